"""Split-conformal intervals normalised by the model's sigma, with a finite-sample coverage guarantee.

Not part of the two papers: an addition that gives intervals whose coverage does not rest on the
Gaussian assumption.  On dev (the calibration split) the nonconformity scores are

.. math:: s_i = \\frac{|q^*_i - \\hat\\mu_i|}{\\hat\\sigma_i}, \\qquad i = 1..n,

and for a level :math:`\\gamma` the threshold is the :math:`k`-th smallest score with
:math:`k = \\lceil (n+1)\\gamma \\rceil` (i.e. the empirical quantile at level
:math:`\\lceil (n+1)\\gamma \\rceil / n`); it is :math:`+\\infty` when :math:`k > n`.  The interval
:math:`\\hat\\mu \\pm \\hat q_\\gamma \\hat\\sigma` then covers a new exchangeable segment with
probability at least :math:`\\gamma` (and below :math:`\\gamma + 1/(n+1)` for continuous scores).

The guarantee holds marginally over the LP group the threshold was fitted on; per-LP thresholds
(``per_lp=True``) give it per LP.  It assumes dev and test are exchangeable -- it does not hold
under domain shift (e.g. the TED ``ood`` split).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from uamt.uncertainty.calibrators import DEFAULT_MIN_LP_ROWS, GLOBAL, _as_lp, _PerLanguagePair, lp_groups
from uamt.uncertainty.metrics import (
    _as_1d,
    _check_gamma,
    _check_row_gammas,
    _check_same_length,
    _z_abs,
    gaussian_interval,
    standardized_abs_error,
)

#: Levels of the coverage report (and the default levels a conformal calibrator is fitted for).
REPORT_GAMMAS: tuple[float, ...] = (0.8, 0.9, 0.95)


def _key(gamma: float) -> str:
    return f"q@{gamma:g}"


def conformal_quantile(scores, gamma: float) -> float:
    """Finite-sample conformal threshold: the :math:`\\lceil (n+1)\\gamma \\rceil`-th smallest score.

    Parameters
    ----------
    scores : array_like, shape [n]
        Nonconformity scores of the calibration set.
    gamma : float
        Target coverage in [0, 1).

    Returns
    -------
    float
        ``+inf`` when :math:`\\lceil (n+1)\\gamma \\rceil > n` (too few calibration points).
    """
    scores = np.sort(_as_1d("scores", scores))
    gamma = _check_gamma(gamma)
    n = scores.size
    # The small tolerance keeps float error in (n+1)*gamma (e.g. 10 * 0.9 = 9.000000000000002)
    # from adding a whole rank.
    rank = math.ceil((n + 1) * gamma - 1e-9)
    if rank > n:
        return math.inf
    return float(scores[max(rank, 1) - 1])


def signed_conformal_quantiles(scores, gamma: float) -> tuple[float, float]:
    """Finite-sample conformal bounds ``(lo, hi)`` of a *signed* score at level gamma.

    With the signed scores sorted, :math:`z_{(1)} \\le \\dots \\le z_{(n)}`,

    .. math:: k_{hi} = \\lceil (n+1)(1+\\gamma)/2 \\rceil, \\quad
              k_{lo} = \\lfloor (n+1)(1-\\gamma)/2 \\rfloor = n + 1 - k_{hi}, \\quad
              lo = z_{(k_{lo})}, \\; hi = z_{(k_{hi})}

    (the empirical quantiles at :math:`k_{lo}/n` and :math:`k_{hi}/n`).  A new exchangeable score falls
    below ``lo`` and above ``hi`` each with probability at most :math:`(1-\\gamma)/2`, so
    :math:`[lo, hi]` covers it with probability at least gamma, whatever the skew.  When
    :math:`k_{hi} > n` (too few scores) the bounds are ``(-inf, +inf)``, as :func:`conformal_quantile`
    returns ``+inf``.

    Parameters
    ----------
    scores : array_like, shape [n]
        Signed nonconformity scores, e.g. :math:`(q^* - \\hat\\mu)/\\hat s`.
    gamma : float
        Target coverage in [0, 1).

    Returns
    -------
    tuple of float
        ``(lo, hi)`` with ``lo <= hi``.
    """
    scores = np.sort(_as_1d("scores", scores))
    gamma = _check_gamma(gamma)
    n = scores.size
    rank = max(math.ceil((n + 1) * (1.0 + gamma) / 2.0 - 1e-9), 1)  # tolerance as in conformal_quantile
    if rank > n:
        return -math.inf, math.inf
    return float(scores[n - rank]), float(scores[rank - 1])


def _signed_key(side: str, gamma: float) -> str:
    return f"{side}@{gamma:g}"


def signed_cdf_knots(params: dict[str, float], gammas: Sequence[float], prefix: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(probabilities, z)`` of the piecewise-linear CDF of a signed score, both shape [2m], increasing.

    The knots are :math:`((1-\\gamma)/2,\\ lo_\\gamma)` and :math:`((1+\\gamma)/2,\\ hi_\\gamma)` for the
    m levels whose bounds ``params[prefix + "lo@<gamma>"]`` / ``"hi@<gamma>"`` are finite.
    """
    levels = [g for g in gammas if math.isfinite(params[prefix + _signed_key("hi", g)])]
    lows = [params[prefix + _signed_key("lo", g)] for g in reversed(levels)]
    highs = [params[prefix + _signed_key("hi", g)] for g in levels]
    probs = [(1.0 - g) / 2.0 for g in reversed(levels)] + [(1.0 + g) / 2.0 for g in levels]
    return np.array(probs), np.array(lows + highs)


