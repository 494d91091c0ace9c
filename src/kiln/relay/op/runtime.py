"""Ops the VM executor runs itself, never compiled into kernels (``OpDef.runtime``).

- ``match_cast``: the same tensor with a refined shape (Relax's ``R.match_cast``): dims the
  caller knows to hold at run time replace symbolic ones, e.g. inside the branch of an ``If``
  whose condition is ``n == 1``, a ``[B, C, n]`` value is ``[B, C, 1]``. The VM makes it a view
  (``vm.builtin.reshape``, which checks the byte size at run time).
- ``trap``: a value that cannot exist (a branch that does not type-check at the model's
  symbolic shapes); running it raises the error it carries (``message``), as onnxruntime
  would fail on taking that branch.
- ``kv_append``: ``concatenate([past, new], axis=0)`` of a key/value cache whose past is a
  graph input (docs/decisions/019-kv-cache.md): past ``[P, ...]``, new ``[S, ...]`` with equal
  trailing dims and dtype give ``[P + S, ...]``. The VM appends ``new`` in place behind a past
  that it returned from an earlier call (``vm.builtin.kv_append``), else copies both.
"""

from __future__ import annotations

import numpy as np

from kiln import arith
from kiln.errors import KilnError, ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity
from kiln.relay.op_registry import OpPattern, register_op


def _match_cast_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    shape = tuple(attrs["shape"])
    if len(shape) != x.ndim:
        raise ShapeError(f"match_cast to rank {len(shape)} of a rank-{x.ndim} value")
    for have, want in zip(x.shape, shape):
        if have != want and arith.is_static(have) and arith.is_static(want):
            raise ShapeError(f"match_cast of {arith.shape_str(x.shape)} to "
                             f"{arith.shape_str(shape)}: dims {have} and {want} differ")
    return TensorType(shape, x.dtype)


def _match_cast_ref(x: np.ndarray, shape) -> np.ndarray:
    if tuple(x.shape) != tuple(shape):
        raise ShapeError(f"match_cast: value of shape {list(x.shape)} is not {list(shape)}")
    return x


def _trap_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 0)
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


def _trap_ref(message: str, shape, dtype) -> np.ndarray:
    raise KilnError(message)


def _kv_append_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    past, new = arg_types
    if past.dtype != new.dtype:
        raise ShapeError(f"kv_append of a {past.dtype} past and a {new.dtype} new value")
    if past.ndim < 1 or past.ndim != new.ndim or any(
            a != b for a, b in zip(past.shape[1:], new.shape[1:])):
        raise ShapeError(f"kv_append of {arith.shape_str(past.shape)} and "
                         f"{arith.shape_str(new.shape)}: the rows differ")
    return TensorType((arith.add(past.shape[0], new.shape[0]), *past.shape[1:]), past.dtype)


def _kv_append_ref(past: np.ndarray, new: np.ndarray) -> np.ndarray:
    return np.concatenate([past, new], axis=0)


register_op("match_cast", _match_cast_infer, OpPattern.OPAQUE, _match_cast_ref, runtime=True)
register_op("trap", _trap_infer, OpPattern.OPAQUE, _trap_ref, runtime=True)
register_op("kv_append", _kv_append_infer, OpPattern.OPAQUE, _kv_append_ref, runtime=True)
