"""The AMX int8 kernel (docs/decisions/026-amx.md): support/amx.c's ``KilnAMXGemmU8S8``
(``ldtilecfg``, ``tileloadd``, ``tdpbusd``, ``tilestored``, ``tilerelease``) and the integer
dense and 1×1 convolution kernels that try it first on targets with AMX-INT8, then run their own
VNNI / AVX2 loops
when it declines (no AMX in cpuid, ``arch_prctl(ARCH_REQ_XCOMP_PERM)`` refused, ``KILN_AMX=0``,
a shape below one tile).

The AMX instructions are checked in the compiled support object everywhere (x86-64 with an
assembler that knows them); they run only where /proc/cpuinfo has ``amx_int8`` and the kernel
grants tile data — elsewhere those tests skip with that reason (this project's machine: AMD
EPYC, AVX2, no AMX; ``qemu-x86_64`` 7.2's TCG does not implement AMX either). Every result is
compared with a numpy int64 reference, exactly."""

from __future__ import annotations

import ctypes
import platform
import re
import shutil
import subprocess

import numpy as np
import pytest
from backend_helpers import cpu_flags, int_conv_reference, run_exported

import kiln
from kiln.errors import CompileError
from kiln.relay.graph import Call, Constant, Function, TensorType, Var
from kiln.relay.op.integer import DENSE_QUAD_AXIS, pack_quads
from kiln.relay.op.nn import pack_dense_weight
from kiln.runtime.toolchain import compiler as toolchain
from kiln.target import Target

RNG = np.random.default_rng(26)
X86 = platform.machine() in ("x86_64", "AMD64")
STATUS = {1: "AMX runs", 0: "KILN_AMX=0", -1: "the CPU has no AMX-TILE/AMX-INT8 (cpuid)",
          -2: "the OS does not enable AMX state (XCR0)",
          -3: "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) was refused",
          -4: "built without AMX (not x86-64 Linux, or no AMX intrinsics in the compiler)"}




@pytest.fixture(scope="module")
def support(tmp_path_factory):
    """amx.c and backend.c as one shared library (ctypes), as every Kiln library links them."""
    work = tmp_path_factory.mktemp("amx")
    so = work / "libkiln_support.so"
    cc = toolchain.find_cc()
    subprocess.run([*cc, *toolchain.COMPILE_FLAGS, f"-I{toolchain.INCLUDE_DIR}",
                    *toolchain.LINK_FLAGS, "-o", str(so), str(toolchain.AMX_C),
                    str(toolchain.BACKEND_C), *toolchain.LINK_LIBS], check=True)
    lib = ctypes.CDLL(str(so))
    lib.KilnAMXGemmU8S8.restype = ctypes.c_int
    lib.KilnAMXGemmU8S8.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 13
    return lib


def _amx_status(lib) -> int:
    return int(lib.KilnAMXStatus())


def _operands(m: int, k: int, n: int, extreme: bool):
    if extreme:
        a = RNG.choice(np.array([0, 255], np.uint8), (m, k))
        w = RNG.choice(np.array([-128, 127], np.int8), (n, k))
    else:
        a = RNG.integers(0, 256, (m, k)).astype(np.uint8)
        w = RNG.integers(-128, 128, (n, k)).astype(np.int8)
    return a, w


