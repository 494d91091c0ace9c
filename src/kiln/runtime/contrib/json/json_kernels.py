"""The kernels of the ``kiln_json`` runtime: numpy implementations of the ops its codegen
offloads, in a registry a vendor extends or replaces (:func:`register_json_kernel`).

A kernel is ``kernel(inputs: list[np.ndarray], attrs: dict, out: np.ndarray) -> None``: it
writes its result into ``out`` (shape and dtype from the JSON node). ``attrs`` are the graph op's
attributes as JSON gives them back (lists for tuples). Convolution is im2col + one matrix
product per group (Chellapilla et al. 2006; numpy's BLAS does the product); pooling reads the
padded input through a strided window view. Semantics are those of Kiln's graph ops
(``kiln.relay.op``, the ONNX operators as onnxruntime computes them).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from kiln.errors import KilnError

Kernel = Callable[[list[np.ndarray], dict, np.ndarray], None]
_KERNELS: dict[str, Kernel] = {}


def register_json_kernel(name: str, kernel: Kernel | None = None, override: bool = False):
    """Register the ``kiln_json`` kernel for JSON node ``name`` (a graph op such as
    ``"nn.conv2d"`` or a composite such as ``"kiln_json.conv2d_bias_relu"``); without
    ``kernel``, a decorator.

    Raises
    ------
    KilnError
        ``name`` has a kernel already and ``override`` is False.
    """

    def do(fn: Kernel) -> Kernel:
        if name in _KERNELS and not override:
            raise KilnError(f"kiln_json: a kernel for {name!r} is already registered")
        _KERNELS[name] = fn
        return fn

    return do(kernel) if kernel is not None else do


def get_json_kernel(name: str) -> Kernel | None:
    """The kernel registered for ``name``, or None."""
    return _KERNELS.get(name)


def list_json_kernels() -> list[str]:
    """Names with a registered kernel, sorted."""
    return sorted(_KERNELS)


# ------------------------------------------------------------------------------ helpers
def _windows(x: np.ndarray, out_hw, kernel, strides, dilation) -> np.ndarray:
    """Read-only view ``[N, C, OH, OW, KH, KW]`` of the windows of (padded) NCHW ``x``."""
    n, c = x.shape[:2]
    s = x.strides
    return as_strided(x, (n, c, out_hw[0], out_hw[1], kernel[0], kernel[1]),
                      (s[0], s[1], s[2] * strides[0], s[3] * strides[1], s[2] * dilation[0],
                       s[3] * dilation[1]), writeable=False)


def _pad(x: np.ndarray, top: int, left: int, bottom: int, right: int, value) -> np.ndarray:
    if not (top or left or bottom or right):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def conv2d(x: np.ndarray, w: np.ndarray, attrs: dict, out: np.ndarray) -> None:
    """``out[N, O, OH, OW] = conv2d(x[N, C, H, W], w[O, C/g, KH, KW])`` by im2col + matmul."""
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    g = int(attrs["groups"])
    oh, ow = out.shape[2:]
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    wmat = w.reshape(g, o // g, cg * kh * kw)
    if kh == kw == 1 and sh == sw == 1 and not (pt or pl or pb or pr):
        cols = x.reshape(n, g, cg, oh * ow)  # a 1x1 convolution is a matrix product as is
    else:
        win = _windows(_pad(x, pt, pl, pb, pr, 0), (oh, ow), (kh, kw), (sh, sw), (dh, dw))
        cols = win.reshape(n, g, cg, oh, ow, kh, kw).transpose(0, 1, 2, 5, 6, 3, 4)
        cols = cols.reshape(n, g, cg * kh * kw, oh * ow)
    np.matmul(wmat, cols, out=out.reshape(n, g, o // g, oh * ow))


def _epilogue(out: np.ndarray, bias: np.ndarray | None, activation: str) -> None:
    if bias is not None:
        out += bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    if activation == "relu":
        np.maximum(out, 0, out=out)
    elif activation:
        raise KilnError(f"kiln_json: unknown activation {activation!r}")


def _max_pool(x: np.ndarray, attrs: dict, out: np.ndarray) -> None:
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    h, w = x.shape[2:]
    oh, ow = out.shape[2:]
    # ceil_mode windows may run past the padding: extend it with -inf as well
    eb = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - (h + pt + pb))
    er = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - (w + pl + pr))
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    win = _windows(_pad(x, pt, pl, pb + eb, pr + er, lowest), (oh, ow), (kh, kw), (sh, sw),
                   (dh, dw))
    np.max(win, axis=(4, 5), out=out)


def _bias_add(ins: list[np.ndarray], attrs: dict, out: np.ndarray) -> None:
    x, b = ins
    axis = int(attrs["axis"]) % x.ndim
    np.add(x, b.reshape((-1,) + (1,) * (x.ndim - axis - 1)), out=out)


def _composite_conv(ins: list[np.ndarray], attrs: dict, out: np.ndarray) -> None:
    conv2d(ins[0], ins[1], attrs, out)
    _epilogue(out, ins[2] if attrs.get("bias") else None, attrs.get("activation", ""))


_BUILTIN: dict[str, Kernel] = {
    "nn.conv2d": lambda ins, a, out: conv2d(ins[0], ins[1], a, out),
    "nn.dense": lambda ins, a, out: np.matmul(ins[0], ins[1].T, out=out),
    "nn.matmul": lambda ins, a, out: np.matmul(ins[0], ins[1], out=out),
    "nn.bias_add": _bias_add,
    "add": lambda ins, a, out: np.add(ins[0], ins[1], out=out),
    "multiply": lambda ins, a, out: np.multiply(ins[0], ins[1], out=out),
    "nn.relu": lambda ins, a, out: np.maximum(ins[0], 0, out=out),
    "clip": lambda ins, a, out: np.clip(ins[0], a["a_min"], a["a_max"], out=out),
    "nn.max_pool2d": lambda ins, a, out: _max_pool(ins[0], a, out),
    "nn.global_avg_pool2d": lambda ins, a, out: np.mean(ins[0], axis=(2, 3), keepdims=True,
                                                        out=out),
    "concatenate": lambda ins, a, out: np.concatenate(ins, axis=int(a["axis"]), out=out),
    "reshape": lambda ins, a, out: np.copyto(out, ins[0].reshape(out.shape)),
}
for _name, _kernel in _BUILTIN.items():
    register_json_kernel(_name, _kernel)
for _name in ("conv2d", "conv2d_bias", "conv2d_relu", "conv2d_bias_relu"):
    register_json_kernel(f"kiln_json.{_name}", _composite_conv)
#: the kernels Kiln itself provides (before any vendor registers more); the native runtime's
#: rt_json_kernels.c has the same names (tests/unit/native/test_c_vocabulary.py checks both ways)
BUILTIN_KERNELS: tuple[str, ...] = tuple(list_json_kernels())

__all__ = ["BUILTIN_KERNELS", "conv2d", "get_json_kernel", "list_json_kernels",
           "register_json_kernel"]
