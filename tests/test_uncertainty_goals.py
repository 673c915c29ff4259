"""Metrics outputs: evaluate_predictions scopes, the conditional.json block and its goals, the
doc/domain labels of predictions tables."""

from __future__ import annotations

import json
import types

import numpy as np
import pandas as pd
import pytest

import uamt.uncertainty.evaluate as evaluate_module
from uamt.models.api import TrainedModel
from uamt.uncertainty import EvaluationSettings, evaluate_predictions
from uamt.uncertainty.goals import (
    GOALS,
    UNSEEN_NOT_YET,
    goal_rows,
    headline_metrics,
    held_out_block,
    served_summary,
    with_held_out,
)

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


def _cell(lp, coverage, se=0.01):
    return {"lp": lp, "cell": "q1", "coverage": coverage, "gap": coverage - 0.9, "se": se, "cells_outside": 1, "cells": 10}


def _lp(coverage, *, below=0.05, above=0.05, low=0.9, low_n=40, ece=0.015, floor=0.01, risk_gap=0.03):
    return {
        "n": 500,
        "coverage": coverage,
        "width": 8.0,
        "miss_below": below,
        "miss_above": above,
        "low_score_coverage": low,
        "low_score_n": low_n,
        "ece": ece,
        "ece_floor": floor,
        "risk": {"-5": {"max_gap": risk_gap, "brier": 0.1}},
    }


def _summary(**overrides):
    summary = {
        "coverage_gamma": 0.9,
        "per_lp": {
            "en-de": _lp(0.92, below=0.07, above=0.01, low=0.80, low_n=60),
            "zh-en": _lp(0.89, ece=0.05, floor=0.03, risk_gap=0.08),  # floor above the goal: not judged
        },
        "worst_cells": {"sd": _cell("zh-en", 0.83), "mu": _cell("en-de", 0.93)},
        "baseline": {"name": "point+mondrian_conformal", "crps": 1.50, "crps_delta": -0.02},
        "held_out": {"lps": ["xx-yy"], "coverage_by_lp": {"xx-yy": 0.80}},
    }
    summary.update(overrides)
    return summary


def test_goal_rows_judge_each_goal():
    rows = {row["key"]: row for row in goal_rows(_summary())}
    met = {key: row["met"] for key, row in rows.items()}
    assert met == {
        "worst_sd_cell_gap": False,
        "worst_mu_cell_gap": True,
        "lp_coverage_error": True,
        "low_score_coverage": False,
        "miss_balance_error": False,
        "risk_max_gap": False,
        "ece_max_where_floor_allows": True,
        "crps_vs_baseline": True,
        "unseen_coverage_error": False,
    }
    assert rows["worst_sd_cell_gap"]["value"] == pytest.approx(0.07)
    assert rows["low_score_coverage"]["value"] == pytest.approx((0.80 * 60 + 0.90 * 40) / 100)  # pooled rows
    assert rows["miss_balance_error"]["value"] == pytest.approx(0.04)
    assert rows["miss_balance_error"]["note"] == "en-de: below 0.070, above 0.010"
    assert rows["risk_max_gap"]["note"] == "zh-en at chi=-5"
    banded = _summary()
    banded["per_lp"]["zh-en"]["risk"]["-5"]["bins"] = [
        {"predicted": 0.10, "observed": 0.18, "se": 0.01},  # 0.08 > 0.05 + 0.0196: beyond its band
        {"predicted": 0.30, "observed": 0.38, "se": 0.02},  # 0.08 <= 0.05 + 0.0392: within its band
    ]
    note = {row["key"]: row for row in goal_rows(banded)}["risk_max_gap"]["note"]
    assert note == "zh-en at chi=-5; 1/2 deciles beyond ±0.05 + 1.96 se"
    assert rows["ece_max_where_floor_allows"]["value"] == 0.015
    assert "zh-en 0.030" in rows["ece_max_where_floor_allows"]["note"]
    assert rows["crps_vs_baseline"]["note"] == "point+mondrian_conformal 1.500"
    assert [row["key"] for row in goal_rows(_summary())] == [key for key, _, _ in GOALS]


