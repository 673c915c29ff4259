"""Honest standardisation, DUP's sigma, calibration candidates, conformal coverage, the rule."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch

from uamt.models.dup import DUP_SIGMA_PER_ERROR, dup_sigma
from uamt.uncertainty import Standardizer, evaluate_predictions, interval_coverage
from uamt.uncertainty.candidates import (
    CANDIDATES,
    DEFAULT_CANDIDATES,
    ScoreVarianceCalibrator,
    candidate_sigma,
    document_folds,
    fit_candidate,
    fit_variance_by_score,
    select_candidate,
)
from uamt.uncertainty.conformal import ConformalCalibrator
from uamt.uncertainty.evaluate import EvaluationSettings, prediction_arrays
from uamt.uncertainty.metrics import expected_calibration_error, grouped_coverage, quantile_groups

COMMON = {"per_lp": True, "min_lp_rows": 50}


def heteroscedastic(rng, n, *, sigma_scale=1.0, docs=40):
    """mu ~ N(0, 1), true sigma log-uniform over 1.5 decades, model sigma = true sigma x ``sigma_scale``."""
    mu = rng.normal(size=n)
    sigma = np.exp(rng.uniform(np.log(0.1), np.log(3.0), size=n))
    human = rng.normal(mu, sigma)
    return human, mu, sigma * sigma_scale, np.array([f"d{i % docs}" for i in range(n)], dtype=object)


def table(human, mu, sigma, doc=None, **extra):
    frame = pd.DataFrame({"lp": "en-de", "human": human, "mu": mu, "sigma": sigma, **extra})
    if doc is not None:
        frame["doc"] = doc
    return frame


# ---------------------------------------------------------------------------------- standardisation
def test_predicted_sigma_does_not_enter_the_standardiser():
    rng = np.random.default_rng(0)
    human, mu, sigma, _ = heteroscedastic(rng, 400, sigma_scale=5.0)
    pooled = Standardizer(per_lp=False).fit(human, mu, sigma)
    own = Standardizer(per_lp=False).fit(human, mu, sigma, sigma_from_samples=False)
    assert own.global_params["pred_std"] == pytest.approx(np.std(mu))
    assert pooled.global_params["pred_std"] == pytest.approx(math.sqrt(np.var(mu) + np.mean(sigma**2)))
    assert own.global_params["pred_std"] < 0.5 * pooled.global_params["pred_std"]


def test_hts_and_dup_mu_is_not_shrunk_but_mcd_samples_are_pooled():
    rng = np.random.default_rng(1)
    human, mu, sigma, _ = heteroscedastic(rng, 300, sigma_scale=4.0)
    # HTS / DUP layout: mu, sigma and no sample spread -> standardised mu has unit spread on dev.
    hts = evaluate_predictions(table(human, mu, sigma), table(human, mu, sigma))
    assert hts["settings"]["sigma_from_samples"] is False
    assert hts["calibration"]["standardizer"]["global"]["pred_std"] == pytest.approx(np.std(mu))
    # MCD / DE: sigma is the spread of samples, given as the epistemic variance.
    mcd_frame = table(human, mu, sigma, epistemic=sigma**2)
    mcd = evaluate_predictions(mcd_frame, mcd_frame)
    assert mcd["settings"]["sigma_from_samples"] is True
    assert mcd["calibration"]["standardizer"]["global"]["pred_std"] == pytest.approx(
        math.sqrt(np.var(mu) + np.mean(sigma**2))
    )
    # HTS+MCD: only the epistemic (sample) part is pooled, not the predicted aleatoric part.
    hts_mcd_frame = table(human, mu, sigma, epistemic=np.full(mu.size, 0.01))
    hts_mcd = evaluate_predictions(hts_mcd_frame, hts_mcd_frame)
    assert hts_mcd["calibration"]["standardizer"]["global"]["pred_std"] == pytest.approx(math.sqrt(np.var(mu) + 0.01))


def test_point_model_placeholder_sigma_is_ignored():
    rng = np.random.default_rng(2)
    human, mu, _, _ = heteroscedastic(rng, 200)
    mu = 0.3 * mu  # raw units where a placeholder sigma of 1 dwarfs the spread of mu
    result = evaluate_predictions(table(human, mu, np.ones(mu.size)), table(human, mu, np.ones(mu.size)))
    assert result["calibration"]["standardizer"]["global"]["pred_std"] == pytest.approx(np.std(mu))
    forced = evaluate_predictions(
        table(human, mu, np.ones(mu.size)), table(human, mu, np.ones(mu.size)), sigma_source="samples"
    )
    assert forced["calibration"]["standardizer"]["global"]["pred_std"] == pytest.approx(math.sqrt(np.var(mu) + 1.0))


def test_sigma_source_is_checked_and_epistemic_validated():
    frame = table([0.0, 1.0], [0.1, 0.9], [1.0, 1.0], epistemic=[0.1, -0.2])
    with pytest.raises(ValueError, match=r"sigma_source='pooled' not supported; choose from \['auto', 'model', 'samples'\]"):
        prediction_arrays(frame, sigma_source="pooled")
    with pytest.raises(Exception, match=r"row 2.*'epistemic'.*negative"):
        prediction_arrays(frame)


# ---------------------------------------------------------------------------------- DUP
def test_dup_abs_loss_prediction_becomes_sigma():
    assert DUP_SIGMA_PER_ERROR == {"abs": pytest.approx(math.sqrt(math.pi / 2)), "sq": 1.0, "hts": 1.0}
    # The ABS loss is minimised by E|eps|; for Gaussian errors that is sigma * sqrt(2/pi).
    eps = np.abs(np.random.default_rng(3).normal(0.0, 2.0, size=200_000))
    assert dup_sigma(eps.mean(), "abs") == pytest.approx(2.0, rel=0.01)
    assert dup_sigma(math.sqrt(np.mean(eps**2)), "hts") == pytest.approx(2.0, rel=0.01)
    with pytest.raises(ValueError, match=r"loss='l1' not supported"):
        dup_sigma(1.0, "l1")


@pytest.mark.parametrize(("loss", "factor"), [("abs", math.pi / 2), ("hts", 1.0), ("sq", 1.0)])
def test_dup_estimator_predicts_converted_variance(loss, factor):
    from uamt.models import TrainConfig
    from uamt.models.dup import DUPEstimator

    cfg = TrainConfig(hidden_sizes=(8, 4), bottleneck_size=4, dup_loss=loss)
    module = DUPEstimator(cfg, num_layers=2, dim=4)
    eps_hat = torch.tensor([0.5, 2.0])
    module.forward = lambda batch: eps_hat  # the network's output; the conversion is what is tested
    out = module.predict_distribution({"q_hat": torch.tensor([0.1, -0.3])})
    assert torch.allclose(out["var"], eps_hat**2 * factor)
    assert torch.allclose(out["mu"], torch.tensor([0.1, -0.3]))


# ---------------------------------------------------------------------------------- conformal
def test_conformal_coverage_is_nominal_in_every_sigma_quintile():
    """Normalised split-conformal keeps sigma's ranking: with a sigma proportional to the truth (here
    3x too large) the interval covers ~90 % overall and in every quintile of sigma."""
    rng = np.random.default_rng(4)
    cal_h, cal_mu, cal_sigma, _ = heteroscedastic(rng, 4000, sigma_scale=3.0)
    human, mu, sigma, _ = heteroscedastic(rng, 20000, sigma_scale=3.0)
    conformal = ConformalCalibrator(gammas=(0.9,), per_lp=False).fit(cal_h, cal_mu, cal_sigma)
    low, high = conformal.interval(mu, sigma, 0.9)
    inside = (low <= human) & (human <= high)
    assert abs(inside.mean() - 0.9) < 0.01
    quintile = quantile_groups(sigma, 5)
    for q in range(5):
        assert abs(inside[quintile == q].mean() - 0.9) < 0.025, q
    # the candidate's Gaussian-equivalent sigma reproduces the same interval at 0.9
    equivalent = candidate_sigma(conformal, mu, sigma, None, 0.9)
    assert interval_coverage(human, mu, equivalent, 0.9) == pytest.approx(inside.mean())


def test_affine_ece_fit_loses_the_quintile_coverage_that_conformal_keeps():
    rng = np.random.default_rng(5)
    dev = heteroscedastic(rng, 3000, sigma_scale=3.0)
    human, mu, sigma, _ = heteroscedastic(rng, 6000, sigma_scale=3.0)
    quintile = quantile_groups(sigma, 5)
    gaps = {}
    for name in CANDIDATES:
        calibrator = fit_candidate(name, *dev[:3], None, common=COMMON, n_levels=100, ece_bound=0.01)
        cal = candidate_sigma(calibrator, mu, sigma, None, 0.9)
        by_q = grouped_coverage(human, mu, cal, quintile, 0.9)
        gaps[name] = max(abs(g["coverage"] - 0.9) for g in by_q.values())
    assert gaps["conformal"] < 0.04 and gaps["scale_nll"] < 0.04
    assert gaps["affine_nll"] < 0.06


def test_conformal_risk_comes_from_the_interval_quantiles():
    rng = np.random.default_rng(6)
    cal_h, cal_mu, cal_sigma, _ = heteroscedastic(rng, 2000)
    conformal = ConformalCalibrator(gammas=(0.5, 0.8, 0.9), per_lp=False).fit(cal_h, cal_mu, cal_sigma)
    mu, sigma = np.zeros(3), np.ones(3)
    low, high = conformal.interval(mu, sigma, 0.8)
    risk_high = conformal.risk(mu, sigma, high)
    risk_low = conformal.risk(mu, sigma, low)
    np.testing.assert_allclose(risk_high, 0.5 + 0.8 / 2)
    np.testing.assert_allclose(risk_low, 0.5 - 0.8 / 2)
    np.testing.assert_allclose(conformal.risk(mu, sigma, 0.0), 0.5)
    grid = conformal.risk(np.zeros(50), np.ones(50), np.linspace(-5, 5, 50))
    assert np.all(np.diff(grid) >= 0)


# ---------------------------------------------------------------------------------- proper-score fits
def test_score_fit_respects_the_ece_bound_and_scale_only_keeps_beta_zero():
    rng = np.random.default_rng(7)
    human, mu, sigma, _ = heteroscedastic(rng, 1500, sigma_scale=0.5)
    fit = fit_variance_by_score(human, mu, sigma, score="nll", ece_bound=0.01)
    best_ece = fit_variance_by_score(human, mu, sigma, score="nll", ece_bound=0.0)["ece_after"]
    assert fit["ece_after"] <= best_ece + 0.01 + 1e-12
    scale = fit_variance_by_score(human, mu, sigma, score="crps", scale_only=True, ece_bound=1.0)
    assert scale["beta"] == 0.0
    # the truth is sigma x 2, i.e. alpha = 4: the unconstrained scale fit lands near it
    assert 2.5 < scale["alpha"] < 6.0
    with pytest.raises(ValueError, match=r"score='mse' not supported; choose from \['crps', 'nll'\]"):
        fit_variance_by_score(human, mu, sigma, score="mse")


def test_fits_are_remembered_by_their_rows_and_options_and_returned_as_copies(monkeypatch):
    """The grid searches are remembered per process (a calibration asks for the same fit many
    times); a remembered answer must be the fit's own, for the same rows and options only."""
    from uamt.uncertainty import calibrators

    rng = np.random.default_rng(11)
    human, mu, sigma, _ = heteroscedastic(rng, 800, sigma_scale=0.5)
    fit_variance_by_score.cache_clear()
    calls = []
    grid = calibrators._ece_columns
    monkeypatch.setattr(
        "uamt.uncertainty.candidates._ece_columns", lambda *a: calls.append(1) or grid(*a)
    )
    first = fit_variance_by_score(human, mu, sigma, score="nll")
    searched = len(calls)
    assert searched > 0
    first["alpha"] = -1.0  # the caller's copy: the remembered answer is not changed
    again = fit_variance_by_score(human.tolist(), mu, sigma, score="nll")  # the same numbers
    assert len(calls) == searched and again["alpha"] > 0
    fit_variance_by_score.cache_clear()
    assert fit_variance_by_score(human, mu, sigma, score="nll") == again  # recomputed: the same fit
    assert len(calls) == 2 * searched
    other_rows = human.copy()
    other_rows[0] += 1.0
    fit_variance_by_score(other_rows, mu, sigma, score="nll")
    fit_variance_by_score(human, mu, sigma, score="crps")
    assert len(calls) == 4 * searched  # other rows, other options: searched again
    for bad in (["a"] * 800, np.full(800, np.nan)):  # what the fit refuses, it refuses as before
        with pytest.raises(ValueError) as unwrapped:
            fit_variance_by_score.__wrapped__(bad, mu, sigma)
        with pytest.raises(ValueError, match=re.escape(str(unwrapped.value))):
            fit_variance_by_score(bad, mu, sigma)


