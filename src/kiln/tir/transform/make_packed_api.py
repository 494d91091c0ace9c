"""MakePackedAPI: wrap a kernel into the packed C calling convention with argument checks.

The packed ABI (docs/formats.md §3.3; TVM src/tir/transforms/make_packed_api.cc) passes
``TVMValue* args, int* type_codes, int num_args``. This pass prepends checks that return -1 with a
message naming the kernel and argument: the argument count, each type code (DLTensor handle),
a non-null handle, ndim, dtype (code, bits, lanes), every dimension of the shape, compact strides
and the CPU device. The body then reads the parameter buffers' data pointers (bound by codegen in
parameter order).

Symbolic extents: a buffer dimension that is a shape symbol's variable binds it (``LetStmt``) at
its first occurrence, in parameter order; every later use of the symbol (another dimension, or an
expression such as ``2 * n``) is checked against it, and a mismatch names the symbol and both
tensors. A symbol that no dimension holds alone (only inside expressions) becomes an int64
scalar argument after the tensors (``attrs["symbol_args"]`` lists their names, in order; TVM
passes such shape variables the same way).

``attrs["prologue"]`` counts the statements prepended (checks and bindings): the kernel body may
itself begin with a ``LetStmt`` or ``AssertStmt`` (a one-element kernel's whole body is FastExp's
lets and one store), so code generators split the function with :func:`split_prologue`, never
by the statements' kinds.
"""

from __future__ import annotations

import numpy as np

from kiln.tir import loop as L

name = "MakePackedAPI"

_TYPE_CODE_INT = 0
_TYPE_CODE_DLTENSOR = 7
_TYPE_CODE_NDARRAY = 13


def dl_dtype(dtype: str) -> tuple[int, int]:
    """DLPack (code, bits) of a numpy dtype name (bool is DLPack's kDLBool=6, 8 bits)."""
    if dtype == "bool":
        return 6, 8
    dt = np.dtype(dtype)
    code = {"i": 0, "u": 1, "f": 2}[dt.kind]
    return code, dt.itemsize * 8


def _acc(field: str, *args: int) -> L.PrimExpr:
    return L.Call(f"kiln.{field}", [L.IntImm(a) for a in args], L.INT)


def make_packed_api(func: L.PrimFunc, arg_names: list[str] | None = None) -> L.PrimFunc:
    """Return ``func`` with packed-API checks; ``arg_names`` name params in error messages."""
    names = arg_names or [b.name for b in func.params]
    bound = _symbol_sources(func.params)
    scalars = [v for v in L.free_vars(func) if v not in bound]
    n = len(func.params) + len(scalars)
    deferred: list[tuple[L.PrimExpr, str, list[L.PrimExpr]]] = []
    checks: list[tuple[L.PrimExpr, str, list[L.PrimExpr]]] = [(
        L.eq(_acc("num_args"), n),
        f"{func.name}: expected {n} arguments, got %lld", [_acc("num_args")],
    )]
    for i, buf in enumerate(func.params):
        arg = f"{func.name}: argument {i} ({names[i]})"
        code = _acc("type_code", i)
        checks.append((
            L.Binary("or", L.eq(code, _TYPE_CODE_DLTENSOR), L.eq(code, _TYPE_CODE_NDARRAY)),
            f"{arg}: expected a tensor, got type code %lld", [code]))
        checks.append((L.ne(_acc("handle_is_null", i), 1), f"{arg}: null tensor handle", []))
        ndim = _acc("arg_ndim", i)
        checks.append((L.eq(ndim, len(buf.shape)),
                       f"{arg}: expected ndim {len(buf.shape)}, got %lld", [ndim]))
        dcode, dbits = dl_dtype(buf.dtype)
        got = [_acc("arg_dtype_code", i), _acc("arg_dtype_bits", i), _acc("arg_dtype_lanes", i)]
        checks.append((L.logical_and(L.eq(got[0], dcode), L.eq(got[1], dbits), L.eq(got[2], 1)),
                       (f"{arg}: expected dtype {buf.dtype}, got DLDataType(code=%lld, "
                        "bits=%lld, lanes=%lld)"), got))
        for j, extent in enumerate(buf.shape):
            dim = _acc("arg_shape", i, j)
            if isinstance(extent, int):
                checks.append((L.eq(dim, extent),
                               f"{arg}: expected shape[{j}] == {extent}, got %lld", [dim]))
            elif bound.get(extent) == (i, j):
                checks.append(("let", extent, dim))  # type: ignore[arg-type]
            else:  # after every symbol is bound (a later tensor may bind it)
                deferred.append((L.eq(dim, extent), _mismatch(arg, j, extent, bound, names),
                                 [dim, extent]))
        checks.append((L.eq(_acc("arg_compact", i), 1),
                       f"{arg}: expected a compact row-major tensor (strides)", []))
        dev = _acc("arg_device_type", i)
        checks.append((L.eq(dev, 1), f"{arg}: expected a CPU tensor, got device type %lld",
                       [dev]))
    for k, var in enumerate(scalars):
        index = len(func.params) + k
        code = _acc("type_code", index)
        checks.append((L.eq(code, _TYPE_CODE_INT),
                       (f"{func.name}: argument {index} (symbol {var.name}): expected an int, "
                        "got type code %lld"), [code]))
        checks.append(("let", var, _acc("arg_int", index)))  # type: ignore[arg-type]
    checks += deferred
    body = func.body
    for cond, msg, args in reversed(checks):
        if isinstance(cond, str):  # ("let", var, value)
            body = L.LetStmt(msg, args, body)  # type: ignore[arg-type]
        else:
            body = L.AssertStmt(cond, msg, args, body)
    attrs = dict(func.attrs, packed=True, arg_names=names,
                 symbol_args=[v.name for v in scalars], prologue=len(checks))
    return L.PrimFunc(func.name, func.params, body, attrs)


def split_prologue(func: L.PrimFunc) -> tuple[list[L.AssertStmt | L.LetStmt], L.Stmt]:
    """The checks and symbol bindings MakePackedAPI prepended to ``func`` (in order; they read
    only the packed arguments) and the kernel body after them (which reads the buffers)."""
    prologue: list[L.AssertStmt | L.LetStmt] = []
    body = func.body
    for _ in range(func.attrs["prologue"]):
        assert isinstance(body, (L.AssertStmt, L.LetStmt)), f"{func.name}: prologue cut short"
        prologue.append(body)
        body = body.body
    return prologue, body


def _symbol_sources(params: list[L.Buffer]) -> dict[L.Var, tuple[int, int]]:
    """Each symbol variable that is a whole dimension of a parameter: its first (param, dim)."""
    found: dict[L.Var, tuple[int, int]] = {}
    for i, buf in enumerate(params):
        for j, extent in enumerate(buf.shape):
            if isinstance(extent, L.Var) and extent not in found:
                found[extent] = (i, j)
    return found


def _mismatch(arg: str, j: int, extent: L.PrimExpr, bound: dict, names: list[str]) -> str:
    """The message of a symbolic dimension that disagrees with the symbol's binding."""
    sources = []
    for var, (i, k) in bound.items():
        if var in L.expr_vars(extent):
            sources.append(f"{var.name} from argument {i} ({names[i]}) shape[{k}]")
    where = f" ({'; '.join(sources)})" if sources else ""
    return f"{arg}: shape[{j}] is %lld but {extent} is %lld{where}"
