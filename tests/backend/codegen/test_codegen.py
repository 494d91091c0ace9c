"""Code generators (C and LLVM) against the loop-IR interpreter (the oracle), and the packed-API
argument checks. Every test runs once per target."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import TARGETS, build_kernels

import kiln
from kiln.backend.te_compiler import lower_primitive, to_te
from kiln.relay.graph import Call, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.relay.op.integer import pack_quads, pack_tap_pairs
from kiln.relay.transform.fuse_ops import fuse_ops
from kiln.schedules import schedule_loops, schedule_te
from kiln.tir import interpreter as loop_interp
from kiln.tir import loop as L
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.make_packed_api import make_packed_api
from kiln.tir.transform.simplify import simplify


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def ints(dtype, *shape, seed=0):
    """Random integers over ``dtype``'s whole range, -128 and 127 included (int8)."""
    info = np.iinfo(dtype)
    values = np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)
    values.reshape(-1)[:2] = [info.min, info.max]
    return values


CONV = {"strides": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2), "groups": 1}
KERNELS = {
    "conv_bias_relu": (
        lambda x, w, b: Call("nn.relu", [Call("nn.bias_add", [Call("nn.conv2d", [x, w], CONV), b],
                                              {"axis": 1})]),
        [rand(1, 3, 9, 8), rand(4, 3, 3, 3, seed=1), rand(4, seed=2)]),
    "dense_sigmoid": (lambda a, w: Call("sigmoid", [Call("nn.dense", [a, w])]),
                      [rand(3, 40), rand(70, 40, seed=1)]),
    "transpose_reshape": (
        lambda x: Call("reshape", [Call("transpose", [x], {"axes": (0, 2, 3, 1)})],
                       {"newshape": (1, 300)}),
        [rand(1, 3, 10, 10)]),
    "softmax": (lambda x: Call("nn.softmax", [x], {"axis": 1}), [rand(2, 1000)]),
    "int_take": (lambda d, i: Call("take", [d, i], {"axis": 1}),
                 [rand(3, 5), np.array([4, -2, 0], "int64")]),
    # int8 kernels (docs/decisions/021): depthwise tap pairs (dot_i16x2) and a dense whose
    # activation words are 4-byte loads (load_u8x4)
    "qnn_depthwise_pairs": (
        lambda x, w: Call("qnn.depthwise_conv2d_NCHWc", [x, w], {
            "strides": (2, 1), "padding": (1, 1, 0, 1), "dilation": (1, 1),
            "input_zero_point": -128, "kernel_size": (3, 3)}),
        [ints("int8", 1, 2, 6, 5, 8), pack_tap_pairs(ints("int8", 2, 1, 3, 3, 1, 8, seed=1))]),
    "qnn_dense_quads": (
        lambda x, w, c: Call("qnn.dense_pack", [x, w, c]),
        [ints("int8", 3, 16), pack_quads(ints("int8", 2, 16, 8, seed=1), 1),
         np.arange(16, dtype="int32")]),
}


def _kernel(name):
    build, arrays = KERNELS[name]
    params = [Var(f"x{i}", TensorType(a.shape, str(a.dtype))) for i, a in enumerate(arrays)]
    fused = fuse_ops(Function(params, [build(*params)]))
    (call,) = [n for n in post_order(fused.outputs) if isinstance(n, PrimitiveCall)]
    return call, arrays


@pytest.fixture(scope="module", params=TARGETS)
def library(request):
    calls = {name: _kernel(name) for name in KERNELS}
    funcs = [lower_primitive(call, name) for name, (call, _) in calls.items()]
    return build_kernels(funcs, request.param), calls


