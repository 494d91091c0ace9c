"""Render a synthetic page of printed text (black on white) for the orientation demo."""

from __future__ import annotations

import numpy as np

#: Lines of real text for the page (from the opening of Apache TVM's paper abstract, reworded).
PAGE_TEXT = (
    "There is an increasing need to bring machine",
    "learning to a wide diversity of hardware devices.",
    "Current frameworks rely on vendor-specific",
    "operator libraries and optimize for a narrow",
    "range of server-class GPUs. Deploying workloads",
    "to new platforms such as mobile phones and",
    "embedded devices requires significant manual",
    "effort. A compiler that exposes graph-level and",
    "operator-level optimizations can provide",
    "performance portability across back-ends.",
)


def render_page(font_size: int = 22, margin: int = 16, line_spacing: float = 1.35,
                lines: tuple[str, ...] = PAGE_TEXT) -> np.ndarray:
    """Render ``lines`` in Pillow's default font, black on white.

    Parameters
    ----------
    font_size : int
        Font size in pixels (``ImageFont.load_default(size=...)``, Pillow ≥ 10.1).
    margin : int
        White border in pixels on every side.
    line_spacing : float
        Baseline-to-baseline distance as a multiple of ``font_size``.
    lines : tuple of str
        The text, one entry per line.

    Returns
    -------
    numpy.ndarray
        ``uint8`` RGB image, shape ``(H, W, 3)``, sized to fit the text.
    """
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=font_size)
    step = round(font_size * line_spacing)
    width = max(int(np.ceil(font.getlength(line))) for line in lines) + 2 * margin
    height = step * len(lines) + 2 * margin
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((margin, margin + i * step), line, fill="black", font=font)
    return np.asarray(img)


def rotate(image: np.ndarray, degrees: int) -> np.ndarray:
    """Rotate an RGB image clockwise by ``degrees`` (a multiple of 90), canvas expanded.

    Clockwise is the orientation model's convention: a page turned 90° clockwise is class
    ``"90"`` (checked with onnxruntime on :func:`render_page`'s output).

    Parameters
    ----------
    image : numpy.ndarray
        ``uint8`` image, shape ``(H, W, 3)``.
    degrees : int
        0, 90, 180 or 270, clockwise (Pillow's ``Image.rotate`` turns counter-clockwise, so
        this calls it with ``-degrees``).

    Returns
    -------
    numpy.ndarray
        The rotated image; height and width swap for 90 and 270.
    """
    from PIL import Image

    if degrees % 90:
        raise ValueError(f"rotation must be a multiple of 90 degrees, got {degrees}")
    return np.asarray(Image.fromarray(image).rotate(-degrees, expand=True))
