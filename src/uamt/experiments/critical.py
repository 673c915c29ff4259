"""Critical-error retrieval with uncertainty (§5.5 and App. F of *Uncertainty-Aware MT Evaluation*).

Glushkova et al. (2021) treat the detection of critical translation errors as retrieval: the targets
are the worst ``n`` % of segments by length-normalised MQM, and a metric ranks all segments by

1. the point estimate ``q_hat`` (lowest first),
2. the mean ``mu`` of the predicted distribution (lowest first),
3. the translation risk ``P(Q <= q_err) = Phi((q_err - mu) / sigma)`` (highest first), with the
   calibrated Gaussian and a threshold ``q_err`` tuned on dev to maximise the average Recall@N.

Retrieval quality of a ranking is ``Recall@N = |top-N ∩ T| / |T|`` and
``Precision@N = |top-N ∩ T| / N`` for the target set ``T``.  The paper's setting is reference-free:
its pseudo-references come from an MT system outside the evaluated ones (PRISM).  Here the
pseudo-references of a segment are the other WMT21 systems' outputs for the same source
(:func:`uamt.experiments.common.pseudo_reference_rows`), scored by the pipeline's reference-based
models and combined over pseudo-references by averaging the per-reference ``mu`` and ``sigma`` as
:meth:`uamt.serving.calibrated_predictor.CalibratedPredictor.raw_predict` does.  The standard setting with the real human
reference is reported beside it.

Ranking by risk uses the monotone equivalent ``(q_err - mu) / sigma`` of ``Phi(.)``: the same order,
without the ties that ``Phi`` underflowing to 0 or 1 in the tails would create.  Ties between
segments are broken by row order (stable sort).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from uamt.core.config import ConfigError
from uamt.core.errors import DataError
from uamt.core.stats import pearson_r
from uamt.experiments import paper_numbers, rendering
from uamt.experiments.common import (
    FIGURES_DIR,
    METRICS_DIR,
    is_human_system,
    pseudo_reference_rows,
    save_figure,
    write_result,
)
from uamt.pipeline_config import CALIBRATION_DIR, PipelineConfig

if TYPE_CHECKING:
    from uamt.encoders import EncodeConfig
    from uamt.uncertainty import EvaluationSettings

NAME = "critical"
FIGURES = {"recall": "critical_recall.png", "precision": "critical_precision.png"}
log = logging.getLogger(__name__)
SETTINGS = ("pseudo", "reference")
SETTING_LABELS = {
    "pseudo": "reference-free: other systems' outputs as pseudo-references",
    "reference": "standard: the human reference",
}
SHORT_LABELS = {"pseudo": "pseudo-references", "reference": "human reference"}
SCALE_LABELS = {"raw": "ranked by predicted MQM", "per_word": "ranked by predicted MQM per word"}
TARGET_PERCENTS = (1, 2, 5, 10)
#: Prediction scales: ``raw`` ranks by the predicted MQM score as in the paper; ``per_word`` divides
#: q_hat, mu and sigma by the MT words, so the ranking is on the targets' own (length-normalised)
#: scale and the risk is P(Q / words <= q_err) = Phi((q_err - mu / words) / (sigma / words)).
SCALES = ("raw", "per_word")
#: Quantile levels of the dev mu (plus a tail below the lowest mu) tried as q_err.
THRESHOLD_QUANTILES = tuple(np.linspace(0.0, 1.0, 41).round(4))
THRESHOLD_TAIL = (0.5, 1.0, 2.0, 4.0)  # q_err = min(mu) - c * median(sigma)


@dataclass(frozen=True)
class CriticalSettings:
    """params.yaml ``exp_critical:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``critical.json`` and the two figures go.
    dataset : str
        MQM data the pipeline's models were trained and calibrated on (must be in pipeline.datasets).
    point_method : str
        Model whose prediction is the point estimate q_hat.
    uncertainty_methods : list of str
        Models whose mu and calibrated sigma give the mu and risk rankings.
    target_percents : list of int
        The worst n % per LP (length-normalised MQM) are the retrieval targets.
    max_n_fraction : float
        Recall/Precision curves for N = 1..ceil(max_n_fraction x rows of the LP).
    max_pseudo_refs : int or None
        Pseudo-references per segment (seeded sample of the other systems); None = all.
    seed : int
    scales : list of {"raw", "per_word"}
        Rank by the predicted MQM score (paper) and/or by the prediction per MT word.
    calibration_dir : str
        The pipeline's calibrations (standard setting).
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    dataset: str = "wmt21_mqm"
    point_method: str = "point"
    uncertainty_methods: tuple[str, ...] = ("hts", "mcd_head")
    target_percents: tuple[int, ...] = TARGET_PERCENTS
    max_n_fraction: float = 0.2
    max_pseudo_refs: int | None = None
    seed: int = 0
    scales: tuple[str, ...] = SCALES
    calibration_dir: str = CALIBRATION_DIR


