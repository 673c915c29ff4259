"""The encoder-in-the-network paths on tiny randomly initialised BERT / XLM-R models and real rows.

* full fine-tuning (``finetune=True``): the unbabel-comet encoder is a trained sub-module with its own
  learning rate, COMET's layer-wise decay and a frozen encoder for the first ``nr_frozen_epochs``;
* MC dropout through encoder + layer mix + head: ``mcd_full`` and ``hts_mcd`` with ``mcd_scope='full'``;
* ``uamt train`` + ``uamt predict [--calibrate-on dev]`` (mcd_full, hts_mcd full, mcd_head, a fine-tuned
  point model) with ``encode.encoder`` pointing at the tiny model.

The rows are real WMT21 MQM en-de segments read through the project's loader from the offline mirror;
the tiny vocabularies map most words to [UNK] / <unk>, which is fine for exercising the code paths.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from tests.test_encoders import make_tiny_bert, make_tiny_xlmr
from uamt.core.errors import DataError, UamtError
from uamt.data import loaders
from uamt.encoders import EncoderConfig, get_encoder
from uamt.models import FeatureSource, TrainConfig, load, train
from uamt.models.data import features_from_encoder
from uamt.models.mcd import full_mc_outputs
from uamt.models.point import PointEstimator
from uamt.models.training import LightningAdapter

CFG = TrainConfig(
    hidden_sizes=(16,),
    batch_size=8,
    max_epochs=1,
    patience=2,
    learning_rate=1e-3,
    encoder_learning_rate=1e-3,
    layerwise_decay=0.5,
    nr_frozen_epochs=0.5,
    mc_samples=5,
    predict_batch_size=32,
)
N_TRAIN, N_DEV, N_TEST = 56, 20, 16


#: Tiny models: one intra-op thread is fastest; two thrash on a loaded 2-core machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def splits(mirror_root) -> dict[str, pd.DataFrame]:
    """Short real en-de rows with a reference: 56 train (7 batches of 8), 20 dev, 16 test."""
    df = loaders.load_wmt21_mqm(mirror_root, lps=("en-de",))
    short = df[df["ref"].notna() & (df[["src", "mt", "ref"]].apply(lambda c: c.str.len()).max(axis=1) < 100)]
    rows = short.sample(n=N_TRAIN + N_DEV + N_TEST, random_state=0).reset_index(drop=True)
    out = {
        "d_q": rows.iloc[:N_TRAIN],
        "dev": rows.iloc[N_TRAIN : N_TRAIN + N_DEV],
        "test": rows.iloc[N_TRAIN + N_DEV :],
    }
    out = {name: frame.reset_index(drop=True).assign(split=name) for name, frame in out.items()}
    for frame in out.values():
        assert frame["score"].std() > 0  # MQM is mostly 0; a constant split could not be standardised
    return out


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-encoders")
    return {"bert": make_tiny_bert(root / "bert"), "xlmr": make_tiny_xlmr(root / "xlmr")}


def encoder_for(folder: Path):
    return get_encoder(EncoderConfig(name="hf", path=str(folder), batch_size=32))


def encoder_for_same(finetuned: dict):
    """A fresh encoder object of the fine-tuned model's base encoder."""
    return get_encoder(finetuned["encoder"].config)


def encoder_tensors(encoder) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in encoder.comet_encoder.state_dict().items()}


@pytest.fixture(scope="module")
def finetuned(tiny_dirs, splits, tmp_path_factory) -> dict:
    """A point model fine-tuned through the tiny BERT, with the freezing state seen at every batch."""
    encoder = encoder_for(tiny_dirs["bert"])
    features = features_from_encoder(encoder)
    before = encoder_tensors(encoder)
    probe = splits["test"]["mt"].tolist()
    probe_before = features(probe)
    seen = []
    original = LightningAdapter.on_train_batch_start

    def recording(self, batch, batch_idx):
        original(self, batch, batch_idx)
        model = self.estimator.comet_encoder.model
        seen.append(
            (
                self.current_epoch,
                batch_idx,
                all(p.requires_grad for p in model.encoder.parameters()),
                any(p.requires_grad for p in model.embeddings.parameters()),
            )
        )

    LightningAdapter.on_train_batch_start = recording
    try:
        path = train(
            "point",
            CFG.replace(finetune=True),
            splits["d_q"],
            splits["dev"],
            features,
            tmp_path_factory.mktemp("finetuned") / "point",
        )
    finally:
        LightningAdapter.on_train_batch_start = original
    return {
        "path": path,
        "before": before,
        "encoder": encoder,
        "seen": seen,
        "probe": probe,
        "probe_before": probe_before,
    }


