"""Isotonic distributional regression (uamt.uncertainty.isotonic): hand-computed fits, in-sample
calibration at every threshold, monotonicity, quantiles, the served adapter and the artifact."""

from __future__ import annotations

import numpy as np
import pytest

from uamt.uncertainty.isotonic import IsotonicDistribution, ServedIsotonic


def _zero_inflated(n: int, seed: int = 0):
    """MQM-like rows: a perfect score with a probability falling as mu falls, else -1, -5 or worse."""
    rng = np.random.default_rng(seed)
    center = rng.uniform(-10.0, 0.0, n)
    perfect = rng.random(n) < 1.0 / (1.0 + np.exp(-(center + 3.0)))
    errors = rng.choice([-1.0, -2.0, -5.0, -6.0, -10.0, -25.0], size=n, p=[0.35, 0.15, 0.25, 0.1, 0.1, 0.05])
    human = np.where(perfect, 0.0, np.minimum(errors + 0.3 * center, -0.1))
    return np.round(human, 1), center


def test_hand_computed_fit_and_interpolation():
    # threshold -5: indicators [1, 1, 0, 0] are already non-increasing in x, so the fit is them;
    # threshold 0 covers every row (1 everywhere)
    idr = IsotonicDistribution.fit([-5.0, -5.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0], ["a"] * 4, n_knots=4, min_lp_rows=1)
    assert idr.lp_params["a"]["thresholds"] == [-5.0, 0.0]
    np.testing.assert_allclose(idr.cdf([0.0, 1.0, 1.5, 2.0, 3.0, 9.0], "a", -5.0), [1.0, 1.0, 0.5, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(idr.cdf([1.5], "a", -6.0), [0.0])  # below every score
    np.testing.assert_allclose(idr.cdf([1.5], "a", 0.0), [1.0])
    # a violator pair is pooled: indicators [1, 0, 1, 0] at x = 0..3 -> [1, 0.5, 0.5, 0]
    idr = IsotonicDistribution.fit([-5.0, 0.0, -5.0, 0.0], [0.0, 1.0, 2.0, 3.0], ["a"] * 4, n_knots=4, min_lp_rows=1)
    np.testing.assert_allclose(idr.cdf([0.0, 1.0, 2.0, 3.0], "a", -5.0), [1.0, 0.5, 0.5, 0.0])


def test_in_sample_risk_is_calibrated_at_every_threshold():
    human, center = _zero_inflated(400)
    idr = IsotonicDistribution.fit(human, center, ["x"] * human.size, n_knots=human.size, max_thresholds=1000)
    for t in np.unique(human):
        # isotonic regression keeps each block's mean, so the mean predicted share is the observed one
        predicted = idr.cdf(center, "x", t)
        observed = (human <= t).astype(float)
        assert predicted.mean() == pytest.approx(observed.mean(), abs=1e-9)


def test_cdf_monotone_in_value_and_center_and_quantiles_invert_it():
    human, center = _zero_inflated(600, seed=1)
    idr = IsotonicDistribution.fit(human, center, ["x"] * human.size, n_knots=50)
    grid = np.linspace(-12.0, 1.0, 27)
    values = np.linspace(-30.0, 0.0, 61)
    cdf = np.stack([idr.cdf(grid, "x", v) for v in values], axis=1)  # [centers, values]
    assert np.all(np.diff(cdf, axis=1) >= -1e-12)  # non-decreasing in the value
    assert np.all(np.diff(cdf, axis=0) <= 1e-12)  # a higher mu: stochastically higher score
    for p in (0.05, 0.3, 0.5, 0.95, 1.0):
        q = idr.quantile(grid, "x", p)
        assert np.all(idr.cdf(grid, "x", q) >= p - 1e-9)
        assert np.all(idr.cdf(grid, "x", np.nextafter(q, -np.inf)) < p)
    low, high = idr.interval(grid, "x", 0.9)
    np.testing.assert_array_equal(low, idr.quantile(grid, "x", 0.05))
    np.testing.assert_array_equal(high, idr.quantile(grid, "x", 0.95))
    with pytest.raises(ValueError, match="p=0"):
        idr.quantile(grid, "x", 0.0)


def test_unseen_lp_gets_the_global_fit_and_small_lps_have_none():
    human, center = _zero_inflated(300, seed=2)
    lp = np.where(np.arange(300) < 280, "big", "small")
    idr = IsotonicDistribution.fit(human, center, lp, min_lp_rows=50)
    assert sorted(idr.lp_params) == ["big"]
    np.testing.assert_array_equal(idr.cdf(center[:5], "unseen", -5.0), idr.cdf(center[:5], None, -5.0))
    np.testing.assert_array_equal(idr.cdf(center[:5], np.array(["small"] * 5, dtype=object), -5.0), idr.cdf(center[:5], None, -5.0))


def test_round_trip_and_refused_artifacts():
    human, center = _zero_inflated(200, seed=3)
    idr = IsotonicDistribution.fit(human, center, ["x"] * 200, min_lp_rows=50)
    back = IsotonicDistribution.from_dict(idr.to_dict())
    np.testing.assert_array_equal(back.cdf(center, "x", -5.0), idr.cdf(center, "x", -5.0))
    data = idr.to_dict()
    data["per_lp"]["x"]["cdf"][0] = list(reversed(data["per_lp"]["x"]["cdf"][0]))
    with pytest.raises(ValueError, match=r"isotonic\[x\].*non-decreasing"):
        IsotonicDistribution.from_dict(data)
    data = idr.to_dict()
    data["global"] = None
    with pytest.raises(ValueError, match=r"isotonic\[global\] is not fitted"):
        IsotonicDistribution.from_dict(data)
    with pytest.raises(ValueError, match="must be 1-d and equal"):
        IsotonicDistribution.fit([0.0, -1.0], [0.0], ["x", "x"])


class _Shift:
    """A base calibration whose served mu is mu + 1 (what ServedIsotonic takes from it)."""

    def center(self, mu, sigma, lp=None, n_refs=None):
        return np.asarray(mu, dtype=float) + 1.0

    def raw_sigma_on_human_scale(self, mu, sigma, lp=None):
        return np.asarray(sigma, dtype=float)


def test_served_adapter_answers_from_the_base_center():
    human, center = _zero_inflated(300, seed=4)
    idr = IsotonicDistribution.fit(human, center, ["x"] * 300)
    served = ServedIsotonic(_Shift(), idr)
    mu = np.array([-6.0, -3.0, -1.0])
    lp = np.array(["x"] * 3, dtype=object)
    np.testing.assert_array_equal(served.risk(mu, np.ones(3), -5.0, lp), idr.cdf(mu + 1.0, lp, -5.0))
    low, high = served.interval(mu, np.ones(3), 0.8, lp)
    np.testing.assert_array_equal(low, idr.quantile(mu + 1.0, lp, 0.1))
    assert not served.is_gaussian
    with pytest.raises(ValueError, match="n_refs"):
        served.risk(mu, np.ones(3), -5.0, lp, n_refs=np.array([2, 2, 2]))
