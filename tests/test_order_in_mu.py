"""The served distribution held stochastically ordered in mu (``evaluate.order_in_mu``): the pooled
knots by hand, the atom's pooled rates, and a served risk that cannot rise with mu where the rows'
own lower tail widens under the best predictions."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from tests.test_top_atom import BOUNDS, SIGNED
from uamt.serving.model_calibration import Calibration, fit_calibration, refit_served, with_top_atom
from uamt.uncertainty import EvaluationSettings
from uamt.uncertainty.atom import TopAtom
from uamt.uncertainty.candidates import SignedMondrianConformalCalibrator, fit_candidate

ORDERED = dataclasses.replace(SIGNED, order_in_mu=True)


def largest_rise(values: np.ndarray) -> float:
    """How far ``values`` (in mu order) climb above their lowest point so far: 0 for non-increasing."""
    return float(np.max(values - np.minimum.accumulate(values)))


def widening_below_the_best(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(human, mu)``: residuals whose lower tail is 4x wider for the best fifth of predictions
    than for the middling ones (the shape of WMT21 en-ru's calibration rows under the QE model)."""
    rng = np.random.default_rng(seed)
    mu = rng.uniform(-3.0, 0.0, n)
    below = np.where(mu > -0.6, 4.0, 1.0)
    noise = rng.normal(size=n)
    return mu + np.where(noise < 0, below, 0.5) * noise, mu


def test_pooled_knots_by_hand():
    calibrator = SignedMondrianConformalCalibrator(gammas=(0.5,), n_bins=2, order_in_mu=True)
    knots = {"mid0": 0.0, "mid1": 1.0, "b0:lo@0.5": -1.0, "b1:lo@0.5": -2.5, "b0:hi@0.5": 1.0, "b1:hi@0.5": 0.5}
    params = dict(knots)
    calibrator._order_in_mu(params, "", np.array([3, 1]), 1.0)
    # lo: c + s k = (-1, -1.5) falls -> pooled, weights 3:1, -1.125 at both centres -> k = (-1.125, -2.125)
    assert params["b0:lo@0.5"] == pytest.approx(-1.125) and params["b1:lo@0.5"] == pytest.approx(-2.125)
    assert params["b0:hi@0.5"] == 1.0 and params["b1:hi@0.5"] == 0.5  # (1, 1.5) already rises
    params = dict(knots)
    calibrator._order_in_mu(params, "", np.array([3, 1]), 2.0)
    # at scale 2: lo (-2, -4) -> -2.5 -> k = (-1.25, -1.75); hi (2, 2) stays
    assert params["b0:lo@0.5"] == pytest.approx(-1.25) and params["b1:lo@0.5"] == pytest.approx(-1.75)
    pit = {"mid0": 0.0, "mid1": 1.0, "b0:pit:lo@0.5": 0.2, "b1:pit:lo@0.5": 0.3, "b0:pit:hi@0.5": 0.8, "b1:pit:hi@0.5": 0.7}
    calibrator._order_in_mu(pit, "pit:", np.array([1, 1]), None)  # the PIT knots themselves
    assert pit["b0:pit:lo@0.5"] == 0.2 and pit["b1:pit:lo@0.5"] == 0.3
    assert pit["b0:pit:hi@0.5"] == pytest.approx(0.75) and pit["b1:pit:hi@0.5"] == pytest.approx(0.75)


def test_pooled_atom_rates_by_hand_and_through_the_file():
    at_top = np.array([1, 1, 1, 1, 0, 1, 1, 0, 0, 0], dtype=float)  # shares 0.8 then 0.4 as mu rises
    center = np.arange(10.0)
    lp = np.full(10, "en-ru", dtype=object)
    stepwise = TopAtom.fit(at_top - 1.0, center, lp, 0.0, n_bins=2, min_lp_rows=5, interpolate=False)
    ordered = TopAtom.fit(at_top - 1.0, center, lp, 0.0, n_bins=2, min_lp_rows=5, interpolate=False, ordered=True)
    assert stepwise.lp_params["en-ru"]["rates"] == pytest.approx([0.8, 0.4])
    assert ordered.lp_params["en-ru"]["rates"] == pytest.approx([0.6, 0.6])  # pooled, 5 rows each
    again = TopAtom.from_dict(json.loads(json.dumps(ordered.to_dict())))
    assert again.ordered and again == ordered and not TopAtom.from_dict(stepwise.to_dict()).ordered


