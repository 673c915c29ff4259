"""On-disk cache of pooled per-layer sentence embeddings, keyed by encoder and text.

Encoding is the expensive part of every uncertainty method on a CPU; the frozen-feature models
(MC dropout on the head, ensembles, HTS, DUP, ...) only need the pooled layers of each text once.
:class:`EmbeddingCache` stores them under ``root/<encoder_id>/``::

    meta.json            encoder_id, num_layers, dim, dtype (written once)
    index.json           the registered shards, in order: file name and row count
    shards/000000.npy    float32 or float16 array [rows, num_layers, dim]
    shards/000000.keys   sha256(text) of each row, one hex digest a line
    .lock                fcntl lock taken by writers

Shards are immutable and append-only.  A writer holds the lock, writes the shard and its keys to
temporary files in the same folder, ``os.replace``-s them into place and only then registers them
by atomically replacing ``index.json``; a run killed at any point leaves at most unregistered
files, which the next writer deletes.  Readers never need the lock: ``index.json`` is always a
complete file and registered shards never change.

Size: ~120k unique texts x 7 layers x 384 x 4 bytes = 1.3 GB as float32; ``dtype="float16"``
halves it (relative rounding error ~5e-4, below anything a regressor on these features resolves).
Values are always returned as float32.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from uamt.core.errors import UamtError
from uamt.core.fileio import atomic_path, atomic_write_bytes, sha256_text

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
DTYPES = ("float32", "float16")


def check_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list, refusing a bare string or any item that is not a string.

    Parameters
    ----------
    texts : sequence of str

    Returns
    -------
    list of str

    Raises
    ------
    TypeError
        ``texts`` is a single string, or ``texts[i]`` is not a string (the message names ``i``).
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not a single string")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, expected str")
    return texts


def text_key(text: str) -> str:
    """sha256 hex digest of the UTF-8 text: the cache key within one encoder."""
    return sha256_text(text)


class EmbeddingCache:
    """Pooled per-layer embeddings of texts, stored on disk and computed only once.

    Parameters
    ----------
    root : str or Path
        Cache root (the pipeline uses ``cache/embeddings``); this encoder's files live in
        ``root/<encoder.encoder_id>``.  ``root`` may also be such an encoder folder itself
        (it holds a ``meta.json``); it must then belong to ``encoder``.
    encoder : PooledEncoder
        Anything with ``encoder_id``, ``num_layers``, ``dim`` and
        ``pooled_layers(texts, batch_size=None) -> [n, num_layers, dim]``
        (see :func:`uamt.encoders.get_encoder`).
    dtype : {"float32", "float16"} or None
        Storage precision.  ``None``: the existing cache's, or float32 for a new one.
    shard_size : int
        Texts encoded and written per shard (a killed run loses at most one shard of work).
    batch_size : int, optional
        Passed to ``encoder.pooled_layers``.

    Raises
    ------
    UamtError
        The folder was built by another encoder, with another shape or another dtype.
    """

    def __init__(
        self,
        root: str | Path,
        encoder: Any,
        dtype: str | None = None,
        shard_size: int = 4096,
        batch_size: int | None = None,
    ) -> None:
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} not supported; choose from {sorted(DTYPES)}")
        if shard_size < 1:
            raise ValueError(f"shard_size={shard_size} must be >= 1")
        self.encoder = encoder
        self.encoder_id = str(encoder.encoder_id)
        self.num_layers = int(encoder.num_layers)
        self.dim = int(encoder.dim)
        self.shard_size = shard_size
        self.batch_size = batch_size
        root = Path(root)
        if (root / "meta.json").is_file():
            self.path = root  # handed the encoder folder itself
        else:
            self.path = root / self.encoder_id
        self.shards_dir = self.path / "shards"
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.dtype = self._open_meta(dtype)
        self._index_stamp: tuple[int, int] | None = None
        self._shards: list[dict[str, Any]] = []
        self._where: dict[str, tuple[int, int]] = {}
        self._arrays: dict[int, np.ndarray] = {}
        #: texts encoded by this object (not loaded from disk), for logging and tests
        self.n_encoded = 0

    # ------------------------------------------------------------------ metadata and index
    def _open_meta(self, dtype: str | None) -> str:
        meta_path = self.path / "meta.json"
        with self._locked():
            if meta_path.is_file():
                try:
                    meta = json.loads(meta_path.read_text(encoding="utf-8"))
                except json.JSONDecodeError as exc:
                    raise UamtError(f"{meta_path}: not valid JSON ({exc})") from exc
                if meta.get("encoder_id") != self.encoder_id:
                    raise UamtError(
                        f"{self.path}: embedding cache built by encoder {meta.get('encoder_id')!r}, "
                        f"not by {self.encoder_id!r}; use another cache folder (embeddings of "
                        "different encoders must never be mixed)"
                    )
                shape = (meta.get("num_layers"), meta.get("dim"))
                if shape != (self.num_layers, self.dim):
                    raise UamtError(
                        f"{meta_path}: stores [num_layers, dim] = {list(shape)} but the encoder gives "
                        f"{[self.num_layers, self.dim]}"
                    )
                if dtype is not None and meta.get("dtype") != dtype:
                    raise UamtError(
                        f"{meta_path}: stores {meta.get('dtype')}, asked for {dtype}; use another "
                        "cache folder or dtype=None"
                    )
                return str(meta["dtype"])
            meta = {
                "format_version": FORMAT_VERSION,
                "encoder_id": self.encoder_id,
                "num_layers": self.num_layers,
                "dim": self.dim,
                "dtype": dtype or "float32",
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            atomic_write_bytes(meta_path, json.dumps(meta, indent=2).encode())
            return meta["dtype"]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.path / ".lock", "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _read_index(self) -> list[dict[str, Any]]:
        index_path = self.path / "index.json"
        if not index_path.is_file():
            return []
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise UamtError(f"{index_path}: not valid JSON ({exc})") from exc
        return list(index["shards"])

    def _refresh(self) -> None:
        """Load shards registered since the last look (by this or another process)."""
        index_path = self.path / "index.json"
        try:
            stat = index_path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._index_stamp:
            return
        shards = self._read_index()
        for number in range(len(self._shards), len(shards)):
            entry = shards[number]
            keys_path = self.shards_dir / entry["keys"]
            keys = keys_path.read_text(encoding="ascii").split()
            if len(keys) != entry["rows"]:
                raise UamtError(f"{keys_path}: {len(keys)} keys, index.json says {entry['rows']}")
            for row, key in enumerate(keys):
                self._where.setdefault(key, (number, row))
        self._shards = shards
        self._index_stamp = stamp

    def _array(self, number: int) -> np.ndarray:
        if number not in self._arrays:
            entry = self._shards[number]
            shard_path = self.shards_dir / entry["file"]
            array = np.load(shard_path, mmap_mode="r", allow_pickle=False)
            expected = (entry["rows"], self.num_layers, self.dim)
            if array.shape != expected or array.dtype != np.dtype(self.dtype):
                raise UamtError(
                    f"{shard_path}: shape {array.shape} {array.dtype}, expected {expected} {self.dtype}"
                )
            self._arrays[number] = array
        return self._arrays[number]

    def _remove_orphans(self) -> None:
        """Delete files no registered shard names (left by a killed writer). Call under the lock."""
        registered = {name for entry in self._read_index() for name in (entry["file"], entry["keys"])}
        for path in self.shards_dir.iterdir():
            if path.name not in registered:
                log.info("removing unregistered cache file %s", path)
                path.unlink()
        for path in self.path.glob(".tmp-*"):
            path.unlink()

    # ------------------------------------------------------------------ writing
    def _store(self, texts: list[str], keys: list[str]) -> None:
        """Encode ``texts`` (one shard) and register them, unless another process already did."""
        with self._locked():
            self._refresh()
            todo = [i for i, key in enumerate(keys) if key not in self._where]
            if not todo:
                return
            texts = [texts[i] for i in todo]
            keys = [keys[i] for i in todo]
            embeddings = self.encoder.pooled_layers(texts, batch_size=self.batch_size)
            embeddings = np.asarray(
                embeddings.detach().cpu().numpy() if hasattr(embeddings, "detach") else embeddings
            )
            expected = (len(texts), self.num_layers, self.dim)
            if embeddings.shape != expected:
                raise UamtError(
                    f"encoder {self.encoder_id} returned shape {embeddings.shape}, expected {expected}"
                )
            if not np.isfinite(embeddings).all():
                raise UamtError(f"encoder {self.encoder_id} returned non-finite values; nothing stored")
            self.n_encoded += len(texts)
            self._remove_orphans()
            shards = self._read_index()
            stem = f"{len(shards):06d}"
            entry = {"file": f"{stem}.npy", "keys": f"{stem}.keys", "rows": len(texts)}
            with atomic_path(self.shards_dir / entry["file"], suffix=".npy") as tmp:
                np.save(tmp, embeddings.astype(self.dtype), allow_pickle=False)
            atomic_write_bytes(self.shards_dir / entry["keys"], ("\n".join(keys) + "\n").encode("ascii"))
            index = {"format_version": FORMAT_VERSION, "shards": [*shards, entry]}
            atomic_write_bytes(self.path / "index.json", json.dumps(index, indent=1).encode())
            self._refresh()

    # ------------------------------------------------------------------ public API
    def get(self, texts: Sequence[str]) -> np.ndarray:
        """Pooled per-layer embeddings of ``texts``, encoding only those not stored yet.

        Parameters
        ----------
        texts : sequence of str, length n (duplicates allowed; each distinct text is encoded once)

        Returns
        -------
        np.ndarray, float32, shape [n, num_layers, dim], in the order of ``texts``.
        """
        texts = check_texts(texts)
        keys = [text_key(text) for text in texts]
        self._refresh()
        missing: dict[str, str] = {}
        for text, key in zip(texts, keys, strict=True):
            if key not in self._where and key not in missing:
                missing[key] = text
        if missing:
            self._encode_missing(missing)
        return self._gather(keys)

    def _encode_missing(self, missing: dict[str, str]) -> None:
        # Similar lengths in one shard make the encoder's length-sorted batches pad little.
        items = sorted(missing.items(), key=lambda kv: len(kv[1]))
        started = time.perf_counter()
        for start in range(0, len(items), self.shard_size):
            chunk = items[start : start + self.shard_size]
            self._store([text for _, text in chunk], [key for key, _ in chunk])
            done = min(start + self.shard_size, len(items))
            log.info(
                "%s: encoded %d/%d new texts (%.1f s)",
                self.encoder_id,
                done,
                len(items),
                time.perf_counter() - started,
            )

    def _gather(self, keys: list[str]) -> np.ndarray:
        out = np.empty((len(keys), self.num_layers, self.dim), dtype=np.float32)
        by_shard: dict[int, tuple[list[int], list[int]]] = {}
        for position, key in enumerate(keys):
            number, row = self._where[key]
            positions, rows = by_shard.setdefault(number, ([], []))
            positions.append(position)
            rows.append(row)
        for number, (positions, rows) in by_shard.items():
            rows_arr = np.asarray(rows)
            order = np.argsort(rows_arr, kind="stable")  # sorted reads of the memory map
            out[np.asarray(positions)[order]] = self._array(number)[rows_arr[order]]
        return out

    def __contains__(self, text: str) -> bool:
        self._refresh()
        return text_key(text) in self._where

    def __len__(self) -> int:
        self._refresh()
        return len(self._where)

    def stats(self) -> dict[str, Any]:
        """Counts: ``texts`` stored, ``shards``, ``bytes`` on disk, ``encoded`` by this object."""
        self._refresh()
        size = sum((self.shards_dir / entry["file"]).stat().st_size for entry in self._shards)
        return {
            "encoder_id": self.encoder_id,
            "num_layers": self.num_layers,
            "dim": self.dim,
            "dtype": self.dtype,
            "texts": len(self._where),
            "shards": len(self._shards),
            "bytes": int(size),
            "encoded": self.n_encoded,
            "path": str(self.path),
        }
