"""``kiln cache`` on a cache folder of every kind of content: each part listed with its size,
the parts adding up to the folder's ``du``, and --clear saying what it removed and kept."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from kiln.cli import main as cli
from kiln.runtime.toolchain.cache_limit import format_size
from kiln.runtime.toolchain.cache_usage import cache_usage

KEY = "ab" * 16


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache folder with compiled code, model files, a hard link, locks, a crashed
    download and a folder Kiln does not know."""
    root = tmp_path / "cache"
    for sub in ("", "objects", "device", "llm"):
        (root / sub).mkdir(mode=0o700, exist_ok=True)
    for n in range(3):
        (root / "objects" / f"{n:064x}.o").write_bytes(b"o" * 9000)
    (root / "device" / f"device-{KEY}.so").write_bytes(b"d" * 20000)
    (root / "llm" / f"smollm2-{'c' * 20}.so").write_bytes(b"l" * 50000)
    (root / f"csource-{KEY}.so").write_bytes(b"j" * 7000)  # the JIT folder is the root here
    (root / "paraphrase-MiniLM-L3-v2.onnx").write_bytes(b"m" * 300_000)
    (root / "vocab.txt").write_bytes(b"v" * 5000)
    os.link(root / "vocab.txt", root / "vocab-copy.txt")  # counts once, as du counts it
    (root / ".cache-size").write_text("0 0\n")
    (root / ".smollm2.lock").touch()
    (root / ".download-x1y2").mkdir()
    (root / ".download-x1y2" / "partial.whl").write_bytes(b"w" * 40000)
    (root / "notes").mkdir()
    (root / "notes" / "a.txt").write_bytes(b"n" * 3000)
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    monkeypatch.delenv("KILN_CACHE_MAX_SIZE", raising=False)
    return root


def _du(path) -> int:
    return int(subprocess.run(["du", "-s", "-B1", str(path)], check=True, capture_output=True,
                              text=True).stdout.split()[0])


def test_the_parts_add_up_to_the_folder_s_du(cache):
    usage = cache_usage()
    assert usage.total == _du(cache)
    parts = {p.name: p for p in usage.parts}
    assert list(parts) == ["compile cache", "llm decoders", "device jit", "jit libraries",
                           "models", "other"]
    assert [parts[n].files for n in parts] == [3, 1, 1, 1, 3, 4]
    assert parts["models"].size == _du(cache / "paraphrase-MiniLM-L3-v2.onnx") + _du(
        cache / "vocab.txt")
    assert parts["compile cache"].size == _du(cache / "objects")
    assert parts["other"].names == [".cache-size", ".download-x1y2/", ".smollm2.lock", "notes/"]


def test_kiln_cache_lists_every_part_and_the_total(cache, capsys):
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert re.search(r"^models .* 3 files .*never capped or removed\)$", lines["models"])
    assert lines["other"].endswith("(.cache-size, .download-x1y2/, .smollm2.lock, notes/)")
    assert re.search(rf"^total +{re.escape(str(cache))} +13 files +"
                     rf"{re.escape(format_size(_du(cache)))}  \(", lines["total"])
    assert "on compiled code" in out and "model files are not capped" in out


def test_kiln_cache_clear_says_what_it_removed_and_keeps_the_models(cache, capsys):
    assert cli.main(["cache", "--clear"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert re.fullmatch(r"removed 6 entries \([\d.]+ KiB\): 3 compile cache \([\d.]+ KiB\), "
                        r"1 llm decoders \([\d.]+ KiB\), 1 device jit \([\d.]+ KiB\), "
                        r"1 jit libraries \([\d.]+ KiB\); model files kept", first), first
    assert (cache / "paraphrase-MiniLM-L3-v2.onnx").exists() and not list(
        (cache / "objects").iterdir())
    assert cache_usage().total == _du(cache)


def test_kiln_cache_without_a_cache_folder_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "none"))
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{tmp_path / 'none'}: no cache folder yet (KILN_CACHE_DIR, default " \
                     "~/.cache/kiln)"
    assert out[1].startswith("total ") and out[1].split()[2:6] == ["0", "files", "0", "B"]
