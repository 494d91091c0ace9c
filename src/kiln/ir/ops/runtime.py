"""Ops the VM executor runs itself, never compiled into kernels (``OpDef.runtime``).

- ``match_cast``: the same tensor with a refined shape (Relax's ``R.match_cast``): dims the
  caller knows to hold at run time replace symbolic ones, e.g. inside the branch of an ``If``
  whose condition is ``n == 1``, a ``[B, C, n]`` value is ``[B, C, 1]``. The VM makes it a view
  (``vm.builtin.reshape``, which checks the byte size at run time).
- ``trap``: a value that cannot exist (a branch that does not type-check at the model's
  symbolic shapes); running it raises the error it carries (``message``), as onnxruntime
  would fail on taking that branch.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.ir import arith
from kiln.ir.graph import TensorType
from kiln.ir.op_registry import OpPattern, register_op
from kiln.ir.ops.common import expect_arity


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


register_op("match_cast", _match_cast_infer, OpPattern.OPAQUE, _match_cast_ref, runtime=True)
register_op("trap", _trap_infer, OpPattern.OPAQUE, _trap_ref, runtime=True)
