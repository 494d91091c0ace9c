"""Integer convolution and dense kernels (docs/decisions/021), compiled for ``c`` and ``llvm``:
``qnn.conv2d`` / ``qnn.dense`` graphs built directly (AlterOpLayout blocks them into
``qnn.conv2d_NCHWc`` / ``qnn.dense_pack``, int8 weights, unsigned products and a compensation),
their int32 outputs equal to a numpy int64 reference exactly — extreme operands included
(activations 0 and 255, weights -128 and 127: where ``vpmaddubsw``'s int16 pair sums would
saturate) — and, on x86, the LLVM kernel's multiply-adds are ``vpmaddwd`` (AVX2) or
``vpdpbusd`` (VNNI: assembly checked for Ice Lake and Alder Lake; run where the CPU has it)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from backend_helpers import cpu_flags, int_conv_reference

import kiln
from kiln.relay.graph import Call, Constant, Function, TensorType, Var
from kiln.target import Target

RNG = np.random.default_rng(21)


def _data(shape, dtype: str, extreme: bool) -> np.ndarray:
    info = np.iinfo(dtype)
    if extreme:
        return RNG.choice([info.min, info.max], shape).astype(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _weight(shape, extreme: bool) -> np.ndarray:
    if extreme:
        return RNG.choice([-128, 127], shape).astype(np.int8)
    return RNG.integers(-128, 128, shape).astype(np.int8)


def _run(func: Function, x: np.ndarray, target: str) -> np.ndarray:
    lib = kiln.build(func, target=target)
    gm = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input("x", x)
    gm.run()
    return gm.get_output(0).numpy()


CONVS = [  # (dtype, input zero point, cin, cout, size, kernel, stride, extreme operands)
    ("int8", -7, 16, 32, 9, 3, 1, False),
    ("uint8", 3, 3, 16, 11, 3, 2, False),    # an image input: NCHW, words along the width
    ("int8", 5, 3, 16, 15, 7, 2, True),      # resnet's stem: 7x7 (8 taps a row), stride 2
    ("int8", 0, 32, 24, 6, 1, 1, False),     # 1x1, an output block of 8
    ("uint8", 0, 64, 16, 5, 3, 1, True),
    ("int8", 5, 64, 16, 5, 3, 1, True),
]


@pytest.mark.parametrize("dtype,zx,cin,cout,size,kernel,stride,extreme", CONVS)
def test_conv2d_exact(dtype, zx, cin, cout, size, kernel, stride, extreme, target):
    x = _data((1, cin, size, size), dtype, extreme)
    w = _weight((cout, cin, kernel, kernel), extreme)
    pad = kernel // 2
    attrs = {"strides": (stride, stride), "padding": (pad,) * 4, "dilation": (1, 1),
             "groups": 1, "input_zero_point": zx}
    xv = Var("x", TensorType(x.shape, dtype))
    func = Function([xv], [Call("qnn.conv2d", [xv, Constant(w)], attrs)])
    got = _run(func, x, target)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, int_conv_reference(x, w, zx, stride, pad))


@pytest.mark.parametrize("dtype,zx,rows,k,n", [("uint8", 131, 1, 64, 40), ("int8", -2, 3, 200, 16)])
def test_dense_exact(dtype, zx, rows, k, n, target):
    x = _data((rows, k), dtype, extreme=False)
    w = _weight((n, k), extreme=False)
    xv = Var("x", TensorType(x.shape, dtype))
    func = Function([xv], [Call("qnn.dense", [xv, Constant(w)], {"input_zero_point": zx})])
    got = _run(func, x, target)
    np.testing.assert_array_equal(got, (x.astype(np.int64) - zx) @ w.astype(np.int64).T)


def _x86() -> bool:
    import platform

    return platform.machine() in ("x86_64", "AMD64")


def _conv_asm(dtype: str, target: str, cin: int = 32) -> str:
    x = Var("x", TensorType((1, cin, 8, 8), dtype))
    w = Constant(_weight((32, cin, 3, 3), False))
    attrs = {"strides": (1, 1), "padding": (1,) * 4, "dilation": (1, 1), "groups": 1,
             "input_zero_point": 1}
    lib = kiln.build(Function([x], [Call("qnn.conv2d", [x, w], attrs)]), target=target).get_lib()
    mods = [lib, *lib.imported_modules]
    return "".join(m.get_source("asm") for m in mods if m.type_key == "llvm")


def _ops(asm: str) -> set[str]:
    return set(re.findall(r"\b(vpmaddwd|vpmaddubsw|vpdpbusd|vpdpwssd|vfmadd\w+|vpmulld)\b", asm))


@pytest.mark.skipif(not _x86(), reason="x86 assembly")
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_avx2_conv_uses_pmaddwd(dtype):
    """AVX2: the quads' products are two ``vpmaddwd`` (exact int16 x int16 -> int32 pair sums;
    never ``vpmaddubsw``, which saturates); no float multiply-add, no ``vpmulld``."""
    assert _ops(_conv_asm(dtype, "llvm -mcpu=haswell")) == {"vpmaddwd"}


VNNI_CPUS = [("icelake-server", "zmm"), ("sapphirerapids", "zmm"), ("znver4", "zmm"),
             ("alderlake", "ymm")]


@pytest.mark.skipif(not _x86(), reason="x86 assembly")
@pytest.mark.parametrize("cpu,register", VNNI_CPUS)
def test_vnni_conv_uses_vpdpbusd(cpu, register):
    """AVX512-VNNI (512-bit vectors) and AVX-VNNI (256): one ``vpdpbusd`` per weight vector
    and activation word, accumulating in place. Checked in the assembly LLVM emits for those
    CPUs; this machine need not have them (the run-time test below skips without)."""
    asm = _conv_asm("int8", f"llvm -mcpu={cpu}")
    assert "vpdpbusd" in _ops(asm) and "vpmaddubsw" not in _ops(asm), _ops(asm)
    assert re.search(rf"vpdpbusd\s+[^\n]*%{register}", asm)




@pytest.mark.skipif(not {"avx512_vnni", "avx_vnni"} & cpu_flags(),
                    reason="the CPU has no AVX512-VNNI / AVX-VNNI (/proc/cpuinfo flags)")
@pytest.mark.parametrize("dtype,zx", [("uint8", 128), ("int8", -3)])
def test_vnni_conv_exact(dtype, zx):
    x = _data((1, 32, 7, 7), dtype, extreme=True)
    w = _weight((16, 32, 3, 3), extreme=True)
    attrs = {"strides": (1, 1), "padding": (1,) * 4, "dilation": (1, 1), "groups": 1,
             "input_zero_point": zx}
    xv = Var("x", TensorType(x.shape, dtype))
    func = Function([xv], [Call("qnn.conv2d", [xv, Constant(w)], attrs)])
    assert Target("llvm -mcpu=native").int8_dot().startswith("vnni")
    np.testing.assert_array_equal(_run(func, x, "llvm -mcpu=native"),
                                  int_conv_reference(x, w, zx, 1, 1))


@pytest.mark.skipif(not _x86(), reason="x86 assembly")
@pytest.mark.parametrize("cpu,register", VNNI_CPUS)
@pytest.mark.parametrize("rows", [4, 64])
def test_vnni_dense_uses_vpdpbusd(cpu, register, rows):
    """The packed integer dense: every ``vpdpbusd`` on the CPU's widest vectors (zmm with
    AVX512-VNNI, ymm with AVX-VNNI alone), none of the AVX2 pair products (on Sapphire Rapids
    with 64 rows these are the loops behind the AMX call, docs/decisions/026)."""
    x = Var("x", TensorType((rows, 256), "int8"))
    w = Constant(_weight((64, 256), False))
    lib = kiln.build(Function([x], [Call("qnn.dense", [x, w], {"input_zero_point": 1})]),
                     target=f"llvm -mcpu={cpu}").get_lib()
    asm = "".join(m.get_source("asm") for m in [lib, *lib.imported_modules]
                  if m.type_key == "llvm")
    assert _ops(asm) & {"vpdpbusd", "vpmaddwd", "vpmaddubsw"} == {"vpdpbusd"}, _ops(asm)
    assert set(re.findall(r"vpdpbusd\s+[^\n]*%(zmm|ymm|xmm)", asm)) == {register}


def _dense_func(x: np.ndarray, w: np.ndarray, zx: int) -> Function:
    xv = Var("x", TensorType(x.shape, str(x.dtype)))
    return Function([xv], [Call("qnn.dense", [xv, Constant(w)], {"input_zero_point": zx})])


def _dense_reference(x: np.ndarray, w: np.ndarray, zx: int) -> np.ndarray:
    return (x.astype(np.int64) - zx) @ w.astype(np.int64).T


@pytest.mark.parametrize("cpu,pairs", [("haswell", True), ("znver3", True),
                                       ("icelake-server", False), ("alderlake", False),
                                       ("skylake-avx512", False)])
def test_dense_pairs_form_on_avx2_without_vnni(cpu, pairs):
    """The int8 dense takes int16 activation pairs on AVX2 without VNNI only; ``vpdpbusd``
    (and AVX-512BW, not measured) keep the quads; ``c`` and generic LLVM too."""
    from kiln.topi.integer import dense_pairs_form

    with Target(f"llvm -mcpu={cpu}"):
        assert dense_pairs_form() is pairs
    for other in ("c", "llvm"):
        with Target(other):
            assert not dense_pairs_form()


@pytest.mark.parametrize("dtype,zx,rows,k,n,extreme", [
    ("uint8", 131, 7, 64, 40, True),      # a row tail, a padded column block, 0/255 × -128/127
    ("int8", -2, 3, 200, 16, False),
    ("uint8", 0, 16, 384, 48, False),
])
def test_dense_pairs_exact(dtype, zx, rows, k, n, extreme, target, monkeypatch):
    """The pair form (:func:`kiln.topi.integer._dense_pairs`) forced on ``c`` and generic
    ``llvm`` (its plain-integer lowering): equal to numpy's int64 product."""
    from kiln.topi import integer

    monkeypatch.setattr(integer, "dense_pairs_form", lambda: True)
    x = _data((rows, k), dtype, extreme)
    w = _weight((n, k), extreme)
    func = _dense_func(x, w, zx)
    if target == "c":  # the pair form's products called, the quads' only defined (prelude)
        source = kiln.build(func, target="c").get_lib().get_source()
        assert source.count("kiln_dot_i16x2(") > 1 and source.count("kiln_dot_u8i8x4(") == 1
    np.testing.assert_array_equal(_run(func, x, target), _dense_reference(x, w, zx))


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="the CPU has no AVX2")
@pytest.mark.parametrize("dtype,zx,rows,extreme", [("uint8", 255, 13, True),
                                                   ("int8", 3, 128, True),
                                                   ("uint8", 7, 32, False)])