def _call(lib, a: np.ndarray, w: np.ndarray, block: int) -> tuple[int, np.ndarray]:
    """``KilnAMXGemmU8S8`` on ``a`` [m, k] u8 and ``w`` [n, k] s8 packed as the integer dense
    packs them: [n / block, k / 4, block] int32 quads."""
    m, k = a.shape
    n = w.shape[0]
    packed = np.ascontiguousarray(pack_quads(pack_dense_weight(w, block), DENSE_QUAD_AXIS))
    out = np.full((m, n), -12345, np.int32)  # poison: every element must be written
    a = np.ascontiguousarray(a)
    rc = lib.KilnAMXGemmU8S8(out.ctypes.data, a.ctypes.data, packed.ctypes.data, 1, m, n,
                             k // 4, block, k, k // 4, 0, 0, n, n, 0, 0)
    return rc, out


@pytest.mark.skipif(not X86, reason="x86-64 only")
def test_support_object_has_amx_instructions(tmp_path):
    """The compiled kernel holds the tile instructions (SDM mnemonics, objdump)."""
    if shutil.which("objdump") is None:
        pytest.skip("no objdump")
    obj = tmp_path / "amx.o"
    subprocess.run([*toolchain.find_cc(), *toolchain.COMPILE_FLAGS, f"-I{toolchain.INCLUDE_DIR}",
                    "-c", str(toolchain.AMX_C), "-o", str(obj)], check=True)
    asm = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    ops = set(re.findall(r"\b(ldtilecfg|tileloadd|tdpbusd|tilestored|tilerelease|tilezero)\b",
                         asm))
    assert ops == {"ldtilecfg", "tileloadd", "tdpbusd", "tilestored", "tilerelease",
                   "tilezero"}, ops


def test_status_explains_this_machine(support):
    status = _amx_status(support)
    assert status in STATUS
    if not X86:
        assert status == -4
    elif "amx_int8" not in cpu_flags():
        assert status == -1, STATUS[status]


def test_declines_without_amx_or_below_one_tile(support):
    """Non-zero (the caller runs its loops) where AMX does not run, and always for a shape
    below one tile (m < 16, K < 64) or a weight block that is not 16 columns wide."""
    for m, k, n, block in ((15, 64, 16, 16), (16, 60, 16, 16), (16, 64, 8, 8)):
        a, w = _operands(m, k, n, False)
        assert _call(support, a, w, block)[0] != 0
    if _amx_status(support) != 1:
        a, w = _operands(32, 128, 32, False)
        assert _call(support, a, w, 32)[0] != 0


def _skip_without_amx(lib) -> None:
    status = _amx_status(lib)
    if "amx_int8" not in cpu_flags():
        pytest.skip("the CPU has no AMX-INT8 (/proc/cpuinfo flags)")
    if status != 1:
        pytest.skip(f"AMX is not usable here: {STATUS[status]}")


@pytest.mark.parametrize("m,k,n,block,extreme", [
    (16, 64, 16, 16, True),       # one tile of each
    (37, 200, 48, 16, False),     # row tail 5, K tail 2 quads, three 16-column tiles
    (64, 256, 64, 32, True),      # full tiles, 32-wide weight blocks
    (20, 1024, 96, 32, False),
])
def test_amx_kernel_exact(support, m, k, n, block, extreme):
    _skip_without_amx(support)
    a, w = _operands(m, k, n, extreme)
    rc, out = _call(support, a, w, block)
    assert rc == 0
    np.testing.assert_array_equal(out, a.astype(np.int64) @ w.astype(np.int64).T)


AMX_TARGETS = ["llvm -mcpu=native -mattr=+amx-int8", "c -mcpu=native -mattr=+amx-int8"]


def _dense(x: np.ndarray, w: np.ndarray, zx: int, target: str, tmp_path) -> np.ndarray:
    xv = Var("x", TensorType(x.shape, str(x.dtype)))
    func = Function([xv], [Call("qnn.dense", [xv, Constant(w)], {"input_zero_point": zx})])
    lib = kiln.build(func, target=target)
    return run_exported(lib, tmp_path / "dense.so", {"x": x})[0]


@pytest.mark.skipif(not X86, reason="x86-64 targets")
@pytest.mark.parametrize("target", AMX_TARGETS)
@pytest.mark.parametrize("dtype,zx,rows,k,n,amx", [
    ("uint8", 131, 37, 200, 50, "0"),   # KILN_AMX=0: the loops, whatever the CPU
    ("int8", -2, 40, 128, 64, ""),      # the CPU decides (here: no AMX, the loops)
    ("int8", 7, 3, 128, 64, ""),        # below one tile: no AMX call compiled at all
])
def test_dense_falls_back_exact(target, dtype, zx, rows, k, n, amx, tmp_path, monkeypatch):
    """An integer dense compiled for an AMX target equals numpy's int64 product whether the
    AMX kernel or the loops ran (KILN_AMX is read once per library, at its first AMX call)."""
    monkeypatch.setenv("KILN_AMX", amx)
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, (rows, k)).astype(dtype)
    w = RNG.integers(-128, 128, (n, k)).astype(np.int8)
    assert Target(target).amx_int8()
    got = _dense(x, w, zx, target, tmp_path)
    np.testing.assert_array_equal(got, (x.astype(np.int64) - zx) @ w.astype(np.int64).T)


def _kernel_source(target: str, rows: int) -> str:
    xv = Var("x", TensorType((rows, 128), "uint8"))
    w = Constant(RNG.integers(-128, 128, (64, 128)).astype(np.int8))
    lib = kiln.build(Function([xv], [Call("qnn.dense", [xv, w], {"input_zero_point": 0})]),
                     target=target).get_lib()
    mods = [lib, *lib.imported_modules]
    kind = "ll" if target.startswith("llvm") else "c"
    return "".join(m.get_source(kind) for m in mods if m.type_key in ("llvm", "c"))


