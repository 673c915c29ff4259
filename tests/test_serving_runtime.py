"""The registered model's encoder runtime (register.serving_runtime): an ONNX export shipped inside the
pyfunc scores like the torch encoder, and scoring with it imports neither transformers, unbabel-comet
nor pytorch-lightning (seconds of `uamt score` start-up)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mlflow
from tests.fakes import FEATURES
from tests.test_models import make_table
from uamt.core.errors import UamtError
from uamt.encoders import EncoderConfig, get_encoder
from uamt.models import TrainConfig, features_from_encoder, train
from uamt.registry.register import RegisterSettings, export_serving_encoder, serving_runtime

REPO_ROOT = Path(__file__).resolve().parents[1]
CFG = TrainConfig(hidden_sizes=(16,), max_epochs=1, batch_size=16, patience=1)
SUBJECTS = ("The committee", "A small dog", "Our new system", "The old bridge", "Every student")
VERBS = ("approved", "barked at", "translated", "crossed", "read")
OBJECTS = ("the proposal.", "the postman.", "the whole report.", "the river at night.", "a long book.")


def sentence_table(n: int, seed: int) -> pd.DataFrame:
    """``n`` rows of short English sentences (the MiniLM vocabulary), scores from a fixed rule."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        words = [p[rng.integers(len(p))] for p in (SUBJECTS, VERBS, OBJECTS)]
        ref = " ".join(words)
        mt = " ".join(words[::-1]) if i % 3 == 0 else ref.replace("the", "a")
        score = -5.0 * (i % 3 == 0) - rng.random()
        rows.append({"lp": "en-de", "src": f"{ref} ({i})", "mt": mt, "ref": ref, "score": score})
    return pd.DataFrame(rows)


def test_unknown_serving_runtime_is_refused():
    with pytest.raises(ValueError, match=r"register.serving_runtime='tensorrt' not supported; choose from"):
        RegisterSettings(serving_runtime="tensorrt")


def test_models_that_need_the_torch_encoder_are_served_with_torch(tmp_path, caplog):
    hts = train("hts", CFG, make_table(64, 1), make_table(32, 2), FEATURES, tmp_path / "hts")
    full = train("mcd_full", CFG.replace(mc_samples=2), make_table(64, 1), make_table(32, 2), FEATURES, tmp_path / "f")
    minilm = EncoderConfig()
    assert serving_runtime("onnx", minilm, hts) == "onnx"
    assert serving_runtime("torch", minilm, hts) == "torch"
    assert serving_runtime("onnx", EncoderConfig(name="use"), hts) == "torch"
    assert serving_runtime("onnx", minilm, full) == "torch"
    assert "MC dropout through the encoder; served with runtime torch" in caplog.text
    int8 = EncoderConfig(runtime="onnx-int8")
    assert serving_runtime("onnx-int8", int8, hts) == "onnx-int8"


@pytest.mark.parametrize(("requested", "trained_on"), [("onnx", "onnx-int8"), ("torch", "onnx-int8"), ("onnx-int8", "onnx")])
def test_serving_other_embeddings_than_trained_on_is_refused(tmp_path, requested, trained_on):
    """int8 and float32 embeddings differ by ~0.2: the served mu would not be the evaluated mu."""
    with pytest.raises(UamtError, match=rf"serving_runtime='{requested}' would serve other embeddings.*runtime='{trained_on}'"):
        serving_runtime(requested, EncoderConfig(runtime=trained_on), tmp_path / "never-read")


@pytest.fixture(scope="module")
def served(tmp_path_factory, one_torch_thread):
    """One hts model on real MiniLM embeddings, saved as a pyfunc three times: torch; the ONNX
    encoder and the ONNX network, as register ships it; and the ONNX encoder alone (models registered
    before the network was exported)."""
    from uamt.serving.calibrated_predictor import ENCODER_ARTIFACT, HEAD_ARTIFACT, scale_for, write_spec
    from uamt.serving.mlflow_pyfunc import UamtPyfunc
    from uamt.serving.model_calibration import Calibration
    from uamt.serving.onnx_head import export_head
    from uamt.uncertainty import AffineVarianceCalibrator, FixedVarianceCalibrator, Standardizer

    root = tmp_path_factory.mktemp("served")
    encoder_cfg = EncoderConfig(batch_size=16)
    features = features_from_encoder(get_encoder(encoder_cfg))
    model_dir = train("hts", CFG, sentence_table(64, 1), sentence_table(32, 2), features, root / "hts")
    standardizer, affine, fixed = Standardizer(), AffineVarianceCalibrator(), FixedVarianceCalibrator()
    standardizer.global_params = {"human_mean": -2.0, "human_std": 2.0, "pred_mean": -2.0, "pred_std": 2.0}
    affine.global_params = {"alpha": 1.0, "beta": 0.0, "var_floor": 1e-6}
    fixed.global_params = {"var": 1.0}
    Calibration(standardizer, affine, fixed, None).save(root / "calibration.json")
    folders = {}
    exported = export_serving_encoder(encoder_cfg, "onnx", root / "encoder-onnx")
    head = export_head(model_dir, root / "head")
    for runtime in ("torch", "onnx", "onnx-without-head"):
        artifacts = {"model": str(model_dir), "calibration": str(root / "calibration.json")}
        if runtime != "torch":
            artifacts[ENCODER_ARTIFACT] = str(exported)
        if runtime == "onnx":
            artifacts[HEAD_ARTIFACT] = str(head)
        spec = write_spec(
            root / f"spec-{runtime}.json",
            dataclasses.replace(encoder_cfg, runtime=runtime.removesuffix("-without-head")),
            scale_for(("wmt21_mqm",)),
            "hts",
            ("wmt21_mqm",),
        )
        folders[runtime] = root / f"pyfunc-{runtime}"
        mlflow.pyfunc.save_model(
            str(folders[runtime]),
            python_model=UamtPyfunc(),
            artifacts={**artifacts, "spec": str(spec)},
            pip_requirements=["mlflow"],
        )
    return folders


