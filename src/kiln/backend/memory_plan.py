"""Static memory planning for the graph executor (TVM's GraphPlanMemory, simplified).

Entries are visited in execution order. An op's output takes the best-fitting free storage (the
smallest one at least as large), else a new one; the op's inputs are released *after* its output
is placed, so no kernel reads and writes the same storage. Graph inputs, params and outputs own
their storage and are never reused. A storage's size is the largest entry it ever holds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StoragePlan:
    storage_id: list[int]  # per entry
    storage_bytes: list[int]  # per storage id

    @property
    def total_bytes(self) -> int:
        return sum(self.storage_bytes)


def plan_memory(entry_bytes: list[int], external: set[int],
                ops: list[tuple[list[int], int | list[int]]], pinned: set[int]) -> StoragePlan:
    """Assign a storage id to every entry.

    Parameters
    ----------
    entry_bytes : bytes of each entry (entry id = index).
    external : entries of graph inputs and params (own storage, never reused).
    ops : per op in execution order, (input entry ids, output entry id or ids: an external
        function may have several outputs, each placed in its own storage).
    pinned : entries that must stay alive to the end (graph outputs).
    """
    storage_id = [-1] * len(entry_bytes)
    sizes: list[int] = []
    for e in sorted(external):
        storage_id[e] = len(sizes)
        sizes.append(entry_bytes[e])
    uses = [0] * len(entry_bytes)
    for inputs, _ in ops:
        for e in inputs:
            uses[e] += 1
    free: list[int] = []
    for inputs, out in ops:
        outs = [out] if isinstance(out, int) else list(out)
        for o in outs:
            need = entry_bytes[o]
            fits = [s for s in free if sizes[s] >= need]
            if fits:
                sid = min(fits, key=lambda s: sizes[s])
                free.remove(sid)
            else:
                sid = len(sizes)
                sizes.append(need)
            storage_id[o] = sid
        for e in inputs:
            uses[e] -= 1
            if uses[e] == 0 and e not in external and e not in pinned and storage_id[e] >= 0:
                free.append(storage_id[e])
        for o in outs:
            if uses[o] == 0 and o not in pinned:
                free.append(storage_id[o])  # dead value: its storage is free right away
    return StoragePlan(storage_id, sizes)
