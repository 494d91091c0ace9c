"""Runs of prepared C packed calls executed by one C call (the graph executor's run loop).

Calling a kernel through ctypes costs about 1 µs of Python per call; a model of 50–150 kernels
loses 0.1–0.2 ms per run to it, several percent of a small model's latency. Every library Kiln
builds links ``support/backend.c``, whose ``KilnRunPackedCalls(calls, count, &failed)`` runs an
array of ``{func, args, type_codes, num_args}`` in order and stops at the first failure. TVM's
graph executor is C++ for the same reason (src/runtime/graph_executor/graph_executor.cc).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

from kiln.runtime import c_types as C
from kiln.runtime.packed_func import PackedFunc, PreparedCall

RUNNER_SYMBOL = "KilnRunPackedCalls"


class KilnPackedCall(ctypes.Structure):
    """``KilnPackedCall`` of support/backend.c."""

    _fields_ = [("func", C.PACKED_CFUNC), ("args", ctypes.c_void_p),
                ("type_codes", ctypes.c_void_p), ("num_args", ctypes.c_int64)]


_RUNNER_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(KilnPackedCall), ctypes.c_int64,
                                ctypes.POINTER(ctypes.c_int64))


def runner_of(func: PackedFunc) -> Callable | None:
    """``KilnRunPackedCalls`` of the library kernel ``func`` lives in, if it has one."""
    handle = getattr(func._keepalive, "handle", None)
    if handle is None:
        return None
    try:
        addr = ctypes.cast(getattr(handle, RUNNER_SYMBOL), ctypes.c_void_p).value
    except AttributeError:  # a library not built by Kiln
        return None
    return _RUNNER_TYPE(addr) if addr else None


COPY_SYMBOL = "KilnCopyTensor"


def copier_of(func: PackedFunc) -> PackedFunc | None:
    """``KilnCopyTensor(src, dst)`` (support/backend.c: copy one tensor's bytes into another)
    of the library kernel ``func`` lives in, as a packed function of that library; None for
    a library without it (one built before it existed, or not by Kiln)."""
    handle = getattr(func._keepalive, "handle", None)
    if handle is None:
        return None
    try:
        addr = ctypes.cast(getattr(handle, COPY_SYMBOL), ctypes.c_void_p).value
    except AttributeError:
        return None
    return PackedFunc(addr, COPY_SYMBOL, func._get_last_error, func._keepalive) if addr else None


class CallBatch:
    """Prepared C calls run in order by one ``KilnRunPackedCalls`` call.

    Raises
    ------
    KilnError
        On call, for the first kernel that fails (its name and its library's message).
    """

    def __init__(self, calls: Sequence[PreparedCall], runner: Callable):
        self.calls = list(calls)
        self._runner = runner
        self._array = (KilnPackedCall * len(self.calls))()
        for slot, call in zip(self._array, self.calls):
            slot.func = call._cfunc
            slot.args = ctypes.addressof(call._values)
            slot.type_codes = ctypes.addressof(call._codes)
            slot.num_args = call._num
        self._failed = ctypes.c_int64(-1)

    def __call__(self) -> None:
        rc = self._runner(self._array, len(self.calls), ctypes.byref(self._failed))
        if rc != 0:
            self.calls[self._failed.value].func._raise(rc)


def batch_calls(ops: Sequence[Callable[[], None]]) -> list[Callable[[], None]]:
    """``ops`` with each run of two or more consecutive :class:`PreparedCall` in a library that
    has the runner replaced by one :class:`CallBatch` (other ops stay as they are, in order)."""
    out: list[Callable[[], None]] = []
    run: list[PreparedCall] = []
    runner = None

    def flush() -> None:
        if len(run) > 1 and runner is not None:
            out.append(CallBatch(run, runner))
        else:
            out.extend(run)
        run.clear()

    for op in ops:
        if isinstance(op, PreparedCall):
            if not run:
                runner = runner_of(op.func)
            run.append(op)
            if runner is None:
                flush()
        else:
            flush()
            out.append(op)
    flush()
    return out
