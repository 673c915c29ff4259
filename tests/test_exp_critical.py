"""Critical-error retrieval (uamt.experiments.critical): retrieval metrics, q_err tuning,
pseudo-references, and the analysis end to end with small deterministic stand-in models."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from uamt.core.errors import DataError
from uamt.experiments import critical
from uamt.experiments.common import is_human_system, pseudo_reference_rows


# ------------------------------------------------------------------------------ retrieval metrics
def test_recall_and_precision_at_n_hand_computed():
    # Flag order by priority: rows 0 (no), 2 (yes), 4 (no), 3 (no), 1 (yes).
    priority = np.array([0.9, 0.1, 0.8, 0.3, 0.5])
    targets = np.array([False, True, True, False, False])
    recall, precision = critical.retrieval_curves(priority, targets, n_max=5)
    np.testing.assert_allclose(recall, [0.0, 0.5, 0.5, 0.5, 1.0])
    np.testing.assert_allclose(precision, [0.0, 1 / 2, 1 / 3, 1 / 4, 2 / 5])
    recall3, precision3 = critical.retrieval_curves(priority, targets, n_max=3)
    np.testing.assert_allclose(recall3, recall[:3])
    np.testing.assert_allclose(precision3, precision[:3])


def test_ties_are_broken_by_row_order():
    recall, _ = critical.retrieval_curves(np.zeros(4), np.array([False, False, False, True]), n_max=4)
    np.testing.assert_allclose(recall, [0, 0, 0, 1])


def test_summary_points_at_multiples_of_the_target_count():
    priority = -np.arange(20, dtype=float)  # flags rows 0, 1, 2, ...
    targets = np.zeros(20, dtype=bool)
    targets[[1, 5]] = True  # |T| = 2
    summary, recall, _ = critical.retrieval_summary(priority, targets, n_max=8)
    assert summary["recall@T"] == 0.5 and summary["precision@T"] == 0.5  # top-2 = rows 0, 1
    assert summary["recall@2T"] == 0.5 and summary["precision@2T"] == 0.25
    assert summary["recall@5T"] == 1.0 and summary["precision@5T"] == 2 / 8  # N = min(10, n_max) = 8
    assert summary["mean_recall"] == pytest.approx(recall.mean())


def test_retrieval_bad_input():
    with pytest.raises(DataError, match="no target segment"):
        critical.retrieval_curves(np.ones(3), np.zeros(3, dtype=bool), 2)
    with pytest.raises(DataError, match="n_max=4 must be in"):
        critical.retrieval_curves(np.ones(3), np.array([True, False, False]), 4)
    with pytest.raises(DataError, match="finite"):
        critical.retrieval_curves(np.array([1.0, np.nan]), np.array([True, False]), 1)


def test_targets_are_the_worst_length_normalised_segments():
    mt = ["a b c d e", "one two", "x", "p q r s"]
    normalised = critical.length_normalised(np.array([-10.0, -2.0, -1.5, 0.0]), mt)
    np.testing.assert_allclose(
        normalised, [-2.0, -1.0, -1.5, 0.0]
    )  # the long segment is not the worst by far
    assert critical.worst_mask(normalised, 50).tolist() == [True, False, True, False]
    assert critical.n_targets(250, 1) == 3  # 2.5 rounds half up
    assert critical.n_targets(10, 1) == 1  # at least one target
    assert critical.worst_mask(np.array([-1.0, -1.0, 0.0]), 40).tolist() == [True, False, False]
    with pytest.raises(DataError, match="must be in \\(0, 100\\)"):
        critical.n_targets(10, 100)


# ------------------------------------------------------------------------------ q_err tuning
def test_threshold_tuning_hand_computed():
    # Row 0 is the critical one: average mu but very uncertain.  A low q_err ranks it first
    # ((-5 - 0) / 3 = -1.67 > -40, -50); a high one ranks it last.
    mu = np.array([0.0, 0.0, -1.0])
    sigma = np.array([3.0, 0.1, 0.1])
    targets = np.array([True, False, False])
    q_err, recall = critical.tune_threshold(mu, sigma, targets, n_max=1, grid=np.array([0.5, -5.0]))
    assert (q_err, recall) == (-5.0, 1.0)
    mu_recall, _ = critical.retrieval_curves(-mu, targets, 1)
    assert mu_recall[0] == 0.0  # ranking by mu flags row 2 first


def test_threshold_tuning_on_synthetic_heteroscedastic_data():
    rng = np.random.default_rng(3)

    def draw(n):
        mu = rng.normal(0.0, 1.0, n)
        sigma = rng.uniform(0.1, 2.0, n)
        quality = mu + sigma * rng.normal(size=n)
        return mu, sigma, critical.worst_mask(quality, 5)

    dev, test = draw(3000), draw(3000)
    q_err, dev_recall = critical.tune_threshold(*dev, n_max=600)
    # The best threshold is in the lower tail (where the critical errors are) ...
    assert q_err < np.quantile(dev[0], 0.25)
    # ... the tuned value is the best of the grid ...
    grid = critical.threshold_grid(dev[0], dev[1])
    best = max(
        critical.retrieval_curves(critical.risk_priority(dev[0], dev[1], q), dev[2], 600)[0].mean()
        for q in grid
    )
    assert dev_recall == pytest.approx(best)
    # ... and on fresh data the risk ranking retrieves more critical errors than mu alone.
    risk_recall = critical.retrieval_curves(critical.risk_priority(test[0], test[1], q_err), test[2], 600)[0]
    mu_recall = critical.retrieval_curves(-test[0], test[2], 600)[0]
    assert risk_recall.mean() > mu_recall.mean() + 0.02


def test_risk_priority_orders_like_the_risk():
    from uamt.uncertainty import translation_risk

    mu = np.array([-3.0, 0.0, 1.0, -1.0])
    sigma = np.array([1.0, 2.0, 0.5, 0.2])
    risk = translation_risk(mu, sigma, -1.5)
    assert np.argsort(-risk).tolist() == np.argsort(-critical.risk_priority(mu, sigma, -1.5)).tolist()


def test_per_word_scale_is_the_risk_of_the_length_normalised_quality():
    from scipy.stats import norm

    mu, sigma, words = np.array([-4.0, -3.0]), np.array([2.0, 1.0]), np.array([4.0, 1.0])
    mu_w, sigma_w = critical._on_scale(mu, sigma, words, "per_word")
    np.testing.assert_allclose(mu_w, [-1.0, -3.0])
    np.testing.assert_allclose(sigma_w, [0.5, 1.0])
    # P(Q / w <= q) = P(Q <= q w) for the Gaussian Q ~ N(mu, sigma^2).
    q = -1.5
    np.testing.assert_allclose(
        norm.cdf(critical.risk_priority(mu_w, sigma_w, q)), norm.cdf((q * words - mu) / sigma)
    )
    assert critical._on_scale(mu, sigma, words, "raw") == (mu, sigma)


# ------------------------------------------------------------------------------ pseudo-references
def _frame():
    rows = []
    for seg in (1, 2):
        for system in ("A", "B", "C", "ref-A"):
            rows.append(
                {
                    "dataset": "wmt21_mqm",
                    "lp": "en-de",
                    "seg_id": seg,
                    "system": system,
                    "src": f"source {seg}",
                    "mt": f"{system} output {seg}",
                }
            )
    rows.append(
        {"dataset": "wmt21_mqm", "lp": "zh-en", "seg_id": 1, "system": "A", "src": "other", "mt": "lonely"}
    )
    return pd.DataFrame(rows)


def test_pseudo_references_are_other_systems_for_the_same_source():
    frame = _frame()
    pseudo = pseudo_reference_rows(frame)
    for i, positions in enumerate(pseudo):
        assert i not in positions  # never its own output
        assert all(frame.system[j] != frame.system[i] for j in positions)
        assert all(not is_human_system(frame.system[j]) for j in positions)
        assert all(frame.seg_id[j] == frame.seg_id[i] and frame.lp[j] == frame.lp[i] for j in positions)
    assert [frame.mt[j] for j in pseudo[0]] == ["B output 1", "C output 1"]
    assert [frame.mt[j] for j in pseudo[3]] == [
        "A output 1",
        "B output 1",
        "C output 1",
    ]  # ref-A's pseudo-refs
    assert len(pseudo[8]) == 0  # the only system of its source
    capped = pseudo_reference_rows(frame, max_refs=1, seed=5)
    assert [len(p) for p in capped[:8]] == [1] * 8
    assert [p.tolist() for p in capped] == [
        p.tolist() for p in pseudo_reference_rows(frame, max_refs=1, seed=5)
    ]
    assert all(set(c) <= set(p) for c, p in zip(capped, pseudo, strict=True))


def test_pseudo_references_bad_input():
    frame = _frame()
    frame.loc[1, "src"] = "a different sentence"
    with pytest.raises(DataError, match="different sources"):
        pseudo_reference_rows(frame)
    with pytest.raises(DataError, match="max_refs=0"):
        pseudo_reference_rows(_frame(), max_refs=0)
    with pytest.raises(DataError, match="columns \\['system'\\]"):
        pseudo_reference_rows(_frame().drop(columns="system"))


def test_human_systems():
    assert all(map(is_human_system, ["ref-A", "ref-D", "refB", "ref", "HUMAN", "HUMAN-refB"]))
    assert not any(map(is_human_system, ["Online-W", "Facebook-AI", "refinery", "VolcTrans-AT"]))


# ------------------------------------------------------------------------------ end to end
class StandIn:
    """A deterministic 'model': mu falls with the words 'bad' in mt and rises with words shared with
    the reference; sigma grows with the words 'odd' (a noisy-segment marker)."""

    def __init__(self, with_sigma: bool):
        self.with_sigma = with_sigma
        self.calls = []

    def predict(self, df, features):
        self.calls.append(df.copy())
        mt_words = [set(m.split()) for m in df["mt"]]
        shared = np.array(
            [len(w & set(r.split())) for w, r in zip(mt_words, df["ref"], strict=True)], dtype=float
        )
        bad = np.array([m.split().count("bad") for m in df["mt"]], dtype=float)
        odd = np.array([m.split().count("odd") for m in df["mt"]], dtype=float)
        sigma = 0.5 + 2.0 * odd if self.with_sigma else np.full(len(df), np.nan)
        return pd.DataFrame({"mu": -bad + 0.1 * shared, "sigma": sigma})


def _mqm_split(seed, n_sources=40):
    rng = np.random.default_rng(seed)
    rows = []
    for lp in ("en-de", "zh-en"):
        for seg in range(n_sources):
            for k, system in enumerate(["S1", "S2", "S3", "S4", "S5", "ref-A"]):
                n_bad, n_odd = int(rng.integers(0, 3)), int(rng.random() < 0.15)
                words = ["w"] * int(rng.integers(3, 9)) + ["bad"] * n_bad + ["odd"] * n_odd
                penalty = n_bad + 4.0 * n_odd * rng.random()
                rows.append(
                    {
                        "dataset": "wmt21_mqm",
                        "lp": lp,
                        "seg_id": seg + 1000 * seed,
                        "system": system,
                        "src": f"{lp} source {seg} {seed}",
                        "mt": " ".join(words + [f"s{k}"]),
                        "ref": f"reference {seg} w",
                        "score": -penalty if system != "ref-A" else 0.0,
                    }
                )
    return pd.DataFrame(rows)


def test_analysis_end_to_end_with_stand_in_models(tmp_path):
    dev, test = _mqm_split(1), _mqm_split(2)
    models = {"point": StandIn(False), "hts": StandIn(True)}
    result = critical.analyse(
        dev,
        test,
        models,
        features=None,
        uncertainty_methods=("hts",),
        target_percents=(2, 10),
        max_n_fraction=0.5,
    )
    assert result["settings"]["rankings"] == ["q_hat:point", "mu:hts", "risk:hts"]
    # Every scored pair is (row, another system's output), never a human system's.
    pseudo_calls = models["hts"].calls[0]
    assert (pseudo_calls["ref"] != pseudo_calls["mt"]).all()
    assert len(pseudo_calls) == 2 * 40 * 5 * 4  # dev: 2 LPs x 40 sources x 5 MT systems x 4 others
    assert result["sizes"]["lps"]["en-de"]["test"]["rows"] == 200
    assert result["sizes"]["lps"]["en-de"]["test"]["targets"] == {"2%": 4, "10%": 20}
    assert list(result["results"]) == ["pseudo/raw", "pseudo/per_word", "reference/raw", "reference/per_word"]
    for setting in result["results"]:
        for lp in ("en-de", "zh-en"):
            for percent in ("2%", "10%"):
                block = result["results"][setting][lp][percent]
                for summary in block.values():
                    assert 0 <= summary["recall@T"] <= 1 and 0 <= summary["mean_precision"] <= 1
                assert "q_err" in block["risk:hts"] and "q_err" not in block["mu:hts"]
                assert len(result["curves"][setting][lp][percent]["n"]) <= 40
    assert result["calibration"]["pseudo"]["hts"].startswith("fitted here on dev")
    assert result["random"]["en-de"]["2%"] == {"mean_recall": 101 / 400, "precision@T": 4 / 200}
    # The stand-in's sigma marks the high-variance penalties, so the risk ranking finds them.
    findings = result["findings"]["pseudo/raw"]["hts"]["vs mu:hts mean_recall"]
    assert findings["cells"] == 4 and findings["mean_difference"] > 0
    json.dumps(result, allow_nan=True)
    text = critical.render(result)
    assert text.startswith("## 5. Critical-error retrieval")
    assert "figures/critical_recall.png" in text and "risk:hts" in text
    from uamt.experiments.common import save_figure

    for quantity in ("recall", "precision"):
        assert save_figure(critical.figure(result, quantity), tmp_path / f"{quantity}.png").stat().st_size > 0


def test_analysis_refuses_missing_models_and_lps():
    dev, test = _mqm_split(1, 5), _mqm_split(2, 5)
    with pytest.raises(DataError, match="method='mcd_head' not supported"):
        critical.analyse(dev, test, {"point": StandIn(False), "hts": StandIn(True)}, None)
    with pytest.raises(DataError, match="no dev rows"):
        critical.analyse(
            dev[dev.lp == "en-de"],
            test,
            {"point": StandIn(False), "hts": StandIn(True)},
            None,
            uncertainty_methods=("hts",),
        )


def test_stage_config_refuses_a_dataset_the_models_were_not_trained_on(tmp_path):
    from pathlib import Path

    import yaml

    from uamt.core.config import ConfigError, read_params
    from uamt.stages import exp_critical

    params = read_params(Path(__file__).resolve().parents[1] / "params.yaml")
    params["exp_critical"]["dataset"] = "mlqe"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match="dataset='mlqe' is not in pipeline.datasets"):
        exp_critical.load_config(path)


def test_report_findings_majority_rule_on_pseudo_reference_cells():
    from uamt.experiments.report import verdict_of

    def entry(method: str, mu_at_least: int, q_at_least: int, cells: int = 4) -> dict:
        def cmp(at_least):
            return {"at_least": at_least, "better": at_least - 1, "cells": cells, "mean_difference": 0.01}

        return {
            f"vs mu:{method} mean_recall": cmp(mu_at_least),
            f"vs mu:{method} precision@T": cmp(2),
            "vs q_hat:point mean_recall": cmp(q_at_least),
            "vs q_hat:point precision@T": cmp(2),
        }

    result = {
        "settings": {"point_method": "point", "target_percents": [1, 2]},
        "sizes": {"lps": {"zh-en": {}, "en-de": {}}},
        "findings": {
            # strict majority (3 of 4) everywhere -> held
            "pseudo/raw": {"hts": entry("hts", 3, 4), "mcd_head": entry("mcd_head", 4, 3)},
            # 2 of 4 is no majority: hts fails vs mu -> partly
            "pseudo/per_word": {"hts": entry("hts", 2, 3), "mcd_head": entry("mcd_head", 3, 3)},
            # the human-reference setting is not the paper's: no row
            "reference/raw": {"hts": entry("hts", 0, 0)},
        },
    }
    rows = critical.report_findings(result)
    assert len(rows) == 2
    assert "ranked by predicted MQM)" in rows[0][0] and "ranked by predicted MQM per word" in rows[1][0]
    assert [verdict_of(r[2]) for r in rows] == ["held", "partly"]
    assert "(en-de, zh-en; worst 1/2 %)" in rows[0][2]
    assert "hts: >= mu in 3/4 (strictly more in 2, mean +0.010; P@|T| >= mu in 2/4)" in rows[0][2]
    result["findings"]["pseudo/raw"] = {"hts": entry("hts", 1, 2), "mcd_head": entry("mcd_head", 2, 0)}
    assert verdict_of(critical.report_findings(result)[0][2]) == "not held"
    result["findings"]["pseudo/raw"] = {"hts": entry("hts", 0, 0, cells=0)}
    assert verdict_of(critical.report_findings(result)[0][2]) == "n/a"
