"""``Stage.fuse`` (two adjacent loop axes as one, TVM's ``fuse``) and the codegens' addressing
of ``[f // W, f % W]`` as one index (``kiln.tir.index``): the flattened-plane register
blocks of 1×1 convs (docs/decisions/003, "Later: 1×1 convs blocked over the flattened plane")."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import ScheduleError
from kiln.tir import interpreter as loop_interp
from kiln.tir import loop as L
from kiln.tir import te
from kiln.tir.index import merge_split_indices, same_expr
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.simplify import simplify
from kiln.tir.verify import verify


def _pointwise(h: int, w: int, k: int = 8, c: int = 4):
    """out[y, x, b] = sum_r a[r, y, x] * wt[r, b]: a 1×1 conv's shape (float32)."""
    a = te.placeholder((k, h, w), "float32", "a")
    wt = te.placeholder((k, c), "float32", "wt")
    r = te.reduce_axis(k, "r")
    out = te.compute((h, w, c), lambda y, x, b: te.sum(a[r.var, y, x] * wt[r.var, b], [r]),
                     name="out")
    return a, wt, r, out


@pytest.mark.parametrize("h,w,pixels", [(7, 7, 5), (3, 5, 6), (2, 3, 6), (4, 4, 4)])
def test_fused_plane_blocks_cross_rows(h, w, pixels):
    # blocks of `pixels` over the flattened h*w plane, the last one shifted back to its end
    a, wt, r, out = _pointwise(h, w)
    sch = Schedule(out)
    stage = sch[out]
    y, x, b = out.axes
    f = stage.fuse(y, x)
    assert f.extent == h * w
    fo, fi = stage.split(f, pixels, tail="shift")
    stage.reorder(fo, r, fi, b)
    stage.unroll(fi)
    stage.vectorize(b)
    stage.cache_write_local()
    func = simplify(lower(sch, [a, wt], "pw"))
    verify(func)
    rng = np.random.default_rng(0)
    av = rng.standard_normal((8, h, w)).astype("float32")
    wv = rng.standard_normal((8, 4)).astype("float32")
    res = np.zeros((h, w, 4), "float32")
    loop_interp.run(func, av, wv, res)
    np.testing.assert_allclose(res, np.einsum("ryx,rb->yxb", av, wv), rtol=1e-5, atol=1e-5)


def test_fuse_needs_adjacent_axes_of_one_kind():
    _, _, r, out = _pointwise(3, 3)
    y, x, b = out.axes
    with pytest.raises(ScheduleError, match="adjacent"):
        Schedule(out)[out].fuse(y, b)
    sch = Schedule(out)
    sch[out].reorder(y, x, r, b)
    with pytest.raises(ScheduleError, match="reduce"):
        sch[out].fuse(x, r)


def test_merge_split_indices_folds_division_pairs():
    f, c, b = L.Var("f"), L.Var("c"), L.Var("b")
    shape, idx = merge_split_indices((1, 4, 7, 7, 16), [L.IntImm(0), c, f // 7, f % 7, b])
    assert shape == (1, 4, 49, 16)
    assert idx[0].value == 0 and idx[1] is c and idx[2] is f and idx[3] is b
    # the same expression rebuilt (after Simplify) still matches; a different divisor does not
    g = (f + 1) // 7, (f + 1) % 7
    assert merge_split_indices((7, 7), list(g))[0] == (49,)
    assert merge_split_indices((7, 8), [f // 7, f % 7])[0] == (7, 8)
    assert merge_split_indices((7, 7), [f // 7, c % 7])[0] == (7, 7)


def test_same_expr_is_structural():
    f = L.Var("f")
    assert same_expr(L.minimum(f * 5, 44) + 2, L.minimum(f * 5, 44) + 2)
    assert not same_expr(f + 1, f + 2)
    assert not same_expr(f + 1, L.Var("f") + 1)  # another variable of the same name