def test_goal_rows_give_each_value_its_sampling_band_and_say_when_the_bound_lies_inside_it():
    summary = _summary()
    for m, n_eff in zip(summary["per_lp"].values(), (100.0, 400.0), strict=True):
        m["n_eff"] = n_eff  # n = 500 rows: design effects 5 (en-de) and 1.25 (zh-en)
    summary["per_lp"]["zh-en"]["risk"]["-5"]["bins"] = [
        {"predicted": 0.10, "observed": 0.12, "se": 0.01},
        {"predicted": 0.30, "observed": 0.38, "se": 0.02},  # the widest gap (0.08): its se is the band's
    ]
    summary["held_out"]["n_eff_by_lp"] = {"xx-yy": 50.0}
    rows = {row["key"]: row for row in goal_rows(summary)}
    band = {key: row["band"] for key, row in rows.items()}
    within = {key: row["within_band"] for key, row in rows.items()}
    assert band["worst_sd_cell_gap"] == pytest.approx(1.96 * 0.01)
    assert within["worst_sd_cell_gap"] is False  # |0.07 - 0.05| > 0.0196
    # the worst LP is en-de (|0.92 - 0.9|): binomial at 0.9 over its 100 effective rows
    assert band["lp_coverage_error"] == pytest.approx(1.96 * (0.9 * 0.1 / 100) ** 0.5)  # 0.0588
    assert within["lp_coverage_error"] is True  # |0.02 - 0.03| <= 0.0588: met, but not decided
    assert rows["lp_coverage_error"]["note"] == "en-de 0.920"
    # en-de's misses (0.07 / 0.01) are the worst: binomial at 0.05 over its 100 effective rows
    assert band["miss_balance_error"] == pytest.approx(1.96 * (0.05 * 0.95 / 100) ** 0.5)  # 0.0427
    assert within["miss_balance_error"] is True  # |0.04 - 0.015| = 0.025 <= 0.0427
    # pooled bad-segment coverage: each LP's share squared x p(1-p) over its low rows at its design effect
    var = (0.6**2) * 0.8 * 0.2 / (60 / 5) + (0.4**2) * 0.9 * 0.1 / (40 / 1.25)
    assert band["low_score_coverage"] == pytest.approx(1.96 * var**0.5)
    assert within["low_score_coverage"] is True  # |0.84 - 0.85| <= 0.23
    assert band["risk_max_gap"] == pytest.approx(1.96 * 0.02)
    assert within["risk_max_gap"] is True  # |0.08 - 0.05| = 0.03 <= 0.0392
    assert band["unseen_coverage_error"] == pytest.approx(1.96 * (0.9 * 0.1 / 50) ** 0.5)  # 0.0832
    assert within["unseen_coverage_error"] is True  # |0.1 - 0.05| <= 0.0832
    assert rows["unseen_coverage_error"]["note"] == "LPs xx-yy; largest xx-yy 0.800"
    for key in ("ece_max_where_floor_allows", "crps_vs_baseline"):  # the floor; a paired difference
        assert band[key] is None and within[key] is None, key
    # without effective sizes (a summary from before they were kept) no band is claimed
    bare = {row["key"]: row for row in goal_rows(_summary())}
    for key in ("lp_coverage_error", "low_score_coverage", "miss_balance_error", "unseen_coverage_error"):
        assert bare[key]["band"] is None and bare[key]["within_band"] is None, key


def test_a_worst_of_k_miss_is_beyond_chance_only_beyond_the_familys_band():
    from uamt.uncertainty.goals import family_z

    assert family_z(1) == pytest.approx(1.959964, abs=1e-6)
    assert family_z(20) == pytest.approx(3.023341, abs=1e-6)  # Phi^-1(1 - 0.05 / 40)
    with pytest.raises(ValueError, match="members=0"):
        family_z(0)
    summary = _summary()
    # 20 risk deciles, the worst 0.05 + 0.06 with se 0.02: beyond 1.96 se (0.039), within 3.18 se
    bins = [{"predicted": 0.2, "observed": 0.2, "se": 0.02} for _ in range(19)]
    bins.append({"predicted": 0.2, "observed": 0.31, "se": 0.02})
    summary["per_lp"]["zh-en"]["risk"]["-5"].update(max_gap=0.11, bins=bins)
    summary["per_lp"]["en-de"]["risk"]["-5"]["bins"] = []
    row = {r["key"]: r for r in goal_rows(summary)}["risk_max_gap"]
    assert row["family"] == 20 and row["within_band"] is False
    assert row["beyond_chance"] is False  # 0.06 <= 3.02 x 0.02 = 0.0605
    bins[-1]["observed"] = 0.32  # 0.07 > 0.0605
    summary["per_lp"]["zh-en"]["risk"]["-5"]["max_gap"] = 0.12
    assert {r["key"]: r for r in goal_rows(summary)}["risk_max_gap"]["beyond_chance"] is True
    # another member with a small se decides it even though the worst one does not
    bins[-1]["observed"] = 0.31
    bins[0].update(observed=0.29, se=0.01)  # 0.04 over the bound, 4 se
    assert {r["key"]: r for r in goal_rows(summary)}["risk_max_gap"]["beyond_chance"] is True
    # the cells: every LP x quintile cell is a member, each with its own se
    cells = {f"q{i}": {"gap": 0.0, "se": 0.02} for i in range(1, 6)}
    for m in summary["per_lp"].values():
        m["cells"] = {"sd": {q: dict(c) for q, c in cells.items()}, "mu": {q: dict(c) for q, c in cells.items()}}
    summary["per_lp"]["zh-en"]["cells"]["sd"]["q1"]["gap"] = -0.07  # the worst cell of _summary (0.83)
    rows = {r["key"]: r for r in goal_rows(summary)}
    assert rows["worst_sd_cell_gap"]["family"] == 10
    assert rows["worst_sd_cell_gap"]["beyond_chance"] is False  # 0.02 <= 2.81 x 0.02
    assert rows["worst_mu_cell_gap"]["beyond_chance"] is False  # met
    # the LPs: each LP's coverage at its own n_eff; misses per LP and side (2 x 2 members)
    for m, n_eff in zip(summary["per_lp"].values(), (100.0, 400.0), strict=True):
        m["n_eff"] = n_eff
    rows = {r["key"]: r for r in goal_rows(summary)}
    assert rows["lp_coverage_error"]["family"] == 2 and rows["lp_coverage_error"]["beyond_chance"] is False
    assert rows["miss_balance_error"]["family"] == 4
    # en-de below 0.07: 0.005 over the tolerance, se 0.0218: not decided
    assert rows["miss_balance_error"]["beyond_chance"] is False
    summary["per_lp"]["en-de"]["miss_below"] = 0.15  # 0.085 over, > 2.50 x 0.0218
    assert {r["key"]: r for r in goal_rows(summary)}["miss_balance_error"]["beyond_chance"] is True
    # a pooled value is a family of one: beyond chance exactly when beyond its band
    low = {r["key"]: r for r in goal_rows(summary)}["low_score_coverage"]
    assert low["family"] == 1 and low["beyond_chance"] is (low["within_band"] is False)


