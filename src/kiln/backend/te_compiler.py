"""Lower a fused primitive function to a packed loop-IR kernel (TVM's TECompiler / CompileEngine).

Steps, in the fixed order docs/design.md §1.5 names (``KILN_DUMP_IR=dir`` writes each stage):
compute (topi) → tensor-level schedule → lower → Simplify → loop schedule → FastExp (float32
``exp`` as vectorizable arithmetic) → MakePackedAPI.
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.errors import CompileError
from kiln.relay.graph import Call, Constant, Function, PrimitiveCall, Var, post_order
from kiln.schedules import schedule_loops, schedule_te, small_extents
from kiln.tir import loop as L
from kiln.tir import te
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.fast_exp import lower_fast_exp
from kiln.tir.transform.make_packed_api import make_packed_api
from kiln.tir.transform.simplify import simplify
from kiln.tir.verify import verify


def to_te(body: Function) -> tuple[list[te.Tensor], te.Tensor]:
    """Apply each op's compute to placeholders of ``body``'s params; returns (inputs, output)."""
    tensors: dict[int, te.Tensor] = {}
    inputs = []
    for p in body.params:
        t = te.placeholder(p.checked_type.shape, p.checked_type.dtype, p.name)
        tensors[p.uid] = t
        inputs.append(t)
    for node in post_order(body.outputs):
        if isinstance(node, Var):
            continue
        if isinstance(node, Constant):
            value = node.data.reshape(-1)[0].item()
            tensors[node.uid] = te.compute(node.checked_type.shape,
                                           lambda *i, v=value, d=node.checked_type.dtype:
                                           L.const(v, d), name="const", tag="elemwise")
            continue
        assert isinstance(node, Call), f"unexpected node {node!r} in a primitive function"
        compute = node.op.compute
        if compute is None:
            where = f" (node {node.span})" if node.span else ""
            raise CompileError(f"no compute definition for op {node.op.name}{where}")
        tensors[node.uid] = compute([tensors[a.uid] for a in node.args], node.attrs,
                                    node.checked_type)
    return inputs, tensors[body.outputs[0].uid]


def lower_primitive(call: PrimitiveCall, name: str) -> L.PrimFunc:
    """The packed kernel ``name`` computing ``call.body``.

    Raises
    ------
    CompileError
        If an op has no compute definition or the kernel cannot be lowered.
    """
    arg_names = [p.name for p in call.body.params] + ["out"]
    return make_packed_api(lower_unpacked(call, name), arg_names)



def lower_unpacked(call: PrimitiveCall, name: str) -> L.PrimFunc:
    """The kernel of :func:`lower_primitive` before MakePackedAPI: one buffer parameter per
    argument then the output, what the loop-IR interpreter runs."""
    inputs, output = to_te(call.body)
    sch = schedule_te(Schedule(output))
    func = _checked(_small_extent_version(call, lower(sch, inputs, name), sch), "0_lower")
    func = _checked(simplify(func), "1_simplify")
    func = _checked(schedule_loops(func), "2_schedule")
    return _checked(lower_fast_exp(func), "3_fast_exp")


def _small_extent_version(call: PrimitiveCall, func: L.PrimFunc, sch: Schedule,
                          version: int = 1) -> L.PrimFunc:
    """``func``, or — when its schedule blocks a symbolic axis with a tail (e.g. 6-row register
    blocks over ``batch x sequence`` rows) — ``if extent < least: <unblocked version> else:
    func``. A tail block over one row computes its whole block for it (MiniLM at one token:
    each dense 2.7x slower than the static kernel), so one row takes the unblocked version; a
    block moved back to the extent's end (``split(tail="shift")``) needs a whole block. A
    version that still blocks a symbolic axis (a matmul-like einsum's one-row form) gets a
    version of its own the same way (``version`` 2: kiln.tir.te.SMALL_EXTENTS)."""
    # (the axis's extent, the least extent the blocked version takes); from two rows on one
    # tail block streams the operands once, not once a row (MiniLM at 5 tokens: 1.57x -> 1.0x
    # onnxruntime's time)
    tails = [(extent, 2) for stage in sch.stages.values() for extent in stage.tails.values()]
    tails += [(extent, stage.splits[k][1].extent) for stage in sch.stages.values()
              for k, extent in stage.shifted.items()]
    tails = [(e, least) for e, least in tails if not isinstance(e, int)]  # static: no choice
    if not tails:
        return func
    assert version <= te.SMALLEST_VERSION, f"{func.name}: version {version - 1} still has blocks"
    with small_extents(version):
        inputs, output = to_te(call.body)
        small_sch = schedule_te(Schedule(output))
        small = lower(small_sch, inputs, func.name, func.params)
    small = _small_extent_version(call, small, small_sch, version + 1)
    cond = L.logical_or(*(L.as_index(extent) < factor for extent, factor in tails))
    return L.PrimFunc(func.name, func.params, L.IfThenElse(cond, small.body, func.body),
                      dict(func.attrs))


def _checked(func: L.PrimFunc, stage: str) -> L.PrimFunc:
    """Dump ``func`` after ``stage`` (KILN_DUMP_IR) and verify it (KILN_DEBUG)."""
    _dump(func, stage)
    if os.environ.get("KILN_DEBUG"):
        verify(func)
    return func


def _dump(func: L.PrimFunc, stage: str) -> None:
    folder = os.environ.get("KILN_DUMP_IR")
    if not folder:
        return
    from kiln.tir.text import astext

    path = Path(folder) / f"{func.name}.{stage}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(astext(func))