@pytest.mark.skipif(not X86, reason="x86-64 targets")
def test_amx_call_only_where_it_can_apply():
    """The kernel calls KilnAMXGemmU8S8 (weakly: a library without it runs the loops) on AMX
    targets with a tile's worth of rows, and nowhere else."""
    assert re.search(r"declare extern_weak i32 @KilnAMXGemmU8S8\(ptr, ptr, ptr, i64",
                     _kernel_source("llvm -mcpu=sapphirerapids", 32))
    assert "__attribute__((weak))" in _kernel_source("c -mcpu=sapphirerapids", 32)
    assert "KilnAMXGemmU8S8" not in _kernel_source("llvm -mcpu=sapphirerapids", 8)
    assert "KilnAMXGemmU8S8" not in _kernel_source("llvm -mcpu=icelake-server", 32)
    assert not Target("llvm -mcpu=sapphirerapids -mattr=-amx-int8").amx_int8()
    assert not Target("llvm -mtriple=aarch64-linux-gnu").amx_int8()
    with pytest.raises(CompileError, match="amx-int8"):  # not an aarch64 feature: refused
        Target("llvm -mtriple=aarch64-linux-gnu -mattr=+amx-int8")


@pytest.mark.parametrize("target", AMX_TARGETS)
def test_dense_uses_amx_exact(support, target, tmp_path, monkeypatch):
    """Where AMX runs: the compiled dense (AMX kernel, then the compensation) is exact."""
    _skip_without_amx(support)
    monkeypatch.setenv("KILN_AMX", "")
    x = RNG.integers(-128, 128, (53, 320)).astype(np.int8)
    w = RNG.choice(np.array([-128, 127], np.int8), (72, 320))
    got = _dense(x, w, -5, target, tmp_path)
    np.testing.assert_array_equal(got, (x.astype(np.int64) + 5) @ w.astype(np.int64).T)


def _conv(x, w, zx, stride, pad, target, tmp_path, source=False):
    xv = Var("x", TensorType(x.shape, str(x.dtype)))
    attrs = {"strides": (stride, stride), "padding": (pad,) * 4, "dilation": (1, 1),
             "groups": 1, "input_zero_point": zx}
    lib = kiln.build(Function([xv], [Call("qnn.conv2d", [xv, Constant(w)], attrs)]),
                     target=target)
    if source:
        mods = [lib.get_lib(), *lib.get_lib().imported_modules]
        return "".join(m.get_source("ll") for m in mods if m.type_key == "llvm")
    return run_exported(lib, tmp_path / "conv.so", {"x": x})[0]


CONVS = [  # (dtype, zx, batch, cin, cout, size, kernel, stride, pad, AMX call compiled)
    ("int8", -3, 1, 64, 32, 7, 1, 1, 0, True),    # 49 pixels: three row tiles and a tail
    ("uint8", 9, 2, 128, 48, 5, 1, 1, 0, True),   # two images, 25 pixels each
    ("int8", 1, 1, 64, 32, 8, 1, 2, 0, False),    # stride 2: not a product over pixels
    ("int8", 1, 1, 64, 32, 6, 3, 1, 1, False),    # 3x3
]


@pytest.mark.skipif(not X86, reason="x86-64 targets")
@pytest.mark.parametrize("dtype,zx,batch,cin,cout,size,kernel,stride,pad,amx", CONVS)
def test_conv_amx_call_and_exact(support, dtype, zx, batch, cin, cout, size, kernel, stride,
                                 pad, amx, tmp_path, monkeypatch):
    """1×1 stride-1 unpadded convolutions call the AMX kernel on an AMX target (over pixels,
    the channel blocks as K); others do not. Exact either way (AMX where it runs, else the
    loops)."""
    monkeypatch.setenv("KILN_AMX", "")
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, (batch, cin, size, size)).astype(dtype)
    w = RNG.integers(-128, 128, (cout, cin, kernel, kernel)).astype(np.int8)
    target = AMX_TARGETS[0]
    assert ("KilnAMXGemmU8S8" in _conv(x, w, zx, stride, pad, "llvm -mcpu=sapphirerapids",
                                       tmp_path, source=True)) == amx
    got = _conv(x, w, zx, stride, pad, target, tmp_path)
    np.testing.assert_array_equal(got, int_conv_reference(x, w, zx, stride, pad))