def test_dense_pairs_avx2_exact(dtype, zx, rows, extreme):
    """On this CPU's AVX2 (unless it has VNNI): ``vpmaddwd`` on the broadcast pair words and
    the weight vectors' even / odd bytes, exact with extreme operands (where ``vpmaddubsw``
    would saturate)."""
    from kiln.topi.integer import dense_pairs_form

    target = "llvm -mcpu=native"
    with Target(target):
        if not dense_pairs_form():
            pytest.skip("the CPU has an 8-bit dot product: the quad form")
    x = _data((rows, 256), dtype, extreme)
    w = _weight((64, 256), extreme)
    np.testing.assert_array_equal(_run(_dense_func(x, w, zx), x, target),
                                  _dense_reference(x, w, zx))


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="the CPU has no AVX2")
@pytest.mark.parametrize("target", ["llvm -mcpu=haswell", "llvm -mcpu=portable"])
@pytest.mark.parametrize("rows,depth,cols", [(2, 8, 2), (6, 8, 2), (3, 12, 4), (5, 16, 6)])
def test_dense_narrow_weight_blocks_exact(rows, depth, cols, target):
    """Haswell and the multi-level library (its AVX2 level runs here), weight blocks under one
    vector (a 2-output head): exact. Such blocks were scalar IR that LLVM's SLP vectorizer
    miscompiled (2x8 · 8x2 wrong at O1-O3)."""
    x = np.random.default_rng(0).integers(0, 256, (rows, depth)).astype("uint8")
    w = np.random.default_rng(1).integers(-128, 128, (cols, depth)).astype(np.int8)
    np.testing.assert_array_equal(_run(_dense_func(x, w, 0), x, target),
                                  _dense_reference(x, w, 0))


