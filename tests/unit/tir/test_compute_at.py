"""``Stage.compute_at`` (kiln.tir.lower, kiln.tir.attach): a producer computed one slice of its
first axis at a time under a consumer's loop, in a local buffer — the quantized dense ops'
dequantized weight panel (docs/decisions/053). On the loop-IR interpreter against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import ScheduleError
from kiln.tir import interpreter as loop_interp
from kiln.tir import loop as L
from kiln.tir import te
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.simplify import simplify
from kiln.tir.verify import verify

ROWS, K, BLOCKS, B = 5, 12, 3, 4


def _panel_dense(shift: int = 0):
    """``out[i, j] = Σ_k x[i, k] · (s[j // B] · float(q[(j // B + shift) % BLOCKS, k, j % B]))``:
    an int8 packed weight ``[BLOCKS, K, B]`` widened and scaled by a producer stage."""
    x = te.placeholder((ROWS, K), "float32", "x")
    q = te.placeholder((BLOCKS, K, B), "int8", "q")
    s = te.placeholder((BLOCKS,), "float32", "s")
    panel = te.compute((BLOCKS, K, B), lambda jb, k, jl: s[jb] * L.Cast("float32", q[jb, k, jl]),
                       name="panel")
    r = te.reduce_axis(K, "r")
    out = te.compute((ROWS, BLOCKS * B), lambda i, j: te.sum(
        x[i, r.var] * panel[(j // B + shift) % BLOCKS, r.var, j % B], [r]), name="out")
    return x, q, s, panel, out, r


def _schedule(panel, out, r) -> Schedule:
    sch = Schedule(out)
    i, j = out.axes
    jo, ji = sch[out].split(j, B)
    sch[out].reorder(jo, i, r, ji)
    sch[out].vectorize(ji)
    sch[out].cache_write_local()
    sch[panel].compute_at(sch[out], jo)
    return sch


def test_panel_per_column_block_matches_numpy():
    x, q, s, panel, out, r = _panel_dense()
    func = simplify(lower(_schedule(panel, out, r), [x, q, s], "f"))
    verify(func)
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((ROWS, K)).astype(np.float32)
    qv = rng.integers(-127, 128, (BLOCKS, K, B)).astype(np.int8)
    sv = rng.random(BLOCKS).astype(np.float32)
    res = np.zeros((ROWS, BLOCKS * B), np.float32)
    loop_interp.run(func, xv, qv, sv, res)
    w = (qv.astype(np.float64) * sv[:, None, None]).transpose(1, 0, 2).reshape(K, -1)
    np.testing.assert_allclose(res, xv @ w, rtol=1e-5, atol=1e-5)
    # one slice [K, B] allocated under the column-block loop, none of the whole panel
    allocs = [st for st in L.walk_stmts(func.body) if isinstance(st, L.Allocate)]
    (slice_,) = [a.buffer for a in allocs if "panel" in a.buffer.name]
    assert slice_.shape == (K, B) and slice_.scope == "local"
    (outer,) = [st for st in L.walk_stmts(func.body) if isinstance(st, L.For)][:1]
    assert outer.var.name.endswith("ax1_o") and isinstance(outer.body, L.Allocate)


def test_consumer_reading_another_slice_is_refused():
    x, q, s, panel, out, r = _panel_dense(shift=1)  # block jo reads the panel of jo + 1
    with pytest.raises(ScheduleError, match="first index"):
        lower(_schedule(panel, out, r), [x, q, s], "f")


def test_compute_at_needs_an_injective_stage_and_a_spatial_axis_of_the_consumer():
    x, q, s, panel, out, r = _panel_dense()
    sch = Schedule(out)
    with pytest.raises(ScheduleError, match="not a spatial loop axis"):
        sch[panel].compute_at(sch[out], r)
    with pytest.raises(ScheduleError, match="is a reduction"):
        sch[out].compute_at(sch[panel], panel.axes[0])
