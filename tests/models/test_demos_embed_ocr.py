"""``kiln demo embed`` and ``kiln demo ocr`` end to end: each compiles its models, runs them
beside onnxruntime and exits 0 only when Kiln's results match (similarities within 1e-4, the
rendered line read exactly by both engines). embed compiles one VM library and runs each
sentence at its own length."""

from __future__ import annotations

import io

import pytest


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


@pytest.mark.slow
@pytest.mark.xdist_group("demo")
def test_kiln_demo_ocr(wheel_file, kiln_cache_dir, monkeypatch, tmp_path):
    from kiln.demo.ocr import run_demo

    monkeypatch.setenv("KILN_CACHE_DIR", str(kiln_cache_dir))
    buf = io.StringIO()
    code = run_demo(runs=1, output=str(tmp_path), console=_console(buf), text="Read by Kiln 42")
    text = buf.getvalue()
    assert code == 0, text
    assert text.count("Read by Kiln 42") >= 2  # Kiln's and onnxruntime's readings
    assert (tmp_path / "ppocrv4_det.so").exists() and (tmp_path / "ppocrv4_rec.so").exists()
