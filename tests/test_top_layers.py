"""Fine-tuning only the top k encoder blocks on cached lower-layer states (``finetune_top_layers``).

On tiny random BERT / XLM-R models and real WMT21 MQM rows: the short path (cached states + the top
blocks) computes what the whole encoder computes; training moves only the top blocks (and the head),
reads every training text from the cache, and the saved model is an ordinary fine-tuned one that
predicts the same through the whole encoder as through the cache.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_models_encoder_path import CFG, encoder_for, encoder_tensors, splits, tiny_dirs  # noqa: F401
from uamt.core.errors import UamtError
from uamt.models import TrainConfig, load, train
from uamt.models.data import features_from_encoder
from uamt.models.point import PointEstimator
from uamt.models.top_layers import LowerStates, clear_shared_lower_states, shared_lower_states
from uamt.models.training import LightningAdapter

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ["the cat", "green house in the red garden of the old town", "a", "the old town is green and the cat is red"]


@pytest.fixture(autouse=True)
def fresh_cache():
    clear_shared_lower_states()
    yield
    clear_shared_lower_states()


@pytest.mark.parametrize(("name", "k"), [("bert", 1), ("xlmr", 1), ("xlmr", 2)])
def test_cached_states_plus_top_blocks_equal_the_whole_encoder(tiny_dirs, name, k):  # noqa: F811
    encoder = encoder_for(tiny_dirs[name])
    whole = encoder.pooled_layers(TEXTS, batch_size=4)  # one padded batch of four lengths
    cache = LowerStates(encoder.encoder_id, encoder.num_layers, k)
    pooled, states = encoder.pooled_and_states(TEXTS, cache.state_layer, batch_size=2)
    torch.testing.assert_close(pooled, whole, rtol=0, atol=1e-6)
    assert [s.shape[0] for s in states] == [len(ids) for ids in encoder.tokenize(TEXTS)]
    cache.add(TEXTS, pooled, states)
    below, padded, mask = cache.gather(TEXTS[::-1])
    top = encoder.top_layers_pooled(padded, mask, k)
    short_path = torch.cat([below, top], dim=1)
    torch.testing.assert_close(short_path, whole.flip(0), rtol=0, atol=1e-5)
    # what the network calls: repeated texts run once, in length-sorted chunks, back in the given order
    asked = [TEXTS[3], TEXTS[0], TEXTS[3], TEXTS[2], TEXTS[1], TEXTS[0]]
    through_top = cache.pooled_through_top(encoder, asked, train=False)
    torch.testing.assert_close(through_top, whole[[3, 0, 3, 2, 1, 0]], rtol=0, atol=1e-5)


def test_settings_are_checked(tiny_dirs):  # noqa: F811
    with pytest.raises(ValueError, match="finetune_top_layers=1 needs finetune: true"):
        TrainConfig(finetune_top_layers=1)
    with pytest.raises(ValueError, match="finetune_top_layers=-1"):
        TrainConfig(finetune=True, finetune_top_layers=-1)
    encoder = encoder_for(tiny_dirs["bert"])  # 2 blocks
    with pytest.raises(ValueError, match=r"finetune_top_layers=2: choose 1 <= k < 2"):
        PointEstimator(CFG.replace(finetune=True, finetune_top_layers=2), encoder.num_layers, encoder.dim, encoder=encoder)
    cache = shared_lower_states(encoder, 1)
    with pytest.raises(UamtError, match="cannot be computed with hf-"):
        cache.ensure(["the cat"], encoder_for(tiny_dirs["xlmr"]))
    with pytest.raises(UamtError, match="not in the lower-state cache"):
        cache.gather(["never seen"])


def test_optimiser_holds_the_top_blocks_with_decay_and_the_head(tiny_dirs):  # noqa: F811
    encoder = encoder_for(tiny_dirs["xlmr"])  # 3 blocks
    cfg = CFG.replace(finetune=True, finetune_top_layers=2)
    module = PointEstimator(cfg, encoder.num_layers, encoder.dim, encoder=encoder)
    groups = LightningAdapter(module).configure_optimizers().param_groups
    lr, decay = cfg.encoder_learning_rate, cfg.layerwise_decay
    assert [g["lr"] for g in groups] == pytest.approx([lr, lr * decay, cfg.learning_rate])
    blocks = module.comet_encoder.model.encoder.layer
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in blocks[2].parameters()}
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in blocks[1].parameters()}


@pytest.fixture(scope="module")
def top_trained(tiny_dirs, splits, tmp_path_factory):  # noqa: F811
    """A point model whose top XLM-R block (of 3) was trained on cached states, with what each
    training batch's embedding went through recorded."""
    clear_shared_lower_states()
    encoder = encoder_for(tiny_dirs["xlmr"])
    before = encoder_tensors(encoder)
    calls = {"short": 0, "whole": 0}
    original_top, original_whole = type(encoder).top_layers_pooled, type(encoder).pooled_layers

    def counted_top(self, *args, **kwargs):
        calls["short"] += 1
        return original_top(self, *args, **kwargs)

    def counted_whole(self, *args, **kwargs):
        calls["whole"] += "train" in kwargs  # the network's calls (the frozen feature table's have none)
        return original_whole(self, *args, **kwargs)

    type(encoder).top_layers_pooled, type(encoder).pooled_layers = counted_top, counted_whole
    try:
        path = train(
            "point",
            CFG.replace(finetune=True, finetune_top_layers=1, nr_frozen_epochs=0.0),
            splits["d_q"],
            splits["dev"],
            features_from_encoder(encoder),
            tmp_path_factory.mktemp("top1") / "point",
        )
        cached = len(shared_lower_states(encoder, 1))
    finally:
        type(encoder).top_layers_pooled, type(encoder).pooled_layers = original_top, original_whole
    yield {"path": path, "before": before, "encoder": encoder, "calls": calls, "cached": cached}
    clear_shared_lower_states()


