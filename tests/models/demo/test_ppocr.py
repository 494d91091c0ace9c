"""PP-OCRv4 text detector and recognizer (from the ``rapidocr_onnxruntime`` wheel; weights in
Constant nodes, shapes computed through Shape/Slice/Concat/Reshape that fold once the input
shape is fixed) against onnxruntime on a rendered line of text: the probability maps and
character probabilities match, and both engines find the same box and read the same text."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from model_helpers import assert_matches_reference, compile_to_library, run_compiled

from kiln.demo.ocr_pipeline import (
    charset,
    ctc_decode,
    det_input,
    rec_input,
    render_line,
    text_boxes,
)

TEXT = "Hello from Kiln 2026"
DET_SHAPE = (1, 3, 96, 320)
REC_SHAPE = (1, 3, 48, 320)


@pytest.fixture(scope="module")
def line():
    return render_line(TEXT, DET_SHAPE[2], DET_SHAPE[3])


def test_detector_matches_onnxruntime(wheel_file, reference, line, tmp_path):
    path = wheel_file("ppocrv4_det")
    compiled = compile_to_library(onnx.load(path), {"x": DET_SHAPE}, tmp_path / "det.so")
    inputs = {"x": det_input(line)}
    got, want = run_compiled(compiled, inputs), reference(path, inputs)
    assert_matches_reference(got, want)
    boxes = text_boxes(got[0][0, 0])
    assert boxes == text_boxes(want[0][0, 0])
    assert len(boxes) == 1


def _ink_crop(image: np.ndarray, margin: int = 6) -> np.ndarray:
    """The rendered text's bounding box (dark pixels) with a white margin."""
    ink = image.min(axis=2) < 128
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    return image[max(0, rows[0] - margin): rows[-1] + 1 + margin,
                 max(0, cols[0] - margin): cols[-1] + 1 + margin]


def test_recognizer_matches_onnxruntime(wheel_file, reference, line, tmp_path):
    path = wheel_file("ppocrv4_rec")
    model = onnx.load(path)
    compiled = compile_to_library(model, {"x": REC_SHAPE}, tmp_path / "rec.so")
    inputs = {"x": rec_input(_ink_crop(line))}
    got, want = run_compiled(compiled, inputs), reference(path, inputs)
    assert_matches_reference(got, want)
    chars = charset(model)
    assert ctc_decode(got[0][0], chars)[0] == ctc_decode(want[0][0], chars)[0] == TEXT
