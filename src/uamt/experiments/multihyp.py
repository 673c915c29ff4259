"""Multi-hypothesis lexical scoring on WMT21 DA with other systems' outputs as pseudo-references.

Re-runs the pseudo-reference part of Fomicheva, Specia and Guzmán (2020), *Multi-Hypothesis
Machine Translation Evaluation* (§3.4, §4, Tables 2 and 4) on the WMT21 DA to-English data, and
the reference rows of its Table 4 on the Estonian-English 1K set.

For every rated segment ``o`` (a row of ``wmt21_da``) the *pseudo-references* ``H = {h_1..h_N}``
are the outputs of the other systems for the same source that are in the DA table
(:func:`uamt.experiments.common.pseudo_reference_rows`; human translations such as ``HUMAN-refB``
are neither evaluated nor used as pseudo-references).  With ``sim(x, y)`` the sacrebleu sentence
metric of hypothesis ``x`` against reference ``y`` (:mod:`uamt.lexical`) and ``r`` the first
reference:

=========================  =========================================
``mt-ref``                 ``sim(o, r)``
``pseudo-mt-*``            ``*_i sim(h_i, o)``   (reference-free)
``pseudo-mt-*-ref``        ``(*_i sim(h_i, o) + sim(o, r)) / 2``
=========================  =========================================

with ``*`` in avg/min/max -- the same definitions as :func:`uamt.lexical.multihyp_variants`, whose
``hyp-self-*`` pairs (``N(N+1)`` scores per segment) this analysis does not need and so skips:
the ``sim(h_i, o)`` of all ordered pairs of one source are scored in one
:func:`uamt.lexical.segment_scores` call and combined with :data:`uamt.lexical.COMBINERS`.
The metrics are not trained, so every split of the prepared data is used (no leakage).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from uamt import lexical
from uamt.core.errors import DataError
from uamt.experiments import paper_numbers, rendering
from uamt.experiments.common import (
    FIGURES_DIR,
    METRICS_DIR,
    fmt,
    is_human_system,
    pseudo_reference_rows,
    save_figure,
    share_verdict,
    write_result,
)

if TYPE_CHECKING:
    from uamt.pipeline_config import PipelineConfig

NAME = "multihyp"
FIGURE = "multihyp.png"
log = logging.getLogger(__name__)
DA_DATASET = "wmt21_da"
ETEN_DATASET = "multihyp_eten"
METRIC_LABELS = {"bleu": "sentBLEU", "chrf": "chrF", "ter": "TER"}

#: The variants reported per LP, in table order.
VARIANTS = (
    "mt-ref",
    "pseudo-mt-avg",
    "pseudo-mt-min",
    "pseudo-mt-max",
    "pseudo-mt-avg-ref",
    "pseudo-mt-min-ref",
    "pseudo-mt-max-ref",
)
ETEN_VARIANTS = ("mt-ref-1", "mt-ref-2", "mt-ref-multi")

#: Published Pearson r of the paper's Table 4 (Estonian-English, 1K) and Table 5 (English-Czech),
#: for comparison only (their pseudo-references are 3-5 online systems, ours the WMT21 systems).
PAPER_ETEN = paper_numbers.values("multihyp", "eten")
PAPER_ENCS = paper_numbers.values("multihyp", "encs")


@dataclass(frozen=True)
class MultihypSettings:
    """params.yaml ``exp_multihyp:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``multihyp.json`` and ``multihyp.png`` go.
    metrics : list of {"bleu", "chrf", "ter"}
        Sentence-level similarity functions (sacrebleu defaults, ``uamt.lexical``).
    max_sources_per_lp : int or None
        Source segments sampled per LP (all rated systems of each are kept); None = all.
    max_pseudo_refs : int or None
        Pseudo-references per segment, sampled from the other systems; None = all.
    seed : int
        Seed of both samples.
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    metrics: tuple[str, ...] = ("bleu", "chrf", "ter")
    max_sources_per_lp: int | None = 60
    max_pseudo_refs: int | None = 5
    seed: int = 0


# ----------------------------------------------------------------------------------------------
# Data


