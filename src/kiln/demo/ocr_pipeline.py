"""Pre- and post-processing of the PP-OCRv4 detector and recognizer (numpy and Pillow only).

Parameters are those of ``rapidocr_onnxruntime`` 1.3.24 (its ``config.yaml``): the detector
takes RGB scaled to [0, 1] and normalized with the ImageNet mean and std, and its output is a
text-probability map thresholded at 0.3; the recognizer takes a crop resized to height 48
(aspect ratio kept, at most 320 wide), scaled to [-1, 1] and zero-padded to 320 columns, and its
output is decoded greedily as CTC over ``["blank", *model character list, " "]``.

Box extraction is simpler than rapidocr's (which traces contours and fits rotated rectangles):
text lines are the bands of rows of the thresholded map that hold text pixels, each cut to the
columns that hold text, then grown by the DB "unclip" distance ``area * 1.6 / perimeter``
(Liao et al. 2020, Real-time Scene Text Detection with Differentiable Binarization) — enough
for horizontal printed lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kiln.demo.preprocess import MEAN, STD
from kiln.errors import KilnError

DET_THRESHOLD = 0.3
UNCLIP_RATIO = 1.6
REC_HEIGHT = 48
REC_WIDTH = 320


@dataclass(frozen=True)
class Box:
    """A text box in image pixels: rows ``[top, bottom)``, columns ``[left, right)``."""

    top: int
    bottom: int
    left: int
    right: int


def render_line(text: str, height: int, width: int, font_size: int = 30) -> np.ndarray:
    """``text`` in Pillow's default font, black on a white ``height × width`` RGB canvas,
    16 pixels from the left and vertically centered.

    Raises
    ------
    KilnError
        If the text does not fit the canvas.
    """
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=font_size)
    _, top, right, bottom = font.getbbox(text)
    if right + 32 > width or bottom - top + 16 > height:
        raise KilnError(f"text {text!r} at {font_size} px does not fit {height}×{width}")
    img = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(img).text((16, (height - (bottom - top)) // 2 - top), text, fill="black",
                             font=font)
    return np.asarray(img)


def det_input(image: np.ndarray) -> np.ndarray:
    """uint8 RGB ``(H, W, 3)`` (H and W multiples of 32) → float32 ``(1, 3, H, W)``."""
    h, w = image.shape[:2]
    if h % 32 or w % 32:
        raise KilnError(f"detector input {h}×{w}: height and width must be multiples of 32")
    x = (image.astype(np.float32) / np.float32(255) - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of every run of True in a 1-D mask."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def text_boxes(prob: np.ndarray, threshold: float = DET_THRESHOLD,
               min_size: int = 3) -> list[Box]:
    """Horizontal text lines in a detector probability map ``(H, W)``, top to bottom.

    Bands of rows with text pixels (``prob > threshold``) smaller than ``min_size`` pixels in
    either direction are noise and skipped.
    """
    text = prob > threshold
    h, w = text.shape
    boxes = []
    for top, bottom in _runs(text.any(axis=1)):
        cols = np.flatnonzero(text[top:bottom].any(axis=0))
        left, right = int(cols[0]), int(cols[-1]) + 1
        bh, bw = bottom - top, right - left
        if bh < min_size or bw < min_size:
            continue
        grow = math.ceil(bh * bw * UNCLIP_RATIO / (2 * (bh + bw)))
        boxes.append(Box(max(0, int(top) - grow), min(h, int(bottom) + grow),
                         max(0, left - grow), min(w, right + grow)))
    return boxes


def rec_input(crop: np.ndarray, width: int | None = REC_WIDTH) -> np.ndarray:
    """uint8 RGB crop → float32 ``(1, 3, 48, width)``: resized (bilinear) to height 48 with its
    aspect ratio (at most ``width`` wide), scaled to [-1, 1], zero-padded on the right;
    ``width`` None: as wide as the resized crop (a recognizer with a symbolic width)."""
    from PIL import Image

    h, w = crop.shape[:2]
    natural = max(1, math.ceil(REC_HEIGHT * w / h))
    width = natural if width is None else width
    new_w = min(width, natural)
    resized = np.asarray(Image.fromarray(crop).resize((new_w, REC_HEIGHT), Image.BILINEAR))
    x = np.zeros((1, 3, REC_HEIGHT, width), dtype=np.float32)
    x[0, :, :, :new_w] = (resized.astype(np.float32).transpose(2, 0, 1) / 255 - 0.5) / 0.5
    return x


def charset(model) -> list[str]:
    """The recognizer's output classes: ``["blank", *metadata "character" lines, " "]``.

    Raises
    ------
    KilnError
        If the model has no ``character`` metadata.
    """
    meta = {p.key: p.value for p in model.metadata_props}
    if "character" not in meta:
        raise KilnError("the recognizer has no 'character' metadata")
    return ["blank", *meta["character"].splitlines(), " "]


def ctc_decode(probs: np.ndarray, chars: list[str]) -> tuple[str, float]:
    """Greedy CTC: the best class per time step, repeats merged, blanks (class 0) dropped.

    Parameters
    ----------
    probs : numpy.ndarray
        ``(T, len(chars))`` class probabilities of one text line.
    chars : list of str
        :func:`charset`.

    Returns
    -------
    text : str
    confidence : float
        Mean probability of the kept characters (0 for an empty reading).
    """
    if probs.shape[-1] != len(chars):
        raise KilnError(f"recognizer output has {probs.shape[-1]} classes, the character list "
                        f"{len(chars)}")
    best = probs.argmax(axis=-1)
    keep = (best != 0) & np.concatenate([[True], best[1:] != best[:-1]])
    text = "".join(chars[k] for k in best[keep])
    scores = probs.max(axis=-1)[keep]
    return text, float(scores.mean()) if scores.size else 0.0
