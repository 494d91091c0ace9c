"""The ``build_once`` fixture (tests/conftest.py) that the model and native-runtime tests share
costly artifacts through: one build per name and session, concurrent callers wait for it, a
failed build leaves nothing behind and is tried again."""

from __future__ import annotations

import threading
import time
import uuid

import pytest


def test_builds_once_and_returns_the_same_folder(build_once):
    name, calls = f"once-{uuid.uuid4().hex}", []

    def build(folder):
        calls.append(folder)
        (folder / "artifact.txt").write_text("built")

    first = build_once(name, build)
    second = build_once(name, build)
    assert first == second == calls[0] and len(calls) == 1
    assert (first / "artifact.txt").read_text() == "built"


def test_concurrent_callers_wait_for_one_build(build_once):
    """Each thread opens its own lock file descriptor, as two xdist workers do."""
    name, calls, results = f"race-{uuid.uuid4().hex}", [], []

    def build(folder):
        calls.append(folder)
        time.sleep(0.2)  # long enough for the other thread to reach the lock
        (folder / "artifact.txt").write_text("built")

    def ask():
        folder = build_once(name, build)
        results.append((folder / "artifact.txt").read_text())

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == ["built", "built"]


def test_a_failed_build_is_wiped_and_tried_again(build_once):
    name = f"fails-{uuid.uuid4().hex}"

    def broken(folder):
        (folder / "partial.txt").write_text("half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        build_once(name, broken)
    folder = build_once(name, lambda f: (f / "artifact.txt").write_text("built"))
    assert sorted(p.name for p in folder.iterdir()) == ["artifact.txt"]
