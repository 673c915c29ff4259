"""Performance indicators of uncertainty-aware MT evaluation (Glushkova et al., 2021, §4 and App. D).

Every quality prediction is a Gaussian :math:`\\hat p_Q(q) = \\mathcal N(q; \\hat\\mu, \\hat\\sigma^2)`.
Throughout, ``human`` is the ground-truth score :math:`q^*`, ``mu`` the predicted mean
:math:`\\hat\\mu` and ``sigma`` the predicted **standard deviation** :math:`\\hat\\sigma`
(never a variance); all three are arrays of shape ``[n_segments]`` on the same scale.

Naming follows scikit-learn: ``*_score`` higher is better, ``*_loss`` / ``*_error`` lower is
better.  :func:`interval_coverage` is neither (the target is the nominal level).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import erf, erfinv, ndtr

from uamt.core.stats import pearson_r

#: Number of confidence levels of the expected calibration error used in both papers.
N_CONFIDENCE_LEVELS = 100

_LOG_2PI = math.log(2.0 * math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


# --------------------------------------------------------------------------- validation helpers
def _as_1d(name: str, values, *, nonnegative: bool = False) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D [n_segments], got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} is empty; need at least one segment")
    if not np.all(np.isfinite(array)):
        bad = int(np.flatnonzero(~np.isfinite(array))[0])
        raise ValueError(f"{name}[{bad}] = {array[bad]!r} is not finite")
    if nonnegative and np.any(array < 0):
        bad = int(np.flatnonzero(array < 0)[0])
        raise ValueError(f"{name}[{bad}] = {array[bad]!r} is negative; sigma is a standard deviation >= 0")
    return array


def _check_same_length(**arrays: np.ndarray) -> None:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"arrays differ in length: {lengths}")


def _columns(**arrays) -> tuple[np.ndarray, ...]:
    """Each named input as a finite 1-D float array (``sigma`` also >= 0), all of one length."""
    checked = {name: _as_1d(name, values, nonnegative=name == "sigma") for name, values in arrays.items()}
    _check_same_length(**checked)
    return tuple(checked.values())


def _triple(human, mu, sigma) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _columns(human=human, mu=mu, sigma=sigma)


def _check_gamma(gamma: float) -> float:
    gamma = float(gamma)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"confidence level gamma={gamma!r} must lie in [0, 1]")
    return gamma


def _check_row_gammas(gamma, n: int) -> np.ndarray:
    """Levels of shape [n]: one ``gamma`` for every row, or one per row (an array of shape [n])."""
    if np.ndim(gamma) == 0:
        return np.full(n, _check_gamma(gamma))
    levels = np.asarray(gamma, dtype=float)
    if levels.shape != (n,):
        raise ValueError(f"gamma must be one level or one per row ({n}), got shape {levels.shape}")
    bad = np.flatnonzero(~((levels >= 0.0) & (levels <= 1.0)))
    if bad.size:
        raise ValueError(f"confidence level gamma[{bad[0]}]={levels[bad[0]]!r} must lie in [0, 1]")
    return levels


# --------------------------------------------------------------------------- building blocks
def probit(p):
    """Standard-normal quantile function, as written in the paper (Eq. 1).

    .. math:: \\operatorname{probit}(p) = \\sqrt 2 \\, \\operatorname{erf}^{-1}(2p - 1)

    Parameters
    ----------
    p : float or array_like
        Probabilities in [0, 1]; ``probit(1) = +inf`` and ``probit(0) = -inf``.

    Returns
    -------
    float or numpy.ndarray
        Same shape as ``p``.
    """
    return np.sqrt(2.0) * erfinv(2.0 * np.asarray(p, dtype=float) - 1.0)


def confidence_levels(n_levels: int = N_CONFIDENCE_LEVELS) -> np.ndarray:
    """The confidence levels :math:`\\gamma_b` of the ECE: ``numpy.linspace(0, 1, n_levels)``.

    Evenly spaced from 0 to 1 inclusive, as in the authors' evaluation code
    (deep-spin/UA_COMET ``evaluation/calibration.py``, ``NUM_BINS = 100``).  The two end levels are
    trivially calibrated (the empty interval at 0 and the whole line at 1 are covered with
    probability 0 and 1), so they only dilute the mean; they are kept for comparability with the
    published numbers.

    Returns
    -------
    numpy.ndarray
        Shape ``[n_levels]``.
    """
    if int(n_levels) < 2:
        raise ValueError(f"n_levels={n_levels!r} must be >= 2")
    return np.linspace(0.0, 1.0, int(n_levels))


def standardized_abs_error(human, mu, sigma) -> np.ndarray:
    """Absolute error in units of the predicted standard deviation, :math:`|q^* - \\hat\\mu| / \\hat\\sigma`.

    A segment is inside the Gaussian interval :math:`I(\\gamma)` exactly when this value is at most
    :math:`\\operatorname{probit}((1+\\gamma)/2)`.  Where ``sigma == 0`` the value is 0 if the
    prediction is exact and ``+inf`` otherwise (the limit of a point mass).

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.

    Returns
    -------
    numpy.ndarray, shape [n_segments]
    """
    human, mu, sigma = _triple(human, mu, sigma)
    return _z_abs(np.abs(human - mu), sigma)


def _z_abs(abs_err: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    z = np.empty_like(abs_err)
    positive = sigma > 0
    z[positive] = abs_err[positive] / sigma[positive]
    z[~positive] = np.where(abs_err[~positive] == 0, 0.0, np.inf)
    return z


def _observed_coverage(z_abs: np.ndarray, gammas: np.ndarray) -> np.ndarray:
    """Fraction of ``z_abs <= probit((1 + gamma)/2)`` for each gamma (sorted once, then searched)."""
    thresholds = probit((1.0 + gammas) / 2.0)
    z_sorted = np.sort(z_abs)
    return np.searchsorted(z_sorted, thresholds, side="right") / z_abs.size


def gaussian_interval(mu, sigma, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Central Gaussian confidence interval :math:`I(\\gamma) = [q_{min}, q_{max}]` (Eq. 1).

    .. math::
        q_{min}(\\gamma) = \\hat\\mu - \\hat\\sigma \\operatorname{probit}((1+\\gamma)/2), \\quad
        q_{max}(\\gamma) = \\hat\\mu + \\hat\\sigma \\operatorname{probit}((1+\\gamma)/2)

    Parameters
    ----------
    mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.
    gamma : float
        Confidence level in [0, 1].

    Returns
    -------
    (lower, upper) : tuple of numpy.ndarray, each shape [n_segments]
    """
    mu, sigma = _columns(mu=mu, sigma=sigma)
    gamma = _check_gamma(gamma)
    if gamma >= 1.0:  # probit(1) = inf, and 0 * inf would give NaN where sigma == 0
        half = np.full_like(sigma, np.inf)
    else:
        half = sigma * float(probit((1.0 + gamma) / 2.0))
    return mu - half, mu + half


