"""The encoder-in-the-network paths on a CUDA GPU (skipped without one; CI has none).

Tiny randomly initialised BERT (tests.test_encoders) and real WMT21 MQM en-de rows, as in
test_models_encoder_path:

* full fine-tuning with ``train_base.accelerator`` and ``encode.encoder.device`` in every combination
  (the trained copy of the encoder follows the network, its token ids must follow its weights);
* MC dropout through the encoder (``mcd_full``; ``hts_mcd`` with ``mcd_scope='full'`` over a network
  fine-tuned on the GPU) with the encoder on the GPU.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests import test_models_encoder_path as cpu_paths
from tests.test_encoders import make_tiny_bert
from uamt.encoders import EncoderConfig, get_encoder
from uamt.models import load, train
from uamt.models.data import features_from_encoder
from uamt.models.training import LightningAdapter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# The same tiny training settings and real en-de rows (a module-scoped fixture) as the CPU tests.
CFG = cpu_paths.CFG
splits = cpu_paths.splits


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert") / "bert")


def encoder_on(folder, device: str):
    return get_encoder(EncoderConfig(name="hf", path=str(folder), batch_size=32, device=device))


def layer_tensors(encoder) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().cpu().clone()
        for k, v in encoder.comet_encoder.state_dict().items()
        if k.startswith("model.encoder.")
    }


@pytest.mark.parametrize(
    ("encoder_device", "accelerator"), [("cpu", "gpu"), ("cuda", "gpu"), ("cuda", "cpu")]
)
def test_finetune_trains_the_encoder_where_the_accelerator_says(
    tiny_bert, splits, tmp_path, encoder_device, accelerator
):
    encoder = encoder_on(tiny_bert, encoder_device)
    before = layer_tensors(encoder)
    seen = []
    original = LightningAdapter.on_train_batch_start

    def recording(self, batch, batch_idx):
        original(self, batch, batch_idx)
        seen.append((next(self.estimator.comet_encoder.parameters()).device.type, batch["y"].device.type))

    LightningAdapter.on_train_batch_start = recording
    try:
        path = train(
            "hts",
            CFG.replace(finetune=True, accelerator=accelerator),
            splits["d_q"],
            splits["dev"],
            features_from_encoder(encoder),
            tmp_path / "hts",
        )
    finally:
        LightningAdapter.on_train_batch_start = original
    expected = "cuda" if accelerator == "gpu" else "cpu"
    assert seen and all(pair == (expected, expected) for pair in seen)
    state = torch.load(path / "weights.pt", map_location="cpu", weights_only=True)
    assert all(not torch.equal(state[f"comet_encoder.{k}"], v) for k, v in before.items())
    # the caller's encoder is untouched and stays where it was
    assert all(torch.equal(v, before[k]) for k, v in layer_tensors(encoder).items())
    assert next(encoder.comet_encoder.parameters()).device.type == torch.device(encoder_device).type
    pred = load(path, encoder=encoder).predict(splits["test"], features_from_encoder(encoder))
    assert np.isfinite(pred["mu"]).all() and (pred["sigma"] > 0).all()


def test_mc_dropout_through_the_encoder_on_the_gpu(tiny_bert, splits, tmp_path):
    encoder = encoder_on(tiny_bert, "cuda")
    features = features_from_encoder(encoder)
    devices = []
    hook = encoder.comet_encoder.register_forward_hook(
        lambda module, args, kwargs, out: devices.append(kwargs["input_ids"].device.type), with_kwargs=True
    )
    try:
        path = train(
            "mcd_full", CFG.replace(accelerator="gpu"), splits["d_q"], splits["dev"], features, tmp_path / "m"
        )
        devices.clear()
        pred = load(path).predict(splits["test"], features)
    finally:
        hook.remove()
    # the texts are embedded once (features), then every pass runs the encoder on src, mt and ref
    assert len(devices) >= CFG.mc_samples * 3 and set(devices) == {"cuda"}
    assert np.isfinite(pred["mu"]).all() and (pred["sigma"] > 0).all()
    np.testing.assert_allclose(pred["sigma"] ** 2, pred["epistemic"], rtol=1e-6)
    pd.testing.assert_frame_equal(pred, load(path).predict(splits["test"], features))


def test_finetuned_hts_mcd_full_scope_on_the_gpu(tiny_bert, splits, tmp_path):
    encoder = encoder_on(tiny_bert, "cuda")
    features = features_from_encoder(encoder)
    cfg = CFG.replace(finetune=True, mcd_scope="full", accelerator="gpu")
    path = train("hts_mcd", cfg, splits["d_q"], splits["dev"], features, tmp_path / "hts_mcd")
    model = load(path, encoder=encoder)
    assert next(model.module.comet_encoder.parameters()).device.type == "cuda"
    pred = model.predict(splits["test"], features)
    assert (pred["epistemic"] > 0).all() and (pred["aleatoric"] > 0).all()
    pd.testing.assert_frame_equal(pred, model.predict(splits["test"], features))
