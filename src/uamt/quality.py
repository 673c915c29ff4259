"""How good the prediction under the uncertainty is: the quality goals per dataset x language pair.

Reads what the pipeline wrote -- a model's test predictions (``predictions/test/<model>.parquet``:
raw ``mu``, ``sigma`` and the human score), its served calibration (``calibration/<model>.json``)
and the prepared test rows (for the texts) -- and measures, per dataset x LP:

``pps``
    Pearson of the served mu (clipped to the scale, as users get it) with the human score.
``chrf_r``
    Pearson of sentence chrF (sacrebleu, translation against its reference) with the human score:
    the lexical floor a learned metric has to clear.
``auroc_risk`` / ``auroc_mu`` / ``auroc_chrf``
    Area under the ROC curve of, respectively, the served risk P(Q <= chi), of -mu and of -chrF
    for the event "human score <= chi" (chi = -5: an MQM major error).
``recall_worst``
    Of the rows among the worst ``worst_fraction`` by human score (ties at the cut included),
    the share that are among the ``ceil(worst_fraction x n)`` rows with the lowest served mu.
``width`` / ``coverage``
    Mean width and coverage of the served central interval at ``gamma`` (clipped to the scale).

:func:`goal_checks` compares them with the goals (:class:`QualityGoals`); ``benchmarks/quality.py``
prints the table.  Metrics follow scikit-learn's convention: higher is better except ``width``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.core.stats import pearson_r

#: Columns that identify a test row in both the predictions and the prepared table.
ROW_KEYS = ("dataset", "lp", "seg_id", "system")


@dataclass(frozen=True)
class QualityGoals:
    """The goals a served model is checked against (defaults: the quality issue's numbers).

    Attributes
    ----------
    chrf_margin : float
        PPS must exceed sentence chrF's Pearson by at least this much, per dataset x LP.
    pps_floor : dict
        ``(dataset, lp) -> PPS`` the published XLM-R-large figures (WMT21 MQM en-de .33, zh-en .59).
    auroc_risk : float
        Floor on the AUROC of the served risk for "human <= chi", per dataset x LP.
    recall_worst : float
        Floor on the recall of the worst ``worst_fraction``.
    width_reduction : float
        The mean interval must be this much narrower (relative) than ``baseline_width`` ...
    baseline_width : float
        ... the mean 90 % width of the champion measured when the goals were set (14.75 MQM) ...
    coverage_tolerance : float
        ... with coverage no further than this below ``gamma``.
    """

    chrf_margin: float = 0.15
    pps_floor: tuple[tuple[str, str, float], ...] = (("wmt21_mqm", "en-de", 0.33), ("wmt21_mqm", "zh-en", 0.59))
    auroc_risk: float = 0.80
    recall_worst: float = 0.30
    width_reduction: float = 0.25
    baseline_width: float = 14.75
    coverage_tolerance: float = 0.03


def auroc_score(scores: np.ndarray, event: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` (higher = more likely) for the boolean ``event``.

    The Mann-Whitney statistic with mid-ranks for ties; NaN when only one class is present.
    """
    from scipy.stats import rankdata

    scores = np.asarray(scores, dtype=float)
    event = np.asarray(event, dtype=bool)
    if scores.shape != event.shape:
        raise ValueError(f"scores {scores.shape} and event {event.shape} differ in shape")
    n_pos = int(event.sum())
    n_neg = event.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[event].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def worst_recall_score(predicted: np.ndarray, human: np.ndarray, fraction: float = 0.02) -> float:
    """Share of the worst ``fraction`` of rows by ``human`` (every row tied with the cut included)
    that are among the ``ceil(fraction x n)`` rows with the lowest ``predicted``."""
    predicted = np.asarray(predicted, dtype=float)
    human = np.asarray(human, dtype=float)
    if not 0 < fraction < 1:
        raise ValueError(f"fraction={fraction!r} must be in (0, 1)")
    k = max(1, math.ceil(fraction * human.size))
    cut = np.sort(human)[k - 1]
    truly_worst = human <= cut
    flagged = np.zeros(human.size, dtype=bool)
    flagged[np.argsort(predicted, kind="stable")[:k]] = True
    return float((flagged & truly_worst).sum() / truly_worst.sum())


def sentence_chrf(mt, ref) -> np.ndarray:
    """Sentence chrF (sacrebleu defaults, 0-100) of each translation against its reference."""
    from uamt.lexical import segment_scores

    return segment_scores([str(t) for t in mt], [str(r) for r in ref], "chrf")


def join_texts(predictions: pd.DataFrame, prepared: pd.DataFrame, where: str) -> pd.DataFrame:
    """``predictions`` with the ``mt`` and ``ref`` columns of their prepared rows (joined on
    :data:`ROW_KEYS`); a prediction without its prepared row is refused, naming it."""
    missing = [c for c in ROW_KEYS if c not in predictions.columns or c not in prepared.columns]
    if missing:
        raise DataError(f"{where}: cannot join predictions to texts; key column(s) {missing} missing")
    texts = prepared[list(ROW_KEYS) + ["mt", "ref"]].drop_duplicates(list(ROW_KEYS))
    joined = predictions.merge(texts, on=list(ROW_KEYS), how="left", validate="one_to_one")
    lost = joined["mt"].isna().to_numpy()
    if lost.any():
        row = joined.loc[lost, list(ROW_KEYS)].iloc[0].to_dict()
        raise DataError(f"{where}: {int(lost.sum())} prediction row(s) have no prepared test row, e.g. {row}")
    return joined


def served_quantities(calibration, table: pd.DataFrame, bounds, chi: float, gamma: float) -> dict[str, np.ndarray]:
    """The served mu, risk P(Q <= chi) and central ``gamma`` interval of each row of ``table``
    (raw ``mu``, ``sigma``, ``lp``), clipped to ``bounds`` as users get them."""
    mu = table["mu"].to_numpy(dtype=float)
    sigma = table["sigma"].to_numpy(dtype=float)
    sigma = np.where(np.isfinite(sigma), sigma, 1.0)  # the point estimate's placeholder sigma
    from uamt.uncertainty.served import served_columns

    lp = table["lp"].astype(str).to_numpy(dtype=object)
    served = served_columns(calibration, mu, sigma, lp, confidence=gamma, chi=chi, bounds=bounds)
    return {
        "center": served["mu"].to_numpy(dtype=float),
        "risk": served["risk"].to_numpy(dtype=float),
        "lower": served["lower"].to_numpy(dtype=float),
        "upper": served["upper"].to_numpy(dtype=float),
    }


def group_metrics(
    human: np.ndarray,
    served: dict[str, np.ndarray],
    chrf: np.ndarray | None,
    *,
    chi: float = -5.0,
    worst_fraction: float = 0.02,
) -> dict[str, Any]:
    """The quality numbers of one group of rows (module docstring); ``chrf`` None skips its columns."""
    human = np.asarray(human, dtype=float)
    event = human <= chi
    center = served["center"]
    inside = (served["lower"] <= human) & (human <= served["upper"])
    out: dict[str, Any] = {
        "n": int(human.size),
        "n_bad": int(event.sum()),
        "pps": pearson_r(center, human, min_rows=3),
        "auroc_risk": auroc_score(served["risk"], event),
        "auroc_mu": auroc_score(-center, event),
        "recall_worst": worst_recall_score(center, human, worst_fraction),
        "width": float(np.mean(served["upper"] - served["lower"])),
        "coverage": float(np.mean(inside)),
    }
    if chrf is not None:
        out["chrf_r"] = pearson_r(chrf, human, min_rows=3)
        out["auroc_chrf"] = auroc_score(-np.asarray(chrf, float), event)
        out["recall_worst_chrf"] = worst_recall_score(np.asarray(chrf, float), human, worst_fraction)
    return out


def quality_table(
    table: pd.DataFrame,
    calibration,
    bounds,
    *,
    chi: float = -5.0,
    gamma: float = 0.9,
    worst_fraction: float = 0.02,
    with_chrf: bool = True,
) -> pd.DataFrame:
    """One row per dataset x LP of ``table`` (columns ``dataset``, ``lp``, ``human``, ``mu``,
    ``sigma`` and, for chrF, ``mt`` and ``ref``) plus an ``all`` row (every row pooled)."""
    served = served_quantities(calibration, table, bounds, chi, gamma)
    chrf = sentence_chrf(table["mt"], table["ref"]) if with_chrf else None
    human = table["human"].to_numpy(dtype=float)
    rows = []
    groups = list(table.groupby(["dataset", "lp"], sort=True).indices.items())
    groups.append((("all", "all"), np.arange(len(table))))
    for (dataset, lp), index in groups:
        part = {k: v[index] for k, v in served.items()}
        metrics = group_metrics(
            human[index], part, None if chrf is None else chrf[index], chi=chi, worst_fraction=worst_fraction
        )
        rows.append({"dataset": dataset, "lp": lp, **metrics})
    return pd.DataFrame(rows)


def goal_checks(row: dict[str, Any], goals: QualityGoals, gamma: float = 0.9) -> dict[str, bool | None]:
    """Which goals one row of :func:`quality_table` meets (None: not measurable on it)."""

    def at_least(value, floor):
        return None if value is None or not np.isfinite(value) else bool(value >= floor)

    if row["dataset"] == "all":  # pooled over datasets of different scales: only the width goal
        narrow = row["width"] <= (1.0 - goals.width_reduction) * goals.baseline_width
        covered = row["coverage"] >= gamma - goals.coverage_tolerance
        return {"width": bool(narrow and covered)}
    checks: dict[str, bool | None] = {
        "pps_vs_chrf": at_least(row["pps"] - row.get("chrf_r", float("nan")), goals.chrf_margin),
        "auroc_risk": at_least(row["auroc_risk"], goals.auroc_risk),
        "recall_worst": at_least(row["recall_worst"], goals.recall_worst),
    }
    floors = {(d, lp): v for d, lp, v in goals.pps_floor}
    if (row["dataset"], row["lp"]) in floors:
        checks["pps_floor"] = at_least(row["pps"], floors[(row["dataset"], row["lp"])])
    return checks


def read_model(
    predictions_dir: str | Path, calibration_dir: str | Path, model: str, split: str = "test"
) -> tuple[pd.DataFrame, Any]:
    """``(predictions, calibration)`` of ``model`` as the pipeline wrote them.

    ``model`` may also name a baseline, ``<point>+<candidate>`` (e.g.
    ``point+signed_mondrian_conformal``): the point model's predictions served through the
    calibration the evaluate stage fitted for it (``calibration/baselines/<model>.json``), the
    baseline every uncertainty method is credited against."""
    from uamt.serving.model_calibration import Calibration, with_model_sigma

    predicted, _, _ = model.partition("+")
    path = Path(predictions_dir) / split / f"{predicted}.parquet"
    if not path.is_file():
        raise DataError(f"{path}: no {split} predictions for model {predicted!r}")
    calibration_path = Path(calibration_dir) / ("baselines" if "+" in model else "") / f"{model}.json"
    if not calibration_path.is_file():
        raise DataError(f"{calibration_path}: no calibration for model {model!r}")
    return with_model_sigma(pd.read_parquet(path), predicted), Calibration.load(calibration_path)


def served_setting(params) -> tuple[Any, Any, tuple[float, float]]:
    """``(pipe, settings, bounds)`` of a params file: the pipeline's paths, the ``evaluate:`` section
    and the score range, what every benchmark that re-measures a served calibration reads first."""
    from uamt.core.config import load_section
    from uamt.data.datasets import scale_bounds
    from uamt.pipeline_config import load_pipeline
    from uamt.uncertainty import EvaluationSettings

    pipe = load_pipeline(params)
    return pipe, load_section(EvaluationSettings, "evaluate", params), scale_bounds(pipe.datasets)


__all__ = [
    "QualityGoals",
    "ROW_KEYS",
    "auroc_score",
    "goal_checks",
    "group_metrics",
    "join_texts",
    "quality_table",
    "read_model",
    "sentence_chrf",
    "served_quantities",
    "served_setting",
    "worst_recall_score",
]
