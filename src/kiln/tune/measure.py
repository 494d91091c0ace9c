"""Build one candidate kernel alone, check it against the default schedule, time it.

The two jobs of :mod:`kiln.tune.executor`, as picklable top-level functions:

- :func:`build_candidate` ``(payload, config, target) -> bytes``: the kernel lowered with the
  config (:func:`kiln.tune.tasks.lower_candidate`), compiled by the same codegen and
  ``export_library`` as ``kiln.build`` (LLVM objects and C objects go through the compile
  cache), the shared library's bytes;
- :func:`measure_candidate` ``(lib_bytes, payload, config, target, repeat) -> MeasureResult``:
  load the library, run the kernel on the task's fixed inputs (the model's constants, seeded
  random data for the rest), compare with the default config's output (built once per task
  and process), then time it.

A candidate that fails to build, raises, or computes something else gets ``error`` set; it
never stops the tune. As AutoTVM's ``LocalBuilder`` / ``LocalRunner``
(``python/tvm/autotvm/measure/measure_methods.py``: ``check_correctness`` against the
reference output, ``MeasureResult(costs, error_no, all_cost, timestamp)``) and MetaSchedule's
``Builder`` / ``Runner`` (``python/tvm/meta_schedule/runner/``).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kiln.codegen.registry import get_codegen
from kiln.driver.tuning_records import MEASURE_METHODS, RECORD_MEASURE
from kiln.errors import KilnError
from kiln.runtime.threads import num_threads
from kiln.schedules.space import Config
from kiln.target import Target
from kiln.tune.cache_flush import CacheFlusher
from kiln.tune.tasks import KernelPayload, lower_candidate

#: seed of the random inputs (one per task: the same data for every candidate)
SEED = 0
#: the least wall time of one timed repeat (the kernel runs as many times as that takes)
MIN_REPEAT_S = 1e-3
#: float tolerance against the default config's output: blocked and unrolled reductions add
#: in another order (relative to the output's largest magnitude)
FLOAT_RTOL = 1e-4
#: the method ``kiln tune`` uses unless told otherwise (and the one ``kiln compile`` applies)
DEFAULT_MEASURE = RECORD_MEASURE
#: the most flushed runs in one timed repeat (each flush costs a write of twice the L2)
MAX_FLUSHED_RUNS = 200


@dataclass(frozen=True)
class MeasureResult:
    """One candidate's measurement (picklable).

    ``costs``: seconds per run of the kernel, one per timed repeat (empty on error; thread
    CPU seconds when the pool has one thread, see :func:`measure_clock`);
    ``error``: None, or why the candidate has no time (a build or run failure, a wrong
    result); ``all_cost``: wall seconds the measurement took; ``timestamp``: when it ended
    (seconds since the epoch)."""

    costs: tuple[float, ...]
    error: str | None
    all_cost: float = 0.0
    timestamp: float = field(default_factory=time.time)

    @property
    def best(self) -> float:
        """The fastest repeat (seconds): the least disturbed by other processes; inf on
        error."""
        return min(self.costs) if self.costs and self.error is None else float("inf")


def build_candidate(payload: KernelPayload, config: Config, target: str) -> bytes:
    """The shared library (bytes) holding ``payload``'s kernel scheduled with ``config``.

    Raises
    ------
    KilnError
        An illegal config, or the kernel cannot be lowered or compiled (CompileError,
        ToolchainError).
    """
    func = lower_candidate(payload, config)
    tgt = Target(target)
    with tgt:
        lib = get_codegen(tgt.kind).build([func], tgt, jobs=1)
    with tempfile.TemporaryDirectory(prefix="kiln-tune-") as folder:
        path = Path(folder) / "kernel.so"
        lib.export_library(str(path))
        return path.read_bytes()


def measure_candidate(lib_bytes: bytes, payload: KernelPayload, config: Config, target: str,
                      repeat: int = 5, method: str = DEFAULT_MEASURE) -> MeasureResult:
    """Run, check and time one built candidate; errors are returned, not raised.

    Parameters
    ----------
    lib_bytes : bytes
        :func:`build_candidate`'s library.
    payload, config, target :
        As given to :func:`build_candidate`.
    repeat : int
        Timed repeats after one warm-up run (each at least MIN_REPEAT_S of runs).
    method : str
        One of MEASURE_METHODS (see :func:`time_kernel`); an unknown one is the result's
        error.
    """
    start = time.perf_counter()
    try:
        kernel = _load_kernel(lib_bytes, payload.name)
        args = kernel_inputs(payload)
        out = _run(kernel, args, payload)
        check_output(out, reference_output(payload, target), payload.name)
        costs = time_kernel(kernel, [*args, out], repeat, measure_clock(), method)
    except Exception as err:  # noqa: BLE001 - any failure is this candidate's error
        return MeasureResult((), f"{type(err).__name__}: {err}", time.perf_counter() - start)
    return MeasureResult(tuple(costs), None, time.perf_counter() - start)


def kernel_inputs(payload: KernelPayload) -> list[np.ndarray]:
    """The kernel's arguments but the output: the model's constant where it has one, else
    seeded random data (floats uniform in [-1, 1), 8-bit integers over their range, wider
    integers 0: they may be indices)."""
    rng = np.random.default_rng(SEED)
    args = []
    for param, value in zip(payload.body.params, payload.constants):
        ty = param.checked_type
        if value is not None:
            # np.array, not ascontiguousarray: that makes a 0-d constant (a per-tensor QDQ
            # scale) 1-d, and the kernel refuses it
            args.append(np.array(value, dtype=ty.dtype, order="C"))
            continue
        dtype = np.dtype(ty.dtype)
        if dtype.kind == "f":
            args.append(rng.uniform(-1, 1, ty.shape).astype(dtype))
        elif dtype.kind in "iu" and dtype.itemsize == 1:
            info = np.iinfo(dtype)
            args.append(rng.integers(info.min, info.max, ty.shape, endpoint=True, dtype=dtype))
        else:
            args.append(np.zeros(ty.shape, dtype))
    return args


_REFERENCES: dict[tuple[str, str], np.ndarray] = {}


def reference_output(payload: KernelPayload, target: str) -> np.ndarray:
    """The default config's output on :func:`kernel_inputs` (built once per task, target and
    process)."""
    key = (payload.key, target)
    if key not in _REFERENCES:
        kernel = _load_kernel(build_candidate(payload, {}, target), payload.name)
        _REFERENCES[key] = _run(kernel, kernel_inputs(payload), payload)
    return _REFERENCES[key]


def check_output(got: np.ndarray, want: np.ndarray, kernel: str) -> None:
    """Raise :class:`KilnError` unless ``got`` matches the reference: exactly for integers and
    booleans, within FLOAT_RTOL of the largest magnitude for floats (NaNs where it has them)."""
    if got.dtype.kind != "f":
        bad = int(np.count_nonzero(got != want))
        if bad:
            raise KilnError(f"kernel {kernel}: {bad} of {got.size} values differ from the "
                            "default schedule's")
        return
    scale = float(np.nanmax(np.abs(want))) if np.isfinite(want).any() else 1.0
    ok = np.isclose(got, want, rtol=FLOAT_RTOL, atol=FLOAT_RTOL * max(scale, 1e-30),
                    equal_nan=True)
    if not ok.all():
        worst = float(np.nanmax(np.abs(got.astype(np.float64) - want)))
        raise KilnError(f"kernel {kernel}: {int((~ok).sum())} of {got.size} values differ from "
                        f"the default schedule's (largest difference {worst:.3g}, output "
                        f"magnitude {scale:.3g})")


def measure_clock():
    """The clock candidates are timed with: the calling thread's CPU time
    (:func:`time.thread_time`) when kernels run on it alone (the pool has one thread,
    :func:`kiln.runtime.threads.num_threads`: ``KILN_NUM_THREADS=1`` or a one-CPU affinity
    mask; then other processes on a shared machine do not count), else wall time
    (:func:`time.perf_counter`)."""
    return time.thread_time if num_threads() == 1 else time.perf_counter


def time_kernel(kernel, args, repeat: int, clock=time.perf_counter, method: str = "hot",
                flusher: CacheFlusher | None = None) -> list[float]:
    """Seconds per run of ``kernel`` on ``args`` (numpy arrays: the inputs, then one shaped
    as the output): one warm-up, then ``repeat`` timings of ``number`` runs (``number``
    calibrated so one timing holds at least MIN_REPEAT_S of kernel time), as TVM's
    ``time_evaluator(number, repeat)``. ``clock``: :func:`measure_clock`'s.

    ``method`` (MEASURE_METHODS): ``hot`` times ``number`` back-to-back calls; ``flush``
    calls ``flusher.flush()`` (default: a new :class:`CacheFlusher`) before every run and
    times each run alone, at most MAX_FLUSHED_RUNS a timing (TVM's
    ``enable_cpu_cache_flush``); ``hot-prepared`` is ``hot`` through a prepared call.

    Raises
    ------
    KilnError
        An unknown ``method``.
    """
    from kiln.runtime import array, empty

    if method not in MEASURE_METHODS:
        raise KilnError(f"unknown measure method {method!r} (one of "
                        f"{', '.join(MEASURE_METHODS)})")
    nd = [array(a) for a in args[:-1]] + [empty(args[-1].shape, args[-1].dtype)]
    call = kernel.prepare(*nd) if method != "hot" else (lambda: kernel(*nd))
    t0 = clock()
    call()
    once = clock() - t0
    number = max(1, min(10_000, int(MIN_REPEAT_S / max(once, 1e-9))))
    if method != "flush":
        return [_timed(call, number, clock) for _ in range(max(1, repeat))]
    flusher = flusher or CacheFlusher()
    number = min(number, MAX_FLUSHED_RUNS)
    costs = []
    for _ in range(max(1, repeat)):
        total = 0.0
        for _ in range(number):
            flusher.flush()
            t0 = clock()
            call()
            total += clock() - t0
        costs.append(total / number)
    return costs


def _timed(call, number: int, clock) -> float:
    """Seconds per call of ``number`` back-to-back calls."""
    t0 = clock()
    for _ in range(number):
        call()
    return (clock() - t0) / number


def _run(kernel, inputs: list[np.ndarray], payload: KernelPayload) -> np.ndarray:
    from kiln.runtime import array, empty

    ty = payload.body.outputs[0].checked_type
    out = empty(ty.shape, ty.dtype)
    kernel(*[array(a) for a in inputs], out)
    return out.numpy()


def _load_kernel(lib_bytes: bytes, name: str):
    """The packed function ``name`` of a library given as bytes (written to a private
    temporary file, loaded, the file removed: the loaded mapping stays)."""
    from kiln.runtime import load_module

    fd, path = tempfile.mkstemp(prefix="kiln-tune-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(lib_bytes)
        lib = load_module(path)
    finally:
        os.unlink(path)
    kernel = lib.get_function(name)
    if kernel is None:
        raise KilnError(f"the candidate library has no kernel {name!r}")
    return _Kernel(lib, kernel)


class _Kernel:
    """A kernel with its library module (kept loaded while the kernel is)."""

    def __init__(self, lib, func) -> None:
        self.lib, self.func = lib, func

    def __call__(self, *args) -> None:
        self.func(*args)

    def prepare(self, *args):
        """A call with ``args`` converted once (the graph executor's way of calling kernels:
        no per-call argument conversion in the time)."""
        return self.func.prepare(*args)
