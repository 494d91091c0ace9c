"""Progress display for long compiler stages: a thin wrapper over :mod:`rich.progress`.

The compiler reports what it is doing; this module decides whether anyone sees it. Output goes
to stderr, and only when stderr is a TTY and quiet mode is off (``kiln compile --quiet`` or
:func:`set_quiet`). Otherwise every call is a cheap no-op, so library code may call it freely.

API
---
``stage(name)``
    Context manager around one named step (e.g. ``"Optimizing graph"``). Shows a spinner while
    the step runs and a ``✓ name (1.2 s)`` line when it ends. Steps are also logged at DEBUG
    level on the ``kiln`` logger with their duration.

``task(description, total)``
    Context manager around a counted loop; yields ``advance(n=1)``. Shows a bar with
    ``done/total`` (e.g. kernels lowered or compiled)::

        with progress.task("Compiling kernels", total=len(kernels)) as advance:
            for k in kernels:
                compile_one(k)
                advance()

``transfer(description)``
    Context manager around a download; yields ``update(done, total)`` (bytes so far, and the
    size once known). Shows a bar with bytes, total and speed (``12.0/45.2 MB 3.1 MB/s``).

``note(text)``
    A line printed above the live display, only while one is shown.

``notice(text)``
    One plain line on stderr that a log should keep too (e.g. time a measurement leaves out):
    shown on a terminal and in non-interactive logs alike, never when quiet.

``set_quiet(flag)`` / ``quiet()``
    Silence (or re-enable) every display in this process; ``quiet()`` is also a context manager
    form for a block. The environment variable ``KILN_QUIET=1`` sets the default.

Nesting is allowed: a ``task`` inside a ``stage`` shares one live display. The display is not
thread-safe; call it from the thread that drives compilation.

May import: kiln.errors only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator

log = logging.getLogger("kiln")

_state = {"quiet": os.environ.get("KILN_QUIET", "") not in ("", "0")}
_live: dict[str, object] = {"progress": None, "depth": 0}


def set_quiet(flag: bool) -> None:
    """Turn every progress display of this process off (``True``) or back on (``False``)."""
    _state["quiet"] = bool(flag)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence progress displays inside a ``with`` block (restores the previous setting)."""
    old = _state["quiet"]
    _state["quiet"] = True
    try:
        yield
    finally:
        _state["quiet"] = old


def is_quiet() -> bool:
    """Whether quiet mode is on (``--quiet``, :func:`set_quiet`, ``KILN_QUIET=1``), whatever
    stderr is."""
    return bool(_state["quiet"])


def enabled() -> bool:
    """Whether progress is shown: not quiet and stderr is a terminal."""
    if _state["quiet"]:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