def test_finetune_freezes_encoder_for_first_fraction_then_trains_it(finetuned):
    seen = finetuned["seen"]
    assert [(epoch, idx) for epoch, idx, _, _ in seen] == [(0, i) for i in range(7)]  # 56 rows / 8
    # nr_frozen_epochs = 0.5: frozen while batch_idx / 7 < 0.5 (batches 0..3), trained from batch 4 on
    assert [trainable for _, _, trainable, _ in seen] == [False] * 4 + [True] * 3
    assert not any(embeddings for _, _, _, embeddings in seen)  # keep_embeddings_frozen


def test_finetune_changes_encoder_layers_but_not_embeddings(finetuned):
    state = torch.load(finetuned["path"] / "weights.pt", map_location="cpu", weights_only=True)
    trained = {
        k.removeprefix("comet_encoder."): v for k, v in state.items() if k.startswith("comet_encoder.")
    }
    before = finetuned["before"]
    assert set(trained) == set(before)
    layers = [k for k in trained if k.startswith("model.encoder.")]
    embeddings = [k for k in trained if k.startswith("model.embeddings.")]
    assert layers and embeddings
    assert all(not torch.equal(trained[k], before[k]) for k in layers)
    assert all(torch.equal(trained[k], before[k]) for k in embeddings)


def test_finetune_leaves_the_callers_encoder_and_its_features_untouched(finetuned):
    """The network trains its own copy: the encoder behind the features (an embedding cache keyed by the
    frozen encoder's id) still gives the frozen encoder's embeddings."""
    encoder = finetuned["encoder"]
    after = encoder_tensors(encoder)
    assert all(torch.equal(after[k], v) for k, v in finetuned["before"].items())
    features = features_from_encoder(encoder)
    np.testing.assert_array_equal(features(finetuned["probe"]), finetuned["probe_before"])


def test_layerwise_learning_rates(tiny_dirs):
    """Optimizer groups: top layer at encoder_learning_rate, each lower layer x decay, embeddings x
    decay^num_layers (COMET), head + layer mix at learning_rate; every trainable tensor in one group."""
    for name, hidden_layers in (("bert", 2), ("xlmr", 3)):
        encoder = encoder_for(tiny_dirs[name])
        cfg = CFG.replace(finetune=True)
        module = PointEstimator(cfg, encoder.num_layers, encoder.dim, encoder=encoder)
        groups = LightningAdapter(module).configure_optimizers().param_groups
        lr, decay = cfg.encoder_learning_rate, cfg.layerwise_decay
        expected = [lr * decay**i for i in range(hidden_layers)] + [lr * decay ** (hidden_layers + 1)]
        assert [g["lr"] for g in groups] == pytest.approx([*expected, cfg.learning_rate])
        layers = module.comet_encoder.model.encoder.layer
        for i, group in enumerate(groups[:hidden_layers]):
            assert {id(p) for p in group["params"]} == {id(p) for p in layers[-(i + 1)].parameters()}
        grouped = [id(p) for g in groups for p in g["params"]]
        assert len(grouped) == len(set(grouped)) and set(grouped) == {id(p) for p in module.parameters()}


