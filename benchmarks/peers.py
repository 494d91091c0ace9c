"""The engines Kiln is measured against ("peers"): onnxruntime and OpenVINO, on the CPU.

Each peer runs the same ``.onnx`` file Kiln compiled, in the benchmark's own process, and is
timed in alternating blocks with Kiln (``worker.py``, ``encoders.py``). Settings:

- onnxruntime: ``intra_op_num_threads`` = the thread count, one inter-op thread,
  ``ORT_ENABLE_ALL``, the CPU execution provider;
- OpenVINO: ``core.compile_model(path, "CPU", config)`` with ``NUM_STREAMS`` 1,
  ``PERFORMANCE_HINT`` ``LATENCY``, ``INFERENCE_NUM_THREADS`` = the thread count and, for float
  models, ``INFERENCE_PRECISION_HINT`` ``f32`` (without it OpenVINO runs float models in bf16
  on CPUs with AVX-512 BF16 or AMX, which is not the comparison we want); for int8 models (QDQ,
  ``quantize_dynamic``) the hint is left unset, so OpenVINO runs them with its int8 kernels.

A peer that is not installed is reported by :func:`missing_peers` (the tables show ``-`` with a
note); a peer whose outputs disagree with onnxruntime's (:func:`agree`) is reported as wrong and
never counted as the best peer. Only numpy and the peers are imported here, never Kiln.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

#: row-key prefix → the name a table shows, in column order
PEERS = {"ort": "onnxruntime", "openvino": "OpenVINO"}
#: the Python module each peer needs
_MODULES = {"ort": "onnxruntime", "openvino": "openvino"}
#: An output agrees with the reference's when max |a - b| <= TOL * max |reference output|, each
#: output against its own magnitude (several models end in a Softmax whose values are ~1e-3;
#: MiniLM passes its int64 token ids, up to ~30000, through as outputs beside its ~2.5 hidden
#: states). Float: both engines sum in float32 in different orders (measured, OpenVINO vs
#: onnxruntime: squeezenet, mobilenet_v2, resnet50 within 1e-6). int8: engines quantize and round
#: differently (OpenVINO vs onnxruntime: mobilenet_v2_qdq 1.5 %, quantize_dynamic MiniLM's
#: hidden states 6 %, while onnxruntime's own int8 and float MiniLM differ by 19 %).
FLOAT_TOL = 1e-3
INT8_TOL = 1e-1


def versions() -> dict[str, str | None]:
    """Each peer's version (OpenVINO's without its build suffix: ``2026.4.1``), or None when it
    is not installed."""
    return {peer: module_version(module) for peer, module in _MODULES.items()}


def module_version(module: str) -> str | None:
    """``module``'s version without a build suffix, or None when it is not installed."""
    try:
        return importlib.import_module(module).__version__.split("-")[0]
    except ImportError:
        return None


def missing_peers() -> dict[str, str]:
    """The peers that cannot be imported: key → the note a table prints."""
    out = {}
    for peer, module in _MODULES.items():
        try:
            importlib.import_module(module)
        except ImportError as err:
            out[peer] = (f"{PEERS[peer]} is not installed ({err}); `make bench` installs it "
                         "(the bench extra)")
    return out


