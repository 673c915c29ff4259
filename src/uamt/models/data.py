"""Rows of the canonical table -> tensors for the estimators (kept out of the LightningModule).

Every distinct text (source, translation, reference) is embedded once through ``features`` (a callable
``texts -> float32 [n, num_layers, dim]``, normally :meth:`uamt.encoders.cache.EmbeddingCache.get`);
rows then hold indices into that table, so a source shared by 20 systems is stored once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from uamt.core.errors import DataError

if TYPE_CHECKING:  # torch only where rows become tensors: scoring with an exported head never does
    import torch
    from torch.utils.data import DataLoader

FeatureFn = Callable[[list[str]], np.ndarray]


@dataclass(frozen=True)
class FeatureSource:
    """A features callable plus the id of the encoder that produced its embeddings.

    Parameters
    ----------
    fn : callable
        ``texts -> np.ndarray float32 [n, num_layers, dim]``.
    encoder_id : str or None
        ``encoder.encoder_id`` (name + weight hash); compared with the id stored in a checkpoint.
    encoder : object, optional
        The encoder itself (``pooled_layers``), needed by ``mcd_full`` and the fine-tuning path.
    """

    fn: FeatureFn
    encoder_id: str | None = None
    encoder: object | None = None

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.fn(texts)


def features_from_cache(cache) -> FeatureSource:
    """Wrap an :class:`~uamt.encoders.cache.EmbeddingCache` (``cache.get`` / ``cache.encoder``)."""
    encoder = getattr(cache, "encoder", None)
    return FeatureSource(cache.get, getattr(encoder, "encoder_id", None), encoder)


def features_from_encoder(encoder, batch_size: int = 64) -> FeatureSource:
    """Embed on the fly with ``encoder.pooled_layers`` (no cache)."""

    def embed(texts: list[str]) -> np.ndarray:
        pooled_array = getattr(encoder, "pooled_array", None)  # PooledEncoder's; torch-free for ONNX
        if pooled_array is not None:
            return pooled_array(texts, batch_size=batch_size)
        import torch

        with torch.no_grad():
            return encoder.pooled_layers(texts, batch_size=batch_size).detach().cpu().numpy()

    return FeatureSource(embed, encoder.encoder_id, encoder)


def encoder_id_of(features) -> str | None:
    """The encoder id a features callable declares (``encoder_id`` attribute, or its bound cache's)."""
    found = getattr(features, "encoder_id", None)
    if found is None:
        owner = getattr(features, "__self__", None)
        found = getattr(getattr(owner, "encoder", None), "encoder_id", None)
    return found


def encoder_of(features):
    """The encoder object behind ``features`` when it exposes one (for MC dropout through the encoder)."""
    found = getattr(features, "encoder", None)
    if found is None:
        found = getattr(getattr(features, "__self__", None), "encoder", None)
    return found


@dataclass
class EncodedRows:
    """Rows as indices into a table of unique-text embeddings.

    Attributes
    ----------
    table : torch.Tensor, float32 [n_unique, num_layers, dim]
    texts : list[str]
        The unique texts, ``texts[i]`` embedded in ``table[i]``.
    src, mt : torch.LongTensor [n_rows]
    ref : torch.LongTensor [n_rows] or None (reference-free)
    columns : dict[str, torch.Tensor]
        Per-row float tensors [n_rows] (targets, q_hat, ...), gathered into every batch.
    """

    table: torch.Tensor
    texts: list[str]
    src: torch.Tensor
    mt: torch.Tensor
    ref: torch.Tensor | None
    columns: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.src.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.table.shape[1])

    @property
    def dim(self) -> int:
        return int(self.table.shape[2])

    def with_columns(self, **columns: np.ndarray) -> EncodedRows:
        """A view of the same rows with extra per-row columns (float32 [n_rows])."""
        import torch

        added = dict(self.columns)
        for name, values in columns.items():
            values = np.asarray(values, dtype=np.float32)
            if values.shape != (len(self),):
                raise DataError(f"column {name!r} has shape {values.shape}, expected ({len(self)},)")
            added[name] = torch.from_numpy(values.copy())
        return EncodedRows(self.table, self.texts, self.src, self.mt, self.ref, added)

    def batch(self, rows: Sequence[int] | torch.Tensor, with_texts: bool = False) -> dict:
        """Gather one batch: embeddings [B, L, D] per side, the columns, and optionally the texts."""
        import torch

        rows = torch.as_tensor(rows, dtype=torch.long)
        out: dict = {"src": self.table[self.src[rows]], "mt": self.table[self.mt[rows]]}
        if self.ref is not None:
            out["ref"] = self.table[self.ref[rows]]
        for name, values in self.columns.items():
            out[name] = values[rows]
        if with_texts:
            sides = [("src", self.src), ("mt", self.mt)] + (
                [("ref", self.ref)] if self.ref is not None else []
            )
            for side, index in sides:
                out[f"{side}_texts"] = [self.texts[i] for i in index[rows].tolist()]
        return out


