"""Tensor-expression schedules and their lowering to a loop-IR PrimFunc (TVM's ``te.lower``).

A :class:`Schedule` holds one :class:`Stage` per computed tensor. Stage primitives:

- ``compute_inline()``: substitute the stage's body into its consumers (injective stages only).
- ``reorder(*axes)``: the loop order of a stage, spatial and reduce axes mixed. When every reduce
  axis comes after every spatial axis the reduction accumulates in a local scalar; otherwise it is
  *decomposed* (TVM's ``decompose_reduction``): the output is initialized under the leading spatial
  loops, then updated in place in the requested order.
- ``compute_at(consumer, axis)``: a producer computed one slice of its first axis at a time
  under the consumer's loop over ``axis`` (:mod:`kiln.tir.attach`).

A nested sum (:func:`kiln.tir.te.block_sum`) accumulates each block's partial sum in a second
local accumulator of the same shape, initialized under the block's outer reduce loops and added
to the first through the block step after its inner loops; it needs the accumulator forms.

Loop-level primitives (parallel, fuse, unroll, ...) act on the lowered PrimFunc (kiln.schedules).
"""

from __future__ import annotations

from kiln import arith
from kiln.errors import ScheduleError
from kiln.tir import loop as L
from kiln.tir.attach import attach
from kiln.tir.te import IterVar, Reduce, Tensor, TensorLoad, buffer_shape


