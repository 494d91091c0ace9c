"""Key/value caches that grow in place: ``vm.builtin.kv_append`` (docs/decisions/019-kv-cache.md).

A decoder's ``present = concatenate([past, new], axis=0)`` (graph op ``kv_append``, made by the
KVAppend pass) would copy the whole cache every token. Here the result lives in an
:class:`AppendBuffer` the VM owns: rows ``[0, filled)`` hold the cache, the rest is spare
capacity. When ``past`` is exactly the rows ``[0, filled)`` of such a buffer (the ``present``
an earlier call returned, fed back), ``new`` is copied into rows ``[filled, filled + S)`` and
the result is a view of rows ``[0, filled + S)``: one copy of the new rows, none of the past.
Otherwise (a cache from elsewhere, a stale or shorter view, a full buffer) a new buffer with
twice the rows needed (at least :data:`MIN_ROWS`) receives copies of both.

Safety rule: rows a view can see are never written again. Views are only ever made of
``[0, filled)`` and ``filled`` only grows, so an append writes rows no existing view covers;
a view of fewer rows than ``filled`` (an older ``present``) takes the copy path. The result is
therefore equal to the concatenation for any sequence of calls. Views are read-only numpy
arrays (writing into a returned cache would change the rows older views share with it).

The VM returns these views without copying them (they are not arena storage that the next
call reuses); feeding them back is zero-copy.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.runtime.ndarray import ALIGNMENT, NDArray, cpu

#: fewest rows a new buffer gets
MIN_ROWS = 64

_CPU = cpu()


class AppendBuffer:
    """A 64-byte-aligned ``[capacity, *row_shape]`` buffer whose first ``filled`` rows are in
    use. Arrays made by :meth:`rows` keep it alive (it is their numpy base), so it can be
    found by its address while any of them lives.

    Parameters
    ----------
    capacity : int
        Rows.
    row_shape : tuple of int
        The trailing dims of one row.
    dtype : str
        numpy dtype name.
    """

    __slots__ = ("__weakref__", "_raw", "address", "capacity", "dtype", "filled", "row_shape")

    def __init__(self, capacity: int, row_shape: tuple[int, ...], dtype: str):
        nbytes = capacity * int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self._raw = np.empty(nbytes + ALIGNMENT, np.uint8)
        self.address = self._raw.ctypes.data + (-self._raw.ctypes.data) % ALIGNMENT
        self.capacity = capacity
        self.row_shape = row_shape
        self.dtype = dtype
        self.filled = 0

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.capacity, *self.row_shape), "typestr": np.dtype(self.dtype).str,
                "data": (self.address, False), "version": 3}

    def rows(self, n: int, full: np.ndarray | None = None) -> NDArray:
        """A read-only NDArray of rows ``[0, n)`` (``_owner``: this buffer); ``full`` is
        ``np.asarray(self)`` when the caller has it."""
        arr = (np.asarray(self) if full is None else full)[:n]
        arr.flags.writeable = False
        out = NDArray._checked(arr, self.dtype, _CPU)
        out._owner = self
        out._ptr = self.address  # rows from the first: numpy's .ctypes would take ~2 us a view
        return out

    def holds(self, t: NDArray, address: int) -> bool:
        """True when ``t`` (at ``address``) is exactly the rows ``[0, filled)`` of this
        buffer."""
        arr = t._arr
        return (arr.shape[0] == self.filled and arr.shape[1:] == self.row_shape
                and t.dtype == self.dtype and address == self.address)


class KVCache:
    """The append buffers of one VM, found by their address (weakly: a buffer lives as long
    as some array of its rows does)."""

    def __init__(self) -> None:
        self._buffers: weakref.WeakValueDictionary[int, AppendBuffer] = (
            weakref.WeakValueDictionary())
        self.copies = 0
        self.appends = 0

    def append(self, past: NDArray, new: NDArray) -> NDArray:
        """``concatenate([past, new], axis=0)`` as a view of an append buffer, in place when
        ``past`` is the filled rows of one with room for ``new`` (module doc).

        Parameters
        ----------
        past : NDArray
            ``[P, *rows]``.
        new : NDArray
            ``[S, *rows]``, the same dtype.

        Raises
        ------
        ShapeError
            Different dtypes, ranks or trailing dims, or a rank-0 value.
        """
        p_arr, n_arr = past._arr, new._arr
        if (p_arr.ndim < 1 or p_arr.shape[1:] != n_arr.shape[1:] or n_arr.ndim != p_arr.ndim
                or past.dtype != new.dtype):
            raise ShapeError(f"vm.builtin.kv_append: cannot append {new.dtype}"
                             f"{list(n_arr.shape)} to {past.dtype}{list(p_arr.shape)}")
        rows, extra = p_arr.shape[0], n_arr.shape[0]
        buf, full = self._reserved(past, extra)
        full[rows:rows + extra] = n_arr
        return buf.rows(rows + extra, full)

    def reserve(self, past: NDArray, extra: int) -> tuple[NDArray, int]:
        """:meth:`append` without writing the new rows: the view of rows ``[0, P + extra)``
        and the address of row ``P``, where the caller writes the ``extra`` new rows (the
        VM's replay does, in C, once the kernel computing them ran).

        Raises
        ------
        ShapeError
            A rank-0 ``past``.
        """
        if past._arr.ndim < 1:
            raise ShapeError(f"vm.builtin.kv_append: cannot append to a scalar {past.dtype}")
        rows = past._arr.shape[0]
        buf, full = self._reserved(past, extra)
        return buf.rows(rows + extra, full), buf.address + rows * full[0].nbytes

    def _reserved(self, past: NDArray, extra: int) -> tuple[AppendBuffer, np.ndarray]:
        """The buffer whose rows ``[P, P + extra)`` take the new rows (``past`` in place, or
        a grown copy of it), marked filled up to ``P + extra``, and its full array."""
        p_arr = past._arr
        rows = p_arr.shape[0]
        address = past.data_ptr if p_arr.size else 0
        buf = self._buffers.get(address) if p_arr.size else None
        if buf is None or not buf.holds(past, address) or rows + extra > buf.capacity:
            buf = self._grown(past, rows + extra)
        else:
            self.appends += 1
        buf.filled = rows + extra
        return buf, np.asarray(buf)

    def _grown(self, past: NDArray, need: int) -> AppendBuffer:
        """A new buffer with room for ``need`` rows, holding a copy of ``past``."""
        buf = AppendBuffer(max(2 * need, MIN_ROWS), tuple(past._arr.shape[1:]), past.dtype)
        rows = past._arr.shape[0]
        np.asarray(buf)[:rows] = past._arr
        self.copies += 1
        if buf.capacity:
            self._buffers[buf.address] = buf
        return buf


def kv_append(site: Any) -> Callable[[Any, list], NDArray]:
    """``kv_append(past, new)``: ``concatenate([past, new], axis=0)`` into the VM's append
    buffers (in place behind a past it returned earlier)."""
    site.nargs(2, 2)
    site.reg_arg(0)

    def run(frame: Any, args: list) -> NDArray:
        past, new = args
        if type(past) is not NDArray or type(new) is not NDArray:
            raise KilnError(f"vm.builtin.kv_append: expects two tensors, got "
                            f"{type(past).__name__} and {type(new).__name__}")
        return frame.vm.kv.append(past, new)

    return run


KV_BUILTINS: dict[str, Callable[[Any], Callable[[Any, list], Any]]] = {"kv_append": kv_append}

__all__ = ["KV_BUILTINS", "MIN_ROWS", "AppendBuffer", "KVCache"]
