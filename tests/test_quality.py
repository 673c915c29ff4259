"""The quality numbers of benchmarks/quality.py (uamt.quality): AUROC, worst-2 % recall, goals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from uamt.core.errors import DataError
from uamt.quality import (
    QualityGoals,
    auroc_score,
    goal_checks,
    join_texts,
    quality_table,
    read_model,
    worst_recall_score,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_matches_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 5, 200).astype(float)  # many ties
    event = rng.random(200) < 0.3
    assert auroc_score(scores, event) == pytest.approx(roc_auc_score(event, scores))


def test_auroc_of_one_class_is_nan():
    assert np.isnan(auroc_score(np.arange(4.0), np.zeros(4, bool)))


@pytest.mark.parametrize(
    ("predicted", "human", "expected"),
    [
        # n = 10, 2 % -> k = 1: the worst human row is row 0; predicted lowest is row 0 / row 1.
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [-9, 0, 0, 0, 0, 0, 0, 0, 0, 0], 1.0),
        ([1, 0, 2, 3, 4, 5, 6, 7, 8, 9], [-9, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.0),
        # ties at the cut: rows 0 and 1 are both worst; one flagged -> 1/2.
        ([0, 5, 2, 3, 4, 5, 6, 7, 8, 9], [-9, -9, 0, 0, 0, 0, 0, 0, 0, 0], 0.5),
    ],
)
def test_worst_recall_hand_computed(predicted, human, expected):
    assert worst_recall_score(np.array(predicted, float), np.array(human, float), 0.02) == expected


def test_worst_recall_refuses_bad_fraction():
    with pytest.raises(ValueError, match="fraction=1.5"):
        worst_recall_score(np.zeros(3), np.zeros(3), 1.5)


class GaussianServed:
    """A served distribution N(mu, sigma^2) with no calibration (what the protocol offers)."""

    fixed = False
    is_gaussian = True

    def center(self, mu, sigma, lp=None, n_refs=None):
        return np.asarray(mu, float)

    def interval(self, mu, sigma, gamma, lp=None, mode="gaussian", n_refs=None):
        half = norm.ppf(0.5 + gamma / 2) * np.asarray(sigma, float)
        return mu - half, mu + half

    def risk(self, mu, sigma, threshold, lp=None, n_refs=None):
        return norm.cdf((threshold - np.asarray(mu, float)) / np.asarray(sigma, float))


def _table(n=400, seed=0):
    rng = np.random.default_rng(seed)
    human = -np.abs(rng.normal(0, 5, n))
    mu = human + rng.normal(0, 2, n)
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran"]
    ref = [" ".join(rng.choice(words, 6)) for _ in range(n)]
    return pd.DataFrame(
        {
            "dataset": ["wmt21_mqm"] * n,
            "lp": np.where(np.arange(n) % 2, "en-de", "zh-en"),
            "seg_id": np.arange(n),
            "system": "s",
            "human": human,
            "mu": mu,
            "sigma": np.full(n, 2.0),
            "mt": ref,
            "ref": ref,
        }
    )


def test_quality_table_per_lp_and_pooled():
    table = _table()
    out = quality_table(table, GaussianServed(), bounds=(-25.0, 0.0))
    assert list(zip(out["dataset"], out["lp"], strict=True)) == [("wmt21_mqm", "en-de"), ("wmt21_mqm", "zh-en"), ("all", "all")]
    assert out["n"].tolist() == [200, 200, 400]
    # mu = human + N(0, 2): strong correlation; the risk ranks like -mu (same sigma everywhere).
    assert (out["pps"] > 0.7).all()
    assert np.allclose(out["auroc_risk"], out["auroc_mu"])
    # Identical mt and ref: chrF is constant 100, its correlation undefined.
    assert out["chrf_r"].isna().all()
    # Clipped to the scale's top (0): the width of each interval is at most 2 x 1.645 x 2.
    assert (out["width"] <= 2 * 1.6449 * 2 + 1e-6).all()
    assert ((out["coverage"] > 0.8) & (out["coverage"] <= 1.0)).all()


def test_goal_checks_news_row_and_pooled_row():
    goals = QualityGoals()
    row = {"dataset": "wmt21_mqm", "lp": "en-de", "pps": 0.40, "chrf_r": 0.10, "auroc_risk": 0.79, "recall_worst": 0.30}
    assert goal_checks(row, goals) == {"pps_vs_chrf": True, "auroc_risk": False, "recall_worst": True, "pps_floor": True}
    pooled = {"dataset": "all", "lp": "all", "width": 11.0, "coverage": 0.88}
    assert goal_checks(pooled, goals) == {"width": True}
    assert goal_checks({**pooled, "coverage": 0.85}, goals) == {"width": False}


def test_join_texts_names_the_missing_row():
    predictions = _table(4).drop(columns=["mt", "ref"])
    prepared = _table(4).iloc[:3]
    with pytest.raises(DataError, match=r"predictions/test/hts: 1 prediction row\(s\) have no prepared test row"):
        join_texts(predictions, prepared, "predictions/test/hts")


def _calibration():
    from uamt.serving.model_calibration import Calibration
    from uamt.uncertainty import AffineVarianceCalibrator, FixedVarianceCalibrator, Standardizer

    standardizer, affine, fixed = Standardizer(), AffineVarianceCalibrator(), FixedVarianceCalibrator()
    standardizer.global_params = {"human_mean": -2.0, "human_std": 2.0, "pred_mean": 0.0, "pred_std": 1.0}
    affine.global_params = {"alpha": 1.0, "beta": 0.0, "var_floor": 1e-6}
    fixed.global_params = {"var": 1.0}
    return Calibration(standardizer, affine, fixed, None)


def test_read_model_reads_a_baseline_as_the_point_predictions_and_its_baseline_calibration(tmp_path):
    (tmp_path / "predictions" / "test").mkdir(parents=True)
    point = pd.DataFrame({"mu": [0.1, -0.3], "sigma": [np.nan, np.nan], "lp": ["en-de", "en-de"]})
    point.to_parquet(tmp_path / "predictions" / "test" / "point.parquet")
    (tmp_path / "calibration" / "baselines").mkdir(parents=True)
    name = "point+signed_mondrian_conformal"
    with pytest.raises(DataError, match=r"baselines/point\+signed_mondrian_conformal\.json: no calibration"):
        read_model(tmp_path / "predictions", tmp_path / "calibration", name)
    _calibration().save(tmp_path / "calibration" / "baselines" / f"{name}.json")
    table, _ = read_model(tmp_path / "predictions", tmp_path / "calibration", name)
    assert table["mu"].tolist() == [0.1, -0.3]
    assert table["sigma"].tolist() == [1.0, 1.0]  # the point estimate's placeholder sigma
    with pytest.raises(DataError, match="no test predictions for model 'hts'"):
        read_model(tmp_path / "predictions", tmp_path / "calibration", "hts")
