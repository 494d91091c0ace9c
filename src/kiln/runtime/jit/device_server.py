"""The host side of Kiln's device server: kernels of a ``jit`` module run in another process,
built for the device's ISA (``support/device_server.c``), started under ``qemu-<arch>`` user
mode or a launcher command, and called over a pipe.

Protocol (docs/decisions/007-source-embedded-device.md; the server's source repeats it). Every
message is a frame ``u32 type | u64 length | payload`` (little-endian):

- ``HELLO`` (server → host, once): ``u32`` protocol version;
- ``LOAD`` (host → server): the kernel library's bytes (the device may be another machine, so
  the library travels in the pipe, not as a path); reply ``OK`` or ``ERROR``;
- ``CALL``: ``string name | u32 nargs | nargs × (u32 is_output | u8 code | u8 bits | u16 lanes |
  u32 ndim | i64 shape[ndim] | u64 nbytes | data)`` — inputs carry their data, outputs only
  their size; reply ``OK`` with ``u64 nbytes | data`` per output, or ``ERROR`` with the text;
- ``QUIT``: the server exits.

A server that dies (a crash in a kernel, the launcher exiting, a lost connection) closes the
pipe: the host sees end-of-file and raises :class:`~kiln.errors.KilnError` naming the function,
the exit status or signal and the end of the server's stderr; it never waits forever on a dead
server. One that stays alive but does not answer is stopped after ``$KILN_DEVICE_TIMEOUT``
seconds (default: 60 s to start and load the library — a launcher waiting for a password —
and no limit for a call, whose legal length under emulation cannot be known; see the decision
record), with the same kind of error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from kiln.errors import KilnError
from kiln.runtime import c_types as C

log = logging.getLogger("kiln")

PROTOCOL_VERSION = 1
MSG_HELLO, MSG_LOAD, MSG_CALL, MSG_OK, MSG_ERROR, MSG_QUIT = 1, 2, 3, 4, 5, 6
_HEADER = struct.Struct("<IQ")
_ARG = struct.Struct("<IBBHI")
ARG_INT = 2  # an argument that is an int64 value, not a tensor
_STDERR_TAIL = 4000
#: longest HELLO or ERROR payload accepted (a longer one is not from Kiln's server)
_MAX_TEXT = 1 << 20
#: seconds the server may take to say hello and load the library, unless $KILN_DEVICE_TIMEOUT
START_TIMEOUT = 60.0


def device_timeout() -> float | None:
    """``$KILN_DEVICE_TIMEOUT`` in seconds, or None when unset.

    Raises
    ------
    KilnError
        If it is not a positive number.
    """
    raw = os.environ.get("KILN_DEVICE_TIMEOUT", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise KilnError(f"$KILN_DEVICE_TIMEOUT={raw!r}: expected a positive number of seconds")
    return value


class DeviceServer:
    """One running device server with one kernel library loaded.

    Parameters
    ----------
    command : list of str
        How to start it (``qemu-riscv64 -L ... server`` or the launcher command + server).
    library : bytes
        The kernel library (a shared object for the device), sent with ``LOAD``.
    what : str
        Names the module in messages.

    Raises
    ------
    KilnError
        The server cannot be started, does not say hello, or cannot load the library (in
        ``$KILN_DEVICE_TIMEOUT`` seconds, default 60), or the timeout is malformed.
    """

    def __init__(self, command: Sequence[str], library: bytes, what: str):
        self.command = [str(c) for c in command]
        self.what = what
        self._lock = threading.Lock()
        self._timeout = device_timeout()
        self._timed_out: float | None = None
        self._broken: KilnError | None = None  # a protocol error: the stream is out of step
        # Lives as long as the server (closed in close()): its end explains a crash.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        log.debug("run: %s", shlex.join(self.command))
        try:
            # Its own process group: a launcher's children (qemu under a shell, sleep...) hold
            # the pipe too, and are stopped with it.
            self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=self._stderr,
                                          start_new_session=True)
        except OSError as err:
            self._stderr.close()
            raise KilnError(f"{what}: cannot start the device server ({shlex.join(self.command)})"
                            f": {err.strerror or err}") from None
        try:
            with self._watchdog(self._timeout or START_TIMEOUT):
                self._start(library)
        except BaseException:
            self.close()
            raise

    def _start(self, library: bytes) -> None:
        """HELLO (checking the protocol version), then LOAD."""
        kind, payload = self._receive("starting", (MSG_HELLO,), 4)
        if len(payload) != 4:
            raise self._protocol_error("starting", f"expected HELLO, got message {kind}")
        (version,) = struct.unpack("<I", payload)
        if version != PROTOCOL_VERSION:
            raise self._protocol_error("starting", f"protocol version {version}, this host "
                                                   f"speaks {PROTOCOL_VERSION}")
        self._send(MSG_LOAD, [library], "loading the kernel library")
        kind, payload = self._receive("loading the kernel library", (MSG_OK, MSG_ERROR), 0)
        if kind == MSG_ERROR:
            raise KilnError(f"{self.what}: device server: {payload.decode(errors='replace')}")

    @contextlib.contextmanager
    def _watchdog(self, timeout: float | None) -> Iterator[None]:
        """Kill the server if the block takes longer than ``timeout`` seconds: the blocked read
        or write then fails and :meth:`_died` says it timed out."""
        if timeout is None:
            yield
            return
        timer = threading.Timer(timeout, self._expire, (timeout,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _expire(self, timeout: float) -> None:
        self._timed_out = timeout
        self._kill()

    def _kill(self) -> None:
        """SIGKILL the server's process group (the launcher and what it started)."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except OSError:  # already gone
            pass

    # -- framing
    def _send(self, kind: int, parts: Sequence[bytes | memoryview], doing: str) -> None:
        stdin = self._proc.stdin
        assert stdin is not None, "the server's stdin is a pipe"
        try:
            stdin.write(_HEADER.pack(kind, sum(len(p) for p in parts)))
            for p in parts:
                stdin.write(p)
            stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died(doing) from None

    def _read(self, n: int, doing: str) -> bytes:
        stdout = self._proc.stdout
        assert stdout is not None, "the server's stdout is a pipe"
        data = stdout.read(n)
        if len(data) != n:
            raise self._died(doing)
        return data

    def _receive(self, doing: str, kinds: Sequence[int], max_ok: int) -> tuple[int, bytes]:
        """One frame of a type in ``kinds`` (OK payloads up to ``max_ok`` bytes, others up to
        1 MiB); anything else is a protocol error, raised before reading a bogus length."""
        kind, length = _HEADER.unpack(self._read(_HEADER.size, doing))
        limit = max_ok if kind in (MSG_OK, MSG_HELLO) else _MAX_TEXT
        if kind not in kinds or length > limit:
            raise self._protocol_error(doing, f"got message type {kind} of {length} bytes")
        return kind, self._read(length, doing) if length else b""

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - _STDERR_TAIL))
            return self._stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def _died(self, doing: str) -> KilnError:
        """The error for a server that closed the pipe: its exit status and stderr."""
        try:
            code = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pipe closed but still running: stop it
            self._kill()
            code = self._proc.wait()
        if code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        if self._timed_out is not None:
            how = (f"did not answer within {self._timed_out:g} s (KILN_DEVICE_TIMEOUT) and was "
                   "stopped")
        tail = self._stderr_tail()
        return KilnError(f"{self.what}: the device server {how} while {doing} "
                         f"({shlex.join(self.command)})" + (f"; its stderr:\n{tail}" if tail
                                                            else ""))

    def _protocol_error(self, doing: str, detail: str) -> KilnError:
        """The error for bytes that are not the expected frame; the server is stopped (the
        stream is out of step) and later calls raise the same error."""
        self._kill()
        tail = self._stderr_tail()
        self._broken = KilnError(
            f"{self.what}: the device server broke the protocol while {doing} ({detail}); is "
            f"{shlex.join(self.command)} Kiln's device server?"
            + (f" Its stderr:\n{tail}" if tail else ""))
        return self._broken

    # -- calls
    def call(self, name: str, arrays: Sequence[np.ndarray], outputs: Sequence[bool],
             ints: Sequence[int] = ()) -> None:
        """Run ``name`` on the device: ``arrays`` (C-contiguous) are its tensors, those with
        ``outputs[i]`` True are overwritten with the results; ``ints`` follow them as integer
        arguments (a symbolic kernel's shape values).

        Raises
        ------
        KilnError
            The kernel reports an error (its message), or the server dies (naming ``name``).
        """
        raw = name.encode()
        parts: list[bytes | memoryview] = [struct.pack("<Q", len(raw)), raw,
                                           struct.pack("<I", len(arrays))]
        for arr, out in zip(arrays, outputs, strict=True):
            code, bits, lanes = C.dl_dtype(arr.dtype)
            parts.append(_ARG.pack(int(out), code, bits, lanes, arr.ndim))
            parts.append(struct.pack(f"<{arr.ndim}q", *arr.shape))
            parts.append(struct.pack("<Q", arr.nbytes))
            if not out and arr.nbytes:  # (memoryview cannot cast an empty array)
                parts.append(memoryview(arr).cast("B"))
        for value in ints:
            parts.append(_ARG.pack(ARG_INT, 0, 64, 1, 0))
            parts.append(struct.pack("<Qq", 8, int(value)))
        parts[2] = struct.pack("<I", len(arrays) + len(ints))
        doing = f"running {name}"
        expect = sum(8 + a.nbytes for a, out in zip(arrays, outputs, strict=True) if out)
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._proc.poll() is not None:
                raise self._died(doing)
            with self._watchdog(self._timeout):
                self._send(MSG_CALL, parts, doing)
                kind, payload = self._receive(doing, (MSG_OK, MSG_ERROR), expect)
        if kind == MSG_ERROR:
            raise KilnError(f"{name} failed on the device: {payload.decode(errors='replace')}")
        pos = 0
        for arr, out in zip(arrays, outputs, strict=True):
            if not out:
                continue
            (n,) = struct.unpack_from("<Q", payload, pos)
            pos += 8
            if n != arr.nbytes or pos + n > len(payload):
                raise self._protocol_error(doing, f"output of {n} bytes, expected {arr.nbytes}")
            arr.reshape(-1).view(np.uint8)[:] = np.frombuffer(payload, np.uint8, n, pos)
            pos += n

    def close(self) -> None:
        """Ask the server to quit (QUIT), then make sure it is gone."""
        proc = self._proc if hasattr(self, "_proc") else None
        if proc is not None and proc.poll() is None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(_HEADER.pack(MSG_QUIT, 0))
                proc.stdin.close()
            except (OSError, ValueError):
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
                proc.wait()
        if proc is not None:
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
        self._stderr.close()


__all__ = ["PROTOCOL_VERSION", "DeviceServer", "device_timeout"]
