"""What the model stages share: which data and methods the pipeline runs, and where things live.

The ``pipeline:`` section of params.yaml; each stage in dvc.yaml lists the keys it reads
(``pipeline.datasets``, ``pipeline.methods``, ...), so one change re-runs only what it touches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from uamt.core.config import DEFAULT_PARAMS, ConfigError, load_section
from uamt.core.errors import DataError
from uamt.core.naming import qe_model_name

SECTION = "pipeline"

#: Folder of the dev-fitted calibrations, ``<dir>/<model>.json`` (calibrate stage; read by evaluate,
#: register and the analyses).
CALIBRATION_DIR = "calibration"


@dataclass(frozen=True)
class PipelineConfig:
    """params.yaml ``pipeline:`` section.

    Attributes
    ----------
    datasets : tuple of str
        Human judgements the models are trained (d_q, d_e), calibrated (dev) and tested (test) on.
        They must share one score scale (e.g. ``wmt21_mqm``: MQM, 0 best, negative worse).
    ood_datasets : tuple of str
        Out-of-domain evaluation data (split ``ood``), e.g. ``ted_mqm``.
    methods : tuple of str
        Single-stage methods the ``train_base`` stage trains (keys of ``uamt.models.METHODS``).
    dup_base : str
        The trained method DUP's second stage builds on (its M_Q).
    register_method : str
        The method whose model is registered and gated (a key of ``methods`` or ``dup``).
    qe_methods : tuple of str
        Single-stage methods also trained reference-free (on <src, mt> only), as ``<method>_qe``:
        the models ``uamt score`` uses when no reference is given.
    register_qe_method : str or None
        The QE model registered (as ``<register.model_name>-qe``) and gated next to the
        reference-based one; a key of ``qe_methods``, or null for none.
    prepared_dir, models_dir, predictions_dir, metrics_dir, plots_dir : str
        Folders (DVC outs).
    workers : int
        Processes the calibrate and evaluate stages spread the models over (each model is fitted and
        measured on its own: the same numbers for any number of workers, up to float rounding where
        torch's thread count orders float32 sums differently; 1 = all in the stage's process).
    """

    datasets: tuple[str, ...] = ("wmt21_mqm",)
    ood_datasets: tuple[str, ...] = ("ted_mqm",)
    methods: tuple[str, ...] = ("point", "mcd_head", "ensemble", "hts", "hts_mcd")
    dup_base: str = "point"
    register_method: str = "hts"
    qe_methods: tuple[str, ...] = ("hts",)
    register_qe_method: str | None = "hts"
    prepared_dir: str = "data/prepared"
    models_dir: str = "models"
    predictions_dir: str = "predictions"
    metrics_dir: str = "metrics"
    plots_dir: str = "plots"
    workers: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"{SECTION}.workers={self.workers!r} must be an integer >= 1")
        check_methods((*self.methods, *self.qe_methods, self.dup_base, self.register_method), SECTION)
        if self.dup_base not in self.methods:
            raise ConfigError(f"{SECTION}.dup_base={self.dup_base!r} must be one of pipeline.methods")
        if self.register_method not in (*self.methods, *self.second_stage_methods):
            raise ConfigError(
                f"{SECTION}.register_method={self.register_method!r} is neither in pipeline.methods nor "
                f"a second-stage method {list(self.second_stage_methods)}"
            )
        extra = [m for m in self.qe_methods if m not in self.methods]
        if extra:
            raise ConfigError(f"{SECTION}.qe_methods {extra} must also be in pipeline.methods")
        if self.register_qe_method is not None and self.register_qe_method not in self.qe_methods:
            raise ConfigError(
                f"{SECTION}.register_qe_method={self.register_qe_method!r} must be one of "
                f"pipeline.qe_methods {list(self.qe_methods)} (or null)"
            )

    @property
    def qe_models(self) -> tuple[str, ...]:
        """Names of the reference-free models (``<method>_qe``)."""
        return tuple(qe_model_name(m) for m in self.qe_methods)

    @property
    def second_stage_methods(self) -> tuple[str, ...]:
        """The methods ``train_dup`` trains over ``dup_base`` (layout ``second_stage``: DUP)."""
        from uamt.models.specs import methods_where

        return methods_where(layout="second_stage")

    @property
    def all_methods(self) -> tuple[str, ...]:
        """Every model the pipeline evaluates: the single-stage ones, the second-stage ones (DUP),
        then the QE models."""
        return (*self.methods, *self.second_stage_methods, *self.qe_models)

    def model_dir(self, method: str) -> Path:
        return Path(self.models_dir) / method


def check_methods(names, where: str) -> None:
    """ConfigError ``<where>: method='x' not supported; choose from [...]`` for the first unknown name."""
    from uamt.models.specs import METHODS

    for name in names:
        if name not in METHODS:
            raise ConfigError(f"{where}: method={name!r} not supported; choose from {sorted(METHODS)}")


def load_pipeline(path: str | Path = DEFAULT_PARAMS) -> PipelineConfig:
    return load_section(PipelineConfig, SECTION, path)


def read_split(prepared_dir: str | Path, split: str, datasets: tuple[str, ...]) -> pd.DataFrame:
    """Rows of ``split`` from the prepared tables that belong to ``datasets`` (index reset)."""
    path = Path(prepared_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(f"{path}: prepared split missing; run `uamt data prepare` (dvc stage prepare) first")
    frame = pd.read_parquet(path)
    frame = frame[frame["dataset"].isin(datasets)].reset_index(drop=True)
    if frame.empty:
        raise DataError(f"{path}: no rows of datasets {list(datasets)} in split {split!r}")
    return frame


def training_splits(model_dir: str | Path) -> frozenset[str]:
    """The splits whose rows trained the model in ``model_dir`` or a model it builds on (DUP's base,
    ``meta["base"]``), from the manifests: neither a calibration nor a paragraph blend may be fitted on them."""
    from uamt.models.api import read_manifest

    meta = read_manifest(Path(model_dir))
    split = (meta.get("config") or {}).get("train_split")
    splits = {str(split)} if split else set()
    if meta.get("base"):
        splits |= training_splits(Path(model_dir) / meta["base"])
    return frozenset(splits)


def paragraph_rows(pipe: PipelineConfig, train_cfg, dev_df: pd.DataFrame, trained_on=()) -> pd.DataFrame | None:
    """The rows a model's paragraph blend is fitted on (:func:`uamt.paragraphs.fit_blend`): those of
    ``train_cfg.paragraph_splits`` (``dev_df`` for its ``dev_split``) less every split in
    ``trained_on`` and the model's own ``train_split``, in that order.  None where the model fits
    no blend (``paragraph_units`` off); DataError when no split is left."""
    if not train_cfg.paragraph_units:
        return None
    excluded = {train_cfg.train_split, *trained_on}
    splits = [split for split in train_cfg.paragraph_splits if split not in excluded]
    if not splits:
        raise DataError(
            f"params.yaml:train_base.paragraph_splits {list(train_cfg.paragraph_splits)} leaves no rows to fit the "
            f"paragraph blend on: the model trained on {sorted(excluded)}; add a split it never saw"
        )
    frames = [dev_df if split == train_cfg.dev_split else read_split(pipe.prepared_dir, split, pipe.datasets) for split in splits]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


#: Suffix of the cache every model stage keeps the texts the encode stage did not encode in
#: (:func:`open_features`): ``cache/embeddings`` -> ``cache/embeddings_on_demand``.
ON_DEMAND_OVERLAY = "on_demand"


def overlay_cache_dir(encode_cfg, overlay: str) -> Path:
    """``<cache_dir>_<overlay>``: a cache of texts read beside the encode stage's, never in it."""
    cache_dir = Path(encode_cfg.cache_dir)
    return cache_dir.with_name(f"{cache_dir.name}_{overlay}")


