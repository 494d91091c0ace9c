"""The graph executor's planned storage and the ``DLTensor`` structs its kernels receive.

TVM's ``GraphExecutor::SetupStorage`` and the ``data_entry_`` / ``input_dltensors_`` /
``output_dltensors_`` bookkeeping behind ``SetInputZeroCopy`` and ``SetOutputZeroCopy``
(src/runtime/graph_executor/graph_executor.cc).

- One 64-byte-aligned pool per ``storage_id``, sized to the largest entry that shares it; every
  entry is a view at offset 0 of its pool (``pool_view``).
- Each entry has **one** ``DLTensor`` struct (plus one flattened 1-d struct if some op sets
  ``flatten_data``) owned by this object; every prepared kernel call that reads or writes the
  entry holds a pointer to that same struct. Re-pointing an entry (:meth:`repoint`) therefore
  changes the data every kernel sees for it, at once, and nothing else: the pool, and the other
  entries that share it, are untouched. (Re-pointing the *pool* instead would be wrong: the pool
  can be larger than the entry, and entries living at other times would write into the
  caller's buffer.)
- :attr:`aliased` marks entries that share their ``storage_id`` with another entry live at the
  same time (``__nop`` views, in-place ops). Such an entry cannot be re-pointed alone: its alias
  would still read or write the pool. Kiln's own memory plan never makes them; a foreign graph
  JSON may.
"""

from __future__ import annotations

import ctypes
import math

from kiln.errors import KilnError
from kiln.runtime import c_types as C
from kiln.runtime.graph_executor.graph_json import Graph, entry_nbytes, storage_pool_bytes
from kiln.runtime.ndarray import Device, NDArray, empty, wrap_aligned

_FOREVER = math.inf


def live_ranges(graph: Graph) -> list[tuple[float, float]]:
    """``(first, last)`` node index during which each entry's value is needed.

    Graph inputs and params (``null`` nodes) and graph outputs live for the whole run and across
    runs; an op output lives from the node that writes it to its last reader.
    """
    ranges: list[list[float]] = [[0.0, 0.0] for _ in range(graph.num_entries)]
    for nid, node in enumerate(graph.nodes):
        for k in range(node.num_outputs):
            eid = graph.entry_id(nid, k)
            ranges[eid] = [-_FOREVER, _FOREVER] if node.op == "null" else [nid, nid]
        for src, idx in node.inputs:
            r = ranges[graph.entry_id(src, idx)]
            r[1] = max(r[1], nid)
    for nid, idx in graph.heads:
        ranges[graph.entry_id(nid, idx)][1] = _FOREVER
    return [(a, b) for a, b in ranges]


def aliased_entries(graph: Graph) -> list[bool]:
    """Per entry: does another entry with the same ``storage_id`` live at the same time?

    A sweep per storage id over entries sorted by start: an entry overlaps an earlier one
    exactly when it starts before the latest end seen so far.
    """
    ranges = live_ranges(graph)
    by_sid: dict[int, list[int]] = {}
    for eid, sid in enumerate(graph.storage_id):
        if entry_nbytes(graph, eid):
            by_sid.setdefault(sid, []).append(eid)
    out = [False] * graph.num_entries
    for eids in by_sid.values():
        eids.sort(key=lambda e: ranges[e])
        best = eids[0]
        for eid in eids[1:]:
            if ranges[eid][0] <= ranges[best][1]:
                out[eid] = out[best] = True
            if ranges[eid][1] > ranges[best][1]:
                best = eid
    return out


class _Slot:
    """The C-visible view of one entry: its DLTensor struct(s) and their shape arrays."""

    __slots__ = ("flat", "full", "keep")

    def __init__(self) -> None:
        self.full: C.DLTensor | None = None
        self.flat: C.DLTensor | None = None
        self.keep: list[object] = []


