"""``vpmaddubsw`` for the integer kernels on AVX2 without VNNI (docs/decisions/049), compiled
for ``c -mcpu=haswell`` and ``llvm -mcpu=haswell`` (both run on this x86 CPU).

- exact mode (the default): weights in [-64, 64] prove that no int16 pair sum saturates, so the
  kernels take ``vpmaddubsw``; any other weight keeps the exact ``vpmaddwd`` pairs. Single-op
  QLinearConv / ConvInteger / QLinearMatMul / MatMulInteger equal onnxruntime bit for bit on a
  VNNI CPU (its int8 kernels are exact there), extreme operands included; elsewhere ONNX's
  reference evaluator (exact int32, QLinear requantization within one step: float64).
- ``int8_products="saturate"``: equal bit for bit to a numpy emulation of onnxruntime MLAS's
  AVX2 U8S8 kernel (``QgemmU8X8KernelAvx2.S``: K in quads, ``vpmaddubsw`` summing the products
  of k-pairs (2m, 2m + 1) into int16 with saturation, ``vpmaddwd`` with ones; the zero points
  as row / column sums), written here over onnxruntime's own orders (MatMul's K; the conv's
  NHWC im2col, K = (tap, channel)) — and different from the exact result on these operands.
- the assembly of the haswell LLVM build has ``vpmaddubsw`` exactly where it should.
"""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest
from backend_helpers import cpu_flags, run_exported, run_onnxruntime
from contrib_cases import model as single_op_model
from contrib_cases import onnxruntime_saturates_u8s8
from onnx import helper

import kiln
from kiln.errors import CompileError
from kiln.frontend import from_onnx
from kiln.relay.op.integer import pack_quads, pair_sums_fit_int16
from kiln.tir.intrin_int8 import dot_u8i8x4_sat16_value, dot_u8i8x4_value

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="haswell code runs on x86 only")

RNG = np.random.default_rng(49)


def _model(nodes, inputs: dict, inits: dict, outputs: list[str]):
    """A default-domain opset 13 model of ``nodes`` (:func:`contrib_cases.model`)."""
    return single_op_model(nodes, inputs, inits, outputs, opset=13)


def _extreme(shape, dtype) -> np.ndarray:
    """Operands where ``vpmaddubsw`` saturates: mostly the type's extremes."""
    info = np.iinfo(dtype)
    values = RNG.integers(info.min, info.max + 1, shape)
    corner = RNG.random(shape) < 0.6
    return np.where(corner, RNG.choice([info.min, info.max], shape), values).astype(dtype)


def _ops_model(dtype: str, small_weights: bool):
    """QLinearConv (3×3, pad 1), ConvInteger (1×1 stride 2), QLinearMatMul and MatMulInteger,
    constant int8 weights (zero point 0): in [-64, 64] or full range with extremes."""
    def weight(shape):
        if small_weights:
            return RNG.integers(-64, 65, shape).astype(np.int8)
        return _extreme(shape, np.int8)

    zx = np.array(7 if dtype == "uint8" else -5, dtype)
    inits = {
        "xs": np.array(0.02, "float32"), "xz": zx, "w": weight((24, 16, 3, 3)),
        "ws": np.array(0.01, "float32"), "wz": np.array(0, "int8"),
        "ys": np.array(4.0, "float32"), "yz": np.array(3, dtype), "w1": weight((32, 16, 1, 1)),
        "b": weight((64, 40)), "bz": np.array(0, "int8"),
    }
    nodes = [
        helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y0"],
                         pads=[1, 1, 1, 1]),
        helper.make_node("ConvInteger", ["x", "w1", "xz", "wz"], ["y1"], strides=[2, 2]),
        helper.make_node("QLinearMatMul", ["a", "xs", "xz", "b", "ws", "wz", "ys", "yz"],
                         ["y2"]),
        helper.make_node("MatMulInteger", ["a", "b", "xz", "bz"], ["y3"]),
    ]
    inputs = {"x": _extreme((1, 16, 9, 9), dtype), "a": _extreme((5, 64), dtype)}
    return _model(nodes, inputs, inits, ["y0", "y1", "y2", "y3"]), inputs, inits


def _build_run(model, inputs, tmp_path, target, **options) -> list[np.ndarray]:
    mod, params = from_onnx(model, shape={k: v.shape for k, v in inputs.items()})
    lib = kiln.build(mod, target=target, params=params, **options)
    return run_exported(lib, tmp_path / "model.so", inputs)