# --------------------------------------------------------------------------- Pearson scores
def predictive_pearson_score(human, mu) -> float:
    """Predictive Pearson score (PPS): :math:`r(q^*, \\hat\\mu)`.

    .. math:: \\mathrm{PPS} = \\frac{\\sum_j (q^*_j - \\bar q^*)(\\hat\\mu_j - \\bar{\\hat\\mu})}
              {\\sqrt{\\sum_j (q^*_j - \\bar q^*)^2 \\sum_j (\\hat\\mu_j - \\bar{\\hat\\mu})^2}}

    Higher is better.

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]

    Returns
    -------
    float
        In [-1, 1]; NaN when ``n_segments < 2`` or an input is constant.
    """
    human, mu = _columns(human=human, mu=mu)
    return pearson_r(human, mu)


def uncertainty_pearson_score(human, mu, sigma) -> float:
    """Uncertainty Pearson score (UPS): :math:`r(|q^* - \\hat\\mu|, \\hat\\sigma)`.

    Correlation between the absolute prediction error and the predicted **standard deviation**
    (not the variance).  Higher is better.

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations, >= 0.

    Returns
    -------
    float
        In [-1, 1]; NaN when ``sigma`` is constant (e.g. the fixed-variance baseline, whose UPS
        the paper reports as "-") or ``n_segments < 2``.
    """
    human, mu, sigma = _triple(human, mu, sigma)
    return pearson_r(np.abs(human - mu), sigma)


