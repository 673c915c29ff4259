"""Fill the embedding cache ahead of training: every text of the prepared splits (stage ``encode``).

Collects the distinct ``src``, ``mt``, ``ref`` and ``refs`` texts of canonical tables and stores the
pooled per-layer embeddings of those not cached yet under ``<cache_dir>/<encoder_id>/`` (see
:mod:`uamt.encoders.cache`).  Writes ``<cache_dir>/<encoder_id>/manifest.json`` and a copy at
``<cache_dir>/manifest.json`` (a path that does not depend on the encoder, for dvc.yaml): encoder id,
shapes and a hash of the texts -- the same bytes whenever the same texts are cached, so a re-run with
nothing new re-runs nothing downstream -- and ``encode_run.json`` beside it with this run's counters
and timings.  :class:`EncodeConfig` (params.yaml ``encode:``) also says where every model reads its
features from.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from uamt.core.errors import DataError
from uamt.core.fileio import atomic_write_bytes, sha256_text
from uamt.encoders.cache import EmbeddingCache, text_key
from uamt.encoders.catalog import EncoderConfig, get_encoder

#: Counters and timings of the last encode run (not a pipeline dependency; see run()).
RUN_STATS = "encode_run.json"

log = logging.getLogger(__name__)

TEXT_COLUMNS = ("src", "mt", "ref", "refs")


@dataclass(frozen=True)
class EncodeConfig:
    """params.yaml ``encode:`` section.

    Attributes
    ----------
    encoder : EncoderConfig
        Which encoder (``name``, ``path``, ``max_length``, ``batch_size``, ``device``).
    prepared_dir : str
        Folder of the canonical ``<split>.parquet`` tables.
    cache_dir : str
        Cache root; the embeddings go to ``<cache_dir>/<encoder_id>/``.
    dtype : {"float32", "float16"}
        Storage precision (float16 halves the ~1.3 GB of float32 MiniLM features; read back as float32).
    shard_size : int
        Texts per shard file (a killed run loses at most one shard of work).
    datasets : list of str or None
        Encode only rows of these ``dataset`` values (``None``: every row).  Texts missing from the
        cache are still encoded on demand by :meth:`EmbeddingCache.get`; this only decides what
        is computed ahead.
    paragraph_units : bool
        Also encode the aligned sentence units of multi-sentence rows (:func:`uamt.paragraphs.unit_texts`),
        which models trained with ``train_base.paragraph_units`` score beside the whole row.
    """

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    prepared_dir: str = "data/prepared"
    cache_dir: str = "cache/embeddings"
    dtype: Literal["float32", "float16"] = "float32"
    shard_size: int = 4096
    datasets: tuple[str, ...] | None = None
    paragraph_units: bool = False


def collect_texts(
    paths: Sequence[str | Path], datasets: Sequence[str] | None = None, paragraph_units: bool = False
) -> tuple[list[str], dict[str, int], int]:
    """Distinct texts of the text columns of canonical tables, in first-seen order.

    Returns
    -------
    texts : list of str
        Distinct non-empty texts of ``src``, ``mt``, ``ref`` and every element of ``refs``, and
        with ``paragraph_units`` the texts of the sentence units of multi-sentence rows.
    rows : dict
        File name -> number of rows used (after the ``datasets`` filter).
    n_occurrences : int
        Number of texts before de-duplication.
    """
    import pandas as pd

    seen: dict[str, None] = {}
    rows: dict[str, int] = {}
    n_occurrences = 0
    for path in paths:
        path = Path(path)
        try:
            frame = pd.read_parquet(path, columns=None)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
            raise DataError(f"{path}: cannot read as parquet ({exc})") from exc
        missing = [column for column in ("src", "mt") if column not in frame.columns]
        if missing:
            raise DataError(f"{path}: missing column(s) {missing}; expected the canonical table")
        if datasets is not None:
            if "dataset" not in frame.columns:
                raise DataError(f"{path}: no 'dataset' column to select datasets {list(datasets)} by")
            frame = frame[frame["dataset"].isin(list(datasets))]
        rows[path.name] = len(frame)
        for column in TEXT_COLUMNS:
            if column not in frame.columns:
                continue
            for row, value in enumerate(frame[column].tolist()):
                values = value if column == "refs" else [value]
                if values is None:
                    continue
                for text in values:
                    if text is None or (isinstance(text, float) and text != text):
                        if column in ("src", "mt"):
                            raise DataError(f"{path}: row {row} has no {column}")
                        continue
                    if not isinstance(text, str):
                        raise DataError(
                            f"{path}: row {row} column {column}: {type(text).__name__}, expected str"
                        )
                    n_occurrences += 1
                    if text:
                        seen[text] = None
        if paragraph_units:
            from uamt.paragraphs import unit_texts

            units = unit_texts(frame)
            n_occurrences += len(units)
            seen.update(dict.fromkeys(units))
    return list(seen), rows, n_occurrences


def precompute_embeddings(cfg: EncodeConfig, splits: Sequence[str | Path] | None = None) -> Path:
    """Encode every text of ``splits`` not yet cached; return the encoder's cache folder.

    Parameters
    ----------
    cfg : EncodeConfig
    splits : sequence of paths, optional
        Canonical parquet tables; default every ``*.parquet`` in ``cfg.prepared_dir``.

    Returns
    -------
    Path
        ``<cache_dir>/<encoder_id>``, holding the shards, ``index.json`` and ``manifest.json``.
    """
    if splits is None:
        splits = sorted(Path(cfg.prepared_dir).glob("*.parquet"))
        if not splits:
            raise DataError(f"{cfg.prepared_dir}: no *.parquet tables to encode (run the prepare stage)")
    started = time.perf_counter()
    texts, rows, n_occurrences = collect_texts(splits, cfg.datasets, cfg.paragraph_units)
    encoder = get_encoder(cfg.encoder)
    cache = EmbeddingCache(cfg.cache_dir, encoder, dtype=cfg.dtype, shard_size=cfg.shard_size)
    log.info("%s: %d distinct texts in %d tables", encoder.encoder_id, len(texts), len(rows))
    encode_started = time.perf_counter()
    already = sum(text in cache for text in texts)
    cache.get(texts)
    encode_seconds = time.perf_counter() - encode_started
    stats = cache.stats()
    # manifest.json is what downstream stages depend on (dvc.yaml): only what the models read --
    # the encoder and which texts are cached -- so re-running encode with nothing new leaves it
    # byte-identical and retrains nothing.  Counters and timings of this run go to encode_run.json.
    manifest = {
        "encoder_id": encoder.encoder_id,
        "encoder": {
            "name": cfg.encoder.name,
            "path": cfg.encoder.path,
            "max_length": cfg.encoder.max_length,
        },
        "num_layers": stats["num_layers"],
        "dim": stats["dim"],
        "dtype": stats["dtype"],
        "datasets": list(cfg.datasets) if cfg.datasets is not None else None,
        "paragraph_units": cfg.paragraph_units,
        "tables": rows,
        "texts_occurrences": n_occurrences,
        "texts_distinct": len(texts),
        "texts_sha256": sha256_text("\n".join(sorted(map(text_key, texts)))),
    }
    run_stats = {
        "encoder_id": encoder.encoder_id,
        "texts_distinct": len(texts),
        "texts_already_cached": already,
        "texts_encoded": stats["encoded"],
        "texts_stored": stats["texts"],
        "shards": stats["shards"],
        "bytes": stats["bytes"],
        "encode_seconds": round(encode_seconds, 3),
        "seconds": round(time.perf_counter() - started, 3),
        "texts_per_second": round(stats["encoded"] / encode_seconds, 2)
        if stats["encoded"] and encode_seconds > 0
        else None,
    }
    for name, content in (("manifest.json", manifest), (RUN_STATS, run_stats)):
        payload = (json.dumps(content, indent=2) + "\n").encode()
        atomic_write_bytes(cache.path / name, payload)
        if cache.path.parent == Path(cfg.cache_dir):
            atomic_write_bytes(Path(cfg.cache_dir) / name, payload)
    log.info(
        "%s: %d encoded, %d stored, %.1f s (%s texts/s)",
        encoder.encoder_id,
        stats["encoded"],
        stats["texts"],
        encode_seconds,
        run_stats["texts_per_second"] if run_stats["texts_per_second"] is not None else "-",
    )
    return cache.path
