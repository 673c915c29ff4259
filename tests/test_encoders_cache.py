"""Embedding cache: encode only what is new, atomic shards, locking, id checks; the encode stage."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import stat
import traceback
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from uamt.core.errors import DataError, UamtError
from uamt.encoders import EmbeddingCache, EncoderConfig, get_encoder

LAYERS, DIM = 3, 8


class CountingEncoder:
    """Deterministic fake encoder: a text's vectors come from its sha256; counts what it encodes."""

    def __init__(self, encoder_id: str = "fake-000000000001", num_layers: int = LAYERS, dim: int = DIM):
        self.encoder_id = encoder_id
        self.num_layers = num_layers
        self.dim = dim
        self.calls: list[list[str]] = []

    @staticmethod
    def vectors(text: str, num_layers: int = LAYERS, dim: int = DIM) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
        return np.random.default_rng(seed).normal(size=(num_layers, dim)).astype(np.float32)

    def pooled_layers(self, texts, batch_size=None, train=False):
        self.calls.append(list(texts))
        return torch.from_numpy(np.stack([self.vectors(t, self.num_layers, self.dim) for t in texts]))

    @property
    def n_encoded(self) -> int:
        return sum(len(call) for call in self.calls)


def expected(texts):
    return np.stack([CountingEncoder.vectors(t) for t in texts])