def test_training_moves_only_the_top_block_and_reads_the_cache(top_trained, splits):  # noqa: F811
    state = torch.load(top_trained["path"] / "weights.pt", map_location="cpu", weights_only=True)
    trained = {k.removeprefix("comet_encoder."): v for k, v in state.items() if k.startswith("comet_encoder.")}
    before = top_trained["before"]
    assert set(trained) == set(before)
    moved = sorted({k.split(".")[3] for k in trained if not torch.equal(trained[k], before[k])})
    assert moved == ["2"]  # model.encoder.layer.2.*: the top block only; embeddings and blocks 0-1 frozen
    texts = {t for name in ("d_q", "dev") for c in ("src", "mt", "ref") for t in splits[name][c]}
    assert top_trained["cached"] == len(texts)
    # every step (7 training batches x 3 sides, dev passes) took the short path, never the whole encoder
    assert top_trained["calls"]["whole"] == 0 and top_trained["calls"]["short"] >= 7 * 3


def test_served_through_the_whole_encoder_as_through_the_cache(top_trained, tiny_dirs, splits):  # noqa: F811
    model = load(top_trained["path"], encoder=encoder_for(tiny_dirs["xlmr"]))
    assert model.cfg.finetune_top_layers == 1 and model.module.needs_texts
    features = features_from_encoder(top_trained["encoder"])
    clear_shared_lower_states()  # as a served model: no cache, the whole encoder runs
    served = model.predict(splits["test"], features)["mu"].to_numpy()
    cache = shared_lower_states(top_trained["encoder"], 1)
    cache.ensure([t for c in ("src", "mt", "ref") for t in splits["test"][c]], top_trained["encoder"])
    short = model.predict(splits["test"], features)["mu"].to_numpy()
    np.testing.assert_allclose(short, served, rtol=0, atol=1e-5)
    assert np.std(served) > 0