def sample_sources(frame: pd.DataFrame, max_sources_per_lp: int | None, seed: int) -> pd.DataFrame:
    """The rows of at most ``max_sources_per_lp`` source segments per LP (seeded, without replacement).

    Sampling whole sources keeps every system's output of a sampled source, so the pseudo-references
    of a kept row are all kept too.  ``None`` keeps everything.  Row order: LP, seg_id, system.
    """
    if max_sources_per_lp is not None and max_sources_per_lp < 1:
        raise DataError(f"max_sources_per_lp={max_sources_per_lp} must be >= 1 (or null for all)")
    rng = np.random.default_rng(seed)
    kept = []
    for lp in sorted(frame["lp"].unique()):
        rows = frame[frame["lp"] == lp]
        seg_ids = np.sort(rows["seg_id"].unique())
        if max_sources_per_lp is not None and len(seg_ids) > max_sources_per_lp:
            seg_ids = np.sort(rng.choice(seg_ids, size=max_sources_per_lp, replace=False))
        kept.append(rows[rows["seg_id"].isin(seg_ids)])
    out = pd.concat(kept) if kept else frame.iloc[:0]
    return out.sort_values(["lp", "seg_id", "system"], kind="stable").reset_index(drop=True)


def da_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Machine-translated DA rows with a reference and a finite score (human systems dropped)."""
    for column in ("lp", "seg_id", "system", "src", "mt", "ref", "score"):
        if column not in frame.columns:
            raise DataError(f"{DA_DATASET} rows: column {column!r} missing")
    keep = ~frame["system"].astype(str).map(is_human_system)
    keep &= frame["ref"].notna() & np.isfinite(pd.to_numeric(frame["score"], errors="coerce"))
    return frame[keep].reset_index(drop=True)


#: Every split of the canonical table: the lexical metrics are not trained, so none is held out.
ALL_SPLITS = ("d_q", "d_e", "dev", "test")


def read_inputs(prepared_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(wmt21_da rows of every split, multihyp_eten rows of the test split)``."""
    from uamt.pipeline_config import read_split

    da = pd.concat(
        [read_split(prepared_dir, split, (DA_DATASET,)) for split in ALL_SPLITS], ignore_index=True
    )
    eten = read_split(prepared_dir, "test", (ETEN_DATASET,))
    return da, eten


# ----------------------------------------------------------------------------------------------
# Scoring


def pseudo_variants(
    mt: Sequence[str], refs: Sequence[str], pseudo_rows: Sequence[np.ndarray], metric: str
) -> dict[str, np.ndarray]:
    """``mt-ref``, ``pseudo-mt-*`` and ``pseudo-mt-*-ref`` of every row (see the module docstring).

    Parameters
    ----------
    mt : sequence of str, length n
        The evaluated outputs ``o``; the pseudo-references are other entries of this list.
    refs : sequence of str, length n
        One human reference per row.
    pseudo_rows : sequence of int arrays, length n
        Positions in ``mt`` of each row's pseudo-references (each non-empty).
    metric : {"bleu", "chrf", "ter"}

    Returns
    -------
    dict of str -> numpy.ndarray, shape (n,)
        Keys :data:`VARIANTS`; scores on the metric's 0-100 scale, TER not sign-flipped.
    """
    n = len(mt)
    if len(refs) != n or len(pseudo_rows) != n:
        raise DataError(f"mt ({n}), refs ({len(refs)}) and pseudo_rows ({len(pseudo_rows)}) differ in length")
    counts = np.array([len(p) for p in pseudo_rows], dtype=np.int64)
    if n and counts.min() < 1:
        raise DataError(f"row {int(np.argmin(counts))} has no pseudo-reference")
    mt_ref = lexical.segment_scores(list(mt), [list(refs)], metric)
    hyp_positions = np.concatenate(pseudo_rows) if n else np.zeros(0, dtype=np.int64)
    owners = np.repeat(np.arange(n), counts)
    # sim(h_i, o): the pseudo-reference is the hypothesis, the evaluated output the reference, as
    # in lexical.multihyp_variants (the metrics are asymmetric).
    pair_scores = (
        lexical.segment_scores([mt[j] for j in hyp_positions], [[mt[i] for i in owners]], metric)
        if n
        else np.zeros(0)
    )
    per_row = np.split(pair_scores, np.cumsum(counts)[:-1]) if n else []
    out = {"mt-ref": mt_ref}
    for comb, combine in lexical.COMBINERS.items():
        combined = np.array([combine(s) for s in per_row], dtype=np.float64)
        out[f"pseudo-mt-{comb}"] = combined
        out[f"pseudo-mt-{comb}-ref"] = (combined + mt_ref) / 2.0
    return {name: out[name] for name in VARIANTS}