@contextlib.contextmanager
def _display() -> Iterator[object | None]:
    """The shared rich Progress for the outermost stage/task, or None when disabled."""
    if not enabled():
        yield None
        return
    if _live["progress"] is not None:
        _live["depth"] = int(_live["depth"]) + 1
        try:
            yield _live["progress"]
        finally:
            _live["depth"] = int(_live["depth"]) - 1
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    class CountColumn(MofNCompleteColumn):
        """``done/total``, or bytes and speed for a :func:`transfer`."""

        def render(self, task):  # type: ignore[no-untyped-def]
            if task.fields.get("unit") != "bytes":
                return super().render(task)
            return Text(byte_counts(task.completed, task.total, task.speed),
                        style="progress.download")

    prog = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=30),
        CountColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    _live["progress"] = prog
    prog.start()
    try:
        yield prog
    finally:
        prog.stop()
        _live["progress"] = None


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Show ``name`` while the block runs and a done line with its duration afterwards.

    Parameters
    ----------
    name : str
        Short description of the step, e.g. ``"Linking model.so"``.
    """
    start = time.perf_counter()
    with _display() as prog:
        tid = None
        if prog is not None:
            tid = prog.add_task(name, total=None)  # type: ignore[attr-defined]
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            log.debug("stage %s: %.3f s", name, elapsed)
            if prog is not None:
                prog.remove_task(tid)  # type: ignore[attr-defined]
                prog.console.print(  # type: ignore[attr-defined]
                    f"[green]✓[/green] {name} [dim]({elapsed:.1f} s)[/dim]"
                )


@contextlib.contextmanager
def task(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """Show a ``done/total`` bar for a counted loop; yields ``advance(n=1)``.

    Parameters
    ----------
    description : str
        What is counted, e.g. ``"Compiling kernels"``.
    total : int
        Number of units the loop will report.

    Yields
    ------
    advance : callable
        ``advance(n=1)`` marks ``n`` more units done. Safe to call when the display is off.
    """
    start = time.perf_counter()
    with _display() as prog:
        if prog is None:
            yield _noop
            log.debug("task %s: %d in %.3f s", description, total,
                      time.perf_counter() - start)
            return
        tid = prog.add_task(description, total=total)  # type: ignore[attr-defined]

        def advance(n: int = 1) -> None:
            prog.advance(tid, n)  # type: ignore[attr-defined]

        try:
            yield advance
        finally:
            elapsed = time.perf_counter() - start
            log.debug("task %s: %d in %.3f s", description, total, elapsed)
            prog.remove_task(tid)  # type: ignore[attr-defined]
            prog.console.print(  # type: ignore[attr-defined]
                f"[green]✓[/green] {description} {total}/{total} [dim]({elapsed:.1f} s)[/dim]"
            )


@contextlib.contextmanager
def transfer(description: str) -> Iterator[Callable[[int, int | None], None]]:
    """Show a download: bytes so far, total and speed; yields ``update(done, total)``.

    Parameters
    ----------
    description : str
        What is transferred, e.g. ``"Downloading model.onnx"``.

    Yields
    ------
    update : callable
        ``update(done, total)``: ``done`` bytes so far, ``total`` the size in bytes (None or 0
        while unknown). Safe to call when the display is off.
    """
    start = time.perf_counter()
    with _display() as prog:
        if prog is None:
            yield _no_update
            log.debug("transfer %s: %.3f s", description, time.perf_counter() - start)
            return
        tid = prog.add_task(description, total=None, unit="bytes")  # type: ignore[attr-defined]

        def update(done: int, total: int | None) -> None:
            prog.update(tid, completed=done, total=total or None)  # type: ignore[attr-defined]

        try:
            yield update
        finally:
            elapsed = time.perf_counter() - start
            task_ = prog.tasks[prog.task_ids.index(tid)]  # type: ignore[attr-defined]
            # no size when nothing was counted (pip's cache, a small file)
            done = f" {byte_counts(task_.completed, task_.total, None)}" if task_.total else ""
            log.debug("transfer %s:%s in %.3f s", description, done, elapsed)
            prog.remove_task(tid)  # type: ignore[attr-defined]
            prog.console.print(  # type: ignore[attr-defined]
                f"[green]✓[/green] {description}{done} [dim]({elapsed:.1f} s)[/dim]")


def byte_counts(done: float, total: float | None, speed: float | None) -> str:
    """``12.0/45.2 MB 3.1 MB/s`` (decimal units, as pip and rich show downloads); ``?`` for
    an unknown total, no speed while there is none."""
    def mb(n: float) -> str:
        return f"{n / 1e6:.1f}"

    text = f"{mb(done)}/{mb(total) if total else '?'} MB"
    return f"{text} {mb(speed)} MB/s" if speed else text


def note(text: str) -> None:
    """Print ``text`` as a line above the live display (e.g. a tuner's best time so far); a
    no-op when the display is off (quiet, or stderr not a terminal)."""
    prog = _live["progress"]
    if prog is not None:
        prog.console.print(text, highlight=False)  # type: ignore[attr-defined]


def notice(text: str) -> None:
    """Print ``text`` as one line on stderr unless quiet, on a terminal or not (above the live
    display while one is shown)."""
    if _state["quiet"]:
        return
    prog = _live["progress"]
    if prog is not None:
        prog.console.print(text, highlight=False, markup=False)  # type: ignore[attr-defined]
    else:
        print(text, file=sys.stderr, flush=True)


def _noop(n: int = 1) -> None:
    """Advance callback used when the display is off."""


def _no_update(done: int, total: int | None) -> None:
    """Transfer callback used when the display is off."""
