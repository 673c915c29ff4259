"""evaluate_predictions / metrics_table and the ``uamt evaluate-predictions`` command."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from uamt.cli import main
from uamt.core.errors import DataError
from uamt.uncertainty import (
    EvaluationSettings,
    evaluate_prediction_files,
    evaluate_predictions,
    metrics_table,
    read_predictions,
)


def synthetic_table(rng, n, lps=("en-de", "zh-en"), sigma_scale=0.4, samples=False):
    """Predictions on a 0-100 human scale whose model sigma is too narrow by ``sigma_scale``."""
    mu = rng.normal(size=n)
    sigma = rng.uniform(0.2, 1.0, size=n)
    human = 70 + 10 * rng.normal(mu, sigma)
    lp = rng.choice(lps, size=n)
    if samples:
        draws = mu[:, None] + sigma_scale * sigma[:, None] * rng.standard_normal((n, 30))
        return pd.DataFrame(
            {"lp": lp, "human": human, "samples": ["|".join(f"{v:.6f}" for v in row) for row in draws]}
        )
    return pd.DataFrame({"lp": lp, "human": human, "mu": mu, "sigma": sigma_scale * sigma})


@pytest.fixture()
def files(tmp_path):
    rng = np.random.default_rng(0)
    dev = tmp_path / "dev.csv"
    pred = tmp_path / "pred.csv"
    synthetic_table(rng, 1200).to_csv(dev, index=False)
    synthetic_table(rng, 800, lps=("en-de", "zh-en", "en-ru")).to_csv(pred, index=False)
    return dev, pred


def test_evaluate_with_dev_detects_and_fixes_a_narrow_sigma(files):
    dev, pred = files
    result = evaluate_predictions(pd.read_csv(pred), pd.read_csv(dev))
    methods = result["methods"]
    assert set(methods) == {"model", "model_uncalibrated", "fixed_variance"}
    model, raw, fixed = (methods[m]["macro_avg"] for m in ("model", "model_uncalibrated", "fixed_variance"))
    assert raw["ece"] > 0.15 and model["ece"] < 0.04  # too-narrow sigma detected, then fixed
    assert model["pps"] == pytest.approx(raw["pps"])  # calibration leaves the means alone
    assert fixed["ups"] is None  # constant sigma per LP: UPS undefined
    assert set(methods["model"]["per_lp"]) == {"en-de", "zh-en", "en-ru"}
    applied = result["calibration"]["applied"]["affine_variance"]
    assert applied["en-ru"]["fallback_to_global"] is True and applied["en-de"]["fallback_to_global"] is False
    intervals = pd.DataFrame(result["intervals"])
    conformal_all = intervals[(intervals.lp == "all") & (intervals.method == "conformal")]
    assert np.all(np.abs(conformal_all.coverage - conformal_all.gamma) < 0.05)
    json.dumps(result, allow_nan=False)  # strict JSON


def test_global_calibration_setting(files):
    dev, pred = files
    result = evaluate_predictions(
        pd.read_csv(pred), pd.read_csv(dev), settings=EvaluationSettings(per_lp=False)
    )
    assert result["calibration"]["affine_variance"]["lps"] == {}


def test_evaluate_without_dev_uses_raw_scores_and_flags_in_sample_baseline(files):
    _, pred = files
    result = evaluate_predictions(pd.read_csv(pred))
    assert result["settings"]["baseline_fitted_on"].startswith("predictions")
    assert "model_uncalibrated" not in result["methods"]
    assert result["methods"]["model"]["pooled"]["ece"] > 0.15


def test_samples_layout_matches_mu_sigma_layout(tmp_path):
    rng = np.random.default_rng(1)
    table = synthetic_table(rng, 300, samples=True)
    arrays = read_predictions(_write(tmp_path / "s.csv", table))
    draws = np.array([[float(v) for v in row.split("|")] for row in table["samples"]])
    np.testing.assert_allclose(arrays.mu, draws.mean(axis=1))
    np.testing.assert_allclose(arrays.sigma, draws.std(axis=1))  # ddof = 0
    assert arrays.layout == "samples"


def test_metrics_table_rows(files):
    dev, pred = files
    table = metrics_table(evaluate_predictions(pd.read_csv(pred), pd.read_csv(dev)))
    assert len(table) == 3 * (3 + 2)  # methods x (3 LPs + macro_avg + pooled)
    assert {"method", "lp", "pps", "ups", "nll", "ece", "sharpness", "coverage@0.9", "crps"} <= set(
        table.columns
    )


def test_cli_writes_metrics(files, tmp_path, capsys):
    dev, pred = files
    out = tmp_path / "m.json"
    assert (
        main(["evaluate-predictions", "--predictions", str(pred), "--dev", str(dev), "--out", str(out)]) == 0
    )
    written = json.loads(out.read_text())
    assert written["methods"]["model"]["macro_avg"]["ece"] < 0.04
    assert "calibration" in written and written["dev"]["n"] == 1200
    assert "wrote" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".m.json")] == []  # no temp left


def _write(path, table):
    table.to_csv(path, index=False)
    return path


GOOD = pd.DataFrame(
    {"lp": ["en-de"] * 3, "human": [1.0, 2.0, 3.0], "mu": [1.1, 2.2, 2.7], "sigma": [0.5, 0.4, 0.3]}
)


@pytest.mark.parametrize(
    ("table", "match"),
    [
        (GOOD.drop(columns=["sigma"]), r"missing column\(s\) \['sigma'\]"),
        (GOOD.drop(columns=["lp"]), r"missing column\(s\) \['lp'\]"),
        (GOOD.rename(columns={"mu": "m", "sigma": "s"}), "unknown column layout"),
        (GOOD.assign(mu=["1", "nan", "2"]), r"row 2 \(line 3\), column 'mu': 'nan' is not finite"),
        (GOOD.assign(sigma=["0.1", "0.2", "inf"]), r"row 3 \(line 4\), column 'sigma': 'inf' is not finite"),
        (GOOD.assign(human=["1", "abc", "2"]), r"row 2 \(line 3\), column 'human': 'abc' is not a number"),
        (GOOD.assign(human=["1", "", "2"]), r"row 2 \(line 3\), column 'human': empty value"),
        (GOOD.assign(sigma=["0.1", "-0.2", "0.3"]), r"row 2 \(line 3\), column 'sigma'.*negative"),
        (GOOD.assign(lp=["en-de", "", "en-de"]), r"row 2 \(line 3\), column 'lp'"),
        (GOOD.iloc[:0], "no data rows"),
        (
            pd.DataFrame({"lp": ["a-b"], "human": [1.0], "samples": ["0.1|x"]}),
            r"row 1 \(line 2\), column 'samples': sample 2 'x' is not a number",
        ),
        (pd.DataFrame({"lp": ["a-b"], "human": [1.0], "samples": ["0.1"]}), "need at least 2 samples"),
    ],
)
def test_bad_predictions_raise_data_error_and_cli_exits_2(tmp_path, capsys, table, match):
    pred = _write(tmp_path / "bad.csv", table)
    out = tmp_path / "m.json"
    with pytest.raises(DataError, match=match):
        evaluate_prediction_files(pred, out)
    assert main(["evaluate-predictions", "--predictions", str(pred), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "error" in err
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [pred]  # no output, no temp file


def test_empty_file_and_missing_out_folder(tmp_path, files):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataError, match=r"empty\.csv: file is empty"):
        evaluate_prediction_files(empty, tmp_path / "m.json")
    _, pred = files
    out = tmp_path / "no" / "such" / "m.json"
    with pytest.raises(DataError, match="output folder .* does not exist"):
        evaluate_prediction_files(pred, out)
    assert main(["evaluate-predictions", "--predictions", str(pred), "--out", str(out)]) == 2
    assert not out.parent.exists()


def test_bad_dev_file_is_named(tmp_path, files):
    _, pred = files
    dev = _write(tmp_path / "dev_bad.csv", GOOD.assign(mu=["1", "2", "x"]))
    with pytest.raises(DataError, match=r"dev_bad\.csv: row 3 \(line 4\), column 'mu'"):
        evaluate_prediction_files(pred, tmp_path / "m.json", dev=dev)
    constant = _write(tmp_path / "dev_const.csv", GOOD.assign(human=[1.0, 1.0, 1.0]))
    with pytest.raises(DataError, match=r"dev_const\.csv: cannot evaluate/calibrate"):
        evaluate_prediction_files(pred, tmp_path / "m.json", dev=constant)
    assert not (tmp_path / "m.json").exists()


def test_existing_output_is_kept_on_error(tmp_path):
    out = tmp_path / "m.json"
    out.write_text('{"old": true}')
    bad = _write(tmp_path / "bad.csv", GOOD.drop(columns=["human"]))
    assert main(["evaluate-predictions", "--predictions", str(bad), "--out", str(out)]) == 2
    assert json.loads(out.read_text()) == {"old": True}


def test_cli_reports_candidates_and_takes_sigma_source_and_calibration(files, tmp_path, capsys):
    dev, pred = files
    out = tmp_path / "m.json"
    argv = ["evaluate-predictions", "--predictions", str(pred), "--dev", str(dev), "--out", str(out)]
    assert main([*argv, "--sigma-from", "samples", "--calibration", "scale_nll"]) == 0
    printed = capsys.readouterr().out
    assert "calibration: scale_nll (rule min_goal_ratio" in printed and "affine_crps" in printed
    written = json.loads(out.read_text())
    assert written["settings"]["sigma_from_samples"] is True
    assert written["calibration"]["selected"] == "scale_nll"
    assert {"ence", "sigma_p90_p10"} <= set(written["methods"]["model"]["macro_avg"])
    assert main([*argv, "--calibration", "isotonic"]) == 2
    assert "--calibration: calibration='isotonic' not supported; choose from ['affine_crps'" in capsys.readouterr().err
