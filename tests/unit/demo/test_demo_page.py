"""The demo's page renderer and preprocessing (no model, no toolchain)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.demo.page import render_page, rotate
from kiln.demo.preprocess import MEAN, STD, preprocess


def test_render_page_is_black_text_on_white():
    page = render_page()
    assert page.dtype == np.uint8 and page.ndim == 3 and page.shape[2] == 3
    assert page.shape[1] > page.shape[0]  # landscape block of text lines
    assert (page == 255).all(axis=2).mean() > 0.6  # mostly white
    assert (page.max(axis=2) < 64).mean() > 0.03  # with a fair amount of dark ink


@pytest.mark.parametrize("degrees", [0, 90, 180, 270])
def test_rotate_clockwise(degrees):
    img = np.zeros((2, 3, 3), np.uint8)
    img[0, 0] = 255  # top-left marker
    out = rotate(img, degrees)
    expect = {0: (2, 3, (0, 0)), 90: (3, 2, (0, 1)), 180: (2, 3, (1, 2)), 270: (3, 2, (2, 0))}
    h, w, (r, c) = expect[degrees]
    assert out.shape[:2] == (h, w)
    assert out[r, c, 0] == 255 and out[..., 0].sum() == 255


def test_rotate_rejects_odd_angles():
    with pytest.raises(ValueError):
        rotate(np.zeros((2, 2, 3), np.uint8), 45)


@pytest.mark.parametrize("shape", [(300, 500), (500, 300), (256, 256), (224, 1000)])
def test_preprocess_shape_and_normalization(shape):
    white = np.full((*shape, 3), 255, np.uint8)
    x = preprocess(white)
    assert x.shape == (3, 224, 224) and x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_allclose(x[:, 112, 112], (1.0 - MEAN) / STD, rtol=1e-5)


def test_preprocess_center_crop_and_channel_order():
    img = np.zeros((256, 400, 3), np.uint8)
    img[:, :, 0] = 255  # red
    img[:, 200:, 2] = 255  # right half also blue
    x = preprocess(img)
    red = (1.0 - MEAN[0]) / STD[0]
    np.testing.assert_allclose(x[0], red, rtol=1e-5)
    assert x[2, 100, 20] < 0 < x[2, 100, 200]  # crop is centered: blue starts mid-crop
