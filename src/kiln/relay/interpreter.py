"""Reference interpreter of the graph IR: runs each op's numpy ``ref`` in dependency order.

It is the executable definition of graph-IR semantics: FoldConstant evaluates constant
subgraphs with it, and tests use it as the oracle of the compiled code. Iterative (via
:func:`kiln.relay.graph.post_order`) and frees each intermediate value after its last use, so whole
models run in bounded memory.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from kiln import arith
from kiln.arith import SymVar, shape_str
from kiln.errors import KilnError, ShapeError
from kiln.relay.graph import (
    CALL_NODES,
    Call,
    Constant,
    Expr,
    Function,
    FunctionCall,
    IfCall,
    LoopCall,
    PrimitiveCall,
    TensorType,
    TupleGetItem,
    Var,
    post_order,
    symbolic_array,
)


def evaluate(func: Function, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate ``func`` on numpy inputs.

    Parameters
    ----------
    func : Function
        The graph function; may contain ``Call``, fused ``PrimitiveCall`` and BYOC
        ``FunctionCall`` / ``TupleGetItem`` nodes (a function call runs its body here).
    inputs : dict[str, np.ndarray]
        A value for every parameter of ``func``, by Var name, of exactly the Var's shape (dtype is
        converted to the Var's dtype).

    Returns
    -------
    list[np.ndarray]
        One array per output of ``func``, in order.

    Raises
    ------
    KilnError
        If an input is missing; :class:`ShapeError` if one has the wrong shape.
    """
    env: dict[int, np.ndarray] = {}
    symbols: dict[str, int] = {}
    for var in func.params:
        if var.name not in inputs:
            raise KilnError(f"graph_eval: no value for input '{var.name}'")
        value = np.asarray(inputs[var.name])
        if not _matches(var.checked_type.shape, value.shape, symbols):
            raise ShapeError(f"graph_eval: input '{var.name}' has shape {value.shape}, expected "
                             f"{shape_str(var.checked_type.shape)}")
        env[var.uid] = value.astype(var.checked_type.dtype, copy=False)
    return _run(func.outputs, env, symbols)


def _matches(shape, actual, symbols: dict[str, int]) -> bool:
    """Whether ``actual`` fits ``shape``, binding its symbols (a symbolic model evaluated at
    one shape)."""
    if len(shape) != len(actual):
        return False
    for d, n in zip(shape, actual):
        if isinstance(d, SymVar) and d.name not in symbols:
            symbols[d.name] = int(n)
    return all(arith.evaluate(d, symbols) == n for d, n in zip(shape, actual))


def evaluate_call(call: Call, args: list[np.ndarray],
                  symbols: dict[str, int] | None = None) -> np.ndarray:
    """Run one op's numpy reference on ``args``; checks the result against the inferred type
    (its symbolic dims evaluated with ``symbols``)."""
    attrs = _concrete(call.attrs, symbols) if symbols else call.attrs
    symbolic = any(isinstance(a, np.ndarray) and a.dtype == object for a in args)
    if symbolic and call.op.name in arith.COMPARISONS:
        return _compare_dims(call.op.name, *args)
    out = np.asarray(call.op.ref(*args, **attrs))
    want = call.checked_type
    if symbolic:
        return _symbolic_result(call, out)
    if call.op.runtime and symbols is not None:
        _bind_late(call, out, symbols)
    if not want.is_static:
        want = TensorType(tuple(arith.evaluate(d, symbols or {}) for d in want.shape),
                          want.dtype)
    assert tuple(out.shape) == want.shape and str(out.dtype) == want.dtype, (
        f"{call.op.name}: reference gave {out.shape} {out.dtype}, type relation says {want}")
    return out


def _bind_late(call: Call, out: np.ndarray, symbols: dict[str, int]) -> None:
    """Bind the data-dependent dims of a ``dyn.*`` call's result (again each time it runs: in
    a loop body they change) and check the rest of its shape."""
    from kiln.relay.op.dynamic import bound_by

    for s in bound_by(call):
        symbols.pop(s.name, None)
    if not _matches(call.checked_type.shape, out.shape, symbols):
        raise ShapeError(f"{call.op.name}: the result's shape {list(out.shape)} does not fit "
                         f"{shape_str(call.checked_type.shape)}")


def _loop(node: LoopCall, args: list, symbols) -> np.ndarray | tuple:
    """A run-time loop, run in numpy: the step decides, the body updates the carried values
    and yields one element per scan output, stacked along a new axis 0 after the loop (an
    empty ``[0, *elem_shape]`` when no iteration ran); binds the loop's count symbol."""
    max_trip, cond = args[0], args[1]
    n = 2 + node.num_carried
    carried, captures = list(args[2:n]), args[n:]
    scans: list[list[np.ndarray]] = [[] for _ in range(node.num_scan)]
    i = np.array(0, np.int64)
    while True:
        step = {p.uid: v for p, v in zip(node.step.params, (i, max_trip, cond))}
        go, i_next = _run(node.step.outputs, step, symbols)
        if not bool(go):
            break
        inner = {p.uid: v for p, v in zip(node.body.params, (i, cond, *carried, *captures))}
        cond, *outs = _run(node.body.outputs, inner, symbols)
        carried = outs[:node.num_carried]
        for acc, elem in zip(scans, outs[node.num_carried:]):
            acc.append(np.asarray(elem))
        i = i_next
    results = carried + [_stacked(node, k, acc, symbols)
                         for k, acc in enumerate(scans)]
    return results[0] if len(results) == 1 else tuple(results)


