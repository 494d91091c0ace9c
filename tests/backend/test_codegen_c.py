"""C codegen against the loop-IR interpreter (the oracle), and the packed-API argument checks."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.backend.te_compiler import lower_primitive, to_te
from kiln.codegen.c import build_c_source
from kiln.ir import loop_interp
from kiln.ir.graph import Call, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.ir.lower import Schedule, lower
from kiln.passes.graph.fuse_ops import fuse_ops
from kiln.passes.loop.simplify import simplify
from kiln.runtime import CSourceModule
from kiln.schedules import schedule_loops, schedule_te


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


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
}


def _kernel(name):
    build, arrays = KERNELS[name]
    params = [Var(f"x{i}", TensorType(a.shape, str(a.dtype))) for i, a in enumerate(arrays)]
    fused = fuse_ops(Function(params, [build(*params)]))
    (call,) = [n for n in post_order(fused.outputs) if isinstance(n, PrimitiveCall)]
    return call, arrays


@pytest.fixture(scope="module")
def library():
    calls = {name: _kernel(name) for name in KERNELS}
    funcs = [lower_primitive(call, name) for name, (call, _) in calls.items()]
    return CSourceModule(build_c_source(funcs), list(KERNELS)), calls


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
    f(a, w, out)  # and the good call still works
