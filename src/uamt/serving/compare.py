"""Compare MT systems on the same segments: system scores and P(system A better than system B).

Normal approximation (default)
    With segment qualities :math:`Q^A_i \\sim \\mathcal N(\\hat\\mu^A_i, \\hat\\sigma^{A\\,2}_i)` and
    :math:`Q^B_i` alike, independent across segments and between the two systems, the difference of
    the mean scores :math:`D = \\frac1n \\sum_i (Q^A_i - Q^B_i)` is Gaussian with mean
    :math:`\\bar\\mu^A - \\bar\\mu^B` and standard deviation
    :math:`\\sqrt{\\sum_i (\\hat\\sigma^{A\\,2}_i + \\hat\\sigma^{B\\,2}_i)} / n`, so
    :math:`P(A > B) = \\Phi\\big((\\bar\\mu^A - \\bar\\mu^B) / \\mathrm{sd}(D)\\big)`.
    Errors of two systems on the same segment are usually positively correlated, which this
    ignores: the difference's spread is then overestimated and the probability conservative
    (pulled towards 0.5).

Paired bootstrap (``n_bootstrap > 0``)
    Resample segment indices with replacement (the same indices for every system), draw each
    resampled segment's quality from its predictive Gaussian, compare the two means; the
    probability is the share of resamples where A's mean is higher (ties count one half).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import ndtr

from uamt.serving.scores import INDEPENDENCE_ASSUMPTION, bootstrap_means, system_score

PAIR_ASSUMPTION = (
    "independent segments and systems: mean(mu_A - mu_B) ~ Normal with "
    "sd = sqrt(sum(sigma_A^2 + sigma_B^2)) / n; P(A better) = Phi(mean / sd)"
)
PAIRED_BOOTSTRAP_METHOD = (
    "paired bootstrap: the same resampled segments for both systems, each quality drawn from "
    "N(mu_i, sigma_i^2); P = share of resamples with mean_A > mean_B (ties 1/2)"
)


def probability_better(mu_a, sigma_a, mu_b, sigma_b) -> tuple[float, float, float]:
    """P(system A's mean quality > system B's) under the normal approximation (module docstring).

    Parameters
    ----------
    mu_a, sigma_a, mu_b, sigma_b : array_like, shape [n_segments]
        Segment means and standard deviations of the two systems on the same segments.

    Returns
    -------
    (probability, difference, difference_sigma) : tuple of float
        ``difference`` = mean(mu_a) - mean(mu_b) and its standard deviation.  With zero spread
        the probability is 1, 0 or 0.5 by the sign of the difference.
    """
    mu_a, sigma_a, mu_b, sigma_b = (np.asarray(x, dtype=float) for x in (mu_a, sigma_a, mu_b, sigma_b))
    if not (mu_a.shape == sigma_a.shape == mu_b.shape == sigma_b.shape) or mu_a.ndim != 1 or mu_a.size == 0:
        raise ValueError(
            "mu_a, sigma_a, mu_b, sigma_b must be 1-D arrays of one common, non-zero length; got shapes "
            f"{[x.shape for x in (mu_a, sigma_a, mu_b, sigma_b)]}"
        )
    n = mu_a.size
    difference = float(mu_a.mean() - mu_b.mean())
    sd = math.sqrt(float(np.sum(sigma_a**2 + sigma_b**2))) / n
    if sd == 0.0:
        probability = 0.5 if difference == 0.0 else float(difference > 0.0)
    else:
        probability = float(ndtr(difference / sd))
    return probability, difference, sd


def paired_bootstrap_probability(
    mu_a, sigma_a, mu_b, sigma_b, n_bootstrap: int, seed: int = 0, chunk_cells: int = 2_000_000
) -> float:
    """P(A > B) by the paired bootstrap of the module docstring; seeded, memory-bounded."""
    mu_a, sigma_a, mu_b, sigma_b = (np.asarray(x, dtype=float) for x in (mu_a, sigma_a, mu_b, sigma_b))
    if n_bootstrap < 1:
        raise ValueError(f"n_bootstrap must be >= 1, got {n_bootstrap}")
    n = mu_a.size
    rng = np.random.default_rng(seed)
    per_chunk = max(1, chunk_cells // max(1, n))
    wins = 0.0
    done = 0
    while done < n_bootstrap:
        k = min(per_chunk, n_bootstrap - done)
        idx = rng.integers(0, n, size=(k, n))
        mean_a = bootstrap_means(mu_a, sigma_a, k, rng, idx=idx)
        mean_b = bootstrap_means(mu_b, sigma_b, k, rng, idx=idx)
        wins += float(np.sum(mean_a > mean_b)) + 0.5 * float(np.sum(mean_a == mean_b))
        done += k
    return wins / n_bootstrap


def compare_outputs(
    outputs: dict[str, pd.DataFrame],
    *,
    confidence: float,
    n_bootstrap: int = 0,
    seed: int = 0,
    bounds=None,
) -> dict[str, Any]:
    """System scores of every system and P(A better than B) for every pair (A listed before B).

    Parameters
    ----------
    outputs : dict
        System name -> predictor output (``mu``, ``sigma``, ...) on the same segments, same order.
    bounds : (low, high), optional
        The scale's range; system intervals are clipped to it.

    Returns
    -------
    dict
        ``systems``: list of ``{name, n_segments, system_score, system_sigma, system_lower,
        system_upper[, system_bootstrap_*]}``; ``pairs``: list of ``{a, b, difference,
        difference_sigma, p_a_better[, p_a_better_bootstrap]}``; the assumptions as text.
    """
    names = list(outputs)
    systems = []
    for k, name in enumerate(names):
        out = outputs[name]
        score = system_score(
            out["mu"], out["sigma"], confidence, n_bootstrap=n_bootstrap, seed=seed + k, bounds=bounds
        )
        systems.append({"name": name, "n_segments": len(out), **score.as_dict()})
    pairs = []
    for i, a in enumerate(names):
        for j in range(i + 1, len(names)):
            b = names[j]
            args = (outputs[a]["mu"], outputs[a]["sigma"], outputs[b]["mu"], outputs[b]["sigma"])
            probability, difference, sd = probability_better(*args)
            pair: dict[str, Any] = {
                "a": a,
                "b": b,
                "difference": difference,
                "difference_sigma": sd,
                "p_a_better": probability,
            }
            if n_bootstrap:
                pair["p_a_better_bootstrap"] = paired_bootstrap_probability(*args, n_bootstrap, seed=seed)
            pairs.append(pair)
    result: dict[str, Any] = {
        "confidence": confidence,
        "systems": systems,
        "pairs": pairs,
        "system_interval_assumption": INDEPENDENCE_ASSUMPTION,
        "pair_assumption": PAIR_ASSUMPTION,
    }
    if n_bootstrap:
        result.update(n_bootstrap=n_bootstrap, seed=seed, bootstrap_method=PAIRED_BOOTSTRAP_METHOD)
    return result


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def comparison_table(result: dict[str, Any]) -> str:
    """A plain-text table: one row per system, then P(row better than column) for every pair."""
    systems: Sequence[dict[str, Any]] = result["systems"]
    bootstrap = bool(result.get("n_bootstrap"))
    width = max(8, *(len(s["name"]) for s in systems))
    level = f"{round(100 * result['confidence'], 2):g}%"
    head = f"{'system':<{width}}  {'score':>9}  {'sigma':>8}  {level + ' interval':>22}"
    if bootstrap:
        head += f"  {'bootstrap interval':>22}"
    lines = []
    if "scale" in result:
        lines.append(
            f"scale: {result['scale']}  model: {result.get('model', '?')}  method: {result.get('method', '?')}"
        )
    lines += [head, "-" * len(head)]
    for s in systems:
        row = (
            f"{s['name']:<{width}}  {s['system_score']:>9.4f}  {s['system_sigma']:>8.4f}  "
            f"{'[' + _fmt(s['system_lower']) + ', ' + _fmt(s['system_upper']) + ']':>22}"
        )
        if bootstrap:
            row += f"  {'[' + _fmt(s['system_bootstrap_lower']) + ', ' + _fmt(s['system_bootstrap_upper']) + ']':>22}"
        lines.append(row)
    if result["pairs"]:
        names = [s["name"] for s in systems]
        prob: dict[tuple[str, str], tuple[float, float | None]] = {}
        for p in result["pairs"]:
            boot = p.get("p_a_better_bootstrap")
            prob[(p["a"], p["b"])] = (p["p_a_better"], boot)
            prob[(p["b"], p["a"])] = (1.0 - p["p_a_better"], None if boot is None else 1.0 - boot)
        cell = 15 if bootstrap else 7
        lines.append("")
        lines.append(
            "P(row better than column)"
            + (": normal approximation (paired bootstrap)" if bootstrap else ": normal approximation")
        )
        # A name wider than its column (a path such as /data/sysA.txt) would be cut to a prefix that
        # several systems share: number the systems instead, the number before each row's name.
        if any(len(n) > cell for n in names):
            labels = [f"#{k}" for k in range(1, len(names) + 1)]
            row_names = [f"{label} {n}" for label, n in zip(labels, names, strict=True)]
        else:
            labels = row_names = names
        name_width = max(width, *(len(n) for n in row_names))
        lines.append(f"{'':<{name_width}}" + "".join(f"  {label:>{cell}}" for label in labels))
        for a, row_name in zip(names, row_names, strict=True):
            cells = []
            for b in names:
                if a == b:
                    text = "-"
                else:
                    p_norm, p_boot = prob[(a, b)]
                    text = f"{p_norm:.3f}" + (f" ({p_boot:.3f})" if p_boot is not None else "")
                cells.append(f"  {text:>{cell}}")
            lines.append(f"{row_name:<{name_width}}" + "".join(cells))
    return "\n".join(lines) + "\n"
