"""Calibration candidates, cross-fitted over documents on dev, and the rule that picks one.

The papers' affine fit :math:`\\sigma^2 \\mapsto \\alpha\\sigma^2 + \\beta` minimises the ECE, which
only looks at *pooled* coverage: on MQM it drives :math:`\\alpha \\to 0`, so every segment of an LP
gets the same interval (the fixed-variance baseline with extra steps).  The candidates here keep
marginal calibration but differ in how much of the model's per-segment sigma they keep:

``affine_ece``
    :class:`~uamt.uncertainty.calibrators.AffineVarianceCalibrator` (the papers', kept for comparison).
``affine_nll`` / ``affine_crps``
    :class:`ScoreVarianceCalibrator`: the same affine map fitted by a proper scoring rule (mean
    Gaussian NLL or CRPS) among the grid points whose dev ECE is within ``ece_bound`` of the best.
``scale_nll``
    :class:`ScoreVarianceCalibrator` with ``scale_only=True``: :math:`\\sigma \\mapsto c\\sigma`, which
    keeps the ratio between any two segments' sigmas.
``conformal``
    :class:`~uamt.uncertainty.conformal.ConformalCalibrator`: the interval
    :math:`\\hat\\mu \\pm \\hat q_\\gamma \\hat\\sigma` with the finite-sample quantile of
    :math:`|q^* - \\hat\\mu|/\\hat\\sigma` per LP; its risk comes from the same quantiles
    (:meth:`ConformalCalibrator.risk`).
``mondrian_conformal``
    :class:`MondrianConformalCalibrator`: the same per LP *and per quintile of predicted mu*, on the
    sigma of ``affine_nll`` -- MQM's errors depend on where mu lies (zero-inflated, long-tailed).
``signed_mondrian_conformal``
    :class:`SignedMondrianConformalCalibrator`: the same cells with separate lower and upper
    quantiles of the *signed* :math:`(q^* - \\hat\\mu)/s` -- an asymmetric interval for MQM's skewed
    residuals (the major-error translations far below mu).

Every candidate is fitted in standardised units (after :class:`Standardizer`) per LP with global
fallback, like the papers' calibration.  :func:`cross_fitted_sigmas` fits each candidate on all but
one fold of documents and applies it to the held-out fold, so that a candidate is judged on rows it
never saw; :func:`select_candidate` applies the rule written in params (``evaluate.calibration_rule``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.special import ndtr

from uamt.uncertainty.calibrators import (
    GLOBAL,
    AffineVarianceCalibrator,
    Standardizer,
    _as_lp,
    _ece_columns,
    lp_groups,
    remembered_fit,
)
from uamt.uncertainty.conformal import (
    ConformalCalibrator,
    _key,
    _signed_key,
    cdf_knots,
    conformal_quantile,
    signed_cdf_knots,
    signed_conformal_quantiles,
)
from uamt.uncertainty.metrics import (
    N_CONFIDENCE_LEVELS,
    _as_1d,
    _check_gamma,
    _check_row_gammas,
    _check_same_length,
    _triple,
    expected_calibration_error,
    expected_normalized_calibration_error,
    grouped_coverage,
    interval_coverage,
    probit,
    quantile_groups,
    standardized_abs_error,
)

_LOG_2PI = math.log(2.0 * math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)
#: Candidate columns the proper-score grid search evaluates at a time: [rows x 64] temporaries stay in
#: cache, 3.5x faster than the whole [29k rows x 775 candidates] matrix, and the same numbers (every
#: step of the ECE and the score is per column).
GRID_BLOCK = 64

#: Levels the conformal candidate is fitted for: its |z| quantile function, from which intervals at
#: these levels and the risk (interpolated) are read.
CONFORMAL_LEVELS: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 20)) + (0.975, 0.99)


# =========================================================================== row-wise interpolation
def interp_rows(x, xp, fp_rows) -> np.ndarray:
    """``np.interp(x[i], xp, fp_rows[i])`` for every row i: ``x`` shape [n], ``xp`` shape [k]
    increasing (shared), ``fp_rows`` shape [n, k]; constant beyond the ends, as ``np.interp``."""
    x, xp, fp_rows = np.asarray(x, dtype=float), np.asarray(xp, dtype=float), np.asarray(fp_rows, dtype=float)
    if xp.size == 1:
        return fp_rows[:, 0].copy()
    right = np.clip(np.searchsorted(xp, x, side="right"), 1, xp.size - 1)
    t = np.clip((x - xp[right - 1]) / (xp[right] - xp[right - 1]), 0.0, 1.0)
    at = np.arange(x.size)
    return fp_rows[at, right - 1] + t * (fp_rows[at, right] - fp_rows[at, right - 1])


def interp_rows_inverse(x, xp_rows, fp) -> np.ndarray:
    """``np.interp(x[i], xp_rows[i], fp)`` for every row i: ``x`` shape [n], ``xp_rows`` shape [n, k]
    non-decreasing per row, ``fp`` shape [k] (shared); constant beyond the ends; where knots tie, the
    value at the last of them (as ``np.interp``)."""
    x, xp_rows, fp = np.asarray(x, dtype=float), np.asarray(xp_rows, dtype=float), np.asarray(fp, dtype=float)
    if fp.size == 1:
        return np.full(x.size, fp[0])
    right = np.clip((xp_rows <= x[:, None]).sum(axis=1), 1, fp.size - 1)
    at = np.arange(x.size)
    x0, x1 = xp_rows[at, right - 1], xp_rows[at, right]
    gap = x1 - x0
    t = np.clip(np.divide(x - x0, gap, out=np.ones_like(x), where=gap > 0), 0.0, 1.0)
    return fp[right - 1] + t * (fp[right] - fp[right - 1])


# =========================================================================== proper-score affine fit
def _mean_scores(abs_err: np.ndarray, var: np.ndarray, score: str) -> np.ndarray:
    """Mean Gaussian NLL or CRPS of each column of calibrated variances ``var`` [n, n_candidates]."""
    if score == "nll":
        return np.mean(0.5 * (_LOG_2PI + np.log(var)) + abs_err[:, None] ** 2 / (2.0 * var), axis=0)
    sd = np.sqrt(var)
    z = abs_err[:, None] / sd
    pdf = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)
    return np.mean(sd * (z * (2.0 * ndtr(z) - 1.0) + 2.0 * pdf - _INV_SQRT_PI), axis=0)


SCORES = ("nll", "crps")


@remembered_fit
def fit_variance_by_score(
    human,
    mu,
    sigma,
    *,
    score: str = "nll",
    scale_only: bool = False,
    ece_bound: float = 0.01,
    n_levels: int = N_CONFIDENCE_LEVELS,
    grid_size: int = 25,
    alpha_decades: float = 3.0,
) -> dict[str, float]:
    """Fit :math:`\\sigma^2_{calib} = \\alpha\\sigma^2 + \\beta` by a proper score under an ECE bound.

    .. math:: (\\alpha, \\beta) = \\arg\\min_{(\\alpha,\\beta) \\in G:\\; \\mathrm{ECE}(\\alpha,\\beta) \\le
              \\min_G \\mathrm{ECE} + \\epsilon} \\; \\frac1n \\sum_j S\\left(\\mathcal N(\\hat\\mu_j,
              \\alpha\\hat\\sigma_j^2 + \\beta), q^*_j\\right)

    with S the Gaussian NLL or CRPS and G the grid of :func:`~uamt.uncertainty.calibrators.fit_affine_variance`
    (``grid_size`` log-spaced alphas around :math:`\\sigma^2_{fixed}/\\overline{\\sigma^2}` over
    :math:`\\pm` ``alpha_decades``; per alpha, 6 betas from :math:`-(1-10^{-3})\\min_j\\alpha\\sigma_j^2`
    to 0 and ``grid_size`` log-spaced ones from :math:`3 \\cdot 10^{-4}\\sigma^2_{fixed}` to
    :math:`3\\sigma^2_{fixed}`), or betas = {0} with ``scale_only``.  The ECE alone is flat over many
    (alpha, beta) (it only sees pooled coverage); the score decides among those, which keeps the
    per-segment information a proper score rewards.

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0, not all 0.
    score : {"nll", "crps"}
    scale_only : bool
        Fit :math:`\\sigma \\mapsto \\sqrt\\alpha\\,\\sigma` only.
    ece_bound : float
        Slack :math:`\\epsilon` >= 0 on the ECE.

    Returns
    -------
    dict
        ``alpha``, ``beta``, ``var_floor``, ``ece_before``, ``ece_after``, ``score`` (the mean score
        at the fit), ``n`` -- the keys :class:`AffineVarianceCalibrator` reads, plus ``score``.
    """
    if score not in SCORES:
        raise ValueError(f"score={score!r} not supported; choose from {sorted(SCORES)}")
    if not ece_bound >= 0:
        raise ValueError(f"ece_bound={ece_bound!r} must be >= 0")
    human, mu, sigma = _triple(human, mu, sigma)
    abs_err, var = np.abs(human - mu), sigma**2
    mse = float(np.mean(abs_err**2))
    if mse == 0.0 or float(var.mean()) == 0.0:
        raise ValueError("a proper-score fit needs some error and some sigma > 0 on dev")
    tiny = 1e-9 * mse
    alphas = mse / float(var.mean()) * 10.0 ** np.linspace(-alpha_decades, alpha_decades, grid_size)
    columns = []  # (alpha, beta) of each candidate
    for alpha in alphas:
        if scale_only:
            betas = np.zeros(1)
        else:
            # beta = 0 and small betas matter (a proportional sigma); a linear grid would step over them
            negative = np.linspace(-(1.0 - 1e-3) * alpha * float(var.min()), 0.0, 6)
            betas = np.unique(np.concatenate([negative, 3.0 * mse * np.logspace(-4.0, 0.0, grid_size)]))
        columns.extend((float(alpha), float(beta)) for beta in betas)
    params = np.asarray(columns)
    ece, scores = np.empty(len(params)), np.empty(len(params))
    for start in range(0, len(params), GRID_BLOCK):  # never the whole [n, n_candidates] matrix
        block = params[start : start + GRID_BLOCK]
        calibrated = np.maximum(block[:, 0][None, :] * var[:, None] + block[:, 1][None, :], tiny)
        ece[start : start + len(block)] = _ece_columns(abs_err, calibrated, n_levels)
        scores[start : start + len(block)] = _mean_scores(abs_err, calibrated, score)
    feasible = ece <= ece.min() + ece_bound
    best = int(np.flatnonzero(feasible)[np.argmin(scores[feasible])])
    alpha, beta = params[best]
    chosen = np.maximum(alpha * var + beta, tiny)
    return {
        "alpha": float(alpha),
        "beta": float(beta),
        "var_floor": float(chosen.min()),
        "ece_before": expected_calibration_error(human, mu, sigma, n_levels),
        "ece_after": expected_calibration_error(human, mu, np.sqrt(chosen), n_levels),
        "score": float(scores[best]),
        "n": float(human.size),
    }


class ScoreVarianceCalibrator(AffineVarianceCalibrator):
    """Affine (or scale-only) variance calibration fitted by a proper score under an ECE bound.

    ``fit`` runs :func:`fit_variance_by_score` per LP (global fallback); ``transform`` is the
    affine one, :math:`\\hat\\sigma_{calib} = \\sqrt{\\max(\\alpha\\hat\\sigma^2 + \\beta, v_{floor})}`.
    """

    kind = "score_variance"

    def __init__(
        self, *, score: str = "nll", scale_only: bool = False, ece_bound: float = 0.01, grid_size: int = 25, **settings
    ) -> None:
        # refine_size is unused here (one grid, no refinement) but kept for the shared serialisation
        super().__init__(grid_size=grid_size, **{"refine_size": 3, **settings})
        if score not in SCORES:
            raise ValueError(f"score={score!r} not supported; choose from {sorted(SCORES)}")
        self.score = score
        self.scale_only = bool(scale_only)
        self.ece_bound = float(ece_bound)

    @classmethod
    def _setting_keys(cls):
        return (*super()._setting_keys(), "score", "scale_only", "ece_bound")

    def _settings(self):
        return {**super()._settings(), "score": self.score, "scale_only": self.scale_only, "ece_bound": self.ece_bound}

    def _fit_group(self, human, mu, sigma):
        if np.all(human == mu) or np.all(sigma == 0):
            return None
        return fit_variance_by_score(
            human,
            mu,
            sigma,
            score=self.score,
            scale_only=self.scale_only,
            ece_bound=self.ece_bound,
            n_levels=self.n_levels,
            grid_size=self.grid_size,
        )


# =========================================================================== Mondrian conformal
class MondrianConformalCalibrator(ConformalCalibrator):
    """Split-conformal per LP *and per bin of predicted mu*, normalised by a proper-score-fitted sigma.

    MQM is zero-inflated and long-tailed: a segment predicted near 0 (no errors) has small errors,
    one predicted low has large ones in both directions, so one threshold per LP over-covers the
    first and under-covers the second whatever sigma does.  Fit on dev: first
    :class:`ScoreVarianceCalibrator` (NLL under the ECE bound) gives the scale :math:`s_j`; then
    per LP the dev mu is cut at its ``n_bins`` equal-count quantiles (``edge<k>``) and in each bin
    b the thresholds ``b<b>:q@<gamma>`` are the conformal quantiles of :math:`|q^* - \\hat\\mu|/s`.
    The finite-sample guarantee then holds within each (LP, mu bin) -- "Mondrian" conformal
    prediction (Vovk et al., 2005) -- so coverage is close to nominal in every predicted-mu quintile.
    Served, the thresholds are interpolated in mu between the bins' centres and recalibrated per bin
    (``interpolate``, :meth:`_row_knots`): continuous in mu, the guarantee then approximate.
    Intervals and the risk come from the same thresholds (:meth:`interval_at`, :meth:`risk`).
    """

    kind = "mondrian_conformal"

    def __init__(
        self, *, gammas: Sequence[float] = CONFORMAL_LEVELS, n_bins: int = 5, ece_bound: float = 0.01,
        n_levels: int = N_CONFIDENCE_LEVELS, interpolate: bool = True, **settings
    ) -> None:
        super().__init__(gammas=gammas, **settings)
        if int(n_bins) < 1:
            raise ValueError(f"n_bins={n_bins!r} must be >= 1")
        self.n_bins, self.ece_bound, self.n_levels = int(n_bins), float(ece_bound), int(n_levels)
        self.interpolate = bool(interpolate)
        self.variance: ScoreVarianceCalibrator | None = None

    @classmethod
    def _setting_keys(cls):
        return (*super()._setting_keys(), "n_bins", "ece_bound", "n_levels", "interpolate")

    def _settings(self) -> dict[str, Any]:
        return {
            **super()._settings(),
            "n_bins": self.n_bins,
            "ece_bound": self.ece_bound,
            "n_levels": self.n_levels,
            "interpolate": self.interpolate,
        }

    def fit(self, human, mu, sigma, lp=None) -> MondrianConformalCalibrator:
        """Fit on the calibration split: arrays of shape [n]; ``sigma`` a std > 0."""
        self.variance = ScoreVarianceCalibrator(
            per_lp=self.per_lp, min_lp_rows=self.min_lp_rows, n_levels=self.n_levels, ece_bound=self.ece_bound
        ).fit(human, mu, sigma, lp=lp)
        return super().fit(human, mu, self.variance.transform(mu, sigma, lp), lp=lp)

    def _binned_params(self, human, mu, sigma) -> dict[str, float]:
        """Edges, centres and per-bin thresholds of one group's rows (arrays of shape [n])."""
        edges = np.quantile(mu, np.arange(1, self.n_bins) / self.n_bins)
        bins = np.searchsorted(edges, mu)
        params = {f"edge{k + 1}": float(e) for k, e in enumerate(edges)}
        for b in range(self.n_bins):
            rows = bins == b
            params.update({f"b{b}:{key}": value for key, value in self._bin_params(human[rows], mu[rows], sigma[rows]).items()})
            # the bin's centre: a row at it takes the bin's own knots (:meth:`_row_knots`)
            params[f"mid{b}"] = float(np.median(mu[rows])) if rows.any() else math.nan
        params["n"] = float(human.size)
        return params

    def _bin_params(self, human, mu, sigma) -> dict[str, float]:
        """Thresholds of one (LP, mu bin) from its rows (arrays of shape [n_b], possibly empty)."""
        scores = standardized_abs_error(human, mu, sigma) if human.size else np.array([np.inf])
        return {_key(g): conformal_quantile(scores, g) for g in self.gammas}

    def _groups(self, mu, sigma, lp):
        """``(rows, params, scale)`` for each LP present (its own parameters or the global
        fallback); ``rows`` a mask of shape [n], ``scale`` shape [n]."""
        sigma = _as_1d("sigma", sigma, nonnegative=True)
        _check_same_length(mu=mu, sigma=sigma)
        if self.variance is None:
            raise RuntimeError("MondrianConformalCalibrator is not fitted; call fit() on dev first")
        scale = self.variance.transform(mu, sigma, lp)
        for name, in_lp in lp_groups(_as_lp(lp, mu.size)):
            yield in_lp, self.params_for(None if name == GLOBAL else name)[0], scale

    #: The piecewise-linear CDF of one cell's scores: ``(params, gammas, prefix) -> (probs, knots)``.
    _knots = staticmethod(cdf_knots)

    def _score(self, human, mu, scale) -> np.ndarray:
        """The score whose CDF :meth:`_knots` describes: :math:`|q^* - \\hat\\mu|/s` here."""
        return np.abs(human - mu) / scale

    def _recalibration_params(self, scores: np.ndarray) -> dict[str, float]:
        """Thresholds of one bin's PIT values ``scores`` (shape [n]) under the interpolated CDF, keyed
        as :meth:`_bin_params` keys a cell's (stored under ``b<b>:pit:``, read back by :meth:`_knots`)."""
        return self._bin_params(scores, np.zeros_like(scores), np.ones_like(scores))

    #: Row sets whose interpolated knots :meth:`_interpolated` remembers per group and part.
    _KNOT_MEMO_SIZE = 4

    def _interpolated(self, params: dict[str, float], mu: np.ndarray, part: str = ""):
        """``(probs, knots)`` of rows with predicted ``mu`` (shape [n]), each knot interpolated
        linearly in mu between the centres of one group's bins (``params``; ``part``: ``""`` the
        scores' CDF, ``"pit:"`` its recalibration): ``probs`` [k] shared, ``knots`` [n, k] (both
        read-only); None where the group cannot be interpolated (:meth:`_row_knots`).

        Remembered per group and part for the last rows asked: a served distribution reads the same
        rows' knots once per level (a CRPS reads 100 levels, each through :meth:`interval_at`), and
        the interpolation was half of its time (``uamt.model_evaluation.ask``, HTS, 28,955 rows:
        8.9 of 18.1 s under cProfile).  A hit needs equal rows, equal parameters and settings, so
        it returns what a new interpolation would, bit for bit."""
        memo = self.__dict__.setdefault("_knot_memo", {}).setdefault((id(params), part), [])
        settings = (self.n_bins, self.interpolate, tuple(self.gammas))
        for seen in memo:
            if seen[0] == settings and seen[1] == params and np.array_equal(seen[2], mu):
                return seen[3]
        out = self._interpolate(params, mu, part)
        if out is not None:
            for array in out:
                array.setflags(write=False)
        # a few row sets: the rows asked and the rearrangement's grid rows alternate, level after level
        memo[:] = [(settings, dict(params), np.array(mu, copy=True), out), *memo[: self._KNOT_MEMO_SIZE - 1]]
        return out

    def __getstate__(self) -> dict[str, Any]:
        """Pickled and deep-copied without the remembered knots (:meth:`_interpolated`)."""
        return {key: value for key, value in self.__dict__.items() if key != "_knot_memo"}

    def _interpolate(self, params: dict[str, float], mu: np.ndarray, part: str):
        """What :meth:`_interpolated` returns, computed."""
        knots = [self._knots(params, self.gammas, f"b{b}:{part}") for b in range(self.n_bins)]
        centres = np.array([params.get(f"mid{b}", math.nan) for b in range(self.n_bins)], dtype=float)
        same = knots[0][0].size > 0 and all(np.array_equal(k[0], knots[0][0]) for k in knots)
        if not (self.interpolate and self.n_bins > 1 and same and np.all(np.isfinite(centres))):
            return None
        table = np.array([k[1] for k in knots])  # [bins, k]
        return knots[0][0], np.column_stack([np.interp(mu, centres, table[:, j]) for j in range(table.shape[1])])

    def _fit_group(self, human, mu, sigma):
        params = self._binned_params(human, mu, sigma)
        interpolated = self._interpolated(params, mu)
        if interpolated is None:
            return params
        pit = interp_rows_inverse(self._score(human, mu, sigma), interpolated[1], interpolated[0])
        bins = np.searchsorted([params[f"edge{k}"] for k in range(1, self.n_bins)], mu)
        for b in range(self.n_bins):
            params.update({f"b{b}:pit:{key}": value for key, value in self._recalibration_params(pit[bins == b]).items()})
        return params

    def _row_knots(self, mu, sigma, lp):
        """``(rows, probs, knots, scale, recalibration)``: the rows of one LP (or of one of its mu
        bins), the probabilities [k] of their scores' CDF knots (:meth:`_knots`), each row's knots
        [rows, k], its scale [rows], and ``(probs, pit_knots)``: the CDF of PIT values that
        recalibrates it, probabilities [k'] and each row's knots [rows, k'] (None: stepwise, none
        is needed).

        Interpolated (``interpolate``, the default since 2026-11-30): each knot of a row is the
        linear interpolation in mu of its LP's bins' knots between the bins' centres (their
        calibration rows' median mu, ``mid<b>``), constant beyond the outermost centres.  That CDF
        :math:`F_j` is recalibrated: in each bin, the conformal thresholds of its calibration rows'
        PIT values :math:`F_i(z_i)` (``b<b>:pit:<key>``) give a piecewise-linear :math:`R_b`, and a
        row gets :math:`R_j(F_j(z))` with :math:`R_j`'s knots interpolated between the centres the
        same way (distributional conformal prediction, Chernozhukov, Wüthrich & Zhu 2021, made
        continuous in mu).  Without the recalibration the interpolated shape over-covers where the
        spread is convex in mu (synthetic spread 0.2 + mu² at 0.9: 0.943 overall, worst mu quintile
        0.975); recalibrated per LP instead of per bin, 0.901 overall but 0.840 in the worst
        quintile; per bin 0.899 and 0.888 (stepwise 0.897 and 0.866).  Stepwise, a row took its bin's knots: the risk and the interval
        jumped at every bin edge, and ranking by the served risk found bad translations less well
        than ranking by mu (HTS test, AUROC for MQM <= -5 of the risk below that of -mu in every
        dataset x LP, e.g. WMT21 en-ru .599 / .619; docs/quality.md).  Convex mixes of
        non-decreasing knots are non-decreasing, so each row keeps a proper CDF.  Stepwise where the
        artifact has no centres (fitted before 2026-11-30) or an LP's bins do not share their
        knots' probabilities (a bin too small for the outer levels)."""
        mu = _as_1d("mu", mu)
        for rows, params, scale in self._groups(mu, sigma, lp):
            interpolated = self._interpolated(params, mu[rows])
            recalibration = self._interpolated(params, mu[rows], "pit:") if f"b0:pit:{self._first_key()}" in params else None
            if interpolated is not None and recalibration is not None:
                yield rows, interpolated[0], interpolated[1], scale[rows], recalibration
                continue
            bins = np.searchsorted([params[f"edge{k}"] for k in range(1, self.n_bins)], mu)
            for b in range(self.n_bins):
                cell = rows & (bins == b)
                if cell.any():
                    probs, knots = self._knots(params, self.gammas, f"b{b}:")
                    yield cell, probs, np.broadcast_to(knots, (int(cell.sum()), knots.size)), scale[cell], None

    def _first_key(self) -> str:
        return _key(self.gammas[0])

    def interval(self, mu, sigma, gamma: float, lp=None) -> tuple[np.ndarray, np.ndarray]:
        return self.interval_at(mu, sigma, gamma, lp)

    def interval_at(self, mu, sigma, gamma, lp=None) -> tuple[np.ndarray, np.ndarray]:
        """Interval ``(lower, upper)`` at level gamma (one, or one per row: shape [n]), each shape [n]
        (thresholds interpolated between levels, and between bins in mu: :meth:`_row_knots`)."""
        mu = _as_1d("mu", mu)
        gamma = _check_row_gammas(gamma, mu.size)
        half = np.empty(mu.size)
        for rows, levels, knots, scale, recalibration in self._row_knots(mu, sigma, lp):
            level, top = gamma[rows], levels[-1]
            if recalibration is not None:  # the PIT value whose recalibrated CDF is gamma
                top = recalibration[0][-1]
                level = interp_rows(level, *recalibration)
            half[rows] = np.where(gamma[rows] <= top, interp_rows(level, levels, knots) * scale, np.inf)
        return mu - half, mu + half

    def risk(self, mu, sigma, threshold, lp=None) -> np.ndarray:
        """P(Q <= threshold), shape [n], from the row's thresholds (:meth:`_row_knots`; see the parent class)."""
        mu = _as_1d("mu", mu)
        chi = np.broadcast_to(np.asarray(threshold, dtype=float), mu.shape)
        cdf = np.empty(mu.size)
        for rows, levels, knots, scale, recalibration in self._row_knots(mu, sigma, lp):
            cdf[rows] = interp_rows_inverse(np.abs(chi[rows] - mu[rows]) / scale, knots, levels)
            if recalibration is not None:
                cdf[rows] = interp_rows_inverse(cdf[rows], recalibration[1], recalibration[0])
        return 0.5 + 0.5 * np.sign(chi - mu) * cdf

    def to_dict(self) -> dict[str, Any]:
        if self.variance is None:
            raise RuntimeError("MondrianConformalCalibrator is not fitted; nothing to serialise")
        return {**super().to_dict(), "variance": self.variance.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        obj = super().from_dict(data)
        obj.variance = ScoreVarianceCalibrator.from_dict(data["variance"])
        return obj


class SignedMondrianConformalCalibrator(MondrianConformalCalibrator):
    """Mondrian conformal with separate lower and upper bounds: an asymmetric interval per (LP, mu bin).

    MQM residuals are skewed: a translation with major errors sits far *below* the predicted mu, and
    a symmetric :math:`|z|` threshold spends its width on both sides, so it under-covers the bad
    tail.  The scale :math:`s_j` (:class:`ScoreVarianceCalibrator`), the LP x mu-bin cells and their
    edges are :class:`MondrianConformalCalibrator`'s; in each cell b the signed scores
    :math:`z_i = (q^*_i - \\hat\\mu_i)/s_i` give, per level gamma,
    ``b<b>:lo@<gamma>`` and ``b<b>:hi@<gamma>`` (:func:`~uamt.uncertainty.conformal.signed_conformal_quantiles`:
    the :math:`\\lfloor (n+1)(1-\\gamma)/2 \\rfloor`-th and :math:`\\lceil (n+1)(1+\\gamma)/2 \\rceil`-th
    smallest :math:`z`; :math:`\\mp\\infty` when the cell has too few rows).  The interval

    .. math:: [\\hat\\mu_j + lo_\\gamma s_j,\\; \\hat\\mu_j + hi_\\gamma s_j]

    misses below and above each with probability at most :math:`(1-\\gamma)/2` within the cell
    (stepwise; served interpolated in mu between the cells' centres and recalibrated per cell,
    :meth:`_row_knots`, it does so approximately, and continuously in mu).
    Interval (:meth:`interval_at`) and risk (:meth:`risk`) read one predictive distribution: the
    piecewise-linear CDF :math:`F` of z through the knots :math:`((1-\\gamma)/2, lo_\\gamma)` and
    :math:`((1+\\gamma)/2, hi_\\gamma)` of every level with finite bounds
    (:func:`~uamt.uncertainty.conformal.signed_cdf_knots`).  The Gaussian-equivalent sigma that
    :func:`candidate_sigma` serves is :math:`(hi_\\gamma - lo_\\gamma) s / (2 z_{(1+\\gamma)/2})`: the width
    is kept, not the asymmetry, which only :meth:`interval_at` and :meth:`risk` carry.
    """

    kind = "signed_mondrian_conformal"
    _knots = staticmethod(signed_cdf_knots)

    def _score(self, human, mu, scale) -> np.ndarray:
        return (human - mu) / scale

    def _first_key(self) -> str:
        return _signed_key("hi", self.gammas[0])

    def _bin_params(self, human, mu, sigma) -> dict[str, float]:
        scores = (human - mu) / sigma
        params = {}
        for g in self.gammas:
            lo, hi = signed_conformal_quantiles(scores, g) if scores.size else (-math.inf, math.inf)
            params[_signed_key("lo", g)], params[_signed_key("hi", g)] = lo, hi
        return params

    def interval_at(self, mu, sigma, gamma, lp=None) -> tuple[np.ndarray, np.ndarray]:
        """Interval ``(lower, upper)`` at level gamma (one, or one per row: shape [n]), each shape [n]: :math:`\\hat\\mu + F^{-1}((1 \\mp \\gamma)/2)\\,s`.

        :math:`F^{-1}` is linear in probability between the knots, so a fitted level gives its
        ``lo``/``hi`` exactly and the bounds of other levels are interpolated between the two nearest
        (below the smallest fitted level, between its ``lo`` and ``hi``); ``(-inf, +inf)`` above the
        largest level with finite bounds.
        """
        mu = _as_1d("mu", mu)
        gamma = _check_row_gammas(gamma, mu.size)
        lower, upper = np.empty(mu.size), np.empty(mu.size)
        for rows, probs, knots, scale, recalibration in self._row_knots(mu, sigma, lp):
            if probs.size == 0:
                lower[rows], upper[rows] = -np.inf, np.inf
                continue
            level = gamma[rows]
            low, high = (1.0 - level) / 2.0, (1.0 + level) / 2.0
            span = probs[-1] - probs[0]
            if recalibration is not None:  # the PIT values whose recalibrated CDF is low, high
                span = recalibration[0][-1] - recalibration[0][0]
                low, high = interp_rows(low, *recalibration), interp_rows(high, *recalibration)
            unbounded = level > span + 1e-12
            lower[rows] = np.where(unbounded, -np.inf, mu[rows] + interp_rows(low, probs, knots) * scale)
            upper[rows] = np.where(unbounded, np.inf, mu[rows] + interp_rows(high, probs, knots) * scale)
        return lower, upper

    def risk(self, mu, sigma, threshold, lp=None) -> np.ndarray:
        """P(Q <= threshold) = :math:`F((\\chi - \\hat\\mu)/s)`, shape [n], from the same knots as :meth:`interval_at`.

        F is non-decreasing (the bounds are order statistics whose ranks move outwards with gamma;
        interpolated, a convex mix of such knots, recalibrated by a non-decreasing map:
        :meth:`_row_knots`).  Beyond the outermost finite knots it is constant (no extrapolation: the
        calibration set says nothing about the tail beyond its extreme order statistics): stepwise at
        their probabilities, :math:`(1-\\gamma_{max})/2` and :math:`(1+\\gamma_{max})/2` (0.005 / 0.995
        with the default levels); interpolated at the recalibrated CDF there, the share of the
        bin's calibration rows beyond them (within [0.005, 0.995]).  A cell without a finite bound
        has :math:`F = 1/2` everywhere.
        """
        mu = _as_1d("mu", mu)
        chi = np.broadcast_to(np.asarray(threshold, dtype=float), mu.shape)
        cdf = np.empty(mu.size)
        for rows, probs, knots, scale, recalibration in self._row_knots(mu, sigma, lp):
            if probs.size == 0:
                cdf[rows] = 0.5
                continue
            cdf[rows] = interp_rows_inverse((chi[rows] - mu[rows]) / scale, knots, probs)
            if recalibration is not None:
                cdf[rows] = interp_rows_inverse(cdf[rows], recalibration[1], recalibration[0])
        return cdf

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """Read :meth:`to_dict` output.  Its JSON writes an infinite bound as null, which the shared
        reader turns into +inf; a lower bound (``lo@``) is unbounded only downwards, so it is -inf."""
        obj = super().from_dict(data)
        for params in (obj.global_params, *obj.lp_params.values()):
            if params is not None:
                params.update({k: -math.inf for k, v in params.items() if "lo@" in k and v == math.inf})
        return obj


# =========================================================================== the candidates
def _affine(common: dict[str, Any], n_levels: int, ece_bound: float):
    return AffineVarianceCalibrator(**common, n_levels=n_levels)


#: Candidate name -> factory ``(common kwargs, n_levels, ece_bound) -> unfitted calibrator``.
CANDIDATES: dict[str, Callable[..., Any]] = {
    "affine_ece": _affine,
    "affine_nll": lambda common, n_levels, ece_bound: ScoreVarianceCalibrator(
        **common, n_levels=n_levels, score="nll", ece_bound=ece_bound
    ),
    "affine_crps": lambda common, n_levels, ece_bound: ScoreVarianceCalibrator(
        **common, n_levels=n_levels, score="crps", ece_bound=ece_bound
    ),
    "scale_nll": lambda common, n_levels, ece_bound: ScoreVarianceCalibrator(
        **common, n_levels=n_levels, score="nll", scale_only=True, ece_bound=ece_bound
    ),
    "conformal": lambda common, n_levels, ece_bound: ConformalCalibrator(gammas=CONFORMAL_LEVELS, **common),
    "mondrian_conformal": lambda common, n_levels, ece_bound: MondrianConformalCalibrator(
        **common, n_levels=n_levels, ece_bound=ece_bound
    ),
    "signed_mondrian_conformal": lambda common, n_levels, ece_bound: SignedMondrianConformalCalibrator(
        **common, n_levels=n_levels, ece_bound=ece_bound
    ),
}


#: Candidates fitted when none are named (``EvaluationSettings.calibration_candidates``): every one.
#: The rule weighs the lower / upper miss balance, so the asymmetric ``signed_mondrian_conformal``
#: is served where MQM's skew makes the symmetric ones miss mostly below.
DEFAULT_CANDIDATES: tuple[str, ...] = tuple(CANDIDATES)


def candidate_from_dict(candidates: dict[str, Any] | None, selected: str | None):
    """The fitted calibrator ``candidates[selected]`` (serialised), or None for the papers' affine fit."""
    if not selected or selected == "affine_ece" or not candidates:
        return None
    data = candidates[selected]
    served = (
        AffineVarianceCalibrator,
        ScoreVarianceCalibrator,
        ConformalCalibrator,
        MondrianConformalCalibrator,
        SignedMondrianConformalCalibrator,
    )
    kinds = {cls.kind: cls for cls in served}
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in kinds:
        raise ValueError(f"calibration kind={kind!r} not supported; choose from {sorted(kinds)}")
    return kinds[kind].from_dict(data)


def check_candidates(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a tuple, refusing unknown ones."""
    for name in names:
        if name not in CANDIDATES:
            raise ValueError(f"calibration candidate={name!r} not supported; choose from {sorted(CANDIDATES)}")
    if not names:
        raise ValueError("at least one calibration candidate is needed")
    return tuple(names)


def fit_candidate(name: str, human_z, mu_z, sigma_z, lp, *, common: dict[str, Any], n_levels: int, ece_bound: float):
    """Fit candidate ``name`` on standardised dev arrays (shape [n]); returns the fitted calibrator."""
    calibrator = CANDIDATES[check_candidates([name])[0]](common, n_levels, ece_bound)
    return calibrator.fit(human_z, mu_z, sigma_z, lp=lp)


def candidate_sigma(calibrator, mu_z, sigma_z, lp, gamma: float) -> np.ndarray:
    """Calibrated standard deviation of each row, shape [n], in standardised units.

    For a variance calibrator its ``transform``; for the conformal one the Gaussian-equivalent sigma
    at ``gamma``, :math:`\\hat q_\\gamma \\hat\\sigma / \\operatorname{probit}((1+\\gamma)/2)`, whose
    Gaussian interval at ``gamma`` is the conformal interval (other levels then follow the Gaussian
    shape, so its ECE is only indicative).
    """
    if isinstance(calibrator, ConformalCalibrator):
        low, high = calibrator.interval(mu_z, sigma_z, gamma, lp)
        return (high - low) / (2.0 * float(probit((1.0 + gamma) / 2.0)))
    return calibrator.transform(mu_z, sigma_z, lp)


def candidate_interval(calibrator, mu_z, sigma_z, lp, gamma: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The interval ``(lower, upper)`` at ``gamma`` (each shape [n]) of a calibrator whose interval is
    *not* the central Gaussian one of :func:`candidate_sigma` -- an asymmetric one
    (:class:`SignedMondrianConformalCalibrator`) -- or None where that Gaussian interval is exact.

    Coverage is measured on these bounds where there are any (:func:`conditional_report`,
    :func:`candidate_summary`): the symmetric sigma keeps the width but not the asymmetry.
    """
    if isinstance(calibrator, SignedMondrianConformalCalibrator):
        return calibrator.interval_at(mu_z, sigma_z, gamma, lp)
    return None


def inside_interval(human, mu, sigma, gamma: float, bounds=None) -> np.ndarray:
    """Whether each row's human score lies in its interval at ``gamma``, boolean shape [n].

    ``bounds`` = ``(lower, upper)`` (shape [n] each): :math:`lower_j \\le q^*_j \\le upper_j`;
    None: the central Gaussian interval, :math:`|q^*_j - \\hat\\mu_j| \\le \\hat\\sigma_j z_{(1+\\gamma)/2}`
    (as :func:`~uamt.uncertainty.metrics.grouped_coverage` counts it).
    """
    human = np.asarray(human, dtype=float)
    if bounds is None:
        return np.abs(human - np.asarray(mu, dtype=float)) <= np.asarray(sigma, dtype=float) * float(
            probit((1.0 + _check_gamma(gamma)) / 2.0)
        )
    lower, upper = (np.asarray(b, dtype=float) for b in bounds)
    _check_same_length(human=human, lower=lower, upper=upper)
    return (lower <= human) & (human <= upper)


# =========================================================================== folds and cross-fitting
def document_folds(groups, n_folds: int = 5, seed: int = 0) -> np.ndarray:
    """Fold index (0..k-1) of each row so that no document spans two folds.

    Documents are shuffled with ``seed`` and dealt round-robin, so each fold holds about the same
    number of documents (the papers' k-fold protocol: "documents are disjunct across the folds").

    Parameters
    ----------
    groups : array_like, shape [n]
        Document id of each row (any labels).
    n_folds : int
        k, at most the number of documents.

    Returns
    -------
    numpy.ndarray of int, shape [n]
    """
    labels = np.asarray(groups).astype(str)
    unique = np.unique(labels)
    if not 2 <= int(n_folds) <= unique.size:
        raise ValueError(f"n_folds={n_folds} must lie in [2, number of documents={unique.size}]")
    order = np.random.default_rng(seed).permutation(unique.size)
    fold_of_doc = np.empty(unique.size, dtype=np.int64)
    fold_of_doc[order] = np.arange(unique.size) % int(n_folds)
    return fold_of_doc[np.searchsorted(unique, labels)]


def standardize(dev, rows_fit, rows_apply, common: dict[str, Any], *, mu_scaling: str = "spread"):
    """Standardiser fitted on ``dev`` rows ``rows_fit``; returns it and the z-arrays of both row sets.

    ``dev`` is a :class:`~uamt.uncertainty.evaluate.PredictionArrays`; its ``sample_sigma`` (None for
    a predicted sigma) decides what enters the pooled spread.  ``mu_scaling``: the
    :class:`Standardizer`'s (``regression`` fits mu's dev-optimal line on ``rows_fit`` only, so a
    cross-fitted fold sees it out of sample).
    """
    sample = dev.sample_sigma
    standardizer = Standardizer(**common, mu_scaling=mu_scaling).fit(
        dev.human[rows_fit],
        dev.mu[rows_fit],
        None if sample is None else sample[rows_fit],
        lp=dev.lp[rows_fit],
        sigma_from_samples=sample is not None,
    )
    out = []
    for rows in (rows_fit, rows_apply):
        human_z = standardizer.transform_human(dev.human[rows], dev.lp[rows])
        mu_z, sigma_z = standardizer.transform_predictions(dev.mu[rows], dev.sigma[rows], dev.lp[rows])
        out.append((human_z, mu_z, sigma_z))
    return standardizer, out[0], out[1]


def cross_fitted_sigmas(
    arrays,
    folds: np.ndarray,
    names: Sequence[str],
    *,
    common: dict[str, Any],
    n_levels: int,
    ece_bound: float,
    gamma: float,
    with_bounds: bool = False,
    mu_scaling: str = "spread",
):
    """Out-of-fold standardised ``human_z``, ``mu_z`` and calibrated sigma per candidate, each shape [n].

    For each fold f: the standardiser (``mu_scaling``, so a dev-fitted mu line too) and every
    candidate are fitted on the rows outside f and applied to the rows of f.  Candidates that cannot be fitted on a fold (degenerate data) get NaN.
    ``with_bounds``: a fourth item, ``{name: (lower, upper)}`` (shape [n] each, out of fold) of the
    candidates with an interval of their own (:func:`candidate_interval`).
    """
    n = len(arrays)
    human_z, mu_z = np.full(n, np.nan), np.full(n, np.nan)
    sigmas = {name: np.full(n, np.nan) for name in names}
    bounds: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for fold in np.unique(folds):
        held_out = folds == fold
        _, (fit_h, fit_mu, fit_sigma), (h, m, s) = standardize(
            arrays, ~held_out, held_out, common, mu_scaling=mu_scaling
        )
        human_z[held_out], mu_z[held_out] = h, m
        for name in names:
            try:
                calibrator = fit_candidate(
                    name, fit_h, fit_mu, fit_sigma, arrays.lp[~held_out], common=common, n_levels=n_levels, ece_bound=ece_bound
                )
            except ValueError:
                continue
            sigmas[name][held_out] = candidate_sigma(calibrator, m, s, arrays.lp[held_out], gamma)
            interval = candidate_interval(calibrator, m, s, arrays.lp[held_out], gamma)
            if interval is not None:
                lower, upper = bounds.setdefault(name, (np.full(n, np.nan), np.full(n, np.nan)))
                lower[held_out], upper[held_out] = interval
    if with_bounds:
        return human_z, mu_z, sigmas, bounds
    return human_z, mu_z, sigmas


# =========================================================================== the rule
#: Rules that pick the served candidate from cross-fitted dev metrics (``evaluate.calibration_rule``).
RULES = ("min_goal_ratio", "min_ece", "min_ence")


def candidate_summary(
    human, mu, sigma, lp, gamma: float, n_levels: int = N_CONFIDENCE_LEVELS, *, bounds=None, doc=None
) -> dict[str, float]:
    """The quantities the rules compare, on one candidate's (out-of-fold) predictions, shape [n].

    ``bounds``: the candidate's own interval at ``gamma`` (:func:`candidate_interval`), on which the
    coverage errors are then measured; ENCE and ECE always read the (Gaussian-equivalent) sigma.
    ``doc`` (shape [n], optional): document ids for the cells' clustered sampling bands.

    ``lp_coverage_error`` (max over LPs of :math:`|\\mathrm{acc} - \\gamma|`), ``sigma_quintile_error`` and
    ``mu_quintile_error`` (the same over the LP x quintile cells of sigma / mu, quintiles taken
    within each LP), ``conditional_coverage_error`` (the larger of the two), ``miss_balance_error``
    (max over LPs and sides of :math:`|\\mathrm{miss} - (1-\\gamma)/2|`, :func:`conditional_report`),
    ``lower_miss`` / ``upper_miss`` (pooled), ``ence`` and ``ece`` (means over LPs), and, not
    weighed by the rules, ``mean_width`` of the interval and ``mu_mse`` (mean squared error of mu),
    both in the units of ``human``.
    """
    human, mu, sigma = (np.asarray(a, dtype=float) for a in (human, mu, sigma))
    lp = np.asarray(lp, dtype=object)
    report = conditional_report(human, mu, sigma, lp, gamma, bounds=bounds, doc=doc)
    lps = sorted(set(lp.tolist()))
    out = {
        "lp_coverage_error": report["lp_coverage_error"],
        "sigma_quintile_error": report["sigma_quintile_coverage_error"],
        "mu_quintile_error": report["mu_quintile_coverage_error"],
        "miss_balance_error": report["miss"]["balance_error"],
        "lower_miss": report["miss"]["lower"],
        "upper_miss": report["miss"]["upper"],
        "ence": float(
            np.mean([expected_normalized_calibration_error(human[lp == n], mu[lp == n], sigma[lp == n], 5) for n in lps])
        ),
        "ece": float(np.mean([expected_calibration_error(human[lp == n], mu[lp == n], sigma[lp == n], n_levels) for n in lps])),
        "mean_width": float(
            np.mean(2.0 * sigma * float(probit((1.0 + gamma) / 2.0)) if bounds is None else bounds[1] - bounds[0])
        ),
        "mu_mse": float(np.mean((human - mu) ** 2)),
    }
    out["conditional_coverage_error"] = max(out["sigma_quintile_error"], out["mu_quintile_error"])
    return out


def _within_lp_quintiles(values: np.ndarray, lp: np.ndarray) -> np.ndarray:
    """Quintile (0..4) of each value among the rows of its LP (LPs with < 5 rows: all 0)."""
    out = np.zeros(values.size, dtype=np.int64)
    for name in set(lp.tolist()):
        rows = lp == name
        if rows.sum() >= 5:
            out[rows] = quantile_groups(values[rows], 5)
    return out


def select_candidate(
    summaries: dict[str, dict[str, float] | None],
    rule: str,
    lp_tolerance: float = 0.03,
    quintile_tolerance: float = 0.05,
    miss_tolerance: float | None = None,
) -> str:
    """The candidate the ``rule`` picks from cross-fitted dev ``summaries`` (None = could not be fitted).

    ``min_goal_ratio``: the smallest worst coverage gap measured against its goal,

    .. math:: \\max\\left(\\frac{\\max_{lp} |\\mathrm{acc}_{lp} - \\gamma|}{t_{lp}},\\;
              \\frac{\\max_{lp \\times quintile} |\\mathrm{acc} - \\gamma|}{t_q},\\;
              \\frac{\\max_{lp,\\ side} |\\mathrm{miss}_{side} - (1-\\gamma)/2|}{t_{miss}}\\right)

    (LP x quintile cells of sigma and of mu, :func:`candidate_summary`; the miss term only with a
    ``miss_tolerance``), ties to the smaller ENCE -- a candidate that is calibrated per LP but covers
    0.6 in the top sigma quintile of one LP loses to one that is a little off per LP and close
    everywhere, and one that misses 9 % below and 2 % above loses to one that misses 5 % on each
    side.  ``min_ece``: the papers' criterion.  ``min_ence``: the smallest ENCE.  Remaining ties go
    to the earlier candidate.
    """
    if rule not in RULES:
        raise ValueError(f"calibration_rule={rule!r} not supported; choose from {sorted(RULES)}")
    if not (lp_tolerance > 0 and quintile_tolerance > 0 and (miss_tolerance is None or miss_tolerance > 0)):
        raise ValueError(f"tolerances must be > 0, got {lp_tolerance!r}, {quintile_tolerance!r}, {miss_tolerance!r}")
    usable = {name: s for name, s in summaries.items() if s is not None}
    if not usable:
        raise ValueError("no calibration candidate could be fitted")
    if rule == "min_ece":
        return min(usable, key=lambda name: usable[name]["ece"])
    if rule == "min_ence":
        return min(usable, key=lambda name: usable[name]["ence"])

    def goal_ratio(name: str) -> tuple[float, float]:
        s = usable[name]
        ratios = [s["lp_coverage_error"] / lp_tolerance, s["conditional_coverage_error"] / quintile_tolerance]
        if miss_tolerance is not None:
            ratios.append(s["miss_balance_error"] / miss_tolerance)
        return max(ratios), s["ence"]

    return min(usable, key=goal_ratio)


def coverage_band(inside: np.ndarray, gamma: float, doc=None) -> dict[str, float | None]:
    """Sampling band of one cell's coverage: ``se`` = :math:`\\sqrt{\\gamma(1-\\gamma)/n}` (the binomial
    standard error of a calibrated cell of n independent rows) and, with ``doc`` (shape [n]), the
    document-clustered one, :math:`\\sqrt{\\frac{G}{G-1}\\sum_g (\\sum_{i \\in g} (x_i - \\bar x))^2}/n`
    over the G documents of the cell (None with fewer than 2) -- translations of one document share
    its difficulty, so their misses are not independent.
    """
    inside = np.asarray(inside, dtype=float)
    n = inside.size
    band: dict[str, float | None] = {"se": math.sqrt(gamma * (1.0 - gamma) / n) if n else None}
    if doc is not None:
        labels = np.unique(np.asarray(doc).astype(str), return_inverse=True)[1]
        sums = np.bincount(labels, weights=inside - inside.mean())
        g = sums.size
        band["se_clustered"] = math.sqrt(g / (g - 1) * float(np.sum(sums**2))) / n if g >= 2 else None
    return band


def _cells(inside: np.ndarray, lp: np.ndarray, quintile: np.ndarray, gamma: float, doc) -> dict[str, dict[str, Any]]:
    """``{"<lp>/<quintile>": {"coverage", "n", "se"[, "se_clustered"]}}`` of each LP x quintile cell."""
    out = {}
    for name in sorted(set(lp.tolist()), key=str):
        for k in sorted(set(quintile[lp == name].tolist())):
            rows = (lp == name) & (quintile == k)
            out[f"{name}/{k}"] = {
                "coverage": float(np.mean(inside[rows])),
                "n": float(rows.sum()),
                **coverage_band(inside[rows], gamma, None if doc is None else doc[rows]),
            }
    return out


def conditional_report(
    human, mu, sigma, lp, gamma: float, *, domain=None, low_human=None, bounds=None, doc=None
) -> dict[str, Any]:
    """Coverage at ``gamma`` by LP, domain and LP x quintile cell of mu and of sigma, with the worst gap of each.

    ``low_human``: boolean mask [n] of the rows whose human score is at or below the low-score
    threshold (e.g. MQM <= -5, the major-error translations); their coverage is reported too.
    ``bounds``: ``(lower, upper)`` (shape [n] each), the interval whose coverage is counted
    (:func:`inside_interval`); None: the central Gaussian interval of ``sigma``.
    ``doc`` (shape [n], optional): document ids, for the cells' clustered bands.

    Keys: ``by_lp`` / ``by_domain`` and their ``*_coverage_error``; ``by_lp_mu_quintile`` /
    ``by_lp_sigma_quintile`` (``"<lp>/<k>"`` -> coverage, n and the sampling band of
    :func:`coverage_band`), whose worst gap is ``mu_quintile_coverage_error`` /
    ``sigma_quintile_coverage_error`` (cell named in ``*_worst_cell``); ``by_mu_quintile`` /
    ``by_sigma_quintile`` pool quintile k over LPs (``pooled_*_quintile_coverage_error``: one LP's
    under-coverage can hide behind another's over-coverage there); ``miss``: the share of rows
    below the interval (``lower``) and above it (``upper``), pooled and ``by_lp``, and
    ``balance_error`` = :math:`\\max_{lp,\\ side} |\\mathrm{miss} - (1-\\gamma)/2|`.
    """
    human = np.asarray(human, dtype=float)
    mu, sigma = np.asarray(mu, dtype=float), np.asarray(sigma, dtype=float)
    inside = inside_interval(human, mu, sigma, gamma, bounds)
    if bounds is None:
        below, above = ~inside & (human < mu), ~inside & (human > mu)
    else:
        below, above = human < np.asarray(bounds[0], dtype=float), human > np.asarray(bounds[1], dtype=float)
    lp = np.asarray(lp, dtype=object)
    doc = None if doc is None else np.asarray(doc)
    groupings = {"lp": lp}
    if domain is not None:
        groupings["domain"] = np.asarray(domain, dtype=object)
    quintiles = {"mu": _within_lp_quintiles(mu, lp), "sigma": _within_lp_quintiles(sigma, lp)}
    groupings["mu_quintile"], groupings["sigma_quintile"] = quintiles["mu"], quintiles["sigma"]
    report: dict[str, Any] = {}
    for key, groups in groupings.items():
        by_group = grouped_coverage(human, mu, sigma, groups, gamma) if bounds is None else _grouped(inside, groups)
        report[f"by_{key}"] = by_group
        error = max(abs(g["coverage"] - gamma) for g in by_group.values())
        report[f"pooled_{key}_coverage_error" if key.endswith("quintile") else f"{key}_coverage_error"] = error
    for key, quintile in quintiles.items():
        cells = _cells(inside, lp, quintile, gamma, doc)
        worst = max(cells, key=lambda c: abs(cells[c]["coverage"] - gamma))
        report[f"by_lp_{key}_quintile"] = cells
        report[f"{key}_quintile_coverage_error"] = abs(cells[worst]["coverage"] - gamma)
        report[f"{key}_quintile_worst_cell"] = worst
    target = (1.0 - gamma) / 2.0
    by_lp = {
        str(name): {"lower": float(np.mean(below[lp == name])), "upper": float(np.mean(above[lp == name]))}
        for name in sorted(set(lp.tolist()), key=str)
    }
    report["miss"] = {
        "lower": float(np.mean(below)),
        "upper": float(np.mean(above)),
        "target": target,
        "by_lp": by_lp,
        "balance_error": max(abs(m[side] - target) for m in by_lp.values() for side in ("lower", "upper")),
    }
    if low_human is not None:
        low = np.asarray(low_human, dtype=bool)
        report["low_score"] = {
            "coverage": (
                None
                if not low.any()
                else interval_coverage(human[low], mu[low], sigma[low], gamma)
                if bounds is None
                else float(np.mean(inside[low]))
            ),
            "n": int(low.sum()),
        }
    return report


def _grouped(inside: np.ndarray, groups) -> dict[str, dict[str, float]]:
    """``{str(label): {"coverage", "n"}}`` of a boolean ``inside`` [n] per group, in sorted label order
    (the layout of :func:`~uamt.uncertainty.metrics.grouped_coverage`)."""
    labels = np.asarray(groups)
    out = {}
    for label in sorted(set(labels.tolist()), key=str):
        rows = labels == label
        out[str(label)] = {"coverage": float(np.mean(inside[rows])), "n": float(rows.sum())}
    return out


def cross_fitted_ece(arrays, folds: np.ndarray, *, common: dict[str, Any], n_levels: int = N_CONFIDENCE_LEVELS) -> dict[str, Any]:
    """The papers' k-fold protocol (Glushkova et al., 2021, §5.1) on one split: ECE per LP, mean over folds.

    For each fold: standardise and fit the papers' affine ECE calibration on the other k-1 folds,
    evaluate the ECE on the held-out fold per LP.  Returns ``{"per_lp": {lp: mean ECE}, "macro_avg":
    ..., "n_folds": k}``; an LP with fewer than 2 rows in a fold skips that fold.  Comparable with
    the papers' published ECEs, which are in-split -- unlike the fixed dev -> test ECE.
    """
    per_lp: dict[str, list[float]] = {}
    for fold in np.unique(folds):
        held_out = folds == fold
        _, (fit_h, fit_mu, fit_sigma), (h, m, s) = standardize(arrays, ~held_out, held_out, common)
        calibrator = AffineVarianceCalibrator(**common, n_levels=n_levels).fit(fit_h, fit_mu, fit_sigma, lp=arrays.lp[~held_out])
        lp = arrays.lp[held_out]
        sigma = calibrator.transform(m, s, lp)
        for name in sorted(set(lp.tolist())):
            rows = lp == name
            if rows.sum() >= 2:
                per_lp.setdefault(name, []).append(expected_calibration_error(h[rows], m[rows], sigma[rows], n_levels))
    means = {name: float(np.mean(v)) for name, v in sorted(per_lp.items())}
    return {"per_lp": means, "macro_avg": float(np.mean(list(means.values()))), "n_folds": int(np.unique(folds).size)}
