"""A point mass at the top of the scale: its fit, the served mixture, the randomised coverage that
scores it, and its round trip through the artifact."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from uamt.core.errors import UamtError
from uamt.model_evaluation import ask, measure
from uamt.serving.model_calibration import Calibration, fit_calibration, refit_served, with_top_atom
from uamt.uncertainty import EvaluationSettings
from uamt.uncertainty.atom import TopAtom
from uamt.uncertainty.served import randomised_shares

BOUNDS = (-25.0, 0.0)
SIGNED = EvaluationSettings(
    min_lp_rows=20,
    calibration="signed_mondrian_conformal",
    calibration_candidates=("signed_mondrian_conformal",),
    mu_scaling="regression",
    top_atom=True,
)


def zero_inflated(seed: int, n: int, p_zero=(0.7, 0.3)) -> pd.DataFrame:
    """MQM-like rows: P(0) depends on the LP and on a latent quality the prediction sees."""
    rng = np.random.default_rng(seed)
    lp = np.array(["en-ru", "zh-en"], dtype=object)[rng.integers(0, 2, n)]
    latent = rng.normal(size=n)
    base = np.where(lp == "en-ru", p_zero[0], p_zero[1])
    zero = rng.random(n) < np.clip(base + 0.15 * latent, 0.02, 0.98)
    human = np.where(zero, 0.0, -np.minimum(rng.gamma(1.5, 3.0, n) + 0.1, 25.0))
    mu = np.where(zero, 0.0, human) * 0.4 + latent + rng.normal(0.0, 1.5, n)
    doc = np.array([f"{lp[i]}/d{i // 10}" for i in range(n)], dtype=object)
    return pd.DataFrame({"lp": lp, "human": human, "mu": mu, "sigma": 0.5 + rng.random(n), "doc": doc})


@pytest.fixture(scope="module")
def fitted():
    dev, test = zero_inflated(0, 3000), zero_inflated(1, 3000)
    calibration, _ = fit_calibration(dev, "hts", settings=SIGNED)
    return dev, test, calibration, with_top_atom(calibration, dev, "hts", SIGNED, BOUNDS[1])


def test_randomised_shares_hand_computed():
    human = np.array([0.0, -25.0, -3.0, 0.0])
    lower = np.array([-5.0, -25.0, -2.0, -5.0])
    upper = np.array([0.0, -20.0, 0.0, 0.0])
    # Row 0: PIT in [0.6, 1], band at 0.5 = [0.25, 0.75]: inside (0.75-0.6)/0.4, above 0.25/0.4.
    # Row 1: PIT in [0, 0.1] at the bottom: below 0.1 -> 0.25 is all of it -> below 1.
    # Row 2: strictly inside the scale, below the interval: counted as the interval says.
    # Row 3: no atom (F(0^-) = 1): its PIT is 1, above the band.
    cdf = np.array([[0.0, 0.6], [0.1, 0.9], [0.0, 0.5], [0.0, 1.0]])
    below, inside, above = randomised_shares(human, 0.5, lower, upper, BOUNDS, cdf)
    np.testing.assert_allclose(below, [0.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(inside, [0.375, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(above, [0.625, 0.0, 0.0, 1.0])
    # Without the CDF at the bounds, the closed interval decides every row.
    below, inside, above = randomised_shares(human, 0.5, lower, upper)
    np.testing.assert_array_equal(inside, [1.0, 1.0, 0.0, 1.0])


def test_a_calibrated_mixture_covers_gamma_in_expectation_and_more_as_a_closed_interval():
    rng = np.random.default_rng(3)
    n, pi = 40_000, 0.6
    # Truth and forecast: P(0) = 0.6, otherwise N(-5, 2^2) clipped at the bottom (far away).
    human = np.where(rng.random(n) < pi, 0.0, rng.normal(-5.0, 2.0, n))
    cdf = np.column_stack([np.zeros(n), np.full(n, 1 - pi)])
    for gamma in (0.2, 0.5, 0.9):
        p_lo, p_hi = (1 - gamma) / 2, (1 + gamma) / 2
        lower = np.full(n, 0.0 if p_lo >= 1 - pi else -5.0 + 2.0 * norm.ppf(p_lo / (1 - pi)))
        upper = np.full(n, 0.0 if p_hi >= 1 - pi else -5.0 + 2.0 * norm.ppf(p_hi / (1 - pi)))
        below, inside, above = randomised_shares(human, gamma, lower, upper, BOUNDS, cdf)
        assert inside.mean() == pytest.approx(gamma, abs=0.01)
        assert below.mean() == pytest.approx((1 - gamma) / 2, abs=0.01)
        closed = np.mean((human >= lower) & (human <= upper))
        # The closed interval takes in the whole atom: P(Q >= lower) = 1 - p_lo, or the atom alone.
        assert closed == pytest.approx(1 - p_lo if p_lo < 1 - pi else pi, abs=0.01)
        assert closed > gamma + 0.04


def test_top_atom_fit_and_probability_hand_computed():
    human = np.array([0.0, 0.0, -1.0, -4.0, 0.0, -2.0])
    center = np.array([-0.5, -0.2, -3.0, -4.0, -0.1, -2.5])
    lp = np.array(["a"] * 4 + ["b"] * 2, dtype=object)
    atom = TopAtom.fit(human, center, lp, 0.0, n_bins=2, min_lp_rows=3, interpolate=False)
    # LP a: edge at the median centre -1.75; below it -3, -4 (no zero), above -0.5, -0.2 (both 0).
    assert atom.lp_params["a"]["edges"] == [pytest.approx(-1.75)]
    assert atom.lp_params["a"]["rates"] == [0.0, 1.0]
    assert "b" not in atom.lp_params  # 2 rows < min_lp_rows: the global fallback
    np.testing.assert_allclose(atom.probability([-3.5, -0.3], ["a", "a"]), [0.0, 1.0])
    glob = atom.global_params
    np.testing.assert_allclose(atom.probability([-2.6, -0.1], ["b", "unseen"]), [glob["rates"][0], glob["rates"][1]])
    assert TopAtom.from_dict(json.loads(json.dumps(atom.to_dict()))) == atom
    older = {k: v for k, v in atom.to_dict().items() if k != "interpolate"}  # written before the interpolation
    assert not TopAtom.from_dict(older).interpolate
    # With mass already clipped onto the top (mean 0.2 in a bin whose share is 0.5): pi = 0.3 / 0.8.
    topped = TopAtom.fit([0.0, -1.0], [-1.0, -1.0], ["a", "a"], 0.0, clipped=[0.1, 0.3], n_bins=1, min_lp_rows=1)
    assert topped.lp_params["a"]["rates"] == [pytest.approx(0.375)]
    assert atom.problem() is None
    broken = TopAtom.from_dict({**atom.to_dict(), "global": {**glob, "rates": [0.2, 1.5]}})
    assert "must be probabilities" in broken.problem()


def test_an_interpolated_atom_is_continuous_in_mu_and_keeps_each_bins_share():
    """pi is linear in mu between the bins' centres (their rows' median mu), constant beyond them,
    and its rates there are solved so that each bin's mean served top mass is still its share of
    rows at the top (with the mass the distribution below already clips onto it)."""
    rng = np.random.default_rng(5)
    n = 3000
    center = rng.normal(-2.0, 1.0, n)
    human = np.where(rng.random(n) < 1 / (1 + np.exp(-2 * (center + 2))), 0.0, -3.0)  # P(0) rises with mu
    clipped = rng.uniform(0.0, 0.05, n)  # below every bin's share, so every share is reachable
    atom = TopAtom.fit(human, center, ["x"] * n, 0.0, clipped=clipped, n_bins=5, min_lp_rows=10)
    params = atom.lp_params["x"]
    edges, centres, rates = (np.asarray(params[k]) for k in ("edges", "centres", "rates"))
    bins = np.searchsorted(edges, center)
    np.testing.assert_allclose(centres, [np.median(center[bins == b]) for b in range(5)])
    pi = atom.probability(center, ["x"] * n)
    mass = pi + (1 - pi) * clipped
    for b in range(5):
        assert mass[bins == b].mean() == pytest.approx((human[bins == b] == 0).mean(), abs=1e-6)
    grid = np.linspace(-6, 2, 8001)
    on_grid = atom.probability(grid, ["x"] * grid.size)
    assert np.abs(np.diff(on_grid)).max() < 1e-3  # no step at an edge
    np.testing.assert_allclose(on_grid[[0, -1]], rates[[0, -1]])
    middle = (centres[1] + centres[2]) / 2
    assert atom.probability([middle], ["x"])[0] == pytest.approx((rates[1] + rates[2]) / 2)
    step = TopAtom.fit(human, center, ["x"] * n, 0.0, clipped=clipped, n_bins=5, min_lp_rows=10, interpolate=False)
    assert "centres" not in step.lp_params["x"] and np.abs(np.diff(step.probability(grid, ["x"] * grid.size))).max() > 0.01
    assert TopAtom.from_dict(json.loads(json.dumps(atom.to_dict()))) == atom
    broken = TopAtom.from_dict({**atom.to_dict(), "per_lp": {"x": {**params, "centres": [1.0, 0.0, 2.0, 3.0, 4.0]}}})
    assert "centres" in broken.problem()


def test_rates_the_passes_leave_off_their_share_are_reported(monkeypatch, caplog):
    """Too few passes leave interior rates off their bins' shares: logged, not silent."""
    rng = np.random.default_rng(5)
    center = rng.normal(-2.0, 1.0, 3000)
    human = np.where(rng.random(3000) < 1 / (1 + np.exp(-2 * (center + 2))), 0.0, -3.0)
    with caplog.at_level("WARNING", logger="uamt.uncertainty.atom"):
        TopAtom.fit(human, center, ["x"] * 3000, 0.0, n_bins=5, min_lp_rows=10)
    assert not caplog.records
    monkeypatch.setattr(TopAtom, "RATE_PASSES", 1)
    with caplog.at_level("WARNING", logger="uamt.uncertainty.atom"):
        TopAtom.fit(human, center, ["x"] * 3000, 0.0, n_bins=5, min_lp_rows=10)
    assert "1 passes left bins" in caplog.text and "off their share at the top" in caplog.text


