"""uamt.models.row_features: surface features read by the head beside the COMET features."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.fakes import FEATURES
from uamt.core.errors import DataError
from uamt.models import TrainConfig, load, train
from uamt.models.row_features import SCALES, row_feature_matrix
from uamt.serving.onnx_head import export_head, export_refusal, load_onnx_head


def _frame(**columns) -> pd.DataFrame:
    return pd.DataFrame({"lp": "en-de", **columns})


def test_matrix_is_the_features_on_their_fixed_scales():
    frame = _frame(
        src=["Das ist gut.", "Hallo Welt"],
        mt=["Das ist gut.", "x"],
        ref=["Das ist gut.", "y" * 99],
    )
    names = ("chrf", "len_ratio_ref", "len_ratio_src", "copy_rate")
    out = row_feature_matrix(frame, names)
    assert out.dtype == np.float32 and out.shape == (2, 4)
    # row 0: the translation is the reference and the source: chrF 100 -> 1, equal lengths, all copied
    np.testing.assert_allclose(out[0], [1.0, 0.0, 0.0, 1.0], atol=1e-6)
    # row 1: log(2 / 100) = -3.91 is clipped to -3; log(2 / 11) = -1.70 is not
    assert out[1, 1] == pytest.approx(-SCALES["len_ratio_ref"][1])
    assert out[1, 2] == pytest.approx(math.log(2 / 11), rel=1e-6)
    assert out[1, 3] == 0.0


def test_unknown_or_reference_features_are_refused():
    with pytest.raises(ValueError, match=r"row_features='bleu' not supported; choose from \['chrf'"):
        TrainConfig(row_features=("bleu",))
    with pytest.raises(ValueError, match=r"row_features \['chrf'\] need a reference"):
        TrainConfig(reference_free=True, row_features=("chrf", "copy_rate"))
    with pytest.raises(ValueError, match=r"row_features set \['copy_rate', 'copy_rate'\] names 'copy_rate' twice"):
        TrainConfig(row_features=("copy_rate", "copy_rate"))
    assert TrainConfig(reference_free=True, row_features=("copy_rate",)).row_features == ("copy_rate",)


def test_a_missing_reference_is_named_with_its_row():
    frame = _frame(src=["a b", "c d"], mt=["a b", "e f"], ref=["a b", None])
    with pytest.raises(DataError, match=r"training split: row 1: column 'ref' is empty or null; row features \['chrf'\]"):
        row_feature_matrix(frame, ("copy_rate", "chrf"), "training split")
    with pytest.raises(DataError, match=r"table: row features \['len_ratio_ref'\] need column 'ref'"):
        row_feature_matrix(frame.drop(columns="ref"), ("len_ratio_ref",))
    assert row_feature_matrix(frame.drop(columns="ref"), ("copy_rate",)).shape == (2, 1)


def _cut_table(n: int, seed: int) -> pd.DataFrame:
    """Half the translations are cut to one word and score -10; embeddings (tests.fakes) are random
    per text, so only the length ratio tells the two apart."""
    rng = np.random.default_rng(seed)
    cut = rng.random(n) < 0.5
    full = [" ".join(f"t{seed}x{i}w{k}" for k in range(8)) for i in range(n)]
    return pd.DataFrame(
        {
            "dataset": "synthetic",
            "lp": "en-de",
            "seg_id": np.arange(n) + 1,
            "system": "s",
            "src": [f"quelle{seed} {i}" for i in range(n)],
            "mt": [text.split()[0] if c else text for text, c in zip(full, cut, strict=True)],
            "ref": [" ".join(f"r{seed}x{i}w{k}" for k in range(8)) for i in range(n)],
            "score": np.where(cut, -10.0, 0.0) + 0.3 * rng.normal(size=n),
        }
    )


@pytest.fixture(scope="module")
def cut_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("row_features")
    cfg = TrainConfig(hidden_sizes=(16,), max_epochs=8, batch_size=16, learning_rate=3e-3, patience=3)
    train_df, dev_df = _cut_table(240, 1), _cut_table(60, 2)
    return {
        "plain": train("hts", cfg, train_df, dev_df, FEATURES, root / "plain"),
        "len_ratio_ref": train("hts", cfg.replace(row_features=["len_ratio_ref"]), train_df, dev_df, FEATURES, root / "len"),
        "lp": train(
            "hts", cfg.replace(row_features=["len_ratio_ref", "target_language_prob"]), train_df, dev_df, FEATURES,
            root / "lp",
        ),
        "dup": train(
            "dup", cfg.replace(row_features=["len_ratio_ref"]), train_df, dev_df, FEATURES, root / "dup",
            base_model_dir=root / "plain",
        ),
    }


def test_the_head_reads_the_row_features(cut_models):
    test = _cut_table(80, 3)
    plain = load(cut_models["plain"]).predict(test, FEATURES)["mu"]
    read = load(cut_models["len_ratio_ref"]).predict(test, FEATURES)["mu"]
    assert np.corrcoef(read, test["score"])[0, 1] > 0.9
    assert abs(np.corrcoef(plain, test["score"])[0, 1]) < 0.5
    model = load(cut_models["len_ratio_ref"])
    assert model.module.head.ff[0].in_features == 6 * model.shape[1] + 1


def test_rows_without_the_columns_are_refused(cut_models):
    from uamt.models.data import encode_rows

    model = load(cut_models["len_ratio_ref"])
    rows = encode_rows(_cut_table(8, 4), FEATURES, reference_free=False)
    with pytest.raises(DataError, match=r"reads row features \['len_ratio_ref'\] but the batch has no column 'row:len_ratio_ref'"):
        model.predict_rows(rows)


def test_dup_on_a_base_without_row_features_predicts(cut_models):
    test = _cut_table(20, 5)
    out = load(cut_models["dup"]).predict(test, FEATURES)
    assert np.isfinite(out[["mu", "sigma"]].to_numpy()).all()


def test_a_head_that_reads_row_features_is_exported_and_predicts_like_torch(cut_models, tmp_path):
    assert export_refusal(load(cut_models["lp"])) is None
    head = load_onnx_head(export_head(cut_models["lp"], tmp_path / "head"), cut_models["lp"])
    assert sorted(item.name for item in head.session.get_inputs()) == ["mt", "ref", "rows", "src"]
    test = _cut_table(40, 9)
    want = load(cut_models["lp"]).predict(test, FEATURES)
    got = head.predict(test, FEATURES)
    for column in want.columns:
        np.testing.assert_allclose(got[column], want[column], rtol=1e-5, atol=1e-6, err_msg=column)
    assert np.corrcoef(got["mu"], test["score"])[0, 1] > 0.9  # it reads the length ratio
    with pytest.raises(DataError, match=r"column\(s\) \['lp'\] missing"):
        head.predict(test.drop(columns="lp"), FEATURES)


def test_a_head_that_reads_row_features_scores_without_torch(cut_models, tmp_path):
    # The served path: the ONNX head computes the row features with numpy, torch never loaded.
    repo = Path(__file__).resolve().parents[1]
    folder = export_head(cut_models["lp"], tmp_path / "head")
    test = _cut_table(12, 9)
    test.to_parquet(tmp_path / "rows.parquet")
    code = (
        "import sys, json;"
        "import pandas as pd;"
        "from tests.fakes import FEATURES;"
        "from uamt.serving.onnx_head import load_onnx_head;"
        f"rows = pd.read_parquet({str(tmp_path / 'rows.parquet')!r});"
        f"out = load_onnx_head({str(folder)!r}, {str(cut_models['lp'])!r}).predict(rows, FEATURES);"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'mu': out['mu'].tolist()}))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "src")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=repo)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["torch"] is False
    want = load(cut_models["lp"]).predict(test, FEATURES)["mu"]
    np.testing.assert_allclose(result["mu"], want, rtol=1e-5, atol=1e-6)


class _FakeEncoder:
    encoder_id = FEATURES.encoder_id

    def pooled_array(self, texts, batch_size=None):
        return FEATURES(list(texts))


def test_the_served_predictor_passes_the_language_pair_to_the_model(cut_models):
    from uamt.serving.calibrated_predictor import CalibratedPredictor

    model = load(cut_models["lp"])
    predictor = CalibratedPredictor(model, None, _FakeEncoder(), scale=None, method="hts")
    test = _cut_table(6, 6)
    served = predictor.raw_predict(test[["src", "mt", "ref", "lp"]])
    np.testing.assert_allclose(served["mu"], model.predict(test, FEATURES)["mu"], rtol=1e-6)
    # several references: every (segment, reference) row carries its segment's language pair
    two = predictor.raw_predict(test[["src", "mt", "lp"]].assign(refs=[[r, r + " x"] for r in test["ref"]]))
    assert list(two["n_refs"]) == [2] * 6
    with pytest.raises(DataError, match=r"column\(s\) \['lp'\] missing"):
        predictor.raw_predict(test[["src", "mt", "ref"]])
    with pytest.raises(DataError, match=r"row 1: lp=None is not a language pair"):
        predictor.raw_predict(test[["src", "mt", "ref"]].assign(lp=["en-de", None, "en-de", "en-de", "en-de", "en-de"]))


def test_params_name_the_section_of_a_bad_row_feature(tmp_path):
    import yaml

    from uamt.core.config import ConfigError
    from uamt.models import load_train_config

    params = yaml.safe_load(open("params.yaml", encoding="utf-8"))
    params["train_base"]["row_features"] = ["bleu"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{path}:train_base: row_features='bleu' not supported"):
        load_train_config("hts", path)


def test_the_qe_variant_keeps_the_features_it_can_read(tmp_path):
    cfg = TrainConfig(hidden_sizes=(8,), max_epochs=1, row_features=("chrf", "copy_rate", "len_ratio_ref", "len_ratio_src"))
    qe = cfg.as_reference_free()
    assert qe.reference_free and qe.row_features == ("copy_rate", "len_ratio_src")
    assert TrainConfig().as_reference_free() == TrainConfig().replace(reference_free=True)
    table = _cut_table(40, 7)
    model = load(train("hts", qe, table, _cut_table(20, 8), FEATURES, tmp_path / "qe"))
    assert np.isfinite(model.predict(table[["src", "mt", "lp"]], FEATURES)["mu"]).all()
