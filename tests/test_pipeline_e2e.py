"""The whole stage chain on a small real slice: fetch -> prepare -> encode -> train_base -> train_dup
-> train_lolo -> calibrate -> evaluate -> calibrate_campaigns -> register, with the default encoder (MiniLM) and tiny heads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT
from uamt.registry.store import SUMMARY_PATH

STAGES = ("fetch", "prepare", "encode", "train_base", "train_dup", "train_lolo", "calibrate", "evaluate", "calibrate_campaigns", "register")


def small_params(tmp_path: Path, mirror: Path) -> Path:
    """The repo's params.yaml with small data and tiny heads, all paths inside ``tmp_path``."""
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["fetch"]["mirror"] = str(mirror)
    params["fetch"]["sources_file"] = str(REPO_ROOT / "data_sources.yaml")
    params["prepare"]["datasets"] = ["wmt21_mqm", "ted_mqm"]
    params["prepare"]["forced_splits"] = {"ted_mqm": "ood"}
    # whole real documents of ~180-280 rows: ~1,500 rows per LP give every split a document
    params["prepare"]["max_rows_per_lp"] = {"wmt21_mqm": 1500, "ted_mqm": 400}
    params["train_base"].update(
        hidden_sizes=[64], max_epochs=3, batch_size=32, mc_samples=20, ensemble_size=2
    )
    params["train_dup"].update(bottleneck_size=16)
    params["pipeline"].update(
        datasets=["wmt21_mqm"],
        ood_datasets=["ted_mqm"],
        methods=["point", "mcd_head", "ensemble", "hts", "hts_mcd"],
    )
    params["encode"]["datasets"] = ["wmt21_mqm", "ted_mqm"]
    params["register"]["tracking_uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params["register"]["allow_new_registry"] = True  # a fresh registry, created on purpose
    params["register"]["gates"]["max_dev_ece"] = 0.5  # tiny models on 400 rows: the gate's logic, not quality
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory, mirror_root):
    import importlib
    import os

    tmp_path = tmp_path_factory.mktemp("pipeline")
    params = small_params(tmp_path, mirror_root)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        outputs = {}
        for name in STAGES:
            module = importlib.import_module(f"uamt.stages.{name}")
            assert module.main(["--params", str(params)]) == 0, f"stage {name} failed"
            outputs[name] = True
        yield tmp_path
    finally:
        os.chdir(cwd)
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)


@pytest.mark.slow
def test_chain_writes_metrics_for_every_method_and_lp(pipeline_run):
    test = json.loads((pipeline_run / "metrics" / "test.json").read_text())
    assert set(test) == {"point", "mcd_head", "ensemble", "hts", "hts_mcd", "dup", "hts_qe", "point_qe"}
    for method, by_lp in test.items():
        assert {"avg", "en-de", "zh-en"} <= set(by_lp), method
        for key in ("pps", "ece", "sharpness", "crps", "coverage@0.9", "miss_below@0.9"):
            assert by_lp["avg"][key] is not None, (method, key)
        if method not in ("point", "point_qe"):  # the point estimate has no sigma of its own to correlate
            assert by_lp["avg"]["ups_raw"] is not None, method
    ood = json.loads((pipeline_run / "metrics" / "ood.json").read_text())
    assert set(ood) == set(test)
    conditional = json.loads((pipeline_run / "metrics" / "conditional.json").read_text())
    assert set(conditional) == set(test)
    for method, summary in conditional.items():
        assert {"en-de", "zh-en"} <= set(summary["per_lp"]), method
        assert summary["candidates"] and len(summary["goals"]) == 9, method
        assert summary["served"] in (*summary["candidates"], "fixed_variance"), method
        if method not in ("point", "point_qe"):  # each model against its point estimate, with or without a reference
            assert summary["baseline"]["name"].startswith("point_qe+" if method == "hts_qe" else "point+"), method
    # the gate reads dev metrics cross-fitted over documents, with the baselines beside the models
    dev = json.loads((pipeline_run / "metrics" / "dev.json").read_text())
    assert {f"point+{conditional['hts']['served']}", f"point_qe+{conditional['hts_qe']['served']}", *test} <= set(dev)
    # the served models' unseen-LP widening is fitted with train_lolo's models (each LP left out of
    # model and calibration), and evaluate measures them on the held-out LPs' test rows
    manifest = json.loads((pipeline_run / "models" / "lolo" / "manifest.json").read_text())
    assert set(manifest["held_out_lps"]) | set(manifest.get("skipped", {})) == {"en-de", "en-ru", "zh-en"}
    assert len(manifest["held_out_lps"]) >= 2, manifest  # an LP is skipped only where dev holds no other
    for model in ("hts", "hts_qe"):
        assert dev[model]["unseen_lp"]["fitted_with"] == "model and calibration held out", model
        assert set(conditional[model]["unseen_lp_held_out_models"]) - {"avg"} <= set(manifest["held_out_lps"]), model
    assert dev["point"]["unseen_lp"]["fitted_with"] == "calibration held out"
    for plot in ("reliability.png", "sharpness.png", "error_vs_sigma.png"):
        assert (pipeline_run / "plots" / plot).stat().st_size > 1000


