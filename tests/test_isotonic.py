"""Isotonic distributional regression (uamt.uncertainty.isotonic): hand-computed fits, in-sample
calibration at every threshold, monotonicity, quantiles; served as a model's distribution (evaluate.distribution:
isotonic): its answers, the unseen-LP widening, the randomised coverage at its point masses, the artifact."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from uamt.core.errors import UamtError
from uamt.model_evaluation import ask, measure
from uamt.serving.model_calibration import Calibration, attach_distribution, fit_calibration, refit_served
from uamt.uncertainty import EvaluationSettings
from uamt.uncertainty.isotonic import IsotonicDistribution
from uamt.uncertainty.served import randomised_shares


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


BOUNDS = (-25.0, 0.0)


def _mqm_table(seed: int, n: int) -> pd.DataFrame:
    """Rows of two LPs whose scores sit on MQM's values (0, -1, -5, ...), documents of 10 rows."""
    human, center = _zero_inflated(n, seed)
    rng = np.random.default_rng(seed + 100)
    lp = np.array(["en-ru", "zh-en"], dtype=object)[rng.integers(0, 2, n)]
    mu = 0.1 * center + rng.normal(0.0, 0.1, n)  # the model's scale, not the human one
    doc = np.array([f"{lp[i]}/d{i // 10}" for i in range(n)], dtype=object)
    return pd.DataFrame({"lp": lp, "human": human, "mu": mu, "sigma": 0.5 + rng.random(n), "doc": doc})


ISOTONIC = EvaluationSettings(
    min_lp_rows=20,
    calibration="signed_mondrian_conformal",
    calibration_candidates=("signed_mondrian_conformal",),
    mu_scaling="regression",
    top_atom=True,
    distribution="isotonic",
)


@pytest.fixture(scope="module")
def served():
    dev, test = _mqm_table(10, 3000), _mqm_table(11, 2000)
    calibration, _ = fit_calibration(dev, "hts", settings=ISOTONIC)
    return dev, test, attach_distribution(calibration, dev, "hts", ISOTONIC, BOUNDS)


def test_unknown_distribution_is_refused():
    with pytest.raises(ValueError, match=r"distribution='beta' not supported; choose from \['candidate', 'isotonic'\]"):
        EvaluationSettings(distribution="beta")


def test_served_isotonic_answers_from_the_served_mu_and_replaces_the_atom(served):
    dev, test, calibration = served
    assert calibration.isotonic is not None and calibration.top_atom is None and not calibration.is_gaussian
    mu, sigma = test["mu"].to_numpy(), test["sigma"].to_numpy()
    lp = test["lp"].to_numpy(dtype=object)
    center = calibration.center(mu, sigma, lp)
    np.testing.assert_array_equal(calibration.risk(mu, sigma, -5.0, lp), calibration.isotonic.cdf(center, lp, -5.0))
    low, high = calibration.interval(mu, sigma, 0.8, lp)
    np.testing.assert_array_equal(low, calibration.isotonic.quantile(center, lp, 0.1))
    np.testing.assert_array_equal(high, calibration.isotonic.quantile(center, lp, 0.9))
    # just below the top: P(Q < 0), not the whole mass (mu + (chi - mu) would round 0^- to 0)
    below_top = calibration.risk(mu, sigma, float(np.nextafter(0.0, -np.inf)), lp)
    np.testing.assert_array_equal(below_top, calibration.isotonic.cdf(center, lp, -0.05))
    assert np.mean(below_top) == pytest.approx(np.mean(test["human"] < 0), abs=0.03)