def test_served_mixture_puts_the_atom_where_the_rows_are(fitted):
    dev, test, without, served = fitted
    mu, sigma, lp = test["mu"].to_numpy(), test["sigma"].to_numpy(), test["lp"].to_numpy(dtype=object)
    pi = served.top_atom.probability(served.center(mu, sigma, lp), lp)
    assert not served.is_gaussian
    np.testing.assert_array_equal(served.risk(mu, sigma, 0.0, lp), 1.0)
    below_top = served.below_top.risk(mu, sigma, np.nextafter(0.0, -1.0), lp)
    np.testing.assert_allclose(served.risk(mu, sigma, np.nextafter(0.0, -1.0), lp), (1 - pi) * below_top)
    # In every (LP, mu bin) the served top mass averages to the share of calibration rows at 0.
    d_mu, d_sigma, d_lp = dev["mu"].to_numpy(), dev["sigma"].to_numpy(), dev["lp"].to_numpy(dtype=object)
    top_mass = 1 - served.risk(d_mu, d_sigma, np.nextafter(0.0, -1.0), d_lp)
    d_center = served.center(d_mu, d_sigma, d_lp)
    for lp_name, params in served.top_atom.lp_params.items():
        bins = np.searchsorted(params["edges"], d_center)
        for b in range(served.top_atom.n_bins):
            cell = (d_lp == lp_name) & (bins == b)
            assert top_mass[cell].mean() == pytest.approx(np.mean(dev["human"].to_numpy()[cell] == 0.0), abs=1e-6)
    lower, upper = served.interval(mu, sigma, 0.9, lp, "conformal")
    assert np.all(lower <= upper) and np.all(upper <= 0.0)
    np.testing.assert_array_equal(upper[pi >= 0.05], 0.0)  # (1 + 0.9) / 2 >= 1 - pi: the top is inside
    # Interval and risk are one distribution: the lower bound is the quantile at 0.05.
    np.testing.assert_allclose(served.risk(mu, sigma, float(lower[0]), lp)[0], 0.05, atol=1e-6)
    full = {name: measure(c, ask(c, test, SIGNED, BOUNDS), test, SIGNED) for name, c in (("without", without), ("with", served))}
    for lp_name in ("en-ru", "zh-en"):
        w, a = full["without"][lp_name], full["with"][lp_name]
        assert abs(a["top_probability"] - a["top_frequency"]) < abs(w["top_probability"] - w["top_frequency"])
        assert abs(a["top_probability"] - a["top_frequency"]) < 0.05
        assert a["ece"] < w["ece"]
        # the continuous part alone, interpolated in mu, already scores close (zh-en: 30 % at 0):
        # the atom may cost a little CRPS in one LP, never much, and gains over both
        assert a["crps"] < w["crps"] + 0.005
        assert a["coverage@0.9"] == pytest.approx(0.9, abs=0.04)
        assert a["closed_coverage@0.9"] >= a["coverage@0.9"]
    assert sum(full["with"][x]["crps"] for x in ("en-ru", "zh-en")) < sum(full["without"][x]["crps"] for x in ("en-ru", "zh-en"))


