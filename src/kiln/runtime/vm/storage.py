"""The VM's storage arena: one 64-byte-aligned buffer per storage id, kept across calls.

TVM's Relax VM allocates storage per call through a pooled allocator
(src/runtime/relax_vm/builtin.cc ``vm.builtin.alloc_storage``); Kiln keeps each storage id's
buffer in the VM and reallocates it only when a call needs more, so memory is bounded by the
largest shape seen and a repeated shape allocates nothing. Storage ids are scoped per VM
function and nesting level (a function running inside itself gets fresh buffers), so two
functions, or two activations of one, never share a buffer by accident.

A buffer that grows gets a new ``generation``: tensors viewing the old buffer are stale, and the
VM drops everything that still refers to them (cached views, prepared calls, recordings).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.runtime.graph_executor.graph_json import memory_bytes
from kiln.runtime.ndarray import ALIGNMENT, MAX_NBYTES, NDArray, checked_nbytes, cpu, empty

#: views cached per storage before the cache is reset (varying shapes make new views)
MAX_CACHED_VIEWS = 256


class Storage:
    """One storage id's buffer.

    Attributes
    ----------
    key : tuple
        ``(function index, nesting level, storage id)``.
    buf : NDArray
        uint8, 64-byte aligned.
    nbytes : int
        Its size.
    generation : int
        Bumped each time the buffer is replaced.
    """

    __slots__ = ("buf", "generation", "key", "nbytes", "views")

    def __init__(self, key: tuple[int, int, int]):
        self.key = key
        self.buf: NDArray | None = None
        self.nbytes = 0
        self.generation = 0
        self.views: dict[tuple[int, str, tuple[int, ...]], NDArray] = {}

    def view(self, offset: int, dtype: str, shape: tuple[int, ...]) -> NDArray:
        """An NDArray over ``nbytes(shape, dtype)`` bytes at ``offset`` (cached per shape, so
        a repeated shape hands kernels the same ``DLTensor``).

        Raises
        ------
        KilnError
            The offset is negative or not 64-byte aligned, or the tensor does not fit.
        ShapeError
            A negative dim or a size no array can have.
        """
        key = (offset, dtype, shape)
        out = self.views.get(key)
        if out is not None:
            return out
        nbytes = checked_nbytes(shape, np.dtype(dtype).itemsize)
        if offset < 0 or offset % ALIGNMENT:
            raise KilnError(f"vm.builtin.alloc_tensor: offset {offset} in storage {self.key[2]} "
                            f"is not a multiple of {ALIGNMENT}")
        if offset + nbytes > self.nbytes:
            raise KilnError(f"vm.builtin.alloc_tensor: {dtype}{list(shape)} ({nbytes} bytes) at "
                            f"offset {offset} does not fit storage {self.key[2]} of "
                            f"{self.nbytes} bytes")
        assert self.buf is not None, "a storage with bytes has a buffer"
        arr = self.buf._arr[offset:offset + nbytes].view(dtype).reshape(shape)
        out = NDArray._checked(arr, dtype, self.buf.device)
        if len(self.views) >= MAX_CACHED_VIEWS:
            self.views.clear()
        self.views[key] = out
        return out


class Arena:
    """Every storage of one VM, with the bytes held now and at most.

    Parameters
    ----------
    on_grow : callable
        Called with the :class:`Storage` after its buffer was replaced.
    limit : int, optional
        Most bytes one storage may have (default: this machine's memory).
    """

    def __init__(self, on_grow: Callable[[Storage], Any], limit: int | None = None):
        self._storages: dict[tuple[int, int, int], Storage] = {}
        self._on_grow = on_grow
        self.limit = limit if limit is not None else (memory_bytes() or MAX_NBYTES)
        self.held = 0
        self.peak = 0
        self.allocations = 0

    def alloc(self, key: tuple[int, int, int], size: int) -> Storage:
        """Storage ``key`` with at least ``size`` bytes (grown, never shrunk).

        Raises
        ------
        ShapeError
            A negative size, or more bytes than :attr:`limit` (checked before allocating).
        KilnError
            The allocation fails.
        """
        st = self._storages.get(key)
        if st is None:
            st = self._storages[key] = Storage(key)
        if size <= st.nbytes and st.buf is not None:
            return st
        if not 0 <= size <= self.limit:
            raise ShapeError(f"vm.builtin.alloc_storage: storage {key[2]} would need {size} "
                             f"bytes (the limit is {self.limit}); are the input shapes right?")
        size = -(-size // ALIGNMENT) * ALIGNMENT  # whole aligned blocks
        try:
            buf = empty((size,), "uint8", cpu())
        except MemoryError:
            raise KilnError(f"vm.builtin.alloc_storage: cannot allocate {size} bytes for "
                            f"storage {key[2]}") from None
        self.held += size - st.nbytes
        self.peak = max(self.peak, self.held)
        self.allocations += 1
        grew = st.buf is not None
        st.buf, st.nbytes = buf, size
        st.generation += 1
        st.views.clear()
        if grew:
            self._on_grow(st)
        return st

    def stats(self) -> dict[str, int]:
        """``{"storage_bytes", "peak_storage_bytes", "num_storages", "allocations"}``."""
        return {"storage_bytes": self.held, "peak_storage_bytes": self.peak,
                "num_storages": len(self._storages), "allocations": self.allocations}


__all__ = ["Arena", "Storage"]