# --------------------------------------------------------------------------- proper scores
def gaussian_nll(human, mu, sigma) -> np.ndarray:
    """Per-segment Gaussian negative log-likelihood :math:`-\\log \\mathcal N(q^*; \\hat\\mu, \\hat\\sigma^2)`.

    .. math:: \\mathrm{nll}_j = \\tfrac12 \\log(2\\pi\\hat\\sigma_j^2) + \\frac{(q^*_j - \\hat\\mu_j)^2}{2\\hat\\sigma_j^2}

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances); must be > 0.

    Returns
    -------
    numpy.ndarray, shape [n_segments]
        In nats.

    Raises
    ------
    ValueError
        If any ``sigma`` is 0 (the density is then not defined).
    """
    human, mu, sigma = _triple(human, mu, sigma)
    if np.any(sigma <= 0):
        bad = int(np.flatnonzero(sigma <= 0)[0])
        raise ValueError(f"sigma[{bad}] = 0: the Gaussian NLL needs sigma > 0")
    var = sigma**2
    return 0.5 * (_LOG_2PI + np.log(var)) + (human - mu) ** 2 / (2.0 * var)


def gaussian_nll_loss(human, mu, sigma) -> float:
    """Mean Gaussian negative log-likelihood (NLL, Eq. 4 of Glushkova et al., 2021).

    .. math:: \\mathrm{NLL} = -\\frac{1}{|D|} \\sum_{j} \\log \\mathcal N(q^*_j; \\hat\\mu_j, \\hat\\sigma_j^2)

    Lower is better.  When ``q* ~ N(mu, sigma^2)`` exactly, its expectation is the Gaussian entropy
    :math:`\\tfrac12 \\log(2\\pi e \\sigma^2)` (averaged over segments).

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances); must be > 0.

    Returns
    -------
    float
        In nats.
    """
    return float(np.mean(gaussian_nll(human, mu, sigma)))


def gaussian_crps(human, mu, sigma) -> np.ndarray:
    """Per-segment continuous ranked probability score of :math:`\\mathcal N(\\hat\\mu, \\hat\\sigma^2)`.

    Closed form (Gneiting et al., 2005), with :math:`z = (q^* - \\hat\\mu)/\\hat\\sigma`:

    .. math:: \\mathrm{CRPS}_j = \\hat\\sigma_j \\left[ z_j (2\\Phi(z_j) - 1) + 2\\varphi(z_j) - \\frac{1}{\\sqrt\\pi} \\right]
              = \\int_{-\\infty}^{\\infty} (F_j(x) - \\mathbb 1[x \\ge q^*_j])^2 \\, dx

    For ``sigma == 0`` it is the limit :math:`|q^* - \\hat\\mu|`.

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.

    Returns
    -------
    numpy.ndarray, shape [n_segments]
        In the units of the scores.
    """
    human, mu, sigma = _triple(human, mu, sigma)
    abs_err = np.abs(human - mu)
    out = abs_err.copy()
    positive = sigma > 0
    s = sigma[positive]
    z = (human[positive] - mu[positive]) / s
    pdf = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)
    out[positive] = s * (z * (2.0 * ndtr(z) - 1.0) + 2.0 * pdf - _INV_SQRT_PI)
    return out


def gaussian_crps_loss(human, mu, sigma) -> float:
    """Mean continuous ranked probability score of the Gaussian predictions (lower is better).

    See :func:`gaussian_crps` for the closed form.  Not one of the papers' indicators; it is a
    proper score that, unlike the NLL, stays finite as ``sigma -> 0`` (it then becomes the MAE).

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.

    Returns
    -------
    float
    """
    return float(np.mean(gaussian_crps(human, mu, sigma)))