class Stage:
    def __init__(self, tensor: Tensor):
        self.tensor = tensor
        self.inline = False
        self.order: list[IterVar] | None = None
        self.splits: dict[int, tuple[IterVar, IterVar]] = {}
        self.tails: dict[int, object] = {}  # split axes with a partial last block: their extent
        self.shifted: dict[int, object] = {}  # split axes whose last block is moved back: extent
        #: fused axes: id(outer or inner) -> (the fused axis, inner's extent, "div" or "mod")
        self.fused: dict[int, tuple[IterVar, object, str]] = {}
        self.kinds: dict[int, str] = {}
        self.local_accumulator = False
        #: ``f(buffer_of) -> int32 PrimExpr`` (a :func:`kiln.tir.loop.call_extern`; ``buffer_of``
        #: maps a Tensor to its Buffer): the stage's nest runs only when that call returns
        #: non-zero (the AMX dense kernel, docs/decisions/026-amx.md). The stage keeps its own
        #: buffer: it is never an epilogue's producer.
        self.try_first = None
        #: (consumer tensor, its loop axis) after :meth:`compute_at`
        self.attach: tuple[Tensor, IterVar] | None = None

    def compute_at(self, consumer: Stage, axis: IterVar) -> None:
        """Compute this stage inside ``consumer``'s loop over ``axis``, one slice of its
        first axis an iteration, in a local buffer (TVM's ``compute_at``, restricted: the
        consumer must read only the slice whose first index is ``axis``'s value, checked when
        lowered; :mod:`kiln.tir.attach`). The stage's own loop order must start with its first
        axis, unsplit."""
        if self.tensor.is_reduction:
            raise ScheduleError(f"compute_at: {self.tensor.name} is a reduction")
        if axis.kind != "spatial" or not any(a is axis for a in consumer.all_axes()):
            raise ScheduleError(f"compute_at: {axis.name} is not a spatial loop axis of "
                                f"{consumer.tensor.name}")
        self.inline = False
        self.attach = (consumer.tensor, axis)

    def compute_inline(self) -> None:
        if self.tensor.is_reduction:
            raise ScheduleError(f"compute_inline: {self.tensor.name} is a reduction")
        self.inline = True

    def compute_root(self) -> None:
        """Materialize the stage in its own buffer (undo compute_inline, compute_at)."""
        self.inline = False
        self.attach = None

    def split(self, axis: IterVar, factor: int, tail: bool | str = False
              ) -> tuple[IterVar, IterVar]:
        """Split ``axis`` into (outer, inner) with ``inner.extent == factor``.

        The factor must divide the extent, unless ``tail`` (a spatial axis, e.g. a symbolic
        row count): then the last block is partial — its reads are clamped to the last valid
        index (they stay in bounds and are cheap: the clamp is invariant in the inner loops)
        and its stores are guarded. ``tail="shift"``: the last block is moved back to end at the
        extent instead, overlapping the one before (its elements are computed twice, with the
        same result): whole blocks only, no clamp, no guard — for a vectorized axis, where a
        clamp would be per lane. It needs ``extent >= factor``: such kernels get a version for
        smaller extents (``te_compiler``). The new axes replace ``axis`` in place in the loop
        order.
        """
        leaves = self.all_axes()
        if not any(a is axis for a in leaves):
            raise ScheduleError(f"split: {axis.name} is not a loop axis of {self.tensor.name}")
        divides = factor > 0 and arith.floormod(axis.extent, factor) == 0
        if tail and factor > 0 and not divides:
            if axis.kind != "spatial":
                raise ScheduleError(f"split: a tail needs a spatial axis, {axis.name} is "
                                    f"{axis.kind}")
            (self.shifted if tail == "shift" else self.tails)[id(axis)] = axis.extent
        elif not divides:
            raise ScheduleError(f"split: factor {factor} does not divide {axis.name} "
                                f"(extent {axis.extent}) of {self.tensor.name}")
        partial = id(axis) in self.tails or id(axis) in self.shifted
        extent = arith.floordiv(axis.extent + factor - 1, factor) if partial \
            else axis.extent // factor
        outer = IterVar(L.Var(f"{axis.name}_o"), extent, axis.kind)
        inner = IterVar(L.Var(f"{axis.name}_i"), factor, axis.kind)
        self.splits[id(axis)] = (outer, inner)
        if self.order is not None:
            i = next(k for k, a in enumerate(self.order) if a is axis)
            self.order[i:i + 1] = [outer, inner]
        return outer, inner

    def fuse(self, outer: IterVar, inner: IterVar) -> IterVar:
        """Fuse two adjacent loop axes of one kind (``outer`` right before ``inner``) into one
        axis of ``outer.extent * inner.extent`` iterations (TVM's ``fuse``): ``outer`` is its
        value ``// inner.extent``, ``inner`` its value ``% inner.extent``. The fused axis may be
        split again: a 1×1 conv's output rows and columns fused into the flattened plane, then
        cut into register blocks of pixels that cross rows. The codegens address
        ``[.., f // W, f % W, ..]`` of a buffer whose next extent is ``W`` as ``[.., f, ..]``
        (:func:`kiln.tir.loop.merge_split_indices`)."""
        order = self.all_axes()
        k = next((i for i, a in enumerate(order) if a is outer), None)
        if k is None or k + 1 >= len(order) or order[k + 1] is not inner:
            raise ScheduleError(f"fuse: {outer.name} and {inner.name} are not adjacent loop "
                                f"axes of {self.tensor.name}")
        if outer.kind != inner.kind:
            raise ScheduleError(f"fuse: {outer.name} is {outer.kind}, {inner.name} "
                                f"{inner.kind}")
        if id(outer) in self.shifted or id(outer) in self.tails \
                or id(inner) in self.shifted or id(inner) in self.tails:
            raise ScheduleError("fuse: an axis split with a tail cannot be fused")
        fused = IterVar(L.Var(f"{outer.name}_{inner.name}_f"),
                        arith.mul(outer.extent, inner.extent), outer.kind)
        self.fused[id(outer)] = (fused, inner.extent, "div")
        self.fused[id(inner)] = (fused, inner.extent, "mod")
        order[k:k + 2] = [fused]
        self.order = order
        return fused

    def reorder(self, *axes: IterVar) -> None:
        own = self.all_axes()
        if sorted(map(id, axes)) != sorted(map(id, own)):
            raise ScheduleError(f"reorder: {self.tensor.name} needs a permutation of its axes "
                                f"{[a.name for a in own]}")
        self.order = list(axes)

    def unroll(self, axis: IterVar) -> None:
        self.kinds[id(axis)] = "unrolled"

    def vectorize(self, axis: IterVar) -> None:
        self.kinds[id(axis)] = "vectorized"

    def cache_write_local(self) -> None:
        """Accumulate a reduction in a local block (TVM's ``cache_write`` + ``compute_at``).

        The spatial axes placed after the first reduce axis form a block of accumulators kept
        in a local buffer (registers, once unrolled and vectorized) while the reduction runs;
        the block is then written out once, through the epilogue if there is one.
        """
        if not self.tensor.is_reduction:
            raise ScheduleError(f"cache_write_local: {self.tensor.name} is not a reduction")
        self.local_accumulator = True

    def root_axes(self) -> list[IterVar]:
        body = self.tensor.body
        return self.tensor.axes + (body.axes if isinstance(body, Reduce) else [])

    def all_axes(self) -> list[IterVar]:
        """The leaf axes (after splits), in the stage's loop order."""
        if self.order is not None:
            return list(self.order)
        out: list[IterVar] = []

        def leaves(ax: IterVar) -> None:
            if id(ax) in self.splits:
                for sub in self.splits[id(ax)]:
                    leaves(sub)
            else:
                out.append(ax)

        for ax in self.root_axes():
            leaves(ax)
        return out

    def leaves_of(self, ax: IterVar) -> list[IterVar]:
        """The leaf axes that ``ax`` was split (or fused) into (``[ax]`` when neither)."""
        if id(ax) in self.fused:
            return self.leaves_of(self.fused[id(ax)][0])
        if id(ax) not in self.splits:
            return [ax]
        return [leaf for sub in self.splits[id(ax)] for leaf in self.leaves_of(sub)]

    def index_of(self, ax: IterVar, leaf_vars: dict[int, L.Var],
                 clamp: bool = False) -> L.PrimExpr:
        """``ax``'s value in terms of the leaf loop variables; with ``clamp``, an axis split
        with a tail stays below its extent (the index reads use)."""
        if id(ax) in self.splits:
            outer, inner = self.splits[id(ax)]
            start = self.index_of(outer, leaf_vars, clamp) * inner.extent
            if id(ax) in self.shifted:  # the last block ends at the extent
                start = L.minimum(start, L.as_index(self.shifted[id(ax)]) - inner.extent)
            index = start + self.index_of(inner, leaf_vars, clamp)
            if clamp and id(ax) in self.tails:
                index = L.minimum(index, L.as_index(self.tails[id(ax)]) - 1)
            return index
        if id(ax) in self.fused:
            fused, width, part = self.fused[id(ax)]
            value = self.index_of(fused, leaf_vars, clamp)
            return value // L.as_index(width) if part == "div" else value % L.as_index(width)
        return leaf_vars[id(ax)]

    def guard(self, leaf_vars: dict[int, L.Var]) -> L.PrimExpr | None:
        """The condition under which an output element exists (split tails), or None."""
        conds = [self.index_of(ax, leaf_vars) < L.as_index(self.tails[id(ax)])
                 for ax in self.root_axes() if id(ax) in self.tails]
        return L.logical_and(*conds) if conds else None