def test_the_crps_difference_gets_its_paired_band():
    summary = _summary()
    summary["baseline"].update(crps_delta=0.01, crps_delta_se=0.004)
    row = {r["key"]: r for r in goal_rows(summary)}["crps_vs_baseline"]
    assert row["met"] is False and row["band"] == pytest.approx(1.96 * 0.004)
    assert row["within_band"] is False and row["beyond_chance"] is True  # 0.01 > 0.00784
    summary["baseline"]["crps_delta_se"] = 0.006
    row = {r["key"]: r for r in goal_rows(summary)}["crps_vs_baseline"]
    assert row["within_band"] is True and row["beyond_chance"] is False
    summary["baseline"]["crps_delta"] = -0.02
    assert {r["key"]: r for r in goal_rows(summary)}["crps_vs_baseline"]["beyond_chance"] is False  # met


def test_goal_rows_leave_unmeasurable_goals_unjudged():
    summary = _summary(held_out=None, baseline=None, worst_cells={"sd": None, "mu": None})
    for m in summary["per_lp"].values():
        m.update(low_score_coverage=None, low_score_n=0, ece_floor=0.05)
    rows = {row["key"]: row for row in goal_rows(summary)}
    for key in (
        "worst_sd_cell_gap", "worst_mu_cell_gap", "low_score_coverage", "ece_max_where_floor_allows",
        "crps_vs_baseline", "unseen_coverage_error",
    ):
        assert rows[key]["met"] is None, key


def test_headline_metrics_are_flat_and_count_goals_met():
    summary = _summary(ece={"papers_cross_fitted": 0.03})
    summary["goals"] = goal_rows(summary)
    flat = headline_metrics({"hts": summary})
    assert flat["conditional.hts.goals_met"] == 4.0
    assert flat["conditional.hts.goals_missed_within_band"] == 0.0  # no effective sizes, no bands
    for m in summary["per_lp"].values():
        m["n_eff"] = 100.0
    summary["goals"] = goal_rows(summary)
    # missed within their bands: bad-segment coverage 0.84 (band 0.12) and the miss balance 0.04 (0.043)
    assert headline_metrics({"hts": summary})["conditional.hts.goals_missed_within_band"] == 2.0
    # beyond chance: the held-out LP (0.80, no n_eff: unknown) no; the LPs' misses no; none decided
    assert headline_metrics({"hts": summary})["conditional.hts.goals_missed_beyond_chance"] == 0.0
    summary["held_out"]["n_eff_by_lp"] = {"xx-yy": 400.0}  # |0.8 - 0.9| - 0.05 = 0.05 > 1.96 x 0.015
    summary["goals"] = goal_rows(summary)
    assert headline_metrics({"hts": summary})["conditional.hts.goals_missed_beyond_chance"] == 1.0
    assert flat["conditional.hts.lp_coverage_error"] == pytest.approx(0.02)
    assert flat["conditional.hts.papers_cross_fitted_ece"] == 0.03