def test_score_calibrator_round_trips():
    rng = np.random.default_rng(8)
    human, mu, sigma, _ = heteroscedastic(rng, 300)
    lp = np.array(["en-de"] * 150 + ["zh-en"] * 150, dtype=object)
    calibrator = ScoreVarianceCalibrator(score="crps", scale_only=True).fit(human, mu, sigma, lp=lp)
    again = ScoreVarianceCalibrator.from_dict(calibrator.to_dict())
    np.testing.assert_allclose(again.transform(mu, sigma, lp), calibrator.transform(mu, sigma, lp))
    assert again.score == "crps" and again.scale_only is True


# ---------------------------------------------------------------------------------- folds and the rule
def test_document_folds_never_split_a_document():
    docs = np.array([f"d{i // 3}" for i in range(60)])
    folds = document_folds(docs, 5)
    for doc in set(docs):
        assert len(set(folds[docs == doc])) == 1
    assert sorted(set(folds)) == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(folds, document_folds(docs, 5))
    with pytest.raises(ValueError, match=r"n_folds=30 must lie in \[2, number of documents=20\]"):
        document_folds(docs, 30)


def test_rule_weighs_worst_gaps_against_their_goals():
    summaries = {
        "marginal_only": {"lp_coverage_error": 0.01, "conditional_coverage_error": 0.30, "ence": 0.4, "ece": 0.01},
        "balanced": {"lp_coverage_error": 0.05, "conditional_coverage_error": 0.06, "ence": 0.2, "ece": 0.02},
        "broken": None,
    }
    assert select_candidate(summaries, "min_goal_ratio") == "balanced"
    assert select_candidate(summaries, "min_ece") == "marginal_only"
    assert select_candidate(summaries, "min_ence") == "balanced"
    with pytest.raises(ValueError, match=r"calibration_rule='best' not supported"):
        select_candidate(summaries, "best")
    with pytest.raises(ValueError, match="no calibration candidate could be fitted"):
        select_candidate({"a": None}, "min_ece")


