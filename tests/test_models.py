"""uamt.models: every method trains on a small fixed table and keeps its invariants; bad input is refused.

The table is synthetic but fixed: each text's "embedding" [3 layers, 8 dims] is drawn from a generator
seeded by the text's crc32, and the score depends on the mt/ref embeddings with noise that grows with
one feature (heteroscedastic), so the methods have something to learn.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from tests.fakes import DIM, FEATURES, N_LAYERS, embed, signal
from uamt.core.errors import DataError, UamtError
from uamt.models import METHODS, FeatureSource, NonFiniteLossError, TrainConfig, get_loss, load, train
from uamt.models.api import MANIFEST, TABLE_COLUMNS
from uamt.models.mcd import NoiseReplay, dropout_noise, head_mc_outputs


def make_table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        src, mt, ref = f"src {seed}-{i}", f"mt {seed}-{i}", f"ref {seed}-{i}"
        clean, fm = signal(mt, ref)
        noise = 0.2 + abs(fm[0])
        multi = i % 3 != 0
        rows.append(
            {
                "dataset": "synthetic",
                "lp": "en-de",
                "seg_id": i + 1,
                "system": f"sys{i % 4}",
                "src": src,
                "mt": mt,
                "ref": ref,
                "score": float(clean + rng.normal() * noise),
                "score_std": float(abs(rng.normal()) + 0.1) if multi else np.nan,
                "n_annotators": 3 if multi else 1,
            }
        )
    return pd.DataFrame(rows)


TRAIN, DEV, TEST = make_table(240, 1), make_table(60, 2), make_table(40, 3)
CFG = TrainConfig(
    hidden_sizes=(32, 16), max_epochs=3, batch_size=16, mc_samples=30, ensemble_size=2, patience=2
)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    paths = {}
    for method in ("point", "mcd_head", "hts", "kl", "hts_mcd"):
        paths[method] = train(method, CFG, TRAIN, DEV, FEATURES, root / method)
    paths["ensemble"] = train("ensemble", CFG.replace(n_jobs=2), TRAIN, DEV, FEATURES, root / "ensemble")
    paths["dup"] = train("dup", CFG, TRAIN, DEV, FEATURES, root / "dup", base_model_dir=paths["point"])
    return paths


@pytest.mark.parametrize("method", ["point", "mcd_head", "hts", "kl", "hts_mcd", "ensemble", "dup"])
def test_each_method_predicts_table(models, method):
    model = load(models[method])
    table = model.predictions_table(TEST, FEATURES)
    assert list(table.columns[: len(TABLE_COLUMNS)]) == list(TABLE_COLUMNS)
    assert len(table) == len(TEST)
    assert np.isfinite(table["mu"]).all()
    np.testing.assert_allclose(table["human"], TEST["score"])
    if method == "point":
        assert table["sigma"].isna().all()  # a point model has no sigma until calibration
    else:
        assert (table["sigma"] > 0).all() and np.isfinite(table["sigma"]).all()
    # predictions are on the human score scale, not the standardised one
    assert abs(table["mu"].mean() - TRAIN["score"].mean()) < 2 * TRAIN["score"].std()


def test_hts_mcd_total_is_epistemic_plus_aleatoric(models):
    pred = load(models["hts_mcd"]).predict(TEST, FEATURES)
    assert (pred["epistemic"] > 0).all() and (pred["aleatoric"] > 0).all()
    # float32 network outputs: equal up to float32 rounding
    np.testing.assert_allclose(pred["sigma"] ** 2, pred["epistemic"] + pred["aleatoric"], rtol=1e-6)


def test_ensemble_spread_positive_and_members_differ(models):
    model = load(models["ensemble"])
    assert len(model.members) == 2
    pred = model.predict(TEST, FEATURES)
    assert (pred["epistemic"] > 0).all()
    np.testing.assert_allclose(pred["sigma"] ** 2, pred["epistemic"], rtol=1e-9)
    mus = [member.predict(TEST, FEATURES)["mu"].to_numpy() for member in model.members]
    np.testing.assert_allclose(pred["mu"], np.mean(mus, axis=0), rtol=1e-9)
    np.testing.assert_allclose(pred["epistemic"], np.var(mus, axis=0), rtol=1e-9)


def test_mcd_passes_differ_and_are_one_batched_forward(models):
    model = load(models["mcd_head"])
    rows = model.encode(TEST, FEATURES)
    batch = rows.batch(range(10))
    linears = [m for m in model.module.head.modules() if isinstance(m, torch.nn.Linear)]
    rows_seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: rows_seen.append(o.shape[0])) for m in linears]
    samples = head_mc_outputs(model.module, batch, 25)[..., 0]
    for hook in hooks:
        hook.remove()
    assert samples.shape == (25, 10)
    # 25 passes, one forward: the first Linear (before any dropout) on the 10 rows once, the rest on
    # the repeated batch
    assert rows_seen == [10] + [250] * (len(linears) - 1)
    assert samples.std(dim=0).min() > 0
    a = model.predict(TEST, FEATURES, n_samples=50)
    assert (a["sigma"] > 0).all() and np.allclose(a["sigma"] ** 2, a["epistemic"], rtol=1e-6)
    # the deterministic point prediction sits inside the MC cloud
    with torch.no_grad():
        model.module.eval()
        point = (
            model.module(rows.batch(range(len(rows)))).view(-1).numpy() * model.scaler.std + model.scaler.mean
        )
    assert np.corrcoef(point, a["mu"])[0, 1] > 0.9


def test_dup_uses_q_hat(models):
    model = load(models["dup"])
    base_pred = model.base.predict(TEST, FEATURES)
    pred = model.predict(TEST, FEATURES)
    np.testing.assert_allclose(pred["mu"], base_pred["mu"], rtol=1e-9)
    np.testing.assert_allclose(pred["q_hat"], base_pred["mu"], rtol=1e-9)
    rows = model.encode(TEST, FEATURES)
    q = model.base.predict_standardised(rows)["mu"]
    eps = model.predict_standardised(rows.with_columns(q_hat=q))["var"]
    eps_shifted = model.predict_standardised(rows.with_columns(q_hat=q + 3.0))["var"]
    assert not np.allclose(eps, eps_shifted)
    assert model.meta["target_std"] == model.base.meta["target_std"]


def test_reference_free_variant(tmp_path):
    no_ref = TRAIN.drop(columns=["ref"])
    cfg = CFG.replace(reference_free=True, max_epochs=1)
    path = train("hts", cfg, no_ref, DEV.assign(ref=None), FEATURES, tmp_path / "qe")
    model = load(path)
    assert model.module.head.ff[0].in_features == 4 * DIM
    pred = model.predict(TEST.drop(columns=["ref"]), FEATURES)
    assert (pred["sigma"] > 0).all()
    with pytest.raises(DataError, match="column 'ref' is empty or null"):
        train("point", CFG, TRAIN.assign(ref=None), DEV, FEATURES, tmp_path / "needs_ref")


def test_same_seed_same_predictions_other_seed_differs(tmp_path):
    cfg = CFG.replace(max_epochs=2)
    a = load(train("hts", cfg, TRAIN, DEV, FEATURES, tmp_path / "a")).predict(TEST, FEATURES)
    b = load(train("hts", cfg, TRAIN, DEV, FEATURES, tmp_path / "b")).predict(TEST, FEATURES)
    c = load(train("hts", cfg.replace(seed=7), TRAIN, DEV, FEATURES, tmp_path / "c")).predict(TEST, FEATURES)
    pd.testing.assert_frame_equal(a, b)
    assert not np.allclose(a["mu"], c["mu"])
    # equal weights, equal bytes: DVC sees a re-trained identical model as unchanged
    assert (tmp_path / "a" / "weights.pt").read_bytes() == (tmp_path / "b" / "weights.pt").read_bytes()


def test_loading_and_predicting_never_imports_lightning(tmp_path):
    """Scoring start-up: pytorch-lightning (with torchmetrics and transformers) costs seconds; only
    training needs it."""
    path = train("hts", CFG.replace(max_epochs=1), TRAIN, DEV, FEATURES, tmp_path / "m")
    code = (
        "import sys; from tests.fakes import FEATURES; from tests.test_models import TEST;"
        "from uamt.models import load; import uamt.serving.calibrated_predictor;"
        f"load({str(path)!r}).predict(TEST, FEATURES);"
        "print(sorted(m for m in ('pytorch_lightning', 'torchmetrics', 'transformers', 'comet') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "src")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_kl_missing_annotator_rules(tmp_path):
    drop = load(
        train("kl", CFG.replace(kl_missing_std="drop", max_epochs=1), TRAIN, DEV, FEATURES, tmp_path / "d")
    )
    assert drop.meta["n_train"] == int((TRAIN["n_annotators"] >= 2).sum())
    mean = load(tmp_path / "d")  # reload works
    assert mean.method == "kl"
    with pytest.raises(DataError, match="'score_std' is missing"):
        train("kl", CFG, TRAIN.drop(columns=["score_std"]), DEV, FEATURES, tmp_path / "x")
    with pytest.raises(DataError, match="no row has >= 2 annotators"):
        rule = CFG.replace(kl_missing_std="mean")  # hts needs no multi-rater row
        train("kl", rule, TRAIN.assign(score_std=np.nan), DEV, FEATURES, tmp_path / "y")


def test_unknown_method_and_loss(tmp_path):
    with pytest.raises(ValueError, match=r"method='nope' not supported; choose from \['dup', 'ensemble'"):
        train("nope", CFG, TRAIN, DEV, FEATURES, tmp_path / "m")
    with pytest.raises(ValueError, match=r"loss='l1' not supported; choose from \['abs', 'hts', 'sq'\]"):
        get_loss("l1")
    with pytest.raises(ValueError, match="loss='l1' not supported"):
        train(
            "dup", CFG.replace(dup_loss="l1"), TRAIN, DEV, FEATURES, tmp_path / "l", base_model_dir=tmp_path
        )
    assert sorted(METHODS) == ["dup", "ensemble", "hts", "hts_mcd", "kl", "mcd_full", "mcd_head", "point"]


def test_method_specs_are_the_one_table(capsys):
    from uamt.cli import main
    from uamt.models.specs import SAME_TRAINING, get_spec, row_spec, training_order

    with pytest.raises(ValueError, match=r"method='nope' not supported; choose from \['dup', 'ensemble'"):
        get_spec("nope")
    assert SAME_TRAINING == {"mcd_head": "point", "mcd_full": "point", "hts_mcd": "hts"}
    assert training_order(("hts_mcd", "mcd_head", "point", "kl")) == ["hts_mcd", "point", "kl", "mcd_head"]
    assert training_order(("hts", "hts_mcd", "mcd_head")) == ["hts", "mcd_head", "hts_mcd"]
    assert row_spec("dup_hts") == (METHODS["dup"], "hts") and row_spec("hts_mcd") == (METHODS["hts_mcd"], None)
    assert METHODS["dup"].row_label("abs") == "DUP L_ABS" and METHODS["point"].row_label() == "Baseline (fixed σ²)"
    for bad in ("dup_l1", "hts_abs", "nope"):
        with pytest.raises(ValueError, match=f"row={bad!r} not supported"):
            row_spec(bad)
    # `uamt train` refuses an unknown method naming every spec
    assert main(["train", "--method", "nope"]) == 2
    assert f"choose from {sorted(METHODS)}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "model,method,fixed_variance",
    [
        ("point", "point", True),
        ("point_qe", "point", True),  # the reference-free point model is still a point model
        ("hts_qe", "hts", False),
        ("dup_hts", "dup", False),  # an analysis row of a per-loss method
        ("ensemble", "ensemble", False),
    ],
)
def test_model_names_resolve_to_their_spec(model, method, fixed_variance):
    from uamt.models.specs import model_spec
    from uamt.serving.model_calibration import is_fixed_variance

    assert model_spec(model) is METHODS[method]
    assert is_fixed_variance(model) is fixed_variance


@pytest.mark.parametrize("model", ["nope", "nope_qe", "hts_l1"])
def test_unknown_model_names_are_refused(model):
    from uamt.serving.model_calibration import is_fixed_variance

    with pytest.raises(ValueError, match="not supported; choose"):
        is_fixed_variance(model)


def test_method_lists_are_derived_from_the_specs_in_the_analyses_order():
    """The lists that used to be written by hand beside the specs, in the same order (the analyses'
    tables and the cost plan follow it)."""
    from uamt.experiments.cost import method_plan
    from uamt.experiments.methods import supported_methods
    from uamt.models.specs import ENSEMBLE_MEMBERS, baseline_method, methods_where, per_loss_rows
    from uamt.pipeline_config import PipelineConfig

    assert supported_methods() == ("point", "mcd_head", "ensemble", "hts", "hts_mcd", "kl", "dup")
    assert [info["method"] for info in method_plan(10, 2, ("hts",)).values()] == [
        "point", "mcd_head", "mcd_full", "ensemble", "hts", "hts_mcd", "kl", "dup"
    ]
    assert ENSEMBLE_MEMBERS == ("point", "hts", "kl")
    assert methods_where(layout="second_stage") == ("dup",) and baseline_method() == "point"
    assert per_loss_rows(["point", "dup_abs", "hts", "dup_hts"]) == ["dup_abs", "dup_hts"]
    assert PipelineConfig(methods=("point", "hts"), qe_methods=("hts",)).all_methods == (
        "point", "hts", "dup", "hts_qe"
    )


def test_models_answer_what_references_ask(models):
    """The public sample interface: aligned samples where MC dropout runs in the head or members vote."""
    expected = {"point": False, "mcd_head": True, "hts": False, "kl": False, "hts_mcd": True, "ensemble": True}
    expected["dup"] = False
    for method, path in models.items():
        assert load(path).aligned_samples is expected[method], method
    ensemble = load(models["ensemble"])
    mu, var = ensemble.sample_outputs(ensemble.encode(TEST, FEATURES))
    assert mu.shape == (len(TEST), 2) and var is None  # point members predict no variance
    hts_mcd = load(models["hts_mcd"])
    mu, var = hts_mcd.sample_outputs(hts_mcd.encode(TEST, FEATURES), n_samples=5)
    assert mu.shape == var.shape == (len(TEST), 5) and (var > 0).all()
    with pytest.raises(UamtError, match="gives no aligned samples"):
        load(models["hts"]).sample_outputs(hts_mcd.encode(TEST, FEATURES))
    full = load(models["hts_mcd"])
    full.cfg = full.cfg.replace(mcd_scope="full")  # dropout through the encoder: masks not alignable
    assert not full.aligned_samples


def test_too_few_rows_for_batch(tmp_path):
    with pytest.raises(DataError, match="fewer than batch_size=16"):
        train("point", CFG, TRAIN.head(10), DEV, FEATURES, tmp_path / "few")
    assert not (tmp_path / "few").exists()


def test_nan_loss_stops_and_saves_nothing(tmp_path, monkeypatch):
    from uamt.models.point import PointEstimator

    monkeypatch.setattr(PointEstimator, "loss", lambda self, out, batch: out.sum() * float("nan"))
    with pytest.raises(NonFiniteLossError, match="training loss is nan"):
        train("point", CFG, TRAIN, DEV, FEATURES, tmp_path / "nan")
    assert not (tmp_path / "nan").exists()
    assert not list(tmp_path.glob(".nan*"))  # temp folder cleaned up


def test_dup_without_base_model(tmp_path):
    with pytest.raises(UamtError, match="needs its base model"):
        train("dup", CFG, TRAIN, DEV, FEATURES, tmp_path / "dup", base_model_dir=tmp_path / "missing")
    with pytest.raises(UamtError, match="needs its base model"):
        train("dup", CFG.replace(base_model_dir=None), TRAIN, DEV, FEATURES, tmp_path / "dup")


def test_features_from_another_encoder(models):
    model = load(models["hts"])
    other = FeatureSource(embed, encoder_id="another-encoder-111")
    with pytest.raises(DataError, match="encoder 'fake-encoder-000'.*another-encoder-111"):
        model.predict(TEST, other)
    # another runtime of the same weights is accepted; of other weights it is not
    onnx = SimpleNamespace(encoder_id="fake-encoder-000+ort-int8")  # the features' encoder object
    same_weights = FeatureSource(embed, encoder_id=onnx.encoder_id, encoder=onnx)
    assert len(model.predict(TEST, same_weights)["mu"]) == len(TEST)
    with pytest.raises(DataError, match="encoder 'fake-encoder-000'.*another-encoder-111\\+ort"):
        model.predict(TEST, FeatureSource(embed, encoder_id="another-encoder-111+ort"))
    with pytest.raises(DataError, match="trained with encoder 'fake-encoder-000', got encoder 'another-encoder-111'"):
        model.predict(TEST, FEATURES, encoder=SimpleNamespace(encoder_id="another-encoder-111"))
    wider = FeatureSource(lambda texts: np.zeros((len(texts), N_LAYERS, DIM + 1), np.float32))
    with pytest.raises(DataError, match="another encoder"):
        model.predict(TEST, wider)


def test_half_written_model_is_not_loaded(models, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(models["point"], broken)
    (broken / MANIFEST).unlink()
    with pytest.raises(UamtError, match="not a trained model"):
        load(broken)
    (broken / MANIFEST).write_text('{"format": "uamt-model/1", "method": "point"')
    with pytest.raises(UamtError, match="corrupt manifest"):
        load(broken)


def test_cli_refuses_unknown_method(capsys):
    from uamt.cli import main

    assert main(["train", "--method", "nope"]) == 2
    assert "method='nope' not supported" in capsys.readouterr().err


def test_mc_dropout_predictions_are_reproducible(models):
    """Same model, input and seed -> identical MC-dropout predictions; the global RNG is left alone."""
    model = load(models["mcd_head"])
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = model.predict(TEST, FEATURES, n_samples=30)
    assert torch.rand(1) == before  # sampling did not consume the caller's random stream
    b = load(models["mcd_head"]).predict(TEST, FEATURES, n_samples=30)
    pd.testing.assert_frame_equal(a, b)
    assert (a["sigma"] > 0).all()


def full_repeat_mc_outputs(module, batch: dict, n: int, chunk: int) -> torch.Tensor:
    """Reference head MC dropout: the whole head on the features repeated ``chunk`` passes at a time
    (what ``head_mc_outputs`` computed before it ran the layers before the first dropout once per row)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(module.cfg.seed)
        features = module.sentence_features(batch)
        module.head.train()
        try:
            outs = [
                module.head_forward(features.repeat(reps, 1), batch, repeats=reps)
                for reps in (min(chunk, n - start) for start in range(0, n, chunk))
            ]
        finally:
            module.head.eval()
    return torch.cat(outs).view(n, features.shape[0], -1)


