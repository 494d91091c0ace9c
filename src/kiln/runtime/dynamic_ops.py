"""ONNX ops whose output shape depends on data, in numpy (decision 016).

These are the executable definitions of Kiln's data-dependent ops: the VM runs them as
builtins (``vm_dynamic_ops``) and the graph IR uses them as the numpy references of its
``dyn.*`` ops (``kiln.relay.op.dynamic``), so compile-time folding and run time agree. Each
follows the ONNX operator spec (onnx/docs/Operators.md) and is checked against
``onnx.reference.ReferenceEvaluator`` and onnxruntime by
tests/backend/runtime/test_vm_data_dependent.py.

Every function takes and returns numpy arrays; a value the spec rejects (a ``k`` larger than
its axis, a reshape that does not fit) raises :class:`~kiln.errors.ShapeError` naming the op.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.errors import ShapeError


def _scalar(v: np.ndarray, op: str, what: str) -> np.ndarray:
    v = np.asarray(v)
    if v.size != 1:
        raise ShapeError(f"{op}: {what} must have one element, got shape {list(v.shape)}")
    return v.reshape(())


def _ints(v: np.ndarray, op: str, what: str) -> list[int]:
    v = np.asarray(v)
    if v.ndim > 1 or v.dtype.kind not in "iu":
        raise ShapeError(f"{op}: {what} must be a 1-D integer tensor, got {v.dtype}"
                         f"{list(v.shape)}")
    return [int(d) for d in v.reshape(-1)]


def nonzero(x: np.ndarray) -> np.ndarray:
    """ONNX NonZero: int64 ``[rank, n]``, the indices of the ``n`` non-zero elements in
    row-major order (a scalar gives ``[0, n]``)."""
    if x.ndim == 0:
        return np.empty((0, int(np.count_nonzero(x))), dtype=np.int64)
    return np.vstack(np.nonzero(x)).astype(np.int64).reshape(x.ndim, -1)


def unique(x: np.ndarray, axis: int | None, sort: bool
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Unique: ``(Y, indices, inverse_indices, counts)``.

    Without ``axis`` the input is flattened and ``Y`` is ``[U]``; with it, ``Y`` is ``x`` with
    that axis cut to the ``U`` unique slices. ``indices`` (``[U]``) are the first occurrences,
    ``inverse_indices`` (``[x.size]`` or ``[x.shape[axis]]``) map each element or slice to its
    entry of ``Y``, ``counts`` (``[U]``) count them; all three int64. ``sort`` False (ONNX's
    ``sorted=0``) keeps the order of first occurrence."""
    flat = x.reshape(-1) if axis is None else x
    y, indices, inverse, counts = np.unique(flat, True, True, True,
                                            axis=None if axis is None else axis)
    inverse = inverse.reshape(-1)
    if not sort:
        order = np.argsort(indices, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        indices, counts, inverse = indices[order], counts[order], rank[inverse]
        y = np.take(flat, indices, axis=0 if axis is None else axis)
    return (y, indices.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64))


