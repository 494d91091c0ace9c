"""One corpus model end to end, in this process: export, compile (symbolic and static), compare
with onnxruntime at each shape, time at one thread. Every step's status and exact error text
goes into a record that ``corpus/run.py`` collects (a child process per model)."""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

os.environ.setdefault("KILN_NUM_THREADS", "1")  # before kiln's runtime reads it

from corpus.spec import Model, make_inputs  # noqa: E402

RTOL = 1e-3  # of the reference's largest magnitude, per output
ATOL = 1e-4
TIME_BUDGET_S = 2.0  # per timed executor
MAX_RUNS = 50


def error_text(err: BaseException) -> str:
    """``Type: message`` (first 600 characters) and the innermost cause, for the table."""
    text = f"{type(err).__name__}: {err}".strip()
    cause = err.__cause__
    if cause is not None:
        text += f" (cause: {type(cause).__name__}: {cause})"
    return text[:600]


def compare(got: list[np.ndarray], want: list[np.ndarray]) -> dict:
    """Kiln vs onnxruntime: ``{"status": "match"|"mismatch", "max_err", "detail"}``; an output
    matches when its shape and dtype agree and max|got - want| ≤ RTOL·max|want| + ATOL."""
    if len(got) != len(want):
        return {"status": "mismatch", "detail": f"{len(got)} outputs, onnxruntime {len(want)}"}
    worst = 0.0
    for k, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return {"status": "mismatch",
                    "detail": f"output {k}: {g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}"}
        if w.size == 0:
            continue
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        err = float(np.nanmax(diff)) if np.isfinite(w).all() else float(
            np.max(np.where(np.isfinite(w), diff, 0)))
        if not np.array_equal(np.isfinite(g), np.isfinite(w)):
            return {"status": "mismatch", "detail": f"output {k}: non-finite values differ"}
        bound = RTOL * float(np.max(np.abs(w[np.isfinite(w)]), initial=0)) + ATOL
        worst = max(worst, err / bound)
        if err > bound:
            return {"status": "mismatch", "max_err": err,
                    "detail": f"output {k}: max abs error {err:.3g} > {bound:.3g}"}
    return {"status": "match", "err_over_bound": round(worst, 4)}


class Runner:
    """A loaded Kiln library (VM or graph executor) called with a feed."""

    def __init__(self, path: Path):
        import kiln
        from kiln.vm import VirtualMachine

        self.lib = kiln.runtime.load_module(str(path))
        if self.lib.get_function("vm_load_executable") is not None:
            self.kind, self.vm = "vm", VirtualMachine(self.lib, kiln.cpu())
        else:
            self.kind = "graph"
            self.gmod = kiln.graph_executor.GraphModule(self.lib["default"](kiln.cpu()))

    def __call__(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.kind == "vm":
            out = self.vm["main"](*feed.values())
            return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]
        for name, value in feed.items():
            self.gmod.set_input(name, value)
        self.gmod.run()
        return [self.gmod.get_output(i).numpy() for i in range(self.gmod.get_num_outputs())]


def median_ms(fn) -> float:
    """Median wall time of ``fn()`` in ms: one warm-up, then runs until the budget."""
    fn()
    times, start = [], time.perf_counter()
    while len(times) < MAX_RUNS and (time.perf_counter() - start < TIME_BUDGET_S or
                                      len(times) < 3):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return round(float(np.median(times)), 3)


def _step(record: dict, name: str, fn, save):
    """Run one step; its status, seconds and exact error go into ``record["steps"][name]``."""
    start = time.perf_counter()
    try:
        value = fn()
        record["steps"][name] = {"status": "ok",
                                 "seconds": round(time.perf_counter() - start, 2)}
        return value
    except Exception as err:  # every failure is a result here, recorded verbatim
        record["steps"][name] = {"status": "error", "error": error_text(err),
                                 "seconds": round(time.perf_counter() - start, 2),
                                 "where": traceback.format_exc(limit=-3)[:3000]}
        return None
    finally:
        save(record)


def measure(model: Model, save=lambda record: None, do_time: bool = True) -> dict:
    """The record of ``model`` (see the module docstring); ``save`` is called after each step
    so that a killed child leaves what it had."""
    import onnxruntime as ort

    from corpus.export import onnx_path
    from kiln.cli.compile import compile_model

    record = {"name": model.name, "source": model.source, "exporter": model.exporter,
              "opset": model.opset, "note": model.note, "steps": {}, "runs": {}, "ms": {}}
    path = _step(record, "export", lambda: onnx_path(model), save)
    if path is None:
        return record
    record["onnx"] = path.name
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = _step(record, "onnxruntime", lambda: ort.InferenceSession(
        str(path), opts, providers=["CPUExecutionProvider"]), save)
    tmp = Path(tempfile.mkdtemp(prefix=f"corpus-{model.name}-"))
    quiet = lambda *a, **k: None  # noqa: E731
    fixed = model.fixed
    builds = {
        "symbolic": lambda: compile_model(str(path), str(tmp / "symbolic.so"), echo=quiet),
        "static": lambda: compile_model(
            str(path), str(tmp / "static.so"), echo=quiet,
            input_shapes=[(i.name, i.shape(fixed)) for i in model.inputs]),
    }
    for build, compile_fn in builds.items():
        lib = _step(record, f"compile_{build}", compile_fn, save)
        if lib is None:
            continue
        runner = _step(record, f"load_{build}", lambda: Runner(lib), save)
        if runner is None:
            continue
        record.setdefault("executor", {})[build] = runner.kind
        shapes = model.shapes if build == "symbolic" else (fixed,)
        for k, symbols in enumerate(shapes):
            key = f"{build}@{_shape_name(symbols)}"
            feed = make_inputs(model, symbols, seed=k + 1)
            record["runs"][key] = _run(runner, sess, feed)
            save(record)
        if do_time and sess is not None:
            feed = make_inputs(model, fixed, seed=9)
            _timed(record, build, lambda: runner(feed), save)
    if do_time and sess is not None:
        feed = make_inputs(model, fixed, seed=9)
        _timed(record, "onnxruntime", lambda: sess.run(None, feed), save)
    return record


def _shape_name(symbols: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in symbols.items()) or "static"


def _run(runner: Runner, sess, feed) -> dict:
    if sess is None:
        return {"status": "no_reference"}
    try:
        want = sess.run(None, feed)
    except Exception as err:
        return {"status": "reference_error", "error": error_text(err)}
    try:
        got = runner(feed)
    except Exception as err:
        return {"status": "error", "error": error_text(err)}
    return compare(got, want)


def _timed(record: dict, name: str, fn, save) -> None:
    try:
        record["ms"][name] = median_ms(fn)
    except Exception as err:
        record["ms"][name] = None
        record.setdefault("timing_errors", {})[name] = error_text(err)
    save(record)
