"""ONNX ModelProto → graph IR (TVM: ``relay.frontend.from_onnx``).

The importer walks the (topologically sorted) ONNX graph once. Initializers become parameter
Vars named like the initializer, with their values returned in ``params``; the other graph
inputs become input Vars with static shapes. Each node is converted by the converter registered
for its op type and the model's opset (:mod:`kiln.frontend.onnx.registry`); an op without one
that ONNX defines as a function is converted through its function body
(:mod:`kiln.frontend.onnx.functions`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from kiln import arith
from kiln.arith import Dim, SymVar
from kiln.errors import KilnError, ShapeError, UnsupportedOpError
from kiln.frontend.onnx import converters  # noqa: F401  (registers the converters)
from kiln.frontend.onnx.body import BODY_OPSET, Body
from kiln.frontend.onnx.context import ConvertContext, NotConstantError, onnx_dtype
from kiln.frontend.onnx.contrib import MS_DOMAIN, expand_contrib
from kiln.frontend.onnx.control_flow import CONTROL_FLOW_OPS, convert_control_flow
from kiln.frontend.onnx.functions import expand_function
from kiln.frontend.onnx.recurrent_scan import needs_scan, recurrent_scan
from kiln.frontend.onnx.registry import find_converter
from kiln.frontend.onnx.support import DEFAULT_DOMAINS, check_supported
from kiln.relay.assume import Assumption, needed_assumptions
from kiln.relay.graph import (
    Call,
    Expr,
    Function,
    IRModule,
    TensorType,
    Var,
    post_order,
)
from kiln.relay.provenance import ONNX_NODES, NodeInfo

#: bounds of a symbolic dim: (lo, hi) or (lo, hi, divisor); hi None is unbounded
DimBound = tuple

logger = logging.getLogger("kiln")

MIN_OPSET, MAX_OPSET = 1, 28


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Read and check an ONNX model file.

    Parameters
    ----------
    path : str or Path
        A ``.onnx`` file (external tensor data next to it is loaded too).

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    KilnError
        If the file is missing or unreadable, is not a valid (or is a truncated) ONNX protobuf,
        or fails ``onnx.checker``; the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise KilnError(f"cannot read ONNX model '{path}': no such file")
    try:
        model = onnx.load(str(path))
    except (DecodeError, OSError, ValueError, RuntimeError) as err:
        raise KilnError(f"'{path}' is not a valid ONNX model: {err}") from None
    try:
        _check_model(model)
    except (onnx.checker.ValidationError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise KilnError(f"'{path}' is not a valid ONNX model (truncated or corrupt?): "
                        f"{first}") from None
    return model


def _check_model(model: onnx.ModelProto) -> None:
    """``onnx.checker.check_model``, except that a graph input or output typed without a shape
    field is accepted, as onnxruntime accepts it: the checker requires the field (an empty
    one is a rank-0 tensor), so one is set for the check alone."""
    graph = model.graph
    shapeless = [vi.type.tensor_type for vi in (*graph.input, *graph.output)
                 if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")]
    for tensor_type in shapeless:
        tensor_type.shape.SetInParent()
    try:
        onnx.checker.check_model(model)
    finally:
        for tensor_type in shapeless:
            tensor_type.ClearField("shape")


def model_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset; outside 1..28 raises UnsupportedOpError."""
    versions = [imp.version for imp in model.opset_import if imp.domain in DEFAULT_DOMAINS]
    if not versions:
        raise UnsupportedOpError("ONNX model imports no default-domain opset")
    opset = int(versions[-1])
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise UnsupportedOpError(f"ONNX opset {opset} is not supported (supported: "
                                 f"{MIN_OPSET}..{MAX_OPSET})")
    return opset