def test_finetuned_model_loads_back_and_predicts_deterministically(finetuned, tiny_dirs, splits):
    embeddings_only = FeatureSource(features_from_encoder(finetuned["encoder"]).fn)
    with pytest.raises(UamtError, match="a fine-tuned model runs its encoder"):
        load(finetuned["path"]).predict(splits["test"], embeddings_only)
    with pytest.raises(DataError, match="trained with encoder 'hf-bert-"):
        load(finetuned["path"], encoder=encoder_for(tiny_dirs["xlmr"]))
    # loaded without an encoder (as the pipeline's stages do), it takes the one the features carry
    via_features = load(finetuned["path"]).predict(
        splits["test"], features_from_encoder(finetuned["encoder"])
    )
    fresh = encoder_for(tiny_dirs["bert"])
    before = encoder_tensors(fresh)
    model = load(finetuned["path"], encoder=fresh)
    assert model.cfg.finetune and model.module.needs_texts
    pred = model.predict(splits["test"], features_from_encoder(fresh))
    assert pred["mu"].notna().all() and pred["sigma"].isna().all()
    # loading did not write the fine-tuned weights into the caller's encoder
    assert all(torch.equal(v, before[k]) for k, v in encoder_tensors(fresh).items())
    # the network runs its fine-tuned encoder, whatever encoder object the features carry
    other = encoder_for(tiny_dirs["bert"])
    again = load(finetuned["path"], encoder=other).predict(splits["test"], features_from_encoder(fresh))
    pd.testing.assert_frame_equal(pred, again)
    pd.testing.assert_frame_equal(pred, via_features)
    # and the fine-tuned encoder matters: the same head over the frozen encoder predicts otherwise
    frozen = PointEstimator(model.cfg, *model.shape, encoder=other)
    state = torch.load(finetuned["path"] / "weights.pt", map_location="cpu", weights_only=True)
    frozen.load_state_dict(
        {k: v for k, v in state.items() if not k.startswith("comet_encoder.")}, strict=False
    )
    rows = model.encode(splits["test"], features_from_encoder(fresh))
    frozen_mu = model.scaler.inverse(frozen.predict_rows(rows)["mu"].numpy())
    assert not np.allclose(frozen_mu, pred["mu"].to_numpy())


def test_dup_over_a_finetuned_base(finetuned, splits, tmp_path):
    """DUP's M_E on frozen features over the fine-tuned M_Q: q_hat comes from the fine-tuned network."""
    features = features_from_encoder(finetuned["encoder"])
    path = train(
        "dup",
        CFG,
        splits["d_q"],
        splits["dev"],
        features,
        tmp_path / "dup",
        base_model_dir=finetuned["path"],
    )
    pred = load(path).predict(splits["test"], features)
    base = load(finetuned["path"]).predict(splits["test"], features)
    np.testing.assert_allclose(pred["q_hat"], base["mu"], rtol=1e-9)
    assert (pred["sigma"] > 0).all()


def test_finetuned_dup_over_a_finetuned_base(finetuned, splits, tmp_path):
    """train_dup reads train_base's settings: with finetune on, M_E fine-tunes its own encoder copy
    too, and the loaded DUP (as the calibrate stage loads it: no encoder given) runs both."""
    features = features_from_encoder(finetuned["encoder"])
    path = train(
        "dup", CFG.replace(finetune=True), splits["d_q"], splits["dev"], features, tmp_path / "dup",
        base_model_dir=finetuned["path"],
    )
    state = torch.load(path / "weights.pt", map_location="cpu", weights_only=True)
    assert any(k.startswith("comet_encoder.") for k in state)
    pred = load(path).predict(splits["test"], features)
    base = load(finetuned["path"]).predict(splits["test"], features)
    np.testing.assert_allclose(pred["q_hat"], base["mu"], rtol=1e-9)
    assert (pred["sigma"] > 0).all()
    again = load(path, encoder=encoder_for_same(finetuned)).predict(splits["test"], features)
    pd.testing.assert_frame_equal(pred, again)


def test_finetuned_deep_ensemble(tiny_dirs, splits, tmp_path):
    """The paper's deep ensemble: every member fine-tunes its own copy of the encoder (seeds differ),
    the caller's encoder is untouched, and the loaded ensemble runs each member's encoder."""
    encoder = encoder_for(tiny_dirs["bert"])
    before = encoder_tensors(encoder)
    cfg = CFG.replace(finetune=True, ensemble_size=2, ensemble_member="hts", n_jobs=2)
    path = train("ensemble", cfg, splits["d_q"], splits["dev"], features_from_encoder(encoder), tmp_path / "ens")
    assert all(torch.equal(v, before[k]) for k, v in encoder_tensors(encoder).items())
    states = [torch.load(path / "members" / k / "weights.pt", map_location="cpu", weights_only=True) for k in "01"]
    layers = [k for k in states[0] if k.startswith("comet_encoder.") and ".encoder.layer." in k]
    assert layers and any(not torch.equal(states[0][k], states[1][k]) for k in layers)
    assert any(not torch.equal(states[0][k], before[k.removeprefix("comet_encoder.")]) for k in layers)
    fresh = encoder_for(tiny_dirs["bert"])
    model = load(path)
    pred = model.predict(splits["test"], features_from_encoder(fresh))
    assert pred["mu"].notna().all() and (pred["sigma"] > 0).all() and (pred["epistemic"] > 0).all()
    members = [load(path / "members" / k, encoder=fresh).predict(splits["test"], features_from_encoder(fresh)) for k in "01"]
    np.testing.assert_allclose(pred["mu"], (members[0]["mu"] + members[1]["mu"]) / 2, rtol=1e-6)


