"""ONNX control flow: If, Scan and Loop, at compile time or at run time.

- ``If``: with a compile-time condition the chosen branch's nodes are converted in place; a
  condition on data becomes an :class:`~kiln.relay.graph.IfCall` with both branches closed over
  the outer values they read, decided at run time by the VM executor.
- ``Scan`` (opset 9+): over a static length the body is converted once per iteration (scan
  inputs sliced per step, scan outputs stacked along their axis); over a symbolic length it
  becomes a run-time :class:`~kiln.relay.graph.LoopCall` whose carried buffers collect the scan
  outputs.
- ``Loop``: unrolled when the trip count is a compile-time constant (at most
  ``_MAX_UNROLL``) and the condition folds to a constant at every iteration (a constant
  count of 0 gives empty ``[0, *elem]`` scan outputs). Otherwise (a data trip count or
  condition, no trip count, a sentinel count) a run-time :class:`~kiln.relay.graph.LoopCall`:
  carried values keep their types, and each scan output is the iterations' elements stacked
  along a new axis 0, ``[count, *elem_shape]`` over a late symbol ``loop_count_<output>``
  (decision 016) the VM binds after the loop. An element whose shape depends on data the
  body computes (it could change between iterations) is an ``UnsupportedOpError``.

A subgraph sees the enclosing scope's values by name (ONNX's outer-scope references). Each
iteration converts into its own copy of the scope, so body names never collide.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from kiln.arith import SymExpr, SymVar, free_symbols, shape_str
from kiln.errors import ShapeError, UnsupportedOpError
from kiln.frontend.onnx.context import ConvertContext, NotConstantError
from kiln.frontend.onnx.converters.dynamic import fallback, late
from kiln.relay.assume import Assumption, AssumptionNeeded, needed_assumptions
from kiln.relay.graph import (
    CALL_NODES,
    Call,
    Constant,
    Expr,
    Function,
    IfCall,
    LoopCall,
    TensorType,
    TupleGetItem,
    Var,
    uid_mark,
    with_args,
)
from kiln.relay.op.dynamic import bound_by

# convert_node(node, index, opset, values, unavailable, param_values) from the importer
ConvertNode = Callable[..., None]
CONTROL_FLOW_OPS = ("If", "Scan", "Loop")


def convert_control_flow(node: onnx.NodeProto, name: str, opset: int,
                         inputs: list[Expr | None], values: dict[str, Expr],
                         unavailable: dict[str, str], param_values: dict[str, np.ndarray],
                         convert_node: ConvertNode) -> list[Expr | None]:
    """The outputs of control-flow ``node`` (one Expr per ONNX output)."""
    ctx = ConvertContext(node, name, opset, inputs, param_values)
    graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}

    def run(graph: onnx.GraphProto, bound: list[Expr | None],
            refine: dict[SymExpr, int] | None = None) -> list[Expr]:
        scope = _refined(values, refine) if refine else dict(values)
        return _run_subgraph(graph, bound, opset, scope, dict(unavailable), param_values,
                             convert_node, ctx)

    if node.op_type == "If":
        try:
            cond = ctx.const_value(0, "If condition").reshape(-1)
        except NotConstantError:  # a condition on data: decided at run time (the VM)
            return _runtime_if(ctx, graphs, run)
        if cond.size != 1:
            raise ctx.unsupported("condition must have one element")
        return list(run(graphs["then_branch" if cond[0] else "else_branch"], []))
    if node.op_type == "Scan":
        if opset < 9:
            raise ctx.unsupported("Scan before opset 9 (batched form)")
        return _scan(ctx, graphs["body"], run)
    return _loop(ctx, graphs["body"], run)


def _runtime_if(ctx: ConvertContext, graphs: dict, run) -> list[Expr]:
    """An :class:`IfCall` over both branches, each closed over the outer values it reads.

    A condition ``d == c`` on a symbolic dim (exporters' ``squeeze(-1)``: ``If(Shape(x)[2] ==
    1, Squeeze, Identity)``) refines ``d`` to ``c`` in the branch it guards (``match_cast``
    of the values it reads). A branch that does not type-check at the model's symbolic shapes,
    or whose outputs cannot have the guarded branch's types, becomes ``trap``s: taking it at
    run time is an error, as it is for onnxruntime when the shapes do not fit. When neither
    branch converts and one needs an assumption on the input symbols (silero's LSTM state
    batch is its input's), that assumption is raised for the importer to make; one branch
    alone never constrains the model's inputs."""
    refine, guarded = _refinement(ctx)
    mark = uid_mark()
    outs: dict[str, list[Expr] | None] = {}
    errors: dict[str, str] = {}
    needed: list[Assumption] = []
    for key in ("then_branch", "else_branch"):
        try:
            outs[key] = run(graphs[key], [], refine if key == guarded else None)
        except ShapeError as err:  # (an op Kiln lacks stays a compile-time error)
            outs[key], errors[key] = None, str(err)
            needed += needed_assumptions(err)
    good = [k for k in outs if outs[k] is not None]
    if not good and needed:  # the model converts under no shape without it: assume it
        raise AssumptionNeeded(f"neither branch converts: {errors['then_branch']}", needed)
    if not good:
        raise ctx.unsupported(f"neither branch converts: {errors['then_branch']}")
    types = {k: [e.checked_type for e in outs[k]] for k in good}
    if len(good) == 2 and types["then_branch"] != types["else_branch"] and guarded:
        other = "else_branch" if guarded == "then_branch" else "then_branch"
        errors[other] = (f"its outputs {list(map(str, types[other]))} differ from the "
                         f"{guarded.replace('_', ' ')}'s {list(map(str, types[guarded]))}")
        good = [guarded]
    for key in ("then_branch", "else_branch"):
        if key not in good:
            outs[key] = _traps(ctx, f"{ctx.unsupported(key.replace('_', ' '))} cannot run at "
                                    f"these shapes: {errors[key]}", types[good[0]])
    branches = [outs["then_branch"], outs["else_branch"]]
    captures = _outer_refs([e for branch in branches for e in branch], mark)
    then_body, else_body = (_closed(branch, mark, captures) for branch in branches)
    return _outputs(ctx, lambda: IfCall(ctx.input(0), then_body, else_body, captures))


def _refinement(ctx: ConvertContext) -> tuple[dict[SymExpr, int], str | None]:
    """``({d: c}, branch)`` when the If's condition is ``equal``/``not_equal`` of a symbolic dim
    ``d`` and an int ``c`` (the branch where they are equal), else ``({}, None)``."""
    cond = ctx.input(0)
    if not isinstance(cond, Call) or cond.op.name not in ("equal", "not_equal"):
        return {}, None
    try:
        a, b = (ctx.const_value(x, "If condition operand").reshape(-1) for x in cond.args)
    except NotConstantError:
        return {}, None
    if a.size != 1 or b.size != 1:
        return {}, None
    a, b = a[0], b[0]
    if isinstance(b, SymExpr):
        a, b = b, a
    if not isinstance(a, SymExpr) or isinstance(b, SymExpr):
        return {}, None
    return {a: int(b)}, "then_branch" if cond.op.name == "equal" else "else_branch"


def _refined(values: dict[str, Expr], refine: dict[SymExpr, int]) -> dict[str, Expr]:
    """The scope with each value whose shape has a refined dim cast to the refined shape, and
    symbolic constants (shape values) refined alike."""
    scope = dict(values)
    for name, e in values.items():
        if isinstance(e, Constant) and e.is_symbolic:
            dims = e.data.reshape(-1).tolist()
            new = [refine.get(d, d) if isinstance(d, SymExpr) else d for d in dims]
            if new != dims:
                scope[name] = Constant(np.array(new, dtype=object).reshape(e.data.shape))
            continue
        shape = e.checked_type.shape
        new_shape = tuple(refine.get(d, d) if isinstance(d, SymExpr) else d for d in shape)
        if new_shape != shape:
            scope[name] = Call("match_cast", [e], {"shape": new_shape})
    return scope


def _traps(ctx: ConvertContext, message: str, types: list[TensorType]) -> list[Expr]:
    """Outputs of a branch that cannot run: each raises ``message`` at run time."""
    return [ctx.call("trap", [], message=message, shape=t.shape, dtype=t.dtype) for t in types]


def _outputs(ctx: ConvertContext, make) -> list[Expr]:
    """The outputs of the control-flow node ``make()`` builds (one Expr per ONNX output); its
    type error (branches or a body that disagree) is an UnsupportedOpError naming the node."""
    try:
        node = make()
    except ShapeError as err:
        raise ctx.unsupported(str(err)) from None
    if node.num_outputs == 1:
        return [node]
    return [TupleGetItem(node, k) for k in range(node.num_outputs)]


#: the trip count of a Loop without one (ONNX: run while the condition holds)
_NO_LIMIT = np.iinfo(np.int64).max
#: a larger constant trip count is a sentinel, not a bound of the count (no dim exceeds it)
_MAX_COUNT = 1 << 40


def _runtime_loop(ctx: ConvertContext, body: onnx.GraphProto, run) -> list[Expr]:
    """A :class:`LoopCall`: the body closed over the outer values it reads, with parameters
    (iteration, condition, *carried, *captures); its carried values keep their types. Scan
    outputs (body outputs after the carried ones) become the loop's stacked outputs
    ``[count, *elem_shape]`` over a late symbol ``loop_count_<output>`` (decision 016), bound
    where the loop has run; their element type must be one for every iteration.

    Raises
    ------
    UnsupportedOpError
        No carried value and no scan output, a trip count or condition that is not one int64
        / bool value, a carried value whose type the body changes, or a scan element whose
        shape depends on data computed in the body (it may change between iterations)."""
    args = ctx.inputs
    max_trip = _scalar(ctx, args[0], Constant(np.array(_NO_LIMIT, np.int64)), "int64")
    cond = _scalar(ctx, args[1] if len(args) > 1 else None, Constant(np.array(True)), "bool")
    initial = list(args[2:])
    k_scan = len(body.output) - 1 - len(initial)
    if not initial and not k_scan:
        raise ctx.unsupported("a run-time Loop without carried values has no effect")
    iter_var = Var("iteration", TensorType((), "int64"))
    cond_var = Var("cond", TensorType((), "bool"))
    carried = [Var(f"carried{k}", e.checked_type) for k, e in enumerate(initial)]
    mark = uid_mark()
    outs = run(body, [iter_var, cond_var, *carried])
    outs = [_scalar(ctx, outs[0], None, "bool"), *outs[1:]]
    _check_scan_elements(ctx, body, outs, len(initial), mark)
    loop_body, captures = _loop_body([iter_var, cond_var, *carried], outs, mark)
    count = _count_symbol(ctx, len(initial)) if k_scan else None
    return _outputs(ctx, lambda: LoopCall(max_trip, cond, initial, captures, _loop_step(),
                                          loop_body, count))


def _loop_body(params: list[Var], outs: list[Expr], mark: int
               ) -> tuple[Function, list[Expr]]:
    """A loop body over its own ``params`` (iteration, condition, state) and one more
    parameter per outer value its nodes read, and those outer values (the captures)."""
    own = {v.uid for v in params}
    captures = [e for e in _outer_refs(outs, mark) if e.uid not in own]
    closed = _closed(outs, mark, captures)
    return Function([*params, *closed.params], closed.outputs), captures


def _count_symbol(ctx: ConvertContext, first_scan: int) -> SymVar:
    """The late symbol of a run-time Loop's iteration count, named after its first scan
    output; bounded by the trip count when that is a constant."""
    hi = None
    if ctx.inputs[0] is not None:
        try:
            (hi,) = ctx.const_value(0, "Loop trip count").reshape(-1).tolist()
        except NotConstantError:
            pass
    known = isinstance(hi, int) and 0 <= hi <= _MAX_COUNT  # not a "loop forever" sentinel
    name, lo, hi = late(ctx, "loop_count", hi if known else None, output=first_scan)
    return SymVar(name, lo, hi)


def _check_scan_elements(ctx: ConvertContext, body: onnx.GraphProto, outs: list[Expr],
                         num_carried: int, mark: int) -> None:
    """Each scan element of a run-time Loop body has one type for every iteration: none of
    its dims may be a late symbol bound inside the body (a NonZero's count...)."""
    inner: set[str] = set()
    for node in _inner_post_order(outs, mark):
        if node.uid >= mark:
            inner |= {s.name for s in bound_by(node)}
    for k, e in enumerate(outs[1 + num_carried:]):
        shape = e.checked_type.shape
        names = sorted({s.name for d in shape for s in free_symbols(d)} & inner)
        if names:
            where = body.output[1 + num_carried + k].name
            raise ctx.unsupported(f"scan output '{where}' has shape {shape_str(shape)}, which "
                                  f"depends on data computed in the body ({', '.join(names)}): "
                                  "it may change between iterations, and a stacked output "
                                  "needs one element shape")


def _scalar(ctx: ConvertContext, e: Expr | None, default: Expr | None, dtype: str) -> Expr:
    """``e`` (a one-element tensor) as a rank-0 ``dtype`` value; ``default`` when omitted."""
    if e is None:
        assert default is not None, "a required loop scalar"
        return default
    t = e.checked_type
    if t.dtype != dtype or t.size != 1:
        raise ctx.unsupported(f"expected one {dtype} value, got {t}")
    return ctx.reshape(e, ())


def _loop_step() -> Function:
    """``(i, max_trip, cond) -> (i < max_trip and cond, i + 1)``: the test before each
    iteration, compiled into kernels like the body."""
    i = Var("i", TensorType((), "int64"))
    m = Var("max_trip", TensorType((), "int64"))
    c = Var("cond", TensorType((), "bool"))
    go = Call("logical_and", [Call("less", [i, m]), c])
    return Function([i, m, c], [go, Call("add", [i, Constant(np.array(1, np.int64))])])


def _inner_post_order(outputs: list[Expr], mark: int):
    """Post-order over the nodes made after ``mark`` (a subgraph's), with the outer nodes they
    read as leaves."""
    seen: set[int] = set()
    for root in outputs:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node.uid in seen:
                continue
            if expanded or node.uid < mark or not isinstance(node, CALL_NODES):
                seen.add(node.uid)
                yield node
                continue
            stack.append((node, True))
            stack.extend((a, False) for a in reversed(node.args) if a.uid not in seen)


def _outer_refs(outputs: list[Expr], mark: int) -> list[Expr]:
    """The outer values (not constants) a subgraph's nodes read, in creation order."""
    found = {n.uid: n for n in _inner_post_order(outputs, mark)
             if n.uid < mark and not isinstance(n, Constant)}
    return [found[k] for k in sorted(found)]


def _closed(outputs: list[Expr], mark: int, captures: list[Expr]) -> Function:
    """The subgraph as a Function of one parameter per capture."""
    params = [Var(f"capture{k}", c.checked_type) for k, c in enumerate(captures)]
    memo: dict[int, Expr] = {c.uid: p for c, p in zip(captures, params)}
    for node in _inner_post_order(outputs, mark):
        if node.uid in memo or node.uid < mark:
            continue
        if isinstance(node, CALL_NODES):
            memo[node.uid] = with_args(node, [memo.get(a.uid, a) for a in node.args])
    return Function(params, [memo.get(o.uid, o) for o in outputs])


def _run_subgraph(graph: onnx.GraphProto, bound: list[Expr | None], opset: int,
                  scope: dict[str, Expr], unavailable: dict[str, str],
                  param_values: dict[str, np.ndarray], convert_node: ConvertNode,
                  ctx: ConvertContext) -> list[Expr]:
    if len(bound) != len(graph.input):
        raise ctx.unsupported(f"subgraph '{graph.name}' takes {len(graph.input)} inputs, "
                              f"given {len(bound)}")
    for value_info, expr in zip(graph.input, bound):
        if expr is None:
            raise ctx.unsupported(f"subgraph input '{value_info.name}' has no value")
        scope[value_info.name] = expr
    for init in graph.initializer:
        scope[init.name] = Constant(numpy_helper.to_array(init), name=init.name)
    for k, inner in enumerate(graph.node):
        convert_node(inner, k, opset, scope, unavailable, param_values)
    outs = []
    for out in graph.output:
        if out.name in unavailable:
            raise UnsupportedOpError(unavailable[out.name])
        if out.name not in scope:
            raise ctx.unsupported(f"subgraph output '{out.name}' is not produced")
        outs.append(scope[out.name])
    return outs


def _take(ctx: ConvertContext, x: Expr, axis: int, index: int) -> Expr:
    """``x[..., index, ...]`` along ``axis`` with that axis removed."""
    shape = x.checked_type.shape
    begin, end = [0] * len(shape), list(shape)
    begin[axis], end[axis] = index, index + 1
    part = ctx.call("strided_slice", [x], begin=tuple(begin), end=tuple(end),
                    strides=(1,) * len(shape))
    return ctx.reshape(part, shape[:axis] + shape[axis + 1:])


def _stack(ctx: ConvertContext, parts: list[Expr], axis: int) -> Expr:
    shape = parts[0].checked_type.shape
    axis = axis % (len(shape) + 1)
    lifted = [ctx.reshape(p, shape[:axis] + (1,) + shape[axis:]) for p in parts]
    return lifted[0] if len(lifted) == 1 else ctx.call("concatenate", lifted, axis=axis)


def _scan(ctx: ConvertContext, body: onnx.GraphProto, run) -> list[Expr | None]:
    m = int(ctx.attr("num_scan_inputs"))
    args = [ctx.input(k) for k in range(len(ctx.inputs))]
    n = len(args) - m
    states, scans = args[:n], args[n:]
    in_dirs = ctx.ints("scan_input_directions", (0,) * m)
    in_axes = ctx.ints("scan_input_axes", (0,) * m)
    k_out = len(body.output) - n
    out_dirs = ctx.ints("scan_output_directions", (0,) * k_out)
    out_axes = ctx.ints("scan_output_axes", (0,) * k_out)
    axes = [a % x.checked_type.ndim for a, x in zip(in_axes, scans)]
    lengths = {x.checked_type.shape[a] for a, x in zip(axes, scans)}
    if len(lengths) != 1:
        raise ctx.unsupported(f"scan inputs have different lengths {sorted(lengths)}")
    (length,) = lengths
    if not isinstance(length, int):
        return _runtime_scan(ctx, body, run, states, scans, axes, in_dirs, out_dirs, out_axes,
                             length)
    if length == 0:
        raise ctx.unsupported("zero-length scan")
    steps: list[list[Expr]] = []
    for t in range(length):
        elems = [_take(ctx, x, a, length - 1 - t if d else t)
                 for x, a, d in zip(scans, axes, in_dirs)]
        outs = run(body, [*states, *elems])
        states = outs[:n]
        steps.append(outs[n:])
    results: list[Expr | None] = list(states)
    for j in range(k_out):
        parts = [s[j] for s in steps]
        if out_dirs[j]:
            parts.reverse()
        results.append(_stack(ctx, parts, out_axes[j]))
    return results


def _runtime_scan(ctx: ConvertContext, body: onnx.GraphProto, run, states: list[Expr],
                  scans: list[Expr], axes: list[int], in_dirs, out_dirs, out_axes,
                  length: SymExpr) -> list[Expr | None]:
    """A Scan over a symbolic length as a :class:`LoopCall` of ``length`` iterations: step
    ``i`` takes element ``i`` (or ``length - 1 - i`` for a reverse input) of each scan input,
    runs the body, and writes each scan output's element into a ``[length, ...]`` buffer
    carried by the loop (``scatter_nd`` at row ``i``, or ``length - 1 - i`` reversed); the
    buffers are moved to their output axes after the loop. Each iteration copies the buffers
    (the loop's carried values): O(length²) bytes moved, fine for the sequences Scan models
    carry, not for long ones."""
    i64 = TensorType((), "int64")
    iter_var, cond_var = Var("iteration", i64), Var("cond", TensorType((), "bool"))
    state_vars = [Var(f"state{k}", x.checked_type) for k, x in enumerate(states)]
    last = Constant(np.array([length - 1], dtype=object))
    mark = uid_mark()
    flipped = ctx.reshape(ctx.call("subtract", [last, ctx.reshape(iter_var, (1,))]), ())

    def step_index(reverse: int) -> Expr:
        return flipped if reverse else iter_var

    elems = [ctx.call("take", [x, step_index(d)], axis=a)
             for x, a, d in zip(scans, axes, in_dirs)]
    outs = run(body, [*state_vars, *elems])
    n = len(states)
    buffers, updated = [], []
    for k, elem in enumerate(outs[n:]):
        t = elem.checked_type
        buf = Var(f"scan_output{k}", TensorType((length, *t.shape), t.dtype))
        row = ctx.reshape(step_index(out_dirs[k]), (1, 1))
        updated.append(ctx.call("scatter_nd", [buf, row, ctx.reshape(elem, (1, *t.shape))],
                                reduction="none"))
        buffers.append(buf)
    body_outs = [Constant(np.array(True)), *outs[:n], *updated]
    loop_body, captures = _loop_body([iter_var, cond_var, *state_vars, *buffers], body_outs,
                                     mark)
    zeros = [ctx.call("expand", [Constant(np.zeros((), b.checked_type.dtype))],
                      newshape=b.checked_type.shape) for b in buffers]
    trips = Constant(np.array(length, dtype=object))
    results = _outputs(ctx, lambda: LoopCall(trips, Constant(np.array(True)),
                                             [*states, *zeros], captures, _loop_step(),
                                             loop_body))
    stacked = results[n:]
    for k, buf in enumerate(stacked):
        axis = out_axes[k] % buf.checked_type.ndim
        if axis:
            perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, buf.checked_type.ndim))
            stacked[k] = ctx.call("transpose", [buf], axes=tuple(perm))
    return results[:n] + stacked


