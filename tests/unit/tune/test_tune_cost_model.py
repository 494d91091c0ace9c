"""The cost model (kiln.tune.cost_model): normalized-throughput labels, random order before
enough samples, a fitted model that ranks unseen candidates, clear errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from kiln.errors import KilnError

pytest.importorskip("lightgbm", reason="the cost model needs lightgbm (pip install kiln[tune])")

from kiln.tune.cost_model import CostModel, normalized_throughput


def _synthetic(n, seed):
    """Two knobs; run time has its minimum at (3, 5) (seconds, always > 0)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 8, size=(n, 2)).astype(np.float64)
    cost = 1e-3 * (1 + (x[:, 0] - 3) ** 2 + 0.5 * (x[:, 1] - 5) ** 2)
    return x, cost


def _rank_correlation(a, b):
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return np.corrcoef(ra, rb)[0, 1]


def test_labels_are_normalized_per_task():
    y = normalized_throughput([2.0, 1.0, None, 4.0, float("nan"), 8.0], list("aaabab"))
    np.testing.assert_allclose(y, [0.5, 1.0, 0.0, 1.0, 0.0, 0.5])
    with pytest.raises(KilnError, match="group keys"):
        normalized_throughput([1.0], ["a", "b"])


def test_random_scores_until_enough_samples():
    model = CostModel(min_samples=8, seed=1)
    x, cost = _synthetic(5, 0)
    model.fit(x, cost)
    assert not model.trained
    s1, s2 = model.predict(x), model.predict(x)
    assert s1.shape == (5,) and not np.array_equal(s1, s2)  # random, not learned


def test_fitted_model_ranks_unseen_candidates():
    model = CostModel(min_samples=8, seed=0)
    x, cost = _synthetic(48, 0)
    cost = list(cost)
    cost[3] = None  # a failed candidate is a sample too (label 0)
    model.fit(x, cost, ["task"] * len(x))
    assert model.trained
    x_new, cost_new = _synthetic(64, 1)
    score = model.predict(x_new)
    # higher score = faster: anti-correlated with the run time
    assert _rank_correlation(score, -cost_new) > 0.7


def test_bad_features_raise():
    model = CostModel()
    with pytest.raises(KilnError, match="2-D"):
        model.predict(np.zeros(3))
    with pytest.raises(KilnError, match="NaN"):
        model.predict(np.full((2, 2), np.nan))
    model.predict(np.zeros((2, 2)))
    with pytest.raises(KilnError, match="3 features per candidate"):
        model.predict(np.zeros((2, 3)))
    with pytest.raises(KilnError, match="costs"):
        model.fit(np.zeros((2, 2)), [1.0])
    with pytest.raises(KilnError, match="min_samples"):
        CostModel(min_samples=1)


def test_missing_lightgbm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightgbm", None)
    with pytest.raises(KilnError, match=r"pip install kiln\[tune\]"):
        CostModel()
