"""The VM's arena plan: offsets of a function body's tensors in one storage, from their
symbolic sizes (decision 014)."""

from __future__ import annotations

from kiln import arith
from kiln.arith import Dim

#: byte alignment of every tensor in the arena (NDArray's alignment)
ALIGN = 64


def _round_up(nbytes: Dim) -> Dim:
    return arith.mul(arith.floordiv(arith.add(nbytes, ALIGN - 1), ALIGN), ALIGN)


def plan_arena(sizes: list[Dim], frees: list[list[int]]) -> tuple[list[Dim], Dim]:
    """Offsets of tensors in one arena, and its total size (bytes, symbolic).

    ``sizes[k]`` is tensor ``k``'s byte size, in allocation order; ``frees[k]`` lists the tensors
    whose last use is the call that produces tensor ``k`` (free after it). A tensor takes a free
    slot its size provably fits in, else the largest free slot, grown to the symbolic max of its
    tenants, else a new slot (greedy by first fit, as TVM's StorageRewrite for static sizes).
    """
    slot_size: list[Dim] = []
    slot_of: list[int] = []
    free: list[int] = []
    for k, size in enumerate(sizes):
        pick = next((s for s in free if _fits(size, slot_size[s])), None)
        if pick is None and free:
            pick = free[-1]
            slot_size[pick] = arith.maximum(slot_size[pick], size)
        if pick is None:
            pick = len(slot_size)
            slot_size.append(size)
        else:
            free.remove(pick)
        slot_of.append(pick)
        free.extend(slot_of[t] for t in frees[k])
    starts: list[Dim] = []
    total: Dim = 0
    for size in slot_size:
        starts.append(total)
        total = arith.add(total, _round_up(size))
    return [starts[s] for s in slot_of], total


def _fits(size: Dim, capacity: Dim) -> bool:
    lo, _ = arith.bounds(arith.sub(capacity, size))
    return lo is not None and lo >= 0