def _saturated_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MLAS's U8S8 AVX2 product of ``a`` [M, K] (unsigned values) and ``b`` [K, N] int8: K
    zero-padded to a multiple of 4, each k-pair (2m, 2m + 1) summed into int16 with
    saturation (``vpmaddubsw``), the int16 sums added exactly (``vpmaddwd`` with ones)."""
    k = a.shape[1]
    pad = -k % 4
    a = np.pad(a.astype(np.int64), ((0, 0), (0, pad)))
    b = np.pad(b.astype(np.int64), ((0, pad), (0, 0)))
    pairs = a[:, 0::2, None] * b[None, 0::2] + a[:, 1::2, None] * b[None, 1::2]  # [M, K/2, N]
    return np.clip(pairs, -32768, 32767).sum(axis=1)


def _unsigned(x: np.ndarray) -> np.ndarray:
    """What MLAS's U8S8 kernel reads: uint8 as it is, int8 shifted by 128 (onnxruntime's QDQ
    S8 → U8 rewrite)."""
    return x.astype(np.int64) + (128 if x.dtype == np.int8 else 0)


def _saturated_conv(x: np.ndarray, w: np.ndarray, zx: int, stride: int, pad: int):
    """ConvInteger through onnxruntime's NHWC im2col (K = (kernel row, column, channel)) and
    :func:`_saturated_matmul`; the zero point as MLAS's column sums ``u(zx) · Σ w``."""
    u, uz = _unsigned(x), int(zx) + (128 if x.dtype == np.int8 else 0)
    u = np.pad(u, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=uz)
    o, c, kh, kw = w.shape
    oh = (u.shape[2] - kh) // stride + 1
    ow = (u.shape[3] - kw) // stride + 1
    nhwc = u.transpose(0, 2, 3, 1)
    cols = np.stack([nhwc[:, ry:ry + stride * (oh - 1) + 1:stride,
                          rx:rx + stride * (ow - 1) + 1:stride] for ry in range(kh)
                     for rx in range(kw)], axis=3).reshape(-1, kh * kw * c)
    wk = w.transpose(2, 3, 1, 0).reshape(kh * kw * c, o)
    acc = _saturated_matmul(cols, wk) - uz * wk.astype(np.int64).sum(axis=0)
    return acc.reshape(x.shape[0], oh, ow, o).transpose(0, 3, 1, 2)


def _requantize(acc: np.ndarray, inits: dict) -> np.ndarray:
    """onnxruntime's QLinear requantization (``MlasRequantizeOutput``): float32 multiply by
    ``xs · ws / ys``, round half to even, add the zero point, saturate."""
    scale = np.float32(inits["xs"]) * np.float32(inits["ws"]) / np.float32(inits["ys"])
    y = np.rint(acc.astype(np.float32) * scale) + inits["yz"].astype(np.float32)
    info = np.iinfo(inits["yz"].dtype)
    return np.clip(y, info.min, info.max).astype(inits["yz"].dtype)


def _emulated(inputs: dict, inits: dict) -> list[np.ndarray]:
    zx = int(inits["xz"])
    x, a = inputs["x"], inputs["a"]
    conv3 = _saturated_conv(x, inits["w"], zx, 1, 1)
    conv1 = _saturated_conv(x, inits["w1"], zx, 2, 0)
    ua, uz = _unsigned(a), zx + (128 if a.dtype == np.int8 else 0)
    mm = _saturated_matmul(ua, inits["b"]) - uz * inits["b"].astype(np.int64).sum(axis=0)
    return [_requantize(conv3, inits), conv1.astype(np.int32), _requantize(mm, inits),
            mm.astype(np.int32)]


def test_pair_sums_fit_int16_bounds():
    """The proof is per byte pair (0, 1) and (2, 3) of each word, at u = 255."""
    def fits(*quad):
        return pair_sums_fit_int16(pack_quads(np.array([quad], np.int8), 1))

    assert fits(64, 64, -64, -64) and fits(127, -128, -128, 127) and fits(-64, -64, 64, 64)
    assert not fits(65, 64, 0, 0) and not fits(0, 0, -65, -64) and not fits(0, 0, 127, 2)
    assert fits(0, 0, 127, 1)  # 255 · 128 = 32640
    assert fits(127, 0, 0, 127)  # the large weights fall in different pairs


