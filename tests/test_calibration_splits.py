"""Which rows a served calibration is fitted on: ``evaluate.calibration_splits`` less the splits each
model was trained on (read from its manifest and its base's), recorded in the artifact."""

from __future__ import annotations

import json

import pytest

from tests.test_unseen_lp import _calibration
from uamt.core.errors import DataError, UamtError
from uamt.model_evaluation import baseline_key, model_calibration_splits, training_splits
from uamt.models.api import FORMAT, MANIFEST
from uamt.pipeline_config import PipelineConfig
from uamt.serving.model_calibration import Calibration
from uamt.uncertainty import EvaluationSettings


def _manifest(folder, train_split: str, base: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "complete": True, "method": "x", "config": {"train_split": train_split}}
    if base:
        meta["base"] = base
    (folder / MANIFEST).write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "splits, message",
    [(("dev", "test"), "test and ood are only measured"), (("ood",), "calibration_splits"),
     (("dev", "dev"), "distinct"), ((), "one or more"), (("d_q",), "d_q trains every model")],
)
def test_settings_refuse_measured_unknown_repeated_or_no_splits(splits, message):
    with pytest.raises(ValueError, match=message):
        EvaluationSettings(calibration_splits=splits)


def test_a_model_is_never_calibrated_on_rows_it_or_its_base_trained_on(tmp_path):
    _manifest(tmp_path / "models" / "hts", "d_q")
    _manifest(tmp_path / "models" / "dup", "d_e", base="base")
    _manifest(tmp_path / "models" / "dup" / "base", "d_q")
    pipe = PipelineConfig(models_dir=str(tmp_path / "models"))
    settings = EvaluationSettings(calibration_splits=("dev", "d_e"))
    assert training_splits(tmp_path / "models" / "dup") == {"d_q", "d_e"}
    assert model_calibration_splits(pipe, "hts", settings) == ("dev", "d_e")
    assert model_calibration_splits(pipe, "dup", settings) == ("dev",)
    with pytest.raises(DataError, match=r"evaluate.calibration_splits \['d_e'\] leaves no rows to calibrate dup"):
        model_calibration_splits(pipe, "dup", EvaluationSettings(calibration_splits=("d_e",)))


def test_the_artifact_records_its_splits_and_old_files_read_as_dev(tmp_path):
    path = tmp_path / "calibration.json"
    calibration = _calibration()
    calibration.calibrated_on = ("dev", "d_e")
    calibration.save(path)
    assert Calibration.load(path).calibrated_on == ("dev", "d_e")
    data = json.loads(path.read_text())
    del data["calibrated_on"]  # written before the setting existed: fitted on dev
    path.write_text(json.dumps(data))
    assert Calibration.load(path).calibrated_on == ("dev",)
    path.write_text(json.dumps({**data, "calibrated_on": "dev"}))
    with pytest.raises(UamtError, match="calibrated_on must be a non-empty list"):
        Calibration.load(path)


def test_a_baseline_fitted_on_fewer_splits_is_named_by_them():
    assert baseline_key("point", "conformal", ("dev", "d_e"), ("dev", "d_e")) == "point+conformal"
    assert baseline_key("point", "conformal", ("dev",), ("dev", "d_e")) == "point+conformal@dev"


def test_the_costliest_models_go_to_the_workers_first(tmp_path):
    """calibrate and evaluate hand out models with held-out models first, then by forward passes per
    row (the model's own mc_samples / ensemble_size) times calibration splits, ties in the
    pipeline's order."""
    from uamt.leave_one_lp_out import MANIFEST as LOLO_MANIFEST
    from uamt.model_evaluation import costliest_first

    models = tmp_path / "models"
    config = {"train_split": "d_q", "mc_samples": 30, "ensemble_size": 4}
    for name in ("point", "mcd_head", "ensemble", "hts", "kl", "hts_qe", "point_qe"):
        _manifest(models / name, "d_q")
        meta = json.loads((models / name / MANIFEST).read_text())
        (models / name / MANIFEST).write_text(json.dumps({**meta, "config": config}))
    _manifest(models / "dup", "d_e", base="base")
    _manifest(models / "dup" / "base", "d_q")
    lolo = tmp_path / "lolo"
    (lolo / "en-de" / "hts_qe").mkdir(parents=True)
    _manifest(lolo / "en-de" / "hts_qe", "d_q")
    (lolo / LOLO_MANIFEST).write_text(json.dumps({"models": ["hts_qe"], "held_out_lps": ["en-de"]}))
    pipe = PipelineConfig(
        models_dir=str(models), methods=("point", "mcd_head", "ensemble", "hts", "kl"), qe_methods=("hts", "point"),
        register_qe_method="hts",
    )
    settings = EvaluationSettings(calibration_splits=("dev", "d_e"))
    # hts_qe: held-out models; mcd_head: 30 passes x 2 splits; ensemble 4 x 2; dup 2 passes x dev only
    expected = ["hts_qe", "mcd_head", "ensemble", "point", "hts", "kl", "dup", "point_qe"]
    assert costliest_first(pipe, settings, lolo) == expected
    assert costliest_first(pipe, settings, None) == ["mcd_head", "ensemble", "point", "hts", "kl", "dup", "hts_qe", "point_qe"]
    # a model without a folder is ordered last and left to the stage's own call to name
    (models / "ensemble" / MANIFEST).unlink()
    assert costliest_first(pipe, settings, None)[-3:] == ["hts_qe", "point_qe", "ensemble"]
