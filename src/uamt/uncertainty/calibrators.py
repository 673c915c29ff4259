"""Post-hoc calibration fitted on a development set and applied to any split.

Three small, JSON-serialisable calibrators (``to_dict()`` / ``from_dict()``), each fitted per
language pair (LP) with a global fit as fallback for LPs unseen on dev (``per_lp=False`` fits only
the global one):

* :class:`Standardizer` -- "q-hat and q* are standardized on the validation set"
  (Glushkova et al., 2021, §5.2).  As in the authors' code (deep-spin/UA_COMET
  ``evaluation/normalisation.py``), human scores are z-normalised with the dev mean and
  (population, ddof=0) standard deviation of the human scores, and every model sample with the
  mean and standard deviation of *all* the model's dev samples pooled.  With ``(mu, sigma)``
  inputs those pooled moments are ``mean(mu)`` and ``sqrt(var(mu) + mean(sigma**2))`` -- exactly
  the pooled-sample moments when sigma is the ddof=0 sample std of equally many samples.  That
  holds only where sigma *is* a spread of real samples (MC dropout, deep ensembles, the epistemic
  part of HTS+MCD): a method that predicts sigma (HTS, KL, DUP) has one sample per segment, its
  mu, so its pooled spread is ``std(mu)``; adding its predicted sigma would shrink mu towards the
  dev mean and lower its residuals (``sigma_from_samples=False``).
* :class:`FixedVarianceCalibrator` -- the baseline of §5.2: one variance for every segment,
  :math:`\\sigma^2_{fixed} = \\frac{1}{|D|}\\sum_j (q^*_j - \\hat\\mu_j)^2` (Eq. 6, the NLL minimiser).
* :class:`AffineVarianceCalibrator` -- §3.5: :math:`\\sigma^2 \\mapsto \\alpha\\sigma^2 + \\beta`,
  tuned to minimise the ECE (Eq. 2) on dev.  The authors grid-searched; here a deterministic
  coarse-to-fine grid over (alpha, beta) is used (see :func:`fit_affine_variance`).

All calibrators' ``transform(mu, sigma, lp)`` return a standard deviation (never a variance).
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from scipy.special import erf

from uamt.uncertainty.metrics import (
    N_CONFIDENCE_LEVELS,
    _as_1d,
    _check_same_length,
    confidence_levels,
    expected_calibration_error,
)

#: Key under which the global (all-LP) parameters are stored.
GLOBAL = "__global__"

#: Fewest dev rows of an LP for an LP-specific fit; smaller LPs use the global parameters.
DEFAULT_MIN_LP_ROWS = 50

_SERIAL_VERSION = 1

#: How :class:`Standardizer` maps mu onto the human z scale (``evaluate.mu_scaling``).
MU_SCALINGS = ("spread", "regression")

#: Range the ``regression`` slope of the human z-scores on the spread-standardised mu is clipped
#: to: below it mu would be all but constant (and a negative slope would reverse the ranking); a
#: slope above 1 is possible only where sample spread enters :math:`s_p` (mu then has less spread
#: than the human scores), and one above 2 would mean a mu far less dispersed than any model's.
MIN_MU_SLOPE, MAX_MU_SLOPE = 0.05, 2.0


def _as_lp(lp, n: int) -> np.ndarray:
    if lp is None:
        return np.full(n, GLOBAL, dtype=object)
    array = np.asarray(lp, dtype=object)
    if array.ndim != 1 or array.size != n:
        raise ValueError(f"lp must be 1-D with {n} entries, got shape {array.shape}")
    # The distinct values are few (LPs): check those, and look for the row only when one is bad.
    try:
        distinct = set(array.tolist())
    except TypeError:  # an unhashable value: it is reported below
        distinct = array.tolist()
    if any(not isinstance(value, str) or not value for value in distinct):
        i, value = next((i, v) for i, v in enumerate(array) if not isinstance(v, str) or not v)
        raise ValueError(f"lp[{i}] = {value!r} is not a non-empty string")
    return array


def lp_groups(lp: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``(name, rows)`` for each distinct value of ``lp`` (shape [n]), names sorted, ``rows`` a
    boolean mask of shape [n].  One hash pass and an integer comparison per LP: comparing a column
    of Python strings with each name costs ~0.16 ms per 13k rows and LP, and the served distribution
    asks for its LPs' rows a dozen times per interval."""
    lp = np.asarray(lp, dtype=object)
    codes, names = pd.factorize(lp)
    if codes.size and codes.min() < 0:  # a missing value (None, NaN), which factorize leaves out: compare each
        names = list(dict.fromkeys(lp.tolist()))
        return [(name, lp == name) for name in sorted(names, key=str)]
    names = names.tolist()
    return [(names[k], codes == k) for k in sorted(range(len(names)), key=lambda k: str(names[k]))]


