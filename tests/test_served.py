"""The served distribution is what is measured: metrics read through the calibration's protocol
(mu, intervals at every level, risk), one artifact from calibrate to evaluate to the pyfunc."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from uamt.model_evaluation import ask, compact, cross_fitted_rows, measure
from uamt.serving.model_calibration import Calibration, fit_calibration
from uamt.uncertainty import EvaluationSettings, expected_calibration_error, gaussian_crps
from uamt.uncertainty.served import ServedRows, ServedSettings, quantile_crps, served_metrics, served_rows

BOUNDS = (-25.0, 0.0)
MONDRIAN = EvaluationSettings(min_lp_rows=20, calibration="mondrian_conformal", calibration_candidates=("mondrian_conformal",))
AFFINE = EvaluationSettings(min_lp_rows=20, calibration="affine_nll", calibration_candidates=("affine_nll",))
SIGNED_REGRESSION = EvaluationSettings(
    min_lp_rows=20,
    calibration="signed_mondrian_conformal",
    calibration_candidates=("signed_mondrian_conformal",),
    mu_scaling="regression",
)


def mqm_like(seed: int, n: int) -> pd.DataFrame:
    """Skewed, zero-inflated MQM-like human scores with a noisy prediction and documents of 10 rows."""
    rng = np.random.default_rng(seed)
    lp = np.array(["en-de", "zh-en"], dtype=object)[rng.integers(0, 2, n)]
    human = -np.where(rng.random(n) < 0.3, 0.0, rng.gamma(1.0, 4.0, n))
    mu = 0.5 * human + rng.normal(0.0, 2.0, n)
    sigma = 0.5 + rng.random(n)
    doc = np.array([f"{lp[i]}/d{i // 10}" for i in range(n)], dtype=object)
    return pd.DataFrame({"lp": lp, "human": np.clip(human, -25, 0), "mu": mu, "sigma": sigma, "doc": doc})


@pytest.fixture(scope="module")
def data():
    return mqm_like(0, 1500), mqm_like(1, 1200)


@pytest.fixture(scope="module")
def mondrian(data):
    return fit_calibration(data[0], "hts", settings=MONDRIAN)[0]


def test_quantile_crps_matches_the_gaussian_closed_form():
    rng = np.random.default_rng(0)
    y, mu, sigma = rng.normal(size=200), rng.normal(size=200), 0.5 + rng.random(200)
    k = 2000
    probs = (np.arange(k) + 0.5) / k
    quantiles = mu[:, None] + sigma[:, None] * norm.ppf(probs)[None, :]
    np.testing.assert_allclose(quantile_crps(y, probs, quantiles), gaussian_crps(y, mu, sigma), rtol=2e-3)


def test_quantile_crps_hand_computed():
    # Two quantiles at p = 1/4 (q = 0) and 3/4 (q = 2), y = 3: 2 * mean(3 * 1/4, 1 * 3/4) = 1.5.
    assert quantile_crps([3.0], [0.25, 0.75], [[0.0, 2.0]])[0] == pytest.approx(1.5)


def test_gaussian_served_ece_equals_the_gaussian_ece(data):
    dev, test = data
    calibration = fit_calibration(dev, "hts", settings=AFFINE)[0]
    assert calibration.is_gaussian
    rows = ask(calibration, test, AFFINE, None)
    full = measure(calibration, rows, test, AFFINE)
    for lp in ("en-de", "zh-en"):
        part = test[test["lp"] == lp]
        mu, sigma = calibration.apply(part["mu"], part["sigma"], part["lp"].to_numpy(dtype=object))
        assert full[lp]["ece"] == pytest.approx(expected_calibration_error(part["human"], mu, sigma), abs=1e-12)
        assert full[lp]["nll"] is not None


def test_conformal_is_scored_as_served_not_as_a_gaussian(data, mondrian):
    _, test = data
    assert not mondrian.is_gaussian
    rows = ask(mondrian, test, MONDRIAN, BOUNDS)
    full = measure(mondrian, rows, test, MONDRIAN)
    lp = test["lp"].to_numpy(dtype=object)
    lower, upper = mondrian.interval(test["mu"], test["sigma"], 0.9, lp, "conformal")
    inside = (test["human"] >= np.clip(lower, *BOUNDS)) & (test["human"] <= np.clip(upper, *BOUNDS))
    en_de = test["lp"] == "en-de"
    assert full["en-de"]["closed_coverage@0.9"] == pytest.approx(inside[en_de].mean())
    # A score at MQM 0 counts with the share of the served mass at 0 inside the interval's band.
    at_top = en_de & (test["human"] == 0.0)
    f_top = mondrian.risk(test["mu"], test["sigma"], np.nextafter(0.0, -1.0), lp)
    share = np.clip(0.95 - np.maximum(f_top, 0.05), 0.0, None) / np.maximum(1.0 - f_top, 1e-12)
    # ... and one at the bottom (-25) with the share of the mass clipped onto -25.
    at_bottom = en_de & (test["human"] == -25.0)
    f_low = mondrian.risk(test["mu"], test["sigma"], -25.0, lp)
    share_low = np.clip(np.minimum(f_low, 0.95) - 0.05, 0.0, None) / np.maximum(f_low, 1e-12)
    assert at_top.any() and at_bottom.any()
    expected = np.where(at_top, share, np.where(at_bottom, share_low, inside))[en_de].mean()
    assert full["en-de"]["coverage@0.9"] == pytest.approx(expected)
    assert full["en-de"]["nll"] is None  # no Gaussian is served, so no Gaussian NLL is reported
    # the served sd is the distribution's own spread, and the served mu is clipped as served
    assert (rows.center <= 0).all() and np.isfinite(full["avg"]["crps"])
    _, sd = mondrian.apply(test["mu"], test["sigma"], lp)
    gaussian_equivalent = (upper - lower) / (2 * norm.ppf(0.95))
    assert not np.allclose(sd, gaussian_equivalent)


def test_risk_reliability_reads_the_served_cdf(data, mondrian):
    _, test = data
    rows = ask(mondrian, test, MONDRIAN, BOUNDS)
    lp = test["lp"].to_numpy(dtype=object)
    np.testing.assert_allclose(rows.risk[-5.0], mondrian.risk(test["mu"], test["sigma"], -5.0, lp))
    full = measure(mondrian, rows, test, MONDRIAN)
    block = full["zh-en"]["risk"]["-5"]
    part = test["lp"] == "zh-en"
    risk = rows.risk[-5.0][part.to_numpy()]
    event = (test["human"][part] <= -5).to_numpy(dtype=float)
    assert block["brier"] == pytest.approx(np.mean((risk - event) ** 2))
    assert sum(b["n"] for b in block["bins"]) == part.sum()
    assert block["max_gap"] == pytest.approx(max(abs(b["observed"] - b["predicted"]) for b in block["bins"]))


def test_clipped_risk_is_one_at_the_top_of_the_scale(data, mondrian):
    _, test = data
    settings = ServedSettings(risk_thresholds=(0.0, -30.0))
    rows = served_rows(mondrian, test["mu"], test["sigma"], test["lp"], bounds=BOUNDS, settings=settings)
    assert (rows.risk[0.0] == 1.0).all() and (rows.risk[-30.0] == 0.0).all()


def test_cells_are_lp_by_quintile_with_clustered_bands(data, mondrian):
    _, test = data
    full = measure(mondrian, ask(mondrian, test, MONDRIAN, BOUNDS), test, MONDRIAN)
    for kind in ("sd", "mu"):
        cells = full["en-de"]["cells"][kind]["cells"]
        assert set(cells) == {"q1", "q2", "q3", "q4", "q5"}
        assert sum(c["n"] for c in cells.values()) == (test["lp"] == "en-de").sum()
        # rows of one document are correlated: n_eff <= n, the band no narrower than binomial
        assert all(c["n_eff"] <= c["n"] + 1e-9 and c["se"] >= math.sqrt(0.09 / c["n"]) - 1e-12 for c in cells.values())
        worst = full["worst_cells"][kind]
        gaps = [c["gap"] for lp in ("en-de", "zh-en") for c in full[lp]["cells"][kind]["cells"].values()]
        assert abs(worst["gap"]) == pytest.approx(max(map(abs, gaps)))


def test_raw_and_served_uncertainty_are_reported_side_by_side(data, mondrian):
    _, test = data
    full = measure(mondrian, ask(mondrian, test, MONDRIAN, BOUNDS), test, MONDRIAN)
    part = test[test["lp"] == "en-de"]
    center = np.clip(mondrian.center(part["mu"], part["sigma"], part["lp"].to_numpy(dtype=object)), *BOUNDS)
    expected = np.corrcoef(np.abs(part["human"] - center), part["sigma"])[0, 1]
    assert full["en-de"]["ups_raw"] == pytest.approx(expected)
    assert full["en-de"]["ups"] is not None and full["en-de"]["ence_raw"] is not None


def test_a_constant_sigma_has_no_raw_ups_or_ence(data, mondrian):
    """A point model's sigma is one constant; on the human scale only rounding noise would vary."""
    _, test = data
    point = test.assign(sigma=1.0)
    full = measure(mondrian, ask(mondrian, point, MONDRIAN, BOUNDS), point, MONDRIAN)
    for lp in ("en-de", "zh-en", "avg"):
        assert full[lp]["ups_raw"] is None and full[lp]["ence_raw"] is None
    assert full["en-de"]["ence"] is not None