def test_sat16_intrinsic_matches_mlas_pairs():
    """``dot_u8i8x4_sat16`` = the MLAS emulation on single quads; equal to the exact product
    where the pair sums fit, and not on saturating quads."""
    words = RNG.integers(-2**31, 2**31, (2000, 2)).astype(np.int64)
    differs = 0
    for a, b in words:
        ua = np.array([(a >> (8 * j)) & 255 for j in range(4)])[None]
        sb = np.array([[(b >> (8 * j)) & 255] for j in range(4)]).astype(np.uint8).view(np.int8)
        want = int(_saturated_matmul(ua, sb)[0, 0])
        assert dot_u8i8x4_sat16_value(int(a), int(b)) == want
        differs += want != dot_u8i8x4_value(int(a), int(b))
    assert differs > 0


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("small_weights", [True, False])
def test_exact_mode_matches_onnxruntime(dtype, small_weights, target, tmp_path):
    """Default mode on haswell: bit-exact vs onnxruntime with extreme activations, whether
    the weights prove the ``vpmaddubsw`` form exact (small) or keep the ``vpmaddwd`` pairs."""
    model, inputs, _ = _ops_model(dtype, small_weights)
    got = _build_run(model, inputs, tmp_path, f"{target} -mcpu=haswell")
    if {"avx512_vnni", "avx_vnni"} & cpu_flags():  # onnxruntime's int8 kernels are exact
        want, steps = run_onnxruntime(model, inputs), 0
    else:  # its AVX2 U8S8 saturates: ONNX's reference evaluator (float64 requantization)
        from onnx.reference import ReferenceEvaluator

        want, steps = ReferenceEvaluator(model).run(None, inputs), 1
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype
        tolerance = steps if k in (0, 2) else 0  # QLinear outputs; the int32 ones are exact
        np.testing.assert_allclose(g.astype(np.int64), w.astype(np.int64), rtol=0,
                                   atol=tolerance, err_msg=f"output {k}")


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_saturate_mode_equals_mlas_emulation(dtype, target, tmp_path):
    """``int8_products="saturate"`` on haswell: bit for bit the MLAS U8S8 emulation, which
    differs from the exact products on these operands (the test can tell the two apart). On a
    CPU where onnxruntime's own U8S8 products saturate (no VNNI), bit for bit onnxruntime too
    for QLinearConv, QLinearMatMul and MatMulInteger (its ConvInteger is exact there: measured
    on a Zen 2, onnxruntime 1.31); the exact reference is then ONNX's evaluator
    (onnxruntime's single-op S8S8 kernels are exact everywhere)."""
    model, inputs, inits = _ops_model(dtype, small_weights=False)
    got = _build_run(model, inputs, tmp_path, f"{target} -mcpu=haswell",
                     int8_products="saturate")
    want = _emulated(inputs, inits)
    ort = run_onnxruntime(model, inputs)
    saturating_ort = dtype == "uint8" and onnxruntime_saturates_u8s8()
    if saturating_ort:
        from onnx.reference import ReferenceEvaluator

        exact = ReferenceEvaluator(model).run(None, inputs)
    else:
        exact = ort
    for k, (g, w, e) in enumerate(zip(got, want, exact, strict=True)):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w, err_msg=f"output {k}")
        assert not np.array_equal(w, e), f"output {k}: the emulation did not saturate"
        if saturating_ort and k != 1:  # output 1: ConvInteger
            np.testing.assert_array_equal(g, ort[k], err_msg=f"output {k} vs onnxruntime")


def _dense_asm(weight: np.ndarray, target: str, **options) -> str:
    x = np.zeros((16, weight.shape[1]), "uint8")
    inits = {"b": weight.T.copy(), "z": np.array(3, "uint8")}
    model = _model([helper.make_node("MatMulInteger", ["a", "b", "z"], ["y"])], {"a": x},
                   inits, ["y"])
    mod, params = from_onnx(model, shape={"a": x.shape})
    lib = kiln.build(mod, target=target, params=params, **options).get_lib()
    return "".join(m.get_source("asm") for m in [lib, *lib.imported_modules]
                   if m.type_key == "llvm")


def _conv_asm(weight: np.ndarray, target: str, **options) -> str:
    x = np.zeros((1, weight.shape[1], 8, 8), "uint8")
    model = _model([helper.make_node("ConvInteger", ["x", "w", "z"], ["y"], pads=[1] * 4)],
                   {"x": x}, {"w": weight, "z": np.array(3, "uint8")}, ["y"])
    mod, params = from_onnx(model, shape={"x": x.shape})
    lib = kiln.build(mod, target=target, params=params, **options).get_lib()
    return "".join(m.get_source("asm") for m in [lib, *lib.imported_modules]
                   if m.type_key == "llvm")


