"""A new uncertainty method is its module, one spec line and its test: this file defines a method
(Laplace regression) and registers its spec only here, then runs it through the pipeline's train ->
calibrate -> evaluate library calls on a synthetic slice, without any other file knowing its name."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from tests.fakes import FEATURES
from tests.test_models import make_table
from uamt.models import specs
from uamt.models.base import Estimator
from uamt.models.specs import MethodSpec


class LaplaceEstimator(Estimator):
    """Laplace regression: the head gives mu and log b, trained with the Laplace negative
    log-likelihood |y - mu| / b + log b; its variance is 2 b^2."""

    out_dim = 2
    has_variance_output = True

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        mu, log_b = output[..., 0], output[..., 1]
        return (torch.abs(batch["y"] - mu) * torch.exp(-log_b) + log_b).mean()

    def predict_distribution(self, batch: dict, n_samples: int | None = None) -> dict[str, torch.Tensor]:
        output = self(batch)
        mu, log_b = output[..., 0], output[..., 1].clamp(-15.0, 15.0)
        var = 2.0 * torch.exp(2.0 * log_b)
        return {"mu": mu, "var": var, "aleatoric": var}


LAPLACE = MethodSpec("laplace", LaplaceEstimator, "network", label="Laplace", cost_label="Laplace")


def split_table(n: int, seed: int, dataset: str):
    """``make_table`` rows as a prepared split: two LPs, MQM-like scores (<= 0)."""
    table = make_table(n, seed).assign(dataset=dataset)
    table["lp"] = np.where(np.arange(n) % 2 == 0, "en-de", "zh-en")
    table["score"] = -np.abs(table["score"])
    table["refs"] = [[ref] for ref in table["ref"]]
    return table


@pytest.fixture
def laplace_registered(monkeypatch):
    monkeypatch.setitem(specs.METHODS, LAPLACE.name, LAPLACE)
    return monkeypatch


@pytest.mark.slow
def test_a_method_defined_here_trains_calibrates_and_evaluates(tmp_path, laplace_registered):
    import uamt.model_evaluation as model_evaluation
    from uamt.encoders import EncodeConfig
    from uamt.models import TrainConfig, load, train
    from uamt.models.shared_training import train_methods
    from uamt.pipeline_config import PipelineConfig
    from uamt.uncertainty import EvaluationSettings

    prepared = tmp_path / "prepared"
    prepared.mkdir()
    splits = {
        "d_q": split_table(240, 1, "wmt21_mqm"),
        "d_e": split_table(160, 5, "wmt21_mqm"),
        "dev": split_table(120, 2, "wmt21_mqm"),
        "test": split_table(80, 3, "wmt21_mqm"),
        "ood": split_table(60, 4, "ted_mqm"),
    }
    for name, table in splits.items():
        table.to_parquet(prepared / f"{name}.parquet", index=False)
    pipe = PipelineConfig(
        methods=("point", "laplace"),
        register_method="laplace",
        qe_methods=(),
        register_qe_method=None,
        **{f"{k}_dir": str(tmp_path / k) for k in ("models", "predictions", "metrics", "plots")},
        prepared_dir=str(prepared),
    )
    cfg = TrainConfig(hidden_sizes=(16,), max_epochs=2, batch_size=16, patience=2)

    # train: the pipeline's single-stage methods, then the second-stage ones over dup_base
    trained = train_methods(pipe.methods, cfg, splits["d_q"], splits["dev"], FEATURES, pipe.model_dir)
    for method in pipe.second_stage_methods:
        train(method, dataclasses.replace(cfg, train_split="d_e"), splits["d_e"], splits["dev"], FEATURES, pipe.model_dir(method),
              base_model_dir=pipe.model_dir(pipe.dup_base))
    model = load(trained["laplace"])
    assert model.method == "laplace" and isinstance(model.module, LaplaceEstimator)
    assert (model.predict(splits["test"], FEATURES)["sigma"] > 0).all()

    # calibrate and evaluate: the stages' library calls, on the fake encoder's features
    laplace_registered.setattr(model_evaluation, "open_features", lambda encode: FEATURES)
    settings = EvaluationSettings(calibration_splits=("dev", "d_e"))
    calibrations = model_evaluation.calibrate_models(pipe, settings, EncodeConfig(), tmp_path / "calibration")
    model_evaluation.evaluate_models(pipe, settings, EncodeConfig(), tmp_path / "calibration")

    assert calibrations["laplace"].is_file()
    dev = json.loads((tmp_path / "metrics" / "dev.json").read_text())
    served = dev["laplace"]["served"]
    assert served != "fixed_variance"  # it has a sigma of its own, so it is not calibrated as the point
    assert f"point+{served}" in dev  # judged against the point estimate + the same calibration
    # calibrated on every split it never trained on: DUP's error model trained on d_e
    assert dev["laplace"]["calibrated_on"] == ["dev", "d_e"] and dev["laplace"]["n_calibration_rows"] == 280
    assert dev["dup"]["calibrated_on"] == ["dev"] and dev["dup"]["n_calibration_rows"] == 120
    assert json.loads(calibrations["dup"].read_text())["calibrated_on"] == ["dev"]
    assert (tmp_path / "predictions" / "d_e" / "laplace.parquet").is_file()
    assert not (tmp_path / "predictions" / "d_e" / "dup.parquet").exists()
    if dev["dup"]["served"] != "fixed_variance":  # its baseline is fitted on the same rows: dev
        assert f"point+{dev['dup']['served']}@dev" in dev
    test = json.loads((tmp_path / "metrics" / "test.json").read_text())
    assert set(test) == {"point", "laplace", *pipe.second_stage_methods}
    for key in ("pps", "ece", "crps", "sharpness"):
        assert np.isfinite(test["laplace"]["avg"][key]), key
    assert test["laplace"]["avg"]["ups_raw"] is not None
    conditional = json.loads((tmp_path / "metrics" / "conditional.json").read_text())
    assert conditional["laplace"]["baseline"]["name"] == f"point+{served}"


def test_the_registry_refuses_a_method_it_does_not_hold(laplace_registered):
    assert specs.get_spec("laplace") is LAPLACE
    laplace_registered.undo()
    with pytest.raises(ValueError, match=r"method='laplace' not supported; choose from \['dup', "):
        specs.get_spec("laplace")
