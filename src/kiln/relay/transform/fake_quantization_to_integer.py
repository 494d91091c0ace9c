"""FakeQuantizationToInteger: QDQ groups around convolutions and dense ops become integer
kernels with a requantizing epilogue (TVM: relay.transform.FakeQuantizationToInteger;
docs/decisions/021).

A group, as onnxruntime's ``quantize_static`` writes it (QDQ format, U8S8 or S8S8)::

    qnn.quantize(act(bias(op(qnn.dequantize(xq, sx, zx), qnn.dequantize(wq, sw, 0)))), sy, zy)

- ``op``: ``nn.conv2d`` (any groups: depthwise and grouped too) or ``nn.dense`` (Gemm;
  MatMul's weight arrives transposed, ``transpose(qnn.dequantize(wq[K, N], sw; axis 1))``);
- ``xq`` uint8 or int8, ``sx``, ``zx``, ``sy``, ``zy`` per-tensor constants; ``wq`` a constant
  int8 weight with zero point 0, ``sw`` per tensor or per output channel;
- ``bias`` optional: ``nn.bias_add`` (or ``add`` for a dense) of ``qnn.dequantize(bq, sb, 0)``
  with ``bq`` a constant int32 vector and ``sb == sx · sw`` (float32) — the tool's quantized
  bias, so the integer sum takes it exactly;
- ``act`` optional: ``nn.relu`` or ``clip``.

becomes ::

    act'(qnn.quantize(float(qnn.op(xq, wq; zx) + bq) · M, 1, zy))

with ``M = (sx · sw) / sy`` in float32 (per output channel for per-channel weights) — onnxruntime's
QLinearConv requantization (``MlasRequantizeOutput``: multiply, round half to even, add the
zero point, saturate; the frontend's QLinearConv converter writes the same) — and ``act'`` the
activation on the quantized value: ``max(q, zy)`` for ReLU and ``min(max(q, Q(lo)), Q(hi))``
for a clip, exact since quantization is monotonic and ``Q(0) = zy``. The integer op's
``qnn.conv2d`` / ``qnn.dense`` (kiln/relay/op/integer.py) computes ``Σ (x - zx) · w`` exactly in
int32 with int8 weights; AlterOpLayout blocks it for the int8 kernels. int8 activations are
exact whatever the number of consumers of ``xq`` (nothing is rewritten upstream of the group).

QLinearConv, ConvInteger, QLinearMatMul and MatMulInteger (operator format: the frontend's
``nn.conv2d`` / ``nn.dense`` over operands widened to int32, zero points subtracted) become
``qnn.conv2d`` / ``qnn.dense`` as well when the weight is constant and, less its zero point,
fits in int8, and the input zero point is a per-tensor constant — or, for the matrix products,
a run-time scalar (DynamicQuantizeLinear's, ``quantize_dynamic``'s models): its term
``zx · colsum(w)`` is subtracted after the sum, ``colsum`` a compile-time constant. A matrix
product's weight less its zero point may span any 256 values (uint8 weights, U8U8): it is an
int8 weight plus a constant ``d``, whose term ``d · Σ_k (x - zx)`` is a row sum of the data.

Groups that do not match (weights with a zero point, a bias in float or at another scale)
stay as they are: float ops between the quantization ops
(docs/decisions/011). Run after BindParams (weights are constants) and before FoldConstant
(which would fold the weight's DequantizeLinear into a float constant).
"""

from __future__ import annotations

import numpy as np

from kiln.relay.graph import Call, Constant, Expr, Function, rewrite, same_call
from kiln.relay.interpreter import evaluate_call
from kiln.relay.op.integer import DATA_DTYPES

name = "FakeQuantizationToInteger"

_PER_TENSOR = {"axis": 0, "block_size": 0}


def fake_quantization_to_integer(func: Function) -> Function:
    """``func`` with its QDQ convolution and dense groups computed in integers (module doc)."""

    def visit(call: Call, args: list[Expr]) -> Expr:
        new = None
        if call.op.name == "qnn.quantize":
            new = _integer_group(call, args)
        elif call.op.name in ("nn.conv2d", "nn.dense"):
            new = _widened(call, args)
        return same_call(call, args) if new is None else new

    return rewrite(func, visit)


