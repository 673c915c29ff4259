"""Train, save, load and run every estimator: the one entry point for stages, the CLI and MLflow.

Model folder (written to a temp folder beside ``out_dir``, then renamed into place; ``model.json``
is written last, so a folder without a complete ``model.json`` is never loaded)::

    out_dir/model.json      method, config, encoder_id, (num_layers, dim), target mean/std, state
    out_dir/weights.pt      state_dict (single-network methods and DUP's M_E)
    out_dir/members/<k>/    ensemble members (each a model folder)
    out_dir/base/           DUP: a copy of the base model M_Q

Example
-------
>>> path = train("hts", cfg, train_df, dev_df, features, "models/hts")          # doctest: +SKIP
>>> load(path).predict(test_df, features)          # DataFrame[mu, sigma, aleatoric]  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from uamt.core.config import from_dict
from uamt.core.errors import DataError, UamtError
from uamt.core.fileio import atomic_dir as fileio_atomic_dir
from uamt.core.fileio import atomic_write_text
from uamt.encoders.catalog import weights_id
from uamt.models.base import Estimator, save_weights
from uamt.models.config import TrainConfig
from uamt.models.data import (
    EncodedRows,
    TargetScaler,
    encode_rows,
    encoder_id_of,
    encoder_of,
    targets_of,
    to_score_scale,
)
from uamt.models.ensemble import combine_members, run_members
from uamt.models.mcd import head_samples
from uamt.models.row_features import with_row_features
from uamt.models.specs import ENSEMBLE_MEMBERS, MethodSpec, get_loss, get_method, get_spec
from uamt.paragraphs import MANIFEST_KEY as PARAGRAPHS
from uamt.paragraphs import ParagraphBlend, fit_blend, predict_with_blend

MANIFEST = "model.json"
WEIGHTS = "weights.pt"
FORMAT = "uamt-model/1"

#: Columns of the predictions table (docs/architecture.md); optional ones follow when present.
TABLE_COLUMNS = ("dataset", "lp", "seg_id", "system", "human", "mu", "sigma")
OPTIONAL_COLUMNS = ("epistemic", "aleatoric", "q_hat")
#: Labels of the prepared rows a predictions table carries (when present and never missing):
#: ``doc`` (folds of the cross-fitted calibration) and ``domain`` (coverage per domain).
CARRIED_LABELS = ("doc", "domain")


# --------------------------------------------------------------------------- saving
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def recover_stale(out_dir: Path) -> list[Path]:
    """Clean up after a training process that was killed (SIGKILL, OOM) while writing ``out_dir``.

    Temp folders ``.<name>.tmp-<pid>-*`` and ``.<name>.old-<pid>`` of processes that no longer run
    are removed; when ``out_dir`` itself is missing because the kill fell between the two renames
    of :func:`atomic_dir`, the previous complete model (``.old-<pid>``) is put back first.
    Folders of live processes are left alone.  Returns the paths removed or restored.
    """
    out_dir = Path(out_dir)
    parent = out_dir.parent
    if not parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(out_dir.name)}\.(tmp|old)-(\d+)(-.*)?$")
    touched = []
    for path in sorted(parent.iterdir()):
        match = pattern.match(path.name)
        if not match or _pid_alive(int(match.group(2))):
            continue
        if match.group(1) == "old" and not out_dir.exists() and (path / MANIFEST).is_file():
            os.replace(path, out_dir)
        else:
            shutil.rmtree(path, ignore_errors=True)
        touched.append(path)
    return touched


@contextlib.contextmanager
def atomic_dir(out_dir: Path):
    """Yield a temp folder beside ``out_dir``; on success it replaces ``out_dir``, on error it is removed.

    The temp folder's name carries the process id, so leftovers of a killed process are recognised
    and removed by the next run (:func:`recover_stale`).
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    recover_stale(out_dir)
    with fileio_atomic_dir(out_dir) as tmp:
        yield tmp