def test_onnx_served_model_scores_like_torch(served):
    from uamt.serving.predictor import load_predictor

    frame = sentence_table(24, 3)[["src", "mt", "ref"]]
    long_text = "a very long sentence " * 200
    frame.loc[5, "mt"] = long_text
    outs = {}
    for runtime, folder in served.items():
        predictor = load_predictor(str(folder))
        assert predictor.encoder.encoder_id.endswith("+ort") == (runtime != "torch")
        assert type(predictor.model).__name__ == ("OnnxHeadModel" if runtime == "onnx" else "SingleModel")
        outs[runtime] = predictor.predict_frame(frame, confidence=0.9, risk_threshold=-5.0)
        assert predictor.truncated(frame["mt"].tolist()) == [5]
    for column in ("mu", "sigma", "lower", "upper", "risk"):
        np.testing.assert_allclose(outs["onnx"][column], outs["torch"][column], atol=1e-4, err_msg=column)
        # the same embeddings through the exported network or through torch's
        np.testing.assert_allclose(outs["onnx"][column], outs["onnx-without-head"][column], atol=1e-5, err_msg=column)


def test_a_model_registered_on_a_gpu_scores_on_a_cpu(served, tmp_path, caplog, monkeypatch):
    """A pipeline run with ``encode.encoder.device: cuda`` registers that device in the spec; where
    torch sees no CUDA device the predictor runs the encoder on the CPU (logged), with the same
    scores, instead of failing in torch."""
    import shutil

    import torch

    from uamt.serving.predictor import load_predictor

    folder = tmp_path / "pyfunc-cuda"
    shutil.copytree(served["torch"], folder)
    spec_path = folder / "artifacts" / "spec-torch.json"
    spec = json.loads(spec_path.read_text())
    spec["encoder"]["device"] = "cuda"
    spec_path.write_text(json.dumps(spec))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    frame = sentence_table(8, 4)[["src", "mt", "ref"]]
    with caplog.at_level("WARNING", logger="uamt.serving.calibrated_predictor"):
        predictor = load_predictor(str(folder))
    assert predictor.encoder.config.device == "cpu"
    assert "registered to run on 'cuda'; torch sees no CUDA device here" in caplog.text
    expected = load_predictor(str(served["torch"])).predict_frame(frame, confidence=0.9, risk_threshold=-5.0)
    pd.testing.assert_frame_equal(predictor.predict_frame(frame, confidence=0.9, risk_threshold=-5.0), expected)


@pytest.mark.parametrize(
    ("runtime", "heavy"),
    [
        ("onnx", ("transformers", "comet", "pytorch_lightning", "torchmetrics", "torch", "sklearn")),
        ("onnx-without-head", ("transformers", "comet", "pytorch_lightning", "torchmetrics")),
    ],
)
def test_onnx_served_model_loads_without_transformers_comet_or_lightning(served, tmp_path, runtime, heavy):
    """With the encoder and the network exported, scoring imports no torch (~190 MB, ~1.3 s) and no
    scikit-learn; with the encoder alone, torch runs the network."""
    code = (
        "import sys, json, pandas as pd;"
        "from uamt.serving.predictor import load_predictor;"
        f"p = load_predictor({str(served[runtime])!r});"
        "out = p.predict_frame(pd.DataFrame({'src': ['Ein Test.'], 'mt': ['A test.'], 'ref': ['A test.']}),"
        " confidence=0.9, risk_threshold=-5.0);"
        f"heavy = {heavy!r};"
        "print(json.dumps({'loaded': sorted(m for m in heavy if m in sys.modules), 'n': len(out)}))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "src")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"loaded": [], "n": 1}


def _load_in_subprocess(model: str, env: dict, cwd: Path) -> dict:
    code = (
        "import sys, json; from uamt.serving.predictor import load_predictor;"
        f"p = load_predictor({model!r});"
        "print(json.dumps({'mlflow': 'mlflow' in sys.modules, 'onnx': p.encoder.encoder_id.endswith('+ort')}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_registered_alias_is_resolved_once_per_registry_state(served, tmp_path):
    """models:/NAME@champion: the first load asks MLflow's store; while the SQLite store is unchanged
    the next ones load the remembered folder without importing MLflow; moving the alias (a registry
    write) makes the next load ask again, and it gets the new version."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment("serving", artifact_location=(tmp_path / "artifacts").as_uri())
    client.create_registered_model("served")
    for runtime in ("torch", "onnx"):
        run = client.create_run(experiment)
        client.log_artifacts(run.info.run_id, str(served[runtime]), "model")
        source = f"{run.info.artifact_uri}/model"
        client.create_model_version("served", source=source, run_id=run.info.run_id)
    client.set_registered_model_alias("served", "champion", "1")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "src")]),
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_REGISTRY_URI": uri,  # MLflow exports the registry URI of earlier tests to the environment
        "UAMT_CACHE_DIR": str(tmp_path / "cache"),
    }
    first = _load_in_subprocess("models:/served@champion", env, tmp_path)
    again = _load_in_subprocess("models:/served@champion", env, tmp_path)
    assert first == {"mlflow": True, "onnx": False} and again == {"mlflow": False, "onnx": False}
    client.set_registered_model_alias("served", "champion", "2")
    moved = _load_in_subprocess("models:/served@champion", env, tmp_path)
    assert moved == {"mlflow": True, "onnx": True}