class Schedule:
    """Stages of every computed tensor reachable from ``output``, producers first."""

    def __init__(self, output: Tensor):
        self.output = output
        self.stages: dict[int, Stage] = {}
        order: list[Tensor] = []
        seen: set[int] = set()
        stack: list[tuple[Tensor, bool]] = [(output, False)]
        while stack:
            t, expanded = stack.pop()
            if id(t) in seen or t.is_placeholder:
                continue
            if expanded:
                seen.add(id(t))
                order.append(t)
                continue
            stack.append((t, True))
            stack.extend((i, False) for i in t.inputs())
        self.order = order
        for t in order:
            self.stages[id(t)] = Stage(t)
        #: directives for the loop-level schedule, copied to the PrimFunc's attrs
        #: (``fuse_rows``: kiln.schedules.row_fusion)
        self.attrs: dict[str, object] = {}

    def __getitem__(self, t: Tensor) -> Stage:
        return self.stages[id(t)]

    def inline_injective(self) -> Schedule:
        """The default: inline every non-reduction stage but the output."""
        for t in self.order:
            if t is not self.output and not t.is_reduction:
                self[t].compute_inline()
        return self


def lower(sch: Schedule, inputs: list[Tensor], name: str,
          params: list[L.Buffer] | None = None) -> L.PrimFunc:
    """Lower ``sch`` to a PrimFunc whose params are ``inputs`` then the output (the Buffers
    ``params`` when given: another version of the same kernel, see
    :func:`kiln.backend.te_compiler.lower_primitive`).

    Epilogue fusion: when the output stage is elementwise over a materialized reduction of the
    same shape (conv2d → bias_add → relu), the reduction writes the output buffer and the
    epilogue is applied where each result is final: on the accumulator before its store, or in
    place under the reduction's outer loops (TVM's compute_at at the last spatial prefix axis).

    Raises
    ------
    ScheduleError
        If the output is inlined or an input placeholder is missing from ``inputs``.
    """
    out = sch.output
    if sch[out].inline:
        raise ScheduleError(f"{name}: the output stage cannot be inlined")
    buffers: dict[int, L.Buffer] = {}
    given = params
    params = []
    for i, t in enumerate(inputs):
        buffers[id(t)] = given[i] if given else L.Buffer(f"p{i}", buffer_shape(t.shape), t.dtype)
        params.append(buffers[id(t)])
    buffers[id(out)] = given[-1] if given else L.Buffer("out", buffer_shape(out.shape),
                                                        out.dtype)
    params.append(buffers[id(out)])
    for t in sch.order:
        if id(t) not in buffers and not sch[t].inline:
            buffers[id(t)] = L.Buffer(t.name, buffer_shape(t.shape), t.dtype)

    def expand(e: L.PrimExpr) -> L.PrimExpr:
        def visit(x: L.PrimExpr) -> L.PrimExpr:
            if not isinstance(x, TensorLoad):
                return x
            t = x.tensor
            if t.is_placeholder and id(t) not in buffers:
                raise ScheduleError(f"{name}: placeholder {t.name} is not a parameter")
            if id(t) in buffers:
                return L.BufferLoad(buffers[id(t)], x.indices)
            vmap = {ax.var: idx for ax, idx in zip(t.axes, x.indices)}
            return expand(L.substitute(t.body, vmap))

        return L.map_expr(e, visit)

    materialized = [t for t in sch.order if not sch[t].inline]
    producer, epilogue = _find_epilogue(sch, materialized, buffers, expand)
    nests = []
    attached = [t for t in materialized if sch[t].attach is not None]
    for t in materialized:
        if t is out and epilogue is not None:
            continue  # applied inside the producer's nest
        if sch[t].attach is not None:
            continue  # lowered inside its consumer's nest
        if t is producer:
            # The producer's results live in the output buffer (in place), or only in its
            # accumulator: either way it needs no buffer of its own.
            buffers[id(t)] = buffers[id(out)]
            nests.append(_stage_nest(sch[t], buffers[id(t)], expand, epilogue))
        else:
            nest = _stage_nest(sch[t], buffers[id(t)], expand)
            if sch[t].try_first is not None:
                call = sch[t].try_first(lambda x: buffers[id(x)])
                nest = L.IfThenElse(L.ne(call, L.IntImm(0, "int32")), nest, None)
            nests.append(nest)
        for a in attached:
            consumer, axis = sch[a].attach
            if consumer is t:
                nests[-1] = attach(nests[-1], f"{t.name}_{axis.name}", buffers[id(a)],
                                   _stage_nest(sch[a], buffers[id(a)], expand))
    body: L.Stmt = L.seq(*nests)
    for t in reversed(materialized):
        buf = buffers[id(t)]
        if sch[t].attach is None and buf not in params:
            body = L.Allocate(buf, body)
    return L.PrimFunc(name, params, body, dict(sch.attrs))