def test_unseen_lps_get_the_global_fit_widened_around_mu(served):
    _, test, calibration = served
    wide = dataclasses.replace(calibration, unseen_lp_sigma_factor=2.0)
    mu, sigma = test["mu"].to_numpy()[:50], test["sigma"].to_numpy()[:50]
    unseen, known = np.full(50, "xx-yy", dtype=object), np.full(50, "zh-en", dtype=object)
    center = wide.center(mu, sigma, unseen)
    low0, high0 = calibration.isotonic.interval(center, unseen, 0.9)  # the global fit
    low, high = wide.interval(mu, sigma, 0.9, unseen)
    # around mu clipped into the scores (a mu above the best score must not pull its mass below it)
    pivot = np.clip(center, min(calibration.isotonic.global_params["thresholds"]), 0.0)
    np.testing.assert_allclose(low, pivot - 2.0 * (pivot - low0))
    np.testing.assert_allclose(high, pivot + 2.0 * (high0 - pivot))
    np.testing.assert_allclose(wide.risk(mu, sigma, -5.0, unseen), calibration.isotonic.cdf(center, None, pivot + (-5.0 - pivot) / 2.0))
    # A served mu above the best score: widened, the point mass at 0 stays at 0, not below it.
    high_mu = np.full(50, mu.max() + 50.0)
    assert np.all(wide.center(high_mu, sigma, unseen) > 1.0)
    assert np.all(wide.interval(high_mu, sigma, 0.9, unseen)[1] >= 0.0)
    assert np.all(wide.risk(high_mu, sigma, -0.5, unseen) < 1.0)
    # a known LP is not widened
    np.testing.assert_array_equal(wide.risk(mu, sigma, -5.0, known), calibration.risk(mu, sigma, -5.0, known))


def test_randomised_shares_inside_the_scale_hand_computed():
    human = np.array([-1.0, -5.0, -3.0])
    lower = np.array([-5.0, -5.0, -5.0])
    upper = np.array([-1.0, -1.0, -1.0])
    # Row 0: mass [0.8, 1.0] at -1, band at 0.8 = [0.1, 0.9]: inside 0.5, above 0.5.
    # Row 1: mass [0.0, 0.3] at -5: below 0.1 / 0.3, inside 0.2 / 0.3.
    # Row 2: no mass at its score (F(y^-) = F(y)): the closed interval decides (inside).
    at = np.array([[0.8, 1.0], [0.0, 0.3], [0.5, 0.5]])
    below, inside, above = randomised_shares(human, 0.8, lower, upper, BOUNDS, None, at)
    np.testing.assert_allclose(below, [0.0, 1 / 3, 0.0])
    np.testing.assert_allclose(inside, [0.5, 2 / 3, 1.0])
    np.testing.assert_allclose(above, [0.5, 0.0, 0.0])


def test_measured_coverage_is_randomised_within_the_point_masses(served):
    dev, test, calibration = served
    rows = ask(calibration, test, ISOTONIC, BOUNDS)
    assert rows.cdf_at_human is not None and rows.cdf_at_human.shape == (len(test), 2)
    in_sample = measure(calibration, ask(calibration, dev, ISOTONIC, BOUNDS), dev, ISOTONIC)
    # IDR on its own rows: calibrated at every level once the point masses are randomised ...
    assert in_sample["avg"]["coverage@0.9"] == pytest.approx(0.9, abs=0.02)
    assert in_sample["avg"]["ece"] < 0.02
    # ... while the closed interval contains every score on the masses it reaches
    assert in_sample["avg"]["closed_coverage@0.9"] > in_sample["avg"]["coverage@0.9"] + 0.02
    for lp in ("en-ru", "zh-en"):
        for chi in ("-1", "-5"):
            assert in_sample[lp]["risk"][chi]["max_gap"] < 0.06