_MAX_UNROLL = 1024


def _loop(ctx: ConvertContext, body: onnx.GraphProto, run) -> list[Expr | None]:
    """A Loop unrolled when its trip count is a constant (up to ``_MAX_UNROLL``) and its
    condition folds to a constant at every iteration; otherwise a run-time
    :class:`LoopCall` (:func:`_runtime_loop`), scan outputs included.

    Raises
    ------
    NotConstantError
        Under :func:`~kiln.frontend.onnx.context.static_values_only`, for a Loop with scan
        outputs whose trip count or condition is data (their count would be a data-dependent
        shape): the ONNX backend then binds those inputs and unrolls."""
    args = ctx.inputs
    k_scan = len(body.output) - 1 - len(args[2:])
    if args[0] is None:
        return _runtime_loop(ctx, body, run)  # runs while the condition holds
    try:
        (trips,) = ctx.const_value(0, "Loop trip count").reshape(-1)
        keep_going = True
        if len(args) > 1 and args[1] is not None:
            keep_going = bool(ctx.const_value(1, "Loop condition").reshape(-1)[0])
    except NotConstantError as err:
        if k_scan:  # stacked outputs over a data count: a data-dependent shape
            fallback(err)
        return _runtime_loop(ctx, body, run)
    if not isinstance(trips, (int, np.integer)) or trips > _MAX_UNROLL:
        return _runtime_loop(ctx, body, run)  # a symbolic or sentinel trip count
    carried = [a for a in args[2:]]
    steps: list[list[Expr]] = []
    for i in range(int(trips)):
        if not keep_going:
            break
        outs = run(body, [Constant(np.array(i, np.int64)), Constant(np.array(True)), *carried])
        try:
            keep_going = bool(ctx.const_value(outs[0], "Loop condition").reshape(-1)[0])
        except NotConstantError as err:
            if k_scan:
                fallback(err)
            return _runtime_loop(ctx, body, run)
        carried = outs[1:1 + len(carried)]
        steps.append(outs[1 + len(carried):])
    if k_scan and not steps:
        return _empty_scans(ctx, body, run, carried)
    results: list[Expr | None] = list(carried)
    for j in range(k_scan):
        results.append(_stack(ctx, [s[j] for s in steps], 0))
    return results


def _empty_scans(ctx: ConvertContext, body: onnx.GraphProto, run,
                 carried: list[Expr]) -> list[Expr | None]:
    """A constant Loop that runs no iteration: its carried inputs, and each scan output an
    empty ``[0, *elem_shape]`` constant (the element types from converting the body once);
    a run-time loop when an element shape is symbolic."""
    outs = run(body, [Constant(np.array(0, np.int64)), Constant(np.array(True)), *carried])
    types = [e.checked_type for e in outs[1 + len(carried):]]
    if not all(t.is_static for t in types):
        return _runtime_loop(ctx, body, run)
    return [*carried, *(Constant(np.zeros((0, *t.shape), t.dtype)) for t in types)]