# --------------------------------------------------------------------------- calibration & sharpness
def reliability_curve(human, mu, sigma, n_levels: int = N_CONFIDENCE_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """Expected vs observed coverage of the Gaussian intervals, for a reliability plot.

    For each confidence level :math:`\\gamma_b` of :func:`confidence_levels` (Eq. 3):

    .. math:: \\mathrm{acc}(\\gamma_b) = \\frac{1}{|D|} \\sum_j \\mathbb 1\\left(q^*_j \\in I_j(\\gamma_b)\\right)

    with the closed interval :math:`I_j(\\gamma)` of Eq. 1 (:func:`gaussian_interval`).

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.
    n_levels : int
        Number M of confidence levels (100 in both papers).

    Returns
    -------
    expected : numpy.ndarray, shape [n_levels]
        The levels :math:`\\gamma_b`.
    observed : numpy.ndarray, shape [n_levels]
        :math:`\\mathrm{acc}(\\gamma_b)`.
    """
    gammas = confidence_levels(n_levels)
    z = standardized_abs_error(human, mu, sigma)
    return gammas, _observed_coverage(z, gammas)


def expected_calibration_error(human, mu, sigma, n_levels: int = N_CONFIDENCE_LEVELS) -> float:
    """Expected calibration error for regression (ECE, Eq. 2 of Glushkova et al., 2021).

    .. math:: \\mathrm{ECE} = \\frac{1}{M} \\sum_{b=1}^{M} |\\mathrm{acc}(\\gamma_b) - \\gamma_b|

    the mean absolute gap between observed and nominal coverage of the central Gaussian intervals,
    over M confidence levels ``linspace(0, 1, M)`` (M = 100 in both papers).  Lower is better.

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.
    n_levels : int
        Number M of confidence levels.

    Returns
    -------
    float
        In [0, 0.5].
    """
    gammas, observed = reliability_curve(human, mu, sigma, n_levels)
    return float(np.mean(np.abs(observed - gammas)))


def effective_sample_size(values, groups) -> float:
    """Kish's effective sample size of ``values`` clustered in ``groups`` (design effect).

    .. math:: n_{eff} = \\frac{n}{1 + (m_0 - 1)\\,\\rho}, \\qquad
              m_0 = \\frac{n - \\sum_g m_g^2 / n}{G - 1}

    with :math:`\\rho` the one-way ANOVA intraclass correlation of ``values`` within groups (clipped to
    [0, 1]) and :math:`m_g` the group sizes.  Translations of the same source segment share its
    difficulty, so their errors are correlated and a test set carries less information than its row
    count: pass the standardised residuals and the source-segment ids.

    Parameters
    ----------
    values : array_like, shape [n]
    groups : array_like, shape [n]
        Any hashable labels.

    Returns
    -------
    float
        In [n / max group size, n] (n when every group has one row).
    """
    values = _as_1d("values", values)
    groups = np.asarray(groups)
    if groups.shape != values.shape:
        raise ValueError(f"groups must have one label per value ({values.size}), got shape {groups.shape}")
    n = values.size
    _, index, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    n_groups = sizes.size
    if n_groups in (1, n):
        return float(n) if n_groups == n else 1.0
    means = np.bincount(index, weights=values) / sizes
    ss_between = float(np.sum(sizes * (means - values.mean()) ** 2))
    ss_within = float(np.sum((values - means[index]) ** 2))
    ms_between = ss_between / (n_groups - 1)
    ms_within = ss_within / (n - n_groups)
    m0 = (n - float(np.sum(sizes**2)) / n) / (n_groups - 1)
    denominator = ms_between + (m0 - 1.0) * ms_within
    rho = 0.0 if denominator <= 0 else min(max((ms_between - ms_within) / denominator, 0.0), 1.0)
    return float(n / (1.0 + (m0 - 1.0) * rho))


def macro_mean_se(values, strata, groups) -> float:
    """Standard error of the macro average of per-stratum means, clustered by group within stratum.

    .. math:: \\bar v = \\frac1S \\sum_s \\bar v_s, \\qquad
              \\widehat{\\operatorname{se}}(\\bar v)^2 = \\frac1{S^2} \\sum_s \\frac{1}{n_s^2}
              \\sum_{g \\in s} \\Bigl(\\sum_{i \\in g} (v_i - \\bar v_s)\\Bigr)^2

    the cluster-robust (sandwich) variance of each stratum's mean, strata independent.  Pass the
    row-wise difference of two scores on the same rows (a paired difference: e.g. a model's CRPS
    minus its baseline's), the LP of each row as ``strata`` and its document as ``groups``: the
    standard error of an LP-averaged difference whose rows share their document's difficulty.

    Parameters
    ----------
    values : array_like, shape [n]
        Finite values.
    strata, groups : array_like, shape [n]
        Any hashable labels; a group is counted within its stratum.

    Returns
    -------
    float
        Non-negative, in the units of ``values``; 0 for a stratum with a single group (its variance is
        not estimable from one cluster, as with every sandwich estimator).
    """
    values = _as_1d("values", values)
    strata, groups = np.asarray(strata), np.asarray(groups)
    if strata.shape != values.shape or groups.shape != values.shape:
        raise ValueError(
            f"strata {strata.shape} and groups {groups.shape} must have one label per value ({values.size})"
        )
    if values.size == 0:
        raise ValueError("values must not be empty")
    if not np.all(np.isfinite(values)):
        raise ValueError("values must be finite")
    labels = sorted(set(strata.tolist()))
    var = 0.0
    for stratum in labels:
        rows = strata == stratum
        centred = values[rows] - values[rows].mean()
        _, index = np.unique(groups[rows], return_inverse=True)
        sums = np.bincount(index, weights=centred)
        var += float(np.sum(sums**2)) / rows.sum() ** 2
    return float(math.sqrt(var) / len(labels))


@functools.lru_cache(maxsize=256)
def ece_sampling_floor(
    n_segments: int,
    n_levels: int = N_CONFIDENCE_LEVELS,
    n_simulations: int = 300,
    seed: int = 0,
    n_fit: int | None = None,
) -> float:
    """The ECE a *perfectly calibrated* Gaussian model still shows on ``n_segments`` rows.

    Observed coverage on a finite test set fluctuates around the nominal level even when every
    predictive distribution is exactly right, so the ECE of Eq. 2 is biased upwards by about
    :math:`\\frac1M\\sum_b \\sqrt{2\\gamma_b(1-\\gamma_b)/(\\pi n)}`.  This returns the Monte-Carlo
    mean ECE of ``n_simulations`` test sets of ``n_segments`` standard-normal errors with sigma = 1:
    an observed ECE near it is indistinguishable from perfect calibration at that sample size.

    With ``n_fit``, the calibration itself is also estimated from a finite (dev) set: each simulated
    test set is judged with the scale a dev set of ``n_fit`` effective rows would have fitted,
    :math:`\\hat s = \\sqrt{\\chi^2_{n_{fit}} / n_{fit}}` -- the floor of a dev-fitted calibration,
    higher than the test-noise-only floor.

    Parameters
    ----------
    n_segments : int
        (Effective) rows of the evaluated set (e.g. test rows of one LP).
    n_levels : int
        Confidence levels M of the ECE.
    n_fit : int, optional
        (Effective) rows the calibration was fitted on; None: a known calibration.

    Returns
    -------
    float
        Expected ECE under perfect calibration, in [0, 0.5].
    """
    n_segments, n_simulations = int(n_segments), int(n_simulations)
    if n_segments < 1 or n_simulations < 1:
        raise ValueError(f"n_segments={n_segments} and n_simulations={n_simulations} must be >= 1")
    if n_fit is not None and int(n_fit) < 1:
        raise ValueError(f"n_fit={n_fit} must be >= 1")
    rng = np.random.default_rng(seed)
    gammas = confidence_levels(n_levels)
    # Level index of each |z|: segment j is inside I(gamma_b) iff erf(|z_j|/sqrt2) <= gamma_b.
    levels = np.abs(rng.standard_normal((n_simulations, n_segments)))
    if n_fit is not None:
        levels = levels / np.sqrt(rng.chisquare(int(n_fit), size=(n_simulations, 1)) / int(n_fit))
    index = np.clip(np.ceil(erf(levels / math.sqrt(2.0)) * (n_levels - 1)).astype(np.int64), 0, n_levels - 1)
    flat = (index + np.arange(n_simulations)[:, None] * n_levels).ravel()
    counts = np.bincount(flat, minlength=n_simulations * n_levels).reshape(n_simulations, n_levels)
    observed = np.cumsum(counts, axis=1) / n_segments
    return float(np.mean(np.abs(observed - gammas[None, :])))


def sharpness_loss(sigma) -> float:
    """Sharpness (Eq. 5 of Glushkova et al., 2021): the mean predicted **variance**.

    .. math:: \\mathrm{sha} = \\frac{1}{|D|} \\sum_j \\hat\\sigma_j^2

    Lower is sharper (tighter intervals); only meaningful alongside a calibration indicator.

    Parameters
    ----------
    sigma : array_like, shape [n_segments]
        Standard deviations (squared here; pass sigma, not var).

    Returns
    -------
    float
        In squared score units.
    """
    sigma = _as_1d("sigma", sigma, nonnegative=True)
    return float(np.mean(sigma**2))


def interval_coverage(human, mu, sigma, gamma: float) -> float:
    """Observed coverage :math:`\\mathrm{acc}(\\gamma)` of the central Gaussian interval at level gamma.

    .. math:: \\frac{1}{|D|} \\sum_j \\mathbb 1\\left(|q^*_j - \\hat\\mu_j| \\le \\hat\\sigma_j \\operatorname{probit}((1+\\gamma)/2)\\right)

    A calibrated model has coverage close to ``gamma``.

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.
    gamma : float
        Confidence level in [0, 1].

    Returns
    -------
    float
        In [0, 1].
    """
    z = standardized_abs_error(human, mu, sigma)
    return float(_observed_coverage(z, np.array([_check_gamma(gamma)]))[0])


def mean_interval_width(sigma, gamma: float) -> float:
    """Mean width of the central Gaussian interval at level gamma: :math:`2 \\overline{\\hat\\sigma} \\operatorname{probit}((1+\\gamma)/2)`.

    Parameters
    ----------
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.
    gamma : float
        Confidence level in [0, 1).

    Returns
    -------
    float
        In score units.
    """
    sigma = _as_1d("sigma", sigma, nonnegative=True)
    gamma = _check_gamma(gamma)
    if gamma >= 1.0:
        return float("inf")
    return float(2.0 * np.mean(sigma) * probit((1.0 + gamma) / 2.0))


def translation_risk(mu, sigma, threshold) -> np.ndarray:
    """Translation risk :math:`\\hat F_Q(\\chi) = P(Q \\le \\chi) = \\Phi((\\chi - \\hat\\mu)/\\hat\\sigma)` (§3.2).

    The probability that the translation's quality is at or below the threshold :math:`\\chi`
    (e.g. a critical-error threshold tuned on dev).  For ``sigma == 0`` it is the step
    :math:`\\mathbb 1(\\hat\\mu \\le \\chi)`.

    Parameters
    ----------
    mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.
    threshold : float or array_like, shape [n_segments]
        :math:`\\chi`, on the same scale as ``mu``.

    Returns
    -------
    numpy.ndarray, shape [n_segments]
        Probabilities in [0, 1].
    """
    mu, sigma = _columns(mu=mu, sigma=sigma)
    chi = np.broadcast_to(np.asarray(threshold, dtype=float), mu.shape)
    if not np.all(np.isfinite(chi)):
        raise ValueError("threshold must be finite")
    risk = (mu <= chi).astype(float)
    positive = sigma > 0
    risk[positive] = ndtr((chi[positive] - mu[positive]) / sigma[positive])
    return risk


def uncertainty_metrics(
    human,
    mu,
    sigma,
    *,
    n_levels: int = N_CONFIDENCE_LEVELS,
    coverage_gamma: float = 0.9,
) -> dict[str, float | None]:
    """All indicators of one method on one set, as a JSON-safe dict.

    Keys: ``n``, ``pps``, ``ups``, ``nll``, ``ece``, ``ece_floor`` (:func:`ece_sampling_floor` for this
    many rows), ``sharpness``, ``coverage@<gamma>``, ``width@<gamma>``, ``crps``.  Undefined values (UPS with constant sigma, Pearson with fewer than 2
    segments, NLL with some ``sigma == 0``) are ``None``.

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.
    n_levels : int
        Confidence levels of the ECE.
    coverage_gamma : float
        Level of the reported interval coverage and width.
    """
    human, mu, sigma = _triple(human, mu, sigma)

    def finite_or_none(value: float) -> float | None:
        return float(value) if math.isfinite(value) else None

    nll = gaussian_nll_loss(human, mu, sigma) if np.all(sigma > 0) else float("nan")
    tag = f"{coverage_gamma:g}"
    return {
        "n": int(human.size),
        "pps": finite_or_none(predictive_pearson_score(human, mu)),
        "ups": finite_or_none(uncertainty_pearson_score(human, mu, sigma)),
        "nll": finite_or_none(nll),
        "ece": expected_calibration_error(human, mu, sigma, n_levels),
        "ece_floor": ece_sampling_floor(human.size, n_levels),
        "sharpness": sharpness_loss(sigma),
        f"coverage@{tag}": interval_coverage(human, mu, sigma, coverage_gamma),
        f"width@{tag}": mean_interval_width(sigma, coverage_gamma),
        "crps": gaussian_crps_loss(human, mu, sigma),
    }


# --------------------------------------------------------------------------- conditional calibration
def quantile_groups(values, n_groups: int = 5) -> np.ndarray:
    """Equal-count quantile group of each value (0 = smallest values), e.g. quintiles of sigma.

    Rows are ranked by value (ties broken by position, so every group gets
    :math:`\\lfloor n/G \\rfloor` or :math:`\\lceil n/G \\rceil` rows) and row of rank :math:`r`
    (0-based) goes to group :math:`\\lfloor r G / n \\rfloor`.

    Parameters
    ----------
    values : array_like, shape [n]
    n_groups : int
        Number G of groups (5 for quintiles), at most n.

    Returns
    -------
    numpy.ndarray of int, shape [n]
        Values in ``0 .. G-1``.
    """
    values = _as_1d("values", values)
    n_groups = int(n_groups)
    if not 1 <= n_groups <= values.size:
        raise ValueError(f"n_groups={n_groups} must lie in [1, n={values.size}]")
    rank = np.empty(values.size, dtype=np.int64)
    rank[np.argsort(values, kind="stable")] = np.arange(values.size)
    return (rank * n_groups) // values.size


def grouped_coverage(human, mu, sigma, groups, gamma: float = 0.9) -> dict[str, dict[str, float]]:
    """Coverage :math:`\\mathrm{acc}_g(\\gamma)` of the central Gaussian interval within each group.

    .. math:: \\mathrm{acc}_g(\\gamma) = \\frac{1}{|D_g|} \\sum_{j \\in D_g}
              \\mathbb 1\\left(|q^*_j - \\hat\\mu_j| \\le \\hat\\sigma_j \\operatorname{probit}((1+\\gamma)/2)\\right)

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.
    groups : array_like, shape [n_segments]
        Any labels (LP, domain, :func:`quantile_groups` of sigma, ...); keys are ``str(label)``.
    gamma : float
        Confidence level in [0, 1].

    Returns
    -------
    dict
        ``{str(label): {"coverage": acc_g, "n": |D_g|}}`` in sorted label order.
    """
    human, mu, sigma = _triple(human, mu, sigma)
    labels = np.asarray(groups)
    if labels.shape != human.shape:
        raise ValueError(f"groups must have one label per segment ({human.size}), got shape {labels.shape}")
    gamma = _check_gamma(gamma)
    inside = _z_abs(np.abs(human - mu), sigma) <= probit((1.0 + gamma) / 2.0)
    out = {}
    for label in sorted(set(labels.tolist()), key=str):
        rows = labels == label
        out[str(label)] = {"coverage": float(np.mean(inside[rows])), "n": float(rows.sum())}
    return out


def conditional_coverage_error(human, mu, sigma, groups, gamma: float = 0.9) -> float:
    """Worst coverage gap over groups, :math:`\\max_g |\\mathrm{acc}_g(\\gamma) - \\gamma|` (lower is better).

    Marginal calibration can hide intervals that are far too wide in one group and far too narrow
    in another (e.g. error-free vs major-error translations); this is the gap a user of the worst
    group sees.  See :func:`grouped_coverage` for :math:`\\mathrm{acc}_g`.

    Parameters
    ----------
    human, mu, sigma, groups : array_like, shape [n_segments]
        As in :func:`grouped_coverage`.
    gamma : float
        Confidence level in [0, 1].

    Returns
    -------
    float
        In [0, max(gamma, 1 - gamma)].
    """
    by_group = grouped_coverage(human, mu, sigma, groups, gamma)
    return float(max(abs(g["coverage"] - gamma) for g in by_group.values()))


def expected_normalized_calibration_error(human, mu, sigma, n_bins: int = 10) -> float:
    """Expected normalised calibration error (ENCE, Levi et al., 2019) over equal-count sigma bins.

    Segments are sorted by :math:`\\hat\\sigma` into B bins of (almost) equal size
    (:func:`quantile_groups`); in each bin the root mean predicted variance is compared with the
    root mean squared error:

    .. math:: \\mathrm{ENCE} = \\frac1B \\sum_{b=1}^B \\frac{|\\mathrm{RMV}_b - \\mathrm{RMSE}_b|}{\\mathrm{RMV}_b},
              \\quad \\mathrm{RMV}_b = \\sqrt{\\overline{\\hat\\sigma^2}_b}, \\quad
              \\mathrm{RMSE}_b = \\sqrt{\\overline{(q^* - \\hat\\mu)^2}_b}

    0 when the predicted sigma matches the error it announces in every bin; lower is better.  Unlike
    the ECE it sees whether *large* sigmas go with large errors, not only the pooled coverage.

    Parameters
    ----------
    human, mu : array_like, shape [n_segments]
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), > 0.
    n_bins : int
        Number B of bins, at most n_segments.

    Returns
    -------
    float
        >= 0.
    """
    human, mu, sigma = _triple(human, mu, sigma)
    if np.any(sigma <= 0):
        bad = int(np.flatnonzero(sigma <= 0)[0])
        raise ValueError(f"sigma[{bad}] = 0: the ENCE divides by the root mean variance of a bin")
    bins = quantile_groups(sigma, n_bins)
    squared_error = (human - mu) ** 2
    gaps = []
    for b in range(int(n_bins)):
        rows = bins == b
        rmv = math.sqrt(float(np.mean(sigma[rows] ** 2)))
        rmse = math.sqrt(float(np.mean(squared_error[rows])))
        gaps.append(abs(rmv - rmse) / rmv)
    return float(np.mean(gaps))


def sigma_spread_ratio(sigma, upper: float = 0.9, lower: float = 0.1) -> float:
    """How much the predicted sigma varies between segments: :math:`P_{90}(\\hat\\sigma) / P_{10}(\\hat\\sigma)`.

    .. math:: \\frac{Q_{\\hat\\sigma}(u)}{Q_{\\hat\\sigma}(l)}

    with :math:`Q` the empirical quantile (numpy's linear interpolation).  1 means every segment
    gets (almost) the same interval -- the fixed-variance baseline; compute it within one LP.
    Neither a score nor a loss: it describes how informative sigma is, not whether it is right.

    Parameters
    ----------
    sigma : array_like, shape [n_segments]
        Standard deviations (not variances), >= 0.
    upper, lower : float
        Quantile levels, ``0 <= lower < upper <= 1``.

    Returns
    -------
    float
        >= 1; ``inf`` when the lower quantile is 0.
    """
    sigma = _as_1d("sigma", sigma, nonnegative=True)
    lower, upper = _check_gamma(lower), _check_gamma(upper)
    if not lower < upper:
        raise ValueError(f"lower={lower!r} must be below upper={upper!r}")
    low, high = np.quantile(sigma, [lower, upper])
    return float(high / low) if low > 0 else float("inf")