def _encode(params: dict[str, float]) -> dict[str, float | None]:
    # Strict JSON has no Infinity: an infinite parameter (e.g. a conformal quantile from too few
    # dev rows) is written as null and read back as +inf.
    return {k: (float(v) if math.isfinite(v) else None) for k, v in params.items()}


def _decode(params: dict[str, Any]) -> dict[str, float]:
    return {str(k): (math.inf if v is None else float(v)) for k, v in params.items()}


class _PerLanguagePair:
    """Parameters fitted globally and (optionally) per language pair, with global fallback."""

    kind: ClassVar[str] = ""

    def __init__(self, *, per_lp: bool = True, min_lp_rows: int = DEFAULT_MIN_LP_ROWS) -> None:
        if int(min_lp_rows) < 2:
            raise ValueError(f"min_lp_rows={min_lp_rows!r} must be >= 2")
        self.per_lp = bool(per_lp)
        self.min_lp_rows = int(min_lp_rows)
        self.global_params: dict[str, float] | None = None
        self.lp_params: dict[str, dict[str, float]] = {}

    # -- subclasses fill these two
    def _fit_group(self, **arrays: np.ndarray) -> dict[str, float] | None:
        raise NotImplementedError

    def _settings(self) -> dict[str, Any]:
        return {}

    # -- shared machinery
    @property
    def is_fitted(self) -> bool:
        return self.global_params is not None

    def _fit_groups(self, lp, **arrays: np.ndarray):
        n = len(next(iter(arrays.values())))
        lp_arr = _as_lp(lp, n)
        global_params = self._fit_group(**arrays)
        if global_params is None:
            raise ValueError(
                f"{type(self).__name__}: cannot fit on the given dev data (degenerate: see docs)"
            )
        self.global_params = global_params
        self.lp_params = {}
        if self.per_lp and lp is not None:
            for name, rows in lp_groups(lp_arr):
                if rows.sum() < self.min_lp_rows:
                    continue
                params = self._fit_group(**{k: v[rows] for k, v in arrays.items()})
                if params is not None:
                    self.lp_params[name] = params
        return self

    def params_for(self, lp: str | None) -> tuple[dict[str, float], bool]:
        """Parameters used for ``lp`` and whether they are the global fallback."""
        if self.global_params is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit() on dev first")
        if lp is not None and lp in self.lp_params:
            return self.lp_params[lp], False
        return self.global_params, lp is not None and lp != GLOBAL

    def _apply(self, lp, n: int, func) -> np.ndarray:
        """Call ``func(rows_mask, params)`` for each LP present, filling an output of length n."""
        lp_arr = _as_lp(lp, n)
        out = np.empty(n, dtype=float)
        for name, rows in lp_groups(lp_arr):
            params, _ = self.params_for(None if name == GLOBAL else name)
            out[rows] = func(rows, params)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (only str keys, floats, ints, bools) for MLflow / metrics files."""
        if self.global_params is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted; nothing to serialise")
        return {
            "kind": self.kind,
            "version": _SERIAL_VERSION,
            "per_lp": self.per_lp,
            "min_lp_rows": self.min_lp_rows,
            **self._settings(),
            "global": _encode(self.global_params),
            "lps": {lp: _encode(p) for lp, p in sorted(self.lp_params.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """Rebuild a fitted calibrator from :meth:`to_dict` output."""
        if not isinstance(data, dict) or data.get("kind") != cls.kind:
            got = data.get("kind") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"expected a serialised {cls.kind!r}, got kind={got!r}")
        if data.get("version") != _SERIAL_VERSION:
            raise ValueError(f"{cls.kind}: unsupported serialisation version {data.get('version')!r}")
        settings = {k: data[k] for k in cls._setting_keys() if k in data}
        obj = cls(per_lp=bool(data["per_lp"]), min_lp_rows=int(data["min_lp_rows"]), **settings)
        obj.global_params = _decode(data["global"])
        obj.lp_params = {str(lp): _decode(p) for lp, p in data["lps"].items()}
        return obj

    @classmethod
    def _setting_keys(cls) -> Sequence[str]:
        return ()

    def __repr__(self) -> str:
        state = f"global={self.global_params}, lps={sorted(self.lp_params)}" if self.is_fitted else "unfitted"
        return f"{type(self).__name__}(per_lp={self.per_lp}, {state})"


# =========================================================================== standardisation
def mu_regression(human_z, mu_z) -> tuple[float, float]:
    """Least-squares line ``human_z ~ a + b * mu_z``: returns ``(a, b)`` with b clipped to
    [:data:`MIN_MU_SLOPE`, :data:`MAX_MU_SLOPE`] and a refitted for the clipped slope (so the line
    still passes through the means).

    Parameters
    ----------
    human_z, mu_z : array_like, shape [n]
        Standardised human scores and predictions; ``mu_z`` must not be constant.
    """
    human_z = _as_1d("human_z", human_z)
    mu_z = _as_1d("mu_z", mu_z)
    _check_same_length(human_z=human_z, mu_z=mu_z)
    centred = mu_z - mu_z.mean()
    var = float(np.mean(centred**2))
    if var == 0.0:
        raise ValueError("mu_z is constant: no slope to fit")
    slope = float(np.mean(centred * (human_z - human_z.mean()))) / var
    slope = min(max(slope, MIN_MU_SLOPE), MAX_MU_SLOPE)
    return float(human_z.mean() - slope * mu_z.mean()), slope


class Standardizer(_PerLanguagePair):
    """Z-normalisation of human scores and model predictions with dev statistics (§5.2).

    Fitted parameters per group: ``human_mean``, ``human_std`` (ddof=0) of :math:`q^*`, and
    ``pred_mean``, ``pred_std`` of the pooled model samples,

    .. math::
        m_p = \\overline{\\hat\\mu}, \\qquad s_p = \\sqrt{\\operatorname{Var}(\\hat\\mu) + \\overline{\\hat\\sigma_s^2}}

    where :math:`\\hat\\sigma_s` is the spread of the model's real samples around :math:`\\hat\\mu`
    (MC dropout, ensemble members, the epistemic part of HTS+MCD) and 0 for a method that predicts
    its sigma or has none (HTS, KL, DUP, the point estimate): ``fit(..., sigma_from_samples=False)``
    or ``sigma=None``.

    Then :math:`q^*_z = (q^* - m_h)/s_h`, :math:`\\hat\\mu_z = (\\hat\\mu - m_p)/s_p` and
    :math:`\\hat\\sigma_z = \\hat\\sigma / s_p` (sigma is a standard deviation).  A group whose
    human scores or predictions are constant on dev is not fitted (falls back to global).

    ``mu_scaling`` (:data:`MU_SCALINGS`) says how mu is put on the human z scale:

    ``spread`` (the papers')
        :math:`m_p, s_p` as above: the standardised mu has the spread of the human scores, slope 1.
        When mu correlates with :math:`q^*` by :math:`r < 1` this over-disperses it: the best
        translations land above the best human score (MQM 0) and are clipped there, and the residual
        :math:`q^*_z - \\hat\\mu_z` (which every calibrator widens its interval for) is larger than
        it needs to be.
    ``regression``
        The least-squares line of :math:`q^*_z` on the spread-standardised mu on dev,
        :math:`q^*_z \\approx a + b\\,\\hat\\mu_z`, is folded into the parameters:
        :math:`s_p \\leftarrow s_p / b`, :math:`m_p \\leftarrow m_p - a\\,s_p / b`, so that
        :meth:`transform_predictions` returns :math:`a + b\\,\\hat\\mu_z` (the dev-optimal linear
        recalibration of mu) and sigma shrinks by the same b (it stays in the units of mu).
        The slope is clipped to [:data:`MIN_MU_SLOPE`, :data:`MAX_MU_SLOPE`]: a mu unrelated to
        (or anti-correlated with) the human scores is not turned into a constant or flipped.
        ``mu_slope`` and ``mu_intercept`` (a, b) are kept in the fitted parameters for inspection.

    Files written before ``mu_scaling`` existed read as ``spread`` (the parameters they hold).
    """

    kind = "standardizer"

    def __init__(self, *, mu_scaling: str = "spread", **settings) -> None:
        super().__init__(**settings)
        if mu_scaling not in MU_SCALINGS:
            raise ValueError(f"mu_scaling={mu_scaling!r} not supported; choose from {sorted(MU_SCALINGS)}")
        self.mu_scaling = mu_scaling

    @classmethod
    def _setting_keys(cls):
        return ("mu_scaling",)

    def _settings(self) -> dict[str, Any]:
        return {"mu_scaling": self.mu_scaling}

    def fit(self, human, mu, sigma=None, lp=None, *, sigma_from_samples: bool = True) -> Standardizer:
        """Fit on dev: ``human``, ``mu`` shape [n]; ``sigma`` (std, shape [n]) or None.

        ``sigma_from_samples``: whether ``sigma`` is the spread of real model samples around ``mu``
        (then it enters the pooled spread :math:`s_p`).  With False -- a predicted sigma, or the
        point estimate's placeholder -- ``sigma`` is ignored and :math:`s_p = \\operatorname{std}(\\hat\\mu)`.
        """
        human = _as_1d("human", human)
        mu = _as_1d("mu", mu)
        if sigma is None or not sigma_from_samples:
            sigma = np.zeros_like(mu)
        else:
            sigma = _as_1d("sigma", sigma, nonnegative=True)
        _check_same_length(human=human, mu=mu, sigma=sigma)
        return self._fit_groups(lp, human=human, mu=mu, sigma=sigma)

    def _fit_group(self, human, mu, sigma):
        human_std = float(np.std(human))
        pred_std = math.sqrt(float(np.var(mu)) + float(np.mean(sigma**2)))
        if human_std == 0.0 or pred_std == 0.0:
            return None
        params = {
            "human_mean": float(np.mean(human)),
            "human_std": human_std,
            "pred_mean": float(np.mean(mu)),
            "pred_std": pred_std,
        }
        if self.mu_scaling == "regression":
            intercept, slope = mu_regression(
                (human - params["human_mean"]) / human_std, (mu - params["pred_mean"]) / pred_std
            )
            params.update(
                pred_mean=params["pred_mean"] - intercept * pred_std / slope,
                pred_std=pred_std / slope,
                mu_intercept=intercept,
                mu_slope=slope,
            )
        return params

    def transform_human(self, human, lp=None) -> np.ndarray:
        """Standardised human scores :math:`(q^* - m_h)/s_h`, shape [n]."""
        human = _as_1d("human", human)
        return self._apply(lp, human.size, lambda r, p: (human[r] - p["human_mean"]) / p["human_std"])

    def transform_predictions(self, mu, sigma=None, lp=None) -> tuple[np.ndarray, np.ndarray | None]:
        """Standardised ``(mu_z, sigma_z)``; sigma is a std and is only divided by :math:`s_p`."""
        mu = _as_1d("mu", mu)
        mu_z = self._apply(lp, mu.size, lambda r, p: (mu[r] - p["pred_mean"]) / p["pred_std"])
        if sigma is None:
            return mu_z, None
        sigma = _as_1d("sigma", sigma, nonnegative=True)
        _check_same_length(mu=mu, sigma=sigma)
        return mu_z, self._apply(lp, mu.size, lambda r, p: sigma[r] / p["pred_std"])

    def to_human_scale(self, mu_z, sigma_z, lp=None) -> tuple[np.ndarray, np.ndarray]:
        """Map a standardised prediction onto the human score scale of dev.

        :math:`\\hat\\mu_h = m_h + s_h \\hat\\mu_z`, :math:`\\hat\\sigma_h = s_h \\hat\\sigma_z` -- the
        (calibrated) predictive Gaussian of :math:`q^*` in the units users know.
        """
        mu_z = _as_1d("mu_z", mu_z)
        sigma_z = _as_1d("sigma_z", sigma_z, nonnegative=True)
        _check_same_length(mu_z=mu_z, sigma_z=sigma_z)
        mu_h = self._apply(lp, mu_z.size, lambda r, p: p["human_mean"] + p["human_std"] * mu_z[r])
        sigma_h = self._apply(lp, mu_z.size, lambda r, p: p["human_std"] * sigma_z[r])
        return mu_h, sigma_h


# =========================================================================== fixed variance
def fixed_variance(human, mu) -> float:
    """Closed-form NLL-optimal constant variance (Eq. 6 / App. A of Glushkova et al., 2021).

    .. math:: \\sigma^2_{fixed} = \\frac{1}{|D|} \\sum_j (q^*_j - \\hat\\mu_j)^2

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]

    Returns
    -------
    float
        A **variance** (take the square root for sigma).
    """
    human = _as_1d("human", human)
    mu = _as_1d("mu", mu)
    _check_same_length(human=human, mu=mu)
    return float(np.mean((human - mu) ** 2))


class FixedVarianceCalibrator(_PerLanguagePair):
    """The fixed-variance baseline: :math:`\\hat\\sigma^2 := \\sigma^2_{fixed}` for every segment.

    Fitted parameter per group: ``var`` (:func:`fixed_variance` on dev).  ``transform`` returns
    :math:`\\sqrt{\\sigma^2_{fixed}}` (a std) for each row, ignoring the model's own sigma.
    """

    kind = "fixed_variance"

    def fit(self, human, mu, sigma=None, lp=None) -> FixedVarianceCalibrator:
        """Fit on dev; ``sigma`` is accepted for a uniform interface and ignored."""
        human = _as_1d("human", human)
        mu = _as_1d("mu", mu)
        _check_same_length(human=human, mu=mu)
        return self._fit_groups(lp, human=human, mu=mu)

    def _fit_group(self, human, mu):
        var = fixed_variance(human, mu)
        return None if var == 0.0 else {"var": var}

    def transform(self, mu, sigma=None, lp=None) -> np.ndarray:
        """Standard deviations :math:`\\sigma_{fixed}` of shape [n] (``mu`` sets n)."""
        mu = _as_1d("mu", mu)
        return self._apply(lp, mu.size, lambda r, p: math.sqrt(p["var"]))


# =========================================================================== fits remembered
#: Grid-search fits a process remembers (:func:`remembered_fit`): one HTS calibration asked for 297
#: fits of :func:`~uamt.uncertainty.candidates.fit_variance_by_score`, 188 distinct; each answer is
#: a few hundred bytes.
REMEMBERED_FITS = 4096


def remembered_fit(fit: Callable[..., dict[str, float]]) -> Callable[..., dict[str, float]]:
    """``fit`` (a deterministic grid search returning a dict of floats), remembering its results in
    this process by the bytes of its array arguments and the values of its options.

    A calibration asks for the same proper-score fit on the same rows many times (measured on
    one HTS calibration, ``calibrate_model``: 297 calls of ``fit_variance_by_score``, 188 distinct;
    the repeats took 19 of its 58 s).  The answer is the fit's own dict (a copy), computed once;
    ``fit.cache_clear()`` forgets.
    """
    remembered: OrderedDict[tuple, dict[str, float]] = OrderedDict()
    lock = threading.Lock()  # a flow may calibrate in threads; the fit itself runs outside it

    @functools.wraps(fit)
    def fit_once(*arrays, **options) -> dict[str, float]:
        digest = hashlib.blake2b(digest_size=16)
        try:
            for array in arrays:
                values = np.ascontiguousarray(np.asarray(array, dtype=float))
                digest.update(repr(values.shape).encode())
                digest.update(values.tobytes())
            key = (digest.digest(), tuple(sorted(options.items())))
            hash(key)
        except (TypeError, ValueError):  # not numbers: the fit itself names what is wrong
            return fit(*arrays, **options)
        with lock:
            known = remembered.get(key)
            if known is not None:
                remembered.move_to_end(key)
                return dict(known)
        result = dict(fit(*arrays, **options))
        with lock:
            remembered[key] = result
            if len(remembered) > REMEMBERED_FITS:
                remembered.popitem(last=False)
        return dict(result)

    fit_once.cache_clear = remembered.clear  # type: ignore[attr-defined]
    return fit_once


# =========================================================================== affine variance
def _ece_columns(abs_err: np.ndarray, var: np.ndarray, n_levels: int) -> np.ndarray:
    """ECE for each column of calibrated variances ``var`` [n, n_candidates].

    Fast path for the grid search: with the levels ``linspace(0, 1, M)``, segment j lies in
    :math:`I(\\gamma_b)` iff its central-interval level :math:`c_j = \\operatorname{erf}(z_j/\\sqrt2)` is
    at most :math:`b/(M-1)`, i.e. iff :math:`\\lceil c_j (M-1) \\rceil \\le b`; one bincount per
    candidate replaces a sort.  (Reported ECEs use :func:`expected_calibration_error`.)

    The erf is scipy's, on the calling thread; torch's (used until 2026-12-06) runs on torch's
    thread pool.  Neither is faster under every load (``python benchmarks/ece_grid_search.py``, one
    ``fit_affine_variance`` per dev LP of 720-3,082 rows, 2 cores, the same fits every time): idle,
    torch's takes 0.05-0.18 s and scipy's 0.13-0.50 s; beside another job's tests, 0.19-0.67 s and
    0.13-0.55 s; with one or two more busy processes the order changes from run to run (torch
    0.13-0.74 / scipy 0.13-0.49 s and 0.17-0.52 / 0.18-0.80 s idle, 0.63-2.15 / 0.36-1.49 s beside
    tests).  Seconds per stage either way; scipy's keeps torch out of the calibration path.  The two
    erfs agree within one ulp, so a level index differs only if :math:`c_j (M-1)` lies within one
    ulp of an integer.
    """
    n, n_candidates = var.shape
    z = abs_err[:, None] / np.sqrt(var)
    levels = erf(z / math.sqrt(2.0))
    level_index = np.ceil(levels * (n_levels - 1)).astype(np.int64)
    np.clip(level_index, 0, n_levels - 1, out=level_index)
    flat = (level_index + np.arange(n_candidates)[None, :] * n_levels).ravel()
    counts = np.bincount(flat, minlength=n_candidates * n_levels).reshape(n_candidates, n_levels)
    observed = np.cumsum(counts, axis=1) / n
    gammas = confidence_levels(n_levels)
    ece = np.mean(np.abs(observed - gammas[None, :]), axis=1)
    return ece


def fit_affine_variance(
    human,
    mu,
    sigma,
    *,
    n_levels: int = N_CONFIDENCE_LEVELS,
    grid_size: int = 61,
    refine_size: int = 21,
    alpha_decades: float = 3.0,
) -> dict[str, float]:
    """Fit :math:`\\sigma^2_{calib} = \\alpha\\sigma^2 + \\beta` minimising the ECE on dev (§3.5).

    Deterministic coarse-to-fine grid search (the ECE is piecewise constant in (alpha, beta), so
    gradient methods do not apply; the authors also grid-searched):

    1. :math:`\\alpha \\in \\alpha_0 \\cdot 10^{[-d, d]}` on ``grid_size`` log-spaced points with
       :math:`\\alpha_0 = \\sigma^2_{fixed} / \\overline{\\sigma^2}` (the scale that matches the mean
       squared error), and for each alpha ``grid_size`` betas evenly spaced in
       :math:`[-(1-10^{-3}) \\min_j \\alpha\\sigma_j^2,\\; 3\\sigma^2_{fixed}]` -- the lower end keeps
       every dev variance positive (constraint :math:`\\beta \\ge -\\min_j \\alpha\\sigma_j^2`).
    2. A ``refine_size`` x ``refine_size`` grid of one coarse step around the best point.
    3. The identity (alpha=1, beta=0) is always a candidate, so the dev ECE never gets worse.

    The minimum ECE wins; ties (frequent: the ECE takes finitely many values) go to the sharper
    candidate (lower mean calibrated variance on dev), then to the earlier one.  If every sigma is 0 (a point-estimate model), alpha is
    fixed to 1 and only beta is searched (the fit then reduces to an ECE-tuned fixed variance).

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
        Dev ground truth and predicted means (standardised scale, usually).
    sigma : array_like, shape [n_segments]
        Dev predicted standard deviations (not variances), >= 0.

    Returns
    -------
    dict
        ``alpha``, ``beta``, ``var_floor`` (smallest calibrated dev variance, used to keep test
        variances positive), ``ece_before``, ``ece_after``, ``n``.
    """
    human = _as_1d("human", human)
    mu = _as_1d("mu", mu)
    sigma = _as_1d("sigma", sigma, nonnegative=True)
    _check_same_length(human=human, mu=mu, sigma=sigma)
    abs_err = np.abs(human - mu)
    var = sigma**2
    mse = float(np.mean(abs_err**2))
    if mse == 0.0:
        raise ValueError("predictions equal the human scores on dev: no error to calibrate against")
    # Floor keeping every variance strictly positive (NLL finite) even where sigma == 0.
    tiny = 1e-9 * mse
    min_var, mean_var = float(var.min()), float(var.mean())

    def candidates_for(alpha: float, betas: np.ndarray):
        betas = np.unique(np.clip(betas, -(1.0 - 1e-3) * alpha * min_var, None))
        calibrated = np.maximum(alpha * var[:, None] + betas[None, :], tiny)
        ece = _ece_columns(abs_err, calibrated, n_levels)
        sharpness = calibrated.mean(axis=0)
        return betas, ece, sharpness

    records: list[tuple[float, float, float, float]] = []  # (ece, sharpness, alpha, beta)

    def search(alphas: np.ndarray, beta_grid) -> None:
        for alpha in alphas:
            betas, ece, sharpness = candidates_for(float(alpha), beta_grid(float(alpha)))
            records.extend(
                zip(
                    ece.tolist(), sharpness.tolist(), [float(alpha)] * betas.size, betas.tolist(), strict=True
                )
            )

    beta_top = 3.0 * mse
    if mean_var == 0.0:
        alphas = np.array([1.0])
        log_step = 0.0
    else:
        alpha0 = mse / mean_var
        alphas = alpha0 * 10.0 ** np.linspace(-alpha_decades, alpha_decades, grid_size)
        log_step = 2.0 * alpha_decades / (grid_size - 1)
    search(alphas, lambda a: np.linspace(-(1.0 - 1e-3) * a * min_var, beta_top, grid_size))
    search(np.array([1.0]), lambda a: np.array([0.0]))

    best = min(records, key=lambda rec: (rec[0], rec[1]))
    _, _, best_alpha, best_beta = best
    beta_step = (beta_top + (1.0 - 1e-3) * best_alpha * min_var) / (grid_size - 1)
    fine_alphas = best_alpha * 10.0 ** np.linspace(-log_step, log_step, refine_size) if log_step else alphas
    search(
        fine_alphas,
        lambda a: np.linspace(best_beta - beta_step, best_beta + beta_step, refine_size),
    )
    _, _, alpha, beta = min(records, key=lambda rec: (rec[0], rec[1]))
    calibrated = np.maximum(alpha * var + beta, tiny)
    ece_after = expected_calibration_error(human, mu, np.sqrt(calibrated), n_levels)
    ece_before = expected_calibration_error(human, mu, sigma, n_levels)
    return {
        "alpha": float(alpha),
        "beta": float(beta),
        "var_floor": float(calibrated.min()),
        "ece_before": ece_before,
        "ece_after": float(ece_after),
        "n": float(human.size),
    }


class AffineVarianceCalibrator(_PerLanguagePair):
    """Affine post-calibration of the predicted variance, :math:`\\sigma^2 \\mapsto \\alpha\\sigma^2 + \\beta` (§3.5).

    ``fit`` runs :func:`fit_affine_variance` on dev (per LP with global fallback);
    ``transform`` returns the calibrated **standard deviation**

    .. math:: \\hat\\sigma_{calib} = \\sqrt{\\max(\\alpha\\hat\\sigma^2 + \\beta,\\; v_{floor})}

    where :math:`v_{floor}` is the smallest calibrated variance seen on dev, so that a test sigma
    smaller than any dev sigma (with a negative beta) still gets a positive variance.
    """

    kind = "affine_variance"

    def __init__(
        self,
        *,
        per_lp: bool = True,
        min_lp_rows: int = DEFAULT_MIN_LP_ROWS,
        n_levels: int = N_CONFIDENCE_LEVELS,
        grid_size: int = 61,
        refine_size: int = 21,
    ) -> None:
        super().__init__(per_lp=per_lp, min_lp_rows=min_lp_rows)
        if int(grid_size) < 3 or int(refine_size) < 3:
            raise ValueError("grid_size and refine_size must be >= 3")
        self.n_levels = int(n_levels)
        self.grid_size = int(grid_size)
        self.refine_size = int(refine_size)

    @classmethod
    def _setting_keys(cls):
        return ("n_levels", "grid_size", "refine_size")

    def _settings(self):
        return {"n_levels": self.n_levels, "grid_size": self.grid_size, "refine_size": self.refine_size}

    def fit(self, human, mu, sigma, lp=None) -> AffineVarianceCalibrator:
        """Fit on dev: ``human``, ``mu``, ``sigma`` (std) of shape [n]; ``lp`` shape [n] or None."""
        human = _as_1d("human", human)
        mu = _as_1d("mu", mu)
        sigma = _as_1d("sigma", sigma, nonnegative=True)
        _check_same_length(human=human, mu=mu, sigma=sigma)
        return self._fit_groups(lp, human=human, mu=mu, sigma=sigma)

    def _fit_group(self, human, mu, sigma):
        if np.all(human == mu):
            return None
        return fit_affine_variance(
            human, mu, sigma, n_levels=self.n_levels, grid_size=self.grid_size, refine_size=self.refine_size
        )

    def transform(self, mu, sigma, lp=None) -> np.ndarray:
        """Calibrated standard deviations, shape [n]; ``mu`` is only checked for length."""
        mu = _as_1d("mu", mu)
        sigma = _as_1d("sigma", sigma, nonnegative=True)
        _check_same_length(mu=mu, sigma=sigma)
        return self._apply(
            lp,
            sigma.size,
            lambda r, p: np.sqrt(np.maximum(p["alpha"] * sigma[r] ** 2 + p["beta"], p["var_floor"])),
        )