def test_the_atom_survives_the_artifact_and_refits(tmp_path, fitted):
    dev, test, _, served = fitted
    served.save(tmp_path / "hts.json")
    loaded = Calibration.load(tmp_path / "hts.json")
    mu, sigma, lp = test["mu"].to_numpy(), test["sigma"].to_numpy(), test["lp"].to_numpy(dtype=object)
    for gamma in (0.1, 0.9):
        np.testing.assert_array_equal(loaded.interval(mu, sigma, gamma, lp), served.interval(mu, sigma, gamma, lp))
    np.testing.assert_array_equal(loaded.risk(mu, sigma, -5.0, lp), served.risk(mu, sigma, -5.0, lp))
    refit = refit_served(dev, "hts", loaded, SIGNED)
    assert refit.top_atom is not None and refit.top_atom.lp_params == served.top_atom.lp_params
    data = json.loads((tmp_path / "hts.json").read_text())
    data.pop("below_top")
    (tmp_path / "broken.json").write_text(json.dumps(data))
    with pytest.raises(UamtError, match="broken.json.*top_atom and below_top come together"):
        Calibration.load(tmp_path / "broken.json")


def test_a_changed_atom_changes_what_is_measured(fitted):
    _, test, _, served = fitted
    before = measure(served, ask(served, test, SIGNED, BOUNDS), test, SIGNED)
    params = served.top_atom.lp_params["en-ru"]
    moved = dataclasses.replace(
        served, top_atom=dataclasses.replace(served.top_atom, lp_params={**served.top_atom.lp_params, "en-ru": {**params, "rates": [0.05] * 5}})
    )
    after = measure(moved, ask(moved, test, SIGNED, BOUNDS), test, SIGNED)
    assert after["en-ru"]["top_probability"] < before["en-ru"]["top_probability"] - 0.3
    assert after["en-ru"]["ece"] > before["en-ru"]["ece"]
    assert after["zh-en"]["ece"] == pytest.approx(before["zh-en"]["ece"])