class OverlayEmbeddingCache:
    """Embeddings read from ``bases`` (the encode stage's :class:`~uamt.encoders.EmbeddingCache`
    and, for the experiment stages, the model stages' on-demand one: never written) where one of
    them holds the text, else from -- or encoded into -- ``overlay`` (a cache of the same encoder).
    Why: the encode stage's cache is a persisted DVC output, hashed; texts a later stage alone
    reads (the out-of-domain split, the synthetic failure rows of training, an experiment's
    perturbed translations...) written into it changed that hash, and the next ``dvc repro`` re-ran
    ``encode``.  The vectors are the same either way (one encoder, one text, one vector).  It lives
    here, built on the cache's public ``in`` and ``get``, and not in :mod:`uamt.encoders`: the encode
    stage does not use it, and a code dependency of that stage re-runs every stage after it."""

    def __init__(self, bases, overlay) -> None:
        bases = list(bases) if isinstance(bases, (list, tuple)) else [bases]
        for base in bases:
            if base.encoder_id != overlay.encoder_id:
                raise ValueError(
                    f"{overlay.path}: an overlay of encoder {overlay.encoder_id!r} over a cache of "
                    f"{base.encoder_id!r}: embeddings of different encoders must never be mixed"
                )
        self.bases, self.overlay = bases, overlay
        self.encoder = overlay.encoder

    def __contains__(self, text: str) -> bool:
        return any(text in cache for cache in (*self.bases, self.overlay))

    def get(self, texts):
        """Pooled per-layer embeddings of ``texts`` (float32, shape [n, num_layers, dim]), as
        :meth:`~uamt.encoders.EmbeddingCache.get`; only texts in no cache are encoded."""
        import numpy as np

        from uamt.encoders.cache import check_texts

        texts = check_texts(texts)
        out = np.empty((len(texts), self.overlay.num_layers, self.overlay.dim), dtype=np.float32)
        left = np.ones(len(texts), dtype=bool)
        for base in self.bases:
            found = left & np.array([text in base for text in texts], dtype=bool)
            if found.any():
                out[found] = base.get([text for text, f in zip(texts, found, strict=True) if f])
                left &= ~found
        if left.any():
            out[left] = self.overlay.get([text for text, f in zip(texts, left, strict=True) if f])
        return out


