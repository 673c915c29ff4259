"""The calibration keyed by language pair x annotation campaign (uamt.campaigns): fitted, measured and served.

Synthetic predictions of one LP rated in two campaigns whose raters scatter differently around the
same predicted quality (residual sd 1 and 4 MQM): the per-LP calibration pools them, so its 90 %
interval over-covers the first and under-covers the second; keyed by campaign, each is covered.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from uamt.campaigns import (
    campaign_key,
    campaign_route,
    fit_campaign_calibration,
    known_campaigns,
    measure_campaigns,
)
from uamt.core.errors import DataError
from uamt.core.scale import ScoreScale
from uamt.serving.model_calibration import attach_distribution, fit_calibration
from uamt.uncertainty import EvaluationSettings

BOUNDS = (-25.0, 0.0)
SPREAD = {"calm": 1.0, "harsh": 4.0}


def _predictions(seed: int, n: int = 2000) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    parts = []
    for campaign, spread in SPREAD.items():
        mu = rng.uniform(-15.0, -6.0, n)
        human = np.clip(np.round(mu + spread * rng.standard_normal(n)), *BOUNDS)
        parts.append(pd.DataFrame({
            "dataset": campaign, "lp": "en-de", "seg_id": np.arange(n), "system": "s",
            "doc": [f"{campaign}/{seed}/{i // 10}" for i in range(n)],
            "human": human, "mu": mu, "sigma": np.full(n, 1.5),
        }))
    return pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="module")
def fitted():
    settings = EvaluationSettings()
    rows, test = _predictions(0), _predictions(1)
    pooled, _ = fit_calibration(rows, "hts", settings=settings)
    pooled = attach_distribution(pooled, rows, "hts", settings, BOUNDS)
    keyed = fit_campaign_calibration(rows, "hts", settings, BOUNDS)
    return settings, rows, test, pooled, keyed


def test_keyed_by_campaign_each_campaign_is_covered_where_the_pooled_calibration_misses_both(fitted):
    settings, rows, test, pooled, keyed = fitted
    assert known_campaigns(keyed) == {"en-de": ["calm", "harsh"]}
    measured = measure_campaigns(pooled, keyed, rows, test, settings, BOUNDS)
    coverage = {(r["split"], r["calibration"], r["campaign"]): r["coverage"] for r in measured["campaigns"]}
    # pooled: too wide for the calm raters, too narrow for the harsh ones, on fresh rows too
    assert coverage["test", "per_lp", "calm"] > 0.96
    assert coverage["test", "per_lp", "harsh"] < 0.85
    for campaign in SPREAD:
        assert coverage["calibration", "per_campaign", campaign] == pytest.approx(0.9, abs=0.02)
        assert coverage["test", "per_campaign", campaign] == pytest.approx(0.9, abs=0.04)
    width = {(r["calibration"], r["campaign"]): r["width"] for r in measured["campaigns"] if r["split"] == "test"}
    # a 90 % interval of N(mu, 4) rounded is about 2 x 1.645 x 4 = 13.2 wide; of N(mu, 1), 3.3
    assert width["per_campaign", "harsh"] == pytest.approx(13.2, abs=1.0)
    assert width["per_campaign", "calm"] == pytest.approx(3.3, abs=0.5)
    assert {"per_lp", "per_campaign"} == set(measured["goals"]) == set(measured["summary"])
    assert measured["summary"]["per_campaign"]["crps"] < measured["summary"]["per_lp"]["crps"]


def test_a_campaign_is_served_the_models_sigma_with_the_weight_the_served_calibration_chose():
    """The keyed calibration tempers σ as the per-LP one does (its λ, medians per key): at λ = 0 its
    answers do not move with σ, and fitting it on σ tempered by hand answers alike."""
    settings = EvaluationSettings()
    rows = _predictions(2).assign(sigma=lambda t: np.exp(np.random.default_rng(3).normal(0.0, 0.5, len(t))))
    flat = fit_campaign_calibration(rows, "hts", settings, BOUNDS, sigma_weight=0.0)
    assert flat.sigma_tempering.weight == 0.0 and set(flat.sigma_tempering.medians) >= {"en-de|calm", "en-de|harsh"}
    mu, sigma = rows["mu"].to_numpy(), rows["sigma"].to_numpy()
    lp = np.full(len(rows), campaign_key("en-de", "harsh"), dtype=object)
    np.testing.assert_array_equal(flat.interval(mu, sigma, 0.9, lp), flat.interval(mu, 3.0 * sigma, 0.9, lp))
    half = fit_campaign_calibration(rows, "hts", settings, BOUNDS, sigma_weight=0.5)
    by_hand = rows.assign(sigma=half.sigma_tempering.apply(sigma, rows["dataset"].map(lambda c: campaign_key("en-de", c)).to_numpy(dtype=object)))
    plain = fit_campaign_calibration(by_hand, "hts", settings, BOUNDS)
    assert plain.sigma_tempering is None
    np.testing.assert_allclose(
        half.risk(mu, sigma, -10.0, lp), plain.risk(mu, half.sigma_tempering.apply(sigma, lp), -10.0, lp), rtol=1e-12
    )


def test_a_row_is_routed_only_by_a_campaign_the_calibration_knows_for_its_language_pair(fitted):
    keyed = fitted[4]
    mask, keys = campaign_route(["en-de", "en-de", "en-de"], [None, "harsh", float("nan")], keyed)
    assert mask.tolist() == [False, True, False]
    assert keys[1] == campaign_key("en-de", "harsh") == "en-de|harsh"
    with pytest.raises(DataError, match=r"row 1: campaign 'wmt99' has no calibration for lp 'en-de'; known: \['calm', 'harsh'\]"):
        campaign_route(["en-de", "en-de"], [None, "wmt99"], keyed)
    with pytest.raises(DataError, match=r"row 0: campaign 'calm' has no calibration for lp 'zh-en'; known: \[\]"):
        campaign_route(["zh-en"], ["calm"], keyed)
    with pytest.raises(DataError, match=r"record 0: campaign 'calm' needs the row's lp"):
        campaign_route(None, ["calm"], keyed, row_label="record")
    # a row whose text contradicts --lp is scored as the unseen pair 'und': say so, not "no calibration for 'und'"
    with pytest.raises(DataError, match=r"row 0: campaign 'calm' needs the row's language pair, but its text contradicts the lp given"):
        campaign_route(["und"], ["calm"], keyed)
    with pytest.raises(DataError, match="this model has no per-campaign calibration"):
        campaign_route(["en-de"], ["calm"], None)


def test_the_served_predictor_answers_rows_naming_their_campaign_with_the_keyed_calibration(fitted, monkeypatch):
    from uamt.serving.calibrated_predictor import CalibratedPredictor

    _, _, test, pooled, keyed = fitted
    rows = test.iloc[[0, 2500, 2, 2700]].reset_index(drop=True)
    predictor = object.__new__(CalibratedPredictor)
    predictor.calibration, predictor.campaigns = pooled, keyed
    predictor.scale = ScoreScale("MQM", "test", -5.0, BOUNDS)
    monkeypatch.setattr(predictor, "raw_predict", lambda frame: rows[["mu", "sigma"]].iloc[: len(frame)].reset_index(drop=True))
    frame = pd.DataFrame({"src": ["a"] * 4, "mt": ["b"] * 4, "lp": "en-de", "campaign": [None, "harsh", "calm", None]})
    out = predictor.predict_frame(frame, interval="conformal")
    mu, sigma = rows["mu"].to_numpy(), rows["sigma"].to_numpy()
    for i, (calibration, key) in enumerate([(pooled, "en-de"), (keyed, "en-de|harsh"), (keyed, "en-de|calm"), (pooled, "en-de")]):
        one = (mu[i : i + 1], sigma[i : i + 1])
        lower, upper = calibration.interval(*one, 0.9, np.array([key], dtype=object), "conformal")
        assert out.loc[i, "lower"] == pytest.approx(max(lower[0], BOUNDS[0]))
        assert out.loc[i, "upper"] == pytest.approx(min(upper[0], BOUNDS[1]))
        assert out.loc[i, "risk"] == pytest.approx(calibration.risk(*one, -5.0, np.array([key], dtype=object))[0])
    # without the column every row gets the per-LP answer, as before
    plain = predictor.predict_frame(frame.drop(columns=["campaign"]), interval="conformal")
    pd.testing.assert_frame_equal(plain.iloc[[0, 3]], out.iloc[[0, 3]])
    assert not np.allclose(plain["upper"].iloc[[1, 2]], out["upper"].iloc[[1, 2]])
    with pytest.raises(DataError, match=r"row 3: campaign 'wmt99' has no calibration"):
        predictor.predict_frame(frame.assign(campaign=[None, None, None, "wmt99"]))


def test_a_campaign_key_gets_its_language_pairs_reference_factor():
    from uamt.campaigns import keyed_reference_factors

    factors = {2: {"__global__": 0.97, "en-de": 1.002}, 3: {"zh-en": 0.9}}
    keys = ["en-de|a", "en-de|b", "zh-en|a", "he-en|a"]
    assert keyed_reference_factors(factors, keys) == {2: {"en-de|a": 1.002, "en-de|b": 1.002}, 3: {"zh-en|a": 0.9}}


def _stage_layout(tmp_path, served):
    """A pipeline folder as the calibrate stage leaves it for the served model ``hts``: its served
    calibration (fitted on ``dev``) and its dev and test predictions."""
    from uamt.pipeline_config import PipelineConfig

    pipe = PipelineConfig(register_qe_method=None, predictions_dir=str(tmp_path / "predictions"), workers=1)
    for split, table in (("dev", _predictions(0)), ("test", _predictions(1))):
        (tmp_path / "predictions" / split).mkdir(parents=True)
        table.to_parquet(tmp_path / "predictions" / split / "hts.parquet")
    served.calibrated_on = ["dev"]
    served.save(tmp_path / "calibration" / "hts.json")
    return pipe


def test_the_stages_fit_the_served_candidate_per_campaign_and_measure_the_files_the_model_ships(tmp_path):
    """calibrate_campaigns fits the served candidate (pinned: here one the dev rule would not pick)
    keyed by campaign and writes it; evaluate_campaigns measures the files as saved, so a changed
    per-campaign file changes its rows and leaves the per-LP ones."""
    import json

    from uamt.campaigns import calibrate_campaigns, evaluate_campaigns
    from uamt.model_evaluation import pinned
    from uamt.serving.model_calibration import Calibration, with_model_sigma

    settings = EvaluationSettings()
    rows = _predictions(0)
    served, _ = fit_calibration(rows, "hts", settings=pinned(settings, "affine_nll"))
    served = attach_distribution(served, rows, "hts", pinned(settings, "affine_nll"), BOUNDS)
    auto_keyed = fit_campaign_calibration(rows, "hts", settings, BOUNDS)
    assert auto_keyed.selected != "affine_nll"  # what the rule picks on the keyed rows
    pipe = _stage_layout(tmp_path, served)

    written = calibrate_campaigns(pipe, settings, tmp_path / "calibration", tmp_path / "campaigns", min_rows=300)
    assert written == {"hts": tmp_path / "campaigns" / "hts.json"}
    keyed = Calibration.load(written["hts"])
    assert keyed.selected == "affine_nll" and tuple(keyed.calibrated_on) == ("dev",)
    assert known_campaigns(keyed) == {"en-de": ["calm", "harsh"]}

    metrics_path = tmp_path / "metrics" / "campaigns.json"
    metrics = evaluate_campaigns(pipe, settings, tmp_path / "calibration", tmp_path / "campaigns", metrics_path)
    assert json.loads(metrics_path.read_text()) == json.loads(json.dumps(metrics))
    test = with_model_sigma(_predictions(1), "hts")
    expected = measure_campaigns(
        Calibration.load(tmp_path / "calibration" / "hts.json"), keyed, with_model_sigma(rows, "hts"), test, settings, BOUNDS
    )
    assert metrics["hts"] == json.loads(json.dumps(expected))

    # another per-campaign file (fitted on other rows) changes the per-campaign rows only
    fit_campaign_calibration(_predictions(2, n=400), "hts", pinned(settings, "affine_nll"), BOUNDS).save(written["hts"])
    changed = evaluate_campaigns(pipe, settings, tmp_path / "calibration", tmp_path / "campaigns", metrics_path)["hts"]
    by_label = {label: [r for r in changed["campaigns"] if r["calibration"] == label] for label in ("per_lp", "per_campaign")}
    before = {label: [r for r in metrics["hts"]["campaigns"] if r["calibration"] == label] for label in ("per_lp", "per_campaign")}
    assert by_label["per_lp"] == before["per_lp"]
    assert by_label["per_campaign"] != before["per_campaign"]


def test_a_campaign_below_the_minimum_is_recorded_in_the_file_and_reported(tmp_path):
    from uamt.campaigns import calibrate_campaigns, evaluate_campaigns
    from uamt.serving.model_calibration import Calibration

    settings = EvaluationSettings()
    rows = _predictions(0)
    served, _ = fit_calibration(rows, "hts", settings=settings)
    pipe = _stage_layout(tmp_path, attach_distribution(served, rows, "hts", settings, BOUNDS))
    written = calibrate_campaigns(pipe, settings, tmp_path / "calibration", tmp_path / "campaigns", min_rows=3000)
    assert Calibration.load(written["hts"]).too_few_rows == {"min_rows": 3000, "keys": {"en-de|calm": 2000, "en-de|harsh": 2000}}
    metrics = evaluate_campaigns(pipe, settings, tmp_path / "calibration", tmp_path / "campaigns", tmp_path / "m.json")
    assert metrics["hts"]["below_min_rows"] == {"min_rows": 3000, "campaigns": {"en-de|calm": 2000, "en-de|harsh": 2000}}
