"""The graph IR: a typed dataflow graph of operator calls (Relay's role in TVM).

Nodes are immutable and typed at construction: building a :class:`Call` runs its op's type
relation, so every node carries a :class:`TensorType`. A dimension is an ``int`` or a symbolic
expression of :mod:`kiln.arith` (ONNX ``dim_param`` inputs: ``sequence_length``,
``2 * sequence_length``, ...); a static model has ints only. A :class:`Function` lists its
parameters and
its outputs; an :class:`IRModule` maps names to functions, with ``"main"`` the model.

Call-like nodes (they have ``args``): :class:`Call` (an operator), :class:`PrimitiveCall` (a
fused kernel, after FuseOps), :class:`FunctionCall` (a composite or an external function, from
the BYOC passes) and :class:`TupleGetItem` (output ``k`` of a multi-output FunctionCall).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln import arith
from kiln.arith import Dim, SymVar
from kiln.errors import ShapeError

_ids = itertools.count()


@dataclass(frozen=True)
class TensorType:
    """Tensor type: ``shape`` (a tuple of dims: ints, or :mod:`kiln.arith` expressions for
    symbolic dims) and ``dtype`` (numpy name, e.g. "float32")."""

    shape: tuple[Dim, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        """Whether every dim is an int."""
        return all(isinstance(d, int) for d in self.shape)

    @property
    def size(self) -> Dim:
        """Element count (an expression when the shape is symbolic)."""
        if self.is_static:
            return int(np.prod(self.shape, dtype=np.int64))
        return arith.prod(self.shape)

    @property
    def nbytes(self) -> Dim:
        return self.size * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"Tensor[({', '.join(map(str, self.shape))}), {self.dtype}]"


class Expr:
    """Base of graph IR nodes. ``checked_type`` is the node's inferred :class:`TensorType`."""

    checked_type: TensorType
    uid: int

    def __hash__(self) -> int:
        return self.uid

    def __eq__(self, other: object) -> bool:
        return self is other


class Var(Expr):
    """A graph input: a named placeholder of a fixed type."""

    def __init__(self, name: str, type_: TensorType):
        self.name = name
        self.checked_type = type_
        self.uid = next(_ids)

    def __repr__(self) -> str:
        return f"%{self.name}: {self.checked_type}"


class Constant(Expr):
    """A constant tensor (weights, folded values). ``data`` is a numpy array.

    A *symbolic* constant is an int64 tensor known at compile time up to shape symbols (the value
    of ONNX ``Shape`` on a symbolic input, and what shape arithmetic makes of it): ``data`` is
    then an object array of ints and :mod:`kiln.arith` expressions, ``checked_type`` says
    int64, and :attr:`is_symbolic` is true. Converters read it as dims (Reshape's shape);
    where it reaches a kernel as data (a comparison of dims deciding an ``If``), the VM makes
    the tensor from its shape heap at run time.
    """

    def __init__(self, data: np.ndarray, name: str | None = None):
        data = np.asarray(data, order="C")  # keeps rank 0 (ascontiguousarray would not)
        dtype = str(data.dtype)
        if data.dtype == object:
            data, dtype = symbolic_array(data), "int64"
        self.data = data
        self.name = name
        self.checked_type = TensorType(tuple(int(d) for d in self.data.shape), dtype)
        self.uid = next(_ids)

    @property
    def is_symbolic(self) -> bool:
        return self.data.dtype == object

    def __repr__(self) -> str:
        return f"const({self.name or ''}{self.checked_type})"


def symbolic_array(values) -> np.ndarray:
    """An int64 array when every element of ``values`` is an integer, else an object array of
    ints and symbolic dims (raises ShapeError for anything else, e.g. a float)."""
    arr = np.asarray(values, dtype=object)
    out = np.empty(arr.size, dtype=object)
    for k, v in enumerate(arr.reshape(-1)):
        if isinstance(v, arith.SymExpr):
            out[k] = v
        elif isinstance(v, (int, np.integer, bool, np.bool_)):
            out[k] = int(v)
        else:
            raise ShapeError(f"a shape value must be an integer or a symbolic dim, got {v!r}")
    out = out.reshape(arr.shape)
    if any(isinstance(v, arith.SymExpr) for v in out.reshape(-1)):
        return out
    return out.astype(np.int64)


