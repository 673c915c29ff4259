"""Calibration (standardisation, fixed variance, affine variance) and split-conformal intervals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from uamt.uncertainty import (
    AffineVarianceCalibrator,
    ConformalCalibrator,
    FixedVarianceCalibrator,
    Standardizer,
    conformal_quantile,
    expected_calibration_error,
    fit_affine_variance,
    fixed_variance,
    gaussian_nll_loss,
    interval_report,
    samples_to_mu_sigma,
)
from uamt.uncertainty.calibrators import MAX_MU_SLOPE, MIN_MU_SLOPE, mu_regression


def gaussian_data(rng, n, sigma_scale=1.0, lp=None):
    """Exchangeable synthetic data: the model's sigma is the true sigma times ``sigma_scale``."""
    mu = rng.normal(size=n)
    sigma = rng.uniform(0.2, 1.5, size=n)
    human = rng.normal(mu, sigma)
    lps = None if lp is None else np.full(n, lp, dtype=object)
    return human, mu, sigma * sigma_scale, lps


# ---------------------------------------------------------------------------------- fixed variance
def test_fixed_variance_closed_form_minimises_nll():
    human = np.array([1.0, 2.0, 4.0])
    mu = np.array([1.5, 1.0, 4.0])
    var = fixed_variance(human, mu)
    assert var == pytest.approx((0.25 + 1.0 + 0.0) / 3)
    nll = gaussian_nll_loss(human, mu, np.full(3, math.sqrt(var)))
    for factor in (0.8, 0.95, 1.05, 1.25):
        assert nll < gaussian_nll_loss(human, mu, np.full(3, math.sqrt(var * factor)))


def test_fixed_variance_calibrator_per_lp_with_global_fallback():
    human = np.array([0.0, 1.0, 0.0, 2.0, 0.0, 4.0])
    mu = np.zeros(6)
    lp = np.array(["a-b", "a-b", "c-d", "c-d", "e-f", "e-f"], dtype=object)
    calibrator = FixedVarianceCalibrator(per_lp=True, min_lp_rows=2).fit(human, mu, lp=lp)
    sigma = calibrator.transform(np.zeros(3), lp=np.array(["a-b", "c-d", "x-y"], dtype=object))
    np.testing.assert_allclose(sigma**2, [0.5, 2.0, (1 + 4 + 16) / 6])
    assert calibrator.params_for("x-y")[1] is True  # unseen LP -> global
    global_only = FixedVarianceCalibrator(per_lp=False).fit(human, mu, lp=lp)
    np.testing.assert_allclose(
        global_only.transform(np.zeros(2), lp=np.array(["a-b", "c-d"], dtype=object)) ** 2, 21 / 6
    )


# ---------------------------------------------------------------------------------- affine variance
def test_affine_calibration_fixes_a_too_narrow_sigma():
    rng = np.random.default_rng(7)
    dev_h, dev_mu, dev_sigma, _ = gaussian_data(rng, 4000, sigma_scale=0.4)
    test_h, test_mu, test_sigma, _ = gaussian_data(rng, 4000, sigma_scale=0.4)
    assert expected_calibration_error(test_h, test_mu, test_sigma) > 0.2  # detected
    calibrator = AffineVarianceCalibrator(per_lp=False).fit(dev_h, dev_mu, dev_sigma)
    calibrated = calibrator.transform(test_mu, test_sigma)
    assert expected_calibration_error(test_h, test_mu, calibrated) < 0.02  # fixed
    assert gaussian_nll_loss(test_h, test_mu, calibrated) < gaussian_nll_loss(test_h, test_mu, test_sigma)
    params = calibrator.global_params
    # the true correction is alpha = 1/0.4^2 = 6.25, beta = 0: mean calibrated variance must match it
    assert params["alpha"] * np.mean(dev_sigma**2) + params["beta"] == pytest.approx(
        6.25 * np.mean(dev_sigma**2), rel=0.1
    )


def test_affine_fit_never_worsens_dev_ece_and_keeps_variances_positive():
    rng = np.random.default_rng(3)
    human, mu, sigma, _ = gaussian_data(rng, 500)
    params = fit_affine_variance(human, mu, sigma, grid_size=11, refine_size=5)
    assert params["ece_after"] <= params["ece_before"] + 1e-12
    assert params["beta"] >= -params["alpha"] * np.min(sigma**2)
    assert params["var_floor"] > 0


