"""The network exported to ONNX (uamt.serving.onnx_head): the same predictions as torch for every
deterministic method, refused for the sampling ones, tied to its checkpoint, and loaded without torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fakes import FEATURES, make_embed
from tests.test_models import make_table
from uamt.core.errors import DataError, UamtError
from uamt.models import FeatureSource, TrainConfig, load, train
from uamt.serving.onnx_head import (
    CHECKPOINT_WEIGHTS,
    META_FILE,
    MODEL_FILE,
    export_head,
    export_refusal,
    load_onnx_head,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
CFG = TrainConfig(hidden_sizes=(16, 8), max_epochs=1, batch_size=16, patience=1, predict_batch_size=7)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_torch_thread):
    root = tmp_path_factory.mktemp("heads")
    models = {}
    for method, cfg in (
        ("hts", CFG),
        ("point", CFG),
        ("kl", CFG),
        ("hts", CFG.replace(reference_free=True, layer_transformation="sparsemax")),
    ):
        name = method + ("_qe" if cfg.reference_free else "")
        models[name] = train(method, cfg, make_table(64, 1), make_table(32, 2), FEATURES, root / name)
    return root, models


@pytest.mark.parametrize("name", ["hts", "point", "kl", "hts_qe"])
def test_exported_network_predicts_like_torch(trained, name):
    root, models = trained
    folder = export_head(models[name], root / f"head-{name}")
    head = load_onnx_head(folder, models[name])
    rows = make_table(40, 3)  # 40 rows in batches of 7: the last batch is short
    if name.endswith("_qe"):
        rows = rows.drop(columns="ref")
    want = load(models[name]).predict(rows, FEATURES)
    got = head.predict(rows, FEATURES)
    assert list(got.columns) == list(want.columns)
    for column in want.columns:
        np.testing.assert_allclose(got[column], want[column], rtol=1e-5, atol=1e-6, err_msg=column)
    meta = json.loads((folder / META_FILE).read_text())
    assert meta["method"] == name.removesuffix("_qe") and meta["max_error"] <= 1e-4
    assert head.cfg == load(models[name]).cfg


def test_point_network_keeps_a_nan_sigma(trained):
    root, models = trained
    head = load_onnx_head(export_head(models["point"], root / "head-point-nan"), models["point"])
    assert np.isnan(head.predict(make_table(5, 4), FEATURES)["sigma"]).all()


def test_sampling_and_composite_methods_are_not_exported(tmp_path, caplog, one_torch_thread):
    table, dev = make_table(48, 1), make_table(24, 2)
    mcd = train("mcd_head", CFG.replace(mc_samples=3), table, dev, FEATURES, tmp_path / "mcd")
    ensemble = train("ensemble", CFG.replace(ensemble_size=2), table, dev, FEATURES, tmp_path / "de")
    assert export_refusal(load(mcd)) == "method 'mcd_head' samples (MC dropout) at inference"
    assert export_refusal(load(ensemble)) == "method 'ensemble' is a ensemble of networks"
    caplog.set_level("INFO")
    assert export_head(mcd, tmp_path / "head-mcd") is None
    assert not (tmp_path / "head-mcd").exists()
    assert "no ONNX head (method 'mcd_head' samples" in caplog.text


def test_head_of_another_checkpoint_or_a_changed_file_is_refused(trained, tmp_path):
    root, models = trained
    folder = shutil.copytree(export_head(models["hts"], root / "head-hts-refuse"), tmp_path / "head")
    with pytest.raises(UamtError, match=rf"{CHECKPOINT_WEIGHTS}: sha256 .* another checkpoint"):
        load_onnx_head(folder, models["kl"])
    (folder / MODEL_FILE).write_bytes((folder / MODEL_FILE).read_bytes()[:-10])
    with pytest.raises(UamtError, match=rf"{MODEL_FILE}: sha256 .*corrupt or was replaced"):
        load_onnx_head(folder, models["hts"])
    (folder / MODEL_FILE).unlink()
    with pytest.raises(UamtError, match=rf"{MODEL_FILE}: missing"):
        load_onnx_head(folder)
    meta = json.loads((folder / META_FILE).read_text())
    del meta["outputs"]
    (folder / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(UamtError, match=r"head_meta.json: missing field\(s\) \['outputs'\]"):
        load_onnx_head(folder)
    (folder / META_FILE).unlink()
    with pytest.raises(UamtError, match=r"head_meta.json: missing; .* is not an exported network"):
        load_onnx_head(folder)


def test_features_of_another_encoder_are_refused(trained):
    root, models = trained
    head = load_onnx_head(export_head(models["hts"], root / "head-hts-enc"), models["hts"])
    with pytest.raises(DataError, match=r"trained on embeddings of encoder 'fake-encoder-000'.*'other-1'"):
        head.predict(make_table(3, 5), FeatureSource(FEATURES.fn, encoder_id="other-1"))
    with pytest.raises(DataError, match=r"features have \(num_layers, dim\) = \(4, 8\)"):
        head.predict(make_table(3, 5), FeatureSource(make_embed(4), encoder_id=None))
    with pytest.raises(DataError, match=r"row 1: column 'ref' is empty or null"):
        head.predict(make_table(3, 5).assign(ref=["a", None, "c"]), FEATURES)


def test_exported_network_runs_without_torch(trained):
    root, models = trained
    folder = export_head(models["hts"], root / "head-hts-notorch")
    code = (
        "import sys, json;"
        "from tests.fakes import FEATURES, synthetic_table;"
        "from uamt.serving.onnx_head import load_onnx_head;"
        f"out = load_onnx_head({str(folder)!r}, {str(models['hts'])!r}).predict(synthetic_table(5, 3), FEATURES);"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'sklearn': 'sklearn' in sys.modules, 'n': len(out)}))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "src")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"torch": False, "sklearn": False, "n": 5}


def test_models_package_loads_its_parts_on_first_use():
    code = (
        "import sys, json, uamt.models, uamt.models.data, uamt.models.config;"
        "before = 'torch' in sys.modules;"
        "names = {n: getattr(uamt.models, n).__module__ if hasattr(getattr(uamt.models, n), '__module__') else None"
        " for n in uamt.models.__all__};"
        "print(json.dumps({'before': before, 'after': 'torch' in sys.modules, 'n': len(names)}))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"before": False, "after": True, "n": 15}
    import uamt.models

    with pytest.raises(AttributeError, match=r"module 'uamt.models' has no attribute 'nothing'"):
        uamt.models.nothing  # noqa: B018


def test_checkpoint_weights_name_is_the_trainers():
    from uamt.models.api import WEIGHTS

    assert CHECKPOINT_WEIGHTS == WEIGHTS