def check_rows(df: pd.DataFrame, reference_free: bool, where: str = "table") -> None:
    """Raise :class:`DataError` naming the column / row when ``df`` cannot be scored."""
    needed = ["src", "mt"] + ([] if reference_free else ["ref"])
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise DataError(f"{where}: missing column(s) {missing}; have {sorted(map(str, df.columns))}")
    for column in needed:
        values = df[column]
        bad = values.isna() | (values.astype(str).str.len() == 0)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            hint = " (use the reference-free variant for rows without a reference)" if column == "ref" else ""
            raise DataError(f"{where}: row {row}: column {column!r} is empty or null{hint}")


def index_rows(
    df: pd.DataFrame,
    features: FeatureFn,
    reference_free: bool,
    where: str = "table",
    expected_shape: tuple[int, int] | None = None,
) -> tuple[np.ndarray, list[str], dict[str, np.ndarray]]:
    """Embed the distinct texts of ``df`` once: ``(table, texts, indices)`` in numpy.

    ``table`` float32 [n_unique, num_layers, dim] (``texts[i]`` embedded in ``table[i]``) and
    ``indices[side]`` int64 [n_rows] into it per side (``src``, ``mt`` and, unless
    ``reference_free``, ``ref``).  :func:`encode_rows` wraps it in tensors; an exported head
    (:mod:`uamt.serving.onnx_head`) reads it as it is.

    Raises
    ------
    DataError
        Missing/empty text columns, or ``features`` returning the wrong shape, a non-float dtype,
        non-finite values, or a (num_layers, dim) different from ``expected_shape``.
    """
    check_rows(df, reference_free, where)
    sides = ["src", "mt"] + ([] if reference_free else ["ref"])
    texts: list[str] = []
    position: dict[str, int] = {}
    indices = {}
    for side in sides:
        column = df[side].astype(str).tolist()
        idx = np.empty(len(column), dtype=np.int64)
        for i, text in enumerate(column):
            j = position.get(text)
            if j is None:
                j = position[text] = len(texts)
                texts.append(text)
            idx[i] = j
        indices[side] = idx
    table = np.asarray(features(texts)) if texts else np.zeros((0,) + (expected_shape or (1, 1)), np.float32)
    if table.ndim != 3 or table.shape[0] != len(texts):
        raise DataError(
            f"{where}: features returned shape {table.shape}; expected [{len(texts)}, num_layers, dim]"
        )
    if expected_shape is not None and tuple(table.shape[1:]) != tuple(expected_shape):
        raise DataError(
            f"{where}: features have (num_layers, dim) = {tuple(table.shape[1:])} but the model was trained "
            f"on {tuple(expected_shape)}: the embeddings come from another encoder"
        )
    if not np.issubdtype(table.dtype, np.floating):
        raise DataError(f"{where}: features dtype {table.dtype} is not floating point")
    table = table.astype(np.float32, copy=False)
    if not np.isfinite(table).all():
        raise DataError(f"{where}: features contain NaN or infinite values")
    return np.ascontiguousarray(table), texts, indices