def test_the_mixture_reads_every_row_at_its_own_level_as_one_call_per_level_would(fitted):
    """The quantile below the top is read for all rows in one call (each row at its own level, the
    rows the top's mass holds at level 1, so that every level asks the same rows); it equals, bit
    for bit, the interval of the distribution below at one level per call on the rows it is for."""
    _, test, _, served = fitted
    mu, sigma, lp = test["mu"].to_numpy(), test["sigma"].to_numpy(), test["lp"].to_numpy(dtype=object)
    pi = served.top_atom.probability(served.center(mu, sigma, lp), lp)
    for p in (0.05, 0.3, 0.5, 0.95):
        inside = pi + p < 1.0
        level = p / (1.0 - pi[inside])
        expected = np.empty(inside.sum())
        for value in np.unique(level):
            rows = level == value
            gamma = min(abs(2.0 * float(value) - 1.0), 1.0)
            lower, upper = served.below_top.interval(mu[inside][rows], sigma[inside][rows], gamma, lp[inside][rows], "conformal")
            expected[rows] = lower if value < 0.5 else upper
        got = served._below_top_quantile(mu, sigma, lp, None, p, pi)
        np.testing.assert_array_equal(got[inside], np.minimum(expected, 0.0))
        np.testing.assert_array_equal(got[~inside], 0.0)


def test_a_gaussian_below_the_top_reads_every_row_at_its_own_level_as_one_call_per_level_would():
    """The fixed-variance point baseline's mixture: the Gaussian below the top is read at each row's
    own level in one pass (an interpolated atom gives nearly every row its own level, and one
    interval call per level made the calibrate stage quadratic); the same quantiles as the calls."""
    dev, test = zero_inflated(0, 3000).assign(sigma=1.0), zero_inflated(1, 600)
    calibration, _ = fit_calibration(dev, "point", settings=SIGNED)
    served = with_top_atom(calibration, dev, "point", SIGNED, BOUNDS[1])
    assert served.below_top.is_gaussian
    mu, sigma, lp = test["mu"].to_numpy(), np.ones(len(test)), test["lp"].to_numpy(dtype=object)
    pi = served.top_atom.probability(served.center(mu, sigma, lp), lp)
    assert np.unique(pi).size > 100  # interpolated: the rows' levels differ
    for p in (0.05, 0.5, 0.95):
        inside = pi + p < 1.0
        expected = np.full(len(test), 0.0)
        for i in np.flatnonzero(inside):
            level = p / (1.0 - pi[i])
            lower, upper = served.below_top.interval(mu[i : i + 1], sigma[i : i + 1], abs(2.0 * level - 1.0), lp[i : i + 1], "gaussian")
            expected[i] = min((lower if level < 0.5 else upper)[0], 0.0)
        np.testing.assert_allclose(served._below_top_quantile(mu, sigma, lp, None, p, pi), expected, rtol=0, atol=1e-12)