def _products(asm: str) -> set[str]:
    return set(re.findall(r"\b(vpmaddubsw|vpmaddwd|vpdpbusd)\b", asm))


SMALL = RNG.integers(-64, 64, (64, 256)).astype(np.int8)  # reduce_range's 7-bit weights
FULL = RNG.integers(-128, 128, (64, 256)).astype(np.int8)


@pytest.mark.parametrize("asm_of,shape", [(_dense_asm, (64, 256)), (_conv_asm, (32, 32, 3, 3))])
def test_haswell_takes_vpmaddubsw_where_proven_or_asked(asm_of, shape):
    """Haswell LLVM: ``vpmaddubsw`` (with ``vpmaddwd`` summing its pairs) for 7-bit weights and
    in the saturating mode; the exact ``vpmaddwd`` pairs alone for full-range weights."""
    small, full = SMALL.reshape(-1)[:np.prod(shape)].reshape(shape), \
        FULL.reshape(-1)[:np.prod(shape)].reshape(shape)
    assert _products(asm_of(small, "llvm -mcpu=haswell")) == {"vpmaddubsw", "vpmaddwd"}
    assert _products(asm_of(full, "llvm -mcpu=haswell")) == {"vpmaddwd"}
    assert _products(asm_of(full, "llvm -mcpu=haswell", int8_products="saturate")) == \
        {"vpmaddubsw", "vpmaddwd"}


def test_saturate_mode_is_exact_where_the_cpu_has_vnni():
    """``vpdpbusd`` is exact and faster: the saturating mode changes nothing on VNNI."""
    asm = _dense_asm(FULL, "llvm -mcpu=icelake-server", int8_products="saturate")
    assert _products(asm) == {"vpdpbusd"}


def test_unknown_int8_products_mode():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": np.zeros(3, "float32")},
                   {}, ["y"])
    mod, params = from_onnx(model)
    with pytest.raises(CompileError, match="int8_products 'fast'"):
        kiln.build(mod, target="llvm -mcpu=haswell", params=params, int8_products="fast")


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_op_references_with_saturating_pairs(dtype):
    """The numpy references of ``qnn.conv2d_NCHWc`` / ``qnn.dense_pack`` with
    ``saturating_pairs`` (what FoldConstant runs) equal the MLAS emulation on blocked,
    quad-packed operands."""
    from kiln.relay.op.integer import DENSE_QUAD_AXIS, compensation
    from kiln.relay.op.nn import pack_dense_weight
    from kiln.relay.op_registry import get_op
    from kiln.tir.layout import transform_array

    zx = 9 if dtype == "uint8" else -3
    x, w = _extreme((1, 16, 6, 6), dtype), _extreme((8, 16, 3, 3), np.int8)
    xb = transform_array(x, "NCHW", "NCHW8c")
    wb = pack_quads(transform_array(w, "OIHW", "OIHW8i8o"), 4)
    comp = compensation(w, zx, dtype).reshape(-1, 8)
    got = get_op("qnn.conv2d_NCHWc").ref(xb, wb, comp, strides=(1, 1), padding=(1, 1, 1, 1),
                                         dilation=(1, 1), input_zero_point=zx,
                                         saturating_pairs=True)
    want = _saturated_conv(x, w, zx, 1, 1)
    np.testing.assert_array_equal(transform_array(got, "NCHW8c", "NCHW"), want)
    a, b = _extreme((3, 32), dtype), _extreme((16, 32), np.int8)
    packed = pack_quads(pack_dense_weight(b, 8), DENSE_QUAD_AXIS)
    got = get_op("qnn.dense_pack").ref(a, packed, compensation(b, zx, dtype),
                                       saturating_pairs=True)
    uz = zx + (128 if dtype == "int8" else 0)
    want = _saturated_matmul(_unsigned(a), b.T) - uz * b.astype(np.int64).sum(axis=1)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(want, (_unsigned(a) - uz) @ b.T.astype(np.int64))