def _config_dict(cfg: TrainConfig) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def manifest(cfg: TrainConfig, encoder_id: str | None, rows: EncodedRows, scaler: TargetScaler, **extra) -> dict:
    """The ``model.json`` of a model trained with ``cfg`` on ``rows``: what every method stores
    (method, config, encoder, embedding shape, target scaling, library versions) plus ``extra``."""
    return {
        "method": cfg.method,
        "config": _config_dict(cfg),
        "encoder_id": encoder_id,
        "num_layers": rows.num_layers,
        "dim": rows.dim,
        "target_mean": scaler.mean,
        "target_std": scaler.std,
        "versions": _versions(),
        **extra,
    }


def _fit_facts(module: Estimator, train_rows: EncodedRows, dev_rows: EncodedRows) -> dict:
    return {"best_val_loss": module.best_val_loss, "n_train": len(train_rows), "n_dev": len(dev_rows)}


def write_manifest(folder: Path, meta: dict) -> None:
    """Write ``model.json`` (temp file + os.replace); call it last, it marks the folder complete."""
    meta = {"format": FORMAT, **meta, "complete": True}
    atomic_write_text(folder / MANIFEST, json.dumps(meta, indent=2, sort_keys=True))


def read_manifest(model_dir: Path) -> dict:
    """The manifest of a complete model folder, else UamtError naming what is missing."""
    model_dir = Path(model_dir)
    path = model_dir / MANIFEST
    if not path.is_file():
        raise UamtError(f"{model_dir}: not a trained model (no {MANIFEST}; training unfinished or failed)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UamtError(f"{path}: corrupt manifest ({exc})") from exc
    if meta.get("format") != FORMAT or not meta.get("complete"):
        raise UamtError(f"{path}: not a complete {FORMAT} model")
    return meta


# --------------------------------------------------------------------------- training
def _encode_pair(cfg, train_df, dev_df, features):
    train_rows = encode_rows(train_df, features, cfg.reference_free, where="training split")
    dev_rows = encode_rows(
        dev_df, features, cfg.reference_free, where="dev split", expected_shape=train_rows.table.shape[1:]
    )
    return (
        with_row_features(train_rows, train_df, cfg.row_features, "training split"),
        with_row_features(dev_rows, dev_df, cfg.row_features, "dev split"),
    )


def _subset(rows: EncodedRows, keep: np.ndarray | None) -> EncodedRows:
    if keep is None:
        return rows
    index = torch.from_numpy(np.flatnonzero(keep))
    return EncodedRows(
        rows.table,
        rows.texts,
        rows.src[index],
        rows.mt[index],
        None if rows.ref is None else rows.ref[index],
        {k: v[index] for k, v in rows.columns.items()},
    )


def _train_single(
    cfg: TrainConfig,
    train_rows: EncodedRows,
    dev_rows: EncodedRows,
    train_df: pd.DataFrame,
    dev_df: pd.DataFrame,
    scaler: TargetScaler,
    folder: Path,
    encoder_id: str | None,
    encoder=None,
) -> dict:
    """Train one single-network model into ``folder`` (already a temp location); returns its manifest."""
    cls = get_method(cfg.method)
    state: dict = {}
    train_cols, train_keep = cls.target_columns(train_df, scaler, cfg, "training split", state)
    dev_cols, dev_keep = cls.target_columns(dev_df, scaler, cfg, "dev split", state)
    train_rows = _subset(train_rows.with_columns(**train_cols), train_keep)
    dev_rows = _subset(dev_rows.with_columns(**dev_cols), dev_keep)
    from uamt.models.training import fit, seed_everything  # Lightning: imported only to train

    seed_everything(cfg.seed)  # initial weights depend on the seed
    module = cls(cfg, train_rows.num_layers, train_rows.dim, encoder=encoder)
    if cfg.init_from is not None:
        _warm_start(module, cfg, train_rows)
    fit(module, train_rows, dev_rows, folder)
    save_weights(module, folder / WEIGHTS)
    meta = manifest(cfg, encoder_id, train_rows, scaler, state=state, **_fit_facts(module, train_rows, dev_rows))
    write_manifest(folder, meta)
    return meta


def _warm_start(module: Estimator, cfg: TrainConfig, rows: EncodedRows) -> None:
    """Load ``cfg.init_from``'s weights into ``module`` (UamtError naming what does not match)."""
    source = Path(cfg.init_from)
    meta = read_manifest(source)
    found = get_spec(meta.get("method"))
    if found.layout != "network":
        raise UamtError(f"init_from={source}: a {meta.get('method')!r} model is not a single network")
    theirs = meta.get("config") or {}
    mine = _config_dict(cfg)
    checks = {
        "head": (found.estimator.out_dim, module.out_dim),
        "encoder layers x dim": ((meta.get("num_layers"), meta.get("dim")), (rows.num_layers, rows.dim)),
        "hidden_sizes": (list(theirs.get("hidden_sizes") or []), list(mine["hidden_sizes"])),
        "reference_free": (theirs.get("reference_free"), mine["reference_free"]),
        "finetune": (theirs.get("finetune"), mine["finetune"]),
    }
    for what, (source_value, needed) in checks.items():
        if source_value != needed:
            raise UamtError(f"init_from={source}: its {what} is {source_value!r}, this training needs {needed!r}")
    weights = source / WEIGHTS
    try:
        module.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    except (OSError, RuntimeError, EOFError) as exc:
        raise UamtError(f"{weights}: cannot start from these weights ({exc})") from exc


def _train_member(cfg, train_rows, dev_rows, train_df, dev_df, scaler, folder, encoder_id, encoder=None) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    return _train_single(cfg, train_rows, dev_rows, train_df, dev_df, scaler, folder, encoder_id, encoder)[
        "best_val_loss"
    ]


def _versions() -> dict:
    import comet
    import pytorch_lightning

    return {
        "torch": torch.__version__,
        "pytorch_lightning": pytorch_lightning.__version__,
        "comet": comet.__version__,
    }


def train(
    method: str,
    cfg: TrainConfig,
    train_df: pd.DataFrame,
    dev_df: pd.DataFrame,
    features,
    out_dir: str | Path,
    base_model_dir: str | Path | None = None,
    encoder=None,
    paragraph_df: pd.DataFrame | None = None,
) -> Path:
    """Train ``method`` on ``train_df`` (early stopping on ``dev_df``) and write the model to ``out_dir``.

    Parameters
    ----------
    method : str
        A key of :data:`uamt.models.specs.METHODS`.
    cfg : TrainConfig
        Hyper-parameters (``cfg.method`` is overridden by ``method``).
    train_df, dev_df : DataFrame
        Canonical-table rows: ``src``, ``mt``, ``ref`` (unless ``cfg.reference_free``), ``score``
        (KL also ``score_std``, ``n_annotators``).  Targets are standardised on ``train_df``.
    features : callable
        ``texts -> float32 [n, num_layers, dim]`` (e.g. ``features_from_cache(cache)``); its
        ``encoder_id`` attribute, when present, is stored and checked at prediction time.
    out_dir : path
        Replaced atomically when training succeeds; untouched when it fails.
    base_model_dir : path, optional
        DUP only: the trained first-stage model (else ``cfg.base_model_dir``).
    encoder : optional
        The encoder object, needed when ``cfg.finetune`` (default: the one behind ``features``).
    paragraph_df : DataFrame, optional
        With ``cfg.paragraph_units``: the rows the paragraph blend is fitted on, none of them a
        training row (default ``dev_df``; the stages pass
        :func:`uamt.pipeline_config.paragraph_rows`).

    Returns
    -------
    Path
        ``out_dir``.
    """
    spec = get_spec(method)
    cfg = cfg.replace(method=method)
    if cfg.finetune and encoder is None:
        encoder = encoder_of(features)
    trainer = _TRAINERS[spec.layout]
    out_dir = trainer(cfg, train_df, dev_df, features, Path(out_dir), base_model_dir or cfg.base_model_dir, encoder)
    if cfg.paragraph_units:
        try:
            fit_paragraphs(out_dir, cfg, dev_df if paragraph_df is None else paragraph_df, features, encoder)
        except BaseException:
            # The trainer's manifest marked the folder complete; without the blend it was configured
            # for, the model would load and serve every paragraph whole. Unmark it: not a model.
            (Path(out_dir) / MANIFEST).unlink(missing_ok=True)
            raise
    return out_dir


def _train_network(cfg, train_df, dev_df, features, out_dir: Path, base_model_dir, encoder) -> Path:
    scaler = TargetScaler.fit(targets_of(train_df, "training split"), "training split")
    train_rows, dev_rows = _encode_pair(cfg, train_df, dev_df, features)
    with atomic_dir(out_dir) as tmp:
        _train_single(
            cfg, train_rows, dev_rows, train_df, dev_df, scaler, tmp, encoder_id_of(features), encoder
        )
    return out_dir


def _train_ensemble(cfg, train_df, dev_df, features, out_dir: Path, base_model_dir, encoder) -> Path:
    scaler = TargetScaler.fit(targets_of(train_df, "training split"), "training split")
    train_rows, dev_rows = _encode_pair(cfg, train_df, dev_df, features)
    encoder_id = encoder_id_of(features)
    if cfg.ensemble_member not in ENSEMBLE_MEMBERS:
        raise ValueError(
            f"ensemble_member={cfg.ensemble_member!r} not supported; choose from {sorted(ENSEMBLE_MEMBERS)}"
        )
    if cfg.ensemble_size < 2:
        raise UamtError(f"ensemble_size={cfg.ensemble_size}; an ensemble needs at least 2 members")
    with atomic_dir(out_dir) as tmp:
        jobs = [
            (
                cfg.replace(method=cfg.ensemble_member, seed=cfg.seed + k),
                train_rows,
                dev_rows,
                train_df,
                dev_df,
                scaler,
                tmp / "members" / str(k),
                encoder_id,
            )
            for k in range(cfg.ensemble_size)
        ]
        if cfg.finetune:
            # The paper's deep ensemble: each member fine-tunes its own copy of the encoder, one after
            # another on the one device (a worker process could not share the caller's GPU encoder).
            losses = [_train_member(*job, encoder) for job in jobs]
        else:
            losses = run_members(_train_member, jobs, cfg.n_jobs)
        members = [f"members/{k}" for k in range(cfg.ensemble_size)]
        meta = manifest(cfg, encoder_id, train_rows, scaler, members=members, member_val_losses=losses)
        write_manifest(tmp, meta)
    return out_dir


def _train_dup(cfg, train_df, dev_df, features, out_dir: Path, base_model_dir, encoder) -> Path:
    get_loss(cfg.dup_loss)
    if base_model_dir is None:
        raise UamtError(
            "method 'dup' needs its base model M_Q: set train_dup.base_model_dir (or pass base_model_dir) "
            "to a model trained first, e.g. `uamt train --method point`"
        )
    base_dir = Path(base_model_dir)
    if not (base_dir / MANIFEST).is_file():
        raise UamtError(
            f"method 'dup' needs its base model M_Q, but {base_dir} holds no trained model; "
            "train it first (e.g. `uamt train --method point`)"
        )
    base = load(base_dir)
    if base.spec.layout != "network":
        raise UamtError(f"{base_dir}: DUP's base model must be a single network, not {base.method!r}")
    encoder_id = encoder_id_of(features)
    base.check_features(features)
    base.attach_encoder(encoder if encoder is not None else encoder_of(features))
    train_rows, dev_rows = _encode_pair(cfg, train_df, dev_df, features)
    columns = {}
    for name, df, rows in (("training split", train_df, train_rows), ("dev split", dev_df, dev_rows)):
        base_rows = (
            with_row_features(rows, df, base.cfg.row_features, name)
            if base.cfg.reference_free == cfg.reference_free
            else base.encode(df, features, name)
        )
        q_hat = base.predict_standardised(base_rows)["mu"]
        z = base.scaler.transform(targets_of(df, name))
        columns[name] = {"q_hat": q_hat, "y": np.abs(q_hat - z)}
    train_rows = train_rows.with_columns(**columns["training split"])
    dev_rows = dev_rows.with_columns(**columns["dev split"])
    cls = get_method(cfg.method)
    from uamt.models.training import fit, seed_everything

    seed_everything(cfg.seed)
    module = cls(cfg, train_rows.num_layers, train_rows.dim, encoder=encoder)
    with atomic_dir(out_dir) as tmp:
        fit(module, train_rows, dev_rows, tmp)
        save_weights(module, tmp / WEIGHTS)
        shutil.copytree(base_dir, tmp / "base")
        meta = manifest(
            cfg,
            encoder_id,
            train_rows,
            base.scaler,
            base="base",
            base_source=str(base_dir),
            **_fit_facts(module, train_rows, dev_rows),
        )
        write_manifest(tmp, meta)
    return out_dir


# --------------------------------------------------------------------------- paragraphs
def fit_paragraphs(out_dir: Path, cfg: TrainConfig, rows: pd.DataFrame, features, encoder=None) -> None:
    """Fit the paragraph blend of the model in ``out_dir`` on ``rows`` (never its training rows:
    their μ would be in-sample) and record it, or why there is none, in the manifest under
    ``paragraphs`` with the splits of ``rows`` (column ``split``) as ``fitted_on``
    (:func:`uamt.paragraphs.fit_blend`).  A model built on a base model whose μ it serves (DUP)
    records the base's blend instead, so that both serve one μ."""
    model = load(out_dir, encoder=encoder)
    base = getattr(model, "base", None)
    if base is not None:
        # DUP: its mu is its base model's, so is the blend of that mu (refitted on DUP's own rows,
        # dev alone, it scored test en-de .025 below its base: docs/quality.md)
        own = base.meta.get(PARAGRAPHS) or {"fit": "the base model scores every row whole"}
        entry = {**own, "fit": f"the base model's blend, {own['fit']}"}
    else:
        splits = list(dict.fromkeys(rows["split"].astype(str))) if "split" in rows.columns else []
        blend, why = fit_blend(
            lambda frame: model.predict_whole(frame, features, None, encoder),
            rows,
            targets_of(rows, f"paragraph fit rows ({'+'.join(splits) or 'given'})"),
            # a reference-free model aligns to the source: it is served without a reference
            alignment="source" if cfg.reference_free else "reference",
        )
        entry = {"fit": why, **(blend.to_dict() if blend is not None else {})}
        if blend is not None and splits:
            entry["fitted_on"] = splits
    meta = {k: v for k, v in model.meta.items() if k not in ("format", "complete")}
    meta[PARAGRAPHS] = entry
    write_manifest(out_dir, meta)


# --------------------------------------------------------------------------- loading / prediction
class TrainedModel:
    """A loaded model: ``predict(df, features)`` -> DataFrame[mu, sigma, ...] on the ``score`` scale.

    Every layout's class takes ``(model_dir, meta, encoder=None)``; ``encoder`` is used by a fine-tuned
    single network (:class:`SingleModel`), the others build their networks from the features.

    Attributes
    ----------
    method : str
    spec : MethodSpec
        The method's specification (:data:`uamt.models.specs.METHODS`).
    cfg : TrainConfig
    meta : dict
        The manifest (encoder_id, num_layers, dim, target_mean, target_std, ...).
    scaler : TargetScaler
    """

    def __init__(self, model_dir: Path, meta: dict, encoder=None) -> None:
        self.model_dir = Path(model_dir)
        self.meta = meta
        self.method = meta["method"]
        self.spec: MethodSpec = get_spec(self.method)
        self.cfg = from_dict(TrainConfig, meta["config"], where=f"{model_dir}/{MANIFEST}:config")
        self.scaler = TargetScaler(meta["target_mean"], meta["target_std"])
        self.encoder_id = meta.get("encoder_id")
        self.shape = (int(meta["num_layers"]), int(meta["dim"]))
        self.paragraphs = ParagraphBlend.from_manifest(meta, self.model_dir / MANIFEST)

    def check_features(self, features) -> None:
        """DataError when ``features`` come from other encoder weights than the model was trained on.

        The runtime may differ (torch vs ONNX of the same weights: ids equal up to the ``+ort``
        suffix, see :func:`uamt.encoders.catalog.weights_id`); how close its features are is
        measured by ``benchmarks/encoder_runtimes.py``.
        """
        found = encoder_id_of(features)
        if self.encoder_id is not None and found is not None and weights_id(found) != weights_id(self.encoder_id):
            raise DataError(
                f"{self.model_dir}: model trained on embeddings of encoder {self.encoder_id!r}, but the "
                f"features come from {found!r}; use the cache of the training encoder"
            )

    def encode(self, df: pd.DataFrame, features, where: str = "table") -> EncodedRows:
        """The model's input rows for ``df`` (``where`` names the table in errors)."""
        self.check_features(features)
        rows = encode_rows(df, features, self.cfg.reference_free, where=where, expected_shape=self.shape)
        return with_row_features(rows, df, self.cfg.row_features, where)

    def predict_standardised(self, rows: EncodedRows, n_samples: int | None = None) -> dict[str, np.ndarray]:
        """``{"mu", "var"[, "epistemic", "aleatoric", "q_hat"]}`` [n] on the standardised scale."""
        raise NotImplementedError  # pragma: no cover - abstract

    @property
    def aligned_samples(self) -> bool:
        """Whether :meth:`sample_outputs` gives stochastic outputs aligned across inputs that differ in
        one text (e.g. the reference): ensemble members, or MC dropout in the head on cached embeddings.
        Dropout through the encoder is not alignable (its masks depend on the texts' lengths)."""
        return False

    def sample_outputs(self, rows: EncodedRows, n_samples: int | None = None):
        """Standardised aligned samples ``(mu [n, K], var [n, K] or None)`` (``var``: per-sample
        predicted variances of heteroscedastic samples); only where :attr:`aligned_samples`."""
        raise UamtError(f"{self.model_dir}: method {self.method!r} gives no aligned samples")

    def predict_rows(self, rows: EncodedRows, n_samples: int | None = None) -> pd.DataFrame:
        """Predictions for pre-encoded rows, on the human ``score`` scale."""
        return to_score_scale(self.predict_standardised(rows, n_samples), self.scaler)

    def predict(self, df: pd.DataFrame, features, n_samples: int | None = None, encoder=None) -> pd.DataFrame:
        """Score ``df`` (columns ``src``, ``mt`` [, ``ref``]).

        A model trained with ``paragraph_units`` scores a multi-sentence row sentence by sentence
        too, and its ``mu`` is the blend recorded in the manifest (:mod:`uamt.paragraphs`).

        Returns
        -------
        DataFrame, one row per input row (same order), columns ``mu``, ``sigma`` (a standard
        deviation; NaN for ``point``) and, per method, ``epistemic``, ``aleatoric`` (variances) and
        ``q_hat`` (DUP's base prediction), all on the ``score`` scale.
        """
        return predict_with_blend(self, df, features, n_samples, encoder)

    def predict_whole(self, df: pd.DataFrame, features, n_samples: int | None = None, encoder=None) -> pd.DataFrame:
        """:meth:`predict` with every row read whole by the network (no paragraph blend)."""
        self.attach_encoder(encoder if encoder is not None else encoder_of(features))
        return self.predict_rows(self.encode(df, features), n_samples)

    def attach_encoder(self, encoder) -> None:
        """Give the networks that run the encoder at inference (fine-tuned, MC dropout through the
        encoder) the encoder object; a no-op for the others."""

    def predictions_table(
        self, df: pd.DataFrame, features, n_samples: int | None = None, encoder=None
    ) -> pd.DataFrame:
        """The predictions table of docs/architecture.md: ``dataset, lp, seg_id, system, human, mu, sigma``
        plus ``epistemic``, ``aleatoric``, ``q_hat`` where the method gives them, and ``doc`` /
        ``domain`` where the prepared rows have them (calibration is cross-fitted over documents and
        coverage reported per domain), and ``campaign`` where some row names one."""
        from uamt.core.columns import filled, optional_columns

        pred = self.predict(df, features, n_samples, encoder)
        table = pd.DataFrame(index=range(len(df)))
        for column in ("dataset", "lp", "seg_id", "system"):
            table[column] = df[column].to_numpy() if column in df.columns else None
        for column in CARRIED_LABELS:
            # a partly missing label would lump its missing rows into one "None" document/domain
            if column in df.columns and df[column].notna().all():
                table[column] = df[column].astype(str).to_numpy()
        for column in optional_columns(df):  # a user's campaign: calibrated on its own (uamt.campaigns)
            given = filled(df[column])
            table[column] = np.where(given, df[column].astype(str).str.strip(), None)
        table["human"] = (
            pd.to_numeric(df["score"], errors="coerce").to_numpy() if "score" in df.columns else np.nan
        )
        for column in ("mu", "sigma", *OPTIONAL_COLUMNS):
            if column in pred.columns:
                table[column] = pred[column].to_numpy()
        return table


class SingleModel(TrainedModel):
    """One Lightning estimator (point, mcd_head, mcd_full, hts, kl, hts_mcd, and DUP's M_E)."""

    def __init__(self, model_dir: Path, meta: dict, encoder=None) -> None:
        super().__init__(model_dir, meta)
        self.module: Estimator | None = None
        if not self.cfg.finetune or encoder is not None:
            self._build(encoder)
        # else: a fine-tuned network is built on first use, from the encoder the features carry

    def _build(self, encoder) -> None:
        """Instantiate the network and load its weights (``encoder``: the fine-tuned model's base)."""
        cls = self.spec.estimator
        if self.cfg.finetune:
            # The checkpoint holds the fine-tuned weights; the tokenizer comes from this encoder.
            self._check_encoder_object(encoder)
        module = cls(self.cfg, *self.shape, encoder=encoder if self.cfg.finetune else None)
        weights = self.model_dir / WEIGHTS
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
            module.load_state_dict(state)
        except (OSError, RuntimeError, EOFError) as exc:
            raise UamtError(f"{weights}: cannot load weights ({exc})") from exc
        module.eval()
        self.module = module

    def _check_encoder_object(self, encoder) -> None:
        # Another runtime of the same weights serves frozen features; a fine-tuned network runs
        # the torch encoder itself, so it needs exactly the training one.
        found = getattr(encoder, "encoder_id", None)
        if self.encoder_id is None or found is None:
            return
        if weights_id(found) != weights_id(self.encoder_id) or (self.cfg.finetune and found != self.encoder_id):
            raise DataError(
                f"{self.model_dir}: model trained with encoder {self.encoder_id!r}, got encoder {found!r}"
                + (" (a fine-tuned model runs its encoder: runtime 'torch' only)" if self.cfg.finetune else "")
            )

    def attach_encoder(self, encoder) -> None:
        if encoder is None:
            return
        if self.module is None:
            self._build(encoder)
        else:
            self._check_encoder_object(encoder)
            self.module.attach_encoder(encoder)

    def predict_standardised(self, rows: EncodedRows, n_samples: int | None = None) -> dict[str, np.ndarray]:
        if self.module is None:
            raise UamtError(
                f"{self.model_dir}: a fine-tuned model runs its encoder: load(model_dir, encoder=...), or "
                "predict with features that carry the encoder (features_from_cache / features_from_encoder)"
            )
        out = self.module.predict_rows(rows, n_samples)
        return {k: v.numpy() for k, v in out.items()}

    @property
    def aligned_samples(self) -> bool:
        return self.spec.yields_samples and self.spec.estimator.dropout_scope(self.cfg) == "head"

    def sample_outputs(self, rows: EncodedRows, n_samples: int | None = None):
        if not self.aligned_samples:
            return super().sample_outputs(rows, n_samples)
        return head_samples(self.module, rows, n_samples)


class EnsembleModel(TrainedModel):
    """K members; mu = mean, epistemic = spread, aleatoric = mean member variance (hts/kl members)."""

    def __init__(self, model_dir: Path, meta: dict, encoder=None) -> None:
        super().__init__(model_dir, meta)
        self.members = [
            SingleModel(self.model_dir / sub, read_manifest(self.model_dir / sub), encoder=encoder)
            for sub in meta["members"]
        ]

    def attach_encoder(self, encoder) -> None:
        if self.cfg.finetune:  # fine-tuned members each run their own copy of the encoder
            for member in self.members:
                member.attach_encoder(encoder)

    def predict_standardised(self, rows: EncodedRows, n_samples: int | None = None) -> dict[str, np.ndarray]:
        return combine_members([member.predict_standardised(rows) for member in self.members])

    @property
    def aligned_samples(self) -> bool:
        return True

    def sample_outputs(self, rows: EncodedRows, n_samples: int | None = None):
        """Member k is sample k; ``var`` only where every member predicts a variance (hts / kl)."""
        outs = [member.predict_standardised(rows) for member in self.members]
        mus = np.stack([np.asarray(o["mu"], dtype=float) for o in outs], axis=1)
        variances = np.stack([np.asarray(o["var"], dtype=float) for o in outs], axis=1)
        return mus, (variances if np.isfinite(variances).all() else None)


class DUPModel(TrainedModel):
    """Base model M_Q (mu = q_hat) + error model M_E (sigma = eps_hat)."""

    def __init__(self, model_dir: Path, meta: dict, encoder=None) -> None:
        super().__init__(model_dir, meta)
        self.base = load(self.model_dir / meta["base"], encoder=encoder)
        self.error_model = SingleModel(self.model_dir, meta, encoder=encoder)

    def attach_encoder(self, encoder) -> None:
        # either network may run its own fine-tuned encoder copy (M_Q, and M_E trained with finetune)
        self.base.attach_encoder(encoder)
        self.error_model.attach_encoder(encoder)

    def predict_whole(self, df: pd.DataFrame, features, n_samples: int | None = None, encoder=None) -> pd.DataFrame:
        rows = self.encode(df, features)
        base_rows = (
            with_row_features(rows, df, self.base.cfg.row_features)
            if self.base.cfg.reference_free == self.cfg.reference_free
            else self.base.encode(df, features)
        )
        self.attach_encoder(encoder if encoder is not None else encoder_of(features))
        q_hat = self.base.predict_standardised(base_rows)["mu"]
        return self.predict_rows(rows.with_columns(q_hat=q_hat), n_samples)

    def predict_standardised(self, rows: EncodedRows, n_samples: int | None = None) -> dict[str, np.ndarray]:
        if "q_hat" not in rows.columns:
            raise UamtError("DUP rows need the base model's q_hat column; use DUPModel.predict")
        return self.error_model.predict_standardised(rows)


def load(model_dir: str | Path, encoder=None) -> TrainedModel:
    """Load a complete model folder written by :func:`train` (UamtError when incomplete or missing)."""
    model_dir = Path(model_dir)
    meta = read_manifest(model_dir)
    spec = get_spec(meta.get("method"))
    return _MODELS[spec.layout](model_dir, meta, encoder=encoder)


#: How a model of each :data:`uamt.models.specs.Layout` is trained and loaded.  Trainers take
#: ``(cfg, train_df, dev_df, features, out_dir, base_model_dir, encoder)`` and return ``out_dir``.
_TRAINERS = {"network": _train_network, "ensemble": _train_ensemble, "second_stage": _train_dup}
_MODELS: dict[str, type[TrainedModel]] = {
    "network": SingleModel,
    "ensemble": EnsembleModel,
    "second_stage": DUPModel,
}
