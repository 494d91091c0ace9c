"""One conformance worker process: reads case names on stdin, writes one JSON result per line.

Started by ``conformance/run.py`` (``python conformance/worker.py BACKEND TARGET``). It loads
ONNX's generated node test cases once, then for each name runs the case through the backend's
``prepare`` and ``run`` and compares the outputs with ONNX's own
``Runner.assert_similar_outputs`` (exact shape and dtype, ``np.testing.assert_allclose`` with
the tolerances below). A case that crashes the process (a segfault in generated code) ends the
worker; the driver records it and starts a new one.

Statuses: ``pass``; ``unsupported`` (Kiln: an :class:`~kiln.errors.UnsupportedOpError`;
onnxruntime: its NOT_IMPLEMENTED error); ``fail`` (wrong outputs, or any other exception).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
import warnings

RTOL, ATOL = 1e-3, 1e-5  # the criterion (ONNX's generated cases default to atol 1e-7)


def _backend(name: str):
    if name == "kiln":
        return importlib.import_module("kiln.driver.onnx_backend")
    if name == "onnxruntime":
        return importlib.import_module("onnxruntime.backend")
    raise SystemExit(f"unknown backend {name!r} (kiln, onnxruntime)")


def _status(backend_name: str, err: BaseException) -> str:
    if backend_name == "kiln":
        from kiln.errors import UnsupportedOpError

        return "unsupported" if isinstance(err, UnsupportedOpError) else "fail"
    text = f"{type(err).__name__} {err}"
    return "unsupported" if "NotImplemented" in text or "NOT_IMPLEMENTED" in text else "fail"


def run_case(backend, backend_name: str, case, target: str) -> dict:
    """Run one ONNX node test case; returns ``{"status", "reason", "seconds"}``."""
    from onnx import TensorProto, numpy_helper
    from onnx.backend.test.runner import Runner

    def arrays(values):  # as ONNX's runner: some cases store TensorProtos (float8, int4...)
        return [numpy_helper.to_array(v) if isinstance(v, TensorProto) else v for v in values]

    start = time.perf_counter()
    kwargs = {"target": target} if backend_name == "kiln" else {}
    try:
        rep = backend.prepare(case.model, "CPU", **kwargs)
        for inputs, outputs in case.data_sets:
            got = rep.run(arrays(inputs))
            Runner.assert_similar_outputs(arrays(outputs), list(got), rtol=RTOL, atol=ATOL)
        status, reason = "pass", ""
    except Exception as err:  # noqa: BLE001 - every failure is a result to record
        status = _status(backend_name, err)
        first = str(err).strip().splitlines()
        reason = f"{type(err).__name__}: {first[0] if first else ''}"[:400]
        if status == "fail" and not isinstance(err, AssertionError):
            reason += " @ " + _where(err)
    return {"status": status, "reason": reason, "seconds": round(time.perf_counter() - start, 3)}


def _where(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "?"
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno}"


def main() -> None:
    backend_name, target = sys.argv[1], sys.argv[2]
    # Results go to the original stdout; anything else printed (by compilers, ONNX's
    # reference implementation, warnings) goes to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    warnings.filterwarnings("ignore")
    from onnx.backend.test.loader import load_model_tests

    backend = _backend(backend_name)
    cases = {c.name: c for c in load_model_tests(kind="node")}
    out.write(json.dumps({"ready": len(cases)}) + "\n")
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        result = run_case(backend, backend_name, cases[name], target)
        result["name"] = name
        out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