class GraphStorage:
    """Pools, entry views and the kernels' ``DLTensor`` structs of one executor.

    Parameters
    ----------
    graph : Graph
        The parsed graph JSON.
    device : Device
        Where the pools live (the CPU).

    Attributes
    ----------
    pool_view : list of NDArray
        Per entry, its planned place in the pools.
    target : list of NDArray
        Per entry, what its DLTensor structs point at now (``pool_view[eid]`` or a caller's
        array after :meth:`repoint`).
    aliased : list of bool
        See :func:`aliased_entries`.
    """

    def __init__(self, graph: Graph, device: Device):
        self.graph = graph
        pool_bytes = storage_pool_bytes(graph)  # checked against memory before allocating
        # np.empty memory is not touched here, so pools cost address space, not resident
        # memory, until a kernel or a copy writes them.
        try:
            pools = {sid: empty((n,), "uint8", device) for sid, n in pool_bytes.items()}
        except MemoryError:
            raise KilnError(f"graph executor: cannot allocate {sum(pool_bytes.values())} bytes "
                            "of storage") from None
        self.pool_bytes = sum(pool_bytes.values())
        self.pool_view: list[NDArray] = []
        for eid in range(graph.num_entries):
            pool = pools[graph.storage_id[eid]]
            raw = pool._arr[:entry_nbytes(graph, eid)]
            view = raw.view(graph.dltype[eid]).reshape(graph.shape[eid])
            self.pool_view.append(wrap_aligned(view, owner=pool))
        self.target: list[NDArray] = list(self.pool_view)
        self.aliased = aliased_entries(graph)
        self._slots = [_Slot() for _ in range(graph.num_entries)]

    def tensor(self, eid: int, flat: bool = False) -> ctypes._Pointer:
        """Pointer to entry ``eid``'s DLTensor (1-d when ``flat``), shared by every caller.

        The struct lives as long as this object; :meth:`repoint` updates its ``data``.
        """
        slot = self._slots[eid]
        struct = slot.flat if flat else slot.full
        if struct is None:
            arr = self.target[eid]
            shape = (arr.size,) if flat else arr.shape
            shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
            code, bits, lanes = C.dl_dtype(arr.dtype)
            struct = C.DLTensor(
                ctypes.c_void_p(arr.data_ptr),
                C.DLDevice(arr.device.device_type, arr.device.device_id), len(shape),
                C.DLDataType(code, bits, lanes),
                ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64)), None, 0)
            slot.keep.append(shape_arr)
            if flat:
                slot.flat = struct
            else:
                slot.full = struct
        return ctypes.pointer(struct)

    def repoint(self, eid: int, arr: NDArray) -> None:
        """Make every kernel use ``arr``'s memory for entry ``eid`` (same shape and dtype).

        The caller checks shape, dtype, alignment and aliasing; ``arr`` must outlive the binding
        (the caller keeps a reference).
        """
        assert arr.shape == self.target[eid].shape and arr.dtype == self.target[eid].dtype, \
            f"repoint entry {eid}: {arr.shape} {arr.dtype} vs {self.target[eid].shape}"
        assert not self.aliased[eid], f"entry {eid} shares live storage; it cannot be re-pointed"
        self.target[eid] = arr
        slot = self._slots[eid]
        for struct in (slot.full, slot.flat):
            if struct is not None:
                struct.data = arr.data_ptr

    def reset(self, eid: int) -> None:
        """Point entry ``eid`` back at its planned storage."""
        if self.target[eid] is not self.pool_view[eid]:
            self.target[eid] = self.pool_view[eid]
            slot = self._slots[eid]
            for struct in (slot.full, slot.flat):
                if struct is not None:
                    struct.data = self.pool_view[eid].data_ptr

    def flat_view(self, eid: int) -> NDArray:
        """Entry ``eid``'s current array, flattened to 1-d (for Python-implemented ops)."""
        arr = self.target[eid]
        return wrap_aligned(arr._arr.reshape(-1), owner=arr)


def memory_range(arr: NDArray) -> tuple[int, int]:
    """``[start, end)`` byte addresses of ``arr``'s data."""
    start = arr.data_ptr
    return start, start + arr.nbytes


def overlaps(a: NDArray, b: NDArray) -> bool:
    """Do the data of ``a`` and ``b`` share any byte? (Empty arrays share nothing.)"""
    if a.nbytes == 0 or b.nbytes == 0:
        return False
    (a0, a1), (b0, b1) = memory_range(a), memory_range(b)
    return a0 < b1 and b0 < a1


__all__ = ["GraphStorage", "aliased_entries", "live_ranges", "memory_range", "overlaps"]

