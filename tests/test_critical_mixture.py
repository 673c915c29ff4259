"""The critical-error point mass of benchmarks/critical_mixture.py: the mixture's quantiles, risk and
mean against a brute-force inversion of its CDF."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from scipy.stats import norm

from benchmarks.critical_mixture import make_detector, mixed_answers

GRID = 400


def gaussian_rows(mu: np.ndarray, sd: float, thresholds) -> SimpleNamespace:
    """A served distribution N(mu, sd^2) per row on a mid-point quantile grid, as served_rows gives it."""
    probs = (np.arange(GRID) + 0.5) / GRID
    return SimpleNamespace(
        center=mu,
        probs=probs,
        quantiles=mu[:, None] + sd * norm.ppf(probs)[None, :],
        risk={t: norm.cdf((t - mu) / sd) for t in thresholds},
    )


def brute_quantile(level: float, mu: float, sd: float, p: float, atom: float) -> float:
    """inf {x : p 1[x >= atom] + (1 - p) Phi((x - mu) / sd) >= level}, on a fine grid."""
    x = np.linspace(-60.0, 20.0, 400_001)
    cdf = p * (x >= atom) + (1 - p) * norm.cdf((x - mu) / sd)
    return float(x[np.argmax(cdf >= level)])


@pytest.mark.parametrize("atom", [-25.0, -10.0, -5.0])
def test_mixture_matches_its_cdf(atom):
    mu = np.array([-1.0, -8.0, -24.0, -2.0])
    p = np.array([0.0, 0.3, 0.6, 0.97])
    rows = gaussian_rows(mu, 4.0, (-5.0, atom))
    answers = mixed_answers(rows, p, chi=-5.0, gamma=0.9, k=20, atom=atom)
    assert answers.risk == pytest.approx(p + (1 - p) * norm.cdf((-5.0 - mu) / 4.0))
    assert answers.center == pytest.approx(p * atom + (1 - p) * mu)
    assert np.all(np.diff(answers.quantiles, axis=1) >= -1e-9)
    for i in range(mu.size):
        expected = [brute_quantile(level, mu[i], 4.0, p[i], atom) for level in answers.probs]
        # the grid's linear interpolation of the Gaussian tails: within 0.15 MQM of the exact inverse
        assert answers.quantiles[i] == pytest.approx(expected, abs=0.15)
        assert answers.lower[i] == pytest.approx(brute_quantile(0.05, mu[i], 4.0, p[i], atom), abs=0.15)
        assert answers.upper[i] == pytest.approx(brute_quantile(0.95, mu[i], 4.0, p[i], atom), abs=0.15)


def test_no_mass_is_the_served_distribution():
    mu = np.array([-3.0, 0.5])
    rows = gaussian_rows(mu, 2.0, (-5.0, -25.0))
    answers = mixed_answers(rows, np.zeros(2), chi=-5.0, gamma=0.9, k=GRID)
    assert answers.quantiles == pytest.approx(rows.quantiles)
    assert answers.risk == pytest.approx(rows.risk[-5.0])


def test_atom_above_the_risk_threshold_is_refused():
    rows = gaussian_rows(np.zeros(1), 1.0, (-5.0, -1.0))
    with pytest.raises(ValueError, match="atom=-1.0 must be at most chi=-5.0"):
        mixed_answers(rows, np.zeros(1), chi=-5.0, gamma=0.9, atom=-1.0)


def test_unknown_detector_is_refused():
    with pytest.raises(ValueError, match="detector='forest' not supported"):
        make_detector("forest", 1.0, 0)
