"""Depthwise and grouped integer convolutions (docs/decisions/021), compiled for ``c`` and
``llvm``: ``qnn.conv2d`` with ``groups = C`` (AlterOpLayout: ``qnn.depthwise_conv2d_NCHWc``,
int8 weights ``[C/b, 1, KH, KW, 1, b]``) and with other groups (SplitGroups: one blocked
``qnn.conv2d_NCHWc`` per group of at least MIN_GROUP_CHANNELS channels, up to MAX_GROUPS
groups; NCHW unblocked otherwise), int32 outputs equal to a numpy int64 reference exactly,
extreme operands included. Depthwise weights are int16 pairs of taps (one ``vpmaddwd`` per two
taps on x86: assembly checked for AVX2 and AVX-512)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import kiln
from kiln.relay.graph import Call, Constant, Function, TensorType, Var
from kiln.relay.transform.split_groups import MAX_GROUPS, MIN_GROUP_CHANNELS

RNG = np.random.default_rng(2117)


def _grouped_ref(x: np.ndarray, w: np.ndarray, zx: int, stride: int, pad: int,
                 groups: int) -> np.ndarray:
    """``Σ (x - zx) · w`` per group over NCHW / OIHW windows, padding contributing 0 (int64)."""
    xs = np.pad(x.astype(np.int64) - zx, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    o, cg, kh, kw = w.shape
    og = o // groups
    oh = (xs.shape[2] - kh) // stride + 1
    ow = (xs.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], o, oh, ow), np.int64)
    for g in range(groups):
        xg = xs[:, g * cg:(g + 1) * cg]
        wg = w[g * og:(g + 1) * og].astype(np.int64)
        for ky in range(kh):
            for kx in range(kw):
                win = xg[:, :, ky:ky + stride * oh:stride, kx:kx + stride * ow:stride]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", win, wg[:, :, ky, kx])
    return out


def _operands(shape_x, shape_w, dtype: str, extreme: bool):
    info = np.iinfo(dtype)
    if extreme:
        return (RNG.choice([info.min, info.max], shape_x).astype(dtype),
                RNG.choice([-128, 127], shape_w).astype(np.int8))
    return (RNG.integers(info.min, info.max + 1, shape_x).astype(dtype),
            RNG.integers(-128, 128, shape_w).astype(np.int8))


def _build(x: np.ndarray, w: np.ndarray, zx: int, stride: int, pad: int, groups: int,
           target: str):
    attrs = {"strides": (stride, stride), "padding": (pad,) * 4, "dilation": (1, 1),
             "groups": groups, "input_zero_point": zx}
    xv = Var("x", TensorType(x.shape, str(x.dtype)))
    return kiln.build(Function([xv], [Call("qnn.conv2d", [xv, Constant(w)], attrs)]),
                      target=target)


def _run(lib, x: np.ndarray) -> np.ndarray:
    gm = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input("x", x)
    gm.run()
    return gm.get_output(0).numpy()


CASES = [  # (dtype, zx, channels, out channels, groups, size, kernel, stride, extreme)
    ("uint8", 3, 32, 32, 32, 9, 3, 1, False),    # depthwise, two channel blocks
    ("int8", -5, 24, 24, 24, 11, 3, 2, True),    # depthwise stride 2, an 8-channel block
    ("uint8", 255, 16, 16, 16, 6, 5, 1, True),   # depthwise 5x5, zero point at the top
    ("int8", -128, 40, 40, 40, 10, 3, 1, True),  # S8S8 after a ReLU; a channel tail (40)
    ("uint8", 0, 24, 24, 24, 13, 3, 2, False),   # zero point 0 (no subtraction), odd size
    ("int8", 9, 32, 32, 32, 9, 2, 1, True),      # 2x2: an even window, no pad tap
    ("uint8", 131, 48, 48, 48, 7, 1, 2, True),   # 1x1 stride 2, no padding: one tap
    ("int8", 7, 16, 32, 4, 7, 3, 1, False),      # 4 in-channels a group: stays NCHW
    ("uint8", 0, 64, 64, 2, 8, 3, 1, True),      # grouped: two groups of 32 channels (quads)
    ("int8", -1, 48, 48, 3, 9, 1, 2, False),     # grouped 1x1 stride 2, three groups of 16
    ("int8", 2, 512, 512, 32, 5, 1, 1, False),   # 32 groups (> MAX_GROUPS): stays NCHW
]


@pytest.mark.parametrize("dtype,zx,cin,cout,groups,size,kernel,stride,extreme", CASES)
def test_grouped_conv_exact(dtype, zx, cin, cout, groups, size, kernel, stride, extreme, target):
    x, w = _operands((1, cin, size, size), (cout, cin // groups, kernel, kernel), dtype, extreme)
    pad = kernel // 2
    lib = _build(x, w, zx, stride, pad, groups, target)
    got = _run(lib, x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, _grouped_ref(x, w, zx, stride, pad, groups))
    kernels = [n["attrs"]["func_name"] for n in json.loads(lib.get_graph_json())["nodes"]
               if n["op"] == "tvm_op"]
    depthwise = groups == cin == cout
    assert any("qnn_depthwise_conv2d_NCHWc" in k for k in kernels) == depthwise, kernels
    if depthwise:  # the tap-pair form: int32 weight words (kiln.relay.op.integer.pack_tap_pairs)
        params = lib.get_params()
        words = [v for v in params.values() if v.numpy().dtype == np.int32]
        assert len(words) == 1 and words[0].shape[2] == (kernel * kernel + 1) // 2, \
            {k: (v.shape, v.numpy().dtype) for k, v in params.items()}
    split = 1 < groups <= MAX_GROUPS and not depthwise and \
        min(cin, cout) // groups >= MIN_GROUP_CHANNELS  # SplitGroups: blocked per group
    assert any("qnn_conv2d_NCHWc" in k for k in kernels) == split, kernels


@pytest.mark.parametrize("cpu,register", [("haswell", "ymm"), ("skylake-avx512", "zmm")])
@pytest.mark.parametrize("dtype,zx", [("int8", -128), ("uint8", 0)])
def test_depthwise_tap_pairs_use_vpmaddwd(cpu, register, dtype, zx):
    """x86: the tap pairs' products are ``vpmaddwd`` on the target's vectors, with no int32
    multiply left (``vpmulld``, the one-tap form's)."""
    x, w = _operands((1, 64, 8, 8), (64, 1, 3, 3), dtype, False)
    lib = _build(x, w, zx, 1, 1, 64, f"llvm -mcpu={cpu}").get_lib()
    asm = "".join(m.get_source("asm") for m in [lib, *lib.imported_modules]
                  if m.type_key == "llvm")
    assert re.search(rf"vpmaddwd\s+[^\n]*%{register}", asm), "no vpmaddwd"
    assert "vpmulld" not in asm