def test_evaluate_reports_every_candidate_the_choice_and_the_papers_cross_fitted_ece():
    rng = np.random.default_rng(9)
    dev = table(*heteroscedastic(rng, 600, sigma_scale=3.0))
    test = table(*heteroscedastic(rng, 600, sigma_scale=3.0))
    result = evaluate_predictions(test, dev)
    assert set(result["candidates"]) == set(DEFAULT_CANDIDATES)
    selection = result["calibration"]["selection"]
    assert selection["on"].startswith("dev, 5-fold cross-fitted over 40 documents")
    assert result["calibration"]["selected"] == selection["rule_choice"]
    chosen = result["candidates"][result["calibration"]["selected"]]["test"]
    assert result["methods"]["model"]["pooled"] == chosen["pooled"]
    cross = result["cross_fitted_ece"]
    assert cross["n_folds"] == 5 and 0 <= cross["per_lp"]["en-de"] <= 0.5
    conditional = result["methods"]["model"]["conditional"]
    assert set(conditional["by_sigma_quintile"]) == {"0", "1", "2", "3", "4"}
    assert conditional["low_score"]["n"] == int(np.sum(test["human"] <= -5.0))
    forced = evaluate_predictions(test, dev, settings=EvaluationSettings(calibration="affine_ece"))
    assert forced["calibration"]["selected"] == "affine_ece"


def test_settings_refuse_unknown_candidates_and_rules():
    with pytest.raises(ValueError, match=r"calibration candidate='isotonic' not supported"):
        EvaluationSettings(calibration_candidates=("affine_ece", "isotonic"))
    with pytest.raises(ValueError, match=r"calibration='conformal' not supported; choose from \['affine_ece', 'auto'\]"):
        EvaluationSettings(calibration="conformal", calibration_candidates=("affine_ece",))
    with pytest.raises(ValueError, match=r"calibration_rule='x' not supported"):
        EvaluationSettings(calibration_rule="x")


def test_ece_of_candidates_is_finite():
    rng = np.random.default_rng(10)
    human, mu, sigma, _ = heteroscedastic(rng, 500)
    for name in CANDIDATES:
        calibrator = fit_candidate(name, human, mu, sigma, None, common=COMMON, n_levels=100, ece_bound=0.01)
        assert 0 <= expected_calibration_error(human, mu, candidate_sigma(calibrator, mu, sigma, None, 0.9)) < 0.5


def test_mondrian_conformal_covers_every_mu_quintile_where_one_threshold_cannot():
    """Errors grow with |mu| (as MQM's do away from 0) while the model's sigma ignores it: one
    threshold per LP misses the extreme mu quintiles, one per mu bin covers each."""
    from uamt.uncertainty.candidates import MondrianConformalCalibrator

    def data(n):
        mu = rng.normal(size=n)
        sigma = np.exp(rng.uniform(-1.0, 0.5, size=n))
        return rng.normal(mu, sigma * (0.2 + mu**2)), mu, sigma

    rng = np.random.default_rng(11)
    cal, test = data(4000), data(20000)
    human, mu, sigma = test
    quintile = quantile_groups(mu, 5)
    gaps = {}
    for name in ("conformal", "mondrian_conformal"):
        calibrator = fit_candidate(name, *cal, None, common=COMMON, n_levels=100, ece_bound=0.01)
        low, high = calibrator.interval(mu, sigma, 0.9)
        inside = (low <= human) & (human <= high)
        gaps[name] = max(abs(inside[quintile == q].mean() - 0.9) for q in range(5))
        assert abs(inside.mean() - 0.9) < 0.02
    assert gaps["mondrian_conformal"] < 0.05 < 0.1 < gaps["conformal"], gaps
    fitted = fit_candidate("mondrian_conformal", *cal, None, common=COMMON, n_levels=100, ece_bound=0.01)
    again = MondrianConformalCalibrator.from_dict(fitted.to_dict())
    low, high = again.interval_at(mu[:5], sigma[:5], 0.8)
    np.testing.assert_allclose(again.risk(mu[:5], sigma[:5], high), 0.9)
    np.testing.assert_allclose(again.risk(mu[:5], sigma[:5], low), 0.1)


# ---------------------------------------------------------------------------------- signed Mondrian
def skewed(rng, n):
    """Left-skewed residuals, as MQM's (major errors far below mu): human = mu + s (1 - Exp(1)),
    mean 0, a long lower tail; the model's sigma is the true scale s."""
    mu = rng.normal(size=n)
    sigma = np.exp(rng.uniform(-1.0, 0.5, size=n))
    return mu + sigma * (1.0 - rng.exponential(size=n)), mu, sigma


def test_signed_conformal_quantiles_are_the_hand_computed_order_statistics():
    from uamt.uncertainty.conformal import signed_conformal_quantiles

    scores = [2.0, -3.0, 0.5, 7.0, -1.0, 0.0, 4.0, 1.0, -2.0]  # sorted: -3 -2 -1 0 0.5 1 2 4 7, n = 9
    # gamma 0.6: k_hi = ceil(10 * 0.8) = 8 -> 4, k_lo = floor(10 * 0.2) = 2 -> -2
    assert signed_conformal_quantiles(scores, 0.6) == (-2.0, 4.0)
    # gamma 0.8: k_hi = 9 -> 7 (the largest), k_lo = 1 -> -3 (the smallest)
    assert signed_conformal_quantiles(scores, 0.8) == (-3.0, 7.0)
    # gamma 0.9: k_hi = ceil(9.5) = 10 > n -> unbounded, as conformal_quantile's +inf
    assert signed_conformal_quantiles(scores, 0.9) == (-math.inf, math.inf)
    # gamma 0: the median (k_hi = ceil(5) = 5 = k_lo)
    assert signed_conformal_quantiles(scores, 0.0) == (0.5, 0.5)
    with pytest.raises(ValueError, match="gamma"):
        signed_conformal_quantiles(scores, 1.5)


