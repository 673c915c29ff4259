"""Issue 15's metrics outputs: evaluate_predictions scopes, the conditional.json block and its goals,
the doc/domain labels of predictions tables."""

from __future__ import annotations

import json
import types

import numpy as np
import pandas as pd
import pytest

import uamt.uncertainty.evaluate as evaluate_module
from uamt.models.api import TrainedModel
from uamt.uncertainty import EvaluationSettings, evaluate_predictions
from uamt.uncertainty.goals import GOALS, goal_rows, headline_metrics, interval_summary

SETTINGS = EvaluationSettings(min_lp_rows=20, calibration_candidates=("affine_ece", "scale_nll", "conformal"))


def split(rng, n, lps=("en-de", "zh-en"), domain="news"):
    """Heteroscedastic MQM-like rows with documents: the error grows with the predicted sigma."""
    lp = np.array([lps[i % len(lps)] for i in range(n)], dtype=object)
    sigma = rng.uniform(0.5, 3.0, n)
    mu = rng.normal(-2.0, 2.0, n)
    human = mu + rng.normal(0.0, 1.0, n) * sigma
    doc = [f"{lp[i]}/doc{i % 25}" for i in range(n)]
    return pd.DataFrame({"lp": lp, "human": human, "mu": mu, "sigma": sigma, "doc": doc, "domain": domain})


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(3)
    return split(rng, 600), split(rng, 600), split(rng, 300, lps=("en-de", "xx-yy"), domain="bio")


@pytest.fixture(scope="module")
def full(tables):
    dev, test, _ = tables
    return evaluate_predictions(test, dev, settings=SETTINGS, scope="full")


def test_served_scope_keeps_what_is_served_and_skips_the_candidates_report(tables, full):
    dev, test, _ = tables
    served = evaluate_predictions(test, dev, settings=SETTINGS, scope="served")
    assert json.dumps(served["methods"]) == json.dumps(full["methods"])
    assert json.dumps(served["calibration"]) == json.dumps(full["calibration"])
    assert "candidates" not in served and served["cross_fitted_ece"] is None
    assert set(full["candidates"]) == set(SETTINGS.calibration_candidates)
    assert full["cross_fitted_ece"]["n_folds"] == SETTINGS.cross_fit_folds


def test_fixed_variance_scope_fits_no_candidate(tables, full, monkeypatch):
    dev, test, _ = tables

    def refuse(*args, **kwargs):
        raise AssertionError("candidates fitted in scope='fixed_variance'")

    monkeypatch.setattr(evaluate_module, "_fit_candidates", refuse)
    monkeypatch.setattr(evaluate_module, "cross_fitted_sigmas", refuse)
    monkeypatch.setattr(evaluate_module, "cross_fitted_ece", refuse)
    result = evaluate_predictions(test, dev, settings=SETTINGS, scope="fixed_variance")
    assert list(result["methods"]) == ["fixed_variance"]
    assert json.dumps(result["methods"]["fixed_variance"]) == json.dumps(full["methods"]["fixed_variance"])
    assert result["calibration"]["selected"] is None
    with pytest.raises(AssertionError, match="candidates fitted"):
        evaluate_predictions(test, dev, settings=SETTINGS, scope="served")


def test_unknown_scope_is_refused(tables):
    dev, test, _ = tables
    with pytest.raises(ValueError, match=r"scope='all' not supported; choose from \['fixed_variance', 'full', 'served'\]"):
        evaluate_predictions(test, dev, settings=SETTINGS, scope="all")


def _metrics(result):
    """What the evaluate stage keeps of the model block (plus a hand-set ECE floor)."""
    block = result["methods"]["model"]
    return {"avg": {**block["macro_avg"], "ece_floor": 0.01}, **{lp: {**m, "ece_floor": 0.01} for lp, m in block["per_lp"].items()}}


def test_interval_summary_blocks_match_the_result(tables, full):
    dev, _, ood = tables
    ood_result = evaluate_predictions(ood, dev, settings=SETTINGS, scope="served")
    test_metrics, ood_metrics = _metrics(full), _metrics(ood_result)
    summary = interval_summary(full, test_metrics, ood_result, ood_metrics)
    conditional = full["methods"]["model"]["conditional"]
    assert summary["served"] == full["calibration"]["selected"]
    assert summary["conditional"]["lp_coverage_error"] == pytest.approx(
        max(abs(g["coverage"] - 0.9) for g in conditional["by_lp"].values())
    )
    assert set(summary["conditional"]["by_sigma_quintile"]) == {"0", "1", "2", "3", "4"}
    assert set(summary["conditional"]["by_domain"]) == {"news"}
    low = full["methods"]["model"]["conditional"]["low_score"]
    assert low["n"] == int((tables[1]["human"] <= -5).sum()) > 0
    for lp, row in summary["per_lp"].items():
        assert row["coverage"] == test_metrics[lp]["coverage@0.9"]
        assert row["cross_fitted_ece"] == full["cross_fitted_ece"]["per_lp"][lp]
    assert summary["ece"]["cross_fitted"] == full["cross_fitted_ece"]["macro_avg"]
    assert summary["candidates"]["scale_nll"]["ence"] == full["candidates"]["scale_nll"]["test"]["macro_avg"]["ence"]
    # xx-yy has no dev rows: the only held-out LP; its RMS sigma against the in-domain mean
    held = summary["held_out"]
    assert held["lps"] == ["xx-yy"]
    in_domain = np.mean([np.sqrt(test_metrics[lp]["sharpness"]) for lp in ("en-de", "zh-en")])
    assert held["sigma_ratio"] == pytest.approx(np.sqrt(ood_metrics["xx-yy"]["sharpness"]) / in_domain)
    assert held["coverage_min"] == ood_metrics["xx-yy"]["coverage@0.9"]
    assert set(held["coverage_by_domain"]) == {"bio"}
    assert [g["key"] for g in summary["goals"]] == [key for key, _, _ in GOALS]
    json.dumps(summary, allow_nan=False)


