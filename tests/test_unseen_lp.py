"""Language pairs the model never saw: offline detection, the leave-one-LP-out sigma factor, widening."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from uamt.calibrated import Calibration, fit_unseen_lp_sigma_factor
from uamt.errors import UamtError
from uamt.langid import detect_language, detect_pair
from uamt.uncertainty import (
    AffineVarianceCalibrator,
    FixedVarianceCalibrator,
    Standardizer,
    evaluate_predictions,
)

GERMAN = ["Das Haus ist sehr groß und alt.", "Ich habe heute keine Zeit für dich.", "Wir fahren morgen nach Berlin."]
ENGLISH = ["The house is very big and old.", "I have no time for you today.", "We are driving to Berlin tomorrow."]


def test_detect_pair_on_real_sentences():
    pair = detect_pair(GERMAN * 5, ENGLISH * 5)
    assert pair.lp == "de-en"
    assert pair.source.share == pytest.approx(1.0) and pair.source.n_lines == 15
    assert "de (100% of 15 lines)" in pair.describe()


def test_mixed_file_gives_no_pair_and_empty_file_refuses():
    mixed = detect_language(GERMAN + ENGLISH + ["这是一个关于天气的测试句子。", "Это тест о погоде сегодня."])
    assert not mixed.clear
    assert detect_pair(GERMAN + ENGLISH + ["这是一个测试。", "Это тест."], ENGLISH).lp is None
    with pytest.raises(ValueError, match="no non-empty line"):
        detect_language(["", "   "])


def _calibration(factor: float = 1.0) -> Calibration:
    standardizer, affine, fixed = Standardizer(), AffineVarianceCalibrator(), FixedVarianceCalibrator()
    standardizer.global_params = {"human_mean": 0.0, "human_std": 1.0, "pred_mean": 0.0, "pred_std": 1.0}
    standardizer.lp_params = {"en-de": dict(standardizer.global_params)}
    affine.global_params = {"alpha": 1.0, "beta": 0.0, "var_floor": 1e-6}
    fixed.global_params = {"var": 1.0}
    return Calibration(standardizer, affine, fixed, None, unseen_lp_sigma_factor=factor)


def test_unseen_lp_rows_are_widened_and_seen_rows_are_not():
    calibration = _calibration(1.5)
    lp = np.array(["en-de", "xx-yy", "en-de"], dtype=object)
    _, sigma = calibration.apply(np.zeros(3), np.ones(3), lp)
    np.testing.assert_allclose(sigma, [1.0, 1.5, 1.0])
    assert calibration.unseen_lps(lp) == ["xx-yy"]
    assert calibration.unseen_lps(None) == [] and calibration.unseen_lps("en-de") == []
    _, no_lp = calibration.apply(np.zeros(2), np.ones(2), None)  # no LP given: the global fit, unwidened
    np.testing.assert_allclose(no_lp, [1.0, 1.0])
    low, high = calibration.interval(np.zeros(3), np.ones(3), 0.9, lp)
    np.testing.assert_allclose((high - low)[1] / (high - low)[0], 1.5)
    risk = calibration.risk(np.zeros(3), np.ones(3), -1.0, lp)
    assert risk[1] > risk[0]  # risk comes from the same widened distribution


def test_factor_round_trips_and_corrupt_factor_is_refused(tmp_path):
    path = tmp_path / "calibration.json"
    _calibration(1.25).save(path)
    assert Calibration.load(path).unseen_lp_sigma_factor == 1.25
    _calibration(0.5).save(path)
    with pytest.raises(UamtError, match="unseen_lp_sigma_factor = 0.5 must be a finite number >= 1"):
        Calibration.load(path)


def _dev_table(rng, scales: dict[str, float], n: int = 400) -> pd.DataFrame:
    """Dev predictions whose error scale differs per LP (sigma carries no per-row signal)."""
    frames = []
    for lp, scale in scales.items():
        mu = rng.normal(size=n)
        frames.append(
            pd.DataFrame({"lp": lp, "mu": mu, "sigma": 1.0, "human": mu + rng.normal(scale=scale, size=n)})
        )
    return pd.concat(frames, ignore_index=True)


def _fit(table: pd.DataFrame) -> Calibration:
    result = evaluate_predictions(table, table, pred_source="dev", dev_source="dev")
    return Calibration.from_result(result["calibration"])


def test_leave_one_lp_out_factor_covers_held_out_lps_on_average():
    """The factor is what held-out LPs need *on average* (each LP weighing the same), not the worst
    of a few noisy LPs: an unseen pair is then covered at the nominal level in expectation."""
    from uamt.calibrated import needed_widening

    rng = np.random.default_rng(0)
    table = _dev_table(rng, {"aa-bb": 1.0, "cc-dd": 1.0, "ee-ff": 3.0})
    factor, needed = fit_unseen_lp_sigma_factor(table, _fit)
    assert set(needed) == {"aa-bb", "cc-dd", "ee-ff"}
    assert needed["ee-ff"] > 1.3 > needed["aa-bb"]  # the noisy LP needed wider intervals than global
    assert min(needed.values()) < factor < max(needed.values())
    coverages = []
    for lp in needed:
        calibration = _fit(table[table.lp != lp])
        coverages.append(np.mean(needed_widening(calibration, table[table.lp == lp], 0.9) <= factor))
    assert np.mean(coverages) == pytest.approx(0.9, abs=0.005)
    # Held out, the noisy LP is covered at about the nominal level once widened by its own factor.
    held, rest = table[table.lp == "ee-ff"], table[table.lp != "ee-ff"]
    calibration = _fit(rest)
    calibration.unseen_lp_sigma_factor = needed["ee-ff"]
    lower, upper = calibration.interval(held.mu.to_numpy(), held.sigma.to_numpy(), 0.9, held.lp.to_numpy(dtype=object))
    coverage = np.mean((held.human.to_numpy() >= lower) & (held.human.to_numpy() <= upper))
    assert coverage == pytest.approx(0.9, abs=0.01)


def test_factor_is_one_with_a_single_lp_and_never_below_one():
    rng = np.random.default_rng(1)
    assert fit_unseen_lp_sigma_factor(_dev_table(rng, {"aa-bb": 1.0}), _fit) == (1.0, {})
    factor, needed = fit_unseen_lp_sigma_factor(_dev_table(rng, {"aa-bb": 1.0, "cc-dd": 1.0}), _fit)
    assert factor >= 1.0 and len(needed) == 2


def test_choose_language_pair_given_detected_unseen_and_undetermined():
    from uamt.scoring.language_pair import choose_language_pair

    known = ("en-de", "zh-en")
    given = choose_language_pair(GERMAN, ENGLISH, "en-de", known, sigma_factor=1.3)
    assert given.lp == "en-de" and given.how == "given" and not given.unseen and given.messages() == []
    detected = choose_language_pair(GERMAN * 3, ENGLISH * 3, None, known, sigma_factor=1.3)
    assert detected.lp == "de-en" and detected.how == "detected" and detected.unseen
    unseen, how = detected.messages()
    assert "de-en was never seen in training" in unseen and "en-de, zh-en" in unseen and "x1.30" in unseen
    assert how.startswith("detected language pair de-en: source de")
    assert detected.to_summary() == {"lp": "de-en", "lp_source": "detected", "lp_seen_in_training": False}
    mixed = choose_language_pair(GERMAN + ENGLISH + ["这是一个测试。", "Это тест."], ENGLISH, None, known)
    assert mixed.lp is None and mixed.how == "undetermined" and "global calibration" in mixed.messages()[0]
    assert choose_language_pair(GERMAN, ENGLISH, None, ()).lp is None  # no per-LP calibration: no detection


def test_served_conformal_risk_is_widened_like_its_interval():
    """The conformal branch of ``risk`` used to skip the unseen-LP factor its interval applies."""
    from uamt.calibrated import fit_calibration
    from uamt.uncertainty import EvaluationSettings

    rng = np.random.default_rng(3)
    table = _dev_table(rng, {"aa-bb": 1.0, "cc-dd": 1.5})
    settings = EvaluationSettings(calibration="mondrian_conformal")
    calibration, _ = fit_calibration(table, settings=settings)
    assert calibration.selected == "mondrian_conformal"
    lp = np.array(["aa-bb", "xx-yy"], dtype=object)
    mu, sigma = np.zeros(2), np.ones(2)
    plain = calibration.risk(mu, sigma, -2.0, lp)
    calibration.unseen_lp_sigma_factor = 1.5
    widened = calibration.risk(mu, sigma, -2.0, lp)
    assert widened[0] == pytest.approx(plain[0]) and widened[1] > plain[1]


def test_calibrate_stage_fits_and_writes_the_unseen_lp_factor(tmp_path, monkeypatch):
    """``calibrate_models`` stores each model's leave-one-LP-out factor (>= 1) in its calibration
    file and in ``metrics/dev.json`` beside the per-LP metrics (the models' dev predictions faked)."""
    import json

    from uamt import model_evaluation
    from uamt.pipeline import PipelineConfig
    from uamt.uncertainty import EvaluationSettings

    rng = np.random.default_rng(4)
    table = _dev_table(rng, {"aa-bb": 1.0, "cc-dd": 1.0, "ee-ff": 2.5}, n=150)
    monkeypatch.setattr(model_evaluation, "read_split", lambda *a, **k: table)
    monkeypatch.setattr(model_evaluation, "open_features", lambda encode: None)
    monkeypatch.setattr(model_evaluation, "predict_split", lambda *a, **k: table)
    monkeypatch.setattr(model_evaluation, "fit_reference_factors", lambda *a, **k: {})
    pipe = PipelineConfig(methods=("point", "hts"), dup_base="point", qe_methods=(), register_qe_method=None,
                          metrics_dir=str(tmp_path / "metrics"))  # fmt: skip
    monkeypatch.setattr(PipelineConfig, "all_methods", property(lambda self: ("point", "hts")))
    paths = model_evaluation.calibrate_models(pipe, EvaluationSettings(), None, tmp_path / "calibration")
    dev = json.loads((tmp_path / "metrics" / "dev.json").read_text())
    for method in ("point", "hts"):
        factor = Calibration.load(paths[method]).unseen_lp_sigma_factor
        unseen = dev[method]["unseen_lp"]
        assert factor == unseen["sigma_factor"] and factor >= 1.0
        assert set(unseen["held_out"]) == {"aa-bb", "cc-dd", "ee-ff"}
        assert unseen["held_out"]["ee-ff"] > 1.2 > unseen["held_out"]["aa-bb"]  # the noisy LP drives it
        assert {"avg", "aa-bb", "cc-dd", "ee-ff"} <= set(dev[method])  # the metrics stay