def test_perturbing_the_calibration_file_changes_the_measured_metrics(data, mondrian, tmp_path):
    """evaluate loads the artifact: a change to calibration/<model>.json changes metrics/test.json."""
    _, test = data
    path = tmp_path / "hts.json"
    mondrian.save(path)
    before = compact(measure(Calibration.load(path), ask(Calibration.load(path), test, MONDRIAN, BOUNDS), test, MONDRIAN))
    data_json = json.loads(path.read_text())
    data_json["unseen_lp_sigma_factor"] = 1.0
    data_json["standardizer"]["lps"]["en-de"]["human_mean"] -= 1.0  # a shifted centre for en-de
    path.write_text(json.dumps(data_json))
    perturbed = Calibration.load(path)
    after = compact(measure(perturbed, ask(perturbed, test, MONDRIAN, BOUNDS), test, MONDRIAN))
    assert after["en-de"]["crps"] != before["en-de"]["crps"]
    assert after["zh-en"]["crps"] == before["zh-en"]["crps"]


def test_cross_fitted_rows_come_from_calibrations_that_never_saw_the_row(data, mondrian):
    dev, _ = data
    rows, unit = cross_fitted_rows(dev, "hts", mondrian, MONDRIAN, BOUNDS)
    assert unit == "documents"
    in_sample = ask(mondrian, dev, MONDRIAN, BOUNDS)
    assert rows.center.shape == in_sample.center.shape
    assert not np.allclose(rows.intervals[0.9][0], in_sample.intervals[0.9][0])
    # out-of-fold coverage stays near nominal (conformal validity on unseen documents)
    covered = (dev["human"] >= rows.intervals[0.9][0]) & (dev["human"] <= rows.intervals[0.9][1])
    assert abs(covered.mean() - 0.9) < 0.03