class Call(Expr):
    """A call of a registered graph op on ``args`` with static ``attrs``.

    Raises
    ------
    ShapeError
        If the op's type relation rejects the argument types; the message names the op.
    """

    def __init__(self, op: str, args: list[Expr], attrs: dict[str, Any] | None = None,
                 span: str | None = None):
        from kiln.relay.op_registry import get_op

        self.op = get_op(op)
        self.args = list(args)
        self.attrs = dict(attrs or {})
        self.span = span  # where it came from (e.g. the ONNX node name), for error messages
        self.uid = next(_ids)
        try:
            self.checked_type = self.op.infer([a.checked_type for a in self.args], self.attrs)
        except ShapeError as err:
            where = f" (node {span})" if span else ""
            raise ShapeError(f"{op}{where}: {err}") from None

    def __repr__(self) -> str:
        return f"{self.op.name}({', '.join(f'#{a.uid}' for a in self.args)}) : {self.checked_type}"


class PrimitiveCall(Expr):
    """A call of a fused primitive function (TVM: a Call of a Function with Primitive=1).

    ``body`` is a :class:`Function` over one Var per argument with a single output; FuseOps makes
    these, and each becomes one kernel and one ``tvm_op`` node of the graph JSON.
    """

    def __init__(self, body: Function, args: list[Expr], name: str):
        assert len(body.params) == len(args), "primitive call arity"
        self.body = body
        self.args = list(args)
        self.name = name
        self.checked_type = body.outputs[0].checked_type
        self.uid = next(_ids)

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(f'#{a.uid}' for a in self.args)}) : {self.checked_type}"


class FunctionCall(Expr):
    """A call of an inline graph :class:`Function` (TVM: a Call whose op is a Function).

    Made by the BYOC passes: ``body.attrs["Composite"]`` names a composite (MergeComposite:
    a matched pattern kept together, e.g. ``"cblas.conv2d_bias_relu"``), and
    ``body.attrs["Compiler"]`` / ``["global_symbol"]`` mark a function offloaded to an external
    codegen (PartitionGraph). ``body`` may have several outputs; consumers then read output
    ``k`` through :class:`TupleGetItem` and ``checked_type`` is the first output's type.
    """

    def __init__(self, body: Function, args: list[Expr]):
        assert len(body.params) == len(args), "function call arity"
        for p, a in zip(body.params, args):
            if p.checked_type != a.checked_type:
                raise ShapeError(f"function call: argument {a.checked_type} does not match "
                                 f"parameter {p!r}")
        self.body = body
        self.args = list(args)
        self.output_types = [o.checked_type for o in body.outputs]
        self.checked_type = self.output_types[0]
        self.uid = next(_ids)

    @property
    def num_outputs(self) -> int:
        return len(self.output_types)

    @property
    def name(self) -> str:
        """The composite's or the external function's name (for listings and errors)."""
        a = self.body.attrs
        return str(a.get("global_symbol") or a.get("Composite") or "fn")

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(f'#{a.uid}' for a in self.args)}) : {self.checked_type}"


class IfCall(Expr):
    """Run-time control flow (Relax's ``If``): ``then_body`` when ``cond`` (a one-element bool
    tensor) is true, else ``else_body``.

    ``args`` is ``[cond, *captures]``: each branch is a closed :class:`Function` with one
    parameter per capture (the outer values its nodes read), so passes that walk ``args`` see
    every dependency. Several outputs are read through :class:`TupleGetItem`; ``checked_type``
    is the first one's.

    Raises
    ------
    ShapeError
        If the condition is not a one-element bool, or the branches' outputs differ in count or
        type (the message names both types).
    """

    def __init__(self, cond: Expr, then_body: Function, else_body: Function,
                 captures: list[Expr]):
        ct = cond.checked_type
        if ct.dtype != "bool" or ct.size != 1:
            raise ShapeError(f"If: the condition must be one bool, got {ct}")
        for body in (then_body, else_body):
            assert len(body.params) == len(captures), "If: one branch parameter per capture"
        then_types = [o.checked_type for o in then_body.outputs]
        else_types = [o.checked_type for o in else_body.outputs]
        if then_types != else_types:
            raise ShapeError(f"If: the branches' outputs differ: then {list(map(str, then_types))}"
                             f", else {list(map(str, else_types))}")
        self.then_body, self.else_body = then_body, else_body
        self.args = [cond, *captures]
        self.output_types = then_types
        self.checked_type = then_types[0]
        self.uid = next(_ids)

    @property
    def num_outputs(self) -> int:
        return len(self.output_types)

    name = "if"

    def __repr__(self) -> str:
        return f"if(#{self.args[0].uid}) : {self.checked_type}"