def test_signed_mondrian_thresholds_on_a_tiny_table():
    from uamt.uncertainty.candidates import SignedMondrianConformalCalibrator

    calibrator = SignedMondrianConformalCalibrator(gammas=(0.6, 0.8))
    human = np.array([2.0, -3.0, 0.5, 7.0, -1.0, 0.0, 4.0, 1.0, -2.0])
    # signed z = (human - mu) / sigma = human / 2: sorted -1.5 -1 -0.5 0 0.25 0.5 1 2 3.5
    params = calibrator._bin_params(human, np.zeros(9), np.full(9, 2.0))
    assert params == {"lo@0.6": -1.0, "hi@0.6": 2.0, "lo@0.8": -1.5, "hi@0.8": 3.5}
    assert calibrator._bin_params(np.array([]), np.array([]), np.array([])) == {
        "lo@0.6": -math.inf, "hi@0.6": math.inf, "lo@0.8": -math.inf, "hi@0.8": math.inf,
    }
    # fitted end to end: per bin the order statistics of the z of that bin's rows on the fitted scale
    rng = np.random.default_rng(20)
    human, mu, sigma = skewed(rng, 300)
    # stepwise (as fitted before 2026-11-30): a row reads its own bin's thresholds
    fitted = SignedMondrianConformalCalibrator(gammas=(0.6, 0.8), n_bins=2, per_lp=False, interpolate=False).fit(
        human, mu, sigma
    )
    params = fitted.global_params
    upper_bin = mu > params["edge1"]
    scale = fitted.variance.transform(mu, sigma)
    z = np.sort(((human - mu) / scale)[upper_bin])
    n = z.size
    k_hi = math.ceil((n + 1) * 0.9)
    assert params["b1:hi@0.8"] == z[k_hi - 1] and params["b1:lo@0.8"] == z[n - k_hi]
    # the interval reads them; between levels lo and hi are interpolated linearly in probability
    row = np.flatnonzero(upper_bin)[:1]
    for gamma, lo, hi in (
        (0.8, params["b1:lo@0.8"], params["b1:hi@0.8"]),
        (0.7, (params["b1:lo@0.6"] + params["b1:lo@0.8"]) / 2, (params["b1:hi@0.6"] + params["b1:hi@0.8"]) / 2),
    ):
        low, high = fitted.interval_at(mu[row], sigma[row], gamma)
        np.testing.assert_allclose([low[0], high[0]], [mu[row][0] + lo * scale[row][0], mu[row][0] + hi * scale[row][0]])
    low, high = fitted.interval_at(mu[row], sigma[row], 0.85)  # above the largest fitted level
    assert (low[0], high[0]) == (-math.inf, math.inf)


@pytest.mark.parametrize("gamma", [0.9, 0.95])
def test_signed_mondrian_covers_the_skewed_tail_the_symmetric_one_misses(gamma):
    rng = np.random.default_rng(21)
    cal, (human, mu, sigma) = skewed(rng, 6000), skewed(rng, 30000)
    misses = {}
    for name in ("mondrian_conformal", "signed_mondrian_conformal"):
        calibrator = fit_candidate(name, *cal, None, common=COMMON, n_levels=100, ece_bound=0.01)
        low, high = calibrator.interval_at(mu, sigma, gamma)
        assert abs(np.mean((low <= human) & (human <= high)) - gamma) < 0.015, name  # both marginally nominal
        misses[name] = (np.mean(human < low), np.mean(human > high))
    tail = (1 - gamma) / 2
    below, above = misses["signed_mondrian_conformal"]
    assert abs(below - tail) < 0.01 and abs(above - tail) < 0.01, misses
    # the symmetric |z| threshold misses the long lower tail about twice as often as its share
    assert misses["mondrian_conformal"][0] > 1.6 * tail, misses


def test_signed_mondrian_is_nominal_on_symmetric_heteroscedastic_data():
    rng = np.random.default_rng(22)
    cal, (human, mu, sigma, _) = heteroscedastic(rng, 5000)[:3], heteroscedastic(rng, 20000)
    calibrator = fit_candidate("signed_mondrian_conformal", *cal, None, common=COMMON, n_levels=100, ece_bound=0.01)
    for gamma in (0.5, 0.8, 0.9, 0.95):
        low, high = calibrator.interval_at(mu, sigma, gamma)
        assert abs(np.mean((low <= human) & (human <= high)) - gamma) < 0.015, gamma


def test_signed_mondrian_risk_comes_from_the_interval():
    from uamt.uncertainty.candidates import SignedMondrianConformalCalibrator

    rng = np.random.default_rng(23)
    human, mu, sigma = skewed(rng, 2000)
    lp = np.where(rng.random(2000) < 0.5, "en-de", "zh-en").astype(object)
    calibrator = SignedMondrianConformalCalibrator(**COMMON).fit(human, mu, sigma, lp=lp)
    for gamma in (0.9, 0.87, 0.02):  # a fitted level, one between levels, one below the smallest
        low, high = calibrator.interval_at(mu, sigma, gamma, lp)
        np.testing.assert_allclose(calibrator.risk(mu, sigma, low, lp), (1 - gamma) / 2, atol=1e-9)
        np.testing.assert_allclose(calibrator.risk(mu, sigma, high, lp), (1 + gamma) / 2, atol=1e-9)
    # monotone in the threshold, and constant beyond the outermost knots: stepwise at the outermost
    # fitted probabilities; interpolated at the recalibrated CDF of the PIT values there (the share of
    # a bin's calibration rows beyond its outermost knots), within [0.005, 0.995]
    chis = np.linspace(-30, 30, 301)
    risks = np.array([calibrator.risk(mu[:20], sigma[:20], chi, lp[:20]) for chi in chis])
    assert np.all(np.diff(risks, axis=0) >= 0)
    far = np.array([calibrator.risk(mu[:20], sigma[:20], chi, lp[:20]) for chi in (-1e6, 1e6)])
    np.testing.assert_allclose(risks[[0, -1]], far)
    assert np.all((0.005 <= far) & (far <= 0.995)) and np.all(far[0] < 0.02) and np.all(far[1] > 0.98)
    stepwise = SignedMondrianConformalCalibrator(**COMMON, interpolate=False).fit(human, mu, sigma, lp=lp)
    np.testing.assert_allclose(stepwise.risk(mu[:20], sigma[:20], -30.0, lp[:20]), 0.005)
    np.testing.assert_allclose(stepwise.risk(mu[:20], sigma[:20], 30.0, lp[:20]), 0.995)
    # the served sigma: the Gaussian with it has the signed interval's width at gamma
    low, high = calibrator.interval_at(mu, sigma, 0.9, lp)
    served = candidate_sigma(calibrator, mu, sigma, lp, 0.9)
    np.testing.assert_allclose(served, (high - low) / (2 * 1.6448536269514722))