def test_served_rows_stack_restores_row_order(data, mondrian):
    _, test = data
    rows = ask(mondrian, test, MONDRIAN, BOUNDS)
    order = np.arange(len(test))
    parts = [(order[order % 2 == 0], rows.take(order % 2 == 0)), (order[order % 2 == 1], rows.take(order % 2 == 1))]
    stacked = ServedRows.stack(parts, len(test))
    np.testing.assert_array_equal(stacked.quantiles, rows.quantiles)
    np.testing.assert_array_equal(stacked.intervals[0.9][1], rows.intervals[0.9][1])


def test_served_metrics_refuse_misaligned_inputs(data, mondrian):
    _, test = data
    rows = ask(mondrian, test, MONDRIAN, BOUNDS)
    with pytest.raises(ValueError, match="must have one entry per row"):
        served_metrics(rows, test["human"][:-1], test["lp"][:-1])


def test_clamp_tails_puts_unbounded_tail_mass_at_the_outermost_finite_quantile():
    inf = np.inf
    quantiles = np.array([[-inf, -inf, -2.0, -1.0, 1.0, 3.0, inf, inf], [-4.0, -3.0, -2.0, -1.0, 1.0, 2.0, 3.0, 4.0]])
    from uamt.uncertainty.served import clamp_tails

    np.testing.assert_array_equal(clamp_tails(quantiles)[0], [-2.0, -2.0, -2.0, -1.0, 1.0, 3.0, 3.0, 3.0])
    np.testing.assert_array_equal(clamp_tails(quantiles)[1], quantiles[1])