fake_quantization_to_integer.name = name  # type: ignore[attr-defined]


def _const(expr: Expr) -> np.ndarray | None:
    """The value of ``expr`` if it is a constant, or a call tree over constants (a reshaped
    scale), else None."""
    if isinstance(expr, Constant):
        return None if expr.is_symbolic else expr.data
    if not isinstance(expr, Call) or not expr.checked_type.is_static:
        return None
    values = []
    for a in expr.args:  # stop at the first non-constant: no walk of the whole graph above
        value = _const(a)
        if value is None:
            return None
        values.append(value)
    return evaluate_call(expr, values)


def _call(expr: Expr, *ops: str) -> Call | None:
    return expr if isinstance(expr, Call) and expr.op.name in ops else None


def _per_tensor(call: Call) -> tuple[float, int] | None:
    """(scale, zero point) of a quantize / dequantize with per-tensor constant parameters."""
    scale, zp = _const(call.args[1]), _const(call.args[2])
    if scale is None or zp is None or scale.size != 1 or zp.size != 1 or call.attrs["block_size"]:
        return None
    if scale.dtype != np.float32:
        return None
    return scale.reshape(()), int(zp.reshape(()))


def _weight(expr: Expr, rows_axis_last: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """(int8 weight with output channels on axis 0, float32 scale: rank 0 or ``[O]``) of a
    dequantized constant weight, or None. ``rows_axis_last``: the dense weight of a MatMul,
    ``transpose(qnn.dequantize(w[K, N]))``."""
    if rows_axis_last:
        t = _call(expr, "transpose")
        if t is None or tuple(t.attrs.get("axes", ())) != (1, 0):
            return None
        expr = t.args[0]
    dq = _call(expr, "qnn.dequantize")
    if dq is None or dq.attrs["block_size"]:
        return None
    w, scale, zp = (_const(a) for a in dq.args)
    if w is None or scale is None or zp is None or w.dtype != np.int8 or np.any(zp != 0) or \
            scale.dtype != np.float32:
        return None
    if scale.ndim == 1:
        channel_axis = 1 if rows_axis_last else 0
        if dq.attrs["axis"] != channel_axis:
            return None
    if rows_axis_last:
        w = w.T
    return np.ascontiguousarray(w), scale


def _bias(expr: Expr, bias_scale: np.ndarray, channels: int) -> np.ndarray | None:
    """The int32 ``[O]`` values of a dequantized int32 bias at scale ``bias_scale``."""
    dq = _call(expr, "qnn.dequantize")
    if dq is None:
        return None
    b, scale, zp = (_const(a) for a in dq.args)
    if b is None or scale is None or zp is None or b.dtype != np.int32 or np.any(zp != 0):
        return None
    b = b.reshape(-1)
    if b.size != channels or not np.array_equal(np.broadcast_to(scale, bias_scale.shape).
                                                astype(np.float32), bias_scale):
        return None
    return b


def _integer_group(quantize: Call, args: list[Expr]) -> Expr | None:
    out_params = _per_tensor(quantize)
    if out_params is None:
        return None
    sy, zy = out_params
    out_dtype = quantize.attrs["out_dtype"]
    y = args[0]
    act = _call(y, "nn.relu", "clip")
    if act is not None:
        y = act.args[0]
    bias = None
    if (b := _call(y, "nn.bias_add")) is not None:
        y, bias = b.args
    elif (b := _call(y, "add")) is not None:
        y, bias = b.args if _call(b.args[0], "nn.dense") else b.args[::-1]
    op = _call(y, "nn.conv2d", "nn.dense")
    if op is None:
        return None
    conv = op.op.name == "nn.conv2d"
    if bias is not None and not _bias_axis_ok(b, conv):
        return None
    x_dq = _call(op.args[0], "qnn.dequantize")
    if x_dq is None or x_dq.args[0].checked_type.dtype not in DATA_DTYPES:
        return None
    in_params = _per_tensor(x_dq)
    weight = _weight(op.args[1], rows_axis_last=not conv and _call(op.args[1], "transpose")
                     is not None)
    if in_params is None or weight is None:
        return None
    sx, zx = in_params
    wq, sw = weight
    channels = wq.shape[0]
    bias_scale = np.broadcast_to(np.float32(sx) * sw, (channels,)).astype(np.float32)
    bq = None
    if bias is not None:
        bq = _bias(bias, bias_scale, channels)
        if bq is None:
            return None
    xq = x_dq.args[0]
    if conv:
        attrs = {k: op.attrs[k] for k in ("strides", "padding", "dilation", "groups")}
        acc: Expr = Call("qnn.conv2d", [xq, Constant(wq)], dict(attrs, input_zero_point=zx),
                         op.span)
        channel_shape: tuple[int, ...] = (channels, 1, 1)
    else:
        acc = Call("qnn.dense", [xq, Constant(wq)], {"input_zero_point": zx}, op.span)
        channel_shape = (channels,)
    if bq is not None:
        acc = Call("add", [acc, Constant(bq.reshape(channel_shape))], {}, op.span)
    multiplier = (np.float32(sx) * sw) / np.float32(sy)  # (sx · sw) / sy in float32
    multiplier = multiplier.reshape(channel_shape) if multiplier.ndim else multiplier
    value = Call("multiply", [Call("cast", [acc], {"dtype": "float32"}),
                              Constant(multiplier.astype(np.float32))])
    q: Expr = Call("qnn.quantize", [value, Constant(np.array(1.0, np.float32)),
                                    Constant(np.array(zy, out_dtype))],
                   dict(_PER_TENSOR, out_dtype=out_dtype, unit_scale=True), quantize.span)
    if act is not None:
        q = _quantized_activation(act, q, sy, zy, out_dtype)
    return q


def _widened(op: Call, args: list[Expr]) -> Expr | None:
    """QLinearConv / ConvInteger / QLinearMatMul / MatMulInteger as the frontend writes them
    (docs/decisions/011): an int32 ``nn.conv2d`` (any groups) or ``nn.dense`` of
    ``int32(xq) - zx`` (``zx`` a per-tensor constant, or absent) by a constant whose values
    fit in int8 (``int32(wq) - zw``) → ``qnn.conv2d`` / ``qnn.dense(xq, w; zx)``, the same
    sums.

    A dense's ``zx`` may also be a run-time scalar (DynamicQuantizeLinear's zero point, as
    ``quantize_dynamic`` feeds MatMulInteger), and its data a reshape of ``int32(xq) - zx``
    (MatMul's leading axes folded into rows): ``qnn.dense(reshape(xq), w; 0) - zx · colsum(w)``,
    ``colsum(w)[n] = Σ_k w[n, k]`` an int32 ``[N]`` constant, the subtraction fused into the
    dense kernel's epilogue — the same sums. A dense's weight may also span any 256 values
    (uint8 weights less a zero point): ``_integer_dense``."""
    data, weight = args
    conv = op.op.name == "nn.conv2d"
    if op.checked_type.dtype != "int32":
        return None
    rows = None
    if not conv and (reshape := _call(data, "reshape")) is not None:
        rows, data = reshape.checked_type.shape, reshape.args[0]
    zx: int | Expr = 0
    if (sub := _call(data, "subtract")) is not None:
        zp = _const(sub.args[1])
        if zp is not None and zp.size == 1:
            zx = int(zp.reshape(()))
        elif zp is None and sub.args[1].checked_type.size == 1 and \
                sub.args[1].checked_type.dtype == "int32":
            zx = Call("reshape", [sub.args[1]], {"newshape": ()})  # a run-time scalar
        else:
            return None
        data = sub.args[0]
    cast = _call(data, "cast")
    w = _const(weight)
    if cast is None or cast.args[0].checked_type.dtype not in DATA_DTYPES or w is None:
        return None
    xq = cast.args[0]
    if not conv:
        return _integer_dense(op, xq, w, zx, rows)
    return _integer_conv(op, xq, w, zx)


def _int8_shift(w: np.ndarray) -> int | None:
    """``d`` with ``w - d`` in int8's range (0 when ``w`` is), or None when ``w`` spans more than
    256 values: uint8 weights less their zero point (``quantize_dynamic``'s U8U8 models, e.g.
    -119..136) are int8 weights plus a constant."""
    lo, hi = int(w.min(initial=0)), int(w.max(initial=0))
    if lo >= -128 and hi <= 127:
        return 0
    if hi - lo > 255:
        return None
    return hi - 127 if hi > 127 else lo + 128


def _integer_dense(op: Call, xq: Expr, w: np.ndarray, zx: int | Expr,
                   rows: tuple | None) -> Expr | None:
    """``Σ_k (xq[m, k] - zx) · w[n, k]`` (``_widened``) with ``w = w8 + d`` and ``w8`` int8:
    ``qnn.dense(xq, w8; zx)`` (a run-time ``zx``: ``qnn.dense(xq, w8; 0) - zx · colsum(w8)``)
    plus ``d · (Σ_k xq[m, k] - K · zx)``, that row sum one more pass over the data."""
    d = _int8_shift(w)
    if d is None:
        return None
    if rows is not None:
        xq = Call("reshape", [xq], {"newshape": tuple(rows)}, op.span)
    w8 = (w.astype(np.int64) - d).astype(np.int8)
    if isinstance(zx, int):
        acc = Call("qnn.dense", [xq, Constant(w8)], {"input_zero_point": zx}, op.span)
    else:
        colsum = Constant(w8.astype(np.int64).sum(axis=1).astype(np.int32))
        acc = Call("subtract", [Call("qnn.dense", [xq, Constant(w8)], {"input_zero_point": 0},
                                     op.span), Call("multiply", [zx, colsum])], {}, op.span)
    if d == 0:
        return acc
    k = w.shape[1]
    rowsum = Call("sum", [Call("cast", [xq], {"dtype": "int32"})],
                  {"axis": (1,), "keepdims": True})
    term = Call("multiply", [Call("subtract", [rowsum, _zx_times(zx, k)]), _i32(d)])
    return Call("add", [acc, term], {}, op.span)


def _integer_conv(op: Call, xq: Expr, w: np.ndarray, zx: int | Expr) -> Expr | None:
    """``Σ_valid taps (xq - zx) · w`` (``_widened``: the padding adds nothing) with
    ``w = w8 + d``, ``w8`` int8. With a constant ``zx`` and ``d == 0`` that is
    ``qnn.conv2d(xq, w8; zx)``. Otherwise the data is padded with ``zx`` first (``xp``: then every
    tap is valid) and the convolution has no padding: ``qnn.conv2d(xp, w8; zx)``, or for a
    run-time ``zx`` ``qnn.conv2d(xp, w8; 0) - zx · colsum(w8)`` (a constant per output channel,
    fused into the epilogue), plus ``d · (Σ_taps xp - zx · C · kh · kw)``, the sum over the
    window an int32 convolution with one output channel. ``d != 0`` needs ``groups == 1``."""
    d = _int8_shift(w)
    groups = op.attrs["groups"]
    if d is None or (d != 0 and groups != 1):
        return None
    w8 = (w.astype(np.int64) - d).astype(np.int8)
    attrs = {k: op.attrs[k] for k in ("strides", "padding", "dilation", "groups")}
    known = isinstance(zx, int)
    if known and d == 0:
        return Call("qnn.conv2d", [xq, Constant(w8)], dict(attrs, input_zero_point=zx), op.span)
    xp = _padded_with(xq, attrs["padding"], zx)
    attrs["padding"] = (0, 0, 0, 0)
    acc = Call("qnn.conv2d", [xp, Constant(w8)], dict(attrs, input_zero_point=zx if known else 0),
               op.span)
    if not known:
        colsum = w8.astype(np.int64).sum(axis=(1, 2, 3)).astype(np.int32).reshape(-1, 1, 1)
        acc = Call("subtract", [acc, Call("multiply", [zx, Constant(colsum)])], {}, op.span)
    if d:
        _, c, kh, kw = w.shape
        window = Call("nn.conv2d", [Call("cast", [xp], {"dtype": "int32"}),
                                    Constant(np.ones((1, c, kh, kw), np.int32))],
                      dict(op.attrs, padding=(0, 0, 0, 0), groups=1))
        term = Call("multiply", [Call("subtract", [window, _zx_times(zx, c * kh * kw)]),
                                 _i32(d)])
        acc = Call("add", [acc, term], {}, op.span)
    return acc


def _padded_with(xq: Expr, padding: tuple[int, int, int, int], zx: int | Expr) -> Expr:
    """``xq`` (NCHW) padded in H and W with its zero point: ``nn.pad`` for a constant; for a
    run-time scalar ``where(inside, pad(xq, 0), zx)``, ``inside`` a constant mask for static
    H and W, else padded from a plane of ones."""
    pt, pl, pb, pr = padding
    if not any(padding):
        return xq
    width = ((0, 0), (0, 0), (pt, pb), (pl, pr))
    if isinstance(zx, int):
        return Call("nn.pad", [xq], {"pad_width": width, "pad_value": float(zx),
                                     "pad_mode": "constant"})
    n, _, h, wd = xq.checked_type.shape
    if isinstance(h, int) and isinstance(wd, int):
        inside: Expr = Constant(np.pad(np.ones((1, 1, h, wd), bool), width))
    else:
        plane = Call("strided_slice", [xq], {"begin": (0, 0, 0, 0), "end": (n, 1, h, wd),
                                             "strides": (1, 1, 1, 1)})
        ones = Call("cast", [Call("add", [Call("multiply", [Call("cast", [plane], {
            "dtype": "int32"}), _i32(0)]), _i32(1)])], {"dtype": "bool"})
        inside = Call("nn.pad", [ones], {"pad_width": width, "pad_value": 0.0,
                                         "pad_mode": "constant"})
    zero_padded = Call("nn.pad", [xq], {"pad_width": width, "pad_value": 0.0,
                                        "pad_mode": "constant"})
    fill = Call("cast", [zx], {"dtype": xq.checked_type.dtype})
    return Call("where", [inside, zero_padded, fill])


def _i32(value: int) -> Constant:
    return Constant(np.array(value, np.int32))


def _zx_times(zx: int | Expr, count: int) -> Expr:
    """``zx · count`` in int32: a constant, or a product for a run-time zero point."""
    return _i32(zx * count) if isinstance(zx, int) else Call("multiply", [zx, _i32(count)])


def _bias_axis_ok(bias_call: Call, conv: bool) -> bool:
    if bias_call.op.name == "nn.bias_add":
        return bias_call.attrs["axis"] == 1
    return not conv  # ``add`` of a [N] vector to a dense's [M, N] output


def _quantize_value(v: float, sy: np.ndarray, zy: int, dtype: str) -> np.ndarray:
    """QuantizeLinear of one float32 value (qnn.quantize's formula)."""
    info = np.iinfo(dtype)
    q = np.rint(np.float32(v) / sy) + np.float32(zy)
    return np.array(np.clip(q, info.min, info.max), dtype)


def _quantized_activation(act: Call, q: Expr, sy: np.ndarray, zy: int, dtype: str) -> Expr:
    """ReLU / clip applied after quantization (exact: quantization is monotonic)."""
    lo, hi = (0.0, None) if act.op.name == "nn.relu" else (act.attrs["a_min"],
                                                          act.attrs["a_max"])
    q = Call("maximum", [q, Constant(_quantize_value(lo, sy, zy, dtype))])
    if hi is not None and np.isfinite(hi):
        q = Call("minimum", [q, Constant(_quantize_value(hi, sy, zy, dtype))])
    return q