def test_affine_fit_is_deterministic_and_row_order_invariant():
    rng = np.random.default_rng(5)
    human, mu, sigma, _ = gaussian_data(rng, 600, sigma_scale=2.0)
    first = fit_affine_variance(human, mu, sigma, grid_size=21, refine_size=7)
    order = rng.permutation(human.size)
    second = fit_affine_variance(human[order], mu[order], sigma[order], grid_size=21, refine_size=7)
    assert first["alpha"] == pytest.approx(second["alpha"]) and first["beta"] == pytest.approx(second["beta"])
    assert first["ece_after"] == pytest.approx(second["ece_after"])


def test_affine_per_lp_differs_from_global_and_falls_back():
    rng = np.random.default_rng(11)
    a = gaussian_data(rng, 1500, sigma_scale=0.4, lp="en-de")
    b = gaussian_data(rng, 1500, sigma_scale=2.5, lp="zh-en")
    human, mu, sigma, lp = (np.concatenate(parts) for parts in zip(a, b, strict=True))
    per_lp = AffineVarianceCalibrator(per_lp=True, grid_size=31, refine_size=11).fit(human, mu, sigma, lp=lp)
    assert per_lp.lp_params["en-de"]["alpha"] > per_lp.lp_params["zh-en"]["alpha"]
    for name, part in (("en-de", a), ("zh-en", b)):
        calibrated = per_lp.transform(part[1], part[2], lp=part[3])
        assert expected_calibration_error(part[0], part[1], calibrated) < 0.03, name
    global_only = AffineVarianceCalibrator(per_lp=False, grid_size=31, refine_size=11).fit(
        human, mu, sigma, lp=lp
    )
    assert global_only.lp_params == {}
    unseen = np.array(["ja-en"], dtype=object)
    np.testing.assert_allclose(per_lp.transform([0.0], [1.0], lp=unseen), global_only.transform([0.0], [1.0]))


def test_calibrators_serialise_to_json_and_back():
    rng = np.random.default_rng(2)
    human, mu, sigma, lp = gaussian_data(rng, 300, lp="en-de")
    lp[:100] = "de-en"
    test_lp = np.array(["en-de", "de-en", "new-lp"], dtype=object)
    for calibrator in (
        AffineVarianceCalibrator(min_lp_rows=50, grid_size=11, refine_size=5).fit(human, mu, sigma, lp=lp),
        FixedVarianceCalibrator(min_lp_rows=50).fit(human, mu, lp=lp),
        ConformalCalibrator(min_lp_rows=50, gammas=(0.5, 0.9)).fit(human, mu, sigma, lp=lp),
    ):
        restored = type(calibrator).from_dict(json.loads(json.dumps(calibrator.to_dict(), allow_nan=False)))
        assert restored.to_dict() == calibrator.to_dict()
        if isinstance(calibrator, ConformalCalibrator):
            np.testing.assert_allclose(
                restored.interval([0.0] * 3, [1.0] * 3, 0.9, lp=test_lp),
                calibrator.interval([0.0] * 3, [1.0] * 3, 0.9, lp=test_lp),
            )
        else:
            np.testing.assert_allclose(
                restored.transform([0.0] * 3, [1.0] * 3, lp=test_lp),
                calibrator.transform([0.0] * 3, [1.0] * 3, lp=test_lp),
            )
    with pytest.raises(ValueError, match="expected a serialised 'affine_variance'"):
        AffineVarianceCalibrator.from_dict({"kind": "fixed_variance"})


def test_unfitted_calibrator_refuses():
    with pytest.raises(RuntimeError, match="not fitted"):
        AffineVarianceCalibrator().transform([0.0], [1.0])