def ort_runner(onnx_path: str | bytes, feeds: dict, threads: int) -> Callable[[], list]:
    """An onnxruntime CPU session of a model file (or its serialized bytes); returns one
    inference (``session.run``: fresh output arrays, in the graph's output order). Inputs the
    graph does not have are left out."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    feed = {k: v for k, v in feeds.items() if k in names}
    return lambda: sess.run(None, feed)


def openvino_config(threads: int, int8: bool) -> dict[str, str]:
    """OpenVINO CPU plugin properties of a latency comparison at ``threads`` threads."""
    config = {"NUM_STREAMS": "1", "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_NUM_THREADS": str(threads)}
    if not int8:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    return config


def openvino_runner(onnx_path: str, feeds: dict, threads: int,
                    int8: bool) -> Callable[[], list]:
    """An OpenVINO CPU compiled model (:func:`openvino_config`); returns one inference (one
    infer request: set inputs, infer, copy the outputs out, in the graph's output order)."""
    import openvino as ov

    compiled = ov.Core().compile_model(onnx_path, "CPU", openvino_config(threads, int8))
    names = {n for port in compiled.inputs for n in port.get_names()}
    feed = {k: v for k, v in feeds.items() if k in names}
    request = compiled.create_infer_request()
    outputs = list(compiled.outputs)

    def run() -> list:
        result = request.infer(feed, share_outputs=False)
        return [result[port] for port in outputs]

    return run


def runner(peer: str, onnx_path: str, feeds: dict, threads: int,
           int8: bool) -> Callable[[], list]:
    """One inference of ``peer`` (a key of :data:`PEERS`) on ``onnx_path``."""
    if peer == "ort":
        return ort_runner(onnx_path, feeds, threads)
    if peer == "openvino":
        return openvino_runner(onnx_path, feeds, threads, int8)
    raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")


def output_errors(outputs: list, reference: list) -> list[float]:
    """Per output, the largest absolute difference from the reference's (in order, as float64).

    Raises
    ------
    ValueError
        Different numbers of outputs, or an output of another shape.
    """
    import numpy as np

    if len(outputs) != len(reference):
        raise ValueError(f"{len(outputs)} outputs, the reference has {len(reference)}")
    errors = []
    for i, (a, b) in enumerate(zip(outputs, reference, strict=True)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            raise ValueError(f"output {i}: shape {a.shape}, the reference's {b.shape}")
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        errors.append(float(diff.max()) if diff.size else 0.0)
    return errors


def agree(errors: list[float], reference: list, int8: bool) -> bool:
    """Whether every output's max abs difference (:func:`output_errors`) is within
    :data:`FLOAT_TOL` / :data:`INT8_TOL` times that reference output's largest magnitude (an
    all-zero output must be matched exactly)."""
    import numpy as np

    tol = INT8_TOL if int8 else FLOAT_TOL
    return all(err <= tol * (float(np.max(np.abs(r))) if np.size(r) else 0.0)
               for err, r in zip(errors, reference, strict=True))


def best_peer(row: dict, peers: dict[str, str] = PEERS) -> tuple[str, float] | None:
    """The fastest of ``peers`` (row-key prefix → name; default :data:`PEERS`) in a result row
    that ran and agreed with onnxruntime: (key, ms).

    A row has ``<peer>_ms`` (None where the peer did not run) and ``<peer>_ok`` (False where
    its outputs disagreed); onnxruntime is the reference, so ``ort_ok`` is absent or True.
    """
    times = [(row[f"{p}_ms"], p) for p in peers
             if row.get(f"{p}_ms") is not None and row.get(f"{p}_ok", True)]
    if not times:
        return None
    ms, peer = min(times)
    return peer, ms


def kiln_over_best_peer(row: dict, peers: dict[str, str] = PEERS) -> dict:
    """``{"best_peer": key or None, "kiln_best_peer": Kiln ms / that peer's ms or None}`` of a
    result row (:func:`best_peer` among ``peers``)."""
    best = best_peer(row, peers)
    return {"best_peer": best[0] if best else None,
            "kiln_best_peer": row["kiln_ms"] / best[1] if best else None}


def load_peers(keys: list[str], onnx_path: str, feeds: dict, threads: int,
               int8: bool) -> tuple[dict[str, Callable[[], list]], dict[str, str]]:
    """The peers ``keys``, loaded (:func:`runner`): (key → one inference, key → why a peer
    failed to load). onnxruntime is the reference: its failure is raised."""
    runs, errors = {}, {}
    for peer in keys:
        try:
            runs[peer] = runner(peer, onnx_path, feeds, threads, int8)
        except Exception as err:  # noqa: BLE001 - a failing peer is a result, not a crash
            if peer == "ort":
                raise
            errors[peer] = f"load: {type(err).__name__}: {err}".splitlines()[0][:300]
    return runs, errors


def check_outputs(runs: dict[str, Callable[[], list]], errors: dict[str, str],
                  int8: bool) -> dict:
    """Run every engine once and compare its outputs with onnxruntime's: ``<engine>_err`` (max
    abs difference over all outputs) and ``<engine>_ok`` (:func:`agree`) per engine. ``runs``
    holds ``"ort"`` and the engines to check; one other than ``"kiln"`` that fails to run is
    moved from ``runs`` to ``errors`` (Kiln's failure is raised)."""
    reference = runs["ort"]()
    out = {}
    for name, run in list(runs.items()):
        if name == "ort":
            continue
        try:
            errors_of_outputs = output_errors(run(), reference)
        except Exception as exc:  # noqa: BLE001 - a failing peer is a result, not a crash
            if name == "kiln":
                raise
            errors[name] = f"run: {type(exc).__name__}: {exc}".splitlines()[0][:300]
            del runs[name]
            continue
        out[f"{name}_err"] = max(errors_of_outputs, default=0.0)
        out[f"{name}_ok"] = agree(errors_of_outputs, reference, int8)
    return out