def check_dataset(settings: CriticalSettings, pipeline: PipelineConfig, where: str) -> None:
    """ConfigError unless the pipeline's models were trained on ``settings.dataset``."""
    if settings.dataset not in pipeline.datasets:
        raise ConfigError(
            f"{where}.dataset={settings.dataset!r} is not in pipeline.datasets "
            f"{list(pipeline.datasets)}: the models were not trained on it"
        )


# ----------------------------------------------------------------------------------------------
# Targets and retrieval metrics


def mt_word_counts(mt: Sequence[str]) -> np.ndarray:
    """Words of each translation: whitespace tokens (``str.split()``), at least 1.

    Both evaluated directions have space-delimited targets (en-de: German, zh-en: English).
    """
    return np.array([max(len(str(text).split()), 1) for text in mt], dtype=np.int64)


def length_normalised(score: np.ndarray, mt: Sequence[str]) -> np.ndarray:
    """MQM score divided by the number of MT words (App. F): long segments are not over-penalised."""
    score = np.asarray(score, dtype=float)
    if score.shape != (len(mt),):
        raise DataError(f"scores have shape {score.shape} but there are {len(mt)} translations")
    return score / mt_word_counts(mt)


def n_targets(n_rows: int, percent: float) -> int:
    """Size of the worst-``percent`` % set: ``percent / 100 * n_rows`` rounded half up, at least 1."""
    if not 0 < percent < 100:
        raise DataError(f"target percent={percent} must be in (0, 100)")
    return max(1, math.floor(percent / 100.0 * n_rows + 0.5))


def worst_mask(values: np.ndarray, percent: float) -> np.ndarray:
    """Boolean mask of the :func:`n_targets` lowest ``values`` (ties: earlier rows first)."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or len(values) == 0:
        raise DataError(f"need a non-empty 1-d array of scores, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise DataError("scores must be finite to pick the worst segments")
    order = np.argsort(values, kind="stable")
    mask = np.zeros(len(values), dtype=bool)
    mask[order[: n_targets(len(values), percent)]] = True
    return mask


def retrieval_curves(priority: np.ndarray, targets: np.ndarray, n_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Recall@N and Precision@N for N = 1..n_max when segments are flagged in decreasing ``priority``.

    Parameters
    ----------
    priority : array, shape [n]
        Higher = flagged earlier (e.g. ``-q_hat``, ``-mu`` or the risk).  Ties: earlier rows first.
    targets : bool array, shape [n]
        The critical segments T (at least one).
    n_max : int
        Longest list, 1 <= n_max <= n.

    Returns
    -------
    recall, precision : arrays, shape [n_max]
        ``recall[N-1] = |top-N ∩ T| / |T|``, ``precision[N-1] = |top-N ∩ T| / N``.
    """
    priority = np.asarray(priority, dtype=float)
    targets = np.asarray(targets, dtype=bool)
    if priority.shape != targets.shape or priority.ndim != 1:
        raise DataError(f"priority {priority.shape} and targets {targets.shape} must be 1-d of one length")
    if not np.all(np.isfinite(priority)):
        raise DataError("ranking scores must be finite")
    if not targets.any():
        raise DataError("no target segment: recall is undefined")
    if not 1 <= n_max <= len(priority):
        raise DataError(f"n_max={n_max} must be in [1, {len(priority)}]")
    order = np.argsort(-priority, kind="stable")
    hits = np.cumsum(targets[order][:n_max])
    return hits / targets.sum(), hits / np.arange(1, n_max + 1)


def n_max_of(n_rows: int, fraction: float) -> int:
    """Longest retrieval list: ``ceil(fraction * n_rows)``, between 1 and ``n_rows``."""
    if not 0 < fraction <= 1:
        raise DataError(f"max_n_fraction={fraction} must be in (0, 1]")
    return int(min(max(math.ceil(fraction * n_rows), 1), n_rows))


# ----------------------------------------------------------------------------------------------
# Risk and its threshold


def risk_priority(mu: np.ndarray, sigma: np.ndarray, q_err: float) -> np.ndarray:
    """``(q_err - mu) / sigma``: ordered exactly as the risk ``Phi((q_err - mu) / sigma)``."""
    mu = np.asarray(mu, dtype=float)
    sigma = np.asarray(sigma, dtype=float)
    if np.any(~np.isfinite(sigma)) or np.any(sigma < 0):
        raise DataError("sigma must be finite and >= 0 to compute a risk")
    return (q_err - mu) / np.maximum(sigma, 1e-12)