# ---------------------------------------------------------------------------------- standardisation
def test_standardizer_matches_pooled_sample_moments():
    rng = np.random.default_rng(9)
    samples = rng.normal(50, 10, size=(200, 30)) + rng.normal(0, 5, size=(200, 1))
    human = rng.normal(70, 15, size=200)
    mu, sigma = samples_to_mu_sigma(samples)
    standardizer = Standardizer(per_lp=False).fit(human, mu, sigma)
    params = standardizer.global_params
    assert params["pred_mean"] == pytest.approx(samples.mean())
    assert params["pred_std"] == pytest.approx(samples.std())  # pooled over all samples, ddof=0
    z_human = standardizer.transform_human(human)
    assert z_human.mean() == pytest.approx(0, abs=1e-12) and z_human.std() == pytest.approx(1)
    mu_z, sigma_z = standardizer.transform_predictions(mu, sigma)
    z_samples = (samples - samples.mean()) / samples.std()
    np.testing.assert_allclose(mu_z, z_samples.mean(axis=1))
    np.testing.assert_allclose(sigma_z, z_samples.std(axis=1))
    back_mu, back_sigma = standardizer.to_human_scale(mu_z, sigma_z)
    np.testing.assert_allclose(back_mu, params["human_mean"] + params["human_std"] * mu_z)
    np.testing.assert_allclose(back_sigma, params["human_std"] * sigma_z)


def test_standardizer_constant_dev_scores_raise():
    with pytest.raises(ValueError, match="cannot fit"):
        Standardizer().fit([1.0, 1.0, 1.0], [0.1, 0.2, 0.3])


def _lp_data(rng, n, lps=("en-de", "zh-en")):
    """Per LP: human = a + b * mu + noise with a different (a, b, noise) per LP, so mu correlates < 1."""
    lp = np.array([lps[i % len(lps)] for i in range(n)], dtype=object)
    mu = rng.normal(3.0, 2.0, size=n)
    slope = np.where(lp == lps[0], 1.5, -0.7)
    human = 10.0 + slope * mu + rng.normal(0, 4.0, size=n)
    return human, mu, lp


def test_regression_scaling_is_the_least_squares_line_of_human_z_on_mu_z_per_lp():
    rng = np.random.default_rng(31)
    human, mu, lp = _lp_data(rng, 2000)
    spread = Standardizer(min_lp_rows=10).fit(human, mu, lp=lp)
    regression = Standardizer(min_lp_rows=10, mu_scaling="regression").fit(human, mu, lp=lp)
    human_z = spread.transform_human(human, lp)
    np.testing.assert_allclose(regression.transform_human(human, lp), human_z)  # humans untouched
    mu_spread, _ = spread.transform_predictions(mu, None, lp)
    mu_reg, _ = regression.transform_predictions(mu, None, lp)
    rows = lp == "en-de"
    slope, intercept = np.polyfit(mu_spread[rows], human_z[rows], 1)
    assert 0.05 < slope < 1.0  # correlation < 1: the spread (slope-1) mu is over-dispersed
    np.testing.assert_allclose(mu_reg[rows], intercept + slope * mu_spread[rows], atol=1e-12)
    assert regression.lp_params["en-de"]["mu_slope"] == pytest.approx(slope)
    # least squares: never a larger in-sample squared error than the slope-1 mu
    assert np.mean((human_z[rows] - mu_reg[rows]) ** 2) < np.mean((human_z[rows] - mu_spread[rows]) ** 2)
    # anti-correlated LP: the slope is clipped at MIN_MU_SLOPE, the ranking is kept, not reversed
    rows = lp == "zh-en"
    assert regression.lp_params["zh-en"]["mu_slope"] == MIN_MU_SLOPE
    np.testing.assert_allclose(
        mu_reg[rows] - mu_reg[rows].mean(), MIN_MU_SLOPE * (mu_spread[rows] - mu_spread[rows].mean()), atol=1e-12
    )
    # sigma stays in mu's units: it shrinks by the same slope
    sigma = rng.uniform(0.5, 2.0, size=mu.size)
    _, sigma_spread = spread.transform_predictions(mu, sigma, lp)
    _, sigma_reg = regression.transform_predictions(mu, sigma, lp)
    np.testing.assert_allclose(sigma_reg[lp == "zh-en"], MIN_MU_SLOPE * sigma_spread[lp == "zh-en"])