@pytest.mark.parametrize("method", ["mcd_head", "hts_mcd"])
def test_head_mc_equals_full_repeat_of_the_head(models, method, monkeypatch):
    """Running the deterministic first layer once per row gives the samples of the full repeat: the
    dropout layers see the same shapes in the same order, so they draw the same masks."""
    model = load(models[method])
    module = model.module
    rows = model.encode(TEST, FEATURES)
    batch = rows.batch(range(len(rows)))
    with torch.no_grad():
        expected = full_repeat_mc_outputs(module, batch, 30, chunk=30)
        got = head_mc_outputs(module, batch, 30)
        # passes in chunks of 7 (the memory bound): the masks of each chunk as in the full repeat's
        monkeypatch.setattr("uamt.models.mcd.MAX_REPEATED_ROWS", 7 * len(rows))
        chunked = head_mc_outputs(module, batch, 30)
        expected_chunked = full_repeat_mc_outputs(module, batch, 30, chunk=7)
    assert got.shape == expected.shape == (30, len(rows), module.out_dim)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(chunked, expected_chunked, rtol=1e-6, atol=1e-7)
    assert got.std(dim=0).min() > 0


@pytest.mark.parametrize("p", [0.05, 0.15, 0.5, 0.9])
def test_dropout_noise_is_what_the_dropout_module_multiplies_by(p):
    """x * dropout_noise(x, p) is nn.Dropout(p)'s training output bit for bit, from the same RNG state,
    and leaves the RNG where the module leaves it (the replay depends on both)."""
    x = torch.randn(37, 19)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        expected = torch.nn.Dropout(p).train()(x)
        after_module = torch.rand(3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        got = x * dropout_noise(x, p)
        after_noise = torch.rand(3)
    assert torch.equal(got, expected)
    assert torch.equal(after_noise, after_module)


@pytest.mark.parametrize("method", ["mcd_head", "hts_mcd"])
def test_replayed_dropout_noise_gives_the_drawn_samples(models, method, monkeypatch):
    """A second batch of the same size replays the first one's noise; its samples equal, bit for bit,
    those drawn afresh (replay off), and a batch of another size draws its own."""
    model = load(models[method])
    module = model.module
    rows = model.encode(TEST, FEATURES)
    half = len(rows) // 2
    first, second, other = rows.batch(range(half)), rows.batch(range(half, 2 * half)), rows.batch(range(half - 1))
    with torch.no_grad():
        monkeypatch.setattr("uamt.models.mcd.MAX_REPLAYED_NOISE_BYTES", 0)
        fresh = [head_mc_outputs(module, batch, 20) for batch in (first, second, other)]
        assert not NoiseReplay._stores.get(module)  # nothing kept over the bound
        monkeypatch.setattr("uamt.models.mcd.MAX_REPLAYED_NOISE_BYTES", 2**30)
        recorded = head_mc_outputs(module, first, 20)
        assert len(NoiseReplay._stores[module]) == 1
        replayed = head_mc_outputs(module, second, 20)
        assert len(NoiseReplay._stores[module]) == 1
        own = head_mc_outputs(module, other, 20)
        assert len(NoiseReplay._stores[module]) == 2
    for got, expected in zip((recorded, replayed, own), fresh, strict=True):
        assert torch.equal(got, expected)
    assert not torch.equal(replayed, recorded)  # the same masks on other rows: other samples


def test_dup_head_split_matches_its_forward(models):
    """DUP's bottleneck head split at its first dropout: q_hat still enters at the bottleneck."""
    model = load(models["dup"])
    rows = model.encode(TEST, FEATURES)
    q = model.base.predict_standardised(rows)["mu"]
    batch = rows.with_columns(q_hat=q).batch(range(len(rows)))
    module = model.error_model.module
    module.head.train()
    try:
        with torch.no_grad():
            features = module.sentence_features(batch)
            torch.manual_seed(7)
            expected = module.head_forward(features.repeat(4, 1), batch, repeats=4)
            torch.manual_seed(7)
            got = module.head_from_dropout(
                module.head_until_dropout(features, batch).repeat(4, 1), batch, repeats=4
            )
    finally:
        module.head.eval()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_every_head_forward_override_has_its_split():
    """A method whose ``head_forward`` differs from the base one must split it for head MC dropout too,
    or the MC path would run the base head instead of its own."""
    from uamt.models.base import Estimator

    for name, spec in METHODS.items():
        cls = spec.estimator
        if cls.head_forward is not Estimator.head_forward:
            assert cls.head_until_dropout is not Estimator.head_until_dropout, name
            assert cls.head_from_dropout is not Estimator.head_from_dropout, name


def test_a_missing_unbabel_comet_names_the_install_that_keeps_lightning_out(monkeypatch):
    """A scoring install lacks unbabel-comet: the message says to install it without its dependencies
    (with them it brings pytorch-lightning and transformers into a scoring install)."""
    import importlib.util

    from uamt.models import comet_parts

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UamtError, match=r"pip install --no-deps unbabel-comet==2\.2\.7 "):
        comet_parts._comet_module("not_a_comet_module")


