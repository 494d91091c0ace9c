"""A pure-Python interpreter of the loop IR: the executable definition of its semantics.

Slow by design (one Python call per scalar operation); the oracle that codegen tests compare
compiled kernels against. Floats compute in their own width (numpy scalars), integers as Python
ints with floor division and floor modulo, as the loop IR defines.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from kiln.tir import intrin_int8 as loop_int8
from kiln.tir import loop as L

_ARITH = {
    "+": operator.add, "-": operator.sub, "*": operator.mul,
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne,
    # as the codegens' ``a < b ? a : b`` selects, a NaN in either operand yields ``b``:
    # Python's min/max return their first argument unless the second compares past it
    "min": lambda a, b: min(b, a), "max": lambda a, b: max(b, a),
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
}

_INTRINSICS = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "fabs": np.abs,
    "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)), "fence": lambda v: v,
    "floor": np.floor, "ceil": np.ceil, "nearbyint": np.rint, "pow": np.power,
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "fmod": np.fmod,
}


def run(func: L.PrimFunc, *arrays: np.ndarray, symbols: dict[str, int] | None = None) -> None:
    """Execute ``func`` on numpy ``arrays`` (one per param, written in place for outputs).

    Shape symbols bind from the first array dimension that holds one alone; ``symbols`` gives
    values by name for the others (those only inside expressions, e.g. ``n * s``).

    Raises
    ------
    ValueError
        If an array's shape or dtype does not match its parameter buffer.
    """
    if func.attrs.get("packed"):
        raise ValueError(f"{func.name}: the interpreter runs functions before MakePackedAPI")
    if len(arrays) != len(func.params):
        raise ValueError(f"{func.name}: expected {len(func.params)} arrays, got {len(arrays)}")
    mem: dict[int, np.ndarray] = {}
    env: dict = {}
    for var in L.free_vars(func):
        if symbols and var.name in symbols:
            env[var] = int(symbols[var.name])
    for buf, arr in zip(func.params, arrays):  # shape symbols bind at their first occurrence
        for d, n in zip(buf.shape, arr.shape):
            if isinstance(d, L.Var) and d not in env:
                env[d] = int(n)
    interp = _Interp(mem)
    for buf, arr in zip(func.params, arrays):
        shape = tuple(interp.expr(L.as_index(d), env) for d in buf.shape)
        if tuple(arr.shape) != shape or str(arr.dtype) != buf.dtype:
            raise ValueError(f"{func.name}: {buf.name} expects {buf.shape} {buf.dtype}, "
                             f"got {arr.shape} {arr.dtype}")
        mem[id(buf)] = arr
    # IEEE float arithmetic as the compiled code does it: overflow to inf and NaN are values
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        interp.stmt(func.body, env)


class _Interp:
    def __init__(self, mem: dict[int, np.ndarray]):
        self.mem = mem

    def expr(self, e: L.PrimExpr, env: dict):
        if isinstance(e, L.Var):
            return env[e]
        if isinstance(e, (L.IntImm, L.FloatImm)):
            return np.dtype(e.dtype).type(e.value) if e.dtype != L.INT else e.value
        if isinstance(e, L.Binary):
            return self.binary(e, env)
        if isinstance(e, L.Select):
            c = self.expr(e.cond, env)
            return self.expr(e.true_value if c else e.false_value, env)
        if isinstance(e, L.Cast):
            v = self.expr(e.value, env)
            if e.dtype == L.INT:
                return int(v)
            if np.dtype(e.dtype).kind in "iu" and not isinstance(v, (float, np.floating)):
                # integer narrowing wraps (two's complement), as in C and LLVM's trunc
                return np.array(int(v), np.int64).astype(e.dtype)[()]
            return np.dtype(e.dtype).type(v)
        if isinstance(e, L.BufferLoad):
            idx = tuple(self.expr(i, env) for i in e.indices)
            v = self.mem[id(e.buffer)][idx]
            return int(v) if e.dtype == L.INT else v
        if isinstance(e, L.Call) and e.name == "reinterpret":
            value = np.array(self.expr(e.args[0], env), dtype=e.args[0].dtype)
            return value.view(e.dtype)[()]
        if isinstance(e, L.Call) and e.name == loop_int8.DOT_U8I8X4:
            a, b = (int(self.expr(x, env)) for x in e.args)
            return np.int32(loop_int8.dot_u8i8x4_value(a, b))
        if isinstance(e, L.Call) and e.name == loop_int8.DOT_U8I8X4_SAT16:
            a, b = (int(self.expr(x, env)) for x in e.args)
            return np.int32(loop_int8.dot_u8i8x4_sat16_value(a, b))
        if isinstance(e, L.Call) and e.name == loop_int8.LOAD_U8X4:
            (load,) = e.args
            arr = self.mem[id(load.buffer)]
            idx = tuple(int(self.expr(i, env)) for i in load.indices)
            flat = int(np.ravel_multi_index(idx, arr.shape))
            return arr.reshape(-1)[flat:flat + 4].view(np.int32)[0]
        if isinstance(e, L.Call) and e.name == loop_int8.DOT_I16X2:
            return np.int32(loop_int8.dot_i16x2_value(*(int(self.expr(x, env)) for x in e.args)))
        if isinstance(e, L.Call) and e.name.startswith(L.EXTERN):
            return np.int32(1)  # support code is not run here: the caller's loops are
        if isinstance(e, L.Call):
            args = [self.expr(a, env) for a in e.args]
            return np.dtype(e.dtype).type(_INTRINSICS[e.name](*args))
        raise AssertionError(f"interpreter: unknown expression {type(e).__name__}")

    def binary(self, e: L.Binary, env: dict):
        if e.op == "and":
            return bool(self.expr(e.a, env)) and bool(self.expr(e.b, env))
        if e.op == "or":
            return bool(self.expr(e.a, env)) or bool(self.expr(e.b, env))
        a, b = self.expr(e.a, env), self.expr(e.b, env)
        if e.op in _ARITH:
            r = _ARITH[e.op](a, b)
        elif e.op == "/":
            r = a / b if L.is_float(e.dtype) else _trunc_div(a, b)
        elif e.op == "//":
            r = a // b if not L.is_float(e.dtype) else np.floor(a / b)
        elif e.op == "%":
            r = a % b if not L.is_float(e.dtype) else a - np.floor(a / b) * b
        else:
            raise AssertionError(f"interpreter: unknown operator {e.op}")
        if e.dtype == "bool":
            return bool(r)
        if e.op == "<<" and not L.is_float(e.dtype):  # wrap to the width, as C does
            bits = np.dtype(e.dtype).itemsize * 8
            r = int(r) & ((1 << bits) - 1)
            if np.dtype(e.dtype).kind == "i" and r >= 1 << (bits - 1):
                r -= 1 << bits
        return r if e.dtype == L.INT else np.dtype(e.dtype).type(r)

    def stmt(self, s: L.Stmt, env: dict) -> None:
        if isinstance(s, L.For):
            lo, n = self.expr(s.min, env), self.expr(s.extent, env)
            for i in range(lo, lo + n):
                env[s.var] = i
                self.stmt(s.body, env)
        elif isinstance(s, L.BufferStore):
            idx = tuple(self.expr(i, env) for i in s.indices)
            self.mem[id(s.buffer)][idx] = self.expr(s.value, env)
        elif isinstance(s, L.Allocate):
            shape = tuple(self.expr(L.as_index(d), env) for d in s.buffer.shape)
            self.mem[id(s.buffer)] = np.zeros(shape, s.buffer.dtype)
            self.stmt(s.body, env)
            del self.mem[id(s.buffer)]
        elif isinstance(s, L.SeqStmt):
            for x in s.stmts:
                self.stmt(x, env)
        elif isinstance(s, L.IfThenElse):
            if self.expr(s.cond, env):
                self.stmt(s.then_case, env)
            elif s.else_case is not None:
                self.stmt(s.else_case, env)
        elif isinstance(s, L.AssertStmt):
            if not self.expr(s.cond, env):
                raise RuntimeError(s.message)
            self.stmt(s.body, env)
        elif isinstance(s, L.LetStmt):
            env[s.var] = self.expr(s.value, env)
            self.stmt(s.body, env)
        elif isinstance(s, L.Evaluate):
            self.expr(s.value, env)
        else:
            raise TypeError(f"interpreter: unknown statement {type(s).__name__}")


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q