def test_mu_regression_hand_computed_and_clipped():
    # human_z = 1 + 0.5 mu_z exactly
    assert mu_regression([0.0, 1.0, 2.0], [-2.0, 0.0, 2.0]) == pytest.approx((1.0, 0.5))
    # slope 3 is clipped to MAX_MU_SLOPE and the line still passes through the means (0, 1)
    assert mu_regression([-5.0, 1.0, 7.0], [-2.0, 0.0, 2.0]) == pytest.approx((1.0, MAX_MU_SLOPE))
    with pytest.raises(ValueError, match="mu_z is constant"):
        mu_regression([0.0, 1.0], [2.0, 2.0])


def test_regression_scaling_round_trips_and_old_files_read_as_spread():
    rng = np.random.default_rng(32)
    human, mu, lp = _lp_data(rng, 400)
    fitted = Standardizer(min_lp_rows=10, mu_scaling="regression").fit(human, mu, lp=lp)
    data = json.loads(json.dumps(fitted.to_dict()))
    assert data["mu_scaling"] == "regression"
    again = Standardizer.from_dict(data)
    assert again.mu_scaling == "regression" and again.to_dict() == fitted.to_dict()
    np.testing.assert_array_equal(again.transform_predictions(mu, None, lp)[0], fitted.transform_predictions(mu, None, lp)[0])
    spread = Standardizer(min_lp_rows=10).fit(human, mu, lp=lp)
    old = {k: v for k, v in spread.to_dict().items() if k != "mu_scaling"}  # written before the option
    read = Standardizer.from_dict(old)
    assert read.mu_scaling == "spread"
    np.testing.assert_array_equal(read.transform_predictions(mu, None, lp)[0], spread.transform_predictions(mu, None, lp)[0])
    with pytest.raises(ValueError, match=r"mu_scaling='isotonic' not supported; choose from \['regression', 'spread'\]"):
        Standardizer(mu_scaling="isotonic")


# ---------------------------------------------------------------------------------- conformal
def test_conformal_quantile_hand_computed():
    scores = np.arange(1.0, 10.0)  # n = 9
    assert conformal_quantile(scores[::-1], 0.9) == 9.0  # ceil(10 * 0.9) = 9th smallest
    assert conformal_quantile(scores, 0.5) == 5.0  # ceil(5) = 5
    assert conformal_quantile(scores, 0.95) == math.inf  # ceil(9.5) = 10 > n


def test_conformal_coverage_guarantee_on_exchangeable_heavy_tailed_data():
    # Student-t errors: Gaussian intervals with the true scale mis-cover, conformal ones do not.
    rng = np.random.default_rng(2024)
    # n_cal = 15: the finite-sample rank ceil(16 * 0.9) = 15 differs from the naive ceil(15 * 0.9) = 14,
    # whose expected coverage 14/16 = 0.875 would fail the guarantee.
    n_cal, n_test, trials, gamma = 15, 200, 400, 0.9
    coverages = []
    for _ in range(trials):
        n = n_cal + n_test
        mu = rng.normal(size=n)
        sigma = rng.uniform(0.2, 2.0, size=n)
        human = mu + sigma * rng.standard_t(df=3, size=n)
        conformal = ConformalCalibrator(gammas=(gamma,), per_lp=False).fit(
            human[:n_cal], mu[:n_cal], sigma[:n_cal]
        )
        lower, upper = conformal.interval(mu[n_cal:], sigma[n_cal:], gamma)
        coverages.append(np.mean((lower <= human[n_cal:]) & (human[n_cal:] <= upper)))
    exact = math.ceil((n_cal + 1) * gamma) / (n_cal + 1)  # 15/16 for continuous scores
    assert np.mean(coverages) >= gamma
    assert np.mean(coverages) == pytest.approx(exact, abs=0.015)


def test_interval_report_rows():
    rng = np.random.default_rng(4)
    human, mu, sigma, lp = gaussian_data(rng, 2000, lp="en-de")
    lp[1000:] = "zh-en"
    conformal = ConformalCalibrator(min_lp_rows=100).fit(human[::2], mu[::2], sigma[::2], lp=lp[::2])
    rows = interval_report(
        human[1::2],
        mu[1::2],
        gaussian_sigma=sigma[1::2],
        conformal=conformal,
        conformal_sigma=sigma[1::2],
        lp=lp[1::2],
    )
    assert len(rows) == 3 * 2 * 3  # (all, en-de, zh-en) x (gaussian, conformal) x (0.8, 0.9, 0.95)
    for row in rows:
        assert row["coverage"] == pytest.approx(row["gamma"], abs=0.06)
        assert row["mean_width"] > 0
    assert {row["lp"] for row in rows} == {"all", "en-de", "zh-en"}