def threshold_grid(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Candidate ``q_err`` (human scale): dev-mu quantiles at :data:`THRESHOLD_QUANTILES` and
    ``min(mu) - c * median(sigma)`` for ``c`` in :data:`THRESHOLD_TAIL`; sorted, unique."""
    mu = np.asarray(mu, dtype=float)
    quantiles = np.quantile(mu, THRESHOLD_QUANTILES)
    tail = mu.min() - np.asarray(THRESHOLD_TAIL) * float(np.median(sigma))
    return np.unique(np.concatenate([tail, quantiles]))


def tune_threshold(
    mu: np.ndarray, sigma: np.ndarray, targets: np.ndarray, n_max: int, grid: np.ndarray | None = None
) -> tuple[float, float]:
    """The ``q_err`` of ``grid`` whose risk ranking has the highest mean Recall@N over N = 1..n_max.

    Returns ``(q_err, mean recall)``; among equal means the lowest ``q_err`` wins.
    """
    grid = threshold_grid(mu, sigma) if grid is None else np.sort(np.asarray(grid, dtype=float))
    if grid.size == 0:
        raise DataError("empty q_err grid")
    best_q, best = float(grid[0]), -1.0
    for q in grid:
        recall, _ = retrieval_curves(risk_priority(mu, sigma, float(q)), targets, n_max)
        score = float(recall.mean())
        if score > best + 1e-12:
            best_q, best = float(q), score
    return best_q, best


# ----------------------------------------------------------------------------------------------
# Data and predictions


def evaluation_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """MT rows (human-reference systems dropped) with a finite MQM score; adds ``words`` and
    ``target`` (= score / words, the length-normalised MQM).  Order: lp, seg_id, system."""
    for column in ("lp", "seg_id", "system", "src", "mt", "ref", "score"):
        if column not in frame.columns:
            raise DataError(f"critical-error rows: column {column!r} missing")
    keep = ~frame["system"].astype(str).map(is_human_system)
    keep &= np.isfinite(pd.to_numeric(frame["score"], errors="coerce"))
    rows = frame[keep].sort_values(["lp", "seg_id", "system"], kind="stable").reset_index(drop=True)
    missing_ref = rows["ref"].isna() | (rows["ref"].astype(str).str.len() == 0)
    if missing_ref.any():
        raise DataError(f"row {int(np.flatnonzero(missing_ref.to_numpy())[0])}: no human reference")
    mt = rows["mt"].astype(str).tolist()
    return rows.assign(words=mt_word_counts(mt), target=length_normalised(rows["score"].to_numpy(float), mt))


def with_pseudo_references(
    rows: pd.DataFrame, max_refs: int | None, seed: int
) -> tuple[pd.DataFrame, list[list[str]], int]:
    """Rows that have at least one pseudo-reference, their pseudo-reference texts, and how many
    rows were dropped for having none."""
    pseudo = pseudo_reference_rows(rows, max_refs=max_refs, seed=seed)
    keep = np.array([len(p) > 0 for p in pseudo], dtype=bool)
    dropped = int((~keep).sum())
    if dropped:
        rows = rows[keep].reset_index(drop=True)
        pseudo = pseudo_reference_rows(rows, max_refs=max_refs, seed=seed)
    mt = rows["mt"].astype(str).to_numpy()
    return rows, [mt[p].tolist() for p in pseudo], dropped


def predict_over_references(
    model, rows: pd.DataFrame, references: Sequence[Sequence[str]], features
) -> pd.DataFrame:
    """``mu, sigma`` per row on the model's score scale, averaged over the row's references.

    Each (row, reference) pair is scored once; the per-reference means and standard deviations are
    averaged, as :meth:`uamt.serving.calibrated_predictor.CalibratedPredictor.raw_predict` combines several references.
    ``sigma`` is NaN for a point estimate.
    """
    if len(references) != len(rows):
        raise DataError(f"{len(references)} reference lists for {len(rows)} rows")
    pairs = [(i, r) for i, items in enumerate(references) for r in items]
    counts = np.bincount([i for i, _ in pairs], minlength=len(rows)) if pairs else np.zeros(len(rows), int)
    if len(rows) and counts.min() == 0:
        raise DataError(f"row {int(np.argmin(counts))} has no reference")
    src, mt = rows["src"].astype(str).tolist(), rows["mt"].astype(str).tolist()
    expanded = pd.DataFrame(
        {"src": [src[i] for i, _ in pairs], "mt": [mt[i] for i, _ in pairs], "ref": [r for _, r in pairs]}
    )
    if "lp" in rows.columns:  # read by a head with the target-language row feature
        expanded["lp"] = rows["lp"].to_numpy()[[i for i, _ in pairs]]
    pred = model.predict(expanded, features)
    pred = pd.DataFrame({"mu": pred["mu"].to_numpy(float), "sigma": pred["sigma"].to_numpy(float)})
    pred["row"] = [i for i, _ in pairs]
    return pred.groupby("row", sort=True)[["mu", "sigma"]].mean().reset_index(drop=True)


def fit_calibration(rows: pd.DataFrame, raw: pd.DataFrame, evaluation_settings=None):
    """Dev-fitted :class:`uamt.serving.model_calibration.Calibration` of one model in one reference setting, fitted
    exactly as the ``calibrate`` stage does (standardisation + affine sigma^2, per LP)."""
    from uamt.serving.model_calibration import fit_calibration as fit_on_dev

    table = pd.DataFrame(
        {
            "lp": rows["lp"].astype(str).to_numpy(),
            "human": rows["score"].to_numpy(float),
            "mu": raw["mu"].to_numpy(float),
            "sigma": raw["sigma"].to_numpy(float),
        }
    )
    calibration, _ = fit_on_dev(table, settings=evaluation_settings)
    return calibration


# ----------------------------------------------------------------------------------------------
# The analysis


def ranking_names(point_method: str, uncertainty_methods: Sequence[str]) -> list[str]:
    """``q_hat:<point>``, then ``mu:<m>`` and ``risk:<m>`` for each uncertainty method."""
    return [f"q_hat:{point_method}"] + [f"{kind}:{m}" for m in uncertainty_methods for kind in ("mu", "risk")]


def _curve_points(n_max: int, points: int) -> np.ndarray:
    return np.unique(np.linspace(1, n_max, num=min(points, n_max)).round().astype(int))


def retrieval_summary(
    priority: np.ndarray, targets: np.ndarray, n_max: int
) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """Recall/Precision at N = |T|, 2|T|, 5|T| (capped at n_max) and their means over N = 1..n_max."""
    recall, precision = retrieval_curves(priority, targets, n_max)
    k = int(targets.sum())
    out: dict[str, float] = {}
    for mult in (1, 2, 5):
        n = min(mult * k, n_max)
        tag = "T" if mult == 1 else f"{mult}T"
        out[f"recall@{tag}"] = float(recall[n - 1])
        out[f"precision@{tag}"] = float(precision[n - 1])
    out["mean_recall"] = float(recall.mean())
    out["mean_precision"] = float(precision.mean())
    return out, recall, precision


def analyse(
    dev: pd.DataFrame,
    test: pd.DataFrame,
    models: Mapping[str, Any],
    features,
    *,
    point_method: str = "point",
    uncertainty_methods: Sequence[str] = ("hts", "mcd_head"),
    reference_calibrations: Mapping[str, Any] | None = None,
    evaluation_settings=None,
    target_percents: Sequence[float] = TARGET_PERCENTS,
    max_n_fraction: float = 0.2,
    max_pseudo_refs: int | None = None,
    seed: int = 0,
    scales: Sequence[str] = SCALES,
    curve_points: int = 40,
) -> dict[str, Any]:
    """Recall@N / Precision@N of the q_hat, mu and risk rankings, both reference settings.

    Parameters
    ----------
    dev, test : DataFrame
        MQM rows of the canonical table (``lp, seg_id, system, src, mt, ref, score``); dev tunes
        (calibration of the pseudo-reference setting, ``q_err``), test evaluates.
    models : mapping method -> model
        Loaded reference-based models (``predict(df, features) -> DataFrame[mu, sigma]`` on the
        score scale): ``point_method`` and every one of ``uncertainty_methods``.
    features
        The cached-feature callable of the models' encoder.
    reference_calibrations : mapping method -> Calibration, optional
        The pipeline's dev calibration (``calibration/<method>.json``) for the standard setting;
        missing methods are fitted on dev here.  The pseudo-reference setting is always fitted on
        dev predictions made with pseudo-references.
    evaluation_settings : uamt.uncertainty.EvaluationSettings, optional
    target_percents : the worst n % per LP that are the targets
    max_n_fraction : float
        Curves for N = 1..ceil(max_n_fraction * rows of the LP).
    max_pseudo_refs : int, optional
        Cap on pseudo-references per segment (seeded sample); None = every other system.
    seed : int
    scales : sequence of {"raw", "per_word"}
        Rank by the predicted MQM score (the paper) and/or by the prediction per MT word (see
        :data:`SCALES`).
    curve_points : int
        N values kept per stored curve.

    Returns
    -------
    dict
        ``settings``, ``sizes``, ``calibration`` (source per setting x method), ``results``
        ``{setting: {lp: {"n%": {ranking: summary}}}}`` (summaries: recall/precision at |T|, 2|T|,
        5|T|, means over N; risk rankings add ``q_err`` and ``dev_mean_recall``), ``curves`` and
        ``findings``.
    """
    for scale in scales:
        if scale not in SCALES:
            raise DataError(f"scale={scale!r} not supported; choose from {sorted(SCALES)}")
    for method in (point_method, *uncertainty_methods):
        if method not in models:
            raise DataError(f"method={method!r} not supported; choose from {sorted(models)}")
    frames, references, dropped = {}, {}, {}
    for split, frame in (("dev", dev), ("test", test)):
        rows, pseudo, dropped[split] = with_pseudo_references(evaluation_rows(frame), max_pseudo_refs, seed)
        if rows.empty:
            raise DataError(f"{split}: no MT rows with pseudo-references")
        frames[split] = rows
        references[split] = {"pseudo": pseudo, "reference": [[r] for r in rows["ref"].astype(str)]}
    lps = sorted(frames["test"]["lp"].unique())
    missing = [lp for lp in lps if lp not in set(frames["dev"]["lp"])]
    if missing:
        raise DataError(f"LPs {missing} have test rows but no dev rows to tune on")

    # mu/sigma per setting x method x split; calibrated (human scale) for the uncertainty methods.
    predictions: dict[str, dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]] = {}
    calibration_source: dict[str, dict[str, str]] = {}
    seconds: dict[str, float] = {}
    for setting in SETTINGS:
        predictions[setting], calibration_source[setting] = {}, {}
        for method in (point_method, *uncertainty_methods):
            started = time.perf_counter()
            raw = {
                split: predict_over_references(
                    models[method], frames[split], references[split][setting], features
                )
                for split in ("dev", "test")
            }
            seconds[f"{setting}:{method}"] = time.perf_counter() - started
            log.info(
                "%s references, %s: predicted %d dev + %d test rows (%d + %d pairs) in %.1f s",
                setting,
                method,
                len(frames["dev"]),
                len(frames["test"]),
                sum(map(len, references["dev"][setting])),
                sum(map(len, references["test"][setting])),
                seconds[f"{setting}:{method}"],
            )
            if method == point_method:
                predictions[setting][method] = {
                    s: (r["mu"].to_numpy(), r["sigma"].to_numpy()) for s, r in raw.items()
                }
                calibration_source[setting][method] = "none (q_hat ranks by the raw point estimate)"
                continue
            if setting == "reference" and reference_calibrations and method in reference_calibrations:
                calibration = reference_calibrations[method]
                calibration_source[setting][method] = "pipeline calibration (dev, human reference)"
            else:
                calibration = fit_calibration(frames["dev"], raw["dev"], evaluation_settings)
                calibration_source[setting][method] = f"fitted here on dev ({setting} references)"
            predictions[setting][method] = {
                split: calibration.apply(
                    raw[split]["mu"].to_numpy(),
                    raw[split]["sigma"].to_numpy(),
                    frames[split]["lp"].astype(str).to_numpy(),
                )
                for split in ("dev", "test")
            }

    # The ranked variants: setting x scale ("pseudo/raw", "pseudo/per_word", ...).
    variants: dict[str, dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]] = {}
    for setting in SETTINGS:
        for scale in scales:
            variants[f"{setting}/{scale}"] = {
                method: {
                    split: _on_scale(mu, sigma, frames[split]["words"].to_numpy(float), scale)
                    for split, (mu, sigma) in per_split.items()
                }
                for method, per_split in predictions[setting].items()
            }

    # Context: how well each ranking score tracks MQM on test, and how close mu is to q_hat.
    pearson = {
        key: {
            method: {
                lp: {
                    "score": pearson_r(
                        pred[method]["test"][0][mask], frames["test"]["score"].to_numpy()[mask]
                    ),
                    "target": pearson_r(
                        pred[method]["test"][0][mask], frames["test"]["target"].to_numpy()[mask]
                    ),
                    "q_hat": pearson_r(pred[method]["test"][0][mask], pred[point_method]["test"][0][mask]),
                }
                for lp in lps
                for mask in [(frames["test"]["lp"] == lp).to_numpy()]
            }
            for method in pred
        }
        for key, pred in variants.items()
    }

    names = ranking_names(point_method, uncertainty_methods)
    results: dict[str, dict] = {key: {} for key in variants}
    curves: dict[str, dict] = {key: {} for key in variants}
    baseline: dict[str, dict] = {}
    sizes: dict[str, Any] = {"dropped_without_pseudo_refs": dropped, "lps": {}}
    for lp in lps:
        masks = {split: (frames[split]["lp"] == lp).to_numpy() for split in ("dev", "test")}
        n_rows = {split: int(m.sum()) for split, m in masks.items()}
        n_max = {split: n_max_of(n_rows[split], max_n_fraction) for split in n_rows}
        sizes["lps"][lp] = {
            split: {
                "rows": n_rows[split],
                "segments": int(frames[split].loc[masks[split], "seg_id"].nunique()),
                "systems": int(frames[split].loc[masks[split], "system"].nunique()),
                "pseudo_refs_mean": float(
                    np.mean([len(references[split]["pseudo"][i]) for i in np.flatnonzero(masks[split])])
                ),
                "n_max": n_max[split],
                "targets": {f"{p}%": n_targets(n_rows[split], p) for p in target_percents},
            }
            for split in ("dev", "test")
        }
        target_values = {split: frames[split]["target"].to_numpy()[masks[split]] for split in masks}
        # A random ranking: E[Recall@N] = N / n, E[Precision@N] = |T| / n.
        baseline[lp] = {
            f"{p}%": {
                "mean_recall": (n_max["test"] + 1) / (2.0 * n_rows["test"]),
                "precision@T": n_targets(n_rows["test"], p) / n_rows["test"],
            }
            for p in target_percents
        }
        for setting, pred in variants.items():
            results[setting][lp], curves[setting][lp] = {}, {}
            for percent in target_percents:
                targets = {split: worst_mask(target_values[split], percent) for split in masks}
                block, curve = {}, {"n": _curve_points(n_max["test"], curve_points).tolist(), "rankings": {}}
                for name in names:
                    kind, method = name.split(":", 1)
                    mu_test, sigma_test = (a[masks["test"]] for a in pred[method]["test"])
                    extra: dict[str, float] = {}
                    if kind == "risk":
                        mu_dev, sigma_dev = (a[masks["dev"]] for a in pred[method]["dev"])
                        q_err, dev_recall = tune_threshold(mu_dev, sigma_dev, targets["dev"], n_max["dev"])
                        priority = risk_priority(mu_test, sigma_test, q_err)
                        extra = {"q_err": q_err, "dev_mean_recall": dev_recall}
                    else:
                        priority = -mu_test
                    summary, recall, precision = retrieval_summary(priority, targets["test"], n_max["test"])
                    block[name] = {**summary, **extra}
                    at = np.asarray(curve["n"]) - 1
                    curve["rankings"][name] = {
                        "recall": recall[at].tolist(),
                        "precision": precision[at].tolist(),
                    }
                results[setting][lp][f"{percent}%"] = block
                curves[setting][lp][f"{percent}%"] = curve
    result = {
        "settings": {
            "point_method": point_method,
            "uncertainty_methods": list(uncertainty_methods),
            "rankings": names,
            "target_percents": list(target_percents),
            "scales": list(scales),
            "max_n_fraction": max_n_fraction,
            "max_pseudo_refs": max_pseudo_refs,
            "seed": seed,
            "target": "MQM score / MT words (whitespace tokens); worst n % per LP, ties by row order",
            "excluded_systems": "human translations (ref-A .. ref-D) are neither evaluated nor pseudo-references",
            # The text is part of the recorded results (metrics/experiments/critical.json): it keeps
            # the module's old name, uamt.pyfunc, so that the results stay identical.
            "reference_combination": "mean of per-reference mu and sigma (as uamt.pyfunc raw_predict)",
            "q_err": "tuned per setting x model x LP x n% on dev: max mean Recall@N over N = 1..n_max(dev), "
            f"grid = dev-mu quantiles {THRESHOLD_QUANTILES[0]}..{THRESHOLD_QUANTILES[-1]} "
            f"({len(THRESHOLD_QUANTILES)} levels) + min(mu) - {list(THRESHOLD_TAIL)} x median(sigma)",
        },
        "sizes": sizes,
        "calibration": calibration_source,
        "results": results,
        "curves": curves,
        "random": baseline,
        "pearson": pearson,
        "seconds": seconds,
    }
    result["findings"] = compare_rankings(result)
    return result


def _on_scale(
    mu: np.ndarray, sigma: np.ndarray, words: np.ndarray, scale: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` as predicted (``raw``) or per MT word (``per_word``; Q / w ~ N(mu / w, (sigma / w)^2))."""
    if scale == "raw":
        return mu, sigma
    return mu / words, sigma / words


def compare_rankings(result: dict[str, Any]) -> dict[str, Any]:
    """Per setting and uncertainty method: in how many (LP, n%) cells risk retrieves at least as
    well as mu and as q_hat (mean Recall@N over N, and Precision@|T|), with mean differences."""
    point = result["settings"]["point_method"]
    out: dict[str, Any] = {}
    for setting, per_lp in result["results"].items():
        out[setting] = {}
        for method in result["settings"]["uncertainty_methods"]:
            entry = {}
            for rival in (f"mu:{method}", f"q_hat:{point}"):
                for measure in ("mean_recall", "precision@T"):
                    diffs = [
                        block[f"risk:{method}"][measure] - block[rival][measure]
                        for lp_block in per_lp.values()
                        for block in lp_block.values()
                    ]
                    entry[f"vs {rival} {measure}"] = {
                        "at_least": int(sum(d >= -1e-12 for d in diffs)),
                        "better": int(sum(d > 1e-12 for d in diffs)),
                        "cells": len(diffs),
                        "mean_difference": float(np.mean(diffs)) if diffs else float("nan"),
                    }
            out[setting][method] = entry
    return out


def write_findings(
    settings: CriticalSettings,
    pipeline: PipelineConfig,
    evaluation_settings: EvaluationSettings,
    encode: EncodeConfig,
) -> dict[str, Path]:
    """The stage ``exp_critical``: rank the dev and test rows of ``settings.dataset`` with the
    pipeline's models, write ``critical.json`` and the recall / precision figures; returns their paths."""
    from uamt.experiments.common import open_experiment_features
    from uamt.pipeline_config import load_models, read_split
    from uamt.serving.model_calibration import load_calibrations

    models = load_models(pipeline, (settings.point_method, *settings.uncertainty_methods))
    calibrations = load_calibrations(settings.calibration_dir, settings.uncertainty_methods)
    result = analyse(
        read_split(pipeline.prepared_dir, "dev", (settings.dataset,)),
        read_split(pipeline.prepared_dir, "test", (settings.dataset,)),
        models,
        open_experiment_features(encode),
        point_method=settings.point_method,
        uncertainty_methods=settings.uncertainty_methods,
        reference_calibrations=calibrations,
        evaluation_settings=evaluation_settings,
        target_percents=settings.target_percents,
        max_n_fraction=settings.max_n_fraction,
        max_pseudo_refs=settings.max_pseudo_refs,
        seed=settings.seed,
        scales=settings.scales,
    )
    out = {"result": write_result(NAME, result, settings.metrics_dir)}
    for quantity, name in FIGURES.items():
        out[quantity] = save_figure(figure(result, quantity), Path(settings.figures_dir) / name)
    return out


# ----------------------------------------------------------------------------------------------
# Figures and report

RANKING_STYLE = {"q_hat": "-", "mu": "--", "risk": ":"}


def variant_label(key: str, short: bool = False) -> str:
    """``"pseudo/raw"`` -> a readable label of the reference setting and prediction scale."""
    setting, _, scale = key.partition("/")
    labels = SHORT_LABELS if short else SETTING_LABELS
    return f"{labels.get(setting, setting)}, {SCALE_LABELS.get(scale, scale)}"


def figure(result: dict[str, Any], quantity: str = "recall"):
    """Recall@N (or Precision@N) vs N on test: rows = setting/scale x LP, columns = worst n %;
    the grey line is a random ranking (E[Recall@N] = N / n, E[Precision@N] = |T| / n)."""
    from uamt.experiments.common import pyplot

    if quantity not in ("recall", "precision"):
        raise ValueError(f"quantity={quantity!r} not supported; choose from ['precision', 'recall']")
    plt = pyplot()
    keys = list(result["curves"])
    lps = sorted({lp for key in keys for lp in result["curves"][key]})
    percents = [f"{p}%" for p in result["settings"]["target_percents"]]
    grid = [(key, lp) for key in keys for lp in lps]
    fig, axes = plt.subplots(
        len(grid), len(percents), figsize=(3.5 * len(percents), 2.5 * len(grid)), squeeze=False
    )
    colors = {m: f"C{k + 1}" for k, m in enumerate(result["settings"]["uncertainty_methods"])}
    for row, (key, lp) in enumerate(grid):
        n_rows = result["sizes"]["lps"][lp]["test"]["rows"]
        for col, percent in enumerate(percents):
            ax = axes[row, col]
            curve = result["curves"][key][lp][percent]
            for name, values in curve["rankings"].items():
                kind, method = name.split(":", 1)
                ax.plot(
                    curve["n"],
                    values[quantity],
                    RANKING_STYLE[kind],
                    color=colors.get(method, "C0"),
                    label=f"{kind} ({method})",
                    linewidth=1.3,
                )
            n = np.asarray(curve["n"], dtype=float)
            k = result["sizes"]["lps"][lp]["test"]["targets"][percent]
            ax.plot(
                n,
                n / n_rows if quantity == "recall" else np.full_like(n, k / n_rows),
                color="0.6",
                linewidth=0.8,
                label="random",
            )
            setting, _, scale = key.partition("/")
            ax.set_title(f"{SHORT_LABELS.get(setting, setting)}, {scale}; {lp}, worst {percent}", fontsize=8)
            ax.set_xlabel("N", fontsize=8)
            ax.set_ylim(0, 1.02)
            if col == 0:
                ax.set_ylabel(f"{quantity.capitalize()}@N")
    axes[0, 0].legend(fontsize=6, loc="best")
    return fig


def random_wins(result: dict[str, Any]) -> list[tuple[str, dict[str, list[int]]]]:
    """``(setting/scale, {ranking: [cells where its mean Recall@N beats a random ranking's, cells]})``."""
    out = []
    for key, per_lp in result["results"].items():
        counts: dict[str, list[int]] = {}
        for lp, per_percent in per_lp.items():
            for percent, block in per_percent.items():
                chance = result["random"][lp][percent]["mean_recall"]
                for name, summary in block.items():
                    counts.setdefault(name, [0, 0])
                    counts[name][0] += summary["mean_recall"] > chance
                    counts[name][1] += 1
        out.append((key, counts))
    return out


def pseudo_verdicts(result: dict[str, Any]) -> list[tuple[str, list[tuple[str, bool, bool]]]]:
    """Whether the paper's finding (risk >= mu and q_hat by recall) holds with pseudo-references:
    per scale, ``(method, majority, strict)`` -- risk at least as good as mu and q_hat in a strict
    majority of the (LP, n %) cells, and strictly better than mu in a strict majority."""
    point = result["settings"]["point_method"]
    out = []
    for key, per_method in result["findings"].items():
        if not key.startswith("pseudo/"):
            continue
        holds = []
        for method, entry in per_method.items():
            mu = entry[f"vs mu:{method} mean_recall"]
            qh = entry[f"vs q_hat:{point} mean_recall"]
            majority = mu["at_least"] * 2 > mu["cells"] and qh["at_least"] * 2 > qh["cells"]
            holds.append((method, majority, mu["better"] * 2 > mu["cells"]))
        out.append((SCALE_LABELS.get(key.partition("/")[2], key), holds))
    return out


def render(result: dict[str, Any]) -> str:
    """The markdown section of reports/experiments.md (``templates/critical.md.j2``)."""
    return rendering.render(
        NAME,
        result,
        percent_keys=[f"{p}%" for p in result["settings"]["target_percents"]],
        variant_label=variant_label,
        pseudo_verdicts=pseudo_verdicts(result),
        random_wins=random_wins(result),
        paper_test_segments=paper_numbers.values("critical", "test_segments"),
    )


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(finding, what the paper reports, what we measured -- starting with held / partly / not held / n/a).

    One row per prediction scale of the reference-free (pseudo-reference) setting, the paper's
    setting.  For every uncertainty method ``m`` and rival ranking (``mu`` of ``m``, ``q_hat`` of the
    point model), the comparison *holds* when the risk ranking's mean Recall@N over N = 1..N max is
    at least the rival's in a strict majority of the (LP, n %) cells (:func:`compare_rankings`,
    ties counted as "at least"; the same rule as :func:`verdict`).  The row is **held** when every
    method x rival comparison holds, **not held** when none does, **partly** otherwise, **n/a**
    without cells.  Precision@|T| is quoted beside, without entering the verdict.
    """
    point = result["settings"]["point_method"]
    rows = []
    for key, per_method in result["findings"].items():
        setting, _, scale = key.partition("/")
        if setting != "pseudo":
            continue
        checks, parts = [], []
        for method, entry in per_method.items():
            texts = []
            for rival, name in ((f"mu:{method}", "mu"), (f"q_hat:{point}", "q_hat")):
                recall = entry[f"vs {rival} mean_recall"]
                precision = entry[f"vs {rival} precision@T"]
                if recall["cells"]:
                    checks.append(recall["at_least"] * 2 > recall["cells"])
                texts.append(
                    f">= {name} in {recall['at_least']}/{recall['cells']} (strictly more in "
                    f"{recall['better']}, mean {recall['mean_difference']:+.3f}; P@|T| >= {name} in "
                    f"{precision['at_least']}/{precision['cells']})"
                )
            parts.append(f"{method}: " + ", ".join(texts))
        verdict = (
            "n/a" if not checks else "held" if all(checks) else "not held" if not any(checks) else "partly"
        )
        percents = "/".join(str(p) for p in result["settings"]["target_percents"])
        lps = ", ".join(sorted(result["sizes"]["lps"]))
        rows.append(
            (
                "Ranking by the risk P(Q <= q_err) retrieves at least as many of the worst n % as ranking "
                f"by mu or q_hat, reference-free with pseudo-references ({SCALE_LABELS.get(scale, scale)})",
                "Risk (UA-COMET) overtakes q_hat and mu in Recall@N as N grows, higher Precision at small "
                "N (WMT20 en-de MQM, PRISM pseudo-references, worst 2 %; §5.5 Fig. 2, App. F Fig. 4)",
                f"{verdict}: mean Recall@N of risk over (LP, n %) cells ({lps}; worst {percents} %) — "
                + "; ".join(parts),
            )
        )
    return rows