def from_onnx(model: onnx.ModelProto, shape: Mapping[str, tuple[int | str, ...]] | None = None,
              dtype: str | Mapping[str, str] = "float32",
              dim_bounds: Mapping[str, DimBound] | None = None, assume: bool = True,
              ) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Convert an ONNX model to a graph-IR module and its parameters.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (opset 1 to 28 of the default domain).
    shape : dict[str, tuple[int | str, ...]], optional
        Shapes of graph inputs by name: ints fix symbolic dimensions (a shape given for an input
        with fixed dimensions must agree with them); a str names the dimension's symbol, so that
        unnamed dims of two inputs become one variable (``{"input": ("batch", "n"), "state": (2,
        "batch", 128)}``). Dimensions left symbolic (ONNX
        ``dim_param``s, one variable per name across all inputs; unnamed or ``-1`` dims, a fresh
        variable ``<input>_dim<k>`` each) stay :class:`kiln.arith.SymVar` dims, and the model
        compiles for the VM executor (``kiln.build(..., executor="vm")``).
    dtype : str or dict[str, str]
        Dtype of inputs whose ONNX type leaves it undefined (default "float32").
    dim_bounds : dict[str, DimBound], optional
        Bounds of symbolic dimensions by ``dim_param`` name: ``(lo, hi)`` inclusive (``hi`` None:
        unbounded) or ``(lo, hi, divisor)``; default ``(1, None, 1)``. ``lo == hi`` fixes the
        dim (in every input that has it). Kernels may drop tail
        loops and checks that known bounds and divisors make unnecessary; the VM rejects inputs
        outside them.
    assume : bool
        When an op needs a relation between symbolic dims that their bounds do not decide
        (``min(512, sequence_length)`` broadcast against ``sequence_length``; two unnamed batch
        dims that must be one), declare the weakest bound, divisor or symbol equality under
        which it holds (:mod:`kiln.relay.assume`) and import again; the VM checks it at run
        time like a declared bound. Default True; False raises the ShapeError instead.

    Returns
    -------
    mod : IRModule
        ``mod["main"]``: params are the graph inputs, then the initializers the graph uses;
        ``output_names`` are the ONNX graph output names; ``attrs["assumptions"]`` the
        :class:`~kiln.relay.assume.Assumption` s made, in order (empty when none was needed).
    params : dict[str, np.ndarray]
        The initializer values by name (bind them with
        :func:`kiln.relay.transform.bind_params`).

    Raises
    ------
    UnsupportedOpError
        For an op, attribute, mode, domain or opset without a converter (names op, node, opset).
    ShapeError
        For a given shape that contradicts the model, or shapes an op rejects.
    KilnError
        For a malformed graph (e.g. a node using an undefined value).
    """
    opset = model_opset(model)
    check_supported(model, opset)  # every unsupported op in one error, before any work
    weights = _initializers(model.graph)  # (read once: every walk shares them)
    symbols = SymbolTable(dim_bounds)
    assumptions: list[Assumption] = []
    while True:
        symbols.vars = {}  # (each walk makes its symbols again, with what is declared now)
        try:
            mod, params = _import(model, opset, shape, dtype, symbols, weights)
        except ShapeError as err:
            options = needed_assumptions(err) if assume else []
            if not options or len(assumptions) >= MAX_ASSUMPTIONS:
                raise
            made = symbols.declare(options)
            if made is None:
                raise  # (it changes nothing: it cannot be what this error needs)
            logger.info("assuming %s (%s)", made.relation(), made.where)
            assumptions.append(made)
            continue
        mod["main"].attrs["assumptions"] = tuple(assumptions)
        return mod, params


#: assumptions one import may make before the ShapeError stands (each import is another walk
#: of the graph; a model needing more is more likely wrong than dynamic)
MAX_ASSUMPTIONS = 16


def _initializers(graph: onnx.GraphProto) -> tuple[dict[str, np.ndarray], list[Var]]:
    """The initializers' values by name and their parameter Vars."""
    param_values: dict[str, np.ndarray] = {}
    param_vars: list[Var] = []
    for init in graph.initializer:
        value = numpy_helper.to_array(init)
        onnx_dtype(init.data_type, f"initializer '{init.name}'")
        param_values[init.name] = value
        param_vars.append(Var(init.name, TensorType(tuple(int(d) for d in value.shape),
                                                    str(value.dtype))))
    if graph.sparse_initializer:
        raise UnsupportedOpError("ONNX sparse initializers are not supported")
    return param_values, param_vars


def _import(model: onnx.ModelProto, opset: int, shape: Mapping | None,
            dtype: str | Mapping[str, str], symbols: SymbolTable,
            weights: tuple[dict[str, np.ndarray], list[Var]],
            ) -> tuple[IRModule, dict[str, np.ndarray]]:
    """One walk of the graph with the symbols as ``symbols`` declares them."""
    graph = model.graph
    shape = dict(shape or {})
    param_values, param_vars = weights
    values: dict[str, Expr] = {v.name: v for v in param_vars}

    input_vars: list[Var] = []
    for value_info in graph.input:
        if value_info.name in param_values:
            continue  # an initializer listed as input is a weight, not a model input
        given = shape.pop(value_info.name, None)
        var = Var(value_info.name, _input_type(value_info, given, dtype, symbols))
        input_vars.append(var)
        values[value_info.name] = _refined_input(var, given, symbols)
    if shape:
        raise ShapeError(f"shape given for unknown input(s) {sorted(shape)}; the model's inputs "
                         f"are {[v.name for v in input_vars]}")
    symbols.check_all_used()

    unavailable: dict[str, str] = {}
    for index, node in enumerate(graph.node):
        _convert_node(node, index, opset, values, unavailable, param_values)

    outputs = []
    for out in graph.output:
        if out.name in unavailable:
            raise UnsupportedOpError(unavailable[out.name])
        if out.name not in values:
            raise KilnError(f"ONNX graph output '{out.name}' is not produced by any node")
        outputs.append(values[out.name])
    used = {n.uid for n in post_order(outputs)}
    kept = [v for v in param_vars if v.uid in used]
    func = Function(input_vars + kept, outputs, [o.name for o in graph.output],
                    {ONNX_NODES: _node_table(graph, values)})
    return IRModule.from_function(func), {v.name: param_values[v.name] for v in kept}


