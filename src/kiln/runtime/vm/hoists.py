"""Builtins a trace runs before its kernels instead of between them (decision 054).

Between two Python steps the kernels of a replay are one batch (one C call), and a replay whose
steps are all batches has the fast path (``Trace.static``): at the last replay's heap values
and input shapes every struct is as that replay left it. Each hoist takes steps of
``Tracer.steps`` out of the run, or rewrites them as C calls, when what they compute is known
when the call starts (from the parameters and the shape heap):

- ``kv_append`` of a parameter (a decoder's past): a reservation before the kernels and a
  ``KilnCopyTensor`` call in the batch;
- ``copy`` between two tensors of the same dims: a ``KilnCopyTensor`` call in the batch;
- ``alloc_storage`` of a size known at the start: allocated before the kernels;
- ``shape_to_tensor`` of values known at the start (shape arithmetic used as data: a Range from
  a symbolic start): a tensor of the trace's own, written from the heap before the kernels.
"""

from __future__ import annotations

from typing import Any

from kiln.runtime.graph_executor.call_batch import copier_of
from kiln.runtime.ndarray import NDArray
from kiln.runtime.vm.trace import Tracer, _Const, _Int, _own_dims, _Tensor


def known_at_start(d: Any, guarded: dict[int, int]) -> bool:
    """True for an integer argument whose value is known before the body runs: an immediate,
    or a heap slot that no builtin of the body writes."""
    if type(d) is not _Int:
        return False
    return d.expr[0] == "c" or (d.expr[0] == "h" and d.expr[1] not in guarded)


def _builtin(step: tuple, name: str) -> bool:
    return step[0] == "py" and getattr(step[1], "builtin_name", "") == name


def _copier(tr: Tracer) -> Any:
    """``KilnCopyTensor`` of the library the traced kernels live in, or None (no kernel, or a
    library without it)."""
    kernel = next((s[1] for s in tr.steps if s[0] == "c"), None)
    return copier_of(kernel) if kernel is not None else None


def hoist_appends(tr: Tracer, params: dict[int, int]) -> list[tuple]:
    """Each ``kv_append`` of a parameter (a decoder's past) becomes a reservation made before
    the kernels run (``KVCache.reserve``: the present's view and where its new rows go, known
    from the parameter and the heap alone) and a ``KilnCopyTensor`` call in the batch that
    writes the new rows once their kernel ran: one batch of C calls instead of one per layer,
    split by a Python step each. ``params``: source -> parameter index. Returns ``(source,
    parameter index, new rows' dim, the copy's destination tensor)`` per hoisted append;
    ``tr.steps`` is rewritten in place. Nothing is hoisted when the kernels' library lacks the
    copy."""
    copy = _copier(tr)
    if copy is None:
        return []
    hoists = []
    for k, step in enumerate(tr.steps):
        if not _builtin(step, "vm.builtin.kv_append"):
            continue
        _, _, (past, new), src, _ = step
        if (type(past) is not _Tensor or type(new) is not _Tensor or past.src not in params
                or past.off != ("c", 0) or past.dims != _own_dims(past.src, len(past.dims))
                or src < 0 or not new.dims):
            continue
        # (a destination of its own: its address is set per replay, not derived)
        dst = _Tensor(src, ("c", -1 - len(hoists)), new.dims, new.dtype)
        tr.steps[k] = ("c", copy, [new, dst])
        hoists.append((src, params[past.src], new.dims[0], dst))
    return hoists


def hoist_copies(tr: Tracer) -> None:
    """Each ``copy`` into a traced tensor from one of its dtype and dims (a loop's carried
    state: a symbolic silero VAD makes 20 a call) becomes a ``KilnCopyTensor`` call in the
    batch; the same dims make the interpreter's shape check hold at every heap. ``tr.steps``
    is rewritten in place; nothing changes when the kernels' library lacks the copy."""
    copy = _copier(tr)
    if copy is None:
        return
    for k, step in enumerate(tr.steps):
        if not _builtin(step, "vm.builtin.copy") or step[4] or step[3] >= 0:
            continue
        src, dst = step[2]
        if type(dst) is _Tensor and _same_layout(src, dst):
            tr.steps[k] = ("c", copy, [src, dst])


def _same_layout(src: Any, dst: _Tensor) -> bool:
    """Whether ``src`` (a traced tensor, or a constant of the executable: a loop's first
    counter) has ``dst``'s dtype and dims at every heap."""
    if type(src) is _Tensor:
        return src.dtype == dst.dtype and src.dims == dst.dims
    value = src.value if type(src) is _Const else None
    return (type(value) is NDArray and value.dtype == dst.dtype
            and dst.dims == tuple(("c", n) for n in value.shape))


def hoist_storages(tr: Tracer) -> list[tuple]:
    """Each ``alloc_storage`` whose size is known when the call starts (an immediate or a slot
    the shape checks computed, not one a data-dependent builtin writes) runs before the kernels
    instead of between them. Its result only depends on that size: the same buffer, unless it
    grows. Returns the steps, which ``tr.steps`` loses."""
    allocs = {id(s): s[2][0].expr for s in tr.steps
              if _builtin(s, "vm.builtin.alloc_storage") and type(s[2][0]) is _Int}
    # (a storage id allocated twice in a call, were a compiler to do it, keeps its order: the
    # second allocation may move the buffer the first one's kernels wrote)
    ids = list(allocs.values())
    return _take(tr, lambda step: (id(step) in allocs and not step[4] and step[3] >= 0
                                   and ids.count(allocs[id(step)]) == 1
                                   and known_at_start(step[2][1], tr.guarded)))


def hoist_shape_tensors(tr: Tracer) -> list[tuple]:
    """Each ``shape_to_tensor`` whose values are known when the call starts: its tensor is the
    trace's own, refilled from the heap before the kernels (a call at the last replay's heap
    finds it as it was). Returns the steps, which ``tr.steps`` loses."""
    return _take(tr, lambda step: (_builtin(step, "vm.builtin.shape_to_tensor")
                                   and not step[4] and step[3] >= 0
                                   and all(type(d) is _Const for d in step[2][:2])
                                   and all(known_at_start(d, tr.guarded)
                                           for d in step[2][2:])))


def _take(tr: Tracer, hoisted) -> list[tuple]:
    keep, out = [], []
    for step in tr.steps:
        (out if hoisted(step) else keep).append(step)
    tr.steps[:] = keep
    return out
