"""``uamt predict --calibrate-on dev``: the distribution the calibrate stage serves, fitted on dev and
applied to the predicted split.

Synthetic fixture of tests/test_models.py (fixed per-text "embeddings", a score that depends on them);
the CLI's features are the fixture's instead of an encoder cache.  The fixed-variance calibration of the
point model is checked against values computed here by hand from the dev predictions; with the
project's served settings (σ's weight, the point mass at the top of the MQM scale, the rearrangement
in μ) the file and the columns are the calibrate stage's served distribution.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.stats import norm

from tests.test_models import CFG, FEATURES, make_table
from uamt.cli import main
from uamt.models import load, train
from uamt.serving.model_calibration import Calibration
from uamt.uncertainty import ConformalCalibrator

DEV_LPS = ("en-de", "zh-en")
MIN_LP_ROWS = 50


def with_lps(frame: pd.DataFrame, lps) -> pd.DataFrame:
    return frame.assign(lp=[lps[i % len(lps)] for i in range(len(frame))])


#: Tiny models: one intra-op thread is fastest; two thrash on a loaded 2-core machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("cli-predict")
    prepared = root / "prepared"
    prepared.mkdir()
    splits = {
        "d_q": make_table(200, 11),
        "dev": with_lps(make_table(120, 12), DEV_LPS),  # 60 rows per LP: per-LP fits
        "test": with_lps(make_table(30, 13), (*DEV_LPS, "de-en")),  # de-en: global fallback
    }
    for name, frame in splits.items():
        frame.to_parquet(prepared / f"{name}.parquet", index=False)
    params = root / "params.yaml"
    params.write_text(
        yaml.safe_dump({"evaluate": {"per_lp": True, "min_lp_rows": MIN_LP_ROWS}}), encoding="utf-8"
    )
    cfg = CFG.replace(max_epochs=2, mc_samples=10)
    models = {
        method: train(method, cfg, splits["d_q"], splits["dev"], FEATURES, root / method)
        for method in ("point", "hts")
    }
    return {"root": root, "prepared": prepared, "params": params, "splits": splits, "models": models}


@pytest.fixture(autouse=True)
def fixture_features(monkeypatch, workspace):
    """The CLI reads the prepared folder of the workspace and embeds with the synthetic features."""
    encode = types.SimpleNamespace(prepared_dir=str(workspace["prepared"]))
    monkeypatch.setattr("uamt.cli.models._features", lambda params: (encode, FEATURES))


def predict(workspace, method: str, out: Path, *extra: str) -> int:
    argv = ["predict", "--model", str(workspace["models"][method]), "--split", "test"]
    return main([*argv, "--params", str(workspace["params"]), "--out", str(out), *extra])


def test_point_model_gets_the_dev_fixed_variance(workspace, tmp_path, capsys):
    out = tmp_path / "point.parquet"
    assert predict(workspace, "point", out, "--calibrate-on", "dev") == 0
    assert "calibrated on dev (120 rows)" in capsys.readouterr().out
    table = pd.read_parquet(out)
    model = load(workspace["models"]["point"])
    dev = model.predictions_table(workspace["splits"]["dev"], FEATURES)
    raw = model.predictions_table(workspace["splits"]["test"], FEATURES)
    pd.testing.assert_frame_equal(table[raw.columns], raw)  # raw columns as plain `uamt predict`
    assert table["sigma"].isna().all()

    def standardise(rows: pd.DataFrame):
        """(m_h, s_h, m_p, s_p) of dev rows and their residuals h_z - mu_z."""
        human, mu = rows["human"].to_numpy(), rows["mu"].to_numpy()
        m_h, s_h = human.mean(), human.std()
        # the point model has no sigma: mu is standardised by its own dev spread
        m_p, s_p = mu.mean(), mu.std()
        return (m_h, s_h, m_p, s_p), (human - m_h) / s_h - (mu - m_p) / s_p

    per_lp = {lp: standardise(dev[dev["lp"] == lp]) for lp in DEV_LPS}
    for lp in (*DEV_LPS, "de-en"):
        if lp in DEV_LPS:
            (m_h, s_h, m_p, s_p), residuals = per_lp[lp]
        else:  # global fallback: global standardisation; the variance of the pooled per-LP residuals
            (m_h, s_h, m_p, s_p), _ = standardise(dev)
            residuals = np.concatenate([r for _, r in per_lp.values()])
        rows = table[table["lp"] == lp]
        assert len(rows) == 10
        mu_cal = m_h + s_h * (rows["mu"] - m_p) / s_p
        sigma_cal = s_h * np.sqrt(np.mean(residuals**2))
        np.testing.assert_allclose(rows["mu_calibrated"], mu_cal, rtol=1e-9)
        np.testing.assert_allclose(rows["sigma_calibrated"], sigma_cal, rtol=1e-9)
        half = norm.ppf(0.95) * sigma_cal
        np.testing.assert_allclose(rows["lower"], mu_cal - half, rtol=1e-9)
        np.testing.assert_allclose(rows["upper"], mu_cal + half, rtol=1e-9)

    saved = Calibration.load(out.with_name("point.parquet.calibration.json"))
    assert saved.fixed and set(saved.standardizer.lp_params) == set(DEV_LPS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["point.parquet", "point.parquet.calibration.json"]


def test_hts_model_gets_the_affine_calibration_of_the_calibrate_stage(workspace, tmp_path):
    from uamt.serving.model_calibration import (
        fit_calibration,
        fit_model_unseen_lp_sigma_factor,
        with_model_sigma,
        with_unseen_factor,
    )
    from uamt.uncertainty import EvaluationSettings

    out = tmp_path / "hts.csv"
    assert predict(workspace, "hts", out, "--calibrate-on", "dev", "--confidence", "0.8") == 0
    table = pd.read_csv(out)
    model = load(workspace["models"]["hts"])
    dev = with_model_sigma(model.predictions_table(workspace["splits"]["dev"], FEATURES), "hts")
    settings = EvaluationSettings(per_lp=True, min_lp_rows=MIN_LP_ROWS)
    expected = fit_calibration(dev, "hts", settings=settings)[0]  # the one fit: global fallback in its own units
    # ... plus the unseen-LP widening, fitted with the calibration held out (nothing else is served
    # under these settings: one σ weight, no point mass, no rearrangement)
    factor, _ = fit_model_unseen_lp_sigma_factor(dev, "hts", expected, settings=settings)
    expected = with_unseen_factor(expected, factor)
    saved = json.loads(out.with_name("hts.csv.calibration.json").read_text())
    assert saved == json.loads(json.dumps(expected.to_dict()))
    assert not saved["fixed"]
    assert saved["selected"] == expected.selected
    # HTS predicts its sigma: mu is standardised by its own dev spread, not shrunk by sigma
    dev_lp = dev[dev["lp"] == DEV_LPS[0]]
    assert expected.standardizer.lp_params[DEV_LPS[0]]["pred_std"] == pytest.approx(dev_lp["mu"].std(ddof=0))
    # per row, with the LP's fitted parameters of the served candidate: a variance calibration gives
    # sigma_cal^2 = s_h^2 (alpha (sigma / s_p)^2 + beta); a conformal one its served distribution's sd
    served = expected.served or expected.affine
    for lp in DEV_LPS:
        rows = table[table["lp"] == lp]
        std = expected.standardizer.lp_params[lp]
        params = served.lp_params.get(lp, served.global_params)
        sigma_z = rows["sigma"] / std["pred_std"]
        if isinstance(served, ConformalCalibrator):  # also the Mondrian kind: thresholds per mu bin
            want = expected.served_sd(rows["mu"].to_numpy(), rows["sigma"].to_numpy(), np.full(len(rows), lp, dtype=object))
        else:
            var_z = params["alpha"] * sigma_z**2 + params["beta"]
            want = std["human_std"] * np.sqrt(np.maximum(var_z, params["var_floor"]))
        np.testing.assert_allclose(rows["sigma_calibrated"], want, rtol=1e-6)
    low, high = expected.interval(table["mu"], table["sigma"], 0.8, lp=table["lp"].to_numpy(dtype=object))
    np.testing.assert_allclose(table["lower"], low, rtol=1e-6)
    np.testing.assert_allclose(table["upper"], high, rtol=1e-6)
    if not isinstance(served, ConformalCalibrator):
        half = norm.ppf(0.9) * table["sigma_calibrated"]
        np.testing.assert_allclose(table["upper"] - table["mu_calibrated"], half, rtol=1e-6)
    assert (table["sigma_calibrated"] > 0).all()


def as_mqm(frame: pd.DataFrame) -> pd.DataFrame:
    """The fixture's rows on the MQM scale: 0 (no error) for the best third, negative below, within
    [-25, 0], so that the served point mass at the top of the scale has rows to fit."""
    score = frame["score"].to_numpy(dtype=float)
    mqm = np.clip(-4.0 * (np.quantile(score, 0.67) - score), -25.0, 0.0)
    return frame.assign(score=np.round(mqm, 1))


def test_served_settings_give_the_calibrate_stages_distribution(workspace, tmp_path):
    """With the project's served settings the calibration is the calibrate stage's
    (:func:`fit_served_distribution`: σ's weight chosen, the point mass at the top, the grid in μ, the
    unseen-LP widening), and every column is its answer, clipped to the scale as ``uamt score`` clips."""
    from uamt.model_evaluation import fit_served_distribution
    from uamt.serving.calibrated_predictor import clip_to_scale
    from uamt.serving.model_calibration import fit_model_unseen_lp_sigma_factor, with_unseen_factor
    from uamt.uncertainty import EvaluationSettings

    as_mqm(workspace["splits"]["dev"]).to_parquet(workspace["prepared"] / "dev_mqm.parquet", index=False)
    evaluate = {
        "per_lp": True, "min_lp_rows": MIN_LP_ROWS, "top_atom": True, "sigma_weights": [0.0, 1.0],
        "rearrange_in_mu": True, "cross_fit_folds": 2,
    }
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"pipeline": {"datasets": ["wmt21_mqm"]}, "evaluate": evaluate}), encoding="utf-8")
    out = tmp_path / "hts.parquet"
    argv = ["predict", "--model", str(workspace["models"]["hts"]), "--split", "test", "--params", str(params)]
    assert main([*argv, "--out", str(out), "--calibrate-on", "dev_mqm"]) == 0
    saved = Calibration.load(out.with_name("hts.parquet.calibration.json"))
    # what the old `--calibrate-on` left out: the served distribution on top of the fit
    assert saved.top_atom is not None and saved.sigma_tempering is not None
    assert saved.sigma_tempering.weight in (0.0, 1.0)
    assert set(saved.rearrangement_mu) == (set(DEV_LPS) if saved.sigma_tempering.weight == 0.0 else set())
    assert saved.unseen_lp_sigma_factor >= 1.0
    # the calibrate stage's function on the same rows gives the same file
    model = load(workspace["models"]["hts"])
    dev = model.predictions_table(as_mqm(workspace["splits"]["dev"]), FEATURES)
    settings = EvaluationSettings(**{**evaluate, "sigma_weights": (0.0, 1.0)})
    stage, _ = fit_served_distribution(dev, "hts", settings, (-25.0, 0.0), splits=("dev_mqm",))
    factor, _ = fit_model_unseen_lp_sigma_factor(dev, "hts", stage, settings=settings, bounds=(-25.0, 0.0))
    assert saved.to_dict() == json.loads(json.dumps(with_unseen_factor(stage, factor).to_dict()))
    # every column is that distribution's answer at the scale's default threshold (-5), clipped
    table = pd.read_parquet(out)
    raw = (table["mu"].to_numpy(), table["sigma"].to_numpy())
    lp = table["lp"].to_numpy(dtype=object)
    lower, upper = saved.interval(*raw, 0.9, lp=lp)
    mu_served, sd_served = saved.apply(*raw, lp=lp)
    answers = pd.DataFrame({
        "mu": mu_served, "sigma": sd_served, "lower": lower, "upper": upper, "risk": saved.risk(*raw, -5.0, lp=lp),
    })
    want = clip_to_scale(answers, (-25.0, 0.0), -5.0)
    for column, served in (("mu_calibrated", "mu"), ("sigma_calibrated", "sigma"), ("lower", "lower"),
                           ("upper", "upper"), ("risk", "risk"), ("clipped", "clipped")):
        np.testing.assert_allclose(table[column].to_numpy(dtype=float), want[served].to_numpy(dtype=float), rtol=1e-9)
    assert (table["upper"] <= 0.0).all() and (table["lower"] >= -25.0).all()
    assert ((table["risk"] >= 0.0) & (table["risk"] <= 1.0)).all()


def test_refuses_a_risk_threshold_that_is_not_a_number(workspace, tmp_path, capsys):
    out = tmp_path / "p.parquet"
    assert predict(workspace, "hts", out, "--calibrate-on", "dev", "--risk-threshold", "nan") == 2
    assert "--risk-threshold must be a finite number, got nan" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_without_calibrate_on_the_output_is_raw(workspace, tmp_path):
    out = tmp_path / "raw.parquet"
    assert predict(workspace, "hts", out) == 0
    assert not {"mu_calibrated", "sigma_calibrated", "lower", "upper", "risk"} & set(pd.read_parquet(out).columns)
    assert not out.with_name("raw.parquet.calibration.json").exists()


def test_refuses_to_calibrate_on_test(workspace, tmp_path, capsys):
    out = tmp_path / "p.parquet"
    assert predict(workspace, "hts", out, "--calibrate-on", "test") == 2
    assert "calibration is fitted on dev, never on test" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("confidence", ["0", "1", "1.5"])
def test_refuses_confidence_outside_0_1(workspace, tmp_path, capsys, confidence):
    out = tmp_path / "p.parquet"
    assert predict(workspace, "hts", out, "--calibrate-on", "dev", "--confidence", confidence) == 2
    assert f"--confidence must be in (0, 1), got {float(confidence)}" in capsys.readouterr().err


def test_missing_calibration_split(workspace, tmp_path, capsys):
    out = tmp_path / "p.parquet"
    assert predict(workspace, "hts", out, "--calibrate-on", "dev2") == 2
    assert "split 'dev2' not found" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