def eten_correlations(frame: pd.DataFrame, metrics: Sequence[str]) -> dict[str, dict[str, float]]:
    """Table 4's reference rows on the Estonian-English 1K set: ``{metric: {mt-ref-1/2/multi: r}}``.

    ``frame``: the ``multihyp_eten`` rows (``mt``, ``refs`` = [ref-1, ref-2], ``score`` = DA z).
    """
    if frame.empty:
        raise DataError(f"no {ETEN_DATASET} rows: is the Estonian-English set in the prepared test split?")
    refs = [list(r) for r in frame["refs"]]
    bad = [i for i, r in enumerate(refs) if len(r) != 2]
    if bad:
        raise DataError(f"{ETEN_DATASET} row {bad[0]}: expected 2 references, got {len(refs[bad[0]])}")
    streams = [[r[0] for r in refs], [r[1] for r in refs]]
    mt = frame["mt"].tolist()
    human = frame["score"].to_numpy(dtype=float)
    return {
        metric: lexical.correlations(lexical.reference_variants(mt, streams, metric), human)
        for metric in metrics
    }


def analyse(
    da: pd.DataFrame,
    eten: pd.DataFrame,
    *,
    metrics: Sequence[str] = ("bleu", "chrf", "ter"),
    max_sources_per_lp: int | None = 60,
    max_pseudo_refs: int | None = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """The analysis' JSON result.

    Parameters
    ----------
    da : DataFrame
        ``wmt21_da`` rows of the canonical table (any splits).
    eten : DataFrame
        ``multihyp_eten`` rows.
    metrics : sequence of {"bleu", "chrf", "ter"}
    max_sources_per_lp, max_pseudo_refs, seed
        Cost caps: sampled sources per LP and pseudo-references per row (``None``: all).

    Returns
    -------
    dict
        ``settings``, ``sizes`` (per LP: sources, rows, mean/min/max pseudo-references),
        ``pearson`` ``{metric: {lp | "avg": {variant: r}}}``, ``eten`` ``{metric: {variant: r}}``,
        ``paper`` (published values), ``seconds`` (scoring time per metric).
    """
    for metric in metrics:
        lexical._check_metric(metric)
    rows = sample_sources(da_rows(da), max_sources_per_lp, seed)
    pseudo = pseudo_reference_rows(rows, max_refs=max_pseudo_refs, seed=seed)
    has_pseudo = np.array([len(p) > 0 for p in pseudo], dtype=bool)
    if not has_pseudo.all():  # a source rated for one system only: nothing to compare with
        keep = np.flatnonzero(has_pseudo)
        rows = rows.iloc[keep].reset_index(drop=True)
        pseudo = pseudo_reference_rows(rows, max_refs=max_pseudo_refs, seed=seed)
    if rows.empty:
        raise DataError(f"no {DA_DATASET} rows with pseudo-references")
    lps = sorted(rows["lp"].unique())
    counts = np.array([len(p) for p in pseudo])
    sizes = {}
    for lp in lps:
        mask = (rows["lp"] == lp).to_numpy()
        sizes[lp] = {
            "sources": int(rows.loc[mask, "seg_id"].nunique()),
            "rows": int(mask.sum()),
            "systems": int(rows.loc[mask, "system"].nunique()),
            "pseudo_refs_mean": float(counts[mask].mean()),
            "pseudo_refs_min": int(counts[mask].min()),
            "pseudo_refs_max": int(counts[mask].max()),
            "pairs": int(counts[mask].sum()),
        }
    human = rows["score"].to_numpy(dtype=float)
    pearson: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    for metric in metrics:
        started = time.perf_counter()
        variants = pseudo_variants(rows["mt"].tolist(), rows["ref"].tolist(), pseudo, metric)
        seconds[metric] = time.perf_counter() - started
        log.info(
            "%s: %d pairs + %d mt-ref scores in %.1f s", metric, int(counts.sum()), len(rows), seconds[metric]
        )
        per_lp = {}
        for lp in lps:
            mask = (rows["lp"] == lp).to_numpy()
            per_lp[lp] = lexical.correlations({k: v[mask] for k, v in variants.items()}, human[mask])
        per_lp["avg"] = {v: _mean([per_lp[lp][v] for lp in lps]) for v in VARIANTS}
        pearson[metric] = per_lp
    started = time.perf_counter()
    eten_r = eten_correlations(eten, metrics)
    seconds["eten"] = time.perf_counter() - started
    return {
        "settings": {
            "metrics": list(metrics),
            "max_sources_per_lp": max_sources_per_lp,
            "max_pseudo_refs": max_pseudo_refs,
            "seed": seed,
            "human_score": "DA z-score (score)",
            "pseudo_references": "other non-human systems' outputs for the same (lp, seg_id) in the "
            "WMT21 DA table (all splits); human systems neither evaluated nor used",
            "reference": "first reference (ref)",
            "sacrebleu": _sacrebleu_version(),
        },
        "sizes": {
            "lps": sizes,
            "rows": int(len(rows)),
            "sources": int(sum(s["sources"] for s in sizes.values())),
            "pairs": int(counts.sum()),
            "eten_rows": int(len(eten)),
        },
        "pearson": pearson,
        "eten": eten_r,
        "paper": {"eten": PAPER_ETEN, "encs": PAPER_ENCS},
        "seconds": seconds,
    }


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def _sacrebleu_version() -> str:
    import sacrebleu

    return sacrebleu.__version__


def write_findings(settings: MultihypSettings, pipeline: PipelineConfig) -> dict[str, Path]:
    """The stage ``exp_multihyp``: score the prepared WMT21 DA and Estonian-English rows, write
    ``multihyp.json`` and ``multihyp.png``; returns their paths."""
    da, eten = read_inputs(pipeline.prepared_dir)
    result = analyse(
        da,
        eten,
        metrics=settings.metrics,
        max_sources_per_lp=settings.max_sources_per_lp,
        max_pseudo_refs=settings.max_pseudo_refs,
        seed=settings.seed,
    )
    return {
        "result": write_result(NAME, result, settings.metrics_dir),
        "figure": save_figure(figure(result), Path(settings.figures_dir) / FIGURE),
    }


# ----------------------------------------------------------------------------------------------
# Figure and report


def _better(metric: str, r: float | None) -> float | None:
    """Correlation oriented so that larger = agrees better with DA (TER is an error rate)."""
    if r is None or not math.isfinite(r):
        return None
    return r if lexical.HIGHER_IS_BETTER[metric] else -r


def figure(result: dict[str, Any]):
    """Per-LP bars of Pearson r for each variant, one panel per metric."""
    from uamt.experiments.common import pyplot

    plt = pyplot()
    metrics = list(result["pearson"])
    fig, axes = plt.subplots(len(metrics), 1, figsize=(11, 3.2 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        block = result["pearson"][metric]
        lps = [lp for lp in block if lp != "avg"] + ["avg"]
        width = 0.8 / len(VARIANTS)
        for k, variant in enumerate(VARIANTS):
            values = [block[lp][variant] if block[lp][variant] is not None else np.nan for lp in lps]
            ax.bar(np.arange(len(lps)) + (k - (len(VARIANTS) - 1) / 2) * width, values, width, label=variant)
        ax.set_xticks(np.arange(len(lps)), lps)
        ax.axhline(0, color="black", linewidth=0.6)
        note = " (error rate: r < 0 = agreement)" if not lexical.HIGHER_IS_BETTER[metric] else ""
        ax.set_title(f"{METRIC_LABELS.get(metric, metric)}: Pearson r with WMT21 DA z{note}")
        ax.set_ylabel("Pearson r")
    axes[0, 0].legend(ncol=4, fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.12))
    return fig


def pseudo_ref_gains(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per metric: how the pseudo-reference variants compare with mt-ref (larger r = better, TER flipped).

    ``wins, n, delta`` (pseudo-mt-avg-ref beats mt-ref in ``wins`` of ``n`` LPs, mean gain ``delta``),
    the same for the reference-free ``pseudo-mt-avg`` (``free_*``), the ``best`` variant on the LP
    average, and the paper's gain of pseudo-mt-avg-ref over the reference in Et-En and En-Cs.
    """
    out = []
    for metric, block in result["pearson"].items():
        lps = [lp for lp in block if lp != "avg"]
        ours = {}
        for variant in ("pseudo-mt-avg-ref", "pseudo-mt-avg", "pseudo-mt-max-ref"):
            deltas = [
                _better(metric, block[lp][variant]) - _better(metric, block[lp]["mt-ref"])
                for lp in lps
                if _better(metric, block[lp][variant]) is not None
                and _better(metric, block[lp]["mt-ref"]) is not None
            ]
            wins = sum(d > 0 for d in deltas)
            ours[variant] = (wins, len(deltas), float(np.mean(deltas)) if deltas else float("nan"))
        best = max(
            VARIANTS,
            key=lambda v: (
                _better(metric, block["avg"][v]) if _better(metric, block["avg"][v]) is not None else -9
            ),
        )
        paper_eten = _better(metric, PAPER_ETEN[metric]["pseudo-mt-avg-ref"]) - _better(
            metric, PAPER_ETEN[metric]["mt-ref-1"]
        )
        paper_encs = _better(metric, PAPER_ENCS[metric]["pseudo-mt-avg-ref"]) - _better(
            metric, PAPER_ENCS[metric]["mt-ref"]
        )
        (wins, n, delta), (free_wins, free_n, free_delta) = ours["pseudo-mt-avg-ref"], ours["pseudo-mt-avg"]
        out.append(
            {
                "label": METRIC_LABELS.get(metric, metric),
                **{"wins": wins, "n": n, "delta": delta},
                **{"free_wins": free_wins, "free_n": free_n, "free_delta": free_delta},
                **{"best": best, "best_r": block["avg"][best]},
                **{"paper_eten": paper_eten, "paper_encs": paper_encs},
            }
        )
    return out


def noise_level(result: dict[str, Any]) -> dict[str, Any]:
    """How large the per-LP correlations are compared with their sampling error 1/sqrt(n).

    ``mt_ref`` (range of mt-ref's r over LPs and metrics, TER flipped), ``paper`` (the papers' BLEU/chrF
    mt-ref r), ``largest`` |r| of any variant, ``se`` (range of 1/sqrt(rows) per LP) and
    ``within_noise`` (largest |r| < 3 x the largest se).
    """
    sizes = result["sizes"]["lps"]
    largest, mt_ref = 0.0, []
    for metric, block in result["pearson"].items():
        for lp, per_variant in block.items():
            if lp == "avg":
                continue
            values = [abs(v) for v in per_variant.values() if v is not None and math.isfinite(v)]
            largest = max([largest, *values])
            if _better(metric, per_variant.get("mt-ref")) is not None:
                mt_ref.append(_better(metric, per_variant["mt-ref"]))
    errors = [1.0 / math.sqrt(s["rows"]) for s in sizes.values()]
    paper = [PAPER_ETEN[m]["mt-ref-1"] for m in ("bleu", "chrf")] + [
        PAPER_ENCS[m]["mt-ref"] for m in ("bleu", "chrf")
    ]
    return {
        "mt_ref": (min(mt_ref), max(mt_ref)),
        "paper": (min(paper), max(paper)),
        "largest": largest,
        "se": (min(errors), max(errors)),
        "within_noise": largest < 3 * max(errors),
    }


def eten_gaps(result: dict[str, Any], tolerance: float = 0.01) -> list[dict[str, Any]]:
    """How far the Et-En reference rows are from the paper's Table 4: per metric the largest
    |difference| in r and whether it is within ``tolerance`` (``reproduced``)."""
    out = []
    for metric, block in result["eten"].items():
        diffs = [abs(block[v] - PAPER_ETEN[metric][v]) for v in ETEN_VARIANTS if block.get(v) is not None]
        if diffs:
            worst = max(diffs)
            out.append({"label": METRIC_LABELS.get(metric, metric), "worst": worst, "reproduced": worst <= tolerance})
    return out


def render(result: dict[str, Any]) -> str:
    """The markdown section of reports/experiments.md (``templates/multihyp.md.j2``)."""
    return rendering.render(
        NAME,
        result,
        metric_labels=METRIC_LABELS,
        variants=VARIANTS,
        eten_variants=ETEN_VARIANTS,
        paper_eten=PAPER_ETEN,
        se={lp: 1.0 / math.sqrt(s["rows"]) for lp, s in result["sizes"]["lps"].items()},
        gains=pseudo_ref_gains(result),
        noise=noise_level(result),
        eten_gaps=eten_gaps(result),
    )


PSEUDO_REF_VARIANTS = ("pseudo-mt-avg-ref", "pseudo-mt-min-ref", "pseudo-mt-max-ref")


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(finding, what the paper reports, what we measured -- starting with held / partly / not held / n/a).

    Correlations are oriented so that larger = agrees better with DA (TER's r sign-flipped,
    :func:`_better`); "beats" is strictly greater.

    * Per metric, pseudo-references add to the reference: cells are LP x ``pseudo-mt-{avg,min,max}-ref``
      (:data:`PSEUDO_REF_VARIANTS`), each compared with ``mt-ref`` of the same LP; **held** when the
      variant beats mt-ref in >= 3/4 of the cells, **partly** in more than half, else **not held**
      (**n/a** without cells).  The paper's cells (Tables 4-5, Et-En and En-Cs) are counted the same way.
    * Et-En 1K: ``mt-ref-multi`` beats both ``mt-ref-1`` and ``mt-ref-2``; **held** for all metrics,
      **not held** for none, else **partly**.
    """
    rows = []
    for metric, block in result["pearson"].items():
        label = METRIC_LABELS.get(metric, metric)
        lps = [lp for lp in block if lp != "avg"]
        wins, cells, per_variant = 0, 0, []
        for variant in PSEUDO_REF_VARIANTS:
            deltas = [
                _better(metric, block[lp][variant]) - _better(metric, block[lp]["mt-ref"])
                for lp in lps
                if _better(metric, block[lp].get(variant)) is not None
                and _better(metric, block[lp].get("mt-ref")) is not None
            ]
            won = sum(d > 0 for d in deltas)
            wins, cells = wins + won, cells + len(deltas)
            mean = f"{np.mean(deltas):+.3f}" if deltas else "–"
            per_variant.append(f"{variant.removeprefix('pseudo-mt-')} {won}/{len(deltas)} (mean {mean})")
        paper_deltas = [
            _better(metric, table[variant]) - _better(metric, table[base])
            for table, base in ((PAPER_ETEN[metric], "mt-ref-1"), (PAPER_ENCS[metric], "mt-ref"))
            for variant in PSEUDO_REF_VARIANTS
        ]
        errors = [1.0 / math.sqrt(result["sizes"]["lps"][lp]["rows"]) for lp in lps]
        rows.append(
            (
                f"{label}: adding pseudo-references to the reference (pseudo-mt-*-ref) correlates better "
                "with human scores than the reference alone (mt-ref)",
                f"pseudo-mt-*-ref beats mt-ref in {sum(d > 0 for d in paper_deltas)}/{len(paper_deltas)} cells "
                f"(Tables 4-5, Et-En 1K and En-Cs, online MT systems as pseudo-references; mean gain in r "
                f"{np.mean(paper_deltas):+.3f})",
                f"{share_verdict(wins, cells)}: on WMT21 DA ({len(lps)} to-English LPs, other systems as "
                f"pseudo-references) pseudo-mt-*-ref beats mt-ref in {wins}/{cells} LP cells: "
                + ", ".join(per_variant)
                + f"; LP-average r mt-ref {fmt(_better(metric, block['avg']['mt-ref']))}, avg-ref "
                f"{fmt(_better(metric, block['avg']['pseudo-mt-avg-ref']))} (se(r) per LP ~ "
                f"{min(errors):.3f}-{max(errors):.3f}"
                f"{'; r sign-flipped, larger = better' if not lexical.HIGHER_IS_BETTER[metric] else ''})",
            )
        )
    eten = result["eten"]
    checks, ours, paper = [], [], []
    for metric, block in eten.items():
        label = METRIC_LABELS.get(metric, metric)
        values = {v: _better(metric, block.get(v)) for v in ETEN_VARIANTS}
        if all(x is not None for x in values.values()):
            checks.append(values["mt-ref-multi"] > max(values["mt-ref-1"], values["mt-ref-2"]))
        ours.append(
            f"{label} {fmt(block.get('mt-ref-multi'))} vs {fmt(block.get('mt-ref-1'))} / {fmt(block.get('mt-ref-2'))}"
        )
        published = PAPER_ETEN.get(metric, {})
        paper.append(
            f"{label} {published.get('mt-ref-multi')} vs {published.get('mt-ref-1')} / {published.get('mt-ref-2')}"
        )
    verdict = "n/a" if not checks else "held" if all(checks) else "not held" if not any(checks) else "partly"
    rows.append(
        (
            "Et-En 1K: scoring against both references (mt-ref-multi) correlates better than against either one",
            "Table 4, Pearson r multi vs ref-1 / ref-2: " + "; ".join(paper),
            f"{verdict}: multi beats both single references for {sum(checks)}/{len(checks)} metrics "
            f"({result['sizes']['eten_rows']} segments): " + "; ".join(ours),
        )
    )
    return rows
