"""Noisy-reference detection (*Better Uncertainty Quantification*, §5.5, Figure 4).

On WMT21 news MQM en-de the human references A, C and D were MQM-rated themselves (pseudo-systems
``ref-A``, ``ref-C``, ``ref-D``).  For each segment, the best-rated reference is ``r_good`` and the
worst-rated one ``r_bad``; segments are kept when their MQM differ by more than a threshold (the paper:
10 points, at least two major errors).  Every rated system output ``<src, mt>`` of a kept segment is
scored with ``r_good`` and with ``r_bad`` by each uncertainty method; the method *picks* the reference
that gives the lower predicted sigma, and we report how often that pick is ``r_good`` (paper: HTS > 82 %,
MCD 38 %).

Rules, stated because the data forces them:

* ties in MQM: among equally rated references the first in name order (A, C, D) is taken, both for
  ``r_good`` and for ``r_bad``; with a gap above the threshold the two are always different;
* ties in sigma count as a wrong pick (no preference is not a correct preference);
* the choice uses each method's raw predicted sigma; the dev calibration (standardisation and
  :math:`\\sigma^2 \\mapsto \\alpha\\sigma^2 + \\beta`, floored) is monotone within a language pair, so
  the calibrated pick is the same except where the floor makes both sigmas equal -- it is reported
  beside;
* WMT21 en-de has few segments with a gap > 10 outside the training pools, so several thresholds are
  reported with their counts; the headline is the strictest threshold that keeps at least
  ``min_segments`` segments;
* the point estimate has no sigma of its own (a fixed variance cannot prefer a reference): skipped.

Pairs of the same segment share ``r_good`` / ``r_bad``, so besides the binomial (Wilson) interval on
pairs a segment-level bootstrap interval is reported.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from uamt.core.config import ConfigError
from uamt.core.errors import DataError
from uamt.experiments import paper_numbers, rendering
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, fmt, save_figure, write_result
from uamt.experiments.references import (
    REFERENCE_SYSTEM,
    check_reference_names,
    read_rows,
    reference_rows,
    reference_table,
    score_references,
)
from uamt.experiments.rendering import percent, percent_interval
from uamt.pipeline_config import CALIBRATION_DIR, PipelineConfig, check_methods

if TYPE_CHECKING:
    from uamt.encoders import EncodeConfig

log = logging.getLogger(__name__)

NAME = "noisy_refs"
FIGURE = "noisy_refs.png"

#: §5.5 / Figure 4 of Zerva et al. (2022): share of pairs where the lower-uncertainty reference is
#: the better one (HTS "> 82 %", MCD 38 %); our ``mcd_head`` is the MC-dropout method.
PAPER = paper_numbers.values("noisy_refs", "share_better_reference")
PAPER_TEXT = paper_numbers.entry("noisy_refs", "share_better_reference")["text"]
PAPER_THRESHOLD = paper_numbers.values("noisy_refs", "threshold")

#: Methods without a sigma of their own, skipped with this reason.
NO_SIGMA = {"point": "a point estimate has no sigma of its own; a fixed variance cannot prefer a reference"}


@dataclass(frozen=True)
class NoisyRefsSettings:
    """params.yaml ``exp_noisy_refs:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``noisy_refs.json`` and ``noisy_refs.png`` go.
    dataset, lp : str
        Rows analysed: a dataset whose references are MQM-rated pseudo-systems ``ref-X``.
    references : tuple of str
        Reference names in the order of the system rows' ``refs`` (WMT21 en-de: A, C, D).
    splits : tuple of str
        Prepared splits used; never the training pools ``d_q`` / ``d_e``.
    methods : tuple of str
        Pipeline models (``models/<method>``); ``point`` is reported as skipped (no sigma).
    thresholds : tuple of float
        MQM gaps MQM(r_good) - MQM(r_bad) > t reported (the paper: 10).
    min_segments : int
        The headline is the strictest threshold keeping at least this many segments.
    calibration_dir : str
        ``<dir>/<method>.json`` (calibrate stage) for the calibrated-sigma pick.
    mc_samples : int or null
        MC-dropout passes (null: each model's own ``mc_samples``).
    n_boot, seed : int
        Segment-bootstrap resamples and their seed.
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    dataset: str = "wmt21_mqm"
    lp: str = "en-de"
    references: tuple[str, ...] = ("A", "C", "D")
    splits: tuple[str, ...] = ("dev", "test")
    methods: tuple[str, ...] = ("point", "mcd_head", "ensemble", "hts", "hts_mcd", "dup")
    thresholds: tuple[float, ...] = (10.0, 5.0, 2.0, 1.0, 0.0)
    min_segments: int = 30
    calibration_dir: str = CALIBRATION_DIR
    mc_samples: int | None = None
    n_boot: int = 2000
    seed: int = 13

    def __post_init__(self) -> None:
        where = f"exp_{NAME}"
        check_methods(self.methods, where)
        for split in self.splits:
            if split in ("d_q", "d_e"):
                raise ConfigError(f"{where}.splits: {split!r} is a training pool; use held-out splits")
        if not self.thresholds:
            raise ConfigError(f"{where}.thresholds is empty")


# --------------------------------------------------------------------------- pair selection
def reference_mqm(frame: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """MQM of each named reference per segment: index (lp, seg_id), one column per name (NaN = unrated).

    Raises
    ------
    ValueError
        A name is not a rated reference (``ref-X`` system) of ``frame``.
    DataError
        A reference is rated twice for the same segment.
    """
    refs = frame.loc[reference_rows(frame)]
    known = sorted({REFERENCE_SYSTEM.fullmatch(str(s)).group(1) for s in refs["system"]})
    names = check_reference_names(names, known)
    refs = refs.assign(name=[REFERENCE_SYSTEM.fullmatch(str(s)).group(1) for s in refs["system"]])
    refs = refs[refs["name"].isin(names)]
    dup = refs.duplicated(["lp", "seg_id", "name"])
    if dup.any():
        row = refs.loc[dup].iloc[0]
        raise DataError(f"reference {row['name']} is rated twice for lp {row['lp']}, seg_id {row['seg_id']}")
    scores = pd.to_numeric(refs["score"], errors="coerce")
    table = refs.assign(score=scores).pivot(index=["lp", "seg_id"], columns="name", values="score")
    return table.reindex(columns=list(names))


def select_pairs(mqm: pd.DataFrame) -> pd.DataFrame:
    """Best and worst rated reference of every segment with at least two rated references.

    Parameters
    ----------
    mqm : DataFrame
        :func:`reference_mqm` (index (lp, seg_id), one column per reference, NaN = unrated).

    Returns
    -------
    DataFrame, index (lp, seg_id): ``good``, ``bad`` (reference names), ``mqm_good``, ``mqm_bad``,
    ``gap = mqm_good - mqm_bad`` (>= 0).  Ties go to the first name in column order.
    """
    rows = []
    names = list(mqm.columns)
    for key, values in mqm.iterrows():
        rated = [(name, float(values[name])) for name in names if math.isfinite(values[name])]
        if len(rated) < 2:
            continue
        best = max(s for _, s in rated)
        worst = min(s for _, s in rated)
        good = next(n for n, s in rated if s == best)
        bad = next(n for n, s in rated if s == worst)
        rows.append((*key, good, bad, best, worst, best - worst))
    out = pd.DataFrame(rows, columns=["lp", "seg_id", "good", "bad", "mqm_good", "mqm_bad", "gap"])
    return out.set_index(["lp", "seg_id"])


def gap_counts(pairs: pd.DataFrame, thresholds: Sequence[float]) -> dict[str, int]:
    """Number of segments whose best-worst MQM gap is strictly above each threshold."""
    return {threshold_label(t): int((pairs["gap"] > t).sum()) for t in thresholds}


def threshold_label(threshold: float) -> str:
    return f"{float(threshold):g}"


def headline_threshold(counts: dict[str, int], thresholds: Sequence[float], min_segments: int) -> float:
    """The strictest threshold keeping >= ``min_segments`` segments (else the loosest one)."""
    ordered = sorted((float(t) for t in thresholds), reverse=True)
    for t in ordered:
        if counts[threshold_label(t)] >= min_segments:
            return t
    return ordered[-1]


# --------------------------------------------------------------------------- statistics
def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % by default); (nan, nan) when n = 0.

    .. math:: \\frac{\\hat p + z^2/2n \\pm z\\sqrt{\\hat p(1-\\hat p)/n + z^2/4n^2}}{1 + z^2/n}
    """
    if n <= 0:
        return float("nan"), float("nan")
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must be in [0, n={n}]")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def segment_bootstrap(
    correct: np.ndarray, segments: np.ndarray, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95 % percentile interval of the pick accuracy, resampling whole segments with replacement."""
    correct = np.asarray(correct, dtype=float)
    if correct.size == 0:
        return float("nan"), float("nan")
    codes, segment_ids = np.unique(np.asarray(segments), return_inverse=True)
    hits = np.bincount(segment_ids, weights=correct, minlength=len(codes))
    sizes = np.bincount(segment_ids, minlength=len(codes)).astype(float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(codes), size=(n_boot, len(codes)))
    stats = hits[draws].sum(axis=1) / sizes[draws].sum(axis=1)
    low, high = np.percentile(stats, [2.5, 97.5])
    return float(low), float(high)


def pick_accuracy(
    sigma_good: np.ndarray, sigma_bad: np.ndarray, segments: np.ndarray, n_boot: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """How often the lower sigma is that of ``r_good`` (ties count as wrong), with intervals."""
    sigma_good = np.asarray(sigma_good, dtype=float)
    sigma_bad = np.asarray(sigma_bad, dtype=float)
    if sigma_good.shape != sigma_bad.shape:
        raise ValueError(f"sigma_good {sigma_good.shape} and sigma_bad {sigma_bad.shape} differ in shape")
    if not (np.isfinite(sigma_good).all() and np.isfinite(sigma_bad).all()):
        raise DataError("sigma is NaN or infinite; a method without its own sigma cannot pick a reference")
    correct = sigma_good < sigma_bad
    n, k = int(correct.size), int(correct.sum())
    return {
        "n": n,
        "correct": k,
        "ties": int((sigma_good == sigma_bad).sum()),
        "fraction": k / n if n else None,
        "wilson95": list(wilson_interval(k, n)),
        "segment_bootstrap95": list(segment_bootstrap(correct, segments, n_boot, seed)),
    }


# --------------------------------------------------------------------------- the analysis
def run_noisy_refs(
    models: dict[str, Any],
    frame: pd.DataFrame,
    features,
    *,
    calibrations: dict[str, Any] | None = None,
    names: Sequence[str] = ("A", "C", "D"),
    thresholds: Sequence[float] = (10.0, 5.0, 2.0, 1.0, 0.0),
    min_segments: int = 30,
    n_samples: int | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Pick accuracy of every method at every threshold.

    Parameters
    ----------
    models : dict
        method -> loaded model (:func:`uamt.models.api.load`); methods in :data:`NO_SIGMA` are skipped.
    frame : DataFrame
        Canonical rows of one dataset x LP (MQM), system rows and the rated ``ref-X`` rows of the same
        segments, from splits the models were not trained on.
    calibrations : dict, optional
        method -> :class:`uamt.serving.model_calibration.Calibration` for the calibrated-sigma pick.
    names : sequence of str
        Reference names in the order of the system rows' ``refs``.
    thresholds : sequence of float
        MQM gaps: a segment is kept when ``MQM(r_good) - MQM(r_bad) > threshold``.
    min_segments : int
        Fewest segments for the headline threshold.
    """
    import time

    if not thresholds:
        raise ValueError("thresholds is empty; give at least one MQM gap")
    frame = frame.reset_index(drop=True)
    names = tuple(names)
    refs = reference_table(frame, names, where="noisy_refs rows")
    pairs = select_pairs(reference_mqm(frame, names))
    counts = gap_counts(pairs, thresholds)
    headline = headline_threshold(counts, thresholds, min_segments)
    loosest = min(float(t) for t in thresholds)
    kept = pairs[pairs["gap"] > loosest]
    systems = frame.loc[refs.index]
    keys = pd.MultiIndex.from_arrays([systems["lp"], systems["seg_id"]])
    in_kept = keys.isin(kept.index)
    rows, refs = systems.loc[in_kept], refs.loc[in_kept]
    row_pairs = kept.loc[pd.MultiIndex.from_arrays([rows["lp"], rows["seg_id"]])]
    good_col = np.array([names.index(n) for n in row_pairs["good"]], dtype=int)
    bad_col = np.array([names.index(n) for n in row_pairs["bad"]], dtype=int)
    gap = row_pairs["gap"].to_numpy(dtype=float)
    segments = np.array([f"{lp}/{sid}" for lp, sid in zip(rows["lp"], rows["seg_id"], strict=True)])
    lp = rows["lp"].astype(str).to_numpy()
    calibrations = calibrations or {}

    sigmas: dict[str, dict[str, np.ndarray]] = {}
    skipped = {}
    for method, model in models.items():
        if method in NO_SIGMA:
            skipped[method] = NO_SIGMA[method]
            continue
        started = time.perf_counter()
        scores = score_references(model, rows, refs, features, n_samples)
        sigma = scores.sigma
        per_method = {"raw": sigma}
        calibration = calibrations.get(method)
        if calibration is not None:
            per_method["calibrated"] = np.stack(
                [calibration.apply(scores.mu[:, j], sigma[:, j], lp)[1] for j in range(len(names))], axis=1
            )
        sigmas[method] = per_method
        if timings is not None:
            timings[method] = time.perf_counter() - started
        log.info("noisy_refs: %s scored in %.1f s", method, time.perf_counter() - started)

    index = np.arange(len(rows))
    by_threshold = []
    for t in sorted((float(x) for x in thresholds), reverse=True):
        keep = gap > t
        block: dict[str, Any] = {
            "threshold": t,
            "n_segments": counts[threshold_label(t)],
            "n_pairs": int(keep.sum()),
            "good": _counts(row_pairs["good"].to_numpy()[keep], names),
            "bad": _counts(row_pairs["bad"].to_numpy()[keep], names),
            "methods": {},
        }
        for method, per_method in sigmas.items():
            block["methods"][method] = {
                kind: pick_accuracy(
                    sigma[index[keep], good_col[keep]],
                    sigma[index[keep], bad_col[keep]],
                    segments[keep],
                    n_boot,
                    seed,
                )
                for kind, sigma in per_method.items()
            }
        by_threshold.append(block)

    all_segments = pairs.reset_index()
    return {
        "data": {
            "dataset": ", ".join(sorted(frame["dataset"].astype(str).unique())),
            "lp": ", ".join(sorted(frame["lp"].astype(str).unique())),
            "splits": sorted(frame["split"].astype(str).unique()) if "split" in frame else None,
            "references": list(names),
            "n_segments_rated": len(all_segments),
            "n_system_rows": len(systems),
            "systems": sorted(systems["system"].astype(str).unique().tolist()),
            "segments_above": counts,
            "max_gap": float(pairs["gap"].max()) if len(pairs) else None,
        },
        "settings": {
            "thresholds": [float(t) for t in thresholds],
            "min_segments": int(min_segments),
            "mc_samples": n_samples,
            "n_boot": int(n_boot),
            "seed": int(seed),
        },
        "headline_threshold": headline,
        "paper": {"threshold": PAPER_THRESHOLD, **PAPER},
        "skipped": skipped,
        "thresholds": by_threshold,
    }


def _counts(values: np.ndarray, names: Sequence[str]) -> dict[str, int]:
    return {name: int((values == name).sum()) for name in names}


def write_findings(
    settings: NoisyRefsSettings, pipeline: PipelineConfig, encode: EncodeConfig
) -> dict[str, Path]:
    """The stage ``exp_noisy_refs``: score the held-out rows of ``settings.dataset`` x ``lp`` with the
    pipeline's models, write ``noisy_refs.json`` and ``noisy_refs.png``; returns their paths."""
    from uamt.experiments.common import open_experiment_features
    from uamt.pipeline_config import load_models
    from uamt.serving.model_calibration import load_calibrations

    frame = pd.concat(
        [read_rows(pipeline.prepared_dir, split, settings.dataset, settings.lp) for split in settings.splits],
        ignore_index=True,
    )
    models = load_models(pipeline, settings.methods)
    calibrations = load_calibrations(
        settings.calibration_dir, [m for m in settings.methods if m not in NO_SIGMA]
    )
    timings: dict[str, float] = {}
    result = run_noisy_refs(
        models,
        frame,
        open_experiment_features(encode),
        calibrations=calibrations,
        names=settings.references,
        thresholds=settings.thresholds,
        min_segments=settings.min_segments,
        n_samples=settings.mc_samples,
        n_boot=settings.n_boot,
        seed=settings.seed,
        timings=timings,
    )
    result["runtime_s"] = {method: round(seconds, 1) for method, seconds in timings.items()}
    return {
        "result": write_result(NAME, result, settings.metrics_dir),
        "figure": save_figure(figure(result), Path(settings.figures_dir) / FIGURE),
    }


# --------------------------------------------------------------------------- report
def headline_block(result: dict[str, Any]) -> dict[str, Any]:
    t = result["headline_threshold"]
    return next(b for b in result["thresholds"] if b["threshold"] == t)


def render(result: dict[str, Any]) -> str:
    """Markdown section ``## 2. Noisy-reference detection`` from the JSON result (``templates/noisy_refs.md.j2``)."""
    paper_threshold = result["paper"]["threshold"]
    return rendering.render(
        NAME,
        result,
        headline=headline_block(result),
        paper_text=PAPER_TEXT,
        chance=CHANCE,
        strict=[b for b in result["thresholds"] if b["threshold"] >= paper_threshold],
    )


def figure(result: dict[str, Any]):
    """Bar chart: share of pairs where each method picks r_good, one bar per threshold, with segment-
    bootstrap 95 % error bars, chance (50 %) and the paper's values marked."""
    from uamt.experiments.common import pyplot

    plt = pyplot()
    blocks = [b for b in result["thresholds"] if b["n_pairs"] > 0]
    methods = sorted(
        {m for b in blocks for m in b["methods"]},
        key=lambda m: list(blocks[0]["methods"]).index(m) if m in blocks[0]["methods"] else 99,
    )
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(methods) + 2), 4.2))
    width = 0.8 / max(len(blocks), 1)
    x = np.arange(len(methods))
    for i, block in enumerate(blocks):
        values, errors = [], [[], []]
        for method in methods:
            raw = block["methods"].get(method, {}).get("raw")
            value = raw["fraction"] if raw else np.nan
            low, high = raw["segment_bootstrap95"] if raw else (np.nan, np.nan)
            values.append(value)
            errors[0].append(value - low)
            errors[1].append(high - value)
        bold = block["threshold"] == result["headline_threshold"]
        ax.bar(
            x + (i - (len(blocks) - 1) / 2) * width,
            values,
            width,
            yerr=errors,
            capsize=2,
            alpha=1.0 if bold else 0.45,
            label=f"gap > {block['threshold']:g} ({block['n_segments']} seg, {block['n_pairs']} pairs)",
        )
    for j, method in enumerate(methods):
        paper = result["paper"].get(method)
        if paper is not None:
            ax.plot([j - 0.45, j + 0.45], [paper, paper], color="crimson", lw=2)
            ax.annotate(
                f"paper {PAPER_TEXT.get(method, f'{100 * paper:.0f} %')}",
                (j, paper),
                textcoords="offset points",
                xytext=(0, 4),
                ha="center",
                fontsize=7,
                color="crimson",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
            )
    ax.axhline(0.5, color="grey", ls="--", lw=1, label="chance")
    ax.set_xticks(x, methods)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share of pairs: lower sigma with r_good\n(error bars: segment bootstrap 95 %)")
    ax.set_title(f"Noisy-reference detection, {result['data']['dataset']} {result['data']['lp']}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


#: Chance level of a pick between two references.
CHANCE = 0.5


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(finding, what the paper reports, what we measured -- starting with held / partly / not held / n/a).

    One row per method with a published share (:data:`PAPER`: HTS, MC dropout), measured at the
    headline threshold on the raw-sigma pick and judged on the segment-bootstrap 95 % interval
    ``[low, high]`` (pairs of one segment share their references, so the pair-level Wilson interval
    is too narrow; it is quoted beside):

    * HTS, paper "> 82 %" (a lower bound, well above chance): **held** when ``low > 0.5`` and
      ``high >= 0.82`` (above chance and consistent with the paper's value); **partly** when
      ``low > 0.5`` but ``high < 0.82`` (better than chance, below the paper); **not held** when
      ``low <= 0.5`` (not distinguishable from chance, or below it).
    * MC dropout, paper "38 %" (below chance): **held** when ``low <= 0.38 <= high < 0.5``;
      **partly** when the interval contains 0.38 but also reaches chance (``high >= 0.5``);
      **not held** when it excludes 0.38.
    * **n/a** when the method was not run or the headline threshold keeps no pair.
    """
    head = headline_block(result)
    threshold = fmt(result["headline_threshold"], 0)
    paper_threshold = result["paper"]["threshold"]
    strict = [b for b in result["thresholds"] if b["threshold"] >= paper_threshold]
    at_paper = strict[-1] if strict else None
    labels = {"hts": "HTS", "mcd_head": "MC dropout"}
    rows = []
    for method, paper_value in PAPER.items():
        label = labels.get(method, method)
        finding = (
            f"{label} picks the better of two references (lower sigma with r_good) in "
            f"{PAPER_TEXT[method]} of pairs"
        )
        paper = (
            f"{PAPER_TEXT[method]} of pairs with MQM gap > {fmt(paper_threshold, 0)} "
            "(Better Uncertainty Quantification §5.5, Fig. 4; WMT21 en-de)"
        )
        raw = head["methods"].get(method, {}).get("raw")
        if raw is None or not raw["n"]:
            why = "not run" if raw is None else "no pair"
            rows.append((finding, paper, f"n/a: {why} at MQM gap > {threshold}"))
            continue
        low, high = raw["segment_bootstrap95"]
        if method == "hts":
            verdict = "not held" if low <= CHANCE else "held" if high >= paper_value else "partly"
        else:
            inside = low <= paper_value <= high
            verdict = "not held" if not inside else "held" if high < CHANCE else "partly"
        measured = (
            f"{verdict}: {percent(raw['fraction'])} of {raw['n']} pairs ({head['n_segments']} segments) at "
            f"MQM gap > {threshold}, segment-bootstrap 95 % {percent_interval(raw['segment_bootstrap95'])} "
            f"(Wilson {percent_interval(raw['wilson95'])}; chance 50 %)"
        )
        paper_raw = at_paper["methods"].get(method, {}).get("raw") if at_paper else None
        if paper_raw is not None and paper_raw["n"] and at_paper is not head:
            measured += (
                f"; at the paper's gap > {fmt(at_paper['threshold'], 0)} only {paper_raw['n']} pairs "
                f"({at_paper['n_segments']} segment(s)): {percent(paper_raw['fraction'])}"
            )
        rows.append((finding, paper, measured))
    return rows
