"""Metrics of the served predictive distribution, read only through its protocol.

What a user receives for a segment is the served calibration's distribution of the human score:
its centre (mu), its central intervals at any level and its CDF (the risk P(Q <= chi)), on the
human scale and clipped to the scale's bounds.  Every number here is computed from those three
calls of a :class:`PredictiveDistribution` (the model's :class:`uamt.serving.model_calibration.Calibration`
loaded from its artifact), so a non-Gaussian served distribution (Mondrian or signed conformal) is
scored as it is served, never through a "Gaussian-equivalent" sigma.

Quantities (per LP, macro-averaged over LPs as ``avg``):

* ``pps`` -- Pearson of human and served mu.
* ``coverage@g`` / ``width@g`` / ``miss_below@g`` / ``miss_above@g`` -- of the served central
  interval at level g (``coverage_gamma`` and the ``report_gammas``); a human score *on a bound of
  the scale* counts with the shares of the served distribution's point mass there that fall below,
  inside and above the interval's probability band (:func:`randomised_shares`).  Clipping to the
  scale puts an atom at each bound (at MQM 0 the mass :math:`1 - F(0^-)`), and a closed interval
  that reaches an atom covers every row on it -- more than g exactly when the atom is right.  The
  randomised PIT (Czado, Gneiting & Held 2009) is uniform for a calibrated forecast, atom or not.
  Rows strictly inside the scale count as the interval says, unless the served distribution has
  point masses inside the scale too (the isotonic one): then every row is randomised within the
  mass at its score (``cdf_at_human``).  ``closed_coverage@g``: the share of
  human scores inside the closed interval (what a user sees; at least g for a calibrated forecast).
* ``ece`` -- :math:`\\frac1M\\sum_b |\\mathrm{acc}(\\gamma_b) - \\gamma_b|` over M = ``n_levels``
  levels of ``numpy.linspace(0, 1, M)`` (the papers' grid), with the coverage above at each level;
  its sampling floor is that of a continuous forecast.  ``ece_interval``: the same with the closed
  intervals (the papers' reading; equal to ``ece`` when no human score lies on a bound).
* ``top_probability`` / ``top_frequency`` -- the served probability of the top of the scale (MQM 0,
  no error), mean over rows, and the share of human scores there.
* ``crps`` -- the continuous ranked probability score through the quantile decomposition
  :math:`\\mathrm{CRPS}(F, y) = 2\\int_0^1 \\rho_p(y - F^{-1}(p))\\,dp`,
  :math:`\\rho_p(u) = u\\,(p - \\mathbb 1[u < 0])`, on K = ``n_quantiles`` mid-point levels
  :math:`p_k = (k - 1/2)/K` (human-score units; lower is better).  Quantiles are clipped to the
  scale's bounds (the distribution users get); a level beyond the calibration's reach takes the
  row's outermost finite quantile (:func:`clamp_tails`).
* ``sd`` -- the served distribution's standard deviation from the same quantiles (what the spread
  of the served distribution is; ``sharpness`` is the mean served variance).
* ``ups`` -- Pearson of :math:`|q^* - \\mu|` and the served ``sd``; ``ups_raw`` -- the same with the
  model's own raw sigma (what the method contributes before calibration).
* ``ence`` -- ENCE (Levi et al.) of the served sd; ``ence_raw`` -- of the raw sigma mapped to the
  human scale by the standardiser alone (no calibration).
* ``nll`` -- Gaussian NLL where the served distribution is Gaussian, else None (use ``crps``).
* ``low_score_coverage`` -- coverage at ``coverage_gamma`` of rows with human <= ``low_score_threshold``.
* ``cells`` -- coverage at ``coverage_gamma`` in every LP x quintile cell of the served sd and of
  the served mu, with its n, a document-clustered standard error and the worst gap.
* ``risk`` -- for each threshold chi: Brier score, and predicted vs observed P(Q <= chi) per decile
  of the predicted risk (the largest gap is ``max_gap``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from uamt.core.stats import pearson_or_none
from uamt.uncertainty.metrics import (
    N_CONFIDENCE_LEVELS,
    confidence_levels,
    effective_sample_size,
    expected_normalized_calibration_error,
    quantile_groups,
)


class PredictiveDistribution(Protocol):
    """What a served calibration offers (raw model ``mu``, ``sigma``: shape [n] on the model's scale).

    ``center`` returns the served mu on the human scale, ``apply`` the served ``(mu, sigma)``; ``interval`` the central
    interval at level ``gamma``; ``risk`` P(Q <= threshold), the threshold a scalar or one per row
    (shape [n]); ``is_gaussian`` whether the served
    distribution is the Gaussian N(mu, sigma^2) (then ``nll`` is defined).
    """

    def center(self, mu, sigma, lp=None, n_refs=None) -> np.ndarray: ...

    def apply(self, mu, sigma, lp=None, n_refs=None) -> tuple[np.ndarray, np.ndarray]: ...

    def interval(self, mu, sigma, gamma: float, lp=None, mode: str = ..., n_refs=None) -> tuple[np.ndarray, np.ndarray]: ...

    def risk(self, mu, sigma, threshold, lp=None, n_refs=None) -> np.ndarray: ...

    def raw_sigma_on_human_scale(self, mu, sigma, lp=None) -> np.ndarray: ...

    @property
    def is_gaussian(self) -> bool: ...


@dataclass(frozen=True)
class ServedSettings:
    """How the served distribution is measured (the ``evaluate:`` section provides the values)."""

    coverage_gamma: float = 0.9
    report_gammas: tuple[float, ...] = (0.8, 0.9, 0.95)
    n_levels: int = N_CONFIDENCE_LEVELS
    n_quantiles: int = 100
    low_score_threshold: float | None = -5.0
    risk_thresholds: tuple[float, ...] = (-1.0, -5.0, -10.0)
    n_risk_bins: int = 10
    n_cell_groups: int = 5
    cell_tolerance: float = 0.05


@dataclass
class ServedRows:
    """Everything the served distribution says about each row, shape [n] (or [n, ...]).

    ``center`` the served mu; ``intervals`` level -> (lower, upper) for every ECE, report and
    quantile level; ``probs`` / ``quantiles`` the mid-point levels [K] and quantiles [n, K];
    ``risk`` chi -> P(Q <= chi); ``raw_sigma`` the model's own sigma and ``raw_sigma_human`` the
    same on the human scale (standardiser only); ``gaussian_sigma`` the served sigma where the
    distribution is Gaussian (else None); ``bounds`` the scale's (low, high) the answers are clipped
    to and ``cdf_at_bounds`` [n, 2] the served CDF at the bottom and just below the top,
    :math:`(F(low), F(high^-))`: the clipped distribution's atoms are :math:`F(low)` at low and
    :math:`1 - F(high^-)` at high (None without bounds); ``cdf_at_human`` [n, 2] the served CDF
    just below and at each row's human score, :math:`(F(y^-), F(y))`, where the distribution has
    point masses inside the scale (else None: inside the scale it is continuous).
    """

    center: np.ndarray
    intervals: dict[float, tuple[np.ndarray, np.ndarray]]
    probs: np.ndarray
    quantiles: np.ndarray
    risk: dict[float, np.ndarray]
    raw_sigma: np.ndarray
    raw_sigma_human: np.ndarray
    gaussian_sigma: np.ndarray | None
    bounds: tuple[float, float] | None = None
    cdf_at_bounds: np.ndarray | None = None
    cdf_at_human: np.ndarray | None = None

    def take(self, rows: np.ndarray) -> ServedRows:
        """The rows ``rows`` (a boolean mask or indices)."""
        return ServedRows(
            center=self.center[rows],
            intervals={g: (lo[rows], hi[rows]) for g, (lo, hi) in self.intervals.items()},
            probs=self.probs,
            quantiles=self.quantiles[rows],
            risk={chi: r[rows] for chi, r in self.risk.items()},
            raw_sigma=self.raw_sigma[rows],
            raw_sigma_human=self.raw_sigma_human[rows],
            gaussian_sigma=None if self.gaussian_sigma is None else self.gaussian_sigma[rows],
            bounds=self.bounds,
            cdf_at_bounds=None if self.cdf_at_bounds is None else self.cdf_at_bounds[rows],
            cdf_at_human=None if self.cdf_at_human is None else self.cdf_at_human[rows],
        )

    @staticmethod
    def stack(parts: Sequence[tuple[np.ndarray, ServedRows]], n: int) -> ServedRows:
        """One :class:`ServedRows` of ``n`` rows from ``(row indices, part)`` pieces that cover them
        (the out-of-fold rows of a cross-fitting, each answered by its own fold's calibration)."""
        first = parts[0][1]

        def fill(get, shape=()):
            out = np.empty((n, *shape))
            for index, part in parts:
                out[index] = get(part)
            return out

        gaussian = all(part.gaussian_sigma is not None for _, part in parts)
        at_bounds = all(part.cdf_at_bounds is not None for _, part in parts)
        at_human = all(part.cdf_at_human is not None for _, part in parts)
        return ServedRows(
            center=fill(lambda p: p.center),
            intervals={
                g: (fill(lambda p, g=g: p.intervals[g][0]), fill(lambda p, g=g: p.intervals[g][1]))
                for g in first.intervals
            },
            probs=first.probs,
            quantiles=fill(lambda p: p.quantiles, first.quantiles.shape[1:]),
            risk={chi: fill(lambda p, chi=chi: p.risk[chi]) for chi in first.risk},
            raw_sigma=fill(lambda p: p.raw_sigma),
            raw_sigma_human=fill(lambda p: p.raw_sigma_human),
            gaussian_sigma=fill(lambda p: p.gaussian_sigma) if gaussian else None,
            bounds=first.bounds,
            cdf_at_bounds=fill(lambda p: p.cdf_at_bounds, (2,)) if at_bounds else None,
            cdf_at_human=fill(lambda p: p.cdf_at_human, (2,)) if at_human else None,
        )


def clamp_tails(quantiles: np.ndarray) -> np.ndarray:
    """``quantiles`` (shape [n, K], K even, levels symmetric about the median) with every infinite
    one -- a level beyond the calibration's reach, unbounded -- replaced by the row's nearest finite
    quantile towards the median: the served CDF says nothing beyond its outermost finite knot, so
    the CRPS and sd put the tail mass there (a lower bound on the spread, never an infinite one)."""
    out = np.array(quantiles, dtype=float, copy=True)
    k = out.shape[1]
    for j in range(k // 2 - 2, -1, -1):
        out[:, j] = np.where(np.isfinite(out[:, j]), out[:, j], out[:, j + 1])
    for j in range(k // 2 + 1, k):
        out[:, j] = np.where(np.isfinite(out[:, j]), out[:, j], out[:, j - 1])
    return out


def _levels(settings: ServedSettings) -> tuple[set[float], np.ndarray]:
    """Every interval level the metrics read, and the K mid-point quantile levels."""
    k = int(settings.n_quantiles)
    if k < 2 or k % 2:
        raise ValueError(f"n_quantiles={settings.n_quantiles!r} must be an even number >= 2")
    probs = (np.arange(k) + 0.5) / k
    levels = {float(g) for g in confidence_levels(settings.n_levels)}
    levels |= {float(settings.coverage_gamma), *map(float, settings.report_gammas)}
    levels |= {_quantile_level(p) for p in probs[: k // 2]}
    return levels, probs


def _quantile_level(p: float) -> float:
    return round(float(1.0 - 2.0 * p), 12)


def served_rows(
    dist: PredictiveDistribution,
    mu,
    sigma,
    lp,
    *,
    n_refs=None,
    bounds=None,
    settings: ServedSettings | None = None,
    human=None,
) -> ServedRows:
    """Ask the served distribution ``dist`` everything the metrics need about each row.

    ``mu``, ``sigma`` (shape [n]) are the model's raw output and ``lp`` (shape [n]) the rows'
    language pairs; ``bounds`` the scale's (low, high): the served mu, intervals and quantiles are
    clipped to them and the risk is that of the clipped distribution (1 at or above the top of the
    scale, 0 below its bottom), as users get them.  Levels 0 and 1 are the empty interval at mu
    and the whole line.  ``human`` (shape [n], optional): the rows' human scores, at which the CDF
    is read (``cdf_at_human``) where ``dist`` has point masses inside the scale
    (``dist.has_interior_atoms``).
    """
    settings = settings or ServedSettings()
    mu = np.asarray(mu, dtype=float)
    sigma = np.asarray(sigma, dtype=float)
    lp = np.asarray(lp, dtype=object)
    center = np.asarray(dist.center(mu, sigma, lp, n_refs=n_refs), dtype=float)
    levels, probs = _levels(settings)
    mode = "gaussian" if dist.is_gaussian else "conformal"
    intervals = {}
    inner = intervals_at(dist, mu, sigma, [g for g in sorted(levels) if 0.0 < g < 1.0], lp, mode, n_refs=n_refs)
    for gamma in sorted(levels):
        if gamma <= 0.0:
            lower, upper = center, center
        elif gamma >= 1.0:
            lower, upper = np.full(mu.size, -np.inf), np.full(mu.size, np.inf)
        else:
            lower, upper = inner[gamma]
        if bounds is not None:
            lower, upper = np.clip(lower, *bounds), np.clip(upper, *bounds)
        intervals[gamma] = (np.asarray(lower, dtype=float), np.asarray(upper, dtype=float))
    if bounds is not None:
        center = np.clip(center, *bounds)
    k = probs.size
    quantiles = np.empty((mu.size, k))
    for j in range(k // 2):
        quantiles[:, j], quantiles[:, k - 1 - j] = intervals[_quantile_level(probs[j])]
    quantiles = clamp_tails(quantiles)
    cdf_at_bounds = None
    if bounds is not None:
        # F(low) and F(high^-): the CDF just below the top, so that a served atom *at* the top (whose
        # risk there is 1) shows as the mass 1 - F(high^-).
        below_top = float(np.nextafter(float(bounds[1]), -np.inf))
        cdf_at_bounds = np.column_stack(
            [np.asarray(dist.risk(mu, sigma, t, lp, n_refs=n_refs), dtype=float) for t in (float(bounds[0]), below_top)]
        )
    risk = {float(chi): served_risk(dist, mu, sigma, float(chi), lp, n_refs=n_refs, bounds=bounds) for chi in settings.risk_thresholds}
    cdf_at_human = None
    if human is not None and getattr(dist, "has_interior_atoms", False):
        cdf_at_human = _cdf_at(dist, mu, sigma, lp, np.asarray(human, dtype=float), n_refs, bounds)
    # NLL is the Gaussian's only where the served distribution is that Gaussian (not clipped).
    gaussian = dist.is_gaussian and bounds is None
    return ServedRows(
        center=center,
        intervals=intervals,
        probs=probs,
        quantiles=quantiles,
        risk=risk,
        raw_sigma=sigma,
        raw_sigma_human=np.asarray(dist.raw_sigma_on_human_scale(mu, sigma, lp), dtype=float),
        gaussian_sigma=np.asarray(dist.apply(mu, sigma, lp, n_refs=n_refs)[1], dtype=float) if gaussian else None,
        bounds=None if bounds is None else (float(bounds[0]), float(bounds[1])),
        cdf_at_bounds=cdf_at_bounds,
        cdf_at_human=cdf_at_human,
    )


def _cdf_at(dist, mu, sigma, lp, human: np.ndarray, n_refs, bounds) -> np.ndarray:
    """[n, 2]: :math:`(F(y^-), F(y))` of the served (clipped) distribution at each row's score y:
    1 at or above the top of the scale, 0 below its bottom, as :func:`served_rows`' risk.  Two calls
    of the risk, each with one threshold per row."""
    refs = None if n_refs is None else np.broadcast_to(np.asarray(n_refs), human.shape)
    out = np.column_stack([clipped_risk(dist, mu, sigma, lp, chi, refs, bounds) for chi in (np.nextafter(human, -np.inf), human)])
    out[:, 1] = np.maximum(out[:, 1], out[:, 0])
    return out


def lattice_threshold(threshold, lattice: dict[str, float] | None):
    """Where the served risk :math:`P(Q \\le \\chi)` reads the served CDF F on a score lattice.

    MQM scores are weighted error counts on whole points (``lattice = {"step": 1, "offset": ½}``).
    A continuous F calibrated on such scores with the randomised PIT passes through the middle of
    each step of the scores' CDF, so :math:`F(\\chi)` at a whole :math:`\\chi` reads
    :math:`P(Q < \\chi) + \\tfrac12 P(Q = \\chi)` (``python benchmarks/lattice_risk.py``).  The
    served risk is read instead at

    .. math:: \\chi' = \\lfloor \\chi / s \\rfloor\\, s + \\delta

    (step s, offset δ in [0, s)): the risk of the served distribution rounded onto the lattice.
    ``lattice`` empty or None: :math:`\\chi` itself (a continuous scale).  Shape as ``threshold``.
    """
    if not lattice:
        return threshold
    step, offset = float(lattice["step"]), float(lattice["offset"])
    chi = np.asarray(threshold, dtype=float)
    # a whole chi divided by the step may land a rounding error below its integer
    read = np.floor(chi / step + 1e-9) * step + offset
    return float(read) if np.ndim(read) == 0 else read


#: Rows (rows x levels) :func:`intervals_at` asks a distribution about in one call.
ROWS_PER_CALL = 200_000


def intervals_at(dist, mu, sigma, gammas, lp, mode: str, *, n_refs=None) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """``{gamma: dist.interval(mu, sigma, gamma, lp, mode, n_refs)}`` for each level of ``gammas``
    (each bound shape [n]).

    Where ``dist`` takes one level per row (``dist.takes_row_levels``: a conformal distribution, or
    one with a point mass at the top), the rows are stacked once per level and asked in one call
    (chunks of at most :data:`ROWS_PER_CALL` rows): the same elementwise answers, without a
    hundred calls' fixed costs (the served distribution's standardisation, tempering and
    rearrangement grid, each asked per call).  Otherwise level by level.
    """
    gammas = [float(g) for g in gammas]
    if not getattr(dist, "takes_row_levels", False) or len(gammas) < 2:
        return {g: dist.interval(mu, sigma, g, lp, mode, n_refs=n_refs) for g in gammas}
    mu = np.asarray(mu, dtype=float)
    n = mu.size
    sigma = np.broadcast_to(np.asarray(sigma, dtype=float), (n,))
    lps = None if lp is None else np.full(n, lp, dtype=object) if isinstance(lp, str) else np.asarray(lp, dtype=object)
    refs = None if n_refs is None else np.broadcast_to(np.asarray(n_refs), (n,))
    out = {}
    per_call = max(1, ROWS_PER_CALL // max(n, 1))
    for start in range(0, len(gammas), per_call):
        chunk = gammas[start : start + per_call]
        k = len(chunk)
        lower, upper = dist.interval(
            np.tile(mu, k), np.tile(sigma, k), np.repeat(chunk, n), None if lps is None else np.tile(lps, k), mode,
            n_refs=None if refs is None else np.tile(refs, k),
        )
        for j, gamma in enumerate(chunk):
            out[gamma] = (np.asarray(lower[j * n : (j + 1) * n]), np.asarray(upper[j * n : (j + 1) * n]))
    return out


def served_risk(dist, mu, sigma, chi, lp, *, n_refs=None, bounds=None) -> np.ndarray:
    """The risk users are served, :math:`P(Q \\le \\chi)`, shape [n]: the CDF of ``dist`` read on the
    score's lattice where ``dist`` holds one (its ``risk_lattice``; :func:`lattice_threshold`), else
    at ``chi``; with ``bounds``, that of the distribution clipped to the scale (:func:`clipped_risk`).

    The one reading of the served risk: the metrics (:func:`served_rows`), the experiments'
    columns (:func:`served_columns`) and the served models
    (:meth:`uamt.serving.model_calibration.Calibration.served_risk`) all call it.  ``chi``: one
    threshold, or one per row.  The scale's bounds are whole points, so ``chi`` and its lattice
    reading fall on the same side of each of them.
    """
    return clipped_risk(dist, mu, sigma, lp, lattice_threshold(chi, getattr(dist, "risk_lattice", None)), n_refs, bounds)


def clipped_risk(dist, mu, sigma, lp, chi, n_refs, bounds) -> np.ndarray:
    """P(Q <= chi) of the served distribution clipped to the scale's ``bounds`` (1 at or above the
    top, 0 below the bottom), shape [n]; ``chi`` a scalar or one threshold per row."""
    values = np.asarray(dist.risk(mu, sigma, chi, lp, n_refs=n_refs), dtype=float)
    if bounds is None:
        return values
    return np.where(chi >= bounds[1], 1.0, np.where(chi < bounds[0], 0.0, values))


def served_interval(dist: PredictiveDistribution, mu, sigma, lp, gamma: float, *, bounds=None, n_refs=None):
    """The served central interval at ``gamma`` (each shape [n]), clipped to the scale's ``bounds`` as
    users get it."""
    lower, upper = dist.interval(mu, sigma, gamma, lp, "gaussian" if dist.is_gaussian else "conformal", n_refs=n_refs)
    if bounds is not None:
        lower, upper = np.clip(lower, *bounds), np.clip(upper, *bounds)
    return lower, upper


def served_coverage(dist: PredictiveDistribution, mu, sigma, lp, human, gamma: float, *, bounds=None, n_refs=None) -> np.ndarray:
    """Per row, shape [n]: the share of the row's randomised PIT inside the served central interval at
    ``gamma`` -- coverage at one level exactly as the metrics count it (:func:`randomised_shares`,
    with every point mass of the clipped distribution, at the bounds or inside the scale), without
    the rest of :func:`served_rows`.  Its mean is ``coverage@gamma`` of :func:`served_metrics`.

    ``mu``, ``sigma``, ``lp``, ``human``: shape [n] (raw model output, language pairs, human scores);
    ``bounds``: the scale's (low, high).
    """
    mu = np.asarray(mu, dtype=float)
    sigma = np.asarray(sigma, dtype=float)
    lp = np.asarray(lp, dtype=object)
    human = np.asarray(human, dtype=float)
    lower, upper = served_interval(dist, mu, sigma, lp, float(gamma), bounds=bounds, n_refs=n_refs)
    # F(y^-), F(y) at every score: at a bound this is the clipped mass there, as cdf_at_bounds reads it
    cdf = _cdf_at(dist, mu, sigma, lp, human, n_refs, bounds)
    return randomised_shares(human, float(gamma), lower, upper, cdf_at_human=cdf)[1]


def served_columns(
    calibration, mu, sigma, lp, *, confidence: float, chi: float, bounds=None, n_refs=None
) -> pd.DataFrame:
    """The served ``mu, lower, upper, risk`` of raw model output (shape [n] each) under a model's
    calibration (:class:`uamt.serving.model_calibration.Calibration`), clipped to the scale's
    ``bounds`` as :func:`uamt.serving.calibrated_predictor.clip_to_scale` serves them (risk 1 for chi at or above
    the top of the scale, 0 below its bottom; otherwise read on the score's lattice where the
    calibration holds one: :func:`served_risk`, as ``uamt score`` serves it)."""
    mu = np.asarray(mu, dtype=float)
    sigma = np.asarray(sigma, dtype=float)
    center = calibration.center(mu, sigma, lp, n_refs=n_refs)
    lower, upper = served_interval(calibration, mu, sigma, lp, confidence, bounds=bounds, n_refs=n_refs)
    risk = served_risk(calibration, mu, sigma, float(chi), lp, n_refs=n_refs, bounds=bounds)
    if bounds is not None:
        center = np.clip(center, *bounds)
    return pd.DataFrame({"mu": center, "lower": lower, "upper": upper, "risk": risk})


def quantile_crps(human, probs, quantiles) -> np.ndarray:
    """CRPS per row from quantiles, shape [n]: :math:`2\\,\\overline{\\rho_{p_k}(y - q_k)}` over the levels.

    Parameters
    ----------
    human : array_like, shape [n]
    probs : array_like, shape [K]
        Evenly spaced mid-point levels in (0, 1).
    quantiles : array_like, shape [n, K]
        The predictive quantiles at ``probs``, non-decreasing along K.
    """
    human = np.asarray(human, dtype=float)[:, None]
    quantiles = np.asarray(quantiles, dtype=float)
    u = human - quantiles
    loss = u * (np.asarray(probs, dtype=float)[None, :] - (u < 0))
    return 2.0 * loss.mean(axis=1)


def row_crps(rows: ServedRows, human) -> np.ndarray:
    """CRPS of each row's served quantiles (:func:`quantile_crps`), shape [n]; NaN where a row's
    quantiles are not all finite (the rows every CRPS of :func:`served_metrics` leaves out)."""
    human = np.asarray(human, dtype=float)
    finite = np.all(np.isfinite(rows.quantiles), axis=1)
    out = np.full(human.shape, np.nan)
    out[finite] = quantile_crps(human[finite], rows.probs, rows.quantiles[finite])
    return out


def randomised_shares(human, gamma: float, lower, upper, bounds=None, cdf_at_bounds=None, cdf_at_human=None):
    """Shares of each row below, inside and above the central interval at level ``gamma``, with a
    human score on a bound of the scale randomised within the served distribution's point mass there.

    A row strictly inside the scale counts as the clipped interval ``[lower, upper]`` says (a share of
    0 or 1).  A row *on* a bound, where the clipped served distribution has an atom, has probability
    integral transform (PIT) anywhere in :math:`[F(y^-), F(y)]`: at the top bound :math:`[F(high^-), 1]`,
    at the bottom :math:`[0, F(low)]` (``cdf_at_bounds``).  With the PIT drawn uniformly from it, the
    shares are the parts of that range below, inside and above the band
    :math:`[(1-\\gamma)/2, (1+\\gamma)/2]` of the central interval, e.g. inside

    .. math:: \\frac{|[F(y^-), F(y)] \\cap [(1-\\gamma)/2, (1+\\gamma)/2]|}{F(y) - F(y^-)}

    (where the atom is empty, where :math:`F(y)` falls).  For a calibrated forecast the randomised
    PIT is uniform (Czado, Gneiting & Held 2009), so coverage is :math:`\\gamma` in expectation and each
    miss :math:`(1-\\gamma)/2`, atom or not; a closed interval that reaches the atom covers every row on
    it, so its coverage exceeds :math:`\\gamma` exactly where the forecast is right.

    Parameters
    ----------
    human, lower, upper : array_like, shape [n]
        Human scores and the clipped interval at ``gamma``.
    gamma : float
        Level in [0, 1].
    bounds : (float, float), optional
        The scale's (low, high); without them (or ``cdf_at_bounds``) the interval decides every row.
    cdf_at_bounds : array_like, shape [n, 2], optional
        :math:`(F(low), F(high^-))` per row: the served CDF at the bottom and just below the top.
    cdf_at_human : array_like, shape [n, 2], optional
        :math:`(F(y^-), F(y))` per row at its score y, for a distribution with point masses inside
        the scale: every row with :math:`F(y) > F(y^-)` is randomised within that mass, wherever y is.

    Returns
    -------
    (below, inside, above) : tuple of numpy.ndarray, each shape [n]
        Shares in [0, 1] summing to 1 per row.
    """
    human = np.asarray(human, dtype=float)
    below = (human < lower).astype(float)
    above = (human > upper).astype(float)
    inside = 1.0 - below - above
    ranges = []
    if bounds is not None and cdf_at_bounds is not None:
        cdf = np.asarray(cdf_at_bounds, dtype=float)
        ranges += [(human == bounds[0], np.zeros(human.size), cdf[:, 0]), (human == bounds[1], cdf[:, 1], np.ones(human.size))]
    if cdf_at_human is not None:
        at = np.asarray(cdf_at_human, dtype=float)
        ranges.append((at[:, 1] - at[:, 0] > 1e-12, at[:, 0], at[:, 1]))
    band_lo, band_hi = (1.0 - gamma) / 2.0, (1.0 + gamma) / 2.0
    for rows, pit_lo, pit_hi in ranges:
        if not rows.any():
            continue
        lo, hi = pit_lo[rows], pit_hi[rows]
        mass = hi - lo
        atom = mass > 1e-12
        safe = np.where(atom, mass, 1.0)
        share_below = np.clip(np.minimum(hi, band_lo) - lo, 0.0, None) / safe
        share_above = np.clip(hi - np.maximum(lo, band_hi), 0.0, None) / safe
        below[rows] = np.where(atom, share_below, (hi < band_lo).astype(float))
        above[rows] = np.where(atom, share_above, (hi > band_hi).astype(float))
        inside[rows] = 1.0 - below[rows] - above[rows]
    return below, inside, above


def _cells(inside: np.ndarray, values: np.ndarray, docs: np.ndarray, n_groups: int, gamma: float) -> dict[str, Any]:
    """Coverage in the quantile groups of ``values`` (one LP): n, coverage, clustered SE, gap."""
    if values.size < n_groups:
        return {"cells": {}, "worst_gap": None}
    groups = quantile_groups(values, n_groups)
    cells = {}
    for g in range(n_groups):
        rows = groups == g
        n = int(rows.sum())
        coverage = float(np.mean(inside[rows]))
        n_eff = effective_sample_size(inside[rows].astype(float), docs[rows]) if n > 1 else 1.0
        se = math.sqrt(gamma * (1.0 - gamma) / max(n_eff, 1.0))
        cells[f"q{g + 1}"] = {"n": n, "n_eff": n_eff, "coverage": coverage, "se": se, "gap": coverage - gamma}
    worst = max(cells.values(), key=lambda c: abs(c["gap"]))
    return {"cells": cells, "worst_gap": worst["gap"]}


def risk_reliability(risk: np.ndarray, event: np.ndarray, n_bins: int, docs: np.ndarray | None = None) -> dict[str, Any]:
    """Brier score and predicted vs observed frequency per equal-count bin of the predicted risk.

    With ``docs`` (shape [n]) each bin also gets the document-clustered standard error of its observed
    frequency, :math:`\\sqrt{\\bar p (1 - \\bar p) / n_{eff}}` with :math:`\\bar p` the bin's mean
    predicted risk and :math:`n_{eff}` the effective size of its residuals ``event - risk``
    clustered by document (:func:`effective_sample_size`): the sampling band of a bin whose risk
    is calibrated.
    """
    brier = float(np.mean((risk - event) ** 2))
    n_bins = min(int(n_bins), risk.size)
    groups = quantile_groups(risk, n_bins) if n_bins >= 1 else np.zeros(risk.size, dtype=int)
    bins = []
    for b in range(n_bins):
        rows = groups == b
        predicted = float(risk[rows].mean())
        item = {"n": int(rows.sum()), "predicted": predicted, "observed": float(event[rows].mean())}
        if docs is not None:
            n_eff = effective_sample_size(event[rows] - risk[rows], docs[rows]) if rows.sum() > 1 else 1.0
            item["n_eff"] = n_eff
            item["se"] = math.sqrt(max(predicted * (1.0 - predicted), 0.0) / max(n_eff, 1.0))
        bins.append(item)
    gaps = [abs(b["observed"] - b["predicted"]) for b in bins]
    return {
        "brier": brier,
        "base_rate": float(event.mean()),
        "max_gap": max(gaps) if gaps else None,
        "bins": bins,
    }


def _lp_metrics(rows: ServedRows, human: np.ndarray, docs: np.ndarray, settings: ServedSettings) -> dict[str, Any]:
    """Every served metric of the rows of one LP (``rows`` and arrays of shape [n])."""
    gamma = settings.coverage_gamma
    center, quantiles = rows.center, rows.quantiles
    finite = np.all(np.isfinite(quantiles), axis=1)
    sd = np.where(finite, quantiles.std(axis=1), np.inf)
    abs_err = np.abs(human - center)

    def shares(level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lower, upper = rows.intervals[float(level)]
        return randomised_shares(human, float(level), lower, upper, rows.bounds, rows.cdf_at_bounds, rows.cdf_at_human)

    def closed(level: float) -> np.ndarray:
        lower, upper = rows.intervals[float(level)]
        return (human >= lower) & (human <= upper)

    out: dict[str, Any] = {"n": int(human.size), "pps": pearson_or_none(human, center)}
    for level in sorted({gamma, *settings.report_gammas}):
        lower, upper = rows.intervals[float(level)]
        below, covered_share, above = shares(level)
        tag = f"{level:g}"
        out[f"coverage@{tag}"] = float(np.mean(covered_share))
        out[f"width@{tag}"] = float(np.mean(upper - lower))
        out[f"miss_below@{tag}"] = float(np.mean(below))
        out[f"miss_above@{tag}"] = float(np.mean(above))
        out[f"closed_coverage@{tag}"] = float(np.mean(closed(level)))
    levels = confidence_levels(settings.n_levels)
    coverage = np.array([np.mean(shares(g)[1]) for g in levels])
    closed_coverage = np.array([np.mean(closed(g)) for g in levels])
    out["ece"] = float(np.mean(np.abs(coverage - levels)))
    out["ece_interval"] = float(np.mean(np.abs(closed_coverage - levels)))
    if rows.cdf_at_bounds is not None and rows.bounds is not None:
        # The served probability of the top of the scale (MQM 0: no error) against its frequency.
        out["top_probability"] = float(np.mean(1.0 - rows.cdf_at_bounds[:, 1]))
        out["top_frequency"] = float(np.mean(human == rows.bounds[1]))
    out["crps"] = float(np.mean(row_crps(rows, human)[finite])) if finite.any() else None
    out["crps_rows"] = int(finite.sum())
    out["sharpness"] = float(np.mean(sd[finite] ** 2)) if finite.any() else None
    out["sd"] = float(np.mean(sd[finite])) if finite.any() else None
    out["ups"] = pearson_or_none(abs_err[finite], sd[finite])
    out["ups_raw"] = pearson_or_none(abs_err, rows.raw_sigma)
    positive = finite & (sd > 0)
    out["ence"] = (
        expected_normalized_calibration_error(human[positive], center[positive], sd[positive], 5)
        if positive.sum() >= 5
        else None
    )
    raw = rows.raw_sigma_human
    # A point model's own sigma is one constant: mapped to the human scale it only picks up rounding
    # noise, and an ENCE binned by that noise is a number about nothing (ups_raw is None there too).
    out["ence_raw"] = (
        expected_normalized_calibration_error(human, center, raw, 5)
        if human.size >= 5 and np.all(raw > 0) and np.std(rows.raw_sigma) > 0
        else None
    )
    low10 = float(np.quantile(sd[finite], 0.1)) if finite.sum() >= 10 else 0.0
    out["sigma_p90_p10"] = float(np.quantile(sd[finite], 0.9) / low10) if low10 > 0 else None
    g_sigma = rows.gaussian_sigma
    out["nll"] = (
        float(np.mean(0.5 * np.log(2 * np.pi * g_sigma**2) + (human - center) ** 2 / (2 * g_sigma**2)))
        if g_sigma is not None and np.all(g_sigma > 0)
        else None
    )
    covered = shares(gamma)[1]
    if settings.low_score_threshold is not None:
        low = human <= settings.low_score_threshold
        out["low_score_coverage"] = float(np.mean(covered[low])) if low.any() else None
        out["low_score_n"] = int(low.sum())
    spread = np.where(finite, sd, np.max(sd[finite]) if finite.any() else 0.0)
    out["cells"] = {
        "sd": _cells(covered, spread, docs, settings.n_cell_groups, gamma),
        "mu": _cells(covered, center, docs, settings.n_cell_groups, gamma),
    }
    out["risk"] = {
        f"{chi:g}": risk_reliability(risk, (human <= chi).astype(float), settings.n_risk_bins, docs)
        for chi, risk in rows.risk.items()
    }
    out["reliability"] = {
        "expected": levels.tolist(),
        "observed": coverage.tolist(),
        "observed_closed": closed_coverage.tolist(),
    }
    return out


#: Per-LP keys averaged over LPs into ``avg`` (numbers only), besides coverage/width/miss.
AVERAGED = (
    "pps", "ups", "ups_raw", "ece", "ece_interval", "crps", "sharpness", "sd", "ence", "ence_raw", "nll", "sigma_p90_p10",
    "low_score_coverage", "top_probability", "top_frequency",
)


def served_metrics(rows: ServedRows, human, lp, *, docs=None, settings: ServedSettings | None = None) -> dict[str, Any]:
    """Every metric of the served distribution on a labelled set, per LP and averaged over LPs.

    Parameters
    ----------
    rows : ServedRows
        What the served distribution says about each row (:func:`served_rows`).
    human : array_like, shape [n]
        Human scores.
    lp : array_like of str, shape [n]
    docs : array_like, shape [n], optional
        Document of each row (clusters of the cells' standard errors; without it every row is its
        own cluster).

    Returns
    -------
    dict
        ``{lp: {...}, "avg": {...}, "worst_cells": {...}}`` (see the module docstring);
        ``worst_cells`` holds the worst LP x sd-quintile and LP x mu-quintile cells over all LPs.
    """
    settings = settings or ServedSettings()
    human = np.asarray(human, dtype=float)
    lp = np.asarray(lp, dtype=object).astype(str)
    docs = np.arange(human.size).astype(str) if docs is None else np.asarray(docs, dtype=object).astype(str)
    if not (human.shape == lp.shape == docs.shape == rows.center.shape):
        raise ValueError(
            f"served_metrics: human {human.shape}, lp {lp.shape}, docs {docs.shape} and rows "
            f"{rows.center.shape} must have one entry per row"
        )
    out: dict[str, Any] = {}
    for name in sorted(set(lp.tolist())):
        mask = lp == name
        out[name] = _lp_metrics(rows.take(mask), human[mask], docs[mask], settings)
    lps = list(out)
    avg: dict[str, Any] = {"n": int(human.size)}
    keys = [*AVERAGED, *(k for k in out[lps[0]] if k.startswith(("coverage@", "width@", "miss_", "closed_coverage@")))] if lps else []
    for key in keys:
        values = [out[name][key] for name in lps if isinstance(out[name].get(key), (int, float))]
        avg[key] = float(np.mean(values)) if values else None
    out["avg"] = avg
    out["worst_cells"] = worst_cells(out, settings)
    return out


def worst_cells(per_lp: dict[str, Any], settings: ServedSettings) -> dict[str, Any]:
    """The worst LP x quintile cell of the served sd and of the served mu, and whether every cell is
    within ``cell_tolerance`` of ``coverage_gamma`` (a cell whose gap is within 1.96 standard errors
    of that tolerance is ``within_noise``)."""
    out = {}
    for kind in ("sd", "mu"):
        cells = [
            (lp, name, cell)
            for lp, m in per_lp.items()
            if lp not in ("avg", "worst_cells")
            for name, cell in m["cells"][kind]["cells"].items()
        ]
        if not cells:
            out[kind] = None
            continue
        lp, name, cell = max(cells, key=lambda c: abs(c[2]["gap"]))
        out[kind] = {
            "lp": lp,
            "cell": name,
            "coverage": cell["coverage"],
            "gap": cell["gap"],
            "se": cell["se"],
            "met": bool(abs(cell["gap"]) <= settings.cell_tolerance),
            "within_noise": bool(abs(cell["gap"]) <= settings.cell_tolerance + 1.96 * cell["se"]),
            "cells_outside": sum(abs(c[2]["gap"]) > settings.cell_tolerance for c in cells),
            "cells": len(cells),
        }
    return out


def summary_row(metrics: dict[str, Any], gamma: float = 0.9, chi: float = -5.0) -> dict[str, Any]:
    """The headline numbers of :func:`served_metrics` (for tables and the gate): averages over LPs
    and the worst cells."""
    avg = metrics["avg"]
    tag = f"{gamma:g}"
    worst = metrics.get("worst_cells") or {}
    risks = [m["risk"].get(f"{chi:g}") for lp, m in metrics.items() if lp not in ("avg", "worst_cells")]
    risks = [r for r in risks if r]
    return {
        "pps": avg.get("pps"),
        "crps": avg.get("crps"),
        "nll": avg.get("nll"),
        "ece": avg.get("ece"),
        "ece_interval": avg.get("ece_interval"),
        "ups": avg.get("ups"),
        "ups_raw": avg.get("ups_raw"),
        "ence": avg.get("ence"),
        "ence_raw": avg.get("ence_raw"),
        f"coverage@{tag}": avg.get(f"coverage@{tag}"),
        f"width@{tag}": avg.get(f"width@{tag}"),
        f"miss_below@{tag}": avg.get(f"miss_below@{tag}"),
        f"miss_above@{tag}": avg.get(f"miss_above@{tag}"),
        "low_score_coverage": avg.get("low_score_coverage"),
        "worst_sd_cell_gap": (worst.get("sd") or {}).get("gap"),
        "worst_mu_cell_gap": (worst.get("mu") or {}).get("gap"),
        f"risk_brier@{chi:g}": float(np.mean([r["brier"] for r in risks])) if risks else None,
        f"risk_max_gap@{chi:g}": max(r["max_gap"] for r in risks) if risks else None,
    }
