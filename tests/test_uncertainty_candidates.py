"""Issue 15: honest standardisation, DUP's sigma, calibration candidates, conformal coverage, the rule."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from uamt.models.dup import DUP_SIGMA_PER_ERROR, dup_sigma
from uamt.uncertainty import Standardizer, evaluate_predictions, interval_coverage
from uamt.uncertainty.candidates import (
    CANDIDATES,
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
    assert set(result["candidates"]) == set(CANDIDATES)
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
