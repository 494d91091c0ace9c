"""``NCHW{b}c`` → ``NCHW`` layout transforms are tagged ``layout_unblock`` and scheduled
n, c_o, y, x, c_i (docs/decisions/003); other transforms stay injective."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kiln.tir import te
from kiln.tir.layout import Layout, transform_array
from kiln.topi.nn_nchwc import layout_transform


def _transform(src: str, dst: str, primal: dict[str, int]):
    x = te.placeholder(Layout.parse(src).shape(primal), "float32", "x")
    out = layout_transform([x], {"src_layout": src, "dst_layout": dst},
                           SimpleNamespace(shape=Layout.parse(dst).shape(primal)))
    return x, out


@pytest.mark.parametrize("src,dst,block", [
    ("NCHW16c", "NCHW", 16), ("NCHW8c", "NCHW", 8),
    ("NCHW", "NCHW16c", None), ("NCHW16c", "NCHW8c", None)])
def test_unblock_tag(src, dst, block):
    _, out = _transform(src, dst, {"N": 1, "C": 32, "H": 3, "W": 5})
    assert out.block == block
    assert out.tag == ("injective" if block is None else "layout_unblock")


def test_unblock_schedule_order_and_values():
    """The lowered loops walk x outside the unrolled channel lanes, and the interpreter's
    result is numpy's transform."""
    from kiln.schedules.cpu import schedule_te
    from kiln.tir import interpreter as loop_interp
    from kiln.tir import loop as L
    from kiln.tir.lower import Schedule, lower

    x, out = _transform("NCHW8c", "NCHW", {"N": 1, "C": 16, "H": 3, "W": 5})
    func = lower(schedule_te(Schedule(out)), [x], "unblock")
    loops = [(s.extent.value, s.kind) for s in L.walk_stmts(func.body) if isinstance(s, L.For)]
    assert loops[-2:] == [(5, "serial"), (8, "unrolled")]
    data = np.random.default_rng(0).standard_normal((1, 2, 3, 5, 8)).astype(np.float32)
    got = np.zeros((1, 16, 3, 5), np.float32)
    loop_interp.run(func, data, got)
    np.testing.assert_array_equal(got, transform_array(data, "NCHW8c", "NCHW"))
