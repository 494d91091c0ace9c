"""``kiln demo embed`` and ``kiln demo ocr`` end to end: each compiles its models, runs them
beside onnxruntime and exits 0 only when Kiln's results match (similarities within 1e-4, the
rendered line read exactly by both engines). embed compiles one VM library and runs each
sentence at its own length.

The OCR demo runs once per session (:func:`ocr_demo`, ``build_once``): its two VM libraries
(PP-OCRv4 det and rec, symbolic image sizes) are also the ones test_symbolic_convnets.py checks
at other shapes, instead of compiling both models a second time for the same target."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

#: the line the OCR demo renders and reads
OCR_TEXT = "Read by Kiln 42"


def _console(buf: io.StringIO):
    from rich.console import Console

    return Console(file=buf, width=160, color_system=None)


@pytest.mark.xdist_group("demo")
def test_kiln_demo_embed(wheel_file, kiln_cache_dir, monkeypatch, tmp_path):
    from kiln.demo.embed import SENTENCES, run_demo

    monkeypatch.setenv("KILN_CACHE_DIR", str(kiln_cache_dir))
    buf = io.StringIO()
    code = run_demo(runs=1, output=str(tmp_path / "embed.so"), console=_console(buf))
    text = buf.getvalue()
    assert code == 0, text
    assert "onnxruntime" in text and "max |Δ cosine|" in text
    assert "one VM library" in text  # symbolic [batch_size, sequence_length], no padding
    for sentence in SENTENCES:
        assert sentence in text
    assert len({line.split(" tokens)")[0] for line in text.splitlines()
                if " tokens): " in line}) > 1  # sentences ran at different lengths
    assert (tmp_path / "embed.so").exists()


def ocr_demo(build_once, kiln_cache_dir) -> Path:
    """The folder of one ``kiln demo ocr`` run this session (``run_demo(runs=1)`` reading
    :data:`OCR_TEXT`): the compiled ``ppocrv4_det.so`` and ``ppocrv4_rec.so``, and
    ``console.txt`` (the exit status, then what the demo printed)."""
    from kiln.demo.ocr import run_demo

    def build(folder: Path) -> None:
        old = os.environ.get("KILN_CACHE_DIR")
        os.environ["KILN_CACHE_DIR"] = str(kiln_cache_dir)
        try:
            buf = io.StringIO()
            code = run_demo(runs=1, output=str(folder), console=_console(buf), text=OCR_TEXT)
        finally:
            if old is None:
                del os.environ["KILN_CACHE_DIR"]
            else:
                os.environ["KILN_CACHE_DIR"] = old
        (folder / "console.txt").write_text(f"{code}\n{buf.getvalue()}")

    return build_once("kiln-demo-ocr", build)


@pytest.mark.slow
@pytest.mark.xdist_group("demo")
def test_kiln_demo_ocr(build_once, kiln_cache_dir):
    folder = ocr_demo(build_once, kiln_cache_dir)
    code, text = (folder / "console.txt").read_text().split("\n", 1)
    assert code == "0", text
    assert text.count(OCR_TEXT) >= 2  # Kiln's and onnxruntime's readings
    assert (folder / "ppocrv4_det.so").exists() and (folder / "ppocrv4_rec.so").exists()
