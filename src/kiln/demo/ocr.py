"""OCR demo: the PP-OCRv4 text detector and recognizer compiled by Kiln.

Steps: fetch both models (``rapidocr_onnxruntime`` 1.3.24 wheel) and compile each **once** with
its image size symbolic (one VM library each: the detector takes any height and width that are
multiples of 32, the recognizer any width at height 48), render lines of text of different
lengths with Pillow, each on a canvas as wide as it needs, then with each engine (Kiln's two
libraries, onnxruntime): detect text boxes, crop each, read it at its own width (no padding to a
fixed width) and decode the CTC output with the model's character list
(:mod:`kiln.demo.ocr_pipeline`). Prints what each engine read, with latencies.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from kiln.demo.common import (
    TARGET,
    compile_vm,
    mark,
    median_ms,
    ort_session,
    require_modules,
    run_vm,
)
from kiln.demo.ocr_pipeline import (
    REC_HEIGHT,
    charset,
    ctc_decode,
    det_input,
    rec_input,
    render_line,
    text_boxes,
)
from kiln.models import wheel_file_path

#: what the demo imports beyond ``pip install kiln`` (the ``demo`` extra)
NEEDS = ("PIL", "onnxruntime")
#: the detector's canvas height; widths follow each line (multiples of 32)
DET_HEIGHT = 96
#: the detector's symbolic height and width (multiples of 32, as its five downsamplings need)
#: and the recognizer's input height (unnamed in the model, "?", so the importer's symbol
#: x_dim2: fixed to 48) and width
DET_BOUNDS = {"p2o.DynamicDimension.1": (32, 2048, 32), "p2o.DynamicDimension.2": (32, 4096, 32)}
REC_BOUNDS = {"x_dim2": (REC_HEIGHT, REC_HEIGHT), "p2o.DynamicDimension.1": (8, 4096)}
TEXTS = ("Kiln compiled this reader", "one library", "reads lines of any width: 42")
TEXT = TEXTS[0]


def canvas_width(text: str, font_size: int = 30) -> int:
    """A detector canvas wide enough for ``text`` (margins included), a multiple of 32."""
    from PIL import ImageFont

    right = ImageFont.load_default(size=font_size).getbbox(text)[2]
    return -(-(right + 48) // 32) * 32


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
        x = rec_input(image[box.top:box.bottom, box.left:box.right], width=None)
        probs, ms = median_ms(lambda x=x: recognize(x), runs)
        readings.append(ctc_decode(probs[0], chars))
        rec_ms += ms
    return readings, det_ms, rec_ms


def run_demo(runs: int = 5, output: str | None = None, console=None,
             text: str | None = None) -> int:
    """Run the demo and print what Kiln and onnxruntime read; return the exit status.

    Parameters
    ----------
    runs : int
        Timed runs per model call and engine (after a warm-up run); the median is shown.
    output : str, optional
        Keep the compiled libraries in this directory (default: a temporary directory).
    console : rich.console.Console, optional
        Where to print (default: stdout).
    text : str, optional
        One line to read instead of :data:`TEXTS`.

    Returns
    -------
    int
        0 when Kiln and onnxruntime both read every line exactly, else 1.

    Raises
    ------
    KilnError
        If Pillow or onnxruntime is missing (before any work), a model cannot be fetched,
        compiled, exported or loaded, or the text does not fit.
    """
    from rich.console import Console
    from rich.table import Table

    require_modules("ocr", NEEDS)
    console = console or Console()
    texts = (text,) if text else TEXTS
    det_path, rec_path = wheel_file_path("ppocrv4_det"), wheel_file_path("ppocrv4_rec")
    chars = charset(onnx.load(rec_path))
    images = [render_line(t, DET_HEIGHT, canvas_width(t)) for t in texts]
    with tempfile.TemporaryDirectory(prefix="kiln-demo-") as tmp:
        folder = Path(output) if output else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        det = compile_vm(det_path, DET_BOUNDS, folder / "ppocrv4_det.so")
        rec = compile_vm(rec_path, REC_BOUNDS, folder / "ppocrv4_rec.so")
        console.print(f"Kiln compiled {det_path.name} and {rec_path.name} once each (symbolic "
                      f"image sizes, VM executor) for target '{TARGET}' in "
                      f"{time.perf_counter() - start:.1f} s")
        det_sess, rec_sess = ort_session(det_path), ort_session(rec_path)
        engines = {
            "kiln": (lambda x: run_vm(det, [x])[0], lambda x: run_vm(rec, [x])[0]),
            "onnxruntime": (lambda x: det_sess.run(None, {"x": x})[0],
                            lambda x: rec_sess.run(None, {"x": x})[0]),
        }
        results = {name: [read_line(img, d, r, chars, runs) for img in images]
                   for name, (d, r) in engines.items()}
    table = Table(title="PP-OCRv4 (rapidocr_onnxruntime 1.3.24) on rendered lines of "
                        "different widths, one compiled detector and recognizer")
    for col in ("line (canvas)", "engine", "text read", "confidence", "det ms", "rec ms"):
        table.add_column(col, justify="left" if col in ("text read", "line (canvas)") else "right")
    wrong = 0
    for k, (t, img) in enumerate(zip(texts, images)):
        for engine, per_line in results.items():
            readings, det_ms, rec_ms = per_line[k]
            read = " | ".join(r for r, _ in readings)
            conf = min((c for _, c in readings), default=0.0)
            wrong += read != t
            table.add_row(f"{k + 1} ({img.shape[0]}×{img.shape[1]})", engine, mark(read, t),
                          f"{conf:.3f}", f"{det_ms:.1f}", f"{rec_ms:.1f}")
    console.print(table)
    if wrong:
        console.print(f"[red]{wrong} reading(s) differ from the rendered text[/red]")
        return 1
    console.print("[green]Kiln and onnxruntime both read every line exactly.")
    return 0