def test_isotonic_survives_the_artifact_refits_and_changes_what_is_measured(served, tmp_path):
    dev, test, calibration = served
    calibration.save(tmp_path / "hts.json")
    back = Calibration.load(tmp_path / "hts.json")
    mu, sigma, lp = test["mu"].to_numpy(), test["sigma"].to_numpy(), test["lp"].to_numpy(dtype=object)
    np.testing.assert_array_equal(back.risk(mu, sigma, -5.0, lp), calibration.risk(mu, sigma, -5.0, lp))
    refit = refit_served(dev, "hts", calibration, ISOTONIC)
    assert refit.isotonic is not None and refit.top_atom is None
    np.testing.assert_allclose(refit.risk(mu, sigma, -5.0, lp), calibration.risk(mu, sigma, -5.0, lp), atol=0.05)
    # a changed artifact changes the metrics: every CDF shifted one threshold up
    data = json.loads((tmp_path / "hts.json").read_text())
    for params in [data["isotonic"]["global"], *data["isotonic"]["per_lp"].values()]:
        cdf = np.asarray(params["cdf"])
        params["cdf"] = np.column_stack([cdf[:, 1:], np.ones(len(cdf))]).tolist()
    (tmp_path / "changed.json").write_text(json.dumps(data))
    changed = Calibration.load(tmp_path / "changed.json")
    before = measure(back, ask(back, test, ISOTONIC, BOUNDS), test, ISOTONIC)["avg"]
    after = measure(changed, ask(changed, test, ISOTONIC, BOUNDS), test, ISOTONIC)["avg"]
    assert after["crps"] != pytest.approx(before["crps"])
    assert after["coverage@0.9"] != pytest.approx(before["coverage@0.9"])
    # a file with both served distributions is refused, naming it
    data = json.loads((tmp_path / "hts.json").read_text())
    data["top_atom"] = {"value": 0.0, "n_bins": 1, "global": {"edges": [], "rates": [0.5], "n": 1}, "per_lp": {}}
    data["below_top"] = json.loads((tmp_path / "hts.json").read_text())
    data["below_top"]["isotonic"] = None
    (tmp_path / "both.json").write_text(json.dumps(data))
    with pytest.raises(UamtError, match=r"both\.json: calibration: isotonic and top_atom"):
        Calibration.load(tmp_path / "both.json")


@pytest.mark.slow
def test_calibrate_stage_serves_and_measures_the_isotonic_distribution(tmp_path, monkeypatch):
    """``calibrate_models`` with ``distribution: isotonic`` writes artifacts that serve it (the model's
    and the point + same-calibration baseline's) and names it in ``metrics/dev.json``, whose
    cross-fitted numbers are the isotonic distribution's (the models' predictions faked)."""
    from uamt import model_evaluation
    from uamt.pipeline_config import PipelineConfig

    table = _mqm_table(12, 1500)
    monkeypatch.setattr(model_evaluation, "read_split", lambda *a, **k: table)
    monkeypatch.setattr(model_evaluation, "open_features", lambda encode: None)
    monkeypatch.setattr(model_evaluation, "predict_split", lambda *a, **k: table)
    monkeypatch.setattr(model_evaluation, "fit_reference_factors", lambda *a, **k: {})
    monkeypatch.setattr(model_evaluation, "training_splits", lambda model_dir: frozenset({"d_q"}))
    monkeypatch.setattr(model_evaluation, "pipeline_bounds", lambda pipe: BOUNDS)
    pipe = PipelineConfig(methods=("point", "hts"), dup_base="point", qe_methods=(), register_qe_method=None,
                          metrics_dir=str(tmp_path / "metrics"))  # fmt: skip
    monkeypatch.setattr(PipelineConfig, "all_methods", property(lambda self: ("point", "hts")))
    settings = dataclasses.replace(ISOTONIC, calibration_splits=("dev",))
    paths = model_evaluation.calibrate_models(pipe, settings, None, tmp_path / "calibration")
    dev = json.loads((tmp_path / "metrics" / "dev.json").read_text())
    for method in ("point", "hts"):
        served = Calibration.load(paths[method])
        assert served.isotonic is not None and served.top_atom is None
        assert dev[method]["distribution"] == "isotonic"
    baseline = Calibration.load(tmp_path / "calibration" / "baselines" / "point+signed_mondrian_conformal.json")
    assert baseline.isotonic is not None
    # the dev metrics are the isotonic distribution's, cross-fitted: close to 0.9 once randomised
    assert dev["hts"]["avg"]["coverage@0.9"] == pytest.approx(0.9, abs=0.03)
