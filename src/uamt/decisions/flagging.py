"""Flag translations for post-editing from the served risk, with a threshold that controls misses.

A user sets "flag every translation with quality <= chi".  The served risk P(Q <= chi) of each
translation is compared with a threshold lambda: ``flagged = risk > lambda`` (:func:`flags`).

Conformal risk control (Angelopoulos et al., 2022) chooses lambda on labelled dev rows so that the
share of *bad* translations (human <= chi) left unflagged is at most ``alpha`` in expectation,
with a finite-sample guarantee: with the loss of a bad dev row ``L_i(lambda) = 1[score_i <=
lambda]`` (unflagged; bounded by B = 1, non-decreasing in lambda) and its mean R_n(lambda) over
the n bad dev rows, :func:`crc_threshold` returns the largest lambda with

    n / (n + 1) * R_n(lambda) + B / (n + 1) <= alpha,

so that E[1[a new bad row goes unflagged]] <= alpha whenever the new bad row and the n dev bad
rows are exchangeable (same LP mix, same model and calibration, scores not fitted on these dev
rows: the pipeline's cross-fitted dev risks).  It is a guarantee in expectation over dev draws,
not for every test set; and it says nothing about how many good translations get flagged (that is
what a better score improves).  Any score works (higher = more suspicious): the risk, or minus the
served mu (the same control without the uncertainty), which is how the value of the risk is
measured.
"""

from __future__ import annotations

import math

import numpy as np

from uamt.core.errors import DataError


def flags(risk, max_risk: float) -> np.ndarray:
    """``risk > max_risk`` (bool, shape [n]): the flag of every translation."""
    if not (math.isfinite(max_risk) and 0.0 <= max_risk <= 1.0):
        raise DataError(f"max_risk={max_risk!r} must be a probability in [0, 1]")
    risk = np.asarray(risk, dtype=float)
    if np.isnan(risk).any():
        raise DataError(f"risk of row {int(np.flatnonzero(np.isnan(risk))[0])} is NaN")
    return risk > max_risk


def crc_threshold(bad_scores, alpha: float, *, bound: float = 1.0) -> float:
    """The largest lambda whose conformal risk-control bound on the miss rate is <= ``alpha``.

    Parameters
    ----------
    bad_scores : array_like, shape [n]
        The score (e.g. the served risk) of every *bad* dev row; a row is flagged when its score
        exceeds lambda.
    alpha : float
        Target share of bad rows left unflagged, in (0, 1).
    bound : float
        B, the largest loss (1 for a miss indicator).

    Returns
    -------
    float
        lambda; ``-inf`` (flag everything) when even lambda below every score cannot meet the bound,
        i.e. when n is too small: ``B / (n + 1) > alpha``.
    """
    if not 0.0 < alpha < 1.0:
        raise DataError(f"alpha={alpha!r} must be in (0, 1)")
    scores = np.sort(np.asarray(bad_scores, dtype=float))
    if scores.size == 0:
        raise DataError("no bad dev rows: the miss rate cannot be controlled")
    if np.isnan(scores).any():
        raise DataError("a bad dev row has a NaN score")
    n = scores.size
    # k misses are allowed when n/(n+1) * k/n + B/(n+1) <= alpha  <=>  k <= alpha (n + 1) - B.
    allowed = math.floor(alpha * (n + 1) - bound + 1e-12)
    if allowed < 0:
        return -math.inf
    if allowed >= n:
        return math.inf
    # Largest lambda leaving at most `allowed` rows with score <= lambda: just below the
    # (allowed + 1)-th smallest score (ties at that value stay flagged).
    return float(np.nextafter(scores[allowed], -np.inf))


def crc_bound(bad_scores, threshold: float, *, bound: float = 1.0) -> float:
    """``n/(n+1) * R_n(threshold) + B/(n+1)`` on the bad dev rows (what :func:`crc_threshold` keeps <= alpha)."""
    scores = np.asarray(bad_scores, dtype=float)
    n = scores.size
    return n / (n + 1) * float(np.mean(scores <= threshold)) + bound / (n + 1)


def flag_quality(score, human, threshold: float, chi: float) -> dict[str, float | int | None]:
    """Precision, recall (= 1 - miss rate), share flagged and miss rate of ``score > threshold`` as
    flags of ``human <= chi`` (shape [n] each)."""
    score = np.asarray(score, dtype=float)
    bad = np.asarray(human, dtype=float) <= chi
    flagged = score > threshold
    n_bad, n_flag = int(bad.sum()), int(flagged.sum())
    hits = int((bad & flagged).sum())
    return {
        "n": int(score.size),
        "n_bad": n_bad,
        "flagged_share": float(flagged.mean()) if score.size else None,
        "precision": hits / n_flag if n_flag else None,
        "recall": hits / n_bad if n_bad else None,
        "miss_rate": 1 - hits / n_bad if n_bad else None,
    }