@pytest.mark.parametrize("order_in_mu", [False, True])
def test_an_ordered_mondrian_distribution_cannot_rise_in_risk_with_mu(order_in_mu):
    human, mu = widening_below_the_best(0, 6000)
    calibrator = fit_candidate(
        "signed_mondrian_conformal", human, mu, np.ones_like(mu), None,
        common={"per_lp": False, "min_lp_rows": 50}, n_levels=100, ece_bound=0.01, order_in_mu=order_in_mu,
    )
    grid = np.linspace(-3.2, 0.2, 400)
    rises = []
    for chi in (-6.0, -4.0, -2.5):
        risk = calibrator.risk(grid, np.ones_like(grid), chi)
        rises.append(largest_rise(risk))
        assert np.all(np.diff(calibrator.risk(np.full(50, -1.0), np.ones(50), np.linspace(-8, 2, 50))) >= -1e-12)
    lower, upper = calibrator.interval_at(grid, np.ones_like(grid), 0.9)
    if not order_in_mu:  # the rows' own shape: the risk at -4 rises under the best predictions
        assert max(rises) > 0.02
        return
    assert max(rises) <= 1e-12
    assert np.all(np.diff(lower) >= -1e-12) and np.all(np.diff(upper) >= -1e-12)
    fresh, fresh_mu = widening_below_the_best(1, 6000)
    low, high = calibrator.interval_at(fresh_mu, np.ones_like(fresh_mu), 0.9)
    assert abs(np.mean((fresh >= low) & (fresh <= high)) - 0.9) < 0.02


def zero_inflated_widening(seed: int, n: int) -> pd.DataFrame:
    """MQM-like rows of one LP: more zeros as mu rises, and below 0 a wider tail under the best
    predictions (:func:`widening_below_the_best` clipped to the scale)."""
    rng = np.random.default_rng(seed)
    human, mu = widening_below_the_best(seed, n)
    human = np.where(rng.random(n) < 0.2 + 0.2 * (mu + 3.0), 0.0, np.clip(3.0 * human - 3.0, BOUNDS[0], -0.1))
    doc = np.array([f"en-ru/d{i // 10}" for i in range(n)], dtype=object)
    return pd.DataFrame({"lp": "en-ru", "human": human, "mu": mu, "sigma": 1.0, "doc": doc})


def test_the_served_mixture_ordered_in_mu_end_to_end(tmp_path):
    """Through the artifact: the point mass and the distribution below it, refitted, serve a risk
    and quantiles monotone in mu; the file says how it was fitted and serves the same answers."""
    dev = zero_inflated_widening(0, 5000)
    grid = np.linspace(dev["mu"].min(), dev["mu"].max(), 300)
    ones, lp = np.ones_like(grid), np.full(grid.size, "en-ru", dtype=object)
    served = {}
    for settings in (SIGNED, ORDERED):
        calibration, _ = fit_calibration(dev, "hts", settings=settings)
        calibration = with_top_atom(calibration, dev, "hts", settings, BOUNDS[1])
        served[settings.order_in_mu] = calibration
        assert calibration.below_top.served.order_in_mu is settings.order_in_mu
        assert calibration.top_atom.ordered is settings.order_in_mu
    assert max(largest_rise(served[False].risk(grid, ones, chi, lp)) for chi in (-10.0, -5.0)) > 0.02
    ordered = served[True]
    assert np.all(np.diff(ordered.top_atom.probability(ordered.center(grid, ones, lp), lp)) >= -1e-12)
    for chi in (-12.0, -10.0, -5.0, -1.0):
        assert np.diff(ordered.risk(grid, ones, chi, lp)).max() <= 1e-12
    for gamma in (0.5, 0.9):
        low, high = ordered.interval(grid, ones, gamma, lp, "conformal")
        assert np.all(np.diff(low) >= -1e-9) and np.all(np.diff(high) >= -1e-9)
    path = tmp_path / "calibration.json"
    ordered.save(path)
    again = Calibration.load(path)
    np.testing.assert_array_equal(again.risk(grid, ones, -5.0, lp), ordered.risk(grid, ones, -5.0, lp))
    refitted = refit_served(dev, "hts", ordered, ORDERED)  # a cross-fit or campaign refit keeps the order
    assert np.diff(refitted.risk(grid, ones, -5.0, lp)).max() <= 1e-12


def test_order_in_mu_is_a_setting_of_the_evaluate_section():
    assert EvaluationSettings().order_in_mu is False and ORDERED.order_in_mu is True