class _Epilogue:
    """The output stage as a function of the producer's value at the output index."""

    def __init__(self, out: Tensor, out_buf: L.Buffer, body: L.PrimExpr, producer_buf: L.Buffer,
                 in_place: bool):
        self.out, self.out_buf, self.body = out, out_buf, body
        self.producer_buf = producer_buf
        self.in_place = in_place

    def apply(self, value: L.PrimExpr, index: list[L.PrimExpr]) -> L.PrimExpr:
        vmap = {ax.var: i for ax, i in zip(self.out.axes, index)}

        def visit(x: L.PrimExpr) -> L.PrimExpr:
            if isinstance(x, L.BufferLoad) and x.buffer is self.producer_buf:
                return value
            return x

        return L.map_expr(L.substitute(self.body, vmap), visit)


def _find_epilogue(sch: Schedule, materialized: list[Tensor], buffers, expand):
    out = sch.output
    if len(materialized) < 2 or out.is_reduction:
        return None, None
    producer = materialized[-2]
    if not producer.is_reduction or producer.shape != out.shape or \
            sch[producer].try_first is not None:
        return None, None
    pbuf = buffers[id(producer)]
    body = expand(out.body)
    loads: list[L.BufferLoad] = []
    readers = [t for t in materialized if t is not out and t is not producer]

    def visit(x: L.PrimExpr) -> L.PrimExpr:
        if isinstance(x, L.BufferLoad) and x.buffer is pbuf:
            loads.append(x)
        return x

    L.map_expr(body, visit)
    if not loads or not all(_is_identity(ld.indices, out) for ld in loads):
        return None, None
    for t in readers:  # nobody else may read the producer
        if producer in t.inputs():
            return None, None
    in_place = producer.dtype == out.dtype
    order = sch[producer].all_axes()
    first_reduce = next(i for i, ax in enumerate(order) if ax.kind == "reduce")
    decomposed = any(ax.kind == "spatial" for ax in order[first_reduce:])
    if decomposed and not in_place and not sch[producer].local_accumulator:
        return None, None
    return producer, _Epilogue(out, buffers[id(out)], body, pbuf, in_place)