def test_regression_scaling_is_served_and_stops_pushing_good_translations_past_the_top(tmp_path):
    """MQM-like data (0 = no error, a long tail below) and a mu that correlates 0.5 with it: slope 1
    puts about a third of the served mu above 0 (clipped there when served); the dev-fitted line does
    not, narrows the interval at equal coverage, and survives the calibration file."""
    import dataclasses

    import pandas as pd

    from uamt.serving.model_calibration import Calibration, fit_calibration
    from uamt.uncertainty import EvaluationSettings

    rng = np.random.default_rng(33)

    def mqm(n):
        quality = rng.normal(size=n)
        human = np.minimum(0.0, -np.exp(1.2 - 1.0 * quality + rng.normal(0, 0.5, n)) + 1.0)
        mu = 0.5 * (human - human.mean()) / human.std() + rng.normal(0, 0.87, n)
        doc = [f"d{i % 40}" for i in range(n)]
        return pd.DataFrame({"lp": "en-de", "human": human, "mu": mu, "sigma": 1.0, "doc": doc})

    dev, test = mqm(3000), mqm(3000)
    base = EvaluationSettings(calibration_candidates=("affine_nll",))
    served = {}
    for scaling in ("spread", "regression"):
        calibration, _ = fit_calibration(dev, None, settings=dataclasses.replace(base, mu_scaling=scaling))
        path = tmp_path / f"{scaling}.json"
        calibration.save(path)
        loaded = Calibration.load(path)
        assert loaded.standardizer.mu_scaling == scaling
        mu, _ = loaded.apply(test["mu"], test["sigma"], test["lp"])
        low, high = loaded.interval(test["mu"], test["sigma"], 0.9, test["lp"])
        human = test["human"].to_numpy()
        served[scaling] = {
            "above_top": np.mean(mu >= 0.0),
            "coverage": np.mean((low <= human) & (human <= high)),
            "width": np.mean(high - low),
            "mse": np.mean((mu - human) ** 2),
        }
    spread, regression = served["spread"], served["regression"]
    assert spread["above_top"] > 0.2 and regression["above_top"] < 0.5 * spread["above_top"], served
    assert abs(regression["coverage"] - spread["coverage"]) < 0.03, served
    assert regression["width"] < 0.8 * spread["width"] and regression["mse"] < spread["mse"], served


@pytest.mark.parametrize("bad", [None, "", 3, float("nan"), ["en-de"]])
def test_a_bad_language_pair_is_refused_naming_its_row(bad):
    from uamt.uncertainty.calibrators import _as_lp

    lp = np.array(["en-de", "zh-en", bad, "en-de"], dtype=object)
    with pytest.raises(ValueError, match=r"lp\[2\] = .* is not a non-empty string"):
        _as_lp(lp, 4)
    assert _as_lp(np.array(["en-de", "zh-en"], dtype=object), 2).tolist() == ["en-de", "zh-en"]


def test_lp_groups_are_the_sorted_distinct_lps_with_their_rows():
    from uamt.uncertainty.calibrators import lp_groups

    lp = np.array(["zh-en", "en-de", "zh-en", "he-en", "en-de"], dtype=object)
    groups = lp_groups(lp)
    assert [name for name, _ in groups] == ["en-de", "he-en", "zh-en"]
    for name, rows in groups:
        np.testing.assert_array_equal(rows, lp == name)
    assert lp_groups(np.array([], dtype=object)) == []
    with_missing = np.array(["en-de", None, "en-de"], dtype=object)  # factorize drops None: compared one by one
    assert [(name, rows.tolist()) for name, rows in lp_groups(with_missing)] == [
        (None, [False, True, False]),  # sorted as its text, "None"
        ("en-de", [True, False, True]),
    ]