def test_get_encodes_only_new_distinct_texts(tmp_path):
    encoder = CountingEncoder()
    cache = EmbeddingCache(tmp_path, encoder)
    out = cache.get(["a", "b", "a", "c"])
    assert out.shape == (4, LAYERS, DIM) and out.dtype == np.float32
    np.testing.assert_array_equal(out, expected(["a", "b", "a", "c"]))
    assert encoder.n_encoded == 3  # "a" once
    out = cache.get(["c", "d", "a", "e", "d"])
    np.testing.assert_array_equal(out, expected(["c", "d", "a", "e", "d"]))
    assert encoder.n_encoded == 5 and sorted(encoder.calls[-1]) == ["d", "e"]
    cache.get(["e", "a"])
    assert encoder.n_encoded == 5  # all hits: the encoder is not called
    assert cache.get([]).shape == (0, LAYERS, DIM)
    stats = cache.stats()
    assert stats["texts"] == 5 and stats["encoded"] == 5 and stats["shards"] == 2
    assert stats["encoder_id"] == encoder.encoder_id and stats["bytes"] > 5 * LAYERS * DIM * 4
    assert "d" in cache and "zzz" not in cache and len(cache) == 5
    umask = os.umask(0)
    os.umask(umask)
    for path in (cache.path / "index.json", cache.path / "meta.json", *cache.shards_dir.iterdir()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_the_overlay_reads_the_encode_cache_and_writes_only_its_own(tmp_path):
    """Texts of the encode stage's cache come from it, new ones are encoded into the overlay, and the
    encode stage's files never change (DVC hashes them: a change re-ran ``encode``)."""
    from uamt.encoders import EncodeConfig
    from uamt.experiments.common import experiment_cache_dir
    from uamt.pipeline_config import OverlayEmbeddingCache, overlay_cache_dir

    encoder = CountingEncoder()
    base = EmbeddingCache(tmp_path / "base", encoder)
    base.get(["a", "b"])

    def files():
        return {p.name: p.read_bytes() for p in (tmp_path / "base").rglob("*") if p.is_file() and p.name != ".lock"}

    before = files()
    overlay = OverlayEmbeddingCache(base, EmbeddingCache(tmp_path / "overlay", encoder))
    np.testing.assert_array_equal(overlay.get(["b", "new", "a", "new", "other"]), expected(["b", "new", "a", "new", "other"]))
    assert encoder.calls[-1] == ["new", "other"] and encoder.n_encoded == 4
    assert files() == before and len(base) == 2 and "new" not in base
    reopened = OverlayEmbeddingCache(EmbeddingCache(tmp_path / "base", encoder), EmbeddingCache(tmp_path / "overlay", encoder))
    np.testing.assert_array_equal(reopened.get(["new", "a"]), expected(["new", "a"]))
    assert encoder.n_encoded == 4  # nothing encoded twice
    with pytest.raises(ValueError, match="overlay of encoder 'fake-000000000002' over a cache of 'fake-000000000001'"):
        OverlayEmbeddingCache(base, EmbeddingCache(tmp_path / "other", CountingEncoder("fake-000000000002")))
    assert experiment_cache_dir(EncodeConfig(cache_dir="cache/embeddings")) == Path("cache/embeddings_experiments")
    assert overlay_cache_dir(EncodeConfig(cache_dir="cache/embeddings"), "on_demand") == Path("cache/embeddings_on_demand")


def test_reopened_cache_reads_from_disk(tmp_path):
    EmbeddingCache(tmp_path, CountingEncoder()).get(["x", "y"])
    fresh = CountingEncoder()
    cache = EmbeddingCache(tmp_path, fresh)
    np.testing.assert_array_equal(cache.get(["y", "x"]), expected(["y", "x"]))
    assert fresh.n_encoded == 0
    assert (tmp_path / fresh.encoder_id / "meta.json").is_file()
    # handing the encoder folder itself works too
    again = EmbeddingCache(tmp_path / fresh.encoder_id, fresh)
    assert again.path == cache.path and fresh.n_encoded == 0 and len(again) == 2


def test_shard_size_splits_work_and_each_shard_is_registered(tmp_path):
    encoder = CountingEncoder()
    cache = EmbeddingCache(tmp_path, encoder, shard_size=2)
    texts = [f"t{i}" for i in range(7)]
    np.testing.assert_array_equal(cache.get(texts), expected(texts))
    assert [len(call) for call in encoder.calls] == [2, 2, 2, 1]
    index = json.loads((cache.path / "index.json").read_text())
    assert [entry["rows"] for entry in index["shards"]] == [2, 2, 2, 1]


def test_float16_storage_halves_size_and_reads_back_float32(tmp_path):
    texts = [f"sentence {i}" for i in range(20)]
    c32 = EmbeddingCache(tmp_path / "a", CountingEncoder())
    c16 = EmbeddingCache(tmp_path / "b", CountingEncoder(), dtype="float16")
    out32, out16 = c32.get(texts), c16.get(texts)
    assert out16.dtype == np.float32
    np.testing.assert_allclose(out16, out32, rtol=1e-3, atol=1e-3)
    assert not np.array_equal(out16, out32)
    payload32 = c32.stats()["bytes"] - 128  # minus the .npy header
    payload16 = c16.stats()["bytes"] - 128
    assert payload16 * 2 == payload32
    # reopening with dtype=None adopts the stored dtype; asking for another one is refused
    assert EmbeddingCache(tmp_path / "b", CountingEncoder()).dtype == "float16"
    with pytest.raises(UamtError, match="stores float16, asked for float32"):
        EmbeddingCache(tmp_path / "b", CountingEncoder(), dtype="float32")


def test_cache_of_another_encoder_is_refused(tmp_path):
    first = CountingEncoder("enc-aaaaaaaaaaaa")
    cache = EmbeddingCache(tmp_path, first)
    cache.get(["a"])
    other = CountingEncoder("enc-bbbbbbbbbbbb")
    # the encoder folder of `first` handed to `other`
    with pytest.raises(UamtError, match=r"built by encoder 'enc-aaaaaaaaaaaa', not by 'enc-bbbbbbbbbbbb'"):
        EmbeddingCache(cache.path, other)
    # a folder whose metadata names another encoder (e.g. copied or renamed by hand)
    (tmp_path / other.encoder_id).mkdir()
    (tmp_path / other.encoder_id / "shards").mkdir()
    (cache.path / "meta.json").replace(tmp_path / other.encoder_id / "meta.json")
    with pytest.raises(UamtError, match="built by encoder 'enc-aaaaaaaaaaaa'"):
        EmbeddingCache(tmp_path, other)
    # same id but another shape
    with pytest.raises(UamtError, match=r"stores \[num_layers, dim\] = \[3, 8\]"):
        EmbeddingCache(tmp_path / other.encoder_id, CountingEncoder("enc-aaaaaaaaaaaa", dim=4))


def test_killed_write_leaves_nothing_registered_and_is_cleaned_up(tmp_path):
    encoder = CountingEncoder()
    cache = EmbeddingCache(tmp_path, encoder)
    cache.get(["a", "b"])
    # what a writer killed before registering leaves: a shard + keys not in index.json, temp files
    (cache.shards_dir / "000001.npy").write_bytes(b"\x93NUMPY garbage")
    (cache.shards_dir / "000001.keys").write_text("deadbeef\n")
    (cache.shards_dir / ".tmp-000002-xyz.npy").write_bytes(b"half")
    (cache.path / ".tmp-index.json-xyz").write_text("{")
    reopened = EmbeddingCache(tmp_path, CountingEncoder())
    assert len(reopened) == 2
    np.testing.assert_array_equal(reopened.get(["b", "c", "a"]), expected(["b", "c", "a"]))
    assert sorted(p.name for p in cache.shards_dir.iterdir()) == [
        "000000.keys",
        "000000.npy",
        "000001.keys",
        "000001.npy",
    ]
    assert not list(cache.path.glob(".tmp-*"))


class FailingEncoder(CountingEncoder):
    def pooled_layers(self, texts, batch_size=None, train=False):
        if "boom" in texts:
            raise RuntimeError("encoder crashed")
        return super().pooled_layers(texts, batch_size, train)


def test_encoder_failure_registers_nothing(tmp_path):
    cache = EmbeddingCache(tmp_path, FailingEncoder(), shard_size=2)
    with pytest.raises(RuntimeError, match="encoder crashed"):
        cache.get(["a", "b", "boom", "c"])
    # the shards before the crash are kept; nothing of the failed shard is
    good = EmbeddingCache(tmp_path, CountingEncoder())
    stored = {t for t in ["a", "b", "boom", "c"] if t in good}
    assert "boom" not in stored and len(stored) == 2
    np.testing.assert_array_equal(good.get(sorted(stored)), expected(sorted(stored)))


def _worker(root: str, start: int, queue) -> None:
    try:
        encoder = CountingEncoder()
        cache = EmbeddingCache(root, encoder, shard_size=5)
        texts = [f"text {i}" for i in range(start, start + 40)]
        out = cache.get(texts)
        queue.put((encoder.n_encoded, bool(np.array_equal(out, expected(texts)))))
    except BaseException:  # the parent's assertion shows why, not only an exit code
        queue.put((None, traceback.format_exc()))
        raise


def test_two_processes_share_one_cache_without_corruption(tmp_path):
    # Spawned, not forked: under `make test` the test runs in an xdist worker, whose threads a fork
    # would copy mid-flight (a forked child exited 1 there once, 2026-12-07; not reproduced since).
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(str(tmp_path), start, queue)) for start in (0, 20)]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0], results
    assert all(ok is True for _, ok in results), results
    # 60 distinct texts; the 20 shared ones are stored once (a process may encode a few of them in
    # vain before seeing the other's shard, but the lock keeps the index free of duplicates)
    cache = EmbeddingCache(tmp_path, CountingEncoder())
    assert len(cache) == 60
    keys = [k for p in sorted(cache.shards_dir.glob("*.keys")) for k in p.read_text().split()]
    assert len(keys) == len(set(keys)) == 60
    assert 60 <= sum(n for n, _ in results) <= 80