def encode_rows(
    df: pd.DataFrame,
    features: FeatureFn,
    reference_free: bool,
    where: str = "table",
    expected_shape: tuple[int, int] | None = None,
) -> EncodedRows:
    """Embed the distinct texts of ``df`` once and index rows into them (:func:`index_rows` as
    tensors; the same errors)."""
    import torch

    table, texts, indices = index_rows(df, features, reference_free, where, expected_shape)
    return EncodedRows(
        table=torch.from_numpy(table),
        texts=texts,
        src=torch.from_numpy(indices["src"]),
        mt=torch.from_numpy(indices["mt"]),
        ref=torch.from_numpy(indices["ref"]) if "ref" in indices else None,
    )


def make_loader(
    rows: EncodedRows,
    batch_size: int,
    shuffle: bool,
    seed: int = 0,
    with_texts: bool = False,
    drop_last: bool = False,
) -> DataLoader:
    """A DataLoader over row ids that gathers batches with :meth:`EncodedRows.batch` (single process)."""
    import torch
    from torch.utils.data import DataLoader

    generator = torch.Generator()
    generator.manual_seed(seed)
    return DataLoader(
        range(len(rows)),
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        drop_last=drop_last,
        collate_fn=lambda ids: rows.batch(ids, with_texts=with_texts),
        num_workers=0,
    )


@dataclass(frozen=True)
class TargetScaler:
    """Standardise targets on the training split: z = (score - mean) / std; std units back via ``std``."""

    mean: float
    std: float

    @classmethod
    def fit(cls, scores: np.ndarray, where: str = "training split") -> TargetScaler:
        scores = np.asarray(scores, dtype=np.float64)
        if not np.isfinite(scores).all():
            bad = int(np.flatnonzero(~np.isfinite(scores))[0])
            raise DataError(f"{where}: row {bad}: column 'score' is NaN or infinite")
        std = float(scores.std())
        if not std > 0:
            raise DataError(
                f"{where}: column 'score' is constant ({scores[0] if len(scores) else 'no rows'})"
            )
        return cls(float(scores.mean()), std)

    def transform(self, scores: np.ndarray) -> np.ndarray:
        return (np.asarray(scores, dtype=np.float64) - self.mean) / self.std

    def inverse(self, z: np.ndarray) -> np.ndarray:
        return np.asarray(z, dtype=np.float64) * self.std + self.mean


def to_score_scale(out: dict[str, np.ndarray], scaler: TargetScaler) -> pd.DataFrame:
    """A network's standardised outputs (``mu``, ``var`` [, ``epistemic``, ``aleatoric``, ``q_hat``])
    on the human ``score`` scale: ``mu`` and ``q_hat`` through ``scaler.inverse``, ``sigma`` the
    standard deviation ``sqrt(var) * std``, the variance parts times ``std**2``."""
    std = scaler.std
    frame = {"mu": scaler.inverse(out["mu"]), "sigma": np.sqrt(np.asarray(out["var"])) * std}
    for name in ("epistemic", "aleatoric"):
        if name in out:
            frame[name] = np.asarray(out[name]) * std**2
    if "q_hat" in out:
        frame["q_hat"] = scaler.inverse(out["q_hat"])
    return pd.DataFrame(frame)


def targets_of(df: pd.DataFrame, where: str) -> np.ndarray:
    """The ``score`` column as float64, with a clear error when absent or non-finite."""
    if "score" not in df.columns:
        raise DataError(f"{where}: column 'score' is missing")
    scores = pd.to_numeric(df["score"], errors="coerce").to_numpy(dtype=np.float64)
    if not np.isfinite(scores).all():
        bad = int(np.flatnonzero(~np.isfinite(scores))[0])
        raise DataError(f"{where}: row {bad}: column 'score' is NaN or not a number")
    return scores
