"""The integer ops' formats (docs/decisions/021): quad packing of int8 weights into int32
words, the depthwise tap pairs, the ``dot_u8i8x4`` and ``dot_i16x2`` loop intrinsics'
definitions, and the int8 dot strategy per target."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.relay.op.integer import (
    compensation,
    pack_quads,
    pack_tap_pairs,
    unpack_quads,
    unpack_tap_pairs,
)
from kiln.target import Target
from kiln.tir import intrin_int8 as loop_int8

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("shape,axis", [((2, 3, 3, 3, 16, 8), 4), ((5, 64, 16), 1)])
def test_quads_round_trip_and_byte_order(shape, axis):
    w = RNG.integers(-128, 128, shape).astype(np.int8)
    words = pack_quads(w, axis)
    assert words.dtype == np.int32 and words.shape[axis] == shape[axis] // 4
    np.testing.assert_array_equal(unpack_quads(words, axis), w)
    # byte j of word q is the weight at 4q + j (little-endian bytes of the int32)
    first = np.moveaxis(w, axis, -1)[(0,) * (w.ndim - 1)][:4]
    word = int(np.moveaxis(words, axis, -1)[(0,) * (w.ndim - 1)][0])
    assert [((word >> (8 * j)) & 255) for j in range(4)] == list(first.view(np.uint8))


def test_dot_u8i8x4_value():
    for _ in range(200):
        a, b = (int(v) for v in RNG.integers(-2**31, 2**31, 2))
        ua = np.array([a], np.int32).view(np.uint8).astype(np.int64)
        sb = np.array([b], np.int32).view(np.int8).astype(np.int64)
        assert loop_int8.dot_u8i8x4_value(a, b) == int(ua @ sb)
    assert loop_int8.dot_u8i8x4_value(-1, 0x80808080 - 2**32) == 4 * 255 * -128


@pytest.mark.parametrize("kernel", [(3, 3), (2, 2), (1, 1), (5, 5)])
def test_tap_pairs_round_trip_and_halves(kernel):
    kh, kw = kernel
    w = RNG.integers(-128, 128, (3, 1, kh, kw, 1, 8)).astype(np.int8)
    w[0, 0, 0, 0, 0, :2] = [-128, 127]
    words = pack_tap_pairs(w)
    pairs = (kh * kw + 1) // 2
    assert words.dtype == np.int32 and words.shape == (3, 1, pairs, 1, 1, 8)
    np.testing.assert_array_equal(unpack_tap_pairs(words, kernel), w)
    # the little-endian int16 halves of word p are taps 2p and 2p + 1 (0 past the window)
    halves = words.view(np.int16).reshape(3, pairs, 8, 2)
    taps = np.concatenate([w.reshape(3, kh * kw, 8), np.zeros((3, 1, 8), np.int8)], axis=1)
    np.testing.assert_array_equal(halves[..., 0], taps[:, 0:2 * pairs:2])
    np.testing.assert_array_equal(halves[..., 1], taps[:, 1:2 * pairs + 1:2])


def test_dot_i16x2_value():
    for _ in range(200):
        a0, a1, b0, b1 = (int(v) for v in RNG.integers(-2**15, 2**15, 4))
        assert loop_int8.dot_i16x2_value(a0, a1, b0, b1) == a0 * b0 + a1 * b1
    # the one sum past int32 wraps, as vpmaddwd's does
    assert loop_int8.dot_i16x2_value(-2**15, -2**15, -2**15, -2**15) == -2**31


def test_compensation_is_zero_point_times_weight_sum():
    w = RNG.integers(-128, 128, (6, 4, 3, 3)).astype(np.int8)
    sums = w.reshape(6, -1).astype(np.int64).sum(1)
    np.testing.assert_array_equal(compensation(w, 3, "uint8"), 3 * sums)
    np.testing.assert_array_equal(compensation(w, -3, "int8"), 125 * sums)


@pytest.mark.parametrize("spec,kind", [
    ("llvm -mcpu=haswell", "avx2"), ("llvm -mcpu=znver3", "avx2"),
    ("llvm -mcpu=skylake-avx512", "avx512bw"), ("llvm -mcpu=icelake-server", "vnni512"),
    ("llvm -mcpu=alderlake", "vnni256"), ("llvm -mcpu=icelake-server -mattr=-avx512vnni",
                                          "avx512bw"),
    ("llvm -mtriple=aarch64-linux-gnu", ""), ("c -mcpu=native", ""), ("llvm", "")])
def test_int8_dot_strategy(spec, kind):
    assert Target(spec).int8_dot() == kind
