"""Isotonic distributional regression (IDR) of the human score on the served mu, per LP.

The served calibrations shift one residual distribution along mu (per LP x mu bin), so the
probability of a score at or below a fixed threshold follows mu with slope 1 inside a bin.  MQM is
not like that: its scores sit on a few values (0, -1, -5, ...) whatever mu is, and the risk
:math:`P(Q \\le \\chi)` of such a distribution comes out too low on its own calibration rows
(``benchmarks/isotonic_distribution.py``).  IDR (Henzi, Ziegel & Gneiting 2021, JRSS B 83) estimates
the conditional CDF at every threshold directly, under one assumption only: a higher mu means a
stochastically higher score.  For each threshold :math:`t_j` it is the antitonic least-squares fit
of :math:`\\mathbb 1[y \\le t_j]` on mu,

.. math:: \\hat F(t_j \\mid x) = \\operatorname{argmin}_{F \\text{ non-increasing in } x}
          \\sum_i (F(x_i) - \\mathbb 1[y_i \\le t_j])^2,

so on the rows it was fitted on the predicted share at or below every threshold equals the observed
one within every block of equal fit: the risk at any :math:`\\chi` is calibrated in sample by
construction, point masses (a perfect translation, one minor error) included.  Fits at different
thresholds are made monotone in the threshold by a running maximum (which keeps them non-increasing
in mu), as the separate fits may cross by rounding.  Between the stored knots of mu the CDF is
linearly interpolated; beyond them it is constant.

Shapes: ``center`` [n] (the served mu, human scale), ``thresholds`` [T] increasing, CDF [n, T].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uamt.uncertainty.calibrators import GLOBAL, lp_groups


def _thresholds(human: np.ndarray, max_thresholds: int, keep) -> np.ndarray:
    """The CDF's support: every distinct score, or ``max_thresholds`` quantiles of them plus ``keep``."""
    values = np.unique(human)
    if values.size > max_thresholds:
        values = np.unique(np.quantile(human, np.linspace(0.0, 1.0, max_thresholds)))
    extra = [k for k in keep if human.min() <= k <= human.max()]
    return np.unique(np.concatenate([values, np.asarray(extra, dtype=float)]))


def _fit_group(human: np.ndarray, center: np.ndarray, max_thresholds: int, n_knots: int, keep) -> dict[str, Any]:
    # scikit-learn only to fit: importing it costs scoring ~0.9 s of start-up
    from sklearn.isotonic import IsotonicRegression

    thresholds = _thresholds(human, max_thresholds, keep)
    knots = np.unique(np.quantile(center, np.linspace(0.0, 1.0, n_knots)))
    cdf = np.empty((knots.size, thresholds.size))
    for j, t in enumerate(thresholds):
        fit = IsotonicRegression(increasing=False, y_min=0.0, y_max=1.0, out_of_bounds="clip")
        cdf[:, j] = fit.fit(center, (human <= t).astype(float)).predict(knots)
    cdf = np.maximum.accumulate(cdf, axis=1)
    cdf[:, -1] = 1.0  # every score is at or below the largest one
    return {"knots": knots.tolist(), "thresholds": thresholds.tolist(), "cdf": cdf.tolist(), "n": int(human.size)}