def _iou_suppressed(box: np.ndarray, kept: np.ndarray, center: bool, iou: np.ndarray
                    ) -> bool:
    """Whether ``box`` overlaps one of ``kept`` by more than ``iou`` (the ONNX reference's
    arithmetic, in the boxes' dtype: corners in any order, or center/width/height)."""
    if center:
        half_w, half_h = box[2] / 2, box[3] / 2
        x1, x2 = box[0] - half_w, box[0] + half_w
        y1, y2 = box[1] - half_h, box[1] + half_h
        kw, kh = kept[:, 2] / 2, kept[:, 3] / 2
        kx1, kx2 = kept[:, 0] - kw, kept[:, 0] + kw
        ky1, ky2 = kept[:, 1] - kh, kept[:, 1] + kh
    else:
        x1, x2 = min(box[1], box[3]), max(box[1], box[3])
        y1, y2 = min(box[0], box[2]), max(box[0], box[2])
        kx1, kx2 = np.minimum(kept[:, 1], kept[:, 3]), np.maximum(kept[:, 1], kept[:, 3])
        ky1, ky2 = np.minimum(kept[:, 0], kept[:, 2]), np.maximum(kept[:, 0], kept[:, 2])
    ix = np.minimum(x2, kx2) - np.maximum(x1, kx1)
    iy = np.minimum(y2, ky2) - np.maximum(y1, ky1)
    inter = ix * iy
    area, kept_area = (x2 - x1) * (y2 - y1), (kx2 - kx1) * (ky2 - ky1)
    union = area + kept_area - inter
    valid = (ix > 0) & (iy > 0) & (inter > 0) & (area > 0) & (kept_area > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = inter / np.where(valid, union, 1)
    return bool(np.any(valid & (ratio > iou)))


def non_max_suppression(boxes: np.ndarray, scores: np.ndarray,
                        max_output_boxes_per_class: np.ndarray | None = None,
                        iou_threshold: np.ndarray | None = None,
                        score_threshold: np.ndarray | None = None,
                        center_point_box: int = 0) -> np.ndarray:
    """ONNX NonMaxSuppression: int64 ``[n, 3]`` rows ``(batch, class, box)``.

    ``boxes`` ``[B, N, 4]``, ``scores`` ``[B, C, N]``. Per batch and class, boxes are taken in
    decreasing score (ties: lower index first), above ``score_threshold`` when given, skipping
    any whose IoU with an already selected one exceeds ``iou_threshold``, up to
    ``max_output_boxes_per_class`` (absent: 0, no output)."""
    op = "NonMaxSuppression"
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or \
            scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ShapeError(f"{op}: boxes {list(boxes.shape)} and scores {list(scores.shape)} "
                         "must be [B, N, 4] and [B, C, N]")
    limit = 0
    if max_output_boxes_per_class is not None and np.size(max_output_boxes_per_class):
        limit = max(int(_scalar(max_output_boxes_per_class, op, "max_output_boxes_per_class")),
                    0)
    iou = boxes.dtype.type(0)
    if iou_threshold is not None and np.size(iou_threshold):
        iou = _scalar(iou_threshold, op, "iou_threshold")
    has_score = score_threshold is not None and np.size(score_threshold) > 0
    selected: list[tuple[int, int, int]] = []
    for b in range(boxes.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            candidates = np.arange(s.size)
            if has_score:
                candidates = candidates[s > _scalar(score_threshold, op, "score_threshold")]
            # decreasing score, ties by increasing index (the reference's BoxInfo order)
            order = candidates[np.lexsort((candidates, -s[candidates].astype(np.float64)))]
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                if kept and _iou_suppressed(boxes[b, i], boxes[b, kept], bool(center_point_box),
                                            iou):
                    continue
                kept.append(int(i))
                selected.append((b, c, int(i)))
    return np.array(selected, dtype=np.int64).reshape(-1, 3)


def compress(x: np.ndarray, condition: np.ndarray, axis: int | None) -> np.ndarray:
    """ONNX Compress: the slices of ``x`` along ``axis`` (flattened when None) where the 1-D
    ``condition`` is true; a condition shorter than the axis drops the rest."""
    cond = np.asarray(condition).reshape(-1).astype(bool)
    extent = x.size if axis is None else x.shape[axis]
    if cond.size > extent:
        raise ShapeError(f"Compress: a condition of {cond.size} entries for an axis of "
                         f"{extent}")
    return np.compress(cond, x, axis=axis)


def topk(x: np.ndarray, k: np.ndarray | int, axis: int, largest: bool
         ) -> tuple[np.ndarray, np.ndarray]:
    """ONNX TopK: ``(values, int64 indices)``, ``x`` with ``axis`` cut to the ``k`` largest
    (or smallest) entries, sorted; equal values keep the lower index first."""
    kv = int(_scalar(np.asarray(k), "TopK", "k"))
    if not 0 <= kv <= x.shape[axis]:
        raise ShapeError(f"TopK: k = {kv} is outside [0, {x.shape[axis]}] (axis {axis} of "
                         f"{list(x.shape)})")
    position = np.indices(x.shape)[axis]
    if largest:
        position = -position
    order = np.lexsort((position, x), axis=axis)
    if largest:
        order = np.flip(order, axis=axis)
    idx = np.take(order, np.arange(kv), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


def range_(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """ONNX Range: ``max(ceil((limit - start) / delta), 0)`` values ``start + k * delta``, in
    ``start``'s dtype."""
    dtype = np.asarray(start).dtype
    s, lim, d = (_scalar(v, "Range", what).item()
                 for v, what in ((start, "start"), (limit, "limit"), (delta, "delta")))
    if d == 0:
        raise ShapeError("Range: delta is 0")
    count = max(math.ceil((lim - s) / d), 0)
    return np.array([s + k * d for k in range(count)], dtype=dtype).reshape(count)


def reshape_dims(in_shape: tuple[int, ...], shape: np.ndarray, allowzero: bool
                 ) -> tuple[int, ...]:
    """ONNX Reshape's output shape: 0 copies the input's dim (unless ``allowzero``), one -1 is
    inferred from the element count."""
    dims = _ints(shape, "Reshape", "shape")
    out = []
    for k, d in enumerate(dims):
        if d == 0 and not allowzero:
            if k >= len(in_shape):
                raise ShapeError(f"Reshape: shape {dims} copies dim {k} of a rank-"
                                 f"{len(in_shape)} input")
            d = in_shape[k]
        out.append(d)
    size = math.prod(in_shape)
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise ShapeError(f"Reshape: invalid shape {dims}")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or size % known:
            raise ShapeError(f"Reshape: cannot infer -1 in {dims} for {size} elements")
        out[out.index(-1)] = size // known
    if math.prod(out) != size:
        raise ShapeError(f"Reshape: shape {out} does not hold {size} elements of "
                         f"{list(in_shape)}")
    return tuple(out)


def reshape(x: np.ndarray, shape: np.ndarray, allowzero: bool) -> np.ndarray:
    """ONNX Reshape to a shape given as data (:func:`reshape_dims`)."""
    return x.reshape(reshape_dims(x.shape, shape, allowzero))


def expand(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """ONNX Expand: ``x`` broadcast with ``shape`` (both ways, numpy's rule)."""
    dims = _ints(shape, "Expand", "shape")
    try:
        out = np.broadcast_shapes(x.shape, tuple(dims))
    except ValueError:
        raise ShapeError(f"Expand: {list(x.shape)} does not broadcast with {dims}") from None
    return np.ascontiguousarray(np.broadcast_to(x, out))


def constant_of_shape(shape: np.ndarray, value: np.ndarray) -> np.ndarray:
    """ONNX ConstantOfShape: a tensor of ``shape`` filled with the one-element ``value``."""
    dims = _ints(shape, "ConstantOfShape", "shape")
    if any(d < 0 for d in dims):
        raise ShapeError(f"ConstantOfShape: negative dim in {dims}")
    return np.full(dims, np.asarray(value).reshape(-1)[0], dtype=np.asarray(value).dtype)


def tile(x: np.ndarray, repeats: np.ndarray) -> np.ndarray:
    """ONNX Tile: ``x`` repeated ``repeats[i]`` times along axis ``i`` (one per axis)."""
    reps = _ints(repeats, "Tile", "repeats")
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise ShapeError(f"Tile: repeats {reps} for a rank-{x.ndim} input")
    return np.tile(x, reps)


def _slice_bounds(dim: int, start: int, end: int, step: int) -> slice:
    """One axis of ONNX Slice: negative positions count from the end, then clamp
    (``[0, dim]`` going forward, ``[-1, dim - 1]`` going back)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


def slice_(x: np.ndarray, starts: np.ndarray, ends: np.ndarray,
           axes: np.ndarray | None = None, steps: np.ndarray | None = None) -> np.ndarray:
    """ONNX Slice (opset 10+) with starts, ends, axes and steps given as data."""
    op = "Slice"
    s, e = _ints(starts, op, "starts"), _ints(ends, op, "ends")
    ax = list(range(len(s))) if axes is None else _ints(axes, op, "axes")
    st = [1] * len(s) if steps is None else _ints(steps, op, "steps")
    if not len(s) == len(e) == len(ax) == len(st):
        raise ShapeError(f"{op}: starts {s}, ends {e}, axes {ax} and steps {st} differ in "
                         "length")
    index = [slice(None)] * x.ndim
    for a, b, c, d in zip(ax, s, e, st):
        if not -x.ndim <= a < x.ndim or d == 0:
            raise ShapeError(f"{op}: axis {a} or step {d} invalid for rank {x.ndim}")
        index[a % x.ndim] = _slice_bounds(x.shape[a % x.ndim], b, c, d)
    return np.ascontiguousarray(x[tuple(index)])
