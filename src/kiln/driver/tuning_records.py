"""Tuning records: JSON lines, one per measured candidate, and the CPU fingerprint.

One line (keys in this order)::

    {"workload_key": "3f2a...", "kernel": "fused_nn_conv2d_NCHWc_nn_relu",
     "config": {"tile_ow": 7, "unroll_ic": 4}, "costs": [1.2e-05, 1.1e-05],
     "measure": "flush", "error": null,
     "target": "llvm -mcpu=native",
     "fingerprint": {"cpu": "AMD EPYC", "features": ["+avx", "+avx2", ...], "cores": 2,
                     "threads": 1},
     "kiln_version": "0.1.0", "timestamp": 1764135600.0}

``costs`` are seconds per run (one per timed repeat), empty when ``error`` says why the
candidate has no time; ``measure`` says how they were timed
(:data:`kiln.tune.measure.MEASURE_METHODS`; a line without it is from before the field and was
timed ``hot``): times of different methods are never compared. A record is applied only where
its ``target`` string and its whole
``fingerprint`` equal the build's (:mod:`kiln.driver.apply_history`): the model name, the ISA
features LLVM sees (what ``-mcpu=native`` compiles for), the logical core count and the kernel
threads (``KILN_NUM_THREADS``: what the parallel loops were timed at) decide the best schedule,
and a record from another CPU or thread count is silently wrong at best.

As AutoTVM's log format (``python/tvm/autotvm/record.py``: one JSON object a line, input =
target + task + config, result = costs + error number + timestamp) and MetaSchedule's
``JSONDatabase`` (``python/tvm/meta_schedule/database/json_database.py``: workload and tuning
record files), in one file, with the CPU it was measured on.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import platform
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kiln.errors import KilnError

#: field names a record line must have
FIELDS = ("workload_key", "kernel", "config", "costs", "error", "target", "fingerprint",
          "kiln_version", "timestamp")
#: how a candidate is timed (records carry it; times of different methods are never compared):
#: ``flush`` (L1/L2 evicted before every run, :mod:`kiln.tune.cache_flush`: predicts the
#: kernel's time inside the model), ``hot`` (back-to-back runs on warm arrays: the first
#: method), ``hot-prepared`` (as ``hot`` with the arguments converted once);
#: kiln.tune.measure times them (here so that the CLI and reading records need no builder)
MEASURE_METHODS = ("flush", "hot", "hot-prepared")
#: the measuring method of the records written before lines had a ``measure`` field
LEGACY_MEASURE = "hot"
#: the method a record made in code has unless told (kiln.tune.measure.DEFAULT_MEASURE; kept
#: here so that reading records needs no builder)
RECORD_MEASURE = "flush"


def config_key(config: Mapping[str, int | str]) -> str:
    """A config as canonical JSON (knob names sorted): the identity of a candidate in the
    records, the search and its resume set."""
    return json.dumps(dict(config), sort_keys=True)


@dataclass(frozen=True)
class TuningRecord:
    """One measured candidate (see the module docstring for the fields)."""

    workload_key: str
    kernel: str
    config: Mapping[str, int | str]
    costs: tuple[float, ...]
    error: str | None
    target: str
    fingerprint: Mapping[str, object]
    kiln_version: str
    timestamp: float = field(default_factory=time.time)
    measure: str = RECORD_MEASURE
    #: the tuner's in-model verdict (:mod:`kiln.tune.in_model`): this config was chosen for the
    #: kernel by timing it inside the whole model (``costs``: its in-model seconds per run);
    #: the latest such record decides the kernel's config (:func:`best_records`)
    in_model: bool = False

    @property
    def best(self) -> float:
        """The fastest run (seconds); inf for a candidate with an error or no time."""
        return min(self.costs) if self.costs and self.error is None else float("inf")

    def config_key(self) -> str:
        """The config as a canonical string (:func:`config_key`)."""
        return config_key(self.config)

    def to_json(self) -> str:
        obj = {"workload_key": self.workload_key, "kernel": self.kernel,
               "config": dict(self.config), "costs": list(self.costs),
               "measure": self.measure, "error": self.error, "target": self.target,
               "fingerprint": dict(self.fingerprint),
               "kiln_version": self.kiln_version, "timestamp": self.timestamp}
        if self.in_model:  # only verdicts carry the key: candidates' lines are as before
            obj["in_model"] = True
        return json.dumps(obj)

    @classmethod
    def from_json(cls, line: str, where: str = "") -> TuningRecord:
        """Parse one line.

        Raises
        ------
        KilnError
            Not JSON, a missing field or one of the wrong type (the message names ``where``:
            the file and line).
        """
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise KilnError(f"{where}: not a tuning record (bad JSON: {err.msg})") from None
        if not isinstance(obj, dict):
            raise KilnError(f"{where}: not a tuning record (a JSON {type(obj).__name__})")
        missing = [f for f in FIELDS if f not in obj]
        measure = obj.get("measure", LEGACY_MEASURE)
        if missing:
            raise KilnError(f"{where}: tuning record without {', '.join(missing)}")
        config, costs, fp = obj["config"], obj["costs"], obj["fingerprint"]
        if not (isinstance(config, dict) and all(isinstance(v, (int, str))
                                                 for v in config.values())
                and isinstance(costs, list) and all(isinstance(c, (int, float)) for c in costs)
                and isinstance(fp, dict) and isinstance(obj["workload_key"], str)
                and isinstance(obj["target"], str) and isinstance(measure, str)
                and (obj["error"] is None or isinstance(obj["error"], str))
                and isinstance(obj.get("in_model", False), bool)):
            raise KilnError(f"{where}: tuning record with a field of the wrong type "
                            "(config: object of int/str, costs: list of seconds, fingerprint: "
                            "object, workload_key/target/measure: string, error: string or null, "
                            "in_model: boolean)")
        return cls(obj["workload_key"], str(obj["kernel"]), config,
                   tuple(float(c) for c in costs), obj["error"], obj["target"], fp,
                   str(obj["kiln_version"]), float(obj["timestamp"]), measure,
                   obj.get("in_model", False))


def cpu_fingerprint() -> dict[str, object]:
    """This machine's CPU as records name it: ``cpu`` (``/proc/cpuinfo``'s model name, else
    :func:`platform.processor`), ``features`` (the ISA features LLVM enables here, sorted,
    :func:`kiln.target.host_cpu`; ``/proc/cpuinfo``'s flags without llvmlite), ``cores``
    (logical CPUs, :func:`os.cpu_count`) and ``threads`` (the kernels' thread count as the
    runtime's pool counts it, :func:`kiln.runtime.threads.num_threads`, read now: the tuner's
    measuring process inherits this process's environment)."""
    from kiln.runtime.threads import num_threads  # the runtime package only when fingerprinting

    return {**_cpu_fingerprint(), "threads": num_threads()}


@functools.lru_cache(maxsize=1)
def _cpu_fingerprint() -> dict[str, object]:
    """The fingerprint's fields that do not change while the process runs (cached: reading
    the host's features loads LLVM)."""
    cpuinfo = _read_cpuinfo()
    model = cpuinfo.get("model name") or platform.processor() or platform.machine()
    try:
        from kiln.target import host_cpu

        features = sorted(f for f in host_cpu()[1] if f.startswith("+"))
    except KilnError:
        flags = cpuinfo.get("flags") or cpuinfo.get("Features") or ""
        features = sorted(flags.split())
    return {"cpu": model, "features": features, "cores": os.cpu_count() or 1}


def _read_cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def fingerprint_id(fingerprint: Mapping[str, object]) -> str:
    """A short stable name of a fingerprint (12 hex digits), e.g. for a Ray resource label."""
    from kiln.runtime.toolchain.compile_cache import make_key

    return make_key(json.dumps(dict(fingerprint), sort_keys=True))[:12]


def load_records(path: str | os.PathLike[str]) -> list[TuningRecord]:
    """Every record of a JSON-lines file (blank lines skipped).

    Raises
    ------
    KilnError
        The file cannot be read, or a line is not a record (the message names file and line).
    """
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise KilnError(f"cannot read tuning records {path}: {err.strerror}") from None
    return [TuningRecord.from_json(line, f"{path}:{n}")
            for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def append_records(path: str | os.PathLike[str], records: Iterable[TuningRecord]) -> None:
    """Append ``records`` to ``path`` (created if missing) as whole lines: one ``write`` of
    all of them under an exclusive ``flock``, to a file opened ``O_APPEND``, then ``fsync`` —
    two tuners appending to one file interleave whole lines, and a crash loses at most the
    lines of this call.

    Raises
    ------
    KilnError
        The file cannot be opened or written.
    """
    data = "".join(r.to_json() + "\n" for r in records).encode()
    if not data:
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as err:
        raise KilnError(f"cannot write tuning records {path}: {err.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not _ends_with_newline_or_empty(fd):
            os.write(fd, b"\n")  # end the partial line a crash left: it stays one bad line
        os.write(fd, data)
        os.fsync(fd)
    except OSError as err:
        raise KilnError(f"cannot write tuning records {path}: {err.strerror}") from None
    finally:
        os.close(fd)


def _ends_with_newline_or_empty(fd: int) -> bool:
    """Whether the file ends a line (a crash mid-write left a partial one otherwise)."""
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def config_times(records: Iterable[TuningRecord], target: str,
                 fingerprint: Mapping[str, object],
                 measure: str = RECORD_MEASURE) -> dict[str, dict[str, list[TuningRecord]]]:
    """Workload key → config key (:meth:`TuningRecord.config_key`) → the error-free records of
    that config measured for ``target`` on a CPU with exactly ``fingerprint`` with the
    ``measure`` method, in file order. In-model verdicts (``in_model``) are not among them:
    their times are of the whole model's run, not comparable with a kernel timed alone."""
    out: dict[str, dict[str, list[TuningRecord]]] = {}
    fp = dict(fingerprint)
    for r in records:
        if (r.target != target or dict(r.fingerprint) != fp or r.measure != measure
                or r.best == float("inf") or r.in_model):
            continue
        out.setdefault(r.workload_key, {}).setdefault(r.config_key(), []).append(r)
    return out


def median_record(records: list[TuningRecord]) -> TuningRecord:
    """The record of median ``best`` among one config's records (the lower middle one of an
    even count): a config measured again is ranked by its typical time, not its luckiest."""
    return sorted(records, key=lambda r: r.best)[(len(records) - 1) // 2]


def best_records(records: Iterable[TuningRecord], target: str,
                 fingerprint: Mapping[str, object],
                 measure: str = RECORD_MEASURE) -> dict[str, TuningRecord]:
    """Per workload key, the config with the least median time (:func:`median_record`) among
    the error-free records measured for ``target`` on a CPU with exactly ``fingerprint`` with
    the ``measure`` method, as its median record (TVM: ``ApplyHistoryBest``'s
    best-by-workload, which takes the least time of any one record).

    Once some config of a workload has been measured more than once (the tuner's
    confirmation, :mod:`kiln.tune.confirm`), configs measured only once are not chosen: a
    single measurement taken at a calmer moment would otherwise beat medians of
    re-measurements (docs/decisions/024-tuner.md).

    A workload with an in-model verdict (a record with ``in_model``, written by
    :mod:`kiln.tune.in_model` after timing the choices inside the whole model) gets the config
    of its latest verdict, which may be the default config ("default wins"): a kernel's time
    alone does not decide what runs faster in the model."""
    records = list(records)
    best = {}
    for key, configs in config_times(records, target, fingerprint, measure).items():
        most = max(len(rs) for rs in configs.values())
        eligible = [rs for rs in configs.values() if len(rs) > 1 or most == 1]
        best[key] = min((median_record(rs) for rs in eligible), key=lambda r: r.best)
    fp = dict(fingerprint)
    for r in records:  # file order: a later verdict replaces an earlier one
        if (r.in_model and r.target == target and dict(r.fingerprint) == fp
                and r.measure == measure and r.error is None):
            best[r.workload_key] = r
    return best