@dataclass
class IsotonicDistribution:
    """Conditional CDF of the human score given the served mu, per LP with a global fallback.

    ``lp_params``: lp -> ``{"knots": [K], "thresholds": [T], "cdf": [K][T], "n": rows}``; ``global_params``
    the same fitted on every row (LPs without their own fit, unseen LPs).
    """

    lp_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    global_params: dict[str, Any] | None = None

    @classmethod
    def fit(
        cls,
        human,
        center,
        lp,
        *,
        max_thresholds: int = 120,
        n_knots: int = 100,
        keep_thresholds=(),
        min_lp_rows: int = 50,
        global_center=None,
    ) -> IsotonicDistribution:
        """Fit on calibration rows: ``human`` scores, served ``center`` and ``lp``, each shape [n].

        ``max_thresholds``: the most distinct scores the CDF is fitted at (else that many quantiles
        of them); ``keep_thresholds`` are added (e.g. the risk thresholds, so that the risk there is
        fitted, not read off a neighbour); ``n_knots`` quantiles of ``center`` are stored.
        ``global_center`` (shape [n], default ``center``): the rows' served mu as a row of an LP
        without its own fit gets it (another standardisation), which the global fallback is fitted on.
        """
        human = np.asarray(human, dtype=float)
        center = np.asarray(center, dtype=float)
        lp = np.asarray(lp, dtype=object).astype(str)
        pooled = center if global_center is None else np.asarray(global_center, dtype=float)
        if not (human.shape == center.shape == lp.shape == pooled.shape) or human.ndim != 1:
            raise ValueError(
                f"human {human.shape}, center {center.shape}, lp {lp.shape} and global_center {pooled.shape} must be 1-d and equal"
            )
        if human.size == 0 or not (np.all(np.isfinite(human)) and np.all(np.isfinite(center)) and np.all(np.isfinite(pooled))):
            raise ValueError("IDR needs at least one row and finite human scores and centers")
        if int(max_thresholds) < 2 or int(n_knots) < 2:
            raise ValueError(f"max_thresholds={max_thresholds!r} and n_knots={n_knots!r} must be >= 2")
        args = (int(max_thresholds), int(n_knots), tuple(float(k) for k in keep_thresholds))
        out = cls(global_params=_fit_group(human, pooled, *args))
        for name in sorted(set(lp.tolist())):
            rows = lp == name
            if rows.sum() >= min_lp_rows:
                out.lp_params[name] = _fit_group(human[rows], center[rows], *args)
        return out

    def _groups(self, center: np.ndarray, lp):
        if lp is None or isinstance(lp, str):
            lps = np.full(center.size, GLOBAL if lp is None else lp, dtype=object)
        else:
            lps = np.asarray(lp, dtype=object)
        for name, rows in lp_groups(lps):
            yield rows, self.lp_params.get(str(name)) or self.global_params

    @staticmethod
    def _cdf_rows(params: dict[str, Any], center: np.ndarray) -> np.ndarray:
        """[n, T]: each row's CDF at the group's thresholds, linear in mu between knots."""
        knots = np.asarray(params["knots"], dtype=float)
        cdf = np.asarray(params["cdf"], dtype=float)
        if knots.size == 1:
            return np.repeat(cdf, center.size, axis=0)
        x = np.clip(center, knots[0], knots[-1])
        right = np.clip(np.searchsorted(knots, x, side="right"), 1, knots.size - 1)
        left = right - 1
        weight = ((x - knots[left]) / (knots[right] - knots[left]))[:, None]
        return (1.0 - weight) * cdf[left] + weight * cdf[right]

    def cdf(self, center, lp, values) -> np.ndarray:
        """:math:`F(v_i \\mid x_i)` per row, shape [n] (``values`` shape [n] or a scalar)."""
        center = np.asarray(center, dtype=float)
        values = np.broadcast_to(np.asarray(values, dtype=float), center.shape)
        out = np.empty(center.size)
        for rows, params in self._groups(center, lp):
            thresholds = np.asarray(params["thresholds"], dtype=float)
            cdf = self._cdf_rows(params, center[rows])
            index = np.searchsorted(thresholds, values[rows], side="right") - 1
            out[rows] = np.where(index >= 0, cdf[np.arange(index.size), np.clip(index, 0, None)], 0.0)
        return out

    def quantile(self, center, lp, p: float) -> np.ndarray:
        """The smallest threshold whose CDF reaches ``p`` (in (0, 1]), per row, shape [n]."""
        if not 0.0 < p <= 1.0:
            raise ValueError(f"p={p!r} must be in (0, 1]")
        center = np.asarray(center, dtype=float)
        out = np.empty(center.size)
        for rows, params in self._groups(center, lp):
            cdf = self._cdf_rows(params, center[rows])
            # a tolerance for the interpolation's rounding: a CDF of 0.8999999 reaches 0.9
            out[rows] = np.asarray(params["thresholds"], dtype=float)[np.argmax(cdf >= p - 1e-12, axis=1)]
        return out

    def clip_to_support(self, center, lp) -> np.ndarray:
        """``center`` (shape [n]) clipped per row to its group's smallest and largest threshold: the
        point a widening around mu pivots on.  A served mu above the best score (a slope-1 mu can be)
        would otherwise move the point mass at the best score *below* it when widened."""
        center = np.asarray(center, dtype=float)
        out = np.empty(center.size)
        for rows, params in self._groups(center, lp):
            thresholds = params["thresholds"]
            out[rows] = np.clip(center[rows], float(thresholds[0]), float(thresholds[-1]))
        return out

    def interval(self, center, lp, gamma: float) -> tuple[np.ndarray, np.ndarray]:
        """Central interval at ``gamma``: quantiles at :math:`(1 \\mp \\gamma) / 2` (closed; on a point
        mass it covers more than ``gamma``, see :func:`uamt.uncertainty.served.randomised_shares`)."""
        low = max((1.0 - gamma) / 2.0, 1e-12)
        return self.quantile(center, lp, low), self.quantile(center, lp, (1.0 + gamma) / 2.0)

    def to_dict(self) -> dict[str, Any]:
        return {"global": self.global_params, "per_lp": self.lp_params}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IsotonicDistribution:
        out = cls(
            lp_params={str(k): dict(v) for k, v in (data.get("per_lp") or {}).items()},
            global_params=None if data.get("global") is None else dict(data["global"]),
        )
        problem = out.problem()
        if problem is not None:
            raise ValueError(problem)
        return out

    def problem(self) -> str | None:
        """What makes the parameters unusable, or None."""
        for name, params in [("global", self.global_params), *self.lp_params.items()]:
            if not isinstance(params, dict):
                return f"isotonic[{name}] is not fitted"
            knots = np.asarray(params.get("knots", []), dtype=float)
            thresholds = np.asarray(params.get("thresholds", []), dtype=float)
            cdf = np.asarray(params.get("cdf", []), dtype=float)
            if knots.ndim != 1 or thresholds.ndim != 1 or cdf.shape != (knots.size, thresholds.size) or not cdf.size:
                return f"isotonic[{name}]: cdf must be [knots, thresholds] = [{knots.size}, {thresholds.size}]"
            if np.any(np.diff(knots) <= 0) or np.any(np.diff(thresholds) <= 0):
                return f"isotonic[{name}]: knots and thresholds must be strictly increasing"
            if np.any(cdf < 0) or np.any(cdf > 1) or np.any(np.diff(cdf, axis=1) < 0) or np.any(cdf[:, -1] != 1.0):
                return f"isotonic[{name}]: cdf must be in [0, 1], non-decreasing in the threshold and 1 at the last"
        return None