def _is_identity(indices: list[L.PrimExpr], out: Tensor) -> bool:
    """Indices equal the output's axes (a constant 0 stands for an axis of extent 1)."""
    return all(i is ax.var or (ax.extent == 1 and isinstance(i, L.IntImm) and i.value == 0)
               for i, ax in zip(indices, out.axes))


def _loops(axes: list[IterVar], lv: dict[int, L.Var], body: L.Stmt,
           kinds: dict[int, str] | None = None) -> L.Stmt:
    for ax in reversed(axes):
        kind = (kinds or {}).get(id(ax), "serial")
        body = L.For(lv[id(ax)], L.IntImm(0), L.as_index(ax.extent), kind, body)
    return body


def _combine(combiner: str, acc: L.PrimExpr, value: L.PrimExpr) -> L.PrimExpr:
    if combiner == "sum":
        return acc + value
    if combiner == "prod":
        return acc * value
    return L.Binary(combiner, acc, value)


def _stage_nest(stage: Stage, buf: L.Buffer, expand, epilogue: _Epilogue | None = None) -> L.Stmt:
    t = stage.tensor
    order = stage.all_axes()
    lv = {id(ax): L.Var(f"{t.name}_{ax.name}") for ax in order}

    def vmap_for(leaf_vars: dict[int, L.Var], clamp: bool = False) -> dict[L.Var, L.PrimExpr]:
        return {ax.var: stage.index_of(ax, leaf_vars, clamp) for ax in stage.root_axes()}

    vmap = vmap_for(lv)
    read_map = vmap_for(lv, clamp=True)  # == vmap unless a split has a tail
    out_idx = [vmap[ax.var] for ax in t.axes]
    kinds = stage.kinds

    def guarded(store: L.Stmt, leaf_vars: dict[int, L.Var] = lv) -> L.Stmt:
        cond = stage.guard(leaf_vars)
        return store if cond is None else L.IfThenElse(cond, store)

    if not isinstance(t.body, Reduce):
        value = L.substitute(expand(t.body), read_map)
        return _loops(order, lv, guarded(L.BufferStore(buf, value, out_idx)), kinds)
    red = t.body
    source = L.substitute(expand(red.source), read_map)
    init = expand(red.init)
    first_reduce = next(i for i, ax in enumerate(order) if ax.kind == "reduce")
    prefix, rest = order[:first_reduce], order[first_reduce:]
    if all(ax.kind == "reduce" for ax in rest):
        # Accumulate in a register-like local scalar; store once.
        acc = L.Buffer(f"{t.name}_acc", (1,), t.dtype, scope="local")
        if red.block is not None:
            update = _block_update(stage, acc, [], rest, lv, vmap_for, source, expand)
        else:
            update = L.BufferStore(acc, _combine(red.combiner, acc[0], source), [L.IntImm(0)])
            update = _loops(rest, lv, update, kinds)
        if epilogue is not None:
            store = L.BufferStore(epilogue.out_buf, epilogue.apply(acc[0], out_idx), out_idx)
        else:
            store = L.BufferStore(buf, acc[0], out_idx)
        store = guarded(store)
        inner = L.seq(L.BufferStore(acc, init, [L.IntImm(0)]), update, store)
        return _loops(prefix, lv, L.Allocate(acc, inner), kinds)
    block = [ax for ax in rest if ax.kind == "spatial"]
    if stage.local_accumulator:
        return _loops(prefix, lv, _local_block(stage, buf, block, lv, vmap_for, source, init,
                                               epilogue, expand), kinds)
    if red.block is not None:
        raise ScheduleError(f"{t.name}: a nested sum needs its reduction accumulated locally "
                            "(all reduce loops innermost, or cache_write_local)")
    if stage.tails or stage.shifted:  # (a shifted block accumulating in place would add twice)
        raise ScheduleError(f"{t.name}: a split with a tail needs the reduction accumulated "
                            "locally (cache_write_local)")
    # decompose_reduction: init under the leading spatial loops, then update in place.
    spatial_leaves = [ax for ax in order if ax.kind == "spatial"]
    rest_spatial = [ax for ax in spatial_leaves if ax not in prefix]

    def rest_nest(suffix: str, make_store) -> L.Stmt:
        rv = dict(lv)
        rv.update({id(ax): L.Var(f"{t.name}_{ax.name}_{suffix}") for ax in rest_spatial})
        rmap = vmap_for(rv)
        return _loops(rest_spatial, rv, make_store([rmap[ax.var] for ax in t.axes]))

    init_nest = rest_nest("init", lambda idx: L.BufferStore(buf, init, idx))
    update = L.BufferStore(buf, _combine(red.combiner, L.BufferLoad(buf, out_idx), source),
                           out_idx)
    post = None
    if epilogue is not None:
        assert epilogue.in_place, "a non-in-place epilogue needs the accumulator form"
        post = rest_nest("epi", lambda idx: L.BufferStore(
            epilogue.out_buf, epilogue.apply(L.BufferLoad(buf, idx), idx), idx))
    return _loops(prefix, lv, L.seq(init_nest, _loops(rest, lv, update, kinds), post), kinds)


