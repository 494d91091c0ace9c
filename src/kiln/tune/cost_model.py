"""The learned cost model: gradient-boosted trees (LightGBM) that rank candidates of a task.

The model never predicts seconds. As in AutoTVM's ``XGBoostCostModel``
(``python/tvm/autotvm/tuner/xgboost_cost_model.py``, loss ``"reg"``) and Ansor's
``XGBModel`` (``python/tvm/auto_scheduler/cost_model/xgb_model.py``), the label of a measured
candidate is its *normalized throughput* within its task: ``best_time / time`` (1 for the
fastest candidate of the task, towards 0 for slow ones, 0 for a failed one), so that samples of
several tasks of one group train one model and only the order within a task matters. Until it
holds ``min_samples`` successful measurements the model has nothing to learn from and returns
random scores (the search then samples uniformly, as AutoTVM's tuner does before its first
fit).

LightGBM is an optional dependency (``pip install kiln[tune]``); it is imported when a model is
made, not when this module is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kiln.errors import KilnError

#: LightGBM's parameters: small trees, deterministic, one thread (the machine measures too)
LGBM_PARAMS = {
    "objective": "regression",
    "learning_rate": 0.1,
    "num_leaves": 15,
    "min_data_in_leaf": 2,
    "min_data_in_bin": 1,
    "feature_fraction": 1.0,
    "deterministic": True,
    "num_threads": 1,
    "verbosity": -1,
}
NUM_BOOST_ROUND = 60


def import_lightgbm():
    """The ``lightgbm`` module, or :class:`KilnError` naming the extra to install."""
    try:
        import lightgbm
    except ImportError as exc:
        raise KilnError("the tuner's cost model needs LightGBM: pip install kiln[tune] "
                        f"(or lightgbm==4.7.0); import failed: {exc}") from exc
    return lightgbm


def normalized_throughput(costs: Sequence[float | None], groups: Sequence[str]) -> np.ndarray:
    """Labels for :meth:`CostModel.fit`: per group (task key), ``min(cost) / cost``; a cost
    that is None, NaN, infinite or not positive (a failed candidate) gets 0.

    Parameters
    ----------
    costs : sequence of float or None
        Run time of each candidate in seconds, shape ``(n,)``.
    groups : sequence of str
        The task key of each candidate, shape ``(n,)``.

    Returns
    -------
    numpy.ndarray
        ``float64``, shape ``(n,)``, values in ``[0, 1]``.
    """
    if len(costs) != len(groups):
        raise KilnError(f"cost model: {len(costs)} costs for {len(groups)} group keys")
    valid = np.array([_valid(c) for c in costs], bool)
    times = np.array([c if v else np.inf for c, v in zip(costs, valid)], np.float64)
    best: dict[str, float] = {}
    for t, g in zip(times, groups):
        best[g] = min(best.get(g, np.inf), t)
    return np.array([best[g] / t if np.isfinite(t) else 0.0 for t, g in zip(times, groups)])


class CostModel:
    """LightGBM regressor on normalized throughput; higher score = faster candidate.

    Parameters
    ----------
    min_samples : int
        Successful measurements needed before the first fit; until then :meth:`predict`
        returns random scores.
    seed : int
        Seeds the random scores and LightGBM.

    Raises
    ------
    KilnError
        When LightGBM is not installed (``pip install kiln[tune]``), or ``min_samples < 2``.
    """

    def __init__(self, min_samples: int = 8, seed: int = 0):
        if min_samples < 2:
            raise KilnError(f"cost model: min_samples must be at least 2, got {min_samples}")
        self._lgb = import_lightgbm()
        self.min_samples = min_samples
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._booster = None
        self._num_features: int | None = None

    @property
    def trained(self) -> bool:
        """Whether :meth:`predict` uses a fitted model (False: random scores)."""
        return self._booster is not None

    def fit(self, features: np.ndarray, costs: Sequence[float | None],
            groups: Sequence[str] | None = None) -> None:
        """Train from scratch on every measured candidate so far.

        Parameters
        ----------
        features : numpy.ndarray
            Shape ``(n, f)``, finite floats (one row per candidate: :mod:`kiln.tune.features`).
        costs : sequence of float or None
            Run time in seconds per row, shape ``(n,)``; None / NaN / inf = failed.
        groups : sequence of str, optional
            The task key of each row (labels are normalized per task); default: one task.

        Raises
        ------
        KilnError
            On mismatched lengths, a non-2-D or non-finite feature matrix, or a feature
            length different from an earlier fit.
        """
        x = self._check(features)
        if len(costs) != len(x):
            raise KilnError(f"cost model: {len(x)} feature rows for {len(costs)} costs")
        groups = list(groups) if groups is not None else [""] * len(x)
        y = normalized_throughput(costs, groups)
        if sum(_valid(c) for c in costs) < self.min_samples:
            return
        data = self._lgb.Dataset(x, label=y, params={"verbosity": -1})
        params = dict(LGBM_PARAMS, seed=self.seed)
        self._booster = self._lgb.train(params, data, num_boost_round=NUM_BOOST_ROUND)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Scores, shape ``(n,)`` ``float64``: predicted normalized throughput (higher is
        faster), or uniform random numbers in ``[0, 1)`` before the first successful fit."""
        x = self._check(features)
        if self._booster is None:
            return self._rng.random(len(x))
        return np.asarray(self._booster.predict(x), np.float64)

    def _check(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, np.float64)
        if x.ndim != 2:
            raise KilnError(f"cost model: features must be 2-D (candidates, features), got "
                            f"shape {x.shape}")
        if not np.isfinite(x).all():
            raise KilnError("cost model: features contain NaN or infinity")
        if self._num_features is None and len(x):
            self._num_features = x.shape[1]
        elif len(x) and x.shape[1] != self._num_features:
            raise KilnError(f"cost model: {x.shape[1]} features per candidate, the model has "
                            f"{self._num_features} (mixing tasks with different feature sets "
                            f"in one group?)")
        return x


def _valid(cost: float | None) -> bool:
    return cost is not None and math.isfinite(cost) and cost > 0
