"""OCR demo: the PP-OCRv4 text detector and recognizer compiled by Kiln.

Steps: fetch both models (``rapidocr_onnxruntime`` 1.3.24 wheel), compile the detector for
``x: 1×3×96×416`` and the recognizer for ``x: 1×3×48×320``, render a line of text with Pillow,
then with each engine (Kiln's two libraries, onnxruntime): detect text boxes, crop each, read it
and decode the CTC output with the model's character list (:mod:`kiln.demo.ocr_pipeline`).
Prints what each engine read, with latencies.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from kiln.demo.common import TARGET, compile_model, mark, median_ms, ort_session, run_graph
from kiln.demo.ocr_pipeline import (
    REC_HEIGHT,
    REC_WIDTH,
    charset,
    ctc_decode,
    det_input,
    rec_input,
    render_line,
    text_boxes,
)
from kiln.models import wheel_file_path

DET_SHAPE = (1, 3, 96, 416)
REC_SHAPE = (1, 3, REC_HEIGHT, REC_WIDTH)
TEXT = "Kiln compiled this reader"


def read_line(image: np.ndarray, detect: Callable, recognize: Callable, chars: list[str],
              runs: int) -> tuple[list[tuple[str, float]], float, float]:
    """Detect the text boxes of ``image`` and read each one.

    Returns
    -------
    readings : list of (text, confidence)
        One per box, top to bottom.
    det_ms, rec_ms : float
        Median detector latency, and median recognizer latency summed over the boxes.
    """
    prob, det_ms = median_ms(lambda: detect(det_input(image)), runs)
    readings, rec_ms = [], 0.0
    for box in text_boxes(prob[0, 0]):
        x = rec_input(image[box.top:box.bottom, box.left:box.right])
        probs, ms = median_ms(lambda x=x: recognize(x), runs)
        readings.append(ctc_decode(probs[0], chars))
        rec_ms += ms
    return readings, det_ms, rec_ms


def run_demo(runs: int = 5, output: str | None = None, console=None, text: str = TEXT) -> int:
    """Run the demo and print what Kiln and onnxruntime read; return the exit status.

    Parameters
    ----------
    runs : int
        Timed runs per model call and engine (after a warm-up run); the median is shown.
    output : str, optional
        Keep the compiled libraries in this directory (default: a temporary directory).
    console : rich.console.Console, optional
        Where to print (default: stdout).
    text : str
        The line to render (must fit 416 pixels at 30 px).

    Returns
    -------
    int
        0 when Kiln and onnxruntime both read exactly ``text``, else 1.

    Raises
    ------
    KilnError
        If a model cannot be fetched, compiled, exported or loaded, or the text does not fit.
    """
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    det_path, rec_path = wheel_file_path("ppocrv4_det"), wheel_file_path("ppocrv4_rec")
    chars = charset(onnx.load(rec_path))
    image = render_line(text, DET_SHAPE[2], DET_SHAPE[3])
    with tempfile.TemporaryDirectory(prefix="kiln-demo-") as tmp:
        folder = Path(output) if output else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        det = compile_model(det_path, {"x": DET_SHAPE}, folder / "ppocrv4_det.so")
        rec = compile_model(rec_path, {"x": REC_SHAPE}, folder / "ppocrv4_rec.so")
        console.print(f"Kiln compiled {det_path.name} and {rec_path.name} for target "
                      f"'{TARGET}' in {time.perf_counter() - start:.1f} s")
        kiln_read = read_line(image, lambda x: run_graph(det, {"x": x})[0],
                              lambda x: run_graph(rec, {"x": x})[0], chars, runs)
        det_sess, rec_sess = ort_session(det_path), ort_session(rec_path)
        ort_read = read_line(image, lambda x: det_sess.run(None, {"x": x})[0],
                             lambda x: rec_sess.run(None, {"x": x})[0], chars, runs)
    table = Table(title=f"PP-OCRv4 (rapidocr_onnxruntime 1.3.24) on a rendered line: {text!r}")
    for col in ("engine", "text read", "confidence", "det ms", "rec ms"):
        table.add_column(col, justify="left" if col == "text read" else "right")
    wrong = 0
    for engine, (readings, det_ms, rec_ms) in (("kiln", kiln_read), ("onnxruntime", ort_read)):
        read = " | ".join(t for t, _ in readings)
        conf = min((c for _, c in readings), default=0.0)
        wrong += read != text
        table.add_row(engine, mark(read, text), f"{conf:.3f}", f"{det_ms:.1f}", f"{rec_ms:.1f}")
    console.print(table)
    if wrong:
        console.print(f"[red]{wrong} engine(s) misread the line[/red]")
        return 1
    console.print("[green]Kiln and onnxruntime both read the line exactly.")
    return 0