def test_served_summary_from_measured_metrics(tables):
    """The conditional.json block of a model, from its served metrics on test and ood."""
    from uamt.model_evaluation import ask, measure
    from uamt.serving.model_calibration import fit_calibration

    dev, test, ood = tables
    settings = EvaluationSettings(min_lp_rows=20, calibration="mondrian_conformal", calibration_candidates=("mondrian_conformal",))
    calibration = fit_calibration(dev, "hts", settings=settings)[0]
    measured = {name: measure(calibration, ask(calibration, t, settings, None), t, settings) for name, t in (("test", test), ("ood", ood))}
    summary = served_summary(
        measured["test"], measured["ood"], served=calibration.selected, rule="min_goal_ratio",
        known_lps=calibration.known_lps, baseline=measured["test"], baseline_name="point+mondrian_conformal",
    )
    assert summary["served"] == "mondrian_conformal"
    assert summary["per_lp"]["en-de"]["coverage"] == measured["test"]["en-de"]["coverage@0.9"]
    assert summary["held_out"]["lps"] == ["xx-yy"]  # no dev rows: the only held-out LP
    assert summary["held_out"]["coverage_by_lp"]["xx-yy"] == measured["ood"]["xx-yy"]["coverage@0.9"]
    assert summary["baseline"]["crps_delta"] == 0.0
    assert [g["key"] for g in summary["goals"]] == [key for key, _, _ in GOALS]
    json.dumps(summary, allow_nan=False)

    # The held-out LPs measured later (evaluate_ood) and completed: the same block and goals as at once
    pending = served_summary(
        measured["test"], None, served=calibration.selected, rule="min_goal_ratio",
        known_lps=calibration.known_lps, baseline=measured["test"], baseline_name="point+mondrian_conformal",
        held_out_pending=True,
    )
    unseen = {g["key"]: g for g in pending["goals"]}["unseen_coverage_error"]
    assert pending["held_out"] is None and unseen["value"] is None and unseen["note"] == UNSEEN_NOT_YET
    block = held_out_block(measured["ood"], calibration.known_lps, measured["test"]["avg"]["width@0.9"])
    assert with_held_out({"hts": pending}, {"hts": block})["hts"] == summary
    assert with_held_out({"hts": pending}, None) == {"hts": pending}  # not measured yet: as it was
    # nothing to measure later (a campaign's block): the goal says there are no held-out LPs
    none = served_summary(measured["test"], None, served=calibration.selected, rule=None, known_lps=calibration.known_lps)
    assert {g["key"]: g for g in none["goals"]}["unseen_coverage_error"]["note"] == "LPs none"


def test_the_crps_difference_is_paired_over_the_same_test_rows(tables):
    """evaluate's band of the CRPS goal: per-row CRPS of the model and its baseline on the same rows."""
    from uamt.model_evaluation import ask, measure, paired_crps_se, row_documents
    from uamt.serving.model_calibration import fit_calibration
    from uamt.uncertainty.metrics import macro_mean_se
    from uamt.uncertainty.served import row_crps

    dev, test, _ = tables
    settings = EvaluationSettings(min_lp_rows=20, calibration="mondrian_conformal", calibration_candidates=("mondrian_conformal",))
    model = fit_calibration(dev, "hts", settings=settings)[0]
    point = dev.assign(sigma=1.0)
    baseline = fit_calibration(point, None, settings=settings)[0]
    rows = {"model": ask(model, test, settings, None), "baseline": ask(baseline, test.assign(sigma=1.0), settings, None)}
    crps = {name: row_crps(r, test["human"]) for name, r in rows.items()}
    for name, calibration in (("model", model), ("baseline", baseline)):
        full = measure(calibration, rows[name], test, settings)
        for lp in ("en-de", "zh-en"):  # the served metrics' CRPS is the mean of the rows'
            assert full[lp]["crps"] == pytest.approx(np.nanmean(crps[name][test["lp"] == lp]))
    se = paired_crps_se(crps["model"], crps["baseline"], test)
    diff = crps["model"] - crps["baseline"]
    assert se == pytest.approx(macro_mean_se(diff, test["lp"].to_numpy(), row_documents(test)))
    assert 0 < se < np.std(diff)  # a mean of hundreds of rows
    # the pairing is the point: unpaired, the two CRPS spreads would add up
    assert se < np.hypot(*(macro_mean_se(c, test["lp"].to_numpy(), row_documents(test)) for c in crps.values()))
    assert paired_crps_se(crps["model"], None, test) is None
    assert paired_crps_se(crps["model"], crps["baseline"][:-1], test) is None  # not the same rows


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
