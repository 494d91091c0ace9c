"""The int8 kernels' loop-IR intrinsics (docs/decisions/021): calls the codegens lower to one
instruction lane where the CPU has it (x86 VNNI ``vpdpbusd``, ``vpmaddwd``, an unaligned
32-bit load) and to exact plain integer code elsewhere, with their values on Python ints (the
interpreter's and the tests' definition)."""

from __future__ import annotations

from kiln.tir import loop as L

#: the 4-byte dot product intrinsic (:func:`dot_u8i8x4`)
DOT_U8I8X4 = "dot_u8i8x4"


def dot_u8i8x4(a: L.PrimExpr, b: L.PrimExpr) -> L.PrimExpr:
    """int32 ``Σ_{j<4} ubyte_j(a) · sbyte_j(b)``: the four bytes of int32 ``a`` read as
    unsigned and of int32 ``b`` as signed (byte ``j`` = bits ``8j .. 8j+7``), multiplied in
    pairs and summed exactly (at most 4 · 255 · 128 in magnitude). One lane of x86 VNNI's
    ``vpdpbusd`` without its accumulator (Intel intrinsics guide, ``_mm512_dpbusd_epi32``);
    emulated exactly elsewhere (AVX2: two ``vpmaddwd`` on the even and odd bytes widened to 16
    bits)."""
    assert a.dtype == b.dtype == "int32", f"dot_u8i8x4 of {a.dtype}, {b.dtype}"
    return L.Call(DOT_U8I8X4, [a, b], "int32")


def dot_u8i8x4_value(a: int, b: int) -> int:
    """:func:`dot_u8i8x4` on Python ints (the interpreter's and the tests' definition)."""
    ua = [(a >> (8 * j)) & 255 for j in range(4)]
    sb = [((b >> (8 * j)) & 255) - (256 if (b >> (8 * j)) & 128 else 0) for j in range(4)]
    return sum(x * y for x, y in zip(ua, sb))


#: the 4-byte dot product with int16-saturated pair sums (:func:`dot_u8i8x4_sat16`)
DOT_U8I8X4_SAT16 = "dot_u8i8x4_sat16"


def dot_u8i8x4_sat16(a: L.PrimExpr, b: L.PrimExpr) -> L.PrimExpr:
    """int32 ``sat16(u0·s0 + u1·s1) + sat16(u2·s2 + u3·s3)``, ``uj = ubyte_j(a)``,
    ``sj = sbyte_j(b)`` as in :func:`dot_u8i8x4`, ``sat16`` clamping to [-32768, 32767]: one
    lane of x86's ``vpmaddubsw`` (u8 × s8 pairs summed into int16 with signed saturation;
    Intel intrinsics guide, ``_mm256_maddubs_epi16``) followed by ``vpmaddwd`` with ones (the
    two int16 summed exactly into int32) — onnxruntime MLAS's AVX2 U8S8 GEMM step
    (``QgemmU8X8KernelAvx2.S``, ``MultiplyAccumulateRowU8S8Avx2``). Equal to
    :func:`dot_u8i8x4` whenever neither pair sum leaves int16 (docs/decisions/049)."""
    assert a.dtype == b.dtype == "int32", f"dot_u8i8x4_sat16 of {a.dtype}, {b.dtype}"
    return L.Call(DOT_U8I8X4_SAT16, [a, b], "int32")


def dot_u8i8x4_sat16_value(a: int, b: int) -> int:
    """:func:`dot_u8i8x4_sat16` on Python ints (the interpreter's and the tests' definition)."""
    ua = [(a >> (8 * j)) & 255 for j in range(4)]
    sb = [((b >> (8 * j)) & 255) - (256 if (b >> (8 * j)) & 128 else 0) for j in range(4)]
    return sum(min(max(ua[p] * sb[p] + ua[p + 1] * sb[p + 1], -32768), 32767) for p in (0, 2))


#: four bytes read as one int32 (:func:`load_u8x4`)
LOAD_U8X4 = "load_u8x4"


def load_u8x4(load: L.PrimExpr) -> L.PrimExpr:
    """int32 of the four bytes of an 8-bit buffer from ``load``'s element on (that element
    in bits 0..7, the next in 8..15, ...: little-endian, as every target Kiln builds for). The
    caller keeps the four in bounds. One unaligned 32-bit load (C: ``memcpy``); how the int8
    kernels pack four activation bytes into a ``dot_u8i8x4`` word (docs/decisions/021)."""
    assert hasattr(load, "indices") and load.dtype in ("int8", "uint8"), \
        f"load_u8x4 of {load!r}"  # a BufferLoad (a te TensorLoad before lowering)
    return L.Call(LOAD_U8X4, [load], "int32")


#: the int16 pair dot product intrinsic (:func:`dot_i16x2`)
DOT_I16X2 = "dot_i16x2"


def dot_i16x2(a0: L.PrimExpr, a1: L.PrimExpr, b0: L.PrimExpr, b1: L.PrimExpr) -> L.PrimExpr:
    """int32 ``a0 · b0 + a1 · b1`` of four int16 values (products and sum in int32, wrapping
    like the instruction: only ``a0 = a1 = b0 = b1 = -32768`` leaves int32). One lane of x86's
    ``vpmaddwd`` when the pairs ``(a0, a1)`` and ``(b0, b1)`` are interleaved (Intel intrinsics
    guide, ``_mm256_madd_epi16``); plain multiply-adds elsewhere. The int8 depthwise kernel
    pairs two taps of one channel with it (docs/decisions/021)."""
    assert all(x.dtype == "int16" for x in (a0, a1, b0, b1)), \
        f"dot_i16x2 of {[x.dtype for x in (a0, a1, b0, b1)]}"
    return L.Call(DOT_I16X2, [a0, a1, b0, b1], "int32")


def dot_i16x2_value(a0: int, a1: int, b0: int, b1: int) -> int:
    """:func:`dot_i16x2` on Python ints (the interpreter's and the tests' definition)."""
    total = (a0 * b0 + a1 * b1) & 0xFFFFFFFF
    return total - (1 << 32) if total & 0x80000000 else total