def test_refuses_finetune_without_encoder(splits, tmp_path):
    def embed(texts):
        return np.zeros((len(texts), 3, 32), dtype=np.float32)

    with pytest.raises(UamtError, match="finetune=True needs the encoder"):
        train(
            "point",
            CFG.replace(finetune=True),
            splits["d_q"],
            splits["dev"],
            FeatureSource(embed),
            tmp_path / "m",
        )


@pytest.fixture(scope="module")
def mc_models(tiny_dirs, splits, tmp_path_factory) -> dict:
    """mcd_full and hts_mcd (mcd_scope='full') trained on the frozen-encoder path (embeddings as features)."""
    encoder = encoder_for(tiny_dirs["bert"])
    features = features_from_encoder(encoder)
    root = tmp_path_factory.mktemp("mc")
    return {
        "features": features,
        "mcd_full": train("mcd_full", CFG, splits["d_q"], splits["dev"], features, root / "mcd_full"),
        "hts_mcd": train(
            "hts_mcd", CFG.replace(mcd_scope="full"), splits["d_q"], splits["dev"], features, root / "hts_mcd"
        ),
    }


def test_mcd_full_passes_differ_through_the_encoder(mc_models, splits):
    model = load(mc_models["mcd_full"])
    features = mc_models["features"]
    assert not model.cfg.finetune and model.module.comet_encoder is None  # weights: head + layer mix only
    model.attach_encoder(features.encoder)
    rows = model.encode(splits["test"], features)
    batch = rows.batch(range(8), with_texts=True)
    calls = []
    hook = features.encoder.comet_encoder.register_forward_hook(lambda *a: calls.append(1))
    samples = full_mc_outputs(model.module, batch, 4)[..., 0]
    hook.remove()
    assert samples.shape == (4, 8)
    assert len(calls) == 4 * 3  # every pass runs the encoder on src, mt and ref
    assert samples.std(dim=0).min() > 0
    # the encoder's own dropout makes passes differ even with the head and layer mix in eval mode
    module = model.module
    with torch.no_grad():
        a, b = (module.sentence_features(batch, encoder_train=True) for _ in range(2))
    assert not torch.equal(a, b)
    assert not module.training and not features.encoder.comet_encoder.training  # modes restored


def test_mcd_full_predictions(mc_models, splits):
    features = mc_models["features"]
    model = load(mc_models["mcd_full"])
    pred = model.predict(splits["test"], features)
    assert (pred["sigma"] > 0).all()
    np.testing.assert_allclose(pred["sigma"] ** 2, pred["epistemic"], rtol=1e-6)
    again = load(mc_models["mcd_full"]).predict(splits["test"], features)
    pd.testing.assert_frame_equal(pred, again)  # same seed -> same dropout masks
    other_seed = load(mc_models["mcd_full"])
    other_seed.module.cfg = other_seed.module.cfg.replace(seed=CFG.seed + 1)
    assert not np.allclose(other_seed.predict(splits["test"], features)["sigma"], pred["sigma"])
    with pytest.raises(UamtError, match="needs the encoder"):
        load(mc_models["mcd_full"]).predict(splits["test"], FeatureSource(features.fn, features.encoder_id))


def test_hts_mcd_full_scope(mc_models, splits):
    features = mc_models["features"]
    model = load(mc_models["hts_mcd"])
    assert model.cfg.mcd_scope == "full"
    pred = model.predict(splits["test"], features)
    assert (pred["epistemic"] > 0).all() and (pred["aleatoric"] > 0).all()
    np.testing.assert_allclose(pred["sigma"] ** 2, pred["epistemic"] + pred["aleatoric"], rtol=1e-6)
    pd.testing.assert_frame_equal(pred, load(mc_models["hts_mcd"]).predict(splits["test"], features))
    with pytest.raises(UamtError, match="needs the encoder"):
        load(mc_models["hts_mcd"]).predict(splits["test"], FeatureSource(features.fn, features.encoder_id))