def _training_inputs():
    return TRAIN, DEV, FEATURES, None  # no paragraph rows: CFG fits no paragraph blend


def _model_folder(root: Path, name: str) -> Path:
    return root / name


def test_train_jobs_in_two_processes_give_the_weights_of_one(tmp_path):
    """train_base's trainings spread over processes (one torch thread each): the same weights bit for
    bit as in one process, and the methods sharing a training get a copy of their source's."""
    import functools
    import json

    from uamt.models.shared_training import train_jobs

    jobs = [("mcd_head", CFG, ""), ("point", CFG, ""), ("hts", CFG, ""), ("hts", CFG.replace(reference_free=True), "_qe")]
    runs = {
        workers: train_jobs(jobs, _training_inputs, functools.partial(_model_folder, tmp_path / str(workers)), workers)
        for workers in (1, 2)
    }
    assert list(runs[2]) == ["point", "hts", "hts_qe", "mcd_head"]  # trained, then derived
    for name, folder in runs[2].items():
        assert (folder / "weights.pt").read_bytes() == (runs[1][name] / "weights.pt").read_bytes(), name
    assert (runs[2]["mcd_head"] / "weights.pt").read_bytes() == (runs[2]["point"] / "weights.pt").read_bytes()
    assert json.loads((runs[2]["mcd_head"] / MANIFEST).read_text())["method"] == "mcd_head"
    assert (runs[2]["hts_qe"] / "weights.pt").read_bytes() != (runs[2]["hts"] / "weights.pt").read_bytes()