def test_cli_int8_products_flag(tmp_path):
    """``kiln compile --int8-products saturate`` builds the saturating kernels."""
    from kiln.cli.main import main

    weight = FULL.T.copy()  # K × N, full range: exact mode keeps vpmaddwd pairs
    model = _model([helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
                   {"a": np.zeros((16, 256), "uint8")}, {"b": weight}, ["y"])
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info(
        "y", helper.np_dtype_to_tensor_dtype(np.dtype("int32")), (16, 64)))
    path = tmp_path / "mm.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "mm.so"
    assert main(["compile", str(path), "--target", "llvm -mcpu=haswell", "-o", str(out), "-q",
                 "--int8-products", "saturate"]) == 0
    a = _extreme((16, 256), "uint8")
    gm = kiln.graph_executor.GraphModule(kiln.runtime.load_module(str(out))["default"](
        kiln.cpu()))
    gm.set_input("a", a)
    gm.run()
    want = _saturated_matmul(a, weight)
    assert not np.array_equal(want, a.astype(np.int64) @ weight.astype(np.int64))
    np.testing.assert_array_equal(gm.get_output(0).numpy(), want)


def test_avx512bw_without_vnni_saturates_on_zmm(tmp_path):
    """Skylake-X (AVX-512BW, no VNNI): the saturating mode's ``vpmaddubsw`` on 512-bit vectors,
    equal to the MLAS emulation where this CPU runs AVX-512BW code."""
    a = _extreme((16, 256), "uint8")
    model = _model([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], {"a": a},
                   {"b": FULL.T.copy()}, ["y"])
    mod, params = from_onnx(model, shape={"a": a.shape})
    lib = kiln.build(mod, target="llvm -mcpu=skylake-avx512", params=params,
                     int8_products="saturate")
    asm = "".join(m.get_source("asm") for m in [lib.get_lib(), *lib.get_lib().imported_modules]
                  if m.type_key == "llvm")
    assert re.search(r"vpmaddubsw\s+[^\n]*%zmm", asm), _products(asm)
    if "avx512bw" not in cpu_flags():
        pytest.skip("this CPU has no AVX-512BW: assembly only")
    (got,) = run_exported(lib, tmp_path / "mm.so", {"a": a})
    np.testing.assert_array_equal(got, _saturated_matmul(a, FULL.T))


@pytest.mark.parametrize("products", ["exact", "saturate"])
def test_multi_level_library(products, tmp_path):
    """``-mcpu=portable`` (one graph, kernels per x86-64 level): its AVX2 and AVX-512 levels
    take ``vpmaddubsw`` (no level has VNNI) for 7-bit weights and in the saturating mode; the
    level this CPU loads gives the proven-exact product, or the MLAS emulation's."""
    a = _extreme((16, 256), "uint8")
    weight = SMALL.T.copy() if products == "exact" else FULL.T.copy()
    model = _model([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], {"a": a},
                   {"b": weight}, ["y"])
    mod, params = from_onnx(model, shape={"a": a.shape})
    lib = kiln.build(mod, target="llvm -mcpu=portable", params=params, int8_products=products)
    asm = "".join(m.get_source("asm") for m in [lib.get_lib(), *lib.get_lib().imported_modules]
                  if m.type_key == "llvm")
    assert re.search(r"vpmaddubsw\s+[^\n]*%ymm", asm) and \
        re.search(r"vpmaddubsw\s+[^\n]*%zmm", asm), _products(asm)
    (got,) = run_exported(lib, tmp_path / "mm.so", {"a": a})
    exact = a.astype(np.int64) @ weight.astype(np.int64)
    np.testing.assert_array_equal(got, exact if products == "exact" else
                                  _saturated_matmul(a, weight))


def test_saturate_mode_reaches_loop_bodies():
    """A DynamicQuantizeLSTM over a symbolic length runs as a VM loop whose body holds the
    recurrent integer products: ``int8_products="saturate"`` reaches it like ``main`` (it did
    not: the body's kernels kept the exact pairs, and the build differed from onnxruntime on an
    AVX2 CPU without VNNI)."""
    from contrib_cases import CASES

    case = next(c for c in CASES if c.name.startswith("DynamicQuantizeLSTM (bi"))
    model, _ = case.build()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    (lstm,) = [n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    lstm.input[4] = ""  # sequence_lens of the old fixed length: every length
    mod, params = from_onnx(model)
    exe = kiln.build(mod, target="llvm -mcpu=haswell", params=params, int8_products="saturate")
    assert isinstance(exe, kiln.runtime.VMExecutable)
    lib = exe.lib
    asm = "".join(m.get_source("asm") for m in [lib, *lib.imported_modules]
                  if m.type_key == "llvm")
    kernels = [k for k in re.split(r"\n(?=[A-Za-z_][\w.]*:\n)", asm) if "vpmaddwd" in k]
    assert len(kernels) >= 2  # the input projection (main) and the recurrence (loop body)
    for kernel in kernels:
        assert "vpmaddubsw" in kernel, kernel.split(":", 1)[0]