def overlay_embeddings(encode_cfg, overlay: str = ON_DEMAND_OVERLAY) -> OverlayEmbeddingCache:
    """The cache behind :func:`open_features`: the encode stage's cache (and, for any other
    ``overlay``, the model stages' on-demand one) read only, new texts encoded into
    :func:`overlay_cache_dir` (``overlay``)."""
    from uamt.encoders import EmbeddingCache, get_encoder

    encoder = get_encoder(encode_cfg.encoder)
    base = EmbeddingCache(encode_cfg.cache_dir, encoder, dtype=encode_cfg.dtype)
    bases = [base]
    if overlay != ON_DEMAND_OVERLAY:  # the out-of-domain split evaluate_ood encoded, for instance
        bases.append(EmbeddingCache(overlay_cache_dir(encode_cfg, ON_DEMAND_OVERLAY), encoder, dtype=base.dtype))
    return OverlayEmbeddingCache(bases, EmbeddingCache(overlay_cache_dir(encode_cfg, overlay), encoder, dtype=base.dtype))


def open_features(encode_cfg, overlay: str = ON_DEMAND_OVERLAY):
    """The cached-feature source of the ``encode:`` section (:func:`overlay_embeddings`): the encode
    stage's cache, read only, and the texts it lacks encoded into :func:`overlay_cache_dir`
    (``overlay``: ``on_demand`` for the model stages, ``experiments`` for the analyses, which also
    read the model stages' ``on_demand`` texts), so ``dvc repro`` never finds ``encode``'s output
    changed by a later stage."""
    from uamt.models.data import features_from_cache

    return features_from_cache(overlay_embeddings(encode_cfg, overlay))


def predict_split(model_dir: Path, frame: pd.DataFrame, features, out_path: Path) -> pd.DataFrame:
    """The predictions table of one model on one split, written atomically to ``out_path``."""
    from uamt.core.fileio import atomic_path
    from uamt.models.api import load

    table = load(model_dir).predictions_table(frame, features)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_path) as tmp:
        table.to_parquet(tmp, index=False)
    return table


def load_models(pipe: PipelineConfig, methods) -> dict:
    """``{method: loaded model}`` of the pipeline's ``models/<method>`` folders."""
    from uamt.models.api import load

    return {method: load(pipe.model_dir(method)) for method in methods}