def assert_valid_intervals(out) -> None:
    """sigma > 0 and lower <= mu <= upper, strictly where nothing was clipped to the scale's bounds
    (MQM: a mu predicted above 0 is clipped to 0, and so is the upper end; an interval wholly above 0,
    as a tiny model predicts for "The dog barks.", becomes [0, 0])."""
    assert (out["sigma"] > 0).all()
    assert (out["lower"] <= out["mu"]).all() and (out["mu"] <= out["upper"]).all()
    free = ~out["clipped"].astype(bool)
    assert (out["lower"][free] < out["mu"][free]).all() and (out["mu"][free] < out["upper"][free]).all()


@pytest.mark.slow
def test_registered_champion_scores_new_text(pipeline_run):
    from uamt.registry.store import tracking_uri
    from uamt.serving.predictor import load_predictor

    summary = json.loads((pipeline_run / SUMMARY_PATH).read_text())
    assert summary["version"] == "1" and summary["promoted"], summary
    import os

    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{pipeline_run / 'mlflow.db'}"
    try:
        assert tracking_uri().endswith("mlflow.db")
        predictor = load_predictor("models:/uamt-comet@champion")
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    import pandas as pd

    frame = pd.DataFrame(
        {
            "src": ["Der Hund bellt.", "Das ist ein Test."],
            "mt": ["The dog barks.", "Banana."],
            "ref": ["The dog is barking.", "This is a test."],
        }
    )
    out = predictor.predict_frame(frame, confidence=0.9, risk_threshold=-5.0)
    assert list(out.columns[:5]) == ["mu", "sigma", "lower", "upper", "risk"]
    assert_valid_intervals(out)
    assert out["risk"].between(0, 1).all()
    multi = predictor.predict_frame(
        frame.assign(refs=[["The dog is barking.", "The dog barks."]] * 2).drop(columns="ref")
    )
    assert len(multi) == 2
    # the per-campaign calibration travels with the model: a row naming its campaign gets it
    campaigns = json.loads((pipeline_run / "metrics" / "campaigns.json").read_text())
    assert set(campaigns) == {"hts", "hts_qe"}
    assert predictor.metadata()["calibration"]["campaigns"] == campaigns["hts"]["known_campaigns"]
    assert "wmt21_mqm" in campaigns["hts"]["known_campaigns"]["en-de"]
    lp = frame.assign(lp="en-de")
    named = predictor.predict_frame(lp.assign(campaign=["wmt21_mqm", None]), confidence=0.9, risk_threshold=-5.0)
    plain = predictor.predict_frame(lp, confidence=0.9, risk_threshold=-5.0)
    # one campaign per LP here (WMT21 only): keyed by campaign, the same rows get the same fit
    pd.testing.assert_frame_equal(named, plain)
    from uamt.core.errors import DataError

    with pytest.raises(DataError, match="row 0: campaign 'wmt99' has no calibration for lp 'en-de'"):
        predictor.predict_frame(lp.assign(campaign="wmt99"))


@pytest.mark.slow
def test_reference_free_model_is_registered_and_scores_without_references(pipeline_run):
    import os

    import pandas as pd

    from uamt.core.errors import UamtError
    from uamt.serving.scores import load_scoring_predictor

    summary = json.loads((pipeline_run / SUMMARY_PATH).read_text())
    assert summary["qe"]["model_name"] == "uamt-comet-qe" and summary["qe"]["method"] == "hts_qe"
    assert summary["qe"]["promoted"], summary["qe"]
    manifest = json.loads((pipeline_run / "models" / "hts_qe" / "model.json").read_text())
    assert manifest["config"]["reference_free"] is True
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{pipeline_run / 'mlflow.db'}"
    try:
        predictor, uri = load_scoring_predictor(None, has_references=False)
        assert uri == "models:/uamt-comet-qe@champion" and not predictor.uses_references
        with pytest.raises(UamtError, match="reference-free"):
            load_scoring_predictor(uri, has_references=True)
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    frame = pd.DataFrame({"src": ["Der Hund bellt.", "Das ist ein Test."], "mt": ["The dog barks.", "Banana."]})
    out = predictor.predict_frame(frame, confidence=0.9, risk_threshold=-5.0)
    assert_valid_intervals(out)