#: ``dim_param`` values that name no symbol: each such dim is a fresh one (Paddle2ONNX writes
#: ``?`` for every unknown dim, some exporters ``-1``); ``unk__N`` names (onnx's and tf2onnx's
#: shape inference) are unique per unknown dim already, and kept
ANONYMOUS_DIMS = frozenset({"", "?", "-1"})


def dim_symbol(input_name: str, k: int, dim_param: str) -> str:
    """The symbol of dim ``k`` of graph input ``input_name``: its ``dim_param``, or
    ``<input>_dim<k>`` when it has none or an anonymous one (:data:`ANONYMOUS_DIMS`), so that
    two unnamed dims are two symbols."""
    param = dim_param.strip()
    return f"{input_name}_dim{k}" if param in ANONYMOUS_DIMS else param


class SymbolTable:
    """The symbolic dims of a model's inputs: one :class:`SymVar` per ``dim_param`` name, with
    the bounds the user declared and those assumed (:meth:`declare`), and the names assumed
    to be one symbol (``aliases``: name -> the symbol it is)."""

    def __init__(self, bounds: Mapping[str, DimBound] | None):
        self.bounds = dict(bounds or {})
        self.declared = set(self.bounds)
        self.aliases: dict[str, str] = {}
        self.vars: dict[str, SymVar] = {}

    def declare(self, options: list[Assumption]) -> Assumption | None:
        """Declare one of ``options`` for the next import and return it: of those naming
        input symbols (of the import that needed it, :attr:`vars`), the one on the symbol
        made last (an inner dim over a batch: ``[b, h]`` reshaped to ``[-1, 4]`` assumes
        ``h % 4 == 0``); None when there is none or it changes nothing."""
        order = list(self.vars)
        usable = [a for a in options if a.symbol in order
                  and (a.equal is None or a.equal in order)]  # (not a late symbol)
        if not usable:
            return None
        a = max(usable, key=lambda o: order.index(o.symbol)) if usable[0].equal is None \
            else usable[0]
        return a if self._declare(a) else None

    def _declare(self, a: Assumption) -> bool:
        order = list(self.vars)
        if a.equal is not None:
            keep, drop = sorted((a.symbol, a.equal), key=lambda n: (
                _anonymous(n), order.index(n)))  # a dim_param's name over <input>_dim<k>
            self.aliases[drop] = keep
            merged = _intersect(self._spec(keep), self._spec(drop), keep)
            self.bounds[keep] = merged
            return True
        name = self.aliases.get(a.symbol, a.symbol)
        old = self._spec(name)
        new = _intersect(old, (a.lo, a.hi, a.divisor), name)
        self.bounds[name] = new
        return new != old

    def _spec(self, name: str) -> tuple[int, int | None, int]:
        spec = tuple(self.bounds.get(name, ()))
        return (int(spec[0]) if len(spec) > 0 else 1,
                None if len(spec) < 2 or spec[1] is None else int(spec[1]),
                int(spec[2]) if len(spec) > 2 else 1)

    def get(self, name: str) -> SymVar | int:
        """The symbol ``name`` (or the one it is assumed to be), or its value when its bounds
        allow only one."""
        name = self.aliases.get(name, name)
        if name not in self.vars:
            spec = tuple(self.bounds.get(name, ()))
            lo = int(spec[0]) if len(spec) > 0 else 1
            hi = None if len(spec) < 2 or spec[1] is None else int(spec[1])
            divisor = int(spec[2]) if len(spec) > 2 else 1
            if lo < 0:
                raise ShapeError(f"symbol {name}: lower bound {lo} is negative")
            self.vars[name] = SymVar(name, lo, hi, divisor)
        var = self.vars[name]
        return var.lo if var.hi == var.lo else var

    def check_all_used(self) -> None:
        unknown = sorted(self.declared - set(self.vars) - set(self.aliases))
        if unknown:
            raise ShapeError(f"bounds given for unknown symbolic dim(s) {unknown}; the model's "
                             f"symbolic dims are {sorted(self.vars) or 'none'}")