def _stacked(node: LoopCall, k: int, elems: list[np.ndarray], symbols) -> np.ndarray:
    """Scan output ``k`` of ``node``: ``elems`` stacked along a new axis 0; binds the count
    symbol (again each time the loop runs) and checks the elements' shape."""
    t = node.output_types[node.num_carried + k]
    elem_shape = tuple(arith.evaluate(d, symbols or {}) for d in t.shape[1:])
    for it, e in enumerate(elems):
        if e.shape != elem_shape:
            raise ShapeError(f"loop: scan output {k} has shape {list(e.shape)} at iteration "
                             f"{it}, expected {list(elem_shape)}")
    out = (np.stack(elems) if elems else np.zeros((0, *elem_shape))).astype(t.dtype, copy=False)
    if symbols is not None and node.count is not None:
        symbols[node.count.name] = len(elems)
    return out


def _concrete(value, symbols: dict[str, int]):
    """Attribute values with their symbolic dims evaluated (a reshape's ``newshape``, a slice's
    ``end``...)."""
    if isinstance(value, dict):
        return {k: _concrete(v, symbols) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_concrete(v, symbols) for v in value)
    if isinstance(value, arith.SymExpr):
        return arith.evaluate(value, symbols)
    return value


def _compare_dims(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A comparison of symbolic dims, element by element (raises arith.UndecidedError where
    the bounds do not decide it; Python's ``==`` on expressions would compare their form)."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
    flat = [arith.compare(op, x, y) for x, y in zip(a.reshape(-1).tolist(),
                                                      b.reshape(-1).tolist())]
    return np.array(flat, dtype=bool).reshape(a.shape)


def _symbolic_result(call: Call, out: np.ndarray) -> np.ndarray:
    """The result of an op over symbolic values (shape arithmetic on ``Shape``'s result): an
    object array of dims, or a plain array when every element folded to a number."""
    want = call.checked_type
    if tuple(out.shape) != want.shape:
        raise ShapeError(f"{call.op.name}: symbolic evaluation gave shape {out.shape}, "
                         f"expected {want.shape}")
    if out.dtype != object:
        return out.astype(want.dtype)
    if want.dtype == "bool":  # a comparison of dims the bounds cannot decide
        raise ShapeError(f"{call.op.name}: cannot decide a comparison of symbolic dims "
                         f"{out.reshape(-1).tolist()} at compile time")
    if np.dtype(want.dtype).kind not in "iu":
        raise ShapeError(f"{call.op.name}: symbolic dims cannot become {want.dtype}")
    return symbolic_array(out)


def _constant_value(data: np.ndarray, symbols: dict[str, int] | None) -> np.ndarray:
    """A Constant's value: a symbolic shape value (an object array: a Range from ``n``) is
    its numbers once the input shapes bound every symbol in it, else as it is (evaluated at
    compile time, the shape arithmetic on it stays symbolic)."""
    if data.dtype != object or not symbols:
        return data
    flat = data.reshape(-1).tolist()
    if any(s.name not in symbols for v in flat if isinstance(v, arith.SymExpr)
           for s in arith.free_symbols(v)):
        return data
    return np.array([arith.evaluate(v, symbols) for v in flat], np.int64).reshape(data.shape)


def _run(outputs: list[Expr], env: dict[int, np.ndarray],
         symbols: dict[str, int] | None = None) -> list[np.ndarray]:
    order = list(post_order(outputs))
    uses: Counter[int] = Counter()
    for node in order:
        if isinstance(node, CALL_NODES):
            uses.update(a.uid for a in node.args)
    uses.update(o.uid for o in outputs)
    for node in order:
        if isinstance(node, Var):
            if node.uid not in env:
                raise KilnError(f"graph_eval: free variable '{node.name}'")
            continue
        if isinstance(node, Constant):
            env[node.uid] = _constant_value(node.data, symbols)
            continue
        args = [env[a.uid] for a in node.args]
        if isinstance(node, (PrimitiveCall, FunctionCall)):
            inner = {p.uid: v for p, v in zip(node.body.params, args)}
            outs = _run(node.body.outputs, inner, symbols)
            env[node.uid] = outs[0] if len(outs) == 1 else tuple(outs)
        elif isinstance(node, TupleGetItem):
            env[node.uid] = args[0][node.index]
        elif isinstance(node, LoopCall):
            env[node.uid] = _loop(node, args, symbols)
        elif isinstance(node, IfCall):
            body = node.then_body if bool(np.asarray(args[0]).reshape(-1)[0]) else node.else_body
            inner = {p.uid: v for p, v in zip(body.params, args[1:])}
            outs = _run(body.outputs, inner, symbols)
            env[node.uid] = outs[0] if len(outs) == 1 else tuple(outs)
        else:
            env[node.uid] = evaluate_call(node, args, symbols)
        for a in node.args:
            uses[a.uid] -= 1
            if uses[a.uid] == 0:
                env.pop(a.uid, None)
    return [env[o.uid] for o in outputs]
