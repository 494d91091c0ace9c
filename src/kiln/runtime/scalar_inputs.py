"""A rank-0 input takes a one-element tensor of any rank, as onnxruntime's inputs do.

ONNX writes a scalar input as shape ``[]`` (an exported sample rate, a step count).
onnxruntime does not check the rank of an input declared so: it reads ``[]`` as "shape not
given" and runs the model on what it is fed (its session's ``ValidateInputs`` checks the rank
only of a declared shape with dims: ``onnxruntime/core/session/inference_session.cc``), so
callers pass such a scalar as ``np.array([16000])``
and models run. Kiln compiles the input as the scalar it declares; the executors take a
one-element tensor of any rank for it, as a view of shape ``()`` (no copy), and refuse one of
more or fewer elements with a ShapeError naming the input. Where onnxruntime keeps the fed
rank (an output that is the input itself, a broadcast), Kiln's shapes are those of the
scalar (docs/decisions/052).
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.runtime.ndarray import NDArray


def as_declared_scalar(value: np.ndarray | NDArray, rank: int, what: str
                       ) -> np.ndarray | NDArray:
    """``value`` for an input of ``rank`` dims: unchanged unless ``rank`` is 0 and ``value``
    has dims, then viewed with shape ``()``.

    Raises
    ------
    ShapeError
        A rank-0 input (``what`` names it) given a tensor of more or fewer than one element.
    """
    if rank or not value.ndim:
        return value
    if value.size != 1:
        raise ShapeError(f"{what}: expected a scalar (shape (), or one element of any rank), "
                         f"got shape {tuple(value.shape)}")
    if isinstance(value, NDArray):
        return NDArray(value._arr.reshape(()), value.device, _owner=value)
    return value.reshape(())