class LoopCall(Expr):
    """A run-time loop (ONNX ``Loop`` whose trip count or condition is data).

    ``args`` is ``[max_trip, cond, *initial, *captures]`` (``max_trip`` an int64 scalar,
    ``cond`` a bool scalar). Each iteration runs ``step(i, max_trip, cond) -> (go, i + 1)``
    and, while ``go``, ``body(i, cond, *carried, *captures) -> (cond, *carried, *scan_elems)``.
    The outputs are the final carried values, whose types the body must keep, then one per
    scan element: the elements of every iteration run, stacked along a new axis 0, of type
    ``[count, *elem_shape]``. ``count`` is a *late symbol* (decision 016: a :class:`SymVar`
    with ``lo`` 0, bound where the loop has run); the caller makes it and every rebuild passes
    the same one, so consumers keep their types.

    Raises
    ------
    ShapeError
        If the body's outputs do not match the carried values' types (the message names both),
        or it returns scan elements without a ``count`` symbol (or a count with no element).
    """

    def __init__(self, max_trip: Expr, cond: Expr, initial: list[Expr], captures: list[Expr],
                 step: Function, body: Function, count: SymVar | None = None):
        carried = [e.checked_type for e in initial]
        outs = [o.checked_type for o in body.outputs]
        n = 1 + len(carried)
        if outs[1:n] != carried or outs[0] != TensorType((), "bool"):
            raise ShapeError(f"Loop: the body returns {list(map(str, outs))} for the condition "
                             f"and carried values {list(map(str, carried))}; a carried value "
                             "must keep its type")
        scans = outs[n:]
        if bool(scans) != (count is not None):
            raise ShapeError(f"Loop: {len(scans)} scan output(s) and count symbol {count}: "
                             "stacked outputs need exactly one count symbol")
        if not carried and not scans:
            raise ShapeError("Loop: the body returns neither carried values nor scan outputs")
        assert len(body.params) == 2 + len(initial) + len(captures), "Loop body arity"
        self.step, self.body = step, body
        self.num_carried = len(initial)
        self.count = count
        self.args = [max_trip, cond, *initial, *captures]
        self.output_types = carried + [TensorType((count, *t.shape), t.dtype) for t in scans]
        self.checked_type = self.output_types[0]
        self.uid = next(_ids)

    @property
    def num_scan(self) -> int:
        """How many stacked (scan) outputs follow the carried values."""
        return len(self.output_types) - self.num_carried

    @property
    def num_outputs(self) -> int:
        return len(self.output_types)

    name = "loop"

    def __repr__(self) -> str:
        return f"loop(#{self.args[0].uid}, #{self.args[1].uid}) : {self.checked_type}"


class TupleGetItem(Expr):
    """Output ``index`` of a multi-output :class:`FunctionCall`, :class:`IfCall` or
    :class:`LoopCall` (TVM: TupleGetItem).

    ``args`` is ``[value]`` so that traversals treat it like any call-like node.
    """

    def __init__(self, value: Expr, index: int):
        assert isinstance(value, (FunctionCall, IfCall, LoopCall)), \
            "TupleGetItem of a non-tuple value"
        if not 0 <= index < value.num_outputs:
            raise ShapeError(f"TupleGetItem: index {index} out of range for {value.num_outputs} "
                             "outputs")
        self.args = [value]
        self.index = index
        self.checked_type = value.output_types[index]
        self.uid = next(_ids)

    @property
    def value(self) -> FunctionCall | IfCall | LoopCall:
        return self.args[0]

    def __repr__(self) -> str:
        return f"#{self.value.uid}.{self.index} : {self.checked_type}"


#: node types with ``args`` (traversals expand them)
CALL_NODES = (Call, PrimitiveCall, FunctionCall, TupleGetItem, IfCall, LoopCall)


