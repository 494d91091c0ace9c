"""Loop-nest features (kiln.tune.features): fixed length, finite, deterministic, and different
for two schedules of the same kernel."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import KilnError
from kiln.schedules import primitives as P
from kiln.schedules.space import Knob, Task
from kiln.tir import te
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.simplify import simplify
from kiln.tune.features import FEATURE_NAMES, extract, knob_features


def _matmul(n=64, m=32, k=48):
    a = te.placeholder((n, k), "float32", "a")
    b = te.placeholder((k, m), "float32", "b")
    r = te.reduce_axis(k, "k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r.var] * b[r.var, j], [r]), name="c")
    return simplify(lower(Schedule(c), [a, b], "mm"))


def _tiled(func):
    """Parallel outer rows, the columns split by 8."""
    outer = P.top_level_nests(func)[0]
    func = P.parallel(func, outer)
    j = P.get_loop(func, outer.body.var.name)
    func, _, _ = P.split(func, j, 8)
    return func


def _index(name):
    return FEATURE_NAMES.index(name)


def test_features_are_fixed_length_finite_and_deterministic():
    a, b = extract(_matmul()), extract(_matmul())
    assert a.shape == b.shape == (len(FEATURE_NAMES),)
    assert a.dtype == np.float64 and np.isfinite(a).all()
    np.testing.assert_array_equal(a, b)


def test_two_schedules_of_one_kernel_differ():
    plain = extract(_matmul())
    tiled = extract(_tiled(_matmul()))
    assert not np.array_equal(plain, tiled)
    assert plain[_index("max.parallel_extent")] == 1  # log2(1 + 1): no parallel loop
    assert tiled[_index("max.parallel_extent")] == pytest.approx(np.log2(65))
    assert tiled[_index("parallel_loops")] == 1
    # the same arithmetic either way
    assert tiled[_index("total_float_ops")] == pytest.approx(plain[_index("total_float_ops")])


def test_vectorized_inner_loop_is_seen():
    x = te.placeholder((4, 16), "float32", "x")
    y = te.compute(x.shape, lambda i, j: x[i, j] + 1.0, name="y")
    func = simplify(lower(Schedule(y), [x], "add1"))
    inner = P.top_level_nests(func)[0].body
    plain, vec = extract(func), extract(P.vectorize(func, inner))
    assert plain[_index("max.inner_is_vectorized")] == 0
    assert vec[_index("max.inner_is_vectorized")] == 1
    assert vec[_index("max.vector_width")] == pytest.approx(np.log2(17))
    assert vec[_index("mean.contiguous_fraction")] == 1.0


def test_strides_and_footprints():
    func = _matmul(4, 8, 2)
    feats = extract(func)
    assert 0 < feats[_index("max.contiguous_fraction")] <= 1
    assert feats[_index("param_bytes")] == pytest.approx(np.log2(1 + 4 * (4 * 2 + 2 * 8 + 4 * 8)))


def test_bad_input_raises():
    with pytest.raises(KilnError, match="PrimFunc"):
        extract("mm")
    task = Task("k", "dense", 1, (Knob("block", (8, 16)), Knob("layout", ("NC", "CN"))))
    np.testing.assert_allclose(knob_features(task, {"block": 16, "layout": "CN"}),
                               [np.log2(17), 1.0])
    with pytest.raises(KilnError, match="legal value"):
        knob_features(task, {"block": 3, "layout": "NC"})
    with pytest.raises(KilnError, match="no value"):
        knob_features(task, {"block": 8})