def test_global_fallback_is_fitted_in_the_units_an_unseen_lp_gets():
    """Rows of an LP without its own calibration are standardised with the global (pooled, human-unit)
    statistics; the served global fallback is fitted on dev rows standardised the same way, not on
    the per-LP z-scores the LP-specific parameters come from."""
    from uamt.uncertainty.candidates import fit_candidate

    rng = np.random.default_rng(5)
    n = 1600
    lp = np.array(["en-de", "zh-en"], dtype=object)[(np.arange(n) % 4 == 0).astype(int)]
    spread = np.where(lp == "en-de", 6.0, 1.0)  # one wide LP dominates the pooled statistics
    human = -np.abs(rng.normal(0.0, spread))
    dev = pd.DataFrame({"lp": lp, "human": human, "mu": human + rng.normal(0.0, spread / 2), "sigma": 1.0 + rng.random(n),
                        "doc": [f"d{i // 8}" for i in range(n)]})
    calibration = fit_calibration(dev, "hts", settings=MONDRIAN)[0]
    h_z = calibration.standardizer.transform_human(dev["human"].to_numpy(), None)
    mu_z, sigma_z = calibration.standardizer.transform_predictions(dev["mu"].to_numpy(), dev["sigma"].to_numpy(), None)
    expected = fit_candidate("mondrian_conformal", h_z, mu_z, sigma_z, None, common={"per_lp": False, "min_lp_rows": 20},
                             n_levels=MONDRIAN.n_levels, ece_bound=MONDRIAN.ece_bound)
    assert calibration.served.global_params == expected.global_params
    assert calibration.served.variance.global_params == expected.variance.global_params
    assert calibration.served.lp_params["en-de"] != expected.global_params  # per-LP fits untouched
    unseen = np.full(n, "xx-yy", dtype=object)
    lower, upper = calibration.interval(dev["mu"], dev["sigma"], 0.9, unseen, "conformal")
    assert abs(((dev["human"] >= lower) & (dev["human"] <= upper)).mean() - 0.9) < 0.02


@pytest.mark.parametrize(
    "settings,method", [(MONDRIAN, "hts"), (AFFINE, "hts"), (MONDRIAN, "point"), (SIGNED_REGRESSION, "hts")]
)
def test_refit_served_equals_the_pinned_full_fit(data, settings, method):
    """The light refit (cross-fitting, leave-one-LP-out) serves what the full pinned fit serves."""
    from uamt.serving.model_calibration import refit_served

    dev, test = data
    table = dev.assign(sigma=np.nan) if method == "point" else dev
    full = fit_calibration(table, method, settings=settings)[0]
    light = refit_served(table, method, full, settings)
    lp = test["lp"].to_numpy(dtype=object)
    for calibration in (full, light):
        calibration.unseen_lp_sigma_factor = 1.0
    np.testing.assert_allclose(light.center(test["mu"], test["sigma"], lp), full.center(test["mu"], test["sigma"], lp))
    for gamma in (0.5, 0.9):
        for a, b in zip(light.interval(test["mu"], test["sigma"], gamma, lp), full.interval(test["mu"], test["sigma"], gamma, lp), strict=True):
            np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(light.risk(test["mu"], test["sigma"], -5.0, lp), full.risk(test["mu"], test["sigma"], -5.0, lp))