def _anonymous(name: str) -> bool:
    """Whether ``name`` is one :func:`dim_symbol` made up (``<input>_dim<k>``)."""
    head, sep, k = name.rpartition("_dim")
    return bool(sep and head and k.isdigit())


def _intersect(a: tuple, b: tuple, name: str) -> tuple[int, int | None, int]:
    """The bounds ``(lo, hi, divisor)`` both allow; none raises ShapeError naming ``name``."""
    lo = max(a[0], b[0])
    his = [h for h in (a[1], b[1]) if h is not None]
    hi = min(his) if his else None
    divisor = math.lcm(a[2], b[2])
    lo = -(-lo // divisor) * divisor
    if hi is not None and hi < lo:
        raise ShapeError(f"symbol {name}: the model needs bounds {a} and {b}, which no value "
                         "satisfies")
    return lo, hi, divisor


def _input_type(value_info: onnx.ValueInfoProto, given: tuple[int | str, ...] | None,
                dtype: str | Mapping[str, str], symbols: SymbolTable) -> TensorType:
    name = value_info.name
    tensor_type = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type"):
        raise UnsupportedOpError(f"ONNX graph input '{name}' is not a tensor")
    if tensor_type.elem_type:
        elem = onnx_dtype(tensor_type.elem_type, f"graph input '{name}'")
    else:
        elem = dtype if isinstance(dtype, str) else dtype.get(name, "float32")
    if not tensor_type.HasField("shape"):
        if given is None:
            raise ShapeError(f"graph input '{name}' has unknown rank; pass its shape")
        return TensorType(tuple(int(d) for d in given), elem)
    dims = list(tensor_type.shape.dim)
    if given is not None and len(given) != len(dims):
        raise ShapeError(f"graph input '{name}': given shape {tuple(given)} has rank {len(given)}, "
                         f"the model says rank {len(dims)}")
    out = []
    for k, dim in enumerate(dims):
        fixed = dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None
        if given is not None and isinstance(given[k], str) and not given[k].isidentifier():
            out.append(symbols.get(f"{name}_dim{k}"))  # an expression: see _refined_input
        elif given is not None and isinstance(given[k], str):  # a symbol named by the caller
            if fixed is not None:
                raise ShapeError(f"graph input '{name}': dimension {k} is {fixed} in the model, "
                                 f"not symbol {given[k]!r}")
            out.append(symbols.get(given[k]))
        elif given is not None:
            if fixed is not None and int(given[k]) != fixed:
                raise ShapeError(f"graph input '{name}': given shape {tuple(given)} contradicts "
                                 f"dimension {k} = {fixed} of the model")
            out.append(int(given[k]))
        elif fixed is not None:
            out.append(fixed)
        else:
            out.append(symbols.get(dim_symbol(name, k, dim.dim_param)))
    return TensorType(tuple(out), elem)


def _refined_input(var: Var, given: tuple[int | str, ...] | None,
                   symbols: SymbolTable) -> Expr:
    """``var`` itself, or, when the caller gave a dim as an expression of other inputs' symbols
    (``"past+sequence"`` for a decoder's attention mask), ``var`` cast to that shape by a
    ``match_cast`` (the VM checks it at run time), so that ops broadcasting it against values of
    that length type-check."""
    if given is None or not any(isinstance(d, str) and not d.isidentifier() for d in given):
        return var
    shape = tuple(parse_dim(d, symbols.get, f"graph input '{var.name}'")
                  if isinstance(d, str) and not d.isidentifier() else have
                  for d, have in zip(given, var.checked_type.shape))
    return Call("match_cast", [var], {"shape": shape}, span=var.name)


def parse_dim(text: str, symbol: Callable[[str], Dim], where: str) -> Dim:
    """The dim written ``text``: integers and symbol names joined by ``+``, ``-``, ``*`` and
    parentheses (``"past+sequence"``, ``"2*n"``).

    Raises
    ------
    ShapeError
        For anything else, naming ``where``.
    """
    import ast

    ops = {ast.Add: arith.add, ast.Sub: arith.sub, ast.Mult: arith.mul}

    def walk(node: ast.AST) -> Dim:
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Name):
            return symbol(node.id)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ShapeError(f"{where}: dim {text!r} is not a sum or product of symbols and ints")

    try:
        return walk(ast.parse(text, mode="eval").body)
    except SyntaxError:
        raise ShapeError(f"{where}: dim {text!r} is not a sum or product of symbols and "
                         "ints") from None


