"""The conv register block follows the target's vector register count (docs/decisions/003):
16 registers (AVX2, SSE) take blocks of at most 6 pixels × 2 vectors, the last block of a row
shifted back; 32 (AVX-512, NEON, RVV) keep REG_BLOCK / POINTWISE_BLOCK."""

from __future__ import annotations

import pytest

from kiln.schedules.conv_blocks import (
    POINTWISE_BLOCK,
    REG_BLOCK,
    _row_block,
    _shifted_row_block,
    max_block_pixels,
)
from kiln.target import Target

X86 = "llvm -mtriple=x86_64-linux-gnu"


@pytest.mark.parametrize("spec,registers,pixels", [
    (f"{X86} -mcpu=skylake-avx512", 32, None),
    (f"{X86} -mcpu=x86-64-v4", 32, None),
    (f"{X86} -mcpu=haswell", 16, 6),
    (f"{X86} -mcpu=znver2", 16, 6),
    (f"{X86} -mcpu=skylake-avx512 -mattr=-avx512f", 16, 6),
    (f"{X86} -mcpu=x86-64-v3", 16, 6),
    (X86, 16, 6),  # SSE2: 16 xmm
    ("llvm -mtriple=aarch64-linux-gnu", 32, None),
    ("llvm -mtriple=riscv64-unknown-linux-gnu -mcpu=generic-rv64 -mattr=+v", 32, None),
])
def test_register_count_sets_the_block(spec, registers, pixels):
    target = Target(spec)
    assert target.vector_registers() == registers
    with target:
        assert max_block_pixels() == pixels
        if pixels is not None:
            assert max_block_pixels(4) == 3  # four vectors a pixel: 12 accumulators
    assert max_block_pixels() is None  # no target: unchanged


def test_multi_level_schedules_each_level_with_its_registers():
    portable = Target(f"{X86} -mcpu=portable")
    with portable.level("x86-64-v3"):
        assert max_block_pixels() == 6
    with portable.level("x86-64-v4"):
        assert max_block_pixels() is None


@pytest.mark.parametrize("extent,pixels", [(1, 1), (3, 3), (6, 6), (7, 4), (14, 5), (28, 4),
                                           (56, 4), (112, 4), (10, 5), (12, 6)])
def test_sixteen_registers_shift_the_last_block(extent, pixels):
    assert _shifted_row_block(extent, 6) == pixels


def test_thirty_two_registers_keep_the_measured_blocks():
    assert (REG_BLOCK, POINTWISE_BLOCK) == (14, 8)
    assert _row_block(56) == 14 and _row_block(56, taps=1) == 8
    assert _row_block(7) == 7 and _row_block(14, taps=1) == 7
    assert _row_block(56, most=6) == 4  # symbolic-width fallback: divisors up to the cap


def test_sixteen_registers_pad_one_vector_output_blocks():
    from kiln.relay.transform.alter_op_layout import _padded_outputs

    with Target(f"{X86} -mcpu=haswell"):  # blocks of 8 = one ymm: 1000 classes as 1008
        assert _padded_outputs(1000, 16, 8) == 1008
        assert _padded_outputs(24, 16, 8) == 24  # a third more work: not padded
    with Target(f"{X86} -mcpu=skylake-avx512"):  # unchanged: only blocks under half a block
        assert _padded_outputs(1000, 32, 8) == 1024
        assert _padded_outputs(528, 32, 16) == 528


def test_narrow_output_blocks_pad_to_one_vector():
    """A float conv whose exact channel block is under half a vector pads its outputs to whole
    vectors when the wider vectors pay twice for the zero filters (decision 059): a detection
    head's 36 outputs ran in 4-float blocks on AVX-512 (2.5x onnxruntime's time)."""
    from kiln.relay.transform.alter_op_layout import _vector_padded_outputs

    with Target(f"{X86} -mcpu=skylake-avx512"):  # 16 lanes
        assert _vector_padded_outputs(36, 4) == (48, 16)
        assert _vector_padded_outputs(18, 2) == (32, 16)
        assert _vector_padded_outputs(3, 1) == (16, 16)
        assert _vector_padded_outputs(24, 8) == (24, 8)  # half a vector: kept
        assert _vector_padded_outputs(1, 1) == (1, 1)  # 16x the work: kept
    with Target(f"{X86} -mcpu=haswell"):  # 8 lanes
        assert _vector_padded_outputs(36, 4) == (36, 4)
        assert _vector_padded_outputs(18, 2) == (24, 8)