def test_cross_fitting_falls_back_to_segments_then_in_sample(data, mondrian):
    dev, _ = data
    one_doc = dev.assign(doc="d0", dataset="wmt", seg_id=np.arange(len(dev)) // 3)
    rows, unit = cross_fitted_rows(one_doc, "hts", mondrian, MONDRIAN, BOUNDS)
    assert unit == "source segments" and rows.center.shape == (len(dev),)
    one_segment = one_doc.assign(seg_id=0, lp="en-de")
    _, unit = cross_fitted_rows(one_segment, "hts", mondrian, MONDRIAN, BOUNDS)
    assert unit == "in-sample"


def test_risk_bins_carry_their_document_clustered_band():
    from uamt.uncertainty.served import risk_reliability

    risk = np.full(8, 0.25)
    event = np.array([1, 0, 0, 0, 1, 0, 0, 0], dtype=float)
    alone = risk_reliability(risk, event, 1, docs=np.arange(8))["bins"][0]
    assert alone["n_eff"] == 8 and alone["se"] == pytest.approx(np.sqrt(0.25 * 0.75 / 8))
    # four documents of two rows with the same outcome: each pair is worth one row, n_eff = 4
    pattern = np.array([1, 1, 0, 0, 0, 0, 0, 0], dtype=float)
    clustered = risk_reliability(risk, pattern, 1, docs=np.array([0, 0, 1, 1, 2, 2, 3, 3]))["bins"][0]
    assert clustered["n_eff"] == pytest.approx(4) and clustered["se"] == pytest.approx(np.sqrt(0.25 * 0.75 / 4))
    assert "se" not in risk_reliability(risk, event, 1)["bins"][0]


@pytest.mark.parametrize("distribution", ["gaussian", "mondrian", "signed_top_atom", "isotonic"])
def test_risk_at_one_threshold_per_row_equals_one_call_per_threshold(data, distribution):
    """The CDF at every row's own score (one call, as the randomised PIT reads it) is exactly the
    risk asked threshold by threshold, for every served family and with the unseen-LP and
    reference widenings."""
    from uamt.serving.model_calibration import attach_distribution, with_unseen_factor
    from uamt.uncertainty.served import _cdf_at

    dev, test = data
    settings = {"gaussian": AFFINE, "mondrian": MONDRIAN}.get(distribution, SIGNED_REGRESSION)
    calibration = fit_calibration(dev, "hts", settings=settings)[0]
    if distribution == "signed_top_atom":
        calibration = attach_distribution(calibration, dev, "hts", settings, BOUNDS)
    elif distribution == "isotonic":
        calibration = attach_distribution(calibration, dev, "hts", dataclasses.replace(settings, distribution="isotonic"), BOUNDS)
    calibration = with_unseen_factor(calibration, 1.2)
    mu, sigma, human = (test[c].to_numpy(dtype=float) for c in ("mu", "sigma", "human"))
    lp = np.where(np.arange(len(test)) % 7 == 0, "xx-yy", test["lp"].to_numpy(dtype=object)).astype(object)
    n_refs = np.where(np.arange(len(test)) % 3 == 0, 2, 1)
    chi = np.round(human + np.sin(np.arange(len(test))), 1)  # many repeated thresholds, some above 0
    together = calibration.risk(mu, sigma, chi, lp, n_refs=n_refs)
    one_by_one = np.empty(len(test))
    for value in np.unique(chi):
        rows = chi == value
        one_by_one[rows] = calibration.risk(mu[rows], sigma[rows], float(value), lp[rows], n_refs=n_refs[rows])
    np.testing.assert_array_equal(together, one_by_one)
    cdf = _cdf_at(calibration, mu, sigma, lp, human, n_refs, BOUNDS)
    just_below = np.nextafter(human, -np.inf)
    row = [calibration.risk(mu[i : i + 1], sigma[i : i + 1], just_below[i], lp[i : i + 1], n_refs=n_refs[i : i + 1])[0] for i in range(len(test))]
    # F(y^-) as served: clipped to the scale (0 below its bottom, 1 at or above its top)
    np.testing.assert_array_equal(cdf[:, 0], np.where(just_below < BOUNDS[0], 0.0, np.where(just_below >= BOUNDS[1], 1.0, row)))
    assert (cdf[:, 1] >= cdf[:, 0]).all() and (cdf[human >= BOUNDS[1], 1] == 1.0).all()