def test_mondrian_risk_and_interval_are_continuous_in_mu_and_rank_as_mu():
    """Interpolated between bin centres, the served risk and bounds move smoothly with mu: no jump
    at a bin edge, and with one sigma the risk of a low score never falls as mu falls (the stepwise
    distribution jumped at each edge, so ranking by its risk found bad rows less well than mu)."""
    from uamt.uncertainty.candidates import MondrianConformalCalibrator, SignedMondrianConformalCalibrator

    rng = np.random.default_rng(31)
    n = 4000
    mu = rng.normal(size=n)
    sigma = np.ones(n)
    human = mu + (0.5 + 0.6 * np.maximum(-mu, 0.0)) * (1.0 - rng.exponential(size=n))  # wider as mu falls
    grid = np.linspace(-2.0, 2.0, 4001)
    ones = np.ones_like(grid)
    for cls in (MondrianConformalCalibrator, SignedMondrianConformalCalibrator):
        smooth = cls(per_lp=False).fit(human, mu, sigma)
        step = cls(per_lp=False, interpolate=False).fit(human, mu, sigma)
        edges = [smooth.global_params[f"edge{k}"] for k in range(1, 5)]
        for fitted, continuous in ((smooth, True), (step, False)):
            low, high = fitted.interval_at(grid, ones, 0.9)
            risk = fitted.risk(grid, ones, -2.5)
            jump = max(np.abs(np.diff(low)).max(), np.abs(np.diff(high)).max())
            assert bool(jump < 0.01) is continuous, (cls.kind, continuous, jump)
            if continuous:
                assert np.all(np.diff(risk) <= 1e-12), cls.kind  # P(Q <= -2.5) falls as mu rises
            else:  # a bin edge inside the grid moves the bounds by a step
                assert any(abs(e) < 2 for e in edges)


def test_interpolated_mondrian_keeps_conformal_coverage_where_the_spread_is_convex():
    """Knots interpolated between bin centres alone over-cover where the spread is convex in mu
    (the chord lies above the curve: 0.943 overall at 0.9, 0.975 in the worst quintile); a PIT
    recalibration per LP restores the overall coverage but not the quintiles (worst 0.840); per
    bin it restores every mu quintile."""
    from uamt.uncertainty.candidates import MondrianConformalCalibrator, SignedMondrianConformalCalibrator

    def data(n):
        mu = rng.normal(size=n)
        sigma = np.exp(rng.uniform(-1.0, 0.5, size=n))
        return rng.normal(mu, sigma * (0.2 + mu**2)), mu, sigma

    rng = np.random.default_rng(11)
    cal, (human, mu, sigma) = data(4000), data(20000)
    quintile = quantile_groups(mu, 5)
    for cls in (MondrianConformalCalibrator, SignedMondrianConformalCalibrator):
        fitted = cls(per_lp=False).fit(*cal)
        assert "b0:pit:" + fitted._first_key() in fitted.global_params
        for gamma in (0.8, 0.9):
            low, high = fitted.interval_at(mu, sigma, gamma)
            inside = (low <= human) & (human <= high)
            assert abs(inside.mean() - gamma) < 0.01, (cls.kind, gamma, inside.mean())
            worst = max(abs(inside[quintile == q].mean() - gamma) for q in range(5))
            assert worst < 0.03, (cls.kind, gamma, worst)


def test_a_mondrian_artifact_without_centres_serves_stepwise():
    """Artifacts fitted before the interpolation (no ``mid<b>``, no ``pit:`` thresholds) serve what
    they were measured with: each row its bin's thresholds."""
    import json

    from uamt.uncertainty.candidates import SignedMondrianConformalCalibrator, candidate_from_dict

    rng = np.random.default_rng(32)
    human, mu, sigma = skewed(rng, 1200)
    lp = np.where(rng.random(1200) < 0.5, "en-de", "zh-en").astype(object)
    data = SignedMondrianConformalCalibrator(**COMMON).fit(human, mu, sigma, lp=lp).to_dict()
    older = json.loads(json.dumps(data))
    older.pop("interpolate")
    for params in (older["global"], *older["lps"].values()):
        for key in [k for k in params if k.startswith("mid") or ":pit:" in k]:
            del params[key]
    old, step = candidate_from_dict({"x": older}, "x"), SignedMondrianConformalCalibrator(**COMMON, interpolate=False)
    step = step.fit(human, mu, sigma, lp=lp)
    for gamma in (0.9, 0.5):
        np.testing.assert_allclose(old.interval_at(mu, sigma, gamma, lp), step.interval_at(mu, sigma, gamma, lp))
    np.testing.assert_allclose(old.risk(mu, sigma, -1.0, lp), step.risk(mu, sigma, -1.0, lp))
    now = candidate_from_dict({"x": json.loads(json.dumps(data))}, "x")
    assert now.interpolate and not np.allclose(now.risk(mu, sigma, -1.0, lp), step.risk(mu, sigma, -1.0, lp))


def test_signed_mondrian_is_invariant_to_row_order_and_round_trips():
    import json

    from uamt.uncertainty.candidates import SignedMondrianConformalCalibrator, candidate_from_dict

    rng = np.random.default_rng(24)
    human, mu, sigma = skewed(rng, 1500)
    lp = np.where(rng.random(1500) < 0.3, "en-de", "zh-en").astype(object)
    fitted = SignedMondrianConformalCalibrator(**COMMON).fit(human, mu, sigma, lp=lp)
    order = rng.permutation(1500)
    shuffled = SignedMondrianConformalCalibrator(**COMMON).fit(human[order], mu[order], sigma[order], lp=lp[order])
    fitted_dict, shuffled_dict = fitted.to_dict(), shuffled.to_dict()
    # the thresholds, edges and the variance fit are the same; only the reported mean dev score of
    # the variance fit differs, by float summation order
    for data in (fitted_dict, shuffled_dict):
        scores = [data["variance"]["global"].pop("score"), *(p.pop("score") for p in data["variance"]["lps"].values())]
        data["scores"] = pytest.approx(scores, rel=1e-12) if data is fitted_dict else scores
    assert shuffled_dict == fitted_dict
    data = json.loads(json.dumps(fitted.to_dict()))  # +-inf bounds survive JSON
    again = SignedMondrianConformalCalibrator.from_dict(data)
    assert again.to_dict() == fitted.to_dict()
    served = candidate_from_dict({"signed_mondrian_conformal": data}, "signed_mondrian_conformal")
    assert isinstance(served, SignedMondrianConformalCalibrator)
    for gamma in (0.5, 0.9, 0.99):
        np.testing.assert_array_equal(served.interval_at(mu, sigma, gamma, lp), fitted.interval_at(mu, sigma, gamma, lp))
    # a cell too small for the outer levels: its bounds are -inf / +inf, and read back so (JSON null)
    small = SignedMondrianConformalCalibrator(per_lp=False).fit(human[:60], mu[:60], sigma[:60])
    assert small.global_params["b0:lo@0.99"] == -math.inf and small.global_params["b0:hi@0.99"] == math.inf
    assert small.to_dict()["global"]["b0:lo@0.99"] is None
    read = SignedMondrianConformalCalibrator.from_dict(json.loads(json.dumps(small.to_dict())))
    assert read.global_params == small.global_params
    low, high = read.interval_at(mu[:3], sigma[:3], 0.99)
    assert np.all(low == -np.inf) and np.all(high == np.inf)
    with pytest.raises(ValueError, match="expected a serialised 'signed_mondrian_conformal', got kind='mondrian_conformal'"):
        SignedMondrianConformalCalibrator.from_dict({**data, "kind": "mondrian_conformal"})