@pytest.mark.skipif(not _x86(), reason="x86 assembly")
def test_avx2_dense_uses_pmaddwd():
    """Haswell: the int8 dense's products are ``vpmaddwd`` only (no ``vpmaddubsw``), on
    broadcast pair words widened before the loop: no ``vpand`` / ``vpsrlw`` in it (the quad
    form had 32 of each per 128 ``vpmaddwd``)."""
    x = _data((32, 256), "uint8", False)
    lib = kiln.build(_dense_func(x, _weight((64, 256), False), 1),
                     target="llvm -mcpu=haswell").get_lib()
    asm = "".join(m.get_source("asm") for m in [lib, *lib.imported_modules]
                  if m.type_key == "llvm")
    assert _ops(asm) == {"vpmaddwd"}, _ops(asm)
    loops = _product_loops(asm)
    assert loops
    for ops in loops:
        assert "vpand" not in ops and "vpsrlw" not in ops, sorted(set(ops))


PAIR_CONVS = [  # (dtype, zx, cin, cout, size, kernel, stride, extreme operands)
    ("uint8", 0, 32, 24, 7, 1, 1, True),     # 1x1: a pixel row block, an output block of 8
    ("int8", -128, 16, 16, 6, 1, 2, True),   # 1x1 stride 2
    ("uint8", 255, 32, 16, 5, 3, 1, True),   # 3x3: the padding's pair words u(zx)
    ("int8", 7, 64, 32, 6, 3, 2, False),
]


