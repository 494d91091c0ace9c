"""MakePackedAPI: wrap a kernel into the packed C calling convention with argument checks.

The packed ABI (shared reference, section 3; TVM src/tir/transforms/make_packed_api.cc) passes
``TVMValue* args, int* type_codes, int num_args``. This pass prepends checks that return -1 with a
message naming the kernel and argument: the argument count, each type code (DLTensor handle),
a non-null handle, ndim, dtype (code, bits, lanes), every dimension of the shape, compact strides
and the CPU device. The body then reads the parameter buffers' data pointers (bound by codegen in
parameter order).
"""

from __future__ import annotations

import numpy as np

from kiln.ir import loop as L

name = "MakePackedAPI"

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
    n = len(func.params)
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
            checks.append((L.eq(dim, extent),
                           f"{arg}: expected shape[{j}] == {extent}, got %lld", [dim]))
        checks.append((L.eq(_acc("arg_compact", i), 1),
                       f"{arg}: expected a compact row-major tensor (strides)", []))
        dev = _acc("arg_device_type", i)
        checks.append((L.eq(dev, 1), f"{arg}: expected a CPU tensor, got device type %lld",
                       [dev]))
    body = func.body
    for cond, msg, args in reversed(checks):
        body = L.AssertStmt(cond, msg, args, body)
    attrs = dict(func.attrs, packed=True, arg_names=names)
    return L.PrimFunc(func.name, func.params, body, attrs)
