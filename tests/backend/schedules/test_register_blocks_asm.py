"""The conv register blocks fit the target's vector registers (docs/decisions/003): no
accumulator spilled to the stack in a 3×3 or a 1×1 conv's machine code, with AVX2's 16 ymm
(at most 6 pixels × 2 vectors: 4 over a 28-pixel row) and AVX-512's 32 zmm (14 pixels × 2
vectors, unchanged). Checked in the assembly LLVM emits for the named CPU (no need to run it
on one)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln
from kiln.relay.graph import Call, Constant, Function, TensorType, Var
from kiln.relay.transform import winograd

X86 = "llvm -mtriple=x86_64-linux-gnu"


@pytest.fixture(autouse=True)
def direct_convs(monkeypatch):
    """The direct kernel's blocks: 3×3 stride-1 convs would run as Winograd convs (decision
    050) unless a test turns it back on."""
    monkeypatch.setattr(winograd, "WINOGRAD", False)
    return monkeypatch


def _conv_asm(target: str, cin: int, cout: int, hw: int, k: int) -> str:
    x = Var("x", TensorType((1, cin, hw, hw), "float32"))
    w = Constant(np.random.default_rng(0).standard_normal((cout, cin, k, k)).astype(np.float32))
    attrs = {"strides": (1, 1), "padding": (k // 2,) * 4, "dilation": (1, 1), "groups": 1}
    lib = kiln.build(Function([x], [Call("nn.conv2d", [x, w], attrs)]), target=target).get_lib()
    mods = [lib, *lib.imported_modules]
    return "".join(m.get_source("asm") for m in mods if m.type_key == "llvm")


def _spills(asm: str, reg: str) -> int:
    """Vector stores to and loads from the stack."""
    return len(re.findall(rf"\bvmov\w+\s+%{reg}\d+, -?\w*\(%rsp\)", asm)) + \
        len(re.findall(rf"\bvmov\w+\s+-?\w*\(%rsp\), %{reg}\d+", asm))


@pytest.mark.parametrize("cpu,reg,fmas", [("haswell", "ymm", 4 * 2 * 4),
                                          ("skylake-avx512", "zmm", 14 * 2 * 4)])
def test_3x3_block_fits_the_registers(cpu, reg, fmas):
    # 64 -> 64 channels at 28x28: blocks of 2 vectors (16 / 32 channels), input channels
    # unrolled by 4 (INPUT_UNROLL): FMAs = pixels x 2 x 4 in the unrolled inner loop
    asm = _conv_asm(f"{X86} -mcpu={cpu}", 64, 64, 28, 3)
    assert _spills(asm, reg) == 0
    assert len(re.findall(rf"\bvfmadd\w+\s+.*%{reg}", asm)) == fmas


def test_avx2_pointwise_block_fits_the_registers():
    asm = _conv_asm(f"{X86} -mcpu=haswell", 128, 128, 14, 1)
    assert _spills(asm, "ymm") == 0


@pytest.mark.parametrize("size,k,pixels", [(7, 1, 5), (14, 1, 6), (7, 3, 5), (14, 3, 6)])
def test_avx2_blocks_cross_rows(size, k, pixels):
    # Rows of 7 and 14 pixels: the conv blocks its flattened plane, 49 pixels as 10 blocks of
    # 5, 196 as 33 of 6 (rows: 4 + 4 - 1 and 5 + 5 + 5 - 1): pixels x 2 x 4 FMAs in the
    # inner loop, one broadcast load per input pixel (a 1x1's at constant offsets from one
    # base: no division in its addresses), no spills.
    asm = _conv_asm(f"{X86} -mcpu=haswell", 128, 128, size, k)
    assert _spills(asm, "ymm") == 0
    assert len(re.findall(r"\bvfmadd\w+\s+.*%ymm", asm)) == pixels * 2 * 4
    if k == 1:
        assert len(re.findall(r"\bvbroadcastss\s+-?\d*\(%\w+,%\w+\)", asm)) == pixels * 4



def _parallel_bodies(asm: str, kernel: str) -> dict[str, str]:
    """The assembly of each outlined parallel body of ``kernel`` (``<kernel>_parallel<k>:``
    up to the next such label)."""
    parts = re.split(rf"^({kernel}\w*_parallel\d+):$", asm, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("cpu,reg,tile,pixels", [("haswell", "ymm", 2, 4),
                                                 ("haswell", "ymm", 4, 5),
                                                 ("skylake-avx512", "zmm", 2, 7),
                                                 ("skylake-avx512", "zmm", 4, 7)])
def test_winograd_gemm_block_fits_the_registers(direct_convs, cpu, reg, tile, pixels):
    # A Winograd conv (64 -> 64 at 28x28, decision 050): its GEMM nest is register-blocked as
    # a 1x1 conv over the tiles (196 of F(2x2): 7 or, capped at 6 on AVX2, shifted 4; 49 of
    # F(4x4): 7, AVX2 5): pixels x 2 x 4 FMAs in its unrolled inner loop, none spilled.
    direct_convs.setattr(winograd, "WINOGRAD", True)
    direct_convs.setattr(winograd, "TILE", tile)
    asm = _conv_asm(f"{X86} -mcpu={cpu}", 64, 64, 28, 3)
    bodies = _parallel_bodies(asm, "fused_nn_conv2d_winograd_NCHWc")
    fmas = {name: len(re.findall(rf"\bvfmadd\w+\s+.*%{reg}", body))
            for name, body in bodies.items()}
    gemm = [name for name, n in fmas.items() if n == pixels * 2 * 4]
    assert len(gemm) == 1, fmas
    assert _spills(bodies[gemm[0]], reg) == 0
