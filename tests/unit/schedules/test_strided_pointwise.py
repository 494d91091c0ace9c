"""A strided unpadded 1×1 ``nn.conv2d_NCHWc`` reads a subsampled copy of its input (a ``pad``
stage the schedule materializes) and runs at stride 1 over it (docs/decisions/003); other
convs read their input as before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kiln.tir import te
from kiln.topi import nn_nchwc


def _conv(size: int, kernel: int, stride: int, pad: int, ib: int = 16):
    data = te.placeholder((1, 2, size, size, ib), "float32", "data")
    weight = te.placeholder((2, 2, kernel, kernel, ib, 16), "float32", "weight")
    out = (size + 2 * pad - kernel) // stride + 1
    attrs = {"strides": (stride, stride), "padding": (pad,) * 4, "dilation": (1, 1)}
    return nn_nchwc.conv2d_nchwc([data, weight], attrs,
                                 SimpleNamespace(shape=(1, 2, out, out, 16)))


@pytest.mark.parametrize("size,stride,plane", [(14, 2, 7), (13, 2, 7), (12, 3, 4)])
def test_strided_pointwise_reads_a_subsample(size, stride, plane):
    conv = _conv(size, 1, stride, 0)
    (picked,) = [t for t in conv.inputs() if t.name.startswith("subsample")]
    assert picked.tag == "pad"
    assert picked.shape == (1, 2, plane, plane, 16)
    assert [t.name for t in picked.inputs()] == ["data"]


@pytest.mark.parametrize("kernel,stride,pad", [(1, 1, 0), (3, 2, 1), (1, 2, 1)])
def test_other_convs_read_their_input(kernel, stride, pad):
    names = {t.name for t in _conv(14, kernel, stride, pad).inputs()}
    assert not any(n.startswith("subsample") for n in names)


def test_switch_off(monkeypatch):
    monkeypatch.setattr(nn_nchwc, "SUBSAMPLE_STRIDED_POINTWISE", False)
    assert not any(t.name.startswith("subsample") for t in _conv(14, 1, 2, 0).inputs())