def uid_mark() -> int:
    """A uid smaller than that of every node made after this call (the frontend tells a
    subgraph's own nodes from the outer ones it reads by it)."""
    return next(_ids)


def with_args(node: Expr, new_args: list[Expr]) -> Expr:
    """``node`` itself if ``new_args`` are its args, else a copy of the call-like ``node`` over
    ``new_args`` (types are inferred again)."""
    if all(a is b for a, b in zip(node.args, new_args)):
        return node
    if isinstance(node, Call):
        return Call(node.op.name, new_args, node.attrs, node.span)
    if isinstance(node, PrimitiveCall):
        return PrimitiveCall(node.body, new_args, node.name)
    if isinstance(node, FunctionCall):
        return FunctionCall(node.body, new_args)
    if isinstance(node, TupleGetItem):
        return TupleGetItem(new_args[0], node.index)
    if isinstance(node, IfCall):
        return IfCall(new_args[0], node.then_body, node.else_body, new_args[1:])
    if isinstance(node, LoopCall):
        n = 2 + node.num_carried
        return LoopCall(new_args[0], new_args[1], new_args[2:n], new_args[n:], node.step,
                        node.body, node.count)
    raise TypeError(f"with_args: {node!r} has no arguments")


@dataclass
class Function:
    """A graph function: ``params`` (inputs) and ``outputs`` (one or more result expressions)."""

    params: list[Var]
    outputs: list[Expr]
    output_names: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.output_names:
            self.output_names = [f"output{i}" for i in range(len(self.outputs))]


@dataclass
class IRModule:
    """Named graph functions; ``mod["main"]`` is the model."""

    functions: dict[str, Function]

    def __getitem__(self, name: str) -> Function:
        return self.functions[name]

    @staticmethod
    def from_function(func: Function) -> IRModule:
        return IRModule({"main": func})