def interpolated_half_width(gamma: np.ndarray, levels: np.ndarray, knots: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Half-widths :math:`G^{-1}(\\gamma)\\,s`, shape [n], of the |z| CDF through ``(levels, knots)``
    (:func:`cdf_knots`) at each row's level ``gamma`` (shape [n]); ``+inf`` above the last finite level."""
    return np.where(gamma <= levels[-1], np.interp(gamma, levels, knots) * scale, np.inf)


def cdf_knots(params: dict[str, float], gammas: Sequence[float], prefix: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(levels, thresholds)`` of the piecewise-linear CDF of |z| through (0, 0) and the finite
    fitted thresholds ``params[prefix + "q@<gamma>"]``."""
    levels = [g for g in gammas if math.isfinite(params[prefix + _key(g)])]
    return np.array([0.0, *levels]), np.array([0.0, *[params[prefix + _key(g)] for g in levels]])


class ConformalCalibrator(_PerLanguagePair):
    """Sigma-normalised split-conformal calibrator (per LP, global fallback), JSON-serialisable.

    Fitted parameters per group: ``q@<gamma>`` for each level in ``gammas`` and ``n`` (calibration
    size).  :meth:`interval` returns :math:`\\hat\\mu \\pm \\hat q_\\gamma \\hat\\sigma`.
    """

    kind = "split_conformal"

    def __init__(
        self,
        *,
        gammas: Sequence[float] = REPORT_GAMMAS,
        per_lp: bool = True,
        min_lp_rows: int = DEFAULT_MIN_LP_ROWS,
    ) -> None:
        super().__init__(per_lp=per_lp, min_lp_rows=min_lp_rows)
        gammas = tuple(sorted({_check_gamma(g) for g in gammas}))
        if not gammas or any(g >= 1.0 for g in gammas):
            raise ValueError(f"gammas={gammas!r} must be a non-empty list of levels in [0, 1)")
        self.gammas = gammas

    @classmethod
    def _setting_keys(cls):
        return ("gammas",)

    def _settings(self) -> dict[str, Any]:
        return {"gammas": list(self.gammas)}

    def fit(self, human, mu, sigma, lp=None) -> ConformalCalibrator:
        """Fit on the calibration split: arrays of shape [n]; ``sigma`` is a std and must be > 0."""
        human = _as_1d("human", human)
        mu = _as_1d("mu", mu)
        sigma = _as_1d("sigma", sigma, nonnegative=True)
        _check_same_length(human=human, mu=mu, sigma=sigma)
        if np.any(sigma <= 0):
            raise ValueError("conformal normalisation needs sigma > 0 on every calibration row")
        return self._fit_groups(lp, human=human, mu=mu, sigma=sigma)

    def _fit_group(self, human, mu, sigma):
        scores = standardized_abs_error(human, mu, sigma)
        params = {_key(g): conformal_quantile(scores, g) for g in self.gammas}
        params["n"] = float(scores.size)
        return params

    def quantile(self, gamma: float, lp: str | None = None) -> float:
        """The fitted threshold :math:`\\hat q_\\gamma` for ``lp`` (global fallback)."""
        params, _ = self.params_for(lp)
        key = _key(_check_gamma(gamma))
        if key not in params:
            raise ValueError(f"gamma={gamma!r} not fitted; fitted levels are {list(self.gammas)}")
        return params[key]

    def interval(self, mu, sigma, gamma: float, lp=None) -> tuple[np.ndarray, np.ndarray]:
        """Conformal interval ``(lower, upper)``, each shape [n], for ``mu``, ``sigma`` (std) shape [n]."""
        mu = _as_1d("mu", mu)
        sigma = _as_1d("sigma", sigma, nonnegative=True)
        _check_same_length(mu=mu, sigma=sigma)
        self.quantile(gamma)  # fail early on an unfitted level
        lp_arr = _as_lp(lp, mu.size)
        half = np.empty(mu.size)
        for name, rows in lp_groups(lp_arr):
            q = self.quantile(gamma, None if name == GLOBAL else name)
            half[rows] = np.inf if math.isinf(q) else q * sigma[rows]
        return mu - half, mu + half


    def interval_at(self, mu, sigma, gamma, lp=None) -> tuple[np.ndarray, np.ndarray]:
        """Interval at any level: the threshold interpolated linearly between the fitted levels
        (the inverse of the CDF :meth:`risk` uses); ``+inf`` above the last finite threshold.
        ``gamma``: one level, or one per row (shape [n])."""
        mu = _as_1d("mu", mu)
        sigma = _as_1d("sigma", sigma, nonnegative=True)
        _check_same_length(mu=mu, sigma=sigma)
        gamma = _check_row_gammas(gamma, mu.size)
        lp_arr = _as_lp(lp, mu.size)
        half = np.empty(mu.size)
        for name, rows in lp_groups(lp_arr):
            levels, knots = self._cdf_knots(None if name == GLOBAL else name)
            half[rows] = interpolated_half_width(gamma[rows], levels, knots, sigma[rows])
        return mu - half, mu + half

    def _cdf_knots(self, lp: str | None) -> tuple[np.ndarray, np.ndarray]:
        """``(levels, thresholds)`` of the piecewise-linear |z| CDF through (0, 0) and the finite fits."""
        return cdf_knots(self.params_for(lp)[0], self.gammas)

    def risk(self, mu, sigma, threshold, lp=None) -> np.ndarray:
        """P(Q <= threshold) from the same fitted quantiles as :meth:`interval`, shape [n].

        The conformal predictive distribution is symmetric about :math:`\\hat\\mu` with
        :math:`|Q - \\hat\\mu|/\\hat\\sigma` distributed as the calibration scores: with
        :math:`t = |\\chi - \\hat\\mu|/\\hat\\sigma` and :math:`G` the piecewise-linear CDF through
        :math:`(0, 0)` and the fitted :math:`(\\hat q_\\gamma, \\gamma)`,
        :math:`P(Q \\le \\chi) = \\tfrac12 + \\tfrac12\\operatorname{sign}(\\chi - \\hat\\mu)\\,G(t)`.
        Beyond the last finite threshold G is held at its level (a conservative tail).
        """
        mu = _as_1d("mu", mu)
        sigma = _as_1d("sigma", sigma, nonnegative=True)
        _check_same_length(mu=mu, sigma=sigma)
        chi = np.broadcast_to(np.asarray(threshold, dtype=float), mu.shape)
        lp_arr = _as_lp(lp, mu.size)
        cdf = np.empty(mu.size)
        t = _z_abs(np.abs(chi - mu), sigma)
        for name, rows in lp_groups(lp_arr):
            levels, knots = self._cdf_knots(None if name == GLOBAL else name)
            cdf[rows] = np.interp(t[rows], knots, levels)
        return 0.5 + 0.5 * np.sign(chi - mu) * cdf


def _coverage_and_width(human, lower, upper) -> tuple[float, float]:
    covered = (lower <= human) & (human <= upper)
    return float(np.mean(covered)), float(np.mean(upper - lower))


def interval_report(
    human,
    mu,
    *,
    gaussian_sigma,
    conformal: ConformalCalibrator,
    conformal_sigma,
    lp=None,
    gammas: Sequence[float] = REPORT_GAMMAS,
) -> list[dict[str, Any]]:
    """Coverage and mean width on a test set: Gaussian (calibrated sigma) vs conformal, per LP.

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
        Test ground truth and predicted means.
    gaussian_sigma : array_like, shape [n_segments]
        Std used for the Gaussian intervals :math:`\\hat\\mu \\pm \\hat\\sigma\\operatorname{probit}((1+\\gamma)/2)`
        (usually the affine-calibrated sigma).
    conformal : ConformalCalibrator
        Fitted on dev with the same kind of sigma as ``conformal_sigma``.
    conformal_sigma : array_like, shape [n_segments]
        Std that normalises the conformal scores (the one the calibrator was fitted with).
    lp : array_like of str, shape [n_segments], optional
    gammas : sequence of float
        Levels reported; each must be fitted in ``conformal``.

    Returns
    -------
    list of dict
        One row per (lp, method, gamma), ``lp`` = ``"all"`` for the pooled test set first, then
        the LPs sorted; keys ``lp, method ("gaussian"|"conformal"), gamma, coverage, mean_width,
        n``.  ``mean_width`` is ``inf`` where the conformal threshold is infinite.
    """
    human = _as_1d("human", human)
    mu = _as_1d("mu", mu)
    g_sigma = _as_1d("gaussian_sigma", gaussian_sigma, nonnegative=True)
    c_sigma = _as_1d("conformal_sigma", conformal_sigma, nonnegative=True)
    _check_same_length(human=human, mu=mu, gaussian_sigma=g_sigma, conformal_sigma=c_sigma)
    lp_arr = _as_lp(lp, human.size)
    bounds = {}
    for gamma in gammas:
        bounds["gaussian", gamma] = gaussian_interval(mu, g_sigma, gamma)
        bounds["conformal", gamma] = conformal.interval(mu, c_sigma, gamma, None if lp is None else lp_arr)
    groups = [("all", np.ones(human.size, dtype=bool))]
    if lp is not None:
        groups += [(name, lp_arr == name) for name in sorted(set(lp_arr.tolist()))]
    rows = []
    for name, mask in groups:
        for method in ("gaussian", "conformal"):
            for gamma in gammas:
                lower, upper = bounds[method, gamma]
                coverage, width = _coverage_and_width(human[mask], lower[mask], upper[mask])
                rows.append(
                    {
                        "lp": name,
                        "method": method,
                        "gamma": float(gamma),
                        "coverage": coverage,
                        "mean_width": width,
                        "n": int(mask.sum()),
                    }
                )
    return rows