def test_xlmr_finetuned_hts_mcd_full(tiny_dirs, splits, tmp_path):
    """The XLM-R config through the same path: fine-tuned, then MC dropout through its fine-tuned encoder."""
    encoder = encoder_for(tiny_dirs["xlmr"])
    features = features_from_encoder(encoder)
    cfg = CFG.replace(finetune=True, mcd_scope="full")
    path = train("hts_mcd", cfg, splits["d_q"], splits["dev"], features, tmp_path / "hts_mcd")
    model = load(path, encoder=encoder_for(tiny_dirs["xlmr"]))
    pred = model.predict(splits["test"], features)
    assert (pred["epistemic"] > 0).all() and (pred["aleatoric"] > 0).all()
    np.testing.assert_allclose(pred["sigma"] ** 2, pred["epistemic"] + pred["aleatoric"], rtol=1e-6)
    pd.testing.assert_frame_equal(pred, model.predict(splits["test"], features))
    state = torch.load(path / "weights.pt", map_location="cpu", weights_only=True)
    key = "comet_encoder.model.encoder.layer.2.output.dense.weight"
    assert not torch.equal(state[key], encoder.comet_encoder.state_dict()[key.removeprefix("comet_encoder.")])


def write_cli_inputs(root: Path, splits: dict, encoder_dir: Path, **train_base) -> Path:
    prepared = root / "prepared"
    prepared.mkdir(parents=True)
    for name, frame in splits.items():
        frame.to_parquet(prepared / f"{name}.parquet", index=False)
    params = {
        "encode": {
            "encoder": {"name": "hf", "path": str(encoder_dir), "max_length": 64, "batch_size": 32},
            "prepared_dir": str(prepared),
            "cache_dir": str(root / "cache"),
            "dtype": "float32",
        },
        "train_base": {
            "hidden_sizes": [16],
            "batch_size": CFG.batch_size,
            "learning_rate": CFG.learning_rate,
            "mc_samples": CFG.mc_samples,
            "max_epochs": 1,
            "out_dir": str(root / "models" / "{method}"),
            **train_base,
        },
        "evaluate": {"per_lp": True, "min_lp_rows": 50},
    }
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("method", "train_base"),
    [("mcd_full", {}), ("hts_mcd", {"mcd_scope": "full"}), ("mcd_head", {})],
    ids=["mcd_full", "hts_mcd-full", "mcd_head"],
)
def test_cli_train_and_predict_mc_dropout(tiny_dirs, splits, tmp_path, capsys, method, train_base):
    from uamt.cli import main
    from uamt.serving.model_calibration import Calibration

    params = write_cli_inputs(tmp_path, splits, tiny_dirs["bert"], **train_base)
    assert main(["train", "--method", method, "--params", str(params)]) == 0
    model_dir = tmp_path / "models" / method
    assert load(model_dir).cfg.mcd_scope == train_base.get("mcd_scope", "head")
    out = tmp_path / "pred" / "test.parquet"
    argv = ["predict", "--model", str(model_dir), "--split", "test", "--params", str(params)]
    assert main([*argv, "--out", str(out), "--calibrate-on", "dev", "--n-samples", "4"]) == 0
    table = pd.read_parquet(out)
    assert len(table) == N_TEST and (table["sigma"] > 0).all()
    assert {"mu_calibrated", "sigma_calibrated", "lower", "upper"} <= set(table.columns)
    assert ((table["lower"] < table["mu_calibrated"]) & (table["mu_calibrated"] < table["upper"])).all()
    calibration = Calibration.load(out.with_name("test.parquet.calibration.json"))
    mu, sigma = calibration.apply(table["mu"], table["sigma"], table["lp"].to_numpy())
    np.testing.assert_allclose(table["sigma_calibrated"], sigma)
    assert "calibrated on dev" in capsys.readouterr().out
    # the raw columns are the plain `uamt predict` output
    raw = tmp_path / "pred" / "raw.parquet"
    assert main([*argv, "--out", str(raw), "--n-samples", "4"]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(raw), table[pd.read_parquet(raw).columns])


def test_cli_predicts_with_a_finetuned_model(tiny_dirs, splits, tmp_path):
    from uamt.cli import main

    params = write_cli_inputs(tmp_path, splits, tiny_dirs["bert"], finetune=True, nr_frozen_epochs=0.5)
    assert main(["train", "--method", "point", "--params", str(params)]) == 0
    out = tmp_path / "test.csv"
    model = str(tmp_path / "models" / "point")
    assert (
        main(["predict", "--model", model, "--split", "test", "--params", str(params), "--out", str(out)])
        == 0
    )
    table = pd.read_csv(out)
    assert len(table) == N_TEST and table["mu"].notna().all()
