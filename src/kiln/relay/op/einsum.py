"""The ``einsum`` graph op: ``equation`` in explicit letter form ("ij,jk->ik"; no ellipsis —
the frontend spells ellipsis dimensions with letters of their own), inputs of one dtype.

A letter's extent is the same in every input that has it, or 1 (broadcast, as ONNX Einsum's
ellipsis dimensions); output letters are the spatial axes, the others are summed over.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import same_dtype
from kiln.relay.op_registry import OpPattern, register_op
from kiln.topi.einsum import letter_extents, parse_einsum


def _einsum_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    terms, out = parse_einsum(attrs["equation"])
    if len(terms) != len(arg_types):
        raise ShapeError(f"equation {attrs['equation']!r} has {len(terms)} operands, got "
                         f"{len(arg_types)}")
    dtype = same_dtype(arg_types)
    extents = letter_extents(terms, [t.shape for t in arg_types])
    if any(c not in extents for c in out) or len(set(out)) != len(out):
        raise ShapeError(f"bad output subscripts in {attrs['equation']!r}")
    return TensorType(tuple(extents[c] for c in out), dtype)


def _einsum_ref(*arrays: np.ndarray, equation: str) -> np.ndarray:
    return np.asarray(np.einsum(equation, *arrays)).astype(arrays[0].dtype, copy=False)


register_op("einsum", _einsum_infer, OpPattern.OUT_ELEMWISE_FUSABLE, _einsum_ref)