def _conv_func(x: np.ndarray, w: np.ndarray, zx: int, stride: int, pad: int) -> Function:
    attrs = {"strides": (stride, stride), "padding": (pad,) * 4, "dilation": (1, 1),
             "groups": 1, "input_zero_point": zx}
    xv = Var("x", TensorType(x.shape, str(x.dtype)))
    return Function([xv], [Call("qnn.conv2d", [xv, Constant(w)], attrs)])


@pytest.mark.parametrize("dtype,zx,cin,cout,size,kernel,stride,extreme", PAIR_CONVS)
def test_conv_pairs_exact(dtype, zx, cin, cout, size, kernel, stride, extreme, target,
                          monkeypatch):
    """The NCHWc conv on activation pair words (stage ``qnn_conv_pairs``, the AVX2 form of
    :func:`kiln.topi.integer._conv2d_quads`) forced on ``c`` and generic ``llvm``: equal to
    numpy's int64 convolution, with 0/255 (-128/127) activations and -128/127 weights."""
    from kiln.topi import integer

    monkeypatch.setattr(integer, "dense_pairs_form", lambda: True)
    x = _data((1, cin, size, size), dtype, extreme)
    w = _weight((cout, cin, kernel, kernel), extreme)
    func = _conv_func(x, w, zx, stride, kernel // 2)
    if target == "c":  # the pair form's products called, the quads' only defined (prelude)
        source = kiln.build(func, target="c").get_lib().get_source()
        assert source.count("kiln_dot_i16x2(") > 1 and source.count("kiln_dot_u8i8x4(") == 1
    np.testing.assert_array_equal(_run(func, x, target),
                                  int_conv_reference(x, w, zx, stride, kernel // 2))


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="the CPU has no AVX2")
@pytest.mark.parametrize("dtype,zx,kernel", [("uint8", 255, 1), ("int8", -128, 3)])
def test_conv_pairs_avx2_exact(dtype, zx, kernel):
    """On this CPU's AVX2 (unless it has VNNI): the pair words' ``vpmaddwd``, exact with
    extreme operands."""
    from kiln.topi.integer import dense_pairs_form

    target = "llvm -mcpu=native"
    with Target(target):
        if not dense_pairs_form():
            pytest.skip("the CPU has an 8-bit dot product: the quad form")
    x = _data((1, 64, 9, 9), dtype, True)
    w = _weight((32, 64, kernel, kernel), True)
    func = _conv_func(x, w, zx, 1, kernel // 2)
    np.testing.assert_array_equal(_run(func, x, target),
                                  int_conv_reference(x, w, zx, 1, kernel // 2))


def _product_loops(asm: str) -> list[list[str]]:
    """The mnemonics of each innermost assembly loop (a label to its backward jump) that
    has a ``vpmaddwd``."""
    lines = asm.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines)
              if (m := re.match(r"^(\.LBB\w+):", line))}
    loops = []
    for i, line in enumerate(lines):
        m = re.match(r"\s+j\w+\s+(\.LBB\w+)", line)
        if m and labels.get(m.group(1), i) < i:
            ops = [s.split()[0] for s in lines[labels[m.group(1)]:i + 1]
                   if s.startswith("\t") and not s.strip().startswith(".")]
            if "vpmaddwd" in ops:
                loops.append(ops)
    return loops


@pytest.mark.skipif(not _x86(), reason="x86 assembly")
@pytest.mark.parametrize("kernel", [1, 3])
def test_avx2_conv_pairs_not_widened_in_loop(kernel):
    """Haswell: the conv's product loops broadcast pair words and widen nothing — no
    ``vpand`` / ``vpsrlw`` on the activations (the quads' per-block widening); the weight's
    bytes are two 16-bit shifts a vector."""
    x = _data((1, 32, 8, 8), "uint8", False)
    func = _conv_func(x, _weight((32, 32, kernel, kernel), False), 1, 1, kernel // 2)
    lib = kiln.build(func, target="llvm -mcpu=haswell").get_lib()
    asm = "".join(m.get_source("asm") for m in [lib, *lib.imported_modules]
                  if m.type_key == "llvm")
    loops = _product_loops(asm)
    assert loops
    for ops in loops:
        assert "vpand" not in ops and "vpsrlw" not in ops, sorted(set(ops))
        assert ops.count("vpbroadcastd") * 4 >= ops.count("vpmaddwd"), sorted(set(ops))