def test_evaluation_counts_the_signed_interval_and_serves_it(tmp_path):
    from uamt.serving.model_calibration import Calibration
    from uamt.uncertainty.candidates import inside_interval

    rng = np.random.default_rng(25)
    dev, test = (table(*skewed(rng, 1500), doc=np.array([f"d{i % 40}" for i in range(1500)])) for _ in range(2))
    settings = EvaluationSettings(
        calibration="signed_mondrian_conformal", calibration_candidates=("mondrian_conformal", "signed_mondrian_conformal"),
        low_score_threshold=-1.5,
    )
    result = evaluate_predictions(test, dev, settings=settings)
    calibration = Calibration.from_result(result["calibration"])
    path = tmp_path / "hts.json"
    calibration.save(path)
    served = Calibration.load(path)
    assert served.selected == "signed_mondrian_conformal"
    low, high = served.interval(test["mu"], test["sigma"], 0.9, ["en-de"] * 1500)
    inside = inside_interval(test["human"], None, None, 0.9, (low, high))
    model = result["methods"]["model"]
    assert model["pooled"]["coverage@0.9"] == pytest.approx(inside.mean())
    bad = test["human"].to_numpy() <= -1.5
    assert model["conditional"]["low_score"]["coverage"] == pytest.approx(inside[bad].mean())
    symmetric = result["candidates"]["mondrian_conformal"]["test"]["conditional"]["low_score"]["coverage"]
    assert model["conditional"]["low_score"]["coverage"] > symmetric + 0.05
    risk = served.risk(test["mu"], test["sigma"], low[0], ["en-de"] * 1500)
    assert risk[0] == pytest.approx(0.05)
    # the served sigma is the served (skewed) distribution's own sd, not a Gaussian-equivalent width
    mu, sigma = served.apply(test["mu"], test["sigma"], ["en-de"] * 1500)
    np.testing.assert_allclose(sigma, served.served_sd(test["mu"], test["sigma"], ["en-de"] * 1500))
    assert not np.allclose(2 * 1.6448536269514722 * sigma, high - low)


def test_served_signed_calibration_with_unbounded_levels_loads(tmp_path):
    """Cells too small for the 0.99 level give -inf / +inf bounds: the file (JSON null) passes the
    loader's checks, reads back unbounded at 0.99 and finite at 0.9; a file without the candidate
    (written before it existed) loads as before."""
    from uamt.serving.model_calibration import Calibration

    rng = np.random.default_rng(26)
    dev = table(*skewed(rng, 300), doc=np.array([f"d{i % 30}" for i in range(300)]))
    pinned = EvaluationSettings(
        min_lp_rows=20, calibration="signed_mondrian_conformal", calibration_candidates=("signed_mondrian_conformal",)
    )
    result = evaluate_predictions(dev, dev, settings=pinned, scope="served")
    params = result["calibration"]["candidates"]["signed_mondrian_conformal"]["lps"]["en-de"]
    assert params["b0:lo@0.99"] is None and params["b0:hi@0.99"] is None  # 60 rows per cell: k_hi = 61 > 60
    path = tmp_path / "cal.json"
    Calibration.from_result(result["calibration"]).save(path)
    served = Calibration.load(path)
    assert served.served.lp_params["en-de"]["b0:lo@0.99"] == -math.inf
    mu, sigma = dev["mu"].to_numpy(), dev["sigma"].to_numpy()
    low, high = served.interval(mu, sigma, 0.99, ["en-de"] * 300)
    assert np.all(np.isinf(low)) and np.all(np.isinf(high)) and np.all(low < 0)
    low, high = served.interval(mu, sigma, 0.9, ["en-de"] * 300)
    assert np.all(np.isfinite(low)) and np.all(low < mu) and np.all(mu < high)
    older = {k: v for k, v in result["calibration"].items() if k != "candidates"}
    older["selected"] = None
    assert Calibration.from_dict(older).served is None


# ---------------------------------------------------------------------------------- centre and skew
def test_rule_weighs_the_lower_and_upper_miss_balance():
    summaries = {
        # both cover 0.9 in every cell; the symmetric one misses 9 % below and 1 % above
        "symmetric": {"lp_coverage_error": 0.01, "conditional_coverage_error": 0.03, "miss_balance_error": 0.04,
                      "ence": 0.1, "ece": 0.01},
        "signed": {"lp_coverage_error": 0.01, "conditional_coverage_error": 0.04, "miss_balance_error": 0.01,
                   "ence": 0.2, "ece": 0.02},
    }
    # ratios without the miss term: 0.6 vs 0.8; with t_miss = 0.015: max(0.6, 2.67) vs max(0.8, 0.67)
    assert select_candidate(summaries, "min_goal_ratio") == "symmetric"
    assert select_candidate(summaries, "min_goal_ratio", miss_tolerance=0.015) == "signed"
    with pytest.raises(ValueError, match="tolerances must be > 0"):
        select_candidate(summaries, "min_goal_ratio", miss_tolerance=0.0)


def test_conditional_report_scores_lp_by_quintile_cells_not_pooled_quintiles():
    from uamt.uncertainty.candidates import conditional_report

    # two LPs of 50 rows; mu quintile 0 (the 10 lowest mu of each LP): LP a covers 10/10, LP b 8/10,
    # pooled quintile 0 covers 18/20 = 0.9 exactly and hides LP b's cell at 0.8
    n = 50
    mu = np.tile(np.arange(n, dtype=float), 2)
    lp = np.array(["a"] * n + ["b"] * n, dtype=object)
    human = mu.copy()
    outside = [n + 0, n + 1]  # LP b, quintile 0: 2 misses
    human[outside] = mu[outside] - 10.0  # below the interval
    # other quintiles of both LPs: 1 miss in 10 above, except LP a quintile 0 (no miss)
    for q in range(1, 5):
        for base in (0, n):
            human[base + 10 * q] = mu[base + 10 * q] + 10.0
    sigma = np.ones(2 * n)
    doc = np.array([f"{lp[i]}{i // 2}" for i in range(2 * n)], dtype=object)  # documents of 2 rows
    report = conditional_report(human, mu, sigma, lp, 0.9, doc=doc)
    assert report["by_mu_quintile"]["0"]["coverage"] == pytest.approx(0.9)
    assert report["pooled_mu_quintile_coverage_error"] == pytest.approx(0.0, abs=1e-12)
    cell = report["by_lp_mu_quintile"]["b/0"]
    assert cell["coverage"] == pytest.approx(0.8) and cell["n"] == 10
    assert report["by_lp_mu_quintile"]["a/0"]["coverage"] == 1.0
    assert report["mu_quintile_coverage_error"] == pytest.approx(0.1)
    assert report["mu_quintile_worst_cell"] in {"a/0", "b/0"}
    assert cell["se"] == pytest.approx(math.sqrt(0.9 * 0.1 / 10))
    # clustered band: rows (n, n+1) form one document with both misses: sums -1.6, then 4 x +0.4
    assert cell["se_clustered"] == pytest.approx(math.sqrt(5 / 4 * (1.6**2 + 4 * 0.4**2)) / 10)
    # misses: LP b 2 below + 4 above of 50; LP a 0 below + 4 above
    miss = report["miss"]
    assert miss["by_lp"]["b"] == {"lower": pytest.approx(0.04), "upper": pytest.approx(0.08)}
    assert miss["by_lp"]["a"] == {"lower": 0.0, "upper": pytest.approx(0.08)}
    assert miss["lower"] == pytest.approx(0.02) and miss["upper"] == pytest.approx(0.08)
    assert miss["balance_error"] == pytest.approx(0.05)  # LP a: 0 below vs 0.05
    # the same counts from explicit bounds
    z = 1.6448536269514722
    bounded = conditional_report(human, mu, sigma, lp, 0.9, bounds=(mu - z, mu + z))
    assert bounded["miss"] == miss and bounded["mu_quintile_coverage_error"] == report["mu_quintile_coverage_error"]