def post_order(outputs: list[Expr]) -> Iterator[Expr]:
    """Yield every node reachable from ``outputs`` once, producers before consumers.

    Iterative (models have thousands of nodes; recursion would hit Python's limit).
    """
    seen: set[int] = set()
    for root in outputs:
        stack: list[tuple[Expr, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node.uid in seen:
                continue
            if expanded or not isinstance(node, CALL_NODES):
                seen.add(node.uid)
                yield node
                continue
            stack.append((node, True))
            for arg in reversed(node.args):
                if arg.uid not in seen:
                    stack.append((arg, False))


def consumers(outputs: list[Expr]) -> dict[int, list[Expr]]:
    """Map each node's uid to the call-like nodes that use it (a node used twice by one call
    counts twice)."""
    users: dict[int, list[Expr]] = {}
    for node in post_order(outputs):
        if isinstance(node, CALL_NODES):
            for arg in node.args:
                users.setdefault(arg.uid, []).append(node)
    return users


def rewrite(func: Function, visit, leaves: dict[int, Expr] | None = None,
            params: list[Var] | None = None) -> Function:
    """Rebuild ``func`` bottom-up: ``visit(call, new_args)`` returns the replacement of each call.

    ``visit`` receives the original call and its already-rewritten arguments and returns an Expr.
    Vars and Constants are kept as they are, except nodes ``leaves`` maps (by uid) to a
    replacement; other call-like nodes (PrimitiveCall, FunctionCall, TupleGetItem, IfCall) are
    rebuilt over their rewritten arguments (:func:`with_args`). ``params`` replaces the
    function's parameters (when ``leaves`` substitutes some of them).
    """
    memo: dict[int, Expr] = dict(leaves or {})
    for node in post_order(func.outputs):
        if node.uid in memo:
            continue
        if isinstance(node, Call):
            new_args = [memo[a.uid] for a in node.args]
            memo[node.uid] = visit(node, new_args)
        elif isinstance(node, CALL_NODES):
            memo[node.uid] = with_args(node, [memo[a.uid] for a in node.args])
        else:
            memo[node.uid] = node
    return Function(func.params if params is None else params,
                    [memo[o.uid] for o in func.outputs], func.output_names, dict(func.attrs))


def same_call(call: Call, new_args: list[Expr]) -> Expr:
    """Return ``call`` itself if its args did not change, else a copy over ``new_args``."""
    if all(a is b for a, b in zip(call.args, new_args)):
        return call
    return Call(call.op.name, new_args, call.attrs, call.span)


def astext(func: Function) -> str:
    """A readable listing of ``func`` (one line a node), for dumps and error messages."""
    lines = []
    names: dict[int, str] = {}
    for p in func.params:
        names[p.uid] = f"%{p.name}"
    for node in post_order(func.outputs):
        if isinstance(node, Var):
            continue
        if isinstance(node, Constant):
            names[node.uid] = f"meta[{node.name or node.uid}]"
            continue
        name = f"%{len(lines)}"
        names[node.uid] = name
        args = ", ".join(names[a.uid] for a in node.args)
        if isinstance(node, PrimitiveCall):
            lines.append(f"  {name} = {node.name}({args}) /* {node.checked_type} */")
            continue
        if isinstance(node, TupleGetItem):
            names[node.uid] = f"{names[node.value.uid]}.{node.index}"
            continue
        if isinstance(node, LoopCall):
            types = ", ".join(str(t) for t in node.output_types)
            inner = "\n".join("    " + ln for ln in astext(node.body).splitlines())
            lines.append(f"  {name} = loop({args}) /* {types} */\n  body\n{inner}")
            continue
        if isinstance(node, IfCall):
            types = ", ".join(str(t) for t in node.output_types)
            branches = "\n".join(f"  {label}\n" + "\n".join("    " + ln for ln in
                                                            astext(b).splitlines())
                                 for label, b in (("then", node.then_body),
                                                  ("else", node.else_body)))
            lines.append(f"  {name} = if({args}) /* {types} */\n{branches}")
            continue
        if isinstance(node, FunctionCall):
            attrs = "".join(f", {k}={v}" for k, v in sorted(node.body.attrs.items()))
            types = ", ".join(str(t) for t in node.output_types)
            inner = "\n".join("  " + ln for ln in astext(node.body).splitlines())
            lines.append(f"  {name} = fn[{node.name}]({args}{attrs}) /* {types} */\n{inner}")
            continue
        attrs = "".join(f", {k}={v}" for k, v in sorted(node.attrs.items()))
        lines.append(f"  {name} = {node.op.name}({args}{attrs}) /* {node.checked_type} */")
    outs = ", ".join(names[o.uid] for o in func.outputs)
    params = ", ".join(f"%{p.name}: {p.checked_type}" for p in func.params)
    return "fn (" + params + ") {\n" + "\n".join(lines) + f"\n  ({outs})\n}}"


def structural_key(func: Function) -> str:
    """A string equal for structurally equal functions (same ops, attrs, types, wiring and
    scalar constant values); used to compile identical fused kernels once."""
    index: dict[int, int] = {}
    parts = []
    for p in func.params:
        index[p.uid] = len(index)
        parts.append(f"param {p.checked_type}")
    for node in post_order(func.outputs):
        if node.uid in index:
            continue
        if isinstance(node, Constant):
            parts.append(f"const {node.checked_type} {node.data.tobytes().hex()[:4096]}")
        elif isinstance(node, Call):
            args = ",".join(str(index[a.uid]) for a in node.args)
            parts.append(f"{node.op.name}({args}) {sorted(node.attrs.items())!r}")
        elif isinstance(node, FunctionCall):
            args = ",".join(str(index[a.uid]) for a in node.args)
            inner = structural_key(node.body).replace("\n", ";")
            parts.append(f"fn({args}) {sorted(node.body.attrs.items())!r} {{{inner}}}")
        elif isinstance(node, TupleGetItem):
            parts.append(f"get({index[node.value.uid]}).{node.index}")
        elif isinstance(node, LoopCall):
            args = ",".join(str(index[a.uid]) for a in node.args)
            body_key = structural_key(node.body).replace("\n", ";")
            parts.append(f"loop({args}) count={node.count!r} {{{body_key}}}")
        elif isinstance(node, IfCall):
            args = ",".join(str(index[a.uid]) for a in node.args)
            then_key, else_key = (structural_key(b).replace("\n", ";")
                                  for b in (node.then_body, node.else_body))
            parts.append(f"if({args}) {{{then_key}}} {{{else_key}}}")
        else:
            raise TypeError(f"structural_key: unexpected node {node!r}")
        index[node.uid] = len(index)
    parts.append("out " + ",".join(str(index[o.uid]) for o in func.outputs))
    return "\n".join(parts)
