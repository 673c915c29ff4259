"""The unseen-LP widening with the model held out: the train_lolo stage's models, the factor the
calibrate stage fits with them, what evaluate measures on the held-out LPs' test rows."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from uamt.core.config import ConfigError
from uamt.core.errors import DataError
from uamt.leave_one_lp_out import LeaveOneLpOutConfig, held_out_lps, held_out_models
from uamt.pipeline_config import PipelineConfig
from uamt.serving.model_calibration import (
    Calibration,
    fit_calibration,
    fit_held_out_model_unseen_lp_sigma_factor,
    fit_model_unseen_lp_sigma_factor,
    served_lp_coverage,
)
from uamt.uncertainty import EvaluationSettings

SETTINGS = EvaluationSettings(
    min_lp_rows=20, calibration="mondrian_conformal", calibration_candidates=("mondrian_conformal",)
)
BOUNDS = (-25.0, 0.0)
LPS = ("en-de", "en-ru", "zh-en")


def predictions(rng, lp_noise: dict[str, float], n: int = 500) -> pd.DataFrame:
    """MQM-like calibration rows: human = clipped skewed scores, mu = a noisy view of them whose noise
    is ``lp_noise[lp]`` (sigma carries no per-row signal)."""
    frames = []
    for lp, noise in lp_noise.items():
        human = -np.where(rng.random(n) < 0.3, 0.0, rng.gamma(1.0, 4.0, n))
        frames.append(pd.DataFrame({
            "lp": lp, "human": np.clip(human, -25, 0), "mu": 0.5 * human + rng.normal(0, noise, n),
            "sigma": 1.0, "doc": [f"{lp}/d{i // 10}" for i in range(n)],
        }))
    return pd.concat(frames, ignore_index=True)


def test_a_model_that_never_saw_the_pair_is_widened_until_held_out_pairs_are_covered():
    """Each LP's model without it predicts that LP worse (noise 4 vs 2): the held-out models ask for
    a much wider interval than the calibration-only fit (the model saw every LP), and with their
    factor the held-out LPs are covered at the level on average."""
    rng = np.random.default_rng(0)
    seen = predictions(rng, dict.fromkeys(LPS, 2.0))
    template = fit_calibration(seen, "hts", settings=SETTINGS)[0]
    calibration_only, _ = fit_model_unseen_lp_sigma_factor(seen, "hts", template, settings=SETTINGS, bounds=BOUNDS)
    tables = {lp: predictions(rng, {other: 4.0 if other == lp else 2.0 for other in LPS}) for lp in LPS}
    fit = fit_held_out_model_unseen_lp_sigma_factor(tables, "hts", template, settings=SETTINGS, bounds=BOUNDS)
    assert fit.factor > calibration_only + 0.3
    assert set(fit.needed) == set(fit.coverage) == set(fit.calibrations) == set(LPS)
    assert min(fit.needed.values()) <= fit.factor <= max(fit.needed.values())
    widened = [fit.coverage[lp]["widened"] for lp in LPS]
    assert np.mean(widened) == pytest.approx(0.9, abs=0.005)
    assert all(fit.coverage[lp]["unwidened"] < fit.coverage[lp]["widened"] for lp in LPS)
    for lp, calibration in fit.calibrations.items():
        # what an unseen LP gets: the global fallback of a fit without it, widened by the factor
        assert lp not in calibration.known_lps and set(calibration.known_lps) == set(LPS) - {lp}
        assert calibration.unseen_lp_sigma_factor == fit.factor
        held = tables[lp][tables[lp]["lp"] == lp]
        assert served_lp_coverage(calibration, held, 0.9, BOUNDS) == pytest.approx(fit.coverage[lp]["widened"])
        assert fit.coverage[lp]["n"] == len(held)


def test_fewer_than_two_held_out_lps_with_enough_rows_give_no_widening():
    rng = np.random.default_rng(1)
    tables = {lp: predictions(rng, dict.fromkeys(LPS, 2.0)) for lp in LPS}
    tables = {lp: t[(t["lp"] != lp) | (t.index % 50 == 0)] for lp, t in tables.items() if lp != "zh-en"}
    template = fit_calibration(tables["en-de"], "hts", settings=SETTINGS)[0]
    fit = fit_held_out_model_unseen_lp_sigma_factor(tables, "hts", template, settings=SETTINGS, bounds=BOUNDS)
    assert (fit.factor, fit.needed, fit.calibrations) == (1.0, {}, {})


def test_config_refuses_a_model_named_twice_or_one_train_base_does_not_train():
    with pytest.raises(ConfigError, match=r"train_lolo.models=\['hts', 'hts'\] names a model twice"):
        LeaveOneLpOutConfig(models=("hts", "hts"))
    pipe = PipelineConfig(methods=("point", "hts"), qe_methods=("hts",))
    LeaveOneLpOutConfig(models=("hts", "hts_qe")).check_against(pipe)
    with pytest.raises(ConfigError, match=r"train_lolo.models: 'dup' is not a model train_base trains; choose from"):
        LeaveOneLpOutConfig(models=("dup",)).check_against(pipe)


def test_an_lp_is_left_out_only_where_other_lps_remain_to_train_and_stop_on():
    """A small profile's dev may hold one LP: leaving that LP out would leave no early-stopping
    rows, so no model is trained without it (said why); one LP in all leaves nothing to hold out."""
    train = pd.DataFrame({"lp": ["en-de", "en-ru", "zh-en", "en-de"]})
    assert held_out_lps(train, train) == (["en-de", "en-ru", "zh-en"], {})
    lps, skipped = held_out_lps(train, pd.DataFrame({"lp": ["en-de", "en-de"]}))
    assert lps == ["en-ru", "zh-en"] and list(skipped) == ["en-de"]
    assert "early-stopping rows hold no other LP (['en-de'])" in skipped["en-de"]
    assert held_out_lps(train[train.lp == "en-de"], train) == ([], {"en-de": "the training rows hold no other LP"})


def test_held_out_models_reads_the_manifest_and_refuses_a_missing_folder(tmp_path):
    assert held_out_models(tmp_path, "hts") == {}  # the stage trained nothing here
    (tmp_path / "manifest.json").write_text(json.dumps({"models": ["hts"], "held_out_lps": ["en-de", "zh-en"]}))
    for lp in ("en-de", "zh-en"):
        (tmp_path / lp / "hts").mkdir(parents=True)
        (tmp_path / lp / "hts" / "model.json").write_text("{}")
    assert held_out_models(tmp_path, "hts") == {lp: tmp_path / lp / "hts" for lp in ("en-de", "zh-en")}
    assert held_out_models(tmp_path, "hts_qe") == {}  # not one of the stage's models
    (tmp_path / "zh-en" / "hts" / "model.json").unlink()
    with pytest.raises(DataError, match=r"manifest.json lists hts without each LP, but .*zh-en/hts.* hold no model"):
        held_out_models(tmp_path, "hts")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match=r"manifest.json: not valid JSON"):
        held_out_models(tmp_path, "hts")


@pytest.mark.slow
def test_stage_models_calibrate_and_evaluate_with_the_model_held_out(tmp_path, monkeypatch):
    """train_lolo -> calibrate -> evaluate on a synthetic three-LP slice: the listed model's widening
    is fitted with its held-out models, the other keeps the calibration-only fit, the held-out
    calibrations are saved and evaluate measures them on the held-out LPs' test rows."""
    import uamt.model_evaluation as model_evaluation
    import uamt.pipeline_config as pipeline_config
    from tests.fakes import FEATURES
    from tests.test_new_method import split_table
    from uamt.encoders import EncodeConfig
    from uamt.leave_one_lp_out import train_leave_one_lp_out
    from uamt.models import TrainConfig, train
    from uamt.models.shared_training import train_methods

    prepared = tmp_path / "prepared"
    prepared.mkdir()
    splits = {name: split_table(n, seed, "wmt21_mqm") for name, n, seed in
              (("d_q", 360, 1), ("d_e", 240, 5), ("dev", 180, 2), ("test", 150, 3))}
    splits["ood"] = split_table(60, 4, "ted_mqm")
    for name, table in splits.items():
        table["lp"] = np.array(LPS, dtype=object)[np.arange(len(table)) % 3]
        if name == "ood":  # a pair no model or calibration saw: the unseen-pair goal's rows
            table.loc[table.index < 20, "lp"] = "aa-zz"
        table.to_parquet(prepared / f"{name}.parquet", index=False)
    pipe = PipelineConfig(
        methods=("point", "hts"), register_method="hts", qe_methods=(), register_qe_method=None,
        **{f"{k}_dir": str(tmp_path / k) for k in ("models", "predictions", "metrics", "plots")},
        prepared_dir=str(prepared),
    )
    cfg = TrainConfig(hidden_sizes=(16,), max_epochs=2, batch_size=16, patience=2, synthetic_failures=0.0)
    lolo = LeaveOneLpOutConfig(models=("hts",), out_dir=str(tmp_path / "lolo"))
    monkeypatch.setattr(pipeline_config, "open_features", lambda encode: FEATURES)
    monkeypatch.setattr(model_evaluation, "open_features", lambda encode: FEATURES)
    train_methods(pipe.methods, cfg, splits["d_q"], splits["dev"], FEATURES, pipe.model_dir)
    for method in pipe.second_stage_methods:  # DUP, over dup_base
        train(method, dataclasses.replace(cfg, train_split="d_e"), splits["d_e"], splits["dev"], FEATURES,
              pipe.model_dir(method), base_model_dir=pipe.model_dir(pipe.dup_base))
    trained = train_leave_one_lp_out(pipe, cfg, EncodeConfig(), lolo)
    assert set(trained) == {"hts"} and set(trained["hts"]) == set(LPS)
    manifest = json.loads((tmp_path / "lolo" / "manifest.json").read_text())
    assert manifest["trained"]["hts"]["en-ru"]["n_train"] == 240  # d_q without en-ru's 120 rows

    settings = EvaluationSettings(
        calibration_splits=("dev", "d_e"), min_lp_rows=20, cross_fit_folds=3, sigma_weights=(0.0, 1.0),
        unseen_sigma_margin=0.0,
    )
    model_evaluation.calibrate_models(pipe, settings, EncodeConfig(), tmp_path / "calibration", lolo.out_dir)
    model_evaluation.evaluate_models(pipe, settings, EncodeConfig(), tmp_path / "calibration", lolo.out_dir)

    dev = json.loads((tmp_path / "metrics" / "dev.json").read_text())
    unseen = dev["hts"]["unseen_lp"]
    assert unseen["fitted_with"] == "model and calibration held out"
    assert set(unseen["held_out_models"]) == set(LPS) and "held_out" in unseen["calibration_only"]
    assert dev["point"]["unseen_lp"]["fitted_with"] == "calibration held out"
    served = Calibration.load(tmp_path / "calibration" / "hts.json")
    assert served.unseen_lp_sigma_factor == pytest.approx(unseen["sigma_factor"])
    # the σ weight of unseen rows chosen by the held-out models, served and in the held-out fits alike
    chosen = unseen["sigma_weight"]["chosen"]
    assert set(unseen["sigma_weight"]["weights"]) == {"0.0", "1.0"}
    assert unseen["sigma_weight"]["in_domain"] == dev["hts"]["sigma_weight"]["chosen"]
    assert served.sigma_tempering.unseen == chosen
    for lp in LPS:
        held = Calibration.load(tmp_path / "calibration" / "lolo" / "hts" / f"{lp}.json")
        assert lp not in held.known_lps and held.unseen_lp_sigma_factor == pytest.approx(unseen["sigma_factor"])
        assert held.sigma_tempering.unseen == chosen
    conditional = json.loads((tmp_path / "metrics" / "conditional.json").read_text())
    measured = conditional["hts"]["unseen_lp_held_out_models"]
    assert set(measured) == {*LPS, "avg"} and "unseen_lp_held_out_models" not in conditional["point"]
    for lp in LPS:
        assert measured[lp]["n"] == 50
        assert measured[lp]["coverage@0.9"] >= measured[lp]["coverage@0.9_unwidened"]
        assert measured[lp]["seen_width@0.9"] == pytest.approx(
            json.loads((tmp_path / "metrics" / "test.json").read_text())["hts"][lp]["width@0.9"]
        )
    assert measured["avg"]["coverage@0.9"] == pytest.approx(np.mean([measured[lp]["coverage@0.9"] for lp in LPS]))

    # evaluate measured the candidates as calibrate fitted them: fitting them all again (the
    # candidate fits gone) writes the same metrics
    fits = tmp_path / "calibration" / model_evaluation.CANDIDATE_FITS_DIR
    assert sorted(p.name for p in fits.iterdir()) == ["dup.json", "hts.json", "point.json"]
    shutil.move(fits, tmp_path / "fits_aside")
    refitted = dataclasses.replace(pipe, metrics_dir=str(tmp_path / "metrics_refitted"), plots_dir=str(tmp_path / "plots_refitted"))
    model_evaluation.evaluate_models(refitted, settings, EncodeConfig(), tmp_path / "calibration", lolo.out_dir)
    shutil.move(tmp_path / "fits_aside", fits)
    for name in ("test.json", "conditional.json", "intervals.json"):
        assert (tmp_path / "metrics_refitted" / name).read_bytes() == (tmp_path / "metrics" / name).read_bytes(), name
    assert not (tmp_path / "metrics" / "ood.json").exists()  # evaluate leaves the out-of-domain split

    # evaluate_ood, after register: the out-of-domain split measured as evaluate measured test, and
    # the unseen pair's goal judged as if evaluate had had it (served_summary given the ood metrics)
    from uamt import ood_evaluation
    from uamt.uncertainty.goals import served_summary, with_held_out

    monkeypatch.setattr(ood_evaluation, "open_features", lambda encode: FEATURES)
    monkeypatch.setattr(ood_evaluation, "encode_ood_texts", lambda pipe, encode: {"texts": 0, "encoded": 0})
    written = ood_evaluation.evaluate_ood_models(pipe, settings, EncodeConfig(), tmp_path / "calibration")
    ood = json.loads(written["ood"].read_text())
    held_out = json.loads(written["held_out"].read_text())
    assert set(ood) == set(held_out) == set(pipe.all_methods) and written["sharpness"].is_file()
    assert held_out["hts"]["lps"] == ["aa-zz"] and ood["hts"]["aa-zz"]["n"] == 20
    assert (tmp_path / "predictions" / "ood" / "hts.parquet").is_file()
    bounds = model_evaluation.pipeline_bounds(pipe)
    calibration, _, n_eff = model_evaluation.served_calibration(pipe, settings, tmp_path / "calibration", "hts", bounds)
    ood_table = pd.read_parquet(tmp_path / "predictions" / "ood" / "hts.parquet")
    test_table = pd.read_parquet(tmp_path / "predictions" / "test" / "hts.parquet")
    full = {}
    for split, table in (("test", test_table), ("ood", ood_table)):
        sigma_table = model_evaluation.with_model_sigma(table, "hts")
        full[split] = model_evaluation.measure(
            calibration, model_evaluation.ask(calibration, sigma_table, settings, bounds), sigma_table, settings, dev_n_eff=n_eff
        )
    at_once = served_summary(full["test"], full["ood"], served=calibration.selected, rule=settings.calibration_rule,
                             known_lps=calibration.known_lps)
    completed = with_held_out(conditional, held_out)["hts"]
    assert completed["held_out"] == at_once["held_out"]
    goal = {g["key"]: g for g in completed["goals"]}["unseen_coverage_error"]
    assert goal == {g["key"]: g for g in at_once["goals"]}["unseen_coverage_error"] and goal["value"] is not None
    assert {g["key"]: g for g in conditional["hts"]["goals"]}["unseen_coverage_error"]["note"].startswith("measured after register")
    assert conditional["hts"]["held_out_pending"] is True and "held_out_pending" not in completed
    # fits of other rows (here: another standardisation) are refused, naming the file
    stored = json.loads((fits / "hts.json").read_text())
    stored["standardizer"]["global"]["pred_mean"] += 1.0
    (fits / "hts.json").write_text(json.dumps(stored))
    with pytest.raises(DataError, match=r"candidates/hts\.json: dev\+d_e/hts: the stored candidate fits were fitted on other rows"):
        model_evaluation.evaluate_models(refitted, settings, EncodeConfig(), tmp_path / "calibration", lolo.out_dir)

    # exp_sigma_weights: the re-check makes the calibrate stage's choices again, number for number,
    # for the models whose weight is pinned
    from uamt.experiments import sigma_weights as exp_sigma_weights

    check = exp_sigma_weights.SigmaWeightSettings(weights=(0.0, 1.0), metrics_dir=str(tmp_path / "exp"))
    calibration_dir = tmp_path / "calibration"
    hts_weight = dev["hts"]["sigma_weight"]["chosen"]
    as_chosen = dataclasses.replace(settings, pinned_sigma_weights={"hts": hts_weight, "dup": 0.0, "point": 0.0})
    result = exp_sigma_weights.check_sigma_weights(check, pipe, as_chosen, EncodeConfig(), calibration_dir, lolo.out_dir)
    assert set(result["models"]) == {"hts", "dup"}  # the point model has no σ to weigh
    for method, rechecked in result["models"].items():
        assert rechecked["seen"] == {"weights": dev[method]["sigma_weight"]["weights"], "chosen": dev[method]["sigma_weight"]["chosen"]}
    assert result["models"]["dup"]["unseen"] is None  # no leave-one-LP-out models: no unseen choice
    rechecked = result["models"]["hts"]
    assert rechecked["unseen"]["weights"] == unseen["sigma_weight"]["weights"] and rechecked["unseen"]["chosen"] == chosen
    assert rechecked["served"] == {"seen": hts_weight, "unseen": chosen}
    assert rechecked["agrees"] and result["disagree"] == []
    # HTS pinned to the weight the grid did not choose: served as pinned (unseen pairs too, nothing
    # tried), DUP still chooses, and the re-check of HTS says the pin is no longer chosen
    other = 1.0 - hts_weight
    pinned = dataclasses.replace(settings, pinned_sigma_weights={"hts": other})
    model_evaluation.calibrate_models(pipe, pinned, EncodeConfig(), calibration_dir, lolo.out_dir)
    repinned = json.loads((tmp_path / "metrics" / "dev.json").read_text())
    if other != 1.0:  # weight 1 alone: the model's own σ, nothing recorded
        assert repinned["hts"]["sigma_weight"] == {"weights": {}, "chosen": other, "pinned": True}
        assert repinned["hts"]["unseen_lp"]["sigma_weight"] == {"weights": {}, "chosen": other, "in_domain": other, "pinned": True}
    assert repinned["dup"]["sigma_weight"] == dev["dup"]["sigma_weight"]
    paths = exp_sigma_weights.write_findings(check, pipe, pinned, EncodeConfig(), calibration_dir, lolo.out_dir)
    result = json.loads(paths["result"].read_text())
    assert set(result["models"]) == {"hts"} and result["disagree"] == ["hts"]
    assert result["pinned"] == {"hts": other} and result["weights"] == [0.0, 1.0]
    assert result["models"]["hts"]["served"] == {"seen": other, "unseen": other}
    assert result["models"]["hts"]["seen"]["weights"] == dev["hts"]["sigma_weight"]["weights"]
    section = exp_sigma_weights.render(result)
    assert "1 of 1 models would now be served another weight: hts" in section and f"| hts | {other} ({other}) |" in section
    with pytest.raises(ValueError, match=r"pinned_sigma_weights.htss not supported; pin models from \[.*'hts_qe'"):
        model_evaluation.calibrate_models(pipe, dataclasses.replace(settings, pinned_sigma_weights={"htss": 0.0}), EncodeConfig(), calibration_dir, lolo.out_dir)