def _summary(**overrides):
    per_lp = {
        "en-de": {"sigma_p90_p10": 1.6, "ece": 0.015, "ece_floor": 0.01},
        "zh-en": {"sigma_p90_p10": 1.2, "ece": 0.05, "ece_floor": 0.03},  # floor above the goal: not judged
    }
    summary = {
        "conditional": {
            "lp_coverage_error": 0.02,
            "sigma_quintile_coverage_error": 0.06,
            "mu_quintile_coverage_error": 0.05,
            "low_score": {"coverage": 0.5, "n": 40},
        },
        "per_lp": per_lp,
        "ence": 0.2,
        "candidates": {"affine_ece": {"ence": 0.3}},
        "ece": {"cross_fitted": 0.03},
        "held_out": {"lps": ["xx-yy"], "sigma_ratio": 1.4, "coverage_min": 0.8},
    }
    summary.update(overrides)
    return summary


def test_goal_rows_judge_each_goal():
    rows = {row["key"]: row for row in goal_rows(_summary())}
    met = {key: row["met"] for key, row in rows.items()}
    assert met == {
        "lp_coverage_error": True,
        "sigma_quintile_coverage_error": False,
        "mu_quintile_coverage_error": True,
        "low_score_coverage": False,
        "sigma_p90_p10_min": False,
        "ence": True,
        "ece_max_where_floor_allows": True,
        "unseen_sigma_ratio": True,
        "unseen_coverage_min": False,
    }
    assert rows["sigma_p90_p10_min"]["value"] == 1.2
    assert rows["ece_max_where_floor_allows"]["value"] == 0.015
    assert "zh-en 0.030" in rows["ece_max_where_floor_allows"]["note"]
    assert rows["ence"]["note"] == "affine 0.300"


def test_goal_rows_leave_unmeasurable_goals_unjudged():
    summary = _summary(held_out=None, candidates={})
    summary["conditional"]["low_score"] = {"coverage": None, "n": 0}
    summary["per_lp"]["en-de"]["ece_floor"] = 0.05
    rows = {row["key"]: row for row in goal_rows(summary)}
    for key in ("low_score_coverage", "ence", "ece_max_where_floor_allows", "unseen_sigma_ratio", "unseen_coverage_min"):
        assert rows[key]["met"] is None, key


def test_headline_metrics_are_flat_and_count_goals_met():
    summary = _summary()
    summary["goals"] = goal_rows(summary)
    flat = headline_metrics({"hts": summary})
    assert flat["conditional.hts.goals_met"] == 5.0
    assert flat["conditional.hts.lp_coverage_error"] == 0.02
    assert flat["conditional.hts.cross_fitted_ece"] == 0.03


def test_predictions_table_carries_doc_and_domain():
    frame = pd.DataFrame(
        {
            "dataset": ["wmt21_mqm"] * 3,
            "lp": ["en-de"] * 3,
            "seg_id": [1, 2, 3],
            "system": ["a", "b", "c"],
            "score": [-1.0, 0.0, -5.0],
            "doc": ["newstest2021/en/d1", "newstest2021/en/d1", "newstest2021/en/d2"],
            "domain": ["news"] * 3,
        }
    )
    model = types.SimpleNamespace(predict=lambda df, features, n, enc: pd.DataFrame({"mu": [0.0] * 3, "sigma": [1.0] * 3}))
    table = TrainedModel.predictions_table(model, frame, None)
    assert table["doc"].tolist() == frame["doc"].tolist()
    assert table["domain"].tolist() == ["news"] * 3
    arrays = evaluate_module.prediction_arrays(table)
    assert arrays.doc_unit == "documents" and list(arrays.doc) == frame["doc"].tolist()
    partly = frame.assign(doc=["d1", None, "d2"])
    assert "doc" not in TrainedModel.predictions_table(model, partly, None).columns