def _local_block(stage: Stage, buf: L.Buffer, block: list[IterVar], lv, vmap_for, source,
                 init, epilogue: _Epilogue | None, expand) -> L.Stmt:
    """Init a local accumulator block, reduce into it, write it out (through the epilogue)."""
    t = stage.tensor
    red = t.body
    acc = L.Buffer(f"{t.name}_acc", tuple(ax.extent for ax in block), t.dtype, scope="local")
    order = stage.all_axes()
    rest = order[next(i for i, ax in enumerate(order) if ax.kind == "reduce"):]
    acc_idx = [lv[id(ax)] for ax in block]
    if red.block is not None:
        reduction = _block_update(stage, acc, block, rest, lv, vmap_for, source, expand)
    else:
        update = L.BufferStore(acc, _combine(red.combiner, L.BufferLoad(acc, acc_idx), source),
                               acc_idx)
        reduction = _loops(rest, lv, update, stage.kinds)

    def block_nest(suffix: str, make_store, guard: bool = False) -> L.Stmt:
        bv = dict(lv)
        bv.update({id(ax): L.Var(f"{t.name}_{ax.name}_{suffix}") for ax in block})
        bmap = vmap_for(bv)
        store = make_store([bmap[ax.var] for ax in t.axes], [bv[id(ax)] for ax in block])
        cond = stage.guard(bv) if guard else None
        if cond is None:
            return _loops(block, bv, store, stage.kinds)
        # The partial last block of a split with a tail: test once per row, outside the loops
        # the condition does not depend on (the vectorized channel loop).
        used = {id(v) for v in L.expr_vars(cond)}
        cut = max((k + 1 for k, ax in enumerate(block) if id(bv[id(ax)]) in used), default=0)
        inner = _loops(block[cut:], bv, store, stage.kinds)
        return _loops(block[:cut], bv, L.IfThenElse(cond, inner), stage.kinds)

    init_nest = block_nest("init", lambda _, a: L.BufferStore(acc, init, a))
    if epilogue is not None:
        store = block_nest("store", lambda o, a: L.BufferStore(
            epilogue.out_buf, epilogue.apply(L.BufferLoad(acc, a), o), o), guard=True)
    else:
        store = block_nest("store", lambda o, a: L.BufferStore(buf, L.BufferLoad(acc, a), o),
                           guard=True)
    return L.Allocate(acc, L.seq(init_nest, reduction, store))