def test_summary_reports_misses_width_and_mse():
    from uamt.uncertainty.candidates import candidate_summary

    rng = np.random.default_rng(41)
    human, mu, sigma = skewed(rng, 4000)
    lp = np.full(4000, "en-de", dtype=object)
    z = 1.6448536269514722
    summary = candidate_summary(human, mu, sigma, lp, 0.9)
    assert summary["lower_miss"] == pytest.approx(np.mean(human < mu - z * sigma))
    assert summary["upper_miss"] == pytest.approx(np.mean(human > mu + z * sigma))
    assert summary["miss_balance_error"] == pytest.approx(
        max(abs(summary["lower_miss"] - 0.05), abs(summary["upper_miss"] - 0.05))
    )
    assert summary["mean_width"] == pytest.approx(np.mean(2 * z * sigma))
    assert summary["mu_mse"] == pytest.approx(np.mean((human - mu) ** 2))
    assert summary["lower_miss"] > 2 * summary["upper_miss"]  # the skew the signed candidate corrects


def test_signed_candidate_is_a_default_and_the_rule_serves_it_on_skewed_data():
    assert "signed_mondrian_conformal" in DEFAULT_CANDIDATES
    rng = np.random.default_rng(42)
    docs = np.array([f"d{i % 60}" for i in range(3000)], dtype=object)
    dev, test = (table(*skewed(rng, 3000), doc=docs) for _ in range(2))
    settings = EvaluationSettings(calibration_candidates=("mondrian_conformal", "signed_mondrian_conformal"))
    assert settings.miss_balance_tolerance == 0.015  # the default weighs the miss balance
    result = evaluate_predictions(test, dev, settings=settings, scope="served")
    assert result["calibration"]["selected"] == "signed_mondrian_conformal"
    summaries = result["calibration"]["selection"]["summaries"]
    assert summaries["mondrian_conformal"]["miss_balance_error"] > 0.02
    assert summaries["signed_mondrian_conformal"]["miss_balance_error"] < 0.015
    with pytest.raises(ValueError, match=r"miss_balance_tolerance=0 must be > 0"):
        EvaluationSettings(miss_balance_tolerance=0)
    with pytest.raises(ValueError, match=r"mu_scaling='slope' not supported; choose from \['regression', 'spread'\]"):
        EvaluationSettings(mu_scaling="slope")


def test_cross_fitting_refits_the_mu_line_on_each_fold():
    from uamt.uncertainty.candidates import cross_fitted_sigmas, standardize

    rng = np.random.default_rng(43)
    n = 1000
    mu = rng.normal(size=n)
    human = 0.4 * mu + rng.normal(scale=1.0, size=n)
    docs = np.array([f"d{i % 50}" for i in range(n)], dtype=object)
    arrays = prediction_arrays(table(human, mu, np.ones(n), doc=docs))
    folds = document_folds(arrays.doc, 5)
    human_z, mu_z, _ = cross_fitted_sigmas(
        arrays, folds, ["affine_nll"], common=COMMON, n_levels=100, ece_bound=0.01, gamma=0.9, mu_scaling="regression"
    )
    for fold in range(5):
        held = folds == fold
        standardizer = Standardizer(**COMMON, mu_scaling="regression").fit(human[~held], mu[~held], lp=arrays.lp[~held])
        np.testing.assert_allclose(mu_z[held], standardizer.transform_predictions(mu[held], None, arrays.lp[held])[0])
    everything = np.ones(n, dtype=bool)
    fitted, _, _ = standardize(arrays, everything, everything, COMMON, mu_scaling="regression")
    assert fitted.mu_scaling == "regression"
    # out of fold, the dev-fitted line still beats slope 1 on this mu (correlation ~0.37)
    spread_h, spread_mu, _ = cross_fitted_sigmas(
        arrays, folds, ["affine_nll"], common=COMMON, n_levels=100, ece_bound=0.01, gamma=0.9
    )
    np.testing.assert_allclose(spread_h, human_z)
    assert np.mean((human_z - mu_z) ** 2) < 0.8 * np.mean((spread_h - spread_mu) ** 2)


@pytest.mark.parametrize("kind", ["split_conformal", "mondrian_conformal", "signed_mondrian_conformal"])
def test_interval_at_reads_one_level_per_row_as_it_reads_one_level(kind):
    from uamt.uncertainty.candidates import MondrianConformalCalibrator, SignedMondrianConformalCalibrator

    rng = np.random.default_rng(7)
    human, mu, sigma = skewed(rng, 900)
    lp = np.where(rng.random(900) < 0.4, "en-de", "zh-en").astype(object)
    make = {
        "split_conformal": lambda: ConformalCalibrator(gammas=(0.5, 0.8, 0.9)),
        "mondrian_conformal": lambda: MondrianConformalCalibrator(**COMMON),
        "signed_mondrian_conformal": lambda: SignedMondrianConformalCalibrator(**COMMON),
    }
    fitted = make[kind]().fit(human, mu, sigma, lp=lp)
    levels = rng.choice([0.0, 0.1, 0.5, 0.85, 0.9, 0.999, 1.0], size=900)
    low, high = fitted.interval_at(mu, sigma, levels, lp)
    for gamma in np.unique(levels):
        rows = levels == gamma
        one_low, one_high = fitted.interval_at(mu[rows], sigma[rows], float(gamma), lp[rows])
        np.testing.assert_array_equal(low[rows], one_low)
        np.testing.assert_array_equal(high[rows], one_high)
    assert np.all(np.isinf(low[levels == 1.0]))  # beyond every fitted level: unbounded
    with pytest.raises(ValueError, match=r"confidence level gamma\[1\]=1.5 must lie in \[0, 1\]"):
        fitted.interval_at(mu[:3], sigma[:3], np.array([0.5, 1.5, 0.2]), lp[:3])
    with pytest.raises(ValueError, match=r"gamma must be one level or one per row \(3\), got shape \(2,\)"):
        fitted.interval_at(mu[:3], sigma[:3], np.array([0.5, 0.2]), lp[:3])


# ------------------------------------------------------------------- the calibrate stage's fits reused
def _two_lp_tables(seed: int, n: int = 600):
    rng = np.random.default_rng(seed)
    frames = []
    for lp in ("en-de", "zh-en"):
        human, mu, sigma = skewed(rng, n)
        frames.append(table(human, mu, sigma, doc=np.array([f"{lp}-d{i % 30}" for i in range(n)])).assign(lp=lp))
    return pd.concat(frames, ignore_index=True)