def node_name(node: onnx.NodeProto, index: int) -> str:
    """The name a node's calls carry as their span: its own, or ``<op_type>_<index>``."""
    return node.name or f"{node.op_type}_{index}"


def _node_table(graph: onnx.GraphProto, values: dict[str, Expr]) -> dict[str, NodeInfo]:
    """Op type and output tensors (name, shape, dtype) of every converted top-level node, for
    profiles and dumps in the model's terms (:mod:`kiln.relay.provenance`)."""
    table = {}
    for index, node in enumerate(graph.node):
        outs = []
        for out in node.output:
            if out in values:
                t = values[out].checked_type
                outs.append((out, tuple(d if isinstance(d, int) else str(d) for d in t.shape),
                             t.dtype))
        table[node_name(node, index)] = NodeInfo(node.op_type, tuple(outs))
    return table


def _convert_node(node: onnx.NodeProto, index: int, opset: int, values: dict[str, Expr],
                  unavailable: dict[str, str], param_values: dict[str, np.ndarray]) -> None:
    name = node_name(node, index)
    where = f"ONNX {node.op_type} (node '{name}', opset {opset})"
    if node.domain not in (*DEFAULT_DOMAINS, MS_DOMAIN):
        raise UnsupportedOpError(f"{where}: domain '{node.domain}' is not supported")
    inputs: list[Expr | None] = []
    for inp in node.input:
        if not inp:
            inputs.append(None)
        elif inp in unavailable:
            raise UnsupportedOpError(unavailable[inp])
        elif inp in values:
            inputs.append(values[inp])
        else:
            raise KilnError(f"{where}: input '{inp}' is not defined before this node")
    if node.domain == MS_DOMAIN or needs_scan(node, _type_of(inputs, 0)):
        # onnxruntime's contrib op, or a recurrent layer over a symbolic length: convert the
        # node's body of simpler ONNX ops
        body = _body(node, name, opset, inputs, param_values)
        (expand_contrib if node.domain == MS_DOMAIN else recurrent_scan)(body)
        for k, inner in enumerate(body.nodes):
            _convert_node(inner, k, BODY_OPSET, values, unavailable, param_values)
        return
    if node.op_type in CONTROL_FLOW_OPS:
        try:
            results: list = convert_control_flow(node, name, opset, inputs, values, unavailable,
                                                 param_values, _convert_node)
        except ShapeError as err:
            raise ShapeError(f"{where}: {err}") from None
        _bind_outputs(node, where, results, values, unavailable)
        return
    converter = find_converter(node.op_type, opset)
    if converter is None:
        types = [None if e is None else e.checked_type for e in inputs]
        expanded = expand_function(node, opset, types, prefix=f"{name}/")
        if expanded is None:
            raise UnsupportedOpError(f"{where}: no converter for this op")
        body, body_opset = expanded  # an op defined by an ONNX function: convert its body
        for k, inner in enumerate(body):
            _convert_node(inner, k, body_opset, values, unavailable, param_values)
        return
    ctx = ConvertContext(node, name, opset, inputs, param_values)
    try:
        result = converter(ctx)
    except ShapeError as err:
        raise ShapeError(f"{where}: {err}") from None
    _bind_outputs(node, where, result if isinstance(result, list) else [result], values,
                  unavailable)


def _type_of(inputs: list[Expr | None], k: int) -> TensorType | None:
    return inputs[k].checked_type if k < len(inputs) and inputs[k] is not None else None


def _body(node: onnx.NodeProto, name: str, opset: int, inputs: list[Expr | None],
          param_values: dict[str, np.ndarray]) -> Body:
    """An empty :class:`Body` for ``node``; its constant inputs are read as a converter reads
    them (:meth:`ConvertContext.const_value`: initializers, ``Constant`` values and what folds
    from them)."""
    ctx = ConvertContext(node, name, opset, inputs, param_values)

    def constant(k: int) -> np.ndarray | None:
        if k >= len(inputs) or inputs[k] is None:
            return None
        try:
            return ctx.const_value(k, f"input {k}")
        except NotConstantError:
            return None

    return Body(node, name, [_type_of(inputs, k) for k in range(len(inputs))], constant)


def _bind_outputs(node: onnx.NodeProto, where: str, results: list, values: dict[str, Expr],
                  unavailable: dict[str, str]) -> None:
    for k, out in enumerate(node.output):
        if not out:
            continue
        if k < len(results) and results[k] is not None:
            values[out] = results[k]
        else:
            unavailable[out] = f"{where}: output {k} ('{out}') is not supported"