def _block_update(stage: Stage, acc: L.Buffer, block: list[IterVar], rest: list[IterVar], lv,
                  vmap_for, source: L.PrimExpr, expand) -> L.Stmt:
    """The loops ``rest`` of a nested sum (:func:`kiln.tir.te.block_sum`) adding into ``acc``
    (over the spatial ``block`` axes, ``[]`` for a scalar): under the outer reduce loops, a
    second accumulator of ``acc``'s shape sums the source over the inner loops, then ``acc``
    takes the block step of it.

    Raises
    ------
    ScheduleError
        An inner reduce loop or a spatial loop runs outside an outer reduce loop.
    """
    t = stage.tensor
    red = t.body
    inner_ids = {id(leaf) for ax in red.block.inner for leaf in stage.leaves_of(ax)}
    outer_ids = {id(leaf) for ax in red.axes if all(ax is not i for i in red.block.inner)
                 for leaf in stage.leaves_of(ax)}
    cut = max((k + 1 for k, ax in enumerate(rest) if id(ax) in outer_ids), default=0)
    if any(id(ax) not in outer_ids for ax in rest[:cut]):
        raise ScheduleError(f"{t.name}: the loops of a nested sum's inner axes and of the "
                            "accumulator block must run inside its outer reduce loops, got "
                            f"{[ax.name for ax in rest]}")
    assert all(id(ax) in inner_ids or ax.kind == "spatial" for ax in rest[cut:]), \
        "a nested sum's loops are its outer, inner and spatial axes"
    part = L.Buffer(f"{t.name}_part", acc.shape, t.dtype, scope="local")

    def block_nest(suffix: str, make_store) -> L.Stmt:
        bv = dict(lv)
        bv.update({id(ax): L.Var(f"{t.name}_{ax.name}_{suffix}") for ax in block})
        idx = [bv[id(ax)] for ax in block] or [L.IntImm(0)]
        return _loops(block, bv, make_store(bv, idx), stage.kinds)

    init = block_nest("part", lambda _, a: L.BufferStore(part, L.const(0, t.dtype), a))
    part_idx = [lv[id(ax)] for ax in block] or [L.IntImm(0)]
    update = L.BufferStore(part, L.BufferLoad(part, part_idx) + source, part_idx)

    def step(bv, a) -> L.Stmt:
        value = L.substitute(expand(red.block.expr), vmap_for(bv, clamp=True))
        value = L.substitute(value, {red.block.var: L.BufferLoad(part, a)})
        return L.BufferStore(acc, L.BufferLoad(acc, a) + value, a)

    body = L.seq(init, _loops(rest[cut:], lv, update, stage.kinds), block_nest("step", step))
    return _loops(rest[:cut], lv, L.Allocate(part, body), stage.kinds)