def test_stored_candidate_fits_give_the_analysis_number_for_number_without_fitting_again(tmp_path, monkeypatch):
    """What the evaluate stage does with the calibrate stage's fits: the candidates and their
    selection, written as JSON and read back, give the same test analysis as fitting and
    cross-fitting them again on the same dev rows -- and nothing is fitted or cross-fitted."""
    import json

    import uamt.uncertainty.evaluate as evaluate_module
    from uamt.uncertainty.evaluate import candidate_fits

    dev, test = _two_lp_tables(31), _two_lp_tables(32)
    settings = EvaluationSettings(min_lp_rows=50, low_score_threshold=-1.5)
    refitted = evaluate_predictions(test, dev, settings=settings, scope="full")
    path = tmp_path / "fits.json"
    path.write_text(json.dumps(candidate_fits(evaluate_predictions(dev, dev, settings=settings, scope="served"))))
    stored = json.loads(path.read_text())
    assert len(stored["candidates"]) == len(DEFAULT_CANDIDATES)  # every candidate fitted, the served one among them

    def refuse(*args, **kwargs):
        raise AssertionError("a stored candidate was fitted again")

    monkeypatch.setattr(evaluate_module, "fit_candidate", refuse)
    monkeypatch.setattr(evaluate_module, "cross_fitted_sigmas", refuse)
    reused = evaluate_predictions(test, dev, settings=settings, scope="full", fitted=stored)
    assert reused == refitted


def test_stored_candidate_fits_of_other_rows_or_settings_are_refused():
    from uamt.core.errors import DataError
    from uamt.uncertainty.evaluate import CandidateFitsError, candidate_fits

    dev, test = _two_lp_tables(33), _two_lp_tables(34)
    settings = EvaluationSettings(min_lp_rows=50)
    stored = candidate_fits(evaluate_predictions(dev, dev, settings=settings, scope="served"))
    with pytest.raises(DataError, match="fitted on other rows"):
        evaluate_predictions(test, test, settings=settings, fitted=stored)
    with pytest.raises(DataError, match=r"rule='min_goal_ratio'\); the settings say calibration='auto', rule='min_ece'"):
        evaluate_predictions(test, dev, settings=EvaluationSettings(min_lp_rows=50, calibration_rule="min_ece"), fitted=stored)
    other = "conformal" if stored["selected"] != "conformal" else "scale_nll"
    with pytest.raises(DataError, match=f"serve {stored['selected']!r}.*the settings say calibration={other!r}"):
        evaluate_predictions(test, dev, settings=EvaluationSettings(min_lp_rows=50, calibration=other), fitted=stored)
    fewer = EvaluationSettings(min_lp_rows=50, calibration_candidates=("affine_ece", "conformal"))
    with pytest.raises(DataError, match=r"the stored candidate fits name \[.*'scale_nll'.*the settings list \['affine_ece', 'conformal'\]"):
        evaluate_predictions(test, dev, settings=fewer, fitted=stored)
    with pytest.raises(DataError, match="lack 'selection'"):
        evaluate_predictions(test, dev, settings=settings, fitted={k: v for k, v in stored.items() if k != "selection"})
    with pytest.raises(CandidateFitsError, match=r"a stored candidate fit cannot be read \(calibration kind='x' not supported"):
        evaluate_predictions(test, dev, settings=settings, fitted={**stored, "candidates": {**stored["candidates"], "conformal": {"kind": "x"}}})
    with pytest.raises(DataError, match=r"the stored candidate fits are malformed \(list indices"):
        evaluate_predictions(test, dev, settings=settings, fitted={**stored, "selection": ["min_goal_ratio"]})


def test_a_broken_candidate_fits_file_is_refused_naming_it(tmp_path):
    from uamt.core.errors import DataError
    from uamt.model_evaluation import CANDIDATE_FITS_DIR, read_candidate_fits

    assert read_candidate_fits(tmp_path, "hts") is None  # an older calibration folder: refitted
    (tmp_path / CANDIDATE_FITS_DIR).mkdir()
    (tmp_path / CANDIDATE_FITS_DIR / "hts.json").write_text('{"selected": "conformal", ')
    with pytest.raises(DataError, match=r"candidates/hts\.json: not valid JSON .*dvc repro calibrate"):
        read_candidate_fits(tmp_path, "hts")


@pytest.mark.parametrize("kind", ["mondrian_conformal", "signed_mondrian_conformal"])
def test_remembered_knots_never_change_an_answer(kind):
    """The interpolated knots a Mondrian calibrator remembers per row set (asked once per level)
    give every answer a fresh, unremembering copy gives, bit for bit: the same rows again, subsets,
    alternating row sets, a changed setting; the remembered arrays are read-only and neither
    pickling nor a deep copy carries them."""
    import copy
    import pickle

    from uamt.uncertainty.candidates import MondrianConformalCalibrator, SignedMondrianConformalCalibrator

    cls = {c.kind: c for c in (MondrianConformalCalibrator, SignedMondrianConformalCalibrator)}[kind]
    rng = np.random.default_rng(41)
    human, mu, sigma = skewed(rng, 2000)
    lp = np.where(rng.random(2000) < 0.4, "en-de", "zh-en").astype(object)
    fitted = cls(**COMMON).fit(human, mu, sigma, lp=lp)

    def fresh():
        return cls.from_dict(fitted.to_dict())

    grid = np.linspace(-3.0, 3.0, 301)
    asks = [
        (mu, sigma, lp), (mu[:700], sigma[:700], lp[:700]), (grid, np.ones_like(grid), np.full(grid.size, "en-de", dtype=object)),
        (mu, sigma, lp), (mu[::3], sigma[::3], lp[::3]), (mu, sigma, lp),
    ]
    for gamma in (0.5, 0.9, np.linspace(0.05, 0.95, mu.size)):
        for rows_mu, rows_sigma, rows_lp in asks:
            level = gamma if np.isscalar(gamma) else gamma[: rows_mu.size]
            got = fitted.interval_at(rows_mu, rows_sigma, level, rows_lp)
            want = fresh().interval_at(rows_mu, rows_sigma, level, rows_lp)
            for a, b in zip(got, want, strict=True):
                assert a.tobytes() == b.tobytes()
            assert fitted.risk(rows_mu, rows_sigma, -1.0, rows_lp).tobytes() == fresh().risk(rows_mu, rows_sigma, -1.0, rows_lp).tobytes()
    remembered = [entry for entries in fitted._knot_memo.values() for entry in entries if entry[3] is not None]
    assert remembered and all(not array.flags.writeable for entry in remembered for array in entry[3])
    stepwise = fresh()
    stepwise.interpolate = False  # a setting changed after a call: the remembered knots are not reused
    fitted.interpolate = False
    np.testing.assert_array_equal(fitted.interval_at(mu, sigma, 0.9, lp), stepwise.interval_at(mu, sigma, 0.9, lp))
    fitted.interpolate = True
    for copied in (pickle.loads(pickle.dumps(fitted)), copy.deepcopy(fitted)):
        assert "_knot_memo" not in vars(copied)
        np.testing.assert_array_equal(copied.interval_at(mu, sigma, 0.9, lp), fitted.interval_at(mu, sigma, 0.9, lp))
