"""Method comparison: *Better Uncertainty Quantification* Tables 1–3 and *Uncertainty-Aware MT
Evaluation* Table 2 (the fixed-variance baseline), re-run on WMT21 DA and WMT21 MQM.

Two benchmarks, each evaluated on its ``test`` split with calibration (dev-standardisation + affine
sigma^2, per LP with a global fallback) fitted on its ``dev`` split (:func:`common.calibrated_indicators`):

* **DA** (``wmt21_da``, 7 into-English LPs, DA z-scores): one model per method, trained on all LPs
  together on a per-LP subsample of the prepared splits (whole source sentences with every rated
  translation of each, so the texts to encode stay few; sizes in ``da_rows_per_lp``).  Single-stage
  methods train on ``d_q``; DUP's M_E on ``d_e`` over the ``point`` model M_Q; ``dev`` stops training
  early and fits the calibration.
* **MQM** (``wmt21_mqm``, en-de + zh-en): the pipeline's models (``models/<method>``, trained on the
  full MQM ``d_q``) and their dev/test predictions are reused where they match the data; DUP losses
  the pipeline did not train (it trains one, ``train_dup.dup_loss``) and methods it lacks are trained here.

Rows (keys of ``result[bench]["indicators"]``): ``point`` (COMET point estimate with the dev-fitted
fixed variance, Glushkova et al. 2021 Eq. 6: the baseline), ``mcd_head`` (MC dropout, ``mc_samples``
passes through the head on frozen features; the paper's MCD also drops out inside the encoder),
``ensemble`` (DE), ``hts`` (Eq. 2), ``hts_mcd`` (Eq. 4; same weights as ``hts``), ``kl`` (Eq. 3,
only where annotator disagreement exists) and ``dup_<loss>`` (Eqs. 5–7).  ``mcd_head`` and
``hts_mcd`` reuse the weights of ``point`` / ``hts`` (identical training, only inference differs:
:data:`uamt.models.specs.SAME_TRAINING`).

Indicators (App. D): PPS = r(mu, q*), UPS = r(|q* - mu|, sigma), NLL, ECE (100 levels), sharpness =
mean calibrated sigma^2, all on dev-standardised scores.  Averages are macro over LPs, per group
(``xx-en`` into English, ``en-xx`` out of English) and over all LPs (``avg``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from uamt.core.config import ConfigError
from uamt.core.errors import DataError, UamtError
from uamt.core.stats import pearson_or_none
from uamt.experiments import paper_numbers, rendering
from uamt.experiments.common import (
    FIGURES_DIR,
    HIGHER_IS_BETTER,
    INDICATORS,
    METRICS_DIR,
    calibrated_indicators,
    fmt,
    pyplot,
    save_figure,
    share_verdict,
    write_result,
)
from uamt.experiments.rendering import section_number

if TYPE_CHECKING:
    from uamt.encoders import EncodeConfig
    from uamt.models.config import TrainConfig
    from uamt.uncertainty import EvaluationSettings

NAME = "methods"
log = logging.getLogger(__name__)


def supported_methods() -> tuple[str, ...]:
    """Methods this analysis can compare: every method whose passes do not run the encoder
    (``mcd_full`` needs the encoder in every MC pass: left out), in ``METHODS`` order."""
    from uamt.models.specs import methods_where

    return methods_where(lambda spec: not spec.cost.through_encoder)


def per_loss_rows(rows) -> list[str]:
    from uamt.models.specs import per_loss_rows as rows_with_a_loss

    return rows_with_a_loss(rows)


def _baseline() -> str:
    from uamt.models.specs import baseline_method

    return baseline_method()


def _is_fixed_variance(row: str) -> bool:
    from uamt.models.specs import is_fixed_variance

    return is_fixed_variance(row)

#: Prepared splits a benchmark reads: training pools, calibration / early stopping, evaluation.
SPLITS = ("d_q", "d_e", "dev", "test")
#: The DUP row that represents DUP in Tables 2–3 (the paper picks L_HTS^E after Table 1).
DUP_REPRESENTATIVE = "dup_hts"
BENCHMARKS = ("da", "mqm")
GROUPS = ("xx-en", "en-xx")

INDICATOR_LABELS = {"pps": "PPS ↑", "ups": "UPS ↑", "nll": "NLL ↓", "ece": "ECE ↓", "sharpness": "Sha. ↓"}

#: The papers' averages, quoted beside ours in the findings (Better UQ Tables 2-3, AVG rows; paper_numbers.yaml).
PAPER = {bench: paper_numbers.values("methods", bench) for bench in ("da", "mqm")}


def _default_rows_per_lp() -> dict[str, int]:
    return {"d_q": 450, "d_e": 300, "dev": 150, "test": 300}


@dataclass(frozen=True)
class MethodsSettings:
    """params.yaml ``exp_methods:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``methods.json`` and the ``methods_*.png`` figures go.
    methods : tuple of str
        Methods compared (of :func:`supported_methods`); the baseline method (``point``) is required
        (baseline and DUP's M_Q). ``dup`` (``per_loss``) expands into one row per loss of ``dup_losses``.
    dup_losses : tuple of str
        DUP second-stage losses (``abs``, ``sq``, ``hts``: Eqs. 5–7).
    models_dir : str
        Models trained here: ``<models_dir>/{da,mqm}/<row>``.
    da_dataset, mqm_dataset : str
        The ``dataset`` values of the two benchmarks in the prepared splits.
    da_rows_per_lp : dict
        Rows per LP drawn from each split of :data:`SPLITS` for the DA benchmark (whole source
        sentences: every rated translation of a drawn source; the last one may be cut).
    da_seed : int
        Seed of that draw.
    mqm_reuse_models_dir, mqm_reuse_predictions_dir : str or None
        The pipeline's ``models/`` and ``predictions/`` folders, reused for the MQM benchmark where a
        model there was trained on the same rows (``n_train`` = rows of ``d_q`` / ``d_e``); null: train
        and predict everything here.
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    methods: tuple[str, ...] = field(default_factory=supported_methods)
    dup_losses: tuple[str, ...] = ("abs", "sq", "hts")
    models_dir: str = "models/experiments"
    da_dataset: str = "wmt21_da"
    da_rows_per_lp: dict[str, int] = field(default_factory=_default_rows_per_lp)
    da_seed: int = 7
    mqm_dataset: str = "wmt21_mqm"
    mqm_reuse_models_dir: str | None = "models"
    mqm_reuse_predictions_dir: str | None = "predictions"

    def __post_init__(self) -> None:
        from uamt.models.losses import LOSSES
        from uamt.models.specs import METHODS, baseline_method

        where = "exp_methods"
        supported = supported_methods()
        for name in self.methods:
            if name not in supported:
                raise ConfigError(
                    f"{where}.methods: method={name!r} not supported; choose from {sorted(supported)}"
                )
        if len(set(self.methods)) != len(self.methods):
            raise ConfigError(f"{where}.methods: {list(self.methods)} names a method twice")
        if (baseline := baseline_method()) not in self.methods:
            raise ConfigError(f"{where}.methods must include {baseline!r} (the baseline and DUP's base model)")
        for loss in self.dup_losses:
            if loss not in LOSSES:
                raise ConfigError(
                    f"{where}.dup_losses: loss={loss!r} not supported; choose from {sorted(LOSSES)}"
                )
        per_loss = [name for name in self.methods if METHODS[name].per_loss]
        if per_loss and not self.dup_losses:
            raise ConfigError(f"{where}.dup_losses is empty but methods includes {per_loss[0]!r}")
        if set(self.da_rows_per_lp) != set(SPLITS):
            raise ConfigError(
                f"{where}.da_rows_per_lp: keys {sorted(self.da_rows_per_lp)}; expected exactly {list(SPLITS)}"
            )
        for split, n in self.da_rows_per_lp.items():
            if n < 1:
                raise ConfigError(f"{where}.da_rows_per_lp.{split}: {n}; must be >= 1")

    @property
    def rows(self) -> tuple[str, ...]:
        """Table rows: the methods, with ``dup`` expanded per loss."""
        return row_keys(self.methods, self.dup_losses)


def row_keys(methods: tuple[str, ...], dup_losses: tuple[str, ...]) -> tuple[str, ...]:
    """``methods`` with each ``per_loss`` method (``dup``) replaced by ``<method>_<loss>`` for each
    loss (table order)."""
    from uamt.models.specs import METHODS

    out: list[str] = []
    for name in methods:
        if METHODS[name].per_loss:
            out.extend(f"{name}_{loss}" for loss in dup_losses)
        else:
            out.append(name)
    return tuple(out)


def label(row: str) -> str:
    """The table label of a row (:attr:`uamt.models.specs.MethodSpec.label`); unknown rows as is."""
    from uamt.models.specs import row_spec

    try:
        spec, loss = row_spec(row)
    except ValueError:
        return row
    return spec.row_label(loss)


# ----------------------------------------------------------------------------- data


def sample_per_lp(frame: pd.DataFrame, n_rows: int, seed: int) -> pd.DataFrame:
    """At most ``n_rows`` rows per LP, drawn as whole source sentences in a seeded random order.

    Sources of each LP are shuffled with ``default_rng([seed, crc32(lp)])``; every rated translation
    of a drawn source is kept until the LP has ``n_rows`` rows (the last source's rows, in
    ``(system, mt)`` order, are cut to fit).  The draw does not depend on the row order of ``frame``.  Sampling sources rather than rows keeps the distinct
    texts to encode close to one per row (the source and reference are shared by its translations).

    Returns
    -------
    DataFrame (index reset), rows of each LP in their original order, LPs sorted.
    """
    parts = []
    for lp in sorted(frame["lp"].unique()):
        rows = frame[frame["lp"] == lp]
        sources = np.array(sorted(rows["src"].unique()), dtype=object)
        rng = np.random.default_rng([seed, zlib.crc32(lp.encode())])
        order = {src: rank for rank, src in enumerate(sources[rng.permutation(len(sources))])}
        # Within a source, rows in (system, mt) order: the cut of the last source is order independent.
        ranked = rows.assign(_rank=rows["src"].map(order), _system=rows["system"].astype(str)).sort_values(
            ["_rank", "_system", "mt"], kind="stable"
        )
        picked = ranked.head(n_rows).drop(columns=["_rank", "_system"])
        parts.append(picked.sort_index())
    if not parts:
        raise DataError("sample_per_lp: empty frame")
    return pd.concat(parts).reset_index(drop=True)


def lp_groups(lps) -> dict[str, list[str]]:
    """``{"xx-en": LPs into English, "en-xx": LPs out of English}`` (an LP may be in neither)."""
    lps = sorted(lps)
    return {
        "xx-en": [lp for lp in lps if lp.split("-")[1] == "en" and lp.split("-")[0] != "en"],
        "en-xx": [lp for lp in lps if lp.split("-")[0] == "en" and lp.split("-")[1] != "en"],
    }


def annotator_disagreement(frame: pd.DataFrame) -> dict[str, Any]:
    """How many rows carry a per-annotator std (>= 2 annotators and a finite ``score_std``): KL's target."""
    from uamt.models.kl import annotator_std

    _, valid = annotator_std(frame, "d_q")
    n_ann = (
        pd.to_numeric(frame["n_annotators"], errors="coerce").fillna(0)
        if "n_annotators" in frame.columns
        else pd.Series(0, index=frame.index)
    )
    return {
        "rows": int(len(frame)),
        "rows_with_std": int(valid.sum()),
        "share_with_std": float(valid.mean()) if len(frame) else 0.0,
        "max_annotators": int(n_ann.max()) if len(n_ann) else 0,
    }


def chrf_pps(frame: pd.DataFrame) -> dict[str, float | None]:
    """Pearson r(chrF(mt, ref), human score) per LP and their mean (``avg``): the lexical floor PPS."""
    from uamt.lexical import segment_scores

    rows = frame[frame["ref"].notna()] if "ref" in frame.columns else frame.iloc[:0]
    out: dict[str, float | None] = {}
    for lp, group in rows.groupby("lp"):
        chrf = segment_scores(list(group["mt"]), list(group["ref"]), "chrf")
        human = pd.to_numeric(group["score"], errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(human)
        out[lp] = pearson_or_none(chrf[ok], human[ok], min_rows=3)
    values = [v for v in out.values() if v is not None]
    out["avg"] = float(np.mean(values)) if values else None
    return out


def split_sizes(frames: dict[str, pd.DataFrame]) -> dict[str, dict[str, int]]:
    return {
        split: {"total": int(len(df)), **{lp: int(n) for lp, n in df.groupby("lp").size().items()}}
        for split, df in frames.items()
    }


def distinct_texts(frames) -> list[str]:
    """The distinct ``src``, ``mt``, ``ref`` texts the models read (first-seen order)."""
    seen: dict[str, None] = {}
    for df in frames:
        for column in ("src", "mt", "ref"):
            if column in df.columns:
                seen.update(dict.fromkeys(t for t in df[column] if isinstance(t, str) and t))
    return list(seen)


def _cache_of(features):
    owner = getattr(getattr(features, "fn", None), "__self__", None)
    return owner if owner is not None and hasattr(owner, "__contains__") else None


def encode_ahead(frames, features) -> dict[str, Any]:
    """Encode (or read from the cache) every text of ``frames`` once, timed, so training times exclude it."""
    texts = distinct_texts(frames)
    cache = _cache_of(features)
    missing = None if cache is None else sum(text not in cache for text in texts)
    started = time.perf_counter()
    if texts:
        features(texts)
    return {"distinct_texts": len(texts), "newly_encoded": missing, "encode_s": time.perf_counter() - started}


# ----------------------------------------------------------------------------- training / prediction


@dataclass
class ModelRun:
    """One row's model: where it is, how long it took, and where it came from."""

    path: Path
    origin: str  # "trained" | "derived" | "reused"
    train_s: float | None = None
    same_training_as: str | None = None
    n_train: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _n_train(model_dir: Path) -> int | None:
    from uamt.models.api import read_manifest

    meta = read_manifest(model_dir)
    if "n_train" in meta:
        return int(meta["n_train"])
    if meta.get("members"):
        return _n_train(model_dir / meta["members"][0])
    return None


#: Settings a reused model must share with the configured ones (else it is trained again here).
REUSE_KEYS = (
    "reference_free",
    "hidden_sizes",
    "activations",
    "dropout",
    "layer_transformation",
    "batch_size",
    "learning_rate",
    "max_epochs",
    "patience",
    "seed",
    "mc_samples",
    "finetune",
    "finetune_top_layers",
)


def _reusable(model_dir: Path | None, method: str, n_train: int, cfg) -> bool:
    """A complete model of ``method`` at ``model_dir``, trained on ``n_train`` rows with ``cfg``'s
    settings (:data:`REUSE_KEYS`, plus the method's own ``MethodSpec.train_keys``)."""
    from uamt.models.api import read_manifest
    from uamt.models.specs import get_spec

    if model_dir is None or not (model_dir / "model.json").is_file():
        return False
    try:
        meta = read_manifest(model_dir)
    except UamtError:
        return False
    if meta.get("method") != method:
        return False
    stored = meta.get("config", {})
    # A key newer than the stored model had its default then (e.g. finetune_top_layers: 0).
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for key in (*REUSE_KEYS, *get_spec(method).train_keys):
        want = getattr(cfg, key)
        have = stored.get(key, defaults.get(key))
        if (tuple(have) if isinstance(have, list) else have) != want:
            log.info("%s: not reused, %s=%r (configured %r)", model_dir, key, have, want)
            return False
    return _n_train(model_dir) == n_train


def train_rows(
    rows: tuple[str, ...],
    frames: dict[str, pd.DataFrame],
    features,
    out_root: Path,
    base_cfg,
    dup_cfg,
    reuse_dir: Path | None = None,
) -> dict[str, ModelRun]:
    """Train (or reuse) the model of every row on ``frames`` (``d_q``, ``d_e``, ``dev``).

    Single-stage methods train on ``d_q``; ``dup_<loss>`` trains M_E on ``d_e`` over the ``point``
    row's model; methods of :data:`uamt.models.specs.SAME_TRAINING` copy their source's weights when
    it is a row.
    A model in ``reuse_dir/<method>`` (``reuse_dir/dup`` for the DUP loss it was trained with) is
    used as is when it was trained with the same settings on as many rows as ``d_q`` (``d_e`` for
    DUP) holds (:func:`_reusable`).

    Returns
    -------
    dict row -> :class:`ModelRun`, in ``rows`` order.
    """
    from uamt.models.api import train
    from uamt.models.shared_training import derive
    from uamt.models.specs import SAME_TRAINING, row_spec, training_order

    runs: dict[str, ModelRun] = {}
    d_q, d_e, dev = frames["d_q"], frames["d_e"], frames["dev"]
    per_loss = {row: row_spec(row) for row in rows if row_spec(row)[0].per_loss}
    for row in training_order([r for r in rows if r not in per_loss]):
        reused = None if reuse_dir is None else reuse_dir / row
        if _reusable(reused, row, len(d_q), base_cfg.replace(method=row)):
            runs[row] = ModelRun(reused, "reused", n_train=len(d_q))
            log.info("%s: reusing %s", row, reused)
            continue
        started = time.perf_counter()
        source = SAME_TRAINING.get(row)
        if source in runs:
            path = derive(runs[source].path, row, out_root / row)
            runs[row] = ModelRun(
                path, "derived", time.perf_counter() - started, same_training_as=source, n_train=len(d_q)
            )
            continue
        cfg = base_cfg.replace(method=row)
        path = train(row, cfg, d_q, dev, features, out_root / row)
        runs[row] = ModelRun(path, "trained", time.perf_counter() - started, n_train=len(d_q))
        log.info("%s: trained on %d rows in %.1f s", row, len(d_q), runs[row].train_s)
    for row, (spec, loss) in per_loss.items():
        reused = None if reuse_dir is None else reuse_dir / spec.name
        if _reusable(reused, spec.name, len(d_e), dup_cfg.replace(dup_loss=loss)):
            runs[row] = ModelRun(reused, "reused", n_train=len(d_e))
            log.info("%s: reusing %s", row, reused)
            continue
        if (base := _baseline()) not in runs:
            raise UamtError(f"{row}: DUP needs the {base!r} model as its base M_Q")
        started = time.perf_counter()
        path = train(
            spec.name,
            dup_cfg.replace(dup_loss=loss),
            d_e,
            dev,
            features,
            out_root / row,
            base_model_dir=runs[base].path,
        )
        runs[row] = ModelRun(path, "trained", time.perf_counter() - started, n_train=len(d_e))
        log.info("%s: trained on %d rows in %.1f s", row, len(d_e), runs[row].train_s)
    for run in runs.values():
        run.extra = _training_facts(run.path)
    return {row: runs[row] for row in rows}


def _training_facts(model_dir: Path) -> dict[str, Any]:
    from uamt.models.api import read_manifest

    meta = read_manifest(model_dir)
    facts: dict[str, Any] = {}
    if "kl_fill_std" in (meta.get("state") or {}):
        facts["kl_fill_std"] = meta["state"]["kl_fill_std"]
    if meta.get("best_val_loss") is not None:
        facts["best_val_loss"] = meta["best_val_loss"]
    return facts


def _aligned(table: pd.DataFrame, frame: pd.DataFrame) -> bool:
    """Whether a stored predictions table is row by row the predictions of ``frame``."""
    if len(table) != len(frame):
        return False
    for column in ("lp", "seg_id", "system"):
        if column not in table.columns or column not in frame.columns:
            return False
        if not np.array_equal(table[column].astype(str).to_numpy(), frame[column].astype(str).to_numpy()):
            return False
    human = pd.to_numeric(frame["score"], errors="coerce").to_numpy()
    return bool(np.allclose(table["human"].to_numpy(dtype=float), human, equal_nan=True))


def _made_by(table: pd.DataFrame, model, frame: pd.DataFrame, features) -> bool:
    """Whether ``model`` reproduces the stored ``mu``/``sigma`` of the first prediction batch of ``frame``.

    A stored table may be stale (an older model in the same folder).  The first ``predict_batch_size``
    rows are one batch, so even MC-dropout methods (seeded per batch) give the same numbers again.
    """
    k = min(len(frame), int(getattr(model.cfg, "predict_batch_size", 256)))
    fresh = model.predictions_table(frame.head(k), features)
    for column in ("mu", "sigma"):
        if column not in table.columns:
            return False
        stored = table[column].to_numpy(dtype=float)[:k]
        if not np.allclose(stored, fresh[column].to_numpy(dtype=float), rtol=1e-4, atol=1e-6, equal_nan=True):
            return False
    return True


def predict_rows(
    runs: dict[str, ModelRun],
    frames: dict[str, pd.DataFrame],
    features,
    reuse_predictions: Path | None = None,
    reuse_names: dict[str, str] | None = None,
) -> tuple[dict[str, dict[str, pd.DataFrame]], dict[str, dict[str, Any]]]:
    """Predictions tables of every row on ``frames["dev"]`` and ``frames["test"]``, with timings.

    For a reused model, ``reuse_predictions/<split>/<name>.parquet`` (``name`` from ``reuse_names``,
    default the row) is read instead when it is aligned with the split (same LP, segment, system and
    human score in every row) and the model reproduces its first batch (:func:`_made_by`); otherwise
    the split is predicted and timed.

    Returns
    -------
    tables : dict row -> {"dev": DataFrame, "test": DataFrame}
    timings : dict row -> {"predict_s": seconds for the splits predicted here (None if all were
        read), "predicted_rows": rows predicted here, "read_rows": rows read from the pipeline}
    """
    from uamt.models.api import load

    reuse_names = reuse_names or {}
    tables: dict[str, dict[str, pd.DataFrame]] = {}
    timings: dict[str, dict[str, Any]] = {}
    for row, run in runs.items():
        tables[row], seconds, predicted, read = {}, 0.0, 0, 0
        model = None
        for split in ("dev", "test"):
            frame = frames[split]
            stored = (
                None
                if reuse_predictions is None or run.origin != "reused"
                else reuse_predictions / split / f"{reuse_names.get(row, row)}.parquet"
            )
            if stored is not None and stored.is_file():
                table = pd.read_parquet(stored)
                model = model or load(run.path)
                if _aligned(table, frame) and _made_by(table, model, frame, features):
                    tables[row][split] = table
                    read += len(table)
                    continue
                log.info(
                    "%s: %s is not this model's prediction of the %s split; predicting", row, stored, split
                )
            started = time.perf_counter()
            model = model or load(run.path)
            tables[row][split] = model.predictions_table(frame, features)
            seconds += time.perf_counter() - started
            predicted += len(frame)
        timings[row] = {
            "predict_s": seconds if predicted else None,
            "predicted_rows": predicted,
            "read_rows": read,
        }
    return tables, timings


def indicators(
    tables: dict[str, dict[str, pd.DataFrame]], groups: dict[str, list[str]], settings=None
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{row: {lp | group | "avg": {pps, ups, nll, ece, sharpness, n}}}``, calibrated on dev.

    ``point`` is evaluated as the fixed-variance baseline.  A group's value is the mean over its
    LPs (None when the group is empty); ``avg`` the mean over all LPs (the papers' balanced AVG).
    """
    from uamt.models.specs import row_spec

    out = {}
    for row, split in tables.items():
        fixed_variance = row_spec(row)[0].fixed_variance
        metrics = calibrated_indicators(split["test"], split["dev"], settings, fixed_variance=fixed_variance)
        block = {key: _keep(value) for key, value in metrics.items()}
        lps = [k for k in block if k != "avg"]
        for group, members in groups.items():
            block[group] = _mean_over([block[lp] for lp in members if lp in lps]) if members else None
        out[row] = block
    return out


def _keep(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: metrics.get(k) for k in (*INDICATORS, "n")}


def _mean_over(blocks: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not blocks:
        return None
    out: dict[str, Any] = {}
    for key in INDICATORS:
        values = [b[key] for b in blocks if b.get(key) is not None and math.isfinite(b[key])]
        out[key] = float(np.mean(values)) if values else None
    out["n"] = int(sum(b.get("n") or 0 for b in blocks))
    return out


# ----------------------------------------------------------------------------- one benchmark


def compare_benchmark(
    name: str,
    frames: dict[str, pd.DataFrame],
    rows: tuple[str, ...],
    features,
    out_root: Path,
    base_cfg,
    dup_cfg,
    eval_settings=None,
    reuse_models: Path | None = None,
    reuse_predictions: Path | None = None,
) -> dict[str, Any]:
    """Train / reuse, predict, and evaluate every row on one benchmark.

    Parameters
    ----------
    frames : dict split -> canonical-table rows of this benchmark (:data:`SPLITS`)
    rows : table rows (:func:`row_keys`)

    Returns
    -------
    dict with ``lps``, ``groups``, ``sizes``, ``encoding``, ``kl`` (availability and the fill rule),
    ``rows`` (the rows evaluated), ``unavailable`` (row -> reason), ``indicators`` (row -> lp/group/avg
    -> metrics), ``timings`` (row -> train/predict seconds and origin).
    """
    missing = [s for s in SPLITS if s not in frames or frames[s].empty]
    if missing:
        raise DataError(f"benchmark {name}: no rows in split(s) {missing}")
    lps = sorted(frames["test"]["lp"].unique())
    result: dict[str, Any] = {
        "lps": lps,
        "groups": lp_groups(lps),
        "sizes": split_sizes(frames),
        "unavailable": {},
    }
    disagreement = annotator_disagreement(frames["d_q"])
    result["kl"] = {
        **disagreement,
        "available": disagreement["rows_with_std"] > 0,
        "missing_std_rule": base_cfg.kl_missing_std,
        "std_floor": base_cfg.kl_std_floor,
    }
    if "kl" in rows and not result["kl"]["available"]:
        result["unavailable"]["kl"] = (
            f"no d_q row has >= 2 annotators with a score_std ({disagreement['rows']} rows, at most "
            f"{disagreement['max_annotators']} annotator(s) per row): KL's target N(mu*, sigma*^2) "
            "needs annotator disagreement"
        )
    rows = tuple(r for r in rows if r not in result["unavailable"])
    result["rows"] = list(rows)
    result["chrf_pps"] = chrf_pps(frames["test"])
    result["encoding"] = encode_ahead([frames[s] for s in SPLITS], features)
    log.info(
        "%s: %s texts ready in %.1f s",
        name,
        result["encoding"]["distinct_texts"],
        result["encoding"]["encode_s"],
    )
    from uamt.models.specs import row_spec

    runs = train_rows(rows, frames, features, out_root, base_cfg, dup_cfg, reuse_models)
    reuse_names = {r: row_spec(r)[0].name for r in rows if row_spec(r)[1] is not None}
    tables, predict_timings = predict_rows(runs, frames, features, reuse_predictions, reuse_names)
    if "kl" in runs and "kl_fill_std" in runs["kl"].extra:
        result["kl"]["fill_std"] = runs["kl"].extra["kl_fill_std"]
    result["indicators"] = indicators(tables, result["groups"], eval_settings)
    result["timings"] = {
        row: {
            "origin": run.origin,
            "train_s": run.train_s,
            "same_training_as": run.same_training_as,
            "n_train": run.n_train,
            "model_dir": str(run.path),
            **predict_timings[row],
        }
        for row, run in runs.items()
    }
    return result


# ----------------------------------------------------------------------------- the analysis


def da_frames(prepared_dir: str | Path, settings: MethodsSettings) -> dict[str, pd.DataFrame]:
    from uamt.pipeline_config import read_split

    return {
        split: sample_per_lp(
            read_split(prepared_dir, split, (settings.da_dataset,)),
            settings.da_rows_per_lp[split],
            settings.da_seed,
        )
        for split in SPLITS
    }


def mqm_frames(prepared_dir: str | Path, settings: MethodsSettings) -> dict[str, pd.DataFrame]:
    from uamt.pipeline_config import read_split

    return {split: read_split(prepared_dir, split, (settings.mqm_dataset,)) for split in SPLITS}


def run_analysis(
    settings: MethodsSettings,
    base_cfg,
    dup_cfg,
    features,
    prepared_dir: str | Path = "data/prepared",
    eval_settings=None,
    benchmarks: tuple[str, ...] = BENCHMARKS,
) -> dict[str, Any]:
    """Both benchmarks (or those in ``benchmarks``); the JSON result of ``metrics/experiments/methods.json``.

    Parameters
    ----------
    settings : MethodsSettings
    base_cfg, dup_cfg : TrainConfig
        ``load_train_config(method)`` / ``load_train_config("dup")``: the pipeline's hyper-parameters.
    features : callable
        ``texts -> float32 [n, layers, dim]`` (the embedding cache; missing texts encoded on demand).
    eval_settings : EvaluationSettings, optional
        The ``evaluate:`` section (per-LP calibration, ECE levels).
    """
    for bench in benchmarks:
        if bench not in BENCHMARKS:
            raise ValueError(f"benchmark={bench!r} not supported; choose from {sorted(BENCHMARKS)}")
    rows = settings.rows
    models_root = Path(settings.models_dir)
    result: dict[str, Any] = {
        "name": NAME,
        "rows": list(rows),
        "labels": {r: label(r) for r in rows},
        "settings": {
            **{
                k: v
                for k, v in dataclasses.asdict(settings).items()
                if k not in ("metrics_dir", "figures_dir")
            },
            "train": {
                k: getattr(base_cfg, k)
                for k in (
                    "hidden_sizes",
                    "dropout",
                    "batch_size",
                    "learning_rate",
                    "max_epochs",
                    "patience",
                    "seed",
                    "mc_samples",
                    "ensemble_size",
                    "ensemble_member",
                    "kl_missing_std",
                    "kl_std_floor",
                )
            },
            "dup": {"bottleneck_size": dup_cfg.bottleneck_size},
        },
        "paper": PAPER,
    }
    started = time.perf_counter()
    if "da" in benchmarks:
        frames = da_frames(prepared_dir, settings)
        result["da"] = {
            "dataset": settings.da_dataset,
            "sampling": f"{settings.da_rows_per_lp} rows per LP, whole source sentences, seed {settings.da_seed}",
            **compare_benchmark(
                "da", frames, rows, features, models_root / "da", base_cfg, dup_cfg, eval_settings
            ),
        }
    if "mqm" in benchmarks:
        frames = mqm_frames(prepared_dir, settings)
        reuse_m = Path(settings.mqm_reuse_models_dir) if settings.mqm_reuse_models_dir else None
        reuse_p = Path(settings.mqm_reuse_predictions_dir) if settings.mqm_reuse_predictions_dir else None
        result["mqm"] = {
            "dataset": settings.mqm_dataset,
            "sampling": "all rows of the prepared splits",
            **compare_benchmark(
                "mqm",
                frames,
                rows,
                features,
                models_root / "mqm",
                base_cfg,
                dup_cfg,
                eval_settings,
                reuse_models=reuse_m,
                reuse_predictions=reuse_p,
            ),
        }
    result["runtime_s"] = time.perf_counter() - started
    result["findings"] = findings(result)
    return result


def write_findings(
    settings: MethodsSettings,
    base_cfg: TrainConfig,
    dup_cfg: TrainConfig,
    encode: EncodeConfig,
    prepared_dir: str | Path,
    eval_settings: EvaluationSettings,
) -> dict[str, Path]:
    """The stage ``exp_methods``: :func:`run_analysis` on the embedding cache of ``encode``, then
    ``methods.json`` and the figures; returns ``{"metrics": json path, <figure stem>: path, ...}``."""
    from uamt.experiments.common import open_experiment_features

    result = run_analysis(
        settings,
        base_cfg,
        dup_cfg,
        open_experiment_features(encode),
        prepared_dir=prepared_dir,
        eval_settings=eval_settings,
    )
    out = {"metrics": write_result(NAME, result, settings.metrics_dir)}
    for path in write_figures(result, settings.figures_dir):
        out[path.stem] = path
    return out


# ----------------------------------------------------------------------------- findings


def _avg(result: dict, bench: str, row: str, key: str) -> float | None:
    block = result.get(bench, {}).get("indicators", {}).get(row)
    value = None if block is None else block["avg"].get(key)
    return value if value is not None and math.isfinite(value) else None


def _best(result: dict, bench: str, rows, key: str) -> str | None:
    scored = [(r, _avg(result, bench, r, key)) for r in rows]
    scored = [(r, v) for r, v in scored if v is not None]
    if not scored:
        return None
    pick = max if key in HIGHER_IS_BETTER else min
    return pick(scored, key=lambda rv: rv[1])[0]


def _wins_over_baseline(result: dict, bench: str, row: str, key: str) -> tuple[int, int] | None:
    ind = result.get(bench, {}).get("indicators", {})
    base = _baseline()
    if row not in ind or base not in ind:
        return None
    lps = result[bench]["lps"]
    wins = total = 0
    for lp in lps:
        a, b = ind[row].get(lp, {}).get(key), ind[base].get(lp, {}).get(key)
        if a is None or b is None:
            continue
        total += 1
        wins += (a > b) if key in HIGHER_IS_BETTER else (a < b)
    return wins, total


def findings(result: dict[str, Any]) -> dict[str, Any]:
    """Numbers behind the comparison with the papers (per benchmark), all computed from ``result``."""
    out: dict[str, Any] = {}
    for bench in BENCHMARKS:
        if bench not in result:
            continue
        evaluated = [r for r in result["rows"] if r in result[bench]["indicators"]]
        uncertain = [r for r in evaluated if not _is_fixed_variance(r)]
        block: dict[str, Any] = {
            "best": {key: _best(result, bench, evaluated, key) for key in INDICATORS},
            "pps_range": _range([_avg(result, bench, r, "pps") for r in evaluated]),
        }
        sharp = {
            r: _avg(result, bench, r, "sharpness")
            for r in ("mcd_head", "ensemble", "hts", DUP_REPRESENTATIVE)
        }
        if (
            all(sharp.get(r) is not None for r in ("mcd_head", "hts"))
            and sharp.get(DUP_REPRESENTATIVE) is not None
        ):
            block["dup_hts_sharper_than_mcd"] = sharp[DUP_REPRESENTATIVE] < sharp["mcd_head"]
            block["hts_sharper_than_mcd"] = sharp["hts"] < sharp["mcd_head"]
        if (
            sharp.get("ensemble") is not None
            and sharp.get(DUP_REPRESENTATIVE) is not None
            and sharp.get("hts") is not None
        ):
            block["dup_hts_sharper_than_de"] = sharp[DUP_REPRESENTATIVE] < sharp["ensemble"]
            block["hts_sharper_than_de"] = sharp["hts"] < sharp["ensemble"]
        dups = per_loss_rows(evaluated)
        if len(dups) > 1:
            block["dup_losses"] = {
                "best_ups": _best(result, bench, dups, "ups"),
                "best_nll": _best(result, bench, dups, "nll"),
                "best_ece": _best(result, bench, dups, "ece"),
                "ups_range": _range([_avg(result, bench, r, "ups") for r in dups]),
                "nll_range": _range([_avg(result, bench, r, "nll") for r in dups]),
            }
        if "kl" in evaluated and "hts" in evaluated:
            block["kl_minus_hts"] = {
                key: _diff(_avg(result, bench, "kl", key), _avg(result, bench, "hts", key))
                for key in INDICATORS
            }
        if "hts_mcd" in evaluated and "hts" in evaluated:
            block["hts_mcd_minus_hts"] = {
                key: _diff(_avg(result, bench, "hts_mcd", key), _avg(result, bench, "hts", key))
                for key in INDICATORS
            }
        block["beats_baseline"] = {
            row: {key: _wins_over_baseline(result, bench, row, key) for key in ("nll", "ece", "pps")}
            for row in uncertain
        }
        out[bench] = block
    return out


def _lp_cells(result: dict, rows_a, rows_b, key: str) -> tuple[int, int, list[str]]:
    """Cells (benchmark x LP x a x b) where row ``a`` is better than row ``b`` on ``key``."""
    wins = cells = 0
    where = []
    for bench in BENCHMARKS:
        ind = result.get(bench, {}).get("indicators", {})
        for lp in result.get(bench, {}).get("lps", []):
            for a in rows_a:
                for b in rows_b:
                    va = (ind.get(a, {}).get(lp) or {}).get(key)
                    vb = (ind.get(b, {}).get(lp) or {}).get(key)
                    if va is None or vb is None:
                        continue
                    cells += 1
                    won = va > vb if key in HIGHER_IS_BETTER else va < vb
                    wins += won
        if ind:
            where.append(bench)
    return wins, cells, where


def _avgs(result: dict, rows, key: str) -> str:
    parts = []
    for bench in BENCHMARKS:
        if bench not in result or any(r not in result[bench]["indicators"] for r in rows):
            continue
        values = ", ".join(
            f"{label(r)} {fmt(_avg(result, bench, r, key))}" for r in rows if r in result[bench]["indicators"]
        )
        if values:
            parts.append(f"{bench.upper()} avg {values}")
    return "; ".join(parts)


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(finding, what the paper reports, what we measured -- starting with the verdict).

    Each verdict is :func:`share_verdict` of the benchmark x LP cells that go the paper's way.
    """
    out: list[tuple[str, str, str]] = []

    def add(finding, paper, rows_a, rows_b, key, shown):
        wins, cells, _ = _lp_cells(result, rows_a, rows_b, key)
        if cells:
            verdict = share_verdict(wins, cells)
            out.append((finding, paper, f"{verdict}: {wins}/{cells} LP cells; {_avgs(result, shown, key)}"))

    dup = [DUP_REPRESENTATIVE]
    add(
        "DUP and HTS give sharper (smaller) calibrated variances than MCD and DE",
        "Better UQ Tables 2–3: sharpness DUP 0.411 / HTS 0.466 vs MCD 1.083 / DE 0.813 (DA avg); "
        "0.317 / 0.296 vs 1.038 / 0.997 (MQM avg)",
        [*dup, "hts"],
        ["mcd_head", "ensemble"],
        "sharpness",
        [*dup, "hts", "mcd_head", "ensemble"],
    )
    add(
        "DUP and HTS rank errors better (higher UPS) than MCD and DE",
        "Better UQ Tables 2–3: UPS DUP 0.112 / HTS 0.119 vs MCD 0.071 / DE 0.090 (DA avg); "
        "0.317 / 0.317 vs 0.215 / 0.222 (MQM avg)",
        [*dup, "hts"],
        ["mcd_head", "ensemble"],
        "ups",
        [*dup, "hts", "mcd_head", "ensemble"],
    )
    add(
        "MC dropout on the HTS model (HTS+MCD) raises UPS over HTS",
        "Better UQ Table 2: UPS 0.254 vs 0.119 (DA avg), Table 3: 0.340 vs 0.317 (MQM avg)",
        ["hts_mcd"],
        ["hts"],
        "ups",
        ["hts_mcd", "hts"],
    )
    add(
        "MCD and DE are better calibrated (ECE) than the fixed-variance baseline",
        "UA-MT Table 2: lower ECE than the baseline in all 9 WMT20 DA LPs for both",
        ["mcd_head", "ensemble"],
        ["point"],
        "ece",
        ["mcd_head", "ensemble", "point"],
    )
    dups = per_loss_rows(result.get("rows", []))
    if DUP_REPRESENTATIVE in dups and len(dups) > 1:
        others = [r for r in dups if r != DUP_REPRESENTATIVE]
        add(
            "Among DUP's losses, L_HTS has a slight UPS advantage",
            "Better UQ Table 1: UPS L_HTS 0.112 vs L_SQ 0.108, L_ABS 0.104 (DA avg); all three similar",
            [DUP_REPRESENTATIVE],
            others,
            "ups",
            dups,
        )
    if any("kl" in result.get(b, {}).get("indicators", {}) for b in BENCHMARKS):
        add(
            "KL (annotator disagreement as target) ranks errors less well than HTS",
            "Better UQ Table 3: UPS KL 0.282 vs HTS 0.317 (MQM avg; KL trained on WMT20 MQM only)",
            ["hts"],
            ["kl"],
            "ups",
            ["kl", "hts"],
        )
    unavailable = {
        b: result[b]["unavailable"]["kl"]
        for b in BENCHMARKS
        if "kl" in result.get(b, {}).get("unavailable", {})
    }
    for bench, reason in unavailable.items():
        out.append(
            (
                f"KL on {bench.upper()} ({result[bench]['dataset']})",
                "Better UQ Table 3: KL trained on multi-annotator WMT20 MQM",
                f"n/a: {reason}",
            )
        )
    return out


def _range(values) -> list[float] | None:
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else None


def _diff(a, b) -> float | None:
    return None if a is None or b is None else a - b


# ----------------------------------------------------------------------------- figures


def write_figures(result: dict[str, Any], figures_dir: str | Path) -> list[Path]:
    """``methods_sharpness_ups.png`` (avg sharpness vs UPS per method and benchmark) and
    ``methods_ece_by_lp.png`` (calibrated test ECE per method x LP)."""
    plt = pyplot()
    figures_dir = Path(figures_dir)
    benches = [b for b in BENCHMARKS if b in result]
    out = []
    colors = {row: f"C{i % 10}" for i, row in enumerate(result["rows"])}  # same colour in both panels
    fig, axes = plt.subplots(
        1, max(len(benches), 1), figsize=(5.2 * max(len(benches), 1), 4.2), squeeze=False
    )
    for ax, bench in zip(axes[0], benches, strict=False):
        for row in result[bench]["indicators"]:
            x, y = _avg(result, bench, row, "sharpness"), _avg(result, bench, row, "ups")
            if x is None:
                continue
            y = 0.0 if y is None else y  # fixed variance: UPS undefined, drawn at 0
            ax.scatter(
                [x], [y], s=45, marker="s" if _is_fixed_variance(row) else "o", color=colors[row], label=label(row)
            )
        ax.set(
            xlabel="sharpness (mean calibrated σ², z units) ↓",
            ylabel="UPS ↑",
            title=f"{result[bench]['dataset']} test, average over LPs",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    out.append(save_figure(fig, figures_dir / "methods_sharpness_ups.png"))

    columns = [(bench, lp) for bench in benches for lp in (*result[bench]["lps"], "avg")]
    rows = list(dict.fromkeys(r for bench in benches for r in result[bench]["indicators"]))
    grid = np.full((len(rows), len(columns)), np.nan)
    for i, row in enumerate(rows):
        for j, (bench, lp) in enumerate(columns):
            value = result[bench]["indicators"].get(row, {}).get(lp, {}).get("ece")
            grid[i, j] = np.nan if value is None else value
    fig, ax = plt.subplots(figsize=(0.75 * len(columns) + 2.5, 0.42 * len(rows) + 1.6))
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis_r", aspect="auto")
    ax.set_xticks(
        range(len(columns)), [f"{b.upper()} {lp}" for b, lp in columns], rotation=45, ha="right", fontsize=8
    )
    ax.set_yticks(range(len(rows)), [label(r) for r in rows], fontsize=8)
    for i in range(len(rows)):
        for j in range(len(columns)):
            if math.isfinite(grid[i, j]):
                dark = grid[i, j] > np.nanmean(grid)  # viridis_r: high values are dark
                ax.text(
                    j,
                    i,
                    f"{grid[i, j]:.3f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="w" if dark else "k",
                )
    fig.colorbar(image, ax=ax, label="ECE (calibrated on dev) ↓")
    ax.set_title("Calibrated test ECE per method and LP")
    out.append(save_figure(fig, figures_dir / "methods_ece_by_lp.png"))
    return out


# ----------------------------------------------------------------------------- report


def _best_per_key(block: dict[str, dict], rows, key: str) -> dict[str, str | None]:
    best = {}
    for ind in INDICATORS:
        scored = [(r, (block[r].get(key) or {}).get(ind)) for r in rows if r in block]
        scored = [(r, v) for r, v in scored if v is not None and math.isfinite(v)]
        pick = max if ind in HIGHER_IS_BETTER else min
        tied = len(scored) > 1 and max(v for _, v in scored) - min(v for _, v in scored) < 1e-9
        best[ind] = pick(scored, key=lambda rv: rv[1])[0] if scored and not tied else None
    return best


def _chrf_at(bench_result: dict[str, Any], key: str) -> float | None:
    """chrF's PPS at an LP, ``avg``, or a group (mean over its LPs)."""
    chrf = bench_result.get("chrf_pps") or {}
    if key in chrf:
        return chrf[key]
    values = [chrf.get(lp) for lp in bench_result["groups"].get(key) or []]
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _group_covering_all(bench_result: dict[str, Any]) -> str | None:
    """The LP group that holds every LP of the benchmark (its average is then AVG), if any."""
    lps = set(bench_result["lps"])
    return next((g for g, members in bench_result["groups"].items() if set(members) == lps), None)


def _table_keys(bench_result: dict[str, Any]) -> list[str]:
    """LPs, the groups of more than one LP that are not all LPs (the JSON has every group), then AVG."""
    covering = _group_covering_all(bench_result)
    groups = [g for g in GROUPS if len(bench_result["groups"].get(g) or []) > 1 and g != covering]
    return [*bench_result["lps"], *groups, "avg"]


def _table_rows(result: dict[str, Any]) -> list[str]:
    """Rows of Tables 2–3: every row but the non-representative DUP losses."""
    dups = per_loss_rows(result["rows"])
    keep = DUP_REPRESENTATIVE if DUP_REPRESENTATIVE in dups else (dups[0] if dups else None)
    return [r for r in result["rows"] if r not in dups or r == keep]


def _span(values: list[float] | None) -> str:
    return "–" if not values else f"{values[0]:.3f}–{values[1]:.3f}"


def table_lines(bench_result: dict[str, Any], rows) -> list[dict[str, Any]]:
    """Lines of Table 2/3: per key (LP, group, AVG) each row's ``{name, row, key, best}`` (``best``:
    the row with the best value per indicator, None on ties), then ``{name, chrf}`` where chrF exists."""
    block = bench_result["indicators"]
    rows = [r for r in rows if r in block]
    lines: list[dict[str, Any]] = []
    for key in _table_keys(bench_result):
        best = _best_per_key(block, rows, key)
        name = key.upper() if key in (*GROUPS, "avg") else key
        if key == "avg" and (covering := _group_covering_all(bench_result)):
            name = f"{covering.upper()} = AVG"
        lines.extend({"name": name, "row": row, "key": key, "best": best} for row in rows)
        chrf = _chrf_at(bench_result, key)
        if chrf is not None:
            lines.append({"name": name, "chrf": chrf})
    return lines


def render_context(result: dict[str, Any]) -> dict[str, Any]:
    """What ``templates/methods.md.j2`` needs beyond the result: constants, table selections, and
    the per-benchmark averages, wins and best rows its findings quote."""
    benches = [b for b in BENCHMARKS if b in result]
    dups = per_loss_rows(result["rows"])
    shown = _table_rows(result)
    beats = {}
    for bench in BENCHMARKS:
        wins = (result["findings"].get(bench) or {}).get("beats_baseline", {})
        beats[bench] = [(r, w) for r, w in wins.items() if r in shown and w.get("ece") and w.get("nll")]
    return {
        "section": section_number(NAME),
        "splits": SPLITS,
        "benchmarks": BENCHMARKS,
        "indicators": INDICATORS,
        "indicator_labels": INDICATOR_LABELS,
        "label": label,
        "span": _span,
        "dup": DUP_REPRESENTATIVE,
        "dups": dups,
        "dup_best": {b: _best_per_key(result[b]["indicators"], dups, "avg") for b in benches},
        "method_tables": {b: table_lines(result[b], shown) for b in benches},
        "papers": PAPER,
        "sharpness_avg": {
            b: {r: _avg(result, b, r, "sharpness") for r in ("mcd_head", "ensemble", "hts", DUP_REPRESENTATIVE)}
            for b in BENCHMARKS
        },
        "ups_avg": {
            b: {r: _avg(result, b, r, "ups") for r in ("mcd_head", "ensemble", "hts", "hts_mcd", DUP_REPRESENTATIVE)}
            for b in BENCHMARKS
        },
        "beats": beats,
    }


def render(result: dict[str, Any]) -> str:
    """The markdown section of reports/experiments.md (Tables 1–3, timings, findings; ``templates/methods.md.j2``)."""
    return rendering.render(NAME, result, **render_context(result))
