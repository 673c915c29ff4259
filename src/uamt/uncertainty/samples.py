"""From stochastic predictions (MC dropout runs, ensemble members) to a Gaussian (mu, sigma).

Glushkova et al. (2021, §3.3) treat the N scores of a segment as a sample of
:math:`\\mathcal N(\\hat\\mu, \\hat\\sigma^2)` and take the sample mean and the sample variance.  Their
evaluation code uses ``numpy.std`` with its default ``ddof=0`` (the 1/N variance), and Eq. 4 of
Zerva et al. (2022) writes the same 1/N estimator, so ``ddof=0`` is the default here.
"""

from __future__ import annotations

import numpy as np

#: Degrees of freedom of the sample variance used by the papers (1/N estimator).
PAPER_DDOF = 0

def _as_samples(samples, name: str = "samples") -> np.ndarray:
    array = np.asarray(samples, dtype=float)
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D [n_segments, n_samples], got shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {array.shape})")
    if not np.all(np.isfinite(array)):
        row, col = (int(i[0]) for i in np.nonzero(~np.isfinite(array)))
        raise ValueError(f"{name}[{row}, {col}] = {array[row, col]!r} is not finite")
    return array


def samples_to_mu_sigma(samples, ddof: int = PAPER_DDOF) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian fit of per-segment score samples: sample mean and sample standard deviation.

    .. math::
        \\hat\\mu_j = \\frac1N \\sum_{k=1}^N \\hat q_{jk}, \\qquad
        \\hat\\sigma_j = \\sqrt{\\frac{1}{N - \\mathrm{ddof}} \\sum_{k=1}^N (\\hat q_{jk} - \\hat\\mu_j)^2}

    Parameters
    ----------
    samples : array_like, shape [n_segments, n_samples]
        Quality scores of the N stochastic forward passes (MC dropout) or ensemble members.
    ddof : int
        0 (default, the papers' choice) for the 1/N variance, 1 for the unbiased 1/(N-1) one.

    Returns
    -------
    mu : numpy.ndarray, shape [n_segments]
    sigma : numpy.ndarray, shape [n_segments]
        Standard deviations (not variances).
    """
    array = _as_samples(samples)
    if ddof not in (0, 1):
        raise ValueError(f"ddof={ddof!r} not supported; choose from [0, 1]")
    if array.shape[1] - ddof < 1:
        raise ValueError(f"need more than {ddof} sample(s) per segment for ddof={ddof}, got {array.shape[1]}")
    return array.mean(axis=1), array.std(axis=1, ddof=ddof)


def average_over_references(samples) -> np.ndarray:
    """Multi-reference pooling of §3.4: average the N predictions pointwise across references.

    .. math:: \\hat q_{jk} = \\frac{1}{|R_j|} \\sum_{r \\in R_j} \\hat q_{jk}^{(r)}

    Parameters
    ----------
    samples : array_like, shape [n_segments, n_references, n_samples]
        The k-th stochastic prediction obtained with each reference (same dropout run / ensemble
        member k across references).

    Returns
    -------
    numpy.ndarray, shape [n_segments, n_samples]
        Feed to :func:`samples_to_mu_sigma`.
    """
    array = np.asarray(samples, dtype=float)
    if array.ndim != 3 or 0 in array.shape:
        raise ValueError(
            f"samples must be 3-D [n_segments, n_references, n_samples], got shape {array.shape}"
        )
    return _as_samples(array.mean(axis=1))


def combine_heteroscedastic_samples(
    mu_samples, var_samples
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Total uncertainty of HTS+MCD (Eq. 4 of Zerva et al., 2022): epistemic + aleatoric variance.

    .. math::
        \\hat U_{total} = \\underbrace{\\frac1M \\sum_k \\hat q_k^2 - \\Big(\\frac1M \\sum_k \\hat q_k\\Big)^2}_{\\text{epistemic}}
        + \\underbrace{\\frac1M \\sum_k \\hat\\sigma_k^2}_{\\text{aleatoric}}

    Parameters
    ----------
    mu_samples : array_like, shape [n_segments, n_samples]
        Predicted means of the M stochastic passes.
    var_samples : array_like, shape [n_segments, n_samples]
        Predicted **variances** :math:`\\hat\\sigma_k^2` (not standard deviations), >= 0.

    Returns
    -------
    mu : numpy.ndarray, shape [n_segments]
    sigma : numpy.ndarray, shape [n_segments]
        Total standard deviation :math:`\\sqrt{\\hat U_{total}}`.
    epistemic_var : numpy.ndarray, shape [n_segments]
        Variance of the M means (1/M estimator).
    aleatoric_var : numpy.ndarray, shape [n_segments]
        Mean of the M predicted variances.
    """
    mu_arr = _as_samples(mu_samples, "mu_samples")
    var_arr = _as_samples(var_samples, "var_samples")
    if mu_arr.shape != var_arr.shape:
        raise ValueError(f"mu_samples {mu_arr.shape} and var_samples {var_arr.shape} differ in shape")
    if np.any(var_arr < 0):
        raise ValueError("var_samples are variances and must be >= 0")
    epistemic = mu_arr.var(axis=1, ddof=PAPER_DDOF)
    aleatoric = var_arr.mean(axis=1)
    return mu_arr.mean(axis=1), np.sqrt(epistemic + aleatoric), epistemic, aleatoric


def parse_samples_field(text: str, separator: str = "|") -> np.ndarray:
    """Parse one ``|``-separated field of scores (the ``samples`` column of a predictions CSV).

    Parameters
    ----------
    text : str
        E.g. ``"0.31|0.29|0.40"``.

    Returns
    -------
    numpy.ndarray, shape [n_samples]

    Raises
    ------
    ValueError
        On an empty field, an empty item or a non-finite / non-numeric item (message names it).
    """
    items = str(text).strip().split(separator)
    values = []
    for position, item in enumerate(items, start=1):
        item = item.strip()
        if not item:
            raise ValueError(f"sample {position} is empty")
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"sample {position} {item!r} is not a number") from None
        if not np.isfinite(value):
            raise ValueError(f"sample {position} {item!r} is not finite")
        values.append(value)
    return np.asarray(values, dtype=float)