def test_bad_input_is_refused(tmp_path):
    cache = EmbeddingCache(tmp_path, CountingEncoder())
    with pytest.raises(TypeError, match="not a single string"):
        cache.get("abc")
    with pytest.raises(TypeError, match=r"texts\[1\] is NoneType"):
        cache.get(["a", None])
    with pytest.raises(ValueError, match="dtype='bfloat16' not supported"):
        EmbeddingCache(tmp_path, CountingEncoder(), dtype="bfloat16")


def test_cache_with_a_real_encoder_equals_direct_encoding(tmp_path):
    from test_encoders import SENTENCES, make_tiny_bert

    model_dir = make_tiny_bert(tmp_path / "model")
    encoder = get_encoder(EncoderConfig(name="hf", path=str(model_dir)))
    cache = EmbeddingCache(tmp_path / "cache", encoder)
    assert cache.path.name == encoder.encoder_id
    np.testing.assert_allclose(cache.get(SENTENCES), encoder.pooled_layers(SENTENCES).numpy(), atol=1e-6)


def _prepared_table(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_encode_stage_fills_cache_and_writes_manifest(tmp_path, monkeypatch):
    from test_encoders import make_tiny_bert

    from uamt.encoders.precompute import RUN_STATS
    from uamt.stages import encode

    model_dir = make_tiny_bert(tmp_path / "model")
    prepared = tmp_path / "data" / "prepared"
    _prepared_table(
        prepared / "d_q.parquet",
        [
            {"src": "der hund", "mt": "the dog", "ref": "a dog", "refs": ["a dog", "the dog"]},
            {"src": "die katze", "mt": "the cat", "ref": None, "refs": []},
        ],
    )
    _prepared_table(
        prepared / "test.parquet",
        [{"src": "der hund", "mt": "green house", "ref": "the green house", "refs": ["the green house"]}],
    )
    params = tmp_path / "params.yaml"
    params.write_text(
        "encode:\n"
        f"  encoder: {{name: hf, path: {model_dir}, max_length: 32, batch_size: 4, device: cpu}}\n"
        f"  prepared_dir: {prepared}\n"
        f"  cache_dir: {tmp_path / 'cache'}\n"
        "  dtype: float16\n"
    )
    assert encode.main(["--params", str(params)]) == 0
    cache_dirs = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(cache_dirs) == 1
    manifest = json.loads((cache_dirs[0] / "manifest.json").read_text())
    assert manifest == json.loads((tmp_path / "cache" / "manifest.json").read_text())
    # distinct: der hund, the dog, a dog, die katze, the cat, green house, the green house
    run_stats = json.loads((cache_dirs[0] / RUN_STATS).read_text())
    assert manifest["texts_distinct"] == 7 and run_stats["texts_encoded"] == 7
    assert manifest["texts_occurrences"] == 11 and manifest["tables"] == {"d_q.parquet": 2, "test.parquet": 1}
    assert manifest["dtype"] == "float16" and manifest["encoder_id"] == cache_dirs[0].name
    # second run: nothing new to encode, and the manifest downstream stages depend on is unchanged
    first_bytes = (tmp_path / "cache" / "manifest.json").read_bytes()
    assert encode.main(["--params", str(params)]) == 0
    run_stats = json.loads((cache_dirs[0] / RUN_STATS).read_text())
    assert run_stats["texts_encoded"] == 0 and run_stats["texts_already_cached"] == 7
    assert (tmp_path / "cache" / "manifest.json").read_bytes() == first_bytes

    # only the rows of the selected datasets
    cfg = encode.EncodeConfig(
        encoder=EncoderConfig(name="hf", path=str(model_dir)),
        cache_dir=str(tmp_path / "cache2"),
        datasets=("ted_mqm",),
    )
    _prepared_table(
        prepared / "ood.parquet",
        [
            {"dataset": "ted_mqm", "src": "die katze", "mt": "the cat is small", "ref": None, "refs": []},
            {"dataset": "mlqe", "src": "der hund", "mt": "dog", "ref": None, "refs": []},
        ],
    )
    manifest = json.loads((encode.run(cfg, [prepared / "ood.parquet"]) / "manifest.json").read_text())
    assert manifest["texts_distinct"] == 2 and manifest["tables"] == {"ood.parquet": 1}
    with pytest.raises(DataError, match="test.parquet: no 'dataset' column"):
        encode.run(cfg, [prepared / "test.parquet"])

    # a table without the canonical columns is named in the error
    _prepared_table(prepared / "bad.parquet", [{"source": "x"}])
    cfg = encode.EncodeConfig(
        encoder=EncoderConfig(name="hf", path=str(model_dir)), cache_dir=str(tmp_path / "cache")
    )
    with pytest.raises(DataError, match=r"bad.parquet: missing column\(s\) \['src', 'mt'\]"):
        encode.run(cfg, [prepared / "bad.parquet"])
    with pytest.raises(DataError, match="no \\*.parquet tables"):
        encode.run(
            encode.EncodeConfig(prepared_dir=str(tmp_path / "empty"), cache_dir=str(tmp_path / "cache"))
        )
    params.write_text("encode:\n  encoder: {name: hf, pth: x}\n")
    assert encode.main(["--params", str(params)]) == 2


def test_the_out_of_domain_texts_are_encoded_once_into_the_on_demand_cache_and_the_experiments_read_them(tmp_path, monkeypatch):
    """evaluate_ood encodes the out-of-domain split's texts the encode stage left out (and only
    those) into the model stages' on-demand cache; a second run encodes nothing; the experiment
    stages read them there instead of encoding them again into their own cache."""
    import uamt.encoders as encoders
    from uamt.encoders import EncodeConfig
    from uamt.ood_evaluation import encode_ood_texts
    from uamt.pipeline_config import PipelineConfig, overlay_embeddings

    encoder = CountingEncoder()
    monkeypatch.setattr(encoders, "get_encoder", lambda cfg: encoder)
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    rows = {"src": ["s1", "s2", "s3"], "mt": ["m1", "m2", "m3"], "ref": ["r1", "r2", "shared"],
            "dataset": ["ted_mqm", "bio_mqm", "other"], "lp": ["en-de"] * 3}
    pd.DataFrame(rows).to_parquet(prepared / "ood.parquet", index=False)
    encode = EncodeConfig(cache_dir=str(tmp_path / "cache" / "embeddings"))
    EmbeddingCache(encode.cache_dir, encoder).get(["r1"])  # the encode stage held this one
    pipe = PipelineConfig(prepared_dir=str(prepared), ood_datasets=("ted_mqm", "bio_mqm"))

    counts = encode_ood_texts(pipe, encode)
    assert counts["texts"] == 6 and counts["encoded"] == 5  # s1 m1 s2 m2 r2 (r1 cached; row 3 not ood)
    assert sorted(encoder.calls[-1]) == ["m1", "m2", "r2", "s1", "s2"]
    assert "s1" not in EmbeddingCache(encode.cache_dir, encoder)  # the encode stage's cache untouched
    assert encode_ood_texts(pipe, encode)["encoded"] == 0
    calls = len(encoder.calls)
    experiments = overlay_embeddings(encode, "experiments")
    np.testing.assert_array_equal(experiments.get(["s1", "r1", "m2"]), expected(["s1", "r1", "m2"]))
    assert len(encoder.calls) == calls  # read from the on-demand cache, nothing encoded again
    with pytest.raises(DataError, match=r"ood\.parquet: missing; run `dvc repro prepare`"):
        encode_ood_texts(PipelineConfig(prepared_dir=str(tmp_path / "none")), encode)