@pytest.mark.parametrize("name", list(KERNELS))
def test_compiled_kernel_matches_interpreter(library, name):
    lib, calls = library
    call, arrays = calls[name]
    ins, out = to_te(call.body)
    oracle = schedule_loops(simplify(lower(schedule_te(Schedule(out)), ins, name)))
    want = np.zeros(call.checked_type.shape, call.checked_type.dtype)
    loop_interp.run(oracle, *arrays, want)
    got = kiln.runtime.empty(call.checked_type.shape, call.checked_type.dtype)
    lib.get_function(name)(*[kiln.runtime.array(a) for a in arrays], got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_packed_api_rejects_bad_arguments(library):
    lib, calls = library
    f = lib.get_function("dense_sigmoid")
    a, w = (kiln.runtime.array(x) for x in calls["dense_sigmoid"][1])
    out = kiln.runtime.empty((3, 70), "float32")
    with pytest.raises(kiln.KilnError, match="expected 3 arguments, got 2"):
        f(a, w)
    with pytest.raises(kiln.KilnError, match=r"argument 2 \(out\): expected shape\[1\] == 70"):
        f(a, w, kiln.runtime.empty((3, 71), "float32"))
    with pytest.raises(kiln.KilnError, match="expected dtype float32"):
        f(a, w, kiln.runtime.empty((3, 70), "float64"))
    with pytest.raises(kiln.KilnError, match="expected ndim 2"):
        f(a, w, kiln.runtime.empty((3, 70, 1), "float32"))
    with pytest.raises(kiln.KilnError, match="expected a tensor"):
        f(a, w, 3)
    with pytest.raises(kiln.KilnError, match="expected a tensor, got type code 4"):
        f(a, w, None)
    f(a, w, out)  # and the good call still works


def _failing_parallel_kernels():
    """Two kernels whose parallel loop body can fail: a workspace too large to allocate, and
    an assertion on the row's value (with a formatted message)."""
    rows = 8
    x = L.Buffer("x", (rows,), "float32")
    out = L.Buffer("out", (rows,), "float32")
    huge = L.Buffer("huge", (1 << 48,), "float32")  # 1 PiB: never allocated
    r = L.Var("r")
    alloc_body = L.Allocate(huge, L.seq(L.BufferStore(huge, x[r], [L.IntImm(0)]),
                                        L.BufferStore(out, huge[L.IntImm(0)], [r])))
    f_alloc = L.PrimFunc("par_alloc_fail", [x, out],
                         L.For(r, L.IntImm(0), L.IntImm(rows), "parallel", alloc_body))
    r2 = L.Var("r")
    check = L.AssertStmt(x[r2] < L.FloatImm(5.0, "float32"), "row %lld: x too large", [r2],
                         L.BufferStore(out, x[r2] * 2.0, [r2]))
    f_assert = L.PrimFunc("par_assert", [x, out],
                          L.For(r2, L.IntImm(0), L.IntImm(rows), "parallel", check))
    return [make_packed_api(f_alloc), make_packed_api(f_assert)]


@pytest.mark.parametrize("target", TARGETS)
def test_failure_inside_parallel_loop_sets_the_callers_error(target):
    """A failure on any pool thread reaches the caller as -1 with its message (the task's
    ``return -1`` ends its chunk; the pool copies the first failing task's message)."""
    lib = build_kernels(_failing_parallel_kernels(), target)
    x = np.arange(8, dtype="float32")
    out = kiln.runtime.empty((8,), "float32")
    with pytest.raises(kiln.KilnError, match="cannot allocate 1125899906842624 bytes of "
                                             "workspace for huge"):
        lib.get_function("par_alloc_fail")(kiln.runtime.array(x), out)
    f = lib.get_function("par_assert")
    ok = np.full(8, 1.5, "float32")
    f(kiln.runtime.array(ok), out)
    np.testing.assert_array_equal(out.numpy(), ok * 2)
    bad = ok.copy()
    bad[5] = 7.0
    with pytest.raises(kiln.KilnError, match="row 5: x too large"):
        f(kiln.runtime.array(bad), out)
    f(kiln.runtime.array(ok), out)  # and a good call still works afterwards


def _leading_let_and_assert_kernel() -> L.PrimFunc:
    """``out[0] = 2 * x[0] + 1`` whose body begins with a LetStmt and an AssertStmt that read
    ``x`` (as a one-element kernel's FastExp lets do): no part of MakePackedAPI's prologue."""
    x, out = L.Buffer("x", (1,), "float32"), L.Buffer("out", (1,), "float32")
    t = L.Var("t", "float32")
    load = L.BufferLoad(x, [L.IntImm(0)])
    store = L.BufferStore(out, t * L.FloatImm(2.0) + L.FloatImm(1.0), [L.IntImm(0)])
    check = L.AssertStmt(L.Binary("<", load, L.FloatImm(100.0)), "x too large", [], store)
    return make_packed_api(L.PrimFunc("leading_let", [x, out], L.LetStmt(t, load, check)))


@pytest.mark.parametrize("target", TARGETS)
def test_a_body_beginning_with_a_let_is_not_taken_for_the_packed_prologue(target):
    """The body's own leading LetStmt and AssertStmt read the buffers after the codegen has
    bound them (they were once taken for symbol bindings of MakePackedAPI: "buffer x is used
    outside its allocation" on LLVM, a C compile error)."""
    lib = build_kernels([_leading_let_and_assert_kernel()], target)
    out = kiln.runtime.empty((1,), "float32")
    f = lib.get_function("leading_let")
    f(kiln.runtime.array(np.array([3.0], "float32")), out)
    assert out.numpy().tolist() == [7.0]
    with pytest.raises(kiln.KilnError, match="x too large"):
        f(kiln.runtime.array(np.array([300.0], "float32")), out)


# ------------------------------------------------------------------ the expression vocabulary
# Hand-written loop IR covering every expression node, intrinsic, cast and loop kind; each
# kernel runs compiled and in the interpreter on the same inputs.

N = 37  # odd: vectorized loops get a remainder


def _loop(n, kind, body_fn, name="i"):
    i = L.Var(name)
    return L.For(i, L.IntImm(0), L.IntImm(n), kind, body_fn(i))


def _floats():
    rng = np.random.default_rng(3)
    return (rng.uniform(0.2, 3.0, N).astype("float32"),
            rng.standard_normal(N).astype("float32"))


def k_intrinsics(dtype):
    """out[f, i] = intrinsic f of (x[i], y[i]) for every intrinsic, in ``dtype``."""
    x, y = L.Buffer("x", (N,), dtype), L.Buffer("y", (N,), dtype)
    names = list(L.INTRINSICS)
    out = L.Buffer("out", (len(names), N), dtype)

    def args(name: str, i) -> tuple:
        # x is in [0.2, 3), y standard normal: each intrinsic gets arguments in its domain.
        if name in ("pow", "fmod"):
            return (x[i], y[i])
        if name in ("asin", "acos", "atanh"):
            return (x[i] * L.const(0.3, dtype),)
        if name == "acosh":
            return (x[i] + L.const(1.0, dtype),)
        if name in ("tanh", "erf", "fabs", "floor", "ceil", "sin", "cos", "atan", "sinh",
                    "cosh", "asinh", "nearbyint"):
            return (y[i],)
        return (x[i],)

    def body(i):
        stmts = [L.BufferStore(out, L.call(name, *args(name, i)), [L.IntImm(k), i])
                 for k, name in enumerate(names)]
        return L.seq(*stmts)

    a, b = _floats()
    return (L.PrimFunc(f"intrinsics_{dtype}", [x, y, out], _loop(N, "vectorized", body)),
            [a.astype(dtype), b.astype(dtype)], np.zeros((len(names), N), dtype), 1e-5)


def k_integer_ops():
    """Floor and truncating division, modulo, min/max, comparisons on int64/int32/uint8."""
    a, b = L.Buffer("a", (N,), "int64"), L.Buffer("b", (N,), "int64")
    u = L.Buffer("u", (N,), "uint8")
    out = L.Buffer("out", (10, N), "int64")

    def body(i):
        x, y = a[i], b[i]
        small = L.Cast("int32", x)
        vals = [x // y, x % y, L.Binary("/", x, y), L.minimum(x, y), L.maximum(x, y),
                L.Cast("int64", L.Binary("<", x, y)),
                L.Cast("int64", L.logical_and(L.Binary(">=", x, 0), L.ne(y, 3))),
                L.Cast("int64", small * small - L.Cast("int32", y)),
                L.Cast("int64", u[i] // L.IntImm(3, "uint8") + u[i] % L.IntImm(7, "uint8")),
                L.Cast("int64", L.Cast("uint8", x))]
        return L.seq(*[L.BufferStore(out, v, [L.IntImm(k), i]) for k, v in enumerate(vals)])

    rng = np.random.default_rng(4)
    av = rng.integers(-50, 50, N).astype("int64")
    bv = rng.integers(1, 9, N).astype("int64") * rng.choice([-1, 1], N)
    uv = rng.integers(0, 255, N).astype("uint8")
    return (L.PrimFunc("integer_ops", [a, b, u, out], _loop(N, "serial", body)),
            [av, bv, uv], np.zeros((10, N), "int64"), 0)


def k_casts_and_select():
    """Casts between float32/float64/int32/int64/uint8/bool, float floor-div/mod, a Select that
    guards an out-of-bounds load, bool buffers, IfThenElse."""
    x = L.Buffer("x", (N,), "float32")
    flag = L.Buffer("flag", (N,), "bool")
    out = L.Buffer("out", (8, N), "float64")
    mask = L.Buffer("mask", (N,), "bool")

    def body(i):
        v = x[i]
        guarded = L.Select(L.Binary(">", i, 0), x[i - 1], L.FloatImm(-7.0))
        vals = [L.Cast("float64", v), L.Cast("float64", L.Cast("int32", v * 10.0)),
                L.Cast("float64", L.Cast("uint8", L.call("fabs", v) * 10.0)),
                L.Cast("float64", guarded), L.Cast("float64", v // 0.75),
                L.Cast("float64", v % 0.75),
                L.Select(flag[i], L.Cast("float64", v), L.FloatImm(1.5, "float64")),
                L.Cast("float64", L.Cast("int64", L.Cast("float64", i) * 0.5))]
        stores = [L.BufferStore(out, e, [L.IntImm(k), i]) for k, e in enumerate(vals)]
        stores.append(L.BufferStore(mask, L.Binary("or", flag[i], L.Binary("<", v, 0.0)), [i]))
        stores.append(L.IfThenElse(L.Binary(">", v, 1.0),
                                   L.BufferStore(out, L.FloatImm(99.0, "float64"),
                                                 [L.IntImm(7), i])))
        return L.seq(*stores)

    a = np.random.default_rng(5).standard_normal(N).astype("float32") * 3
    fl = np.random.default_rng(6).random(N) < 0.5
    return (L.PrimFunc("casts_select", [x, flag, out, mask], _loop(N, "unrolled", body)),
            [a, fl], (np.zeros((8, N), "float64"), np.zeros(N, bool)), 1e-6)


def k_bool_cast():
    """Casting to bool is ``!= 0`` (numpy's astype(bool)), also from wide integers."""
    x = L.Buffer("x", (N,), "int64")
    out = L.Buffer("out", (2, N), "int32")

    def body(i):
        return L.seq(
            L.BufferStore(out, L.Cast("int32", L.Cast("bool", x[i])), [L.IntImm(0), i]),
            L.BufferStore(out, L.Cast("int32", L.Cast("bool", L.Cast("float32", x[i]) * 0.5)),
                          [L.IntImm(1), i]))

    xs = np.arange(N, dtype="int64") * 127 - 600
    return (L.PrimFunc("bool_cast", [x, out], _loop(N, "serial", body)), [xs],
            np.zeros((2, N), "int32"), 0)


def k_parallel_alloc():
    """A parallel loop over rows using a small (stack) and a large (workspace) scratch buffer
    and an outer variable; then a reduction in a local accumulator."""
    rows, cols = 64, 300
    x = L.Buffer("x", (rows, cols), "float32")
    out = L.Buffer("out", (rows,), "float32")
    small = L.Buffer("small", (4,), "float32")
    big = L.Buffer("big", (cols,), "float32")
    acc = L.Buffer("acc", (1,), "float32", scope="local")
    r = L.Var("r")

    def fill(j):
        return L.BufferStore(big, x[r, j] * small[L.IntImm(1)], [j])

    def reduce_(j):
        return L.BufferStore(acc, acc[L.IntImm(0)] + big[j], [L.IntImm(0)])

    row = L.seq(
        _loop(4, "serial", lambda k: L.BufferStore(small, L.Cast("float32", k) + 1.0, [k]), "k"),
        _loop(cols, "vectorized", fill, "j"),
        L.Allocate(acc, L.seq(L.BufferStore(acc, L.FloatImm(0.0), [L.IntImm(0)]),
                              _loop(cols, "serial", reduce_, "j2"),
                              L.BufferStore(out, acc[L.IntImm(0)], [r]))))
    body = L.For(r, L.IntImm(0), L.IntImm(rows), "parallel",
                 L.Allocate(small, L.Allocate(big, row)))
    return (L.PrimFunc("parallel_alloc", [x, out], body),
            [np.random.default_rng(7).standard_normal((rows, cols)).astype("float32")],
            np.zeros(rows, "float32"), 1e-5)


VOCABULARY = {
    "intrinsics_f32": lambda: k_intrinsics("float32"),
    "intrinsics_f64": lambda: k_intrinsics("float64"),
    "integer_ops": k_integer_ops,
    "casts_select": k_casts_and_select,
    "bool_cast": k_bool_cast,
    "parallel_alloc": k_parallel_alloc,
}
# Known gaps of one code generator: (target, case) → reason.
KNOWN_GAPS: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module", params=TARGETS)
def vocabulary(request):
    cases = {name: make() for name, make in VOCABULARY.items()
             if (request.param, name) not in KNOWN_GAPS}
    funcs = [make_packed_api(c[0]) for c in cases.values()]
    return build_kernels(funcs, request.param), cases, request.param


@pytest.mark.parametrize("name", list(VOCABULARY))
def test_expression_vocabulary_matches_interpreter(vocabulary, name):
    lib, cases, target = vocabulary
    if (target, name) in KNOWN_GAPS:
        pytest.xfail(KNOWN_GAPS[target, name])
    func, inputs, outputs, rtol = cases[name]
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    want = [o.copy() for o in outputs]
    loop_interp.run(func, *inputs, *want)
    got = [kiln.runtime.array(o) for o in outputs]
    lib.get_function(func.name)(*[kiln.runtime.array(a) for a in inputs], *got)
    for g, w in zip(got, want):
        if rtol:
            np.testing.assert_allclose(g.numpy(), w, rtol=rtol, atol=1e-6)
        else:
            np.testing.assert_array_equal(g.numpy(), w)


def test_nested_min_max_stay_linear(target):
    """min/max nested 8 deep (clamps of clamps, as fused quantize → dequantize → relu chains
    make): the C source stays small (a min/max macro would copy the innermost value 4^8 times) and
    both targets match the interpreter."""
    x, out = L.Buffer("x", (N,), "float32"), L.Buffer("out", (N,), "float32")

    def body(i):
        v = x[i]
        for k in range(8):
            v = L.minimum(L.maximum(v * 1.5, L.FloatImm(-1.0 - k)), L.FloatImm(1.0 + k))
        return L.BufferStore(out, v, [i])

    func = L.PrimFunc("nested_min_max", [x, out], _loop(N, "vectorized", body))
    if target == "c":
        from kiln.codegen.c.source import build_c_source

        assert len(build_c_source([make_packed_api(func)])) < 20000
    data = _floats()[1] * 3
    want = np.zeros(N, "float32")
    loop_interp.run(func, data, want)
    got = kiln.runtime.array(np.zeros(N, "float32"))
    build_kernels([make_packed_api(func)], target).get_function("nested_min_max")(
        kiln.runtime.array(data), got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
