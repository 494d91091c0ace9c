"""Converters of ONNX DFT and STFT as matrix products with constant cosine and sine matrices.

The signal axis is moved last and multiplied by [n, m] matrices (n input samples, m output
bins): forward ``Y[k] = sum_j x[j] e^(-2 pi i jk / L)``, inverse ``e^(+...) / L``, with L the
``dft_length`` (zero rows past L truncate, missing rows zero-pad). ``onesided`` keeps bins
0..L/2 of a real input's transform; with ``inverse`` it reads those bins and, by Hermitian
symmetry, returns the real signal (irfft). Formulas: the ONNX DFT spec.
"""

from __future__ import annotations

import numpy as np

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Constant, Expr
from kiln.relay.op.common import FLOAT_DTYPES


def _take_last(ctx: ConvertContext, x: Expr, index: int) -> Expr:
    shape = x.checked_type.shape
    part = ctx.call("strided_slice", [x], begin=(0,) * (len(shape) - 1) + (index,),
                    end=shape[:-1] + (index + 1,), strides=(1,) * len(shape))
    return ctx.reshape(part, shape[:-1])


def _matrices(n: int, length: int, inverse: bool, onesided: bool) -> tuple:
    """(a, b, c, d) with re' = re @ a + im @ b, im' = re @ c + im @ d ([n, m] each; None for
    a zero matrix or an absent imaginary output)."""
    j = np.arange(n)[:, None]
    if inverse and onesided:  # irfft: n bins of a length-L real signal
        k = j
        t = np.arange(length)[None, :]
        w = np.where((k == 0) | (2 * k == length), 1.0, 2.0)
        ang = 2 * np.pi * k * t / length
        return w * np.cos(ang) / length, -w * np.sin(ang) / length, None, None
    m = length // 2 + 1 if onesided else length
    k = np.arange(m)[None, :]
    ang = 2 * np.pi * j * k / length
    keep = (j < length).astype(np.float64)  # samples past dft_length are dropped
    cos, sin = np.cos(ang) * keep, np.sin(ang) * keep
    if inverse:
        return cos / length, -sin / length, sin / length, cos / length
    return cos, sin, -sin, cos


@onnx_op("DFT", since=17)
def dft(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    shape = x.checked_type.shape
    dtype = x.checked_type.dtype
    if dtype not in FLOAT_DTYPES or shape[-1] not in (1, 2):
        raise ctx.unsupported(f"input {shape} {dtype} is neither real [..., 1] nor complex "
                              f"[..., 2] floats")
    ndim = len(shape)
    if ctx.opset >= 20:
        axis = ctx.const_ints(2, "DFT axis")[0] if ctx.optional_input(2) is not None else -2
    else:
        axis = int(ctx.attr("axis", 1))
    if not -ndim <= axis < ndim - 1 or axis % ndim in (0, ndim - 1):
        raise ctx.unsupported(f"axis {axis} for input shape {shape}")
    axis %= ndim
    n = shape[axis]
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    if ctx.optional_input(1) is not None:
        (length,) = ctx.const_ints(1, "DFT dft_length")
    else:
        length = 2 * (n - 1) if inverse and onesided else n
    if onesided and not inverse and shape[-1] != 1:
        raise ctx.unsupported("onesided on a complex input")
    return _transform(ctx, x, axis, length, inverse, onesided)


def _transform(ctx: ConvertContext, x: Expr, axis: int, length: int, inverse: bool,
               onesided: bool) -> Expr:
    """The DFT of ``x`` ([..., 1 | 2] real or complex) along ``axis``."""
    shape = x.checked_type.shape
    dtype = x.checked_type.dtype
    ndim = len(shape)
    n = shape[axis]
    # the signal axis last: [..., n] per part
    perm = tuple(d for d in range(ndim - 1) if d != axis) + (axis,)
    parts = [_take_last(ctx, x, k) for k in range(shape[-1])]
    parts = [ctx.call("transpose", [p], axes=perm) for p in parts]
    a, b, c, d = _matrices(n, length, inverse, onesided)

    def mm(v: Expr, mat) -> Expr:
        return ctx.call("nn.matmul", [v, Constant(np.asarray(mat, dtype=dtype))])

    def combine(terms: list[Expr]) -> Expr:
        out = terms[0]
        for t in terms[1:]:
            out = ctx.call("add", [out, t])
        return out

    re, im = parts[0], parts[1] if len(parts) == 2 else None
    outs = [combine([mm(re, a)] + ([mm(im, b)] if im is not None else []))]
    if c is not None:
        outs.append(combine([mm(re, c)] + ([mm(im, d)] if im is not None else [])))
    inv = tuple(np.argsort(perm))
    outs = [ctx.call("transpose", [o], axes=inv) for o in outs]
    oshape = outs[0].checked_type.shape
    lifted = [ctx.reshape(o, oshape + (1,)) for o in outs]
    return lifted[0] if len(lifted) == 1 else ctx.call("concatenate", lifted, axis=ndim - 1)


@onnx_op("STFT", since=17)
def stft(ctx: ConvertContext) -> Expr:
    """Frames of ``frame_length`` samples every ``frame_step`` (a ``take`` with a constant index
    matrix), times the window, then the DFT of each frame: [batch, frames, bins, 2]."""
    signal = ctx.input(0)
    shape = signal.checked_type.shape
    dtype = signal.checked_type.dtype
    if len(shape) != 3 or shape[-1] not in (1, 2) or dtype not in FLOAT_DTYPES:
        raise ctx.unsupported(f"signal {shape} {dtype} is not [batch, length, 1 | 2] floats")
    (step,) = ctx.const_ints(1, "STFT frame_step")
    window = ctx.optional_input(2)
    if ctx.optional_input(3) is not None:
        (frame,) = ctx.const_ints(3, "STFT frame_length")
    elif window is not None:
        frame = window.checked_type.shape[0]
    else:
        raise ctx.unsupported("neither window nor frame_length")
    onesided = bool(ctx.attr("onesided", 1))
    if onesided and shape[-1] != 1:
        raise ctx.unsupported("onesided on a complex signal")
    count = (shape[1] - frame) // step + 1
    if step <= 0 or frame <= 0 or count <= 0:
        raise ctx.unsupported(f"frame_step {step}, frame_length {frame} for {shape[1]} samples")
    index = np.arange(count)[:, None] * step + np.arange(frame)[None, :]
    frames = ctx.call("take", [signal, Constant(index.astype(np.int64))], axis=1)
    if window is not None:
        frames = ctx.call("multiply", [frames, ctx.reshape(window, (1, 1, frame, 1))])
    return _transform(ctx, frames, 2, frame, False, onesided)
