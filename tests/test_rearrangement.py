"""The served distribution rearranged in mu (``evaluate.rearrange_in_mu``): the rearrangement by
hand, and a served mixture whose risk cannot rise and whose bounds cannot fall with mu, through the
artifact and its refits, where the rows' own lower tail widens under the best predictions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from tests.test_top_atom import BOUNDS, SIGNED
from uamt.core.errors import UamtError
from uamt.serving.model_calibration import Calibration, attach_distribution, fit_calibration, refit_served
from uamt.uncertainty import EvaluationSettings
from uamt.uncertainty.rearrangement import GRID_PERCENTILES, rearranged

REARRANGED = dataclasses.replace(SIGNED, rearrange_in_mu=True)


def largest_rise(values: np.ndarray) -> float:
    """How far ``values`` (in mu order) climb above their lowest point so far: 0 for non-increasing."""
    return float(np.max(values - np.minimum.accumulate(values)))


def test_rearranged_by_hand():
    grid_mu, grid_values = np.array([0.0, 1.0, 2.0, 3.0]), np.array([5.0, 3.0, 4.0, 6.0])
    # sorted 3, 4, 5, 6 interpolated at mu: 1.5 -> 4.5; at a grid point its sorted value
    assert rearranged([0.0, 10.0, 9.0], [1.5, 1.0, 3.0], grid_mu, grid_values).tolist() == [4.5, 4.0, 6.0]
    # beyond the grid: the own value capped below at the smallest, floored above at the largest
    assert rearranged([7.0, 1.0, 2.0, 8.0], [-1.0, -1.0, 9.0, 9.0], grid_mu, grid_values).tolist() == [3.0, 1.0, 6.0, 8.0]
    # an infinite grid value (a level beyond the calibration's reach) stays infinite on its side
    inf = rearranged([0.0, 0.0], [0.5, 1.0], grid_mu, np.array([-np.inf, 3.0, 4.0, 6.0]))
    assert inf.tolist() == [-np.inf, 3.0]
    # an answer already non-decreasing and linear between the grid points is left as it is
    grid = np.arange(49.0)
    curve = np.sort(np.random.default_rng(0).normal(size=49))
    mu = np.random.default_rng(1).uniform(0.0, 48.0, 200)
    own = np.interp(mu, grid, curve)
    np.testing.assert_allclose(rearranged(own, mu, grid, curve), own)
    # any answer comes out non-decreasing in mu inside the grid
    out = rearranged(np.random.default_rng(2).normal(size=mu.size), mu, grid, np.random.default_rng(3).normal(size=49))
    assert np.all(np.diff(out[np.argsort(mu)]) >= 0)


def widening_below_the_best(seed: int, n: int) -> pd.DataFrame:
    """MQM-like rows of one LP: 30 % at 0, and below 0 a lower tail 4x wider under the
    best fifth of predictions than under the middling ones (the shape of WMT21 en-ru's calibration
    rows under the QE model), one sigma for every row."""
    rng = np.random.default_rng(seed)
    mu = rng.uniform(-3.0, 0.0, n)
    noise = rng.normal(size=n)
    below = mu + np.where(noise < 0, np.where(mu > -0.6, 4.0, 1.0), 0.5) * noise
    human = np.where(rng.random(n) < 0.3, 0.0, np.clip(3.0 * below - 3.0, BOUNDS[0], -0.1))
    doc = np.array([f"en-ru/d{i // 10}" for i in range(n)], dtype=object)
    return pd.DataFrame({"lp": "en-ru", "human": human, "mu": mu, "sigma": 1.0, "doc": doc})


@pytest.fixture(scope="module")
def served():
    dev = widening_below_the_best(0, 5000)
    out = {}
    for settings in (SIGNED, REARRANGED):
        calibration, _ = fit_calibration(dev, "hts", settings=settings)
        out[settings.rearrange_in_mu] = attach_distribution(calibration, dev, "hts", settings, BOUNDS)
    return dev, out


def test_the_served_mixture_rearranged_in_mu_cannot_rise_in_risk(served, tmp_path):
    dev, by_setting = served
    grid = np.linspace(dev["mu"].min() - 0.2, dev["mu"].max() + 0.2, 300)
    ones, lp = np.ones_like(grid), np.full(grid.size, "en-ru", dtype=object)
    plain, rearranged_ = by_setting[False], by_setting[True]
    assert not plain.rearrangement_mu and rearranged_.below_top.rearrangement_mu == {}
    np.testing.assert_allclose(rearranged_.rearrangement_mu["en-ru"], np.quantile(dev["mu"], GRID_PERCENTILES))
    # the rows' own shape: as calibrated, the risk rises under the best predictions
    assert max(largest_rise(plain.risk(grid, ones, chi, lp)) for chi in (-10.0, -5.0)) > 0.02
    for chi in (-12.0, -10.0, -5.0, -1.0):
        assert largest_rise(rearranged_.risk(grid, ones, chi, lp)) == 0.0
    for gamma in (0.5, 0.9):
        low, high = rearranged_.interval(grid, ones, gamma, lp, "conformal")
        assert np.all(np.diff(low) >= 0) and np.all(np.diff(high) >= 0)
        sd = rearranged_.served_sd(grid, ones, lp)
        assert np.all(np.isfinite(sd)) and not np.allclose(sd, plain.served_sd(grid, ones, lp))
    # each row keeps a proper distribution: its risk rises with the threshold
    chis = np.linspace(-20.0, -0.5, 40)
    risks = np.column_stack([rearranged_.risk(grid, ones, chi, lp) for chi in chis])
    assert np.all(np.diff(risks, axis=1) >= -1e-12)
    # what the file serves is what was fitted; a refit (a cross-fit fold, a campaign) keeps the order
    path = tmp_path / "calibration.json"
    rearranged_.save(path)
    again = Calibration.load(path)
    np.testing.assert_array_equal(again.risk(grid, ones, -5.0, lp), rearranged_.risk(grid, ones, -5.0, lp))
    refitted = refit_served(dev.iloc[: len(dev) // 2], "hts", again, SIGNED)
    assert refitted.rearrangement_mu and largest_rise(refitted.risk(grid, ones, -5.0, lp)) == 0.0
    # a row of an unseen LP has no grid: answered as calibrated
    unseen = np.full(grid.size, "xx-yy", dtype=object)
    np.testing.assert_array_equal(again.risk(grid, ones, -5.0, unseen), again._risk(grid, ones, -5.0, unseen, None))


def test_rearranging_keeps_the_coverage_of_fresh_rows(served):
    """Overall: the rearrangement pairs the bounds with other mu, it does not move them.  (Where the
    truth itself is not ordered in mu, as here by construction, the best fifth's coverage falls:
    0.949 -> 0.805 on these rows; on the pipeline's rows the worst LP x mu cell did not move,
    docs/quality.md.)"""
    _, by_setting = served
    fresh = widening_below_the_best(1, 5000)
    mu, lp = fresh["mu"].to_numpy(), fresh["lp"].to_numpy(dtype=object)
    coverage = {}
    for setting, calibration in by_setting.items():
        low, high = calibration.interval(mu, np.ones_like(mu), 0.9, lp, "conformal")
        coverage[setting] = np.mean((fresh["human"] >= low) & (fresh["human"] <= high))
    assert abs(coverage[True] - coverage[False]) < 0.01


def test_no_grid_where_sigma_has_weight_and_a_bad_grid_is_refused(served, tmp_path):
    dev, by_setting = served
    varied = dev.assign(sigma=np.random.default_rng(4).uniform(0.5, 2.0, len(dev)))
    calibration, _ = fit_calibration(varied, "hts", settings=REARRANGED)
    assert attach_distribution(calibration, varied, "hts", REARRANGED, BOUNDS).rearrangement_mu == {}
    bad = dataclasses.replace(by_setting[True], rearrangement_mu={"en-ru": [0.0, -1.0]})
    path = tmp_path / "bad.json"
    bad.save(path)
    with pytest.raises(UamtError, match=r"bad.json: rearrangement_mu\[en-ru\] must be at least two finite, non-decreasing mu"):
        Calibration.load(path)
    assert EvaluationSettings().rearrange_in_mu is False


def two_lps(seed: int, n: int) -> pd.DataFrame:
    """The rows of :func:`widening_below_the_best` for en-ru and, from another seed, for de-en."""
    other = widening_below_the_best(seed + 100, n).assign(lp="de-en")
    return pd.concat([widening_below_the_best(seed, n), other], ignore_index=True)


def test_every_level_and_lp_is_asked_in_one_call_with_the_answers_of_one_call_each():
    """The calibrate stage asks ~100 levels of 4 LPs per measurement: intervals_at stacks the rows
    once per level, and the rearrangement asks every LP's grid at every level in one call.  The
    answers are those of asking one level and one grid at a time, bit for bit."""
    from uamt.uncertainty import rearrangement
    from uamt.uncertainty.served import intervals_at

    dev = two_lps(0, 2000)
    calibration, _ = fit_calibration(dev, "hts", settings=REARRANGED)
    served = attach_distribution(calibration, dev, "hts", REARRANGED, BOUNDS)
    assert served.takes_row_levels and served.top_atom is not None and set(served.rearrangement_mu) == {"en-ru", "de-en"}
    fresh = two_lps(1, 300)
    mu, lp = fresh["mu"].to_numpy(), fresh["lp"].to_numpy(dtype=object)
    lp[::7] = "xx-yy"  # an unseen LP: no grid, answered as calibrated
    sigma, refs = np.ones_like(mu), np.where(np.arange(mu.size) % 3 == 0, 2, 1)
    levels = [0.05, 0.5, 0.8, 0.9, 0.95, 0.99]
    asked = intervals_at(served, mu, sigma, levels, lp, "conformal", n_refs=refs)
    for gamma in levels:
        one = served.interval(mu, sigma, gamma, lp, "conformal", n_refs=refs)
        np.testing.assert_array_equal(asked[gamma][0], one[0])
        np.testing.assert_array_equal(asked[gamma][1], one[1])
    # the grids: one call for every LP, level and number of references, as asking each alone
    calls = []

    def answer(m, s, grid_lp, n_refs, level):
        calls.append(level)
        return -served._risk(m, s, level, grid_lp, n_refs)  # the same answer as the values: -risk

    chi = np.where(np.arange(mu.size) % 2 == 0, -5.0, -1.0)
    own = served._risk(mu, sigma, chi, lp, refs)
    once = rearrangement.in_mu_order(answer, -own, mu, sigma, lp, refs, chi, served.rearrangement_mu, increasing=True)
    assert len(calls) == 1 and np.unique(calls[0]).tolist() == [-5.0, -1.0]
    expected = -own
    for name, grid in served.rearrangement_mu.items():
        for at in (-5.0, -1.0):
            for k in (1, 2):
                rows = (lp == name) & (chi == at) & (refs == k)
                first = int(np.flatnonzero(rows)[0])
                g = np.asarray(grid)
                along = served._risk(g, np.full(g.size, sigma[first]), at, np.full(g.size, name, dtype=object), np.full(g.size, k))
                expected[rows] = rearranged(expected[rows], mu[rows], g, -along)
    np.testing.assert_array_equal(once, expected)
    np.testing.assert_array_equal(once[lp == "xx-yy"], -own[lp == "xx-yy"])


def test_a_distribution_of_one_level_per_call_is_asked_level_by_level():
    from uamt.uncertainty.served import intervals_at

    class OneLevel:
        is_gaussian = True

        def __init__(self):
            self.asked = []

        def interval(self, mu, sigma, gamma, lp=None, mode="gaussian", n_refs=None):
            assert np.ndim(gamma) == 0
            self.asked.append(gamma)
            return mu - gamma * sigma, mu + gamma * sigma

    dist, mu = OneLevel(), np.arange(4.0)
    out = intervals_at(dist, mu, np.ones(4), [0.5, 0.9], np.full(4, "en-de", dtype=object), "gaussian")
    assert dist.asked == [0.5, 0.9]
    np.testing.assert_array_equal(out[0.9][1], mu + 0.9)
