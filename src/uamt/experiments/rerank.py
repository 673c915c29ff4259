"""Choosing among candidate translations with the served distribution, on real human judgements.

The WMT21 and WMT23 expert-MQM **test** sources were translated by 11-15 systems each and every
translation was rated.  Each source is a group; each rule of :mod:`uamt.decisions.rerank` picks one
translation per group, and the pick is judged by its human MQM.  Per LP: the mean human MQM of the
picks, the share of picks with MQM <= ``chi`` (bad picks), the regret to the oracle pick (the best
human MQM of the group).  Rivals: a random pick (its exact expectation: the group mean), the
highest sentence chrF to the human reference (sacrebleu), the served mu alone, and the
reference-free (QE) model's served mu.  Human translations (``ref-A``...) are not candidates.

Selective prediction: groups are kept in decreasing confidence of the rule in its pick (the rule's
own score of the pick: mu, lower bound, minus risk, MBR utility; chrF for chrF), and the curve is
the share kept vs the bad-pick rate among the kept groups; its area (the mean bad-pick rate over
the kept shares 1/G..1; lower is better) summarises it.  ``by risk`` keeps every rule's picks in
increasing served risk of the pick instead (the ``abstain`` mechanism).

The served distribution is the pipeline's ``calibration/<model>.json`` applied to
``predictions/test/<model>.parquet`` (raw mu, sigma), clipped to the scale's bounds; the MBR rules
score each candidate with up to ``max_pseudo_refs`` other candidates of its group as references
(the reference-based model, per-reference predictions averaged) and serve that with the same
calibration (not recalibrated for pseudo-references: within a group only the order matters).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.decisions.rerank import RerankSettings, pseudo_reference_lists, rerank
from uamt.experiments import rendering
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, is_human_system, save_figure, write_result
from uamt.experiments.rendering import section_number
from uamt.uncertainty.served import served_columns

NAME = "rerank"
FIGURE = "rerank_selective.png"
KEYS = ("dataset", "lp", "seg_id", "system")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RerankExperimentSettings:
    """params.yaml ``exp_rerank:`` section.

    Attributes
    ----------
    datasets : list of str
        MQM test sets whose sources were translated by many systems.
    method : str
        Reference-based model whose served distribution the rules read (and MBR scores with).
    qe_method : str or None
        Reference-free model (rival: its served mu).
    confidence : float
        Level of the central interval whose lower end is the ``lcb`` rule's bound.
    chi : float
        Bad = human MQM <= chi; the risk is P(Q <= chi).
    max_risk : float
        Abstain when the pick's risk exceeds it (reported: share abstained, bad rate of the rest).
    max_pseudo_refs : int or None
        Pseudo-references per candidate for MBR (seeded sample of the group's others; None = all).
    n_bootstrap : int
        Resamples of the groups for the interval of the lcb - mu difference.
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    datasets: tuple[str, ...] = ("wmt21_mqm", "wmt23_mqm")
    method: str = "hts"
    qe_method: str | None = "hts_qe"
    confidence: float = 0.9
    chi: float = -5.0
    max_risk: float = 0.5
    max_pseudo_refs: int | None = 6
    seed: int = 0
    n_bootstrap: int = 1000
    calibration_dir: str = "calibration"
    predictions_dir: str = "predictions"


# ----------------------------------------------------------------------------------------------
# Candidates


def candidate_rows(frame: pd.DataFrame, datasets) -> pd.DataFrame:
    """MT rows of ``datasets`` (human translations dropped) with a finite score, in groups of at
    least two candidates; adds ``group`` = ``dataset/lp/seg_id`` and ``subset`` = ``dataset lp``."""
    for column in (*KEYS, "src", "mt", "ref", "score"):
        if column not in frame.columns:
            raise DataError(f"rerank rows: column {column!r} missing")
    rows = frame[frame["dataset"].isin(list(datasets))]
    rows = rows[~rows["system"].astype(str).map(is_human_system)]
    rows = rows[np.isfinite(pd.to_numeric(rows["score"], errors="coerce"))]
    rows = rows.drop_duplicates(list(KEYS)).sort_values(list(KEYS), kind="stable").reset_index(drop=True)
    group = rows["dataset"].astype(str) + "/" + rows["lp"].astype(str) + "/" + rows["seg_id"].astype(str)
    rows = rows.assign(group=group, subset=rows["dataset"].str.replace("_mqm", "") + " " + rows["lp"])
    size = rows.groupby("group")["group"].transform("size")
    rows = rows[size >= 2].reset_index(drop=True)
    if rows.empty:
        raise DataError(f"no source of {list(datasets)} has two or more rated MT outputs")
    return rows


def join_predictions(rows: pd.DataFrame, predictions: pd.DataFrame, name: str) -> pd.DataFrame:
    """``mu, sigma`` of ``predictions`` (a predictions table) for each of ``rows`` (by the row keys);
    a candidate without a prediction is an error naming it."""
    pred = predictions.drop_duplicates(list(KEYS))[[*KEYS, "mu", "sigma"]]
    pred = pred.assign(seg_id=pred["seg_id"].astype(str), system=pred["system"].astype(str))
    left = rows[list(KEYS)].assign(seg_id=rows["seg_id"].astype(str), system=rows["system"].astype(str))
    joined = left.merge(pred, on=list(KEYS), how="left", validate="one_to_one")
    missing = joined["mu"].isna()
    if missing.any():
        first = joined[missing].iloc[0]
        raise DataError(f"{name}: no prediction for {dict(first[list(KEYS)])} ({int(missing.sum())} rows)")
    return joined[["mu", "sigma"]]


def chrf_scores(mt, ref) -> np.ndarray:
    """Sentence chrF (sacrebleu defaults) of each translation against its human reference."""
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    return np.array([metric.sentence_score(str(h), [str(r)]).score for h, r in zip(mt, ref, strict=True)])


# ----------------------------------------------------------------------------------------------
# Evaluation


def selective_curve(confidence: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Keep groups in decreasing ``confidence`` (ties: row order): ``(share kept, bad rate among
    kept, area)``; the area is the mean bad rate over the kept shares 1/G, ..., 1."""
    order = np.argsort(-np.asarray(confidence, dtype=float), kind="stable")
    kept_bad = np.cumsum(np.asarray(bad, dtype=float)[order])
    n = np.arange(1, len(order) + 1)
    rate = kept_bad / n
    return n / len(order), rate, float(rate.mean())


def group_oracle(rows: pd.DataFrame) -> pd.DataFrame:
    """Per group: the best human score (oracle), the mean score and the bad share (a random pick)."""
    grouped = rows.groupby("group", sort=False)
    return pd.DataFrame(
        {"oracle": grouped["score"].max(), "mean": grouped["score"].mean(), "bad_rate": grouped["bad"].mean()}
    )


def judge(picks: pd.DataFrame, rows: pd.DataFrame, oracle: pd.DataFrame, chi: float) -> dict[str, Any]:
    """Mean MQM, bad share and regret of ``picks`` (one row per group: ``group``, ``row``,
    ``confidence``, ``risk``), with the selective-prediction areas (own confidence, by risk)."""
    human = rows["score"].to_numpy(dtype=float)[picks["row"].to_numpy()]
    bad = human <= chi
    best = oracle.loc[picks["group"], "oracle"].to_numpy()
    _, _, area = selective_curve(picks["confidence"].to_numpy(), bad)
    out = {
        "n_groups": int(len(picks)),
        "mean_mqm": float(human.mean()),
        "bad_share": float(bad.mean()),
        "regret": float(np.mean(best - human)),
        "oracle_share": float(np.mean(human >= best)),
        "area": area,
    }
    if "risk" in picks.columns:
        out["area_by_risk"] = selective_curve(-picks["risk"].to_numpy(), bad)[2]
    return out


def paired_interval(a: np.ndarray, b: np.ndarray, n_bootstrap: int, seed: int) -> list[float]:
    """95 % bootstrap interval (over groups) of mean(a - b)."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(n_bootstrap, diff.size))].mean(axis=1)
    return [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]


def analyse(
    rows: pd.DataFrame,
    served: dict[str, pd.DataFrame],
    *,
    chrf: np.ndarray | None,
    chi: float = -5.0,
    max_risk: float = 0.5,
    n_bootstrap: int = 1000,
    seed: int = 0,
    curve_points: int = 50,
) -> dict[str, Any]:
    """Every rule's picks judged per subset (dataset LP) and pooled.

    Parameters
    ----------
    rows : DataFrame
        :func:`candidate_rows` (``group``, ``subset``, ``score``, ...).
    served : dict
        model name -> DataFrame aligned with ``rows``: ``mu, lower, upper, risk`` (and ``mbr_mu``,
        ``mbr_lower`` where the model has pseudo-reference predictions): the served distribution.
    chrf : array or None
        Sentence chrF of each row against the reference.
    """
    rows = rows.reset_index(drop=True).assign(bad=lambda r: r["score"].astype(float) <= chi)
    pickers: dict[str, pd.DataFrame] = {}
    for model, table in served.items():
        for rule in ("mu", "lcb", "risk", "mbr", "mbr_lcb"):
            if rule.startswith("mbr") and "mbr_mu" not in table.columns:
                continue
            picks = rerank(
                table.assign(group=rows["group"].to_numpy()), RerankSettings(rule=rule, max_risk=max_risk)
            )
            pickers[f"{rule}:{model}"] = picks.assign(confidence=picks["score"] * (-1 if rule == "risk" else 1))
    if chrf is not None:
        picks = rerank(
            pd.DataFrame({"group": rows["group"], "mu": chrf, "lower": chrf, "upper": chrf, "risk": 0.0}),
            RerankSettings(rule="mu", max_risk=None),
        )
        pickers["chrf"] = picks[["group", "row", "mu"]].rename(columns={"mu": "confidence"})
    results: dict[str, Any] = {}
    curves: dict[str, Any] = {}
    subsets = ["all", *sorted(rows["subset"].unique())]
    for subset in subsets:
        mask = np.ones(len(rows), bool) if subset == "all" else (rows["subset"] == subset).to_numpy()
        sub_groups = set(rows.loc[mask, "group"])
        oracle = group_oracle(rows[mask])
        block: dict[str, Any] = {
            "random": {
                "n_groups": int(len(oracle)),
                "mean_mqm": float(oracle["mean"].mean()),
                "bad_share": float(oracle["bad_rate"].mean()),
                "regret": float((oracle["oracle"] - oracle["mean"]).mean()),
                "area": float(oracle["bad_rate"].mean()),
            },
            "oracle": {
                "n_groups": int(len(oracle)),
                "mean_mqm": float(oracle["oracle"].mean()),
                "bad_share": float((oracle["oracle"] <= chi).mean()),
                "regret": 0.0,
            },
        }
        curves[subset] = {}
        for name, picks in pickers.items():
            chosen = picks[picks["group"].isin(sub_groups)].reset_index(drop=True)
            block[name] = judge(chosen, rows, oracle, chi)
            if "abstain" in chosen.columns:
                kept = ~chosen["abstain"].to_numpy(dtype=bool)
                human = rows["score"].to_numpy(dtype=float)[chosen["row"].to_numpy()]
                block[name]["abstain_share"] = float(1 - kept.mean())
                block[name]["bad_share_kept"] = float(np.mean(human[kept] <= chi)) if kept.any() else None
            share, rate, _ = selective_curve(
                chosen["confidence"].to_numpy(), rows["score"].to_numpy()[chosen["row"].to_numpy()] <= chi
            )
            at = np.unique(np.linspace(0, share.size - 1, min(curve_points, share.size)).round().astype(int))
            curves[subset][name] = {"kept": share[at].tolist(), "bad_rate": rate[at].tolist()}
        results[subset] = block
    comparisons = {}
    for model in served:
        lcb, mu = pickers.get(f"lcb:{model}"), pickers.get(f"mu:{model}")
        if lcb is None or mu is None:
            continue
        comparisons[model] = {}
        for subset in subsets:
            mask = np.ones(len(rows), bool) if subset == "all" else (rows["subset"] == subset).to_numpy()
            groups = set(rows.loc[mask, "group"])
            a = lcb[lcb["group"].isin(groups)]["row"].to_numpy()
            b = mu[mu["group"].isin(groups)]["row"].to_numpy()
            human = rows["score"].to_numpy(dtype=float)
            comparisons[model][subset] = {
                "mqm_difference": float(np.mean(human[a] - human[b])),
                "mqm_difference_95": paired_interval(human[a], human[b], n_bootstrap, seed),
                "bad_difference": float(np.mean((human[a] <= chi).astype(float) - (human[b] <= chi))),
                "same_pick": float(np.mean(a == b)),
                "area_difference": results[subset][f"lcb:{model}"]["area"] - results[subset][f"mu:{model}"]["area"],
            }
    return {
        "settings": {"chi": chi, "max_risk": max_risk, "n_bootstrap": n_bootstrap, "seed": seed},
        "sizes": {
            subset: {
                "groups": int(rows.loc[rows["subset"] == subset, "group"].nunique()),
                "candidates": int((rows["subset"] == subset).sum()),
            }
            for subset in subsets[1:]
        },
        "rules": list(pickers),
        "results": results,
        "lcb_vs_mu": comparisons,
        "curves": curves,
    }


# ----------------------------------------------------------------------------------------------
# The stage


def served_for(
    rows: pd.DataFrame, model: str, settings: RerankExperimentSettings, bounds
) -> pd.DataFrame:
    """The served columns of ``model``'s test predictions for ``rows``."""
    from uamt.serving.model_calibration import Calibration, with_model_sigma

    calibration = Calibration.load(Path(settings.calibration_dir) / f"{model}.json")
    predictions = pd.read_parquet(Path(settings.predictions_dir) / "test" / f"{model}.parquet")
    raw = with_model_sigma(join_predictions(rows, predictions, f"predictions/test/{model}.parquet"), model)
    return _served(calibration, raw, rows, settings, bounds)


def _served(calibration, raw: pd.DataFrame, rows: pd.DataFrame, settings: RerankExperimentSettings, bounds) -> pd.DataFrame:
    """The served columns of the model's raw mu and sigma for ``rows`` (their language pairs)."""
    return served_columns(
        calibration,
        raw["mu"].to_numpy(),
        raw["sigma"].to_numpy(),
        rows["lp"].astype(str).to_numpy(dtype=object),
        confidence=settings.confidence,
        chi=settings.chi,
        bounds=bounds,
    )


def mbr_columns(rows: pd.DataFrame, model_dir: Path, features, settings: RerankExperimentSettings, bounds) -> pd.DataFrame:
    """``mbr_mu``, ``mbr_lower`` (and ``mbr_risk``) of each candidate scored against the other
    candidates of its group with the reference-based model, served by its calibration."""
    from uamt.experiments.critical import predict_over_references
    from uamt.models.api import load
    from uamt.serving.model_calibration import Calibration

    references = pseudo_reference_lists(
        rows["group"], rows["mt"].astype(str), max_refs=settings.max_pseudo_refs, seed=settings.seed
    )
    raw = predict_over_references(load(model_dir), rows, references, features)
    calibration = Calibration.load(Path(settings.calibration_dir) / f"{settings.method}.json")
    served = _served(calibration, raw, rows, settings, bounds)
    return pd.DataFrame({"mbr_mu": served["mu"], "mbr_lower": served["lower"], "mbr_risk": served["risk"]})


def write_findings(settings: RerankExperimentSettings, pipeline, encode) -> dict[str, Path]:
    """The stage ``exp_rerank``: write ``rerank.json`` and the selective-prediction figure."""
    from uamt.data.datasets import scale_bounds
    from uamt.experiments.common import open_experiment_features
    from uamt.pipeline_config import read_split

    started = time.perf_counter()
    rows = candidate_rows(read_split(pipeline.prepared_dir, "test", tuple(settings.datasets)), settings.datasets)
    bounds = scale_bounds(pipeline.datasets)
    served = {settings.method: served_for(rows, settings.method, settings, bounds)}
    seconds = {}
    tick = time.perf_counter()
    mbr = mbr_columns(rows, pipeline.model_dir(settings.method), open_experiment_features(encode), settings, bounds)
    seconds["mbr_scoring"] = time.perf_counter() - tick
    served[settings.method] = pd.concat([served[settings.method], mbr], axis=1)
    if settings.qe_method:
        served[settings.qe_method] = served_for(rows, settings.qe_method, settings, bounds)
    tick = time.perf_counter()
    chrf = chrf_scores(rows["mt"], rows["ref"])
    seconds["chrf"] = time.perf_counter() - tick
    result = analyse(
        rows, served, chrf=chrf, chi=settings.chi, max_risk=settings.max_risk,
        n_bootstrap=settings.n_bootstrap, seed=settings.seed,
    )
    result["settings"].update(
        datasets=list(settings.datasets), method=settings.method, qe_method=settings.qe_method,
        confidence=settings.confidence, max_pseudo_refs=settings.max_pseudo_refs,
        mbr_pairs=int(sum(min(n - 1, settings.max_pseudo_refs or n) * n for n in rows.groupby("group").size())),
    )
    seconds["total"] = time.perf_counter() - started
    result["seconds"] = seconds
    out = {"result": write_result(NAME, result, settings.metrics_dir)}
    out["figure"] = save_figure(figure(result), Path(settings.figures_dir) / FIGURE)
    return out


# ----------------------------------------------------------------------------------------------
# Figure and report


def figure(result: dict[str, Any]):
    """Selective prediction per subset: share of groups kept vs bad-pick rate among them."""
    from uamt.experiments.common import pyplot

    plt = pyplot()
    subsets = list(result["curves"])
    cols = 4
    rows = (len(subsets) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    for ax, subset in zip(axes.flat, subsets, strict=False):
        for name, curve in result["curves"][subset].items():
            style = "--" if "_qe" in name else ":" if name == "chrf" else "-"
            ax.plot(curve["kept"], curve["bad_rate"], style, linewidth=1.1, label=name)
        ax.axhline(result["results"][subset]["random"]["bad_share"], color="0.6", linewidth=0.8, label="random")
        ax.set_title(subset, fontsize=9)
        ax.set_xlabel("share of sources kept", fontsize=8)
        ax.set_ylabel("bad-pick rate among kept", fontsize=8)
    for ax in list(axes.flat)[len(subsets):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=5, loc="best")
    fig.tight_layout()
    return fig


def table_rows(result: dict[str, Any], subset: str) -> list[list[Any]]:
    """One table row per rule (random and oracle first) of ``subset``."""
    block = result["results"][subset]
    names = ["random", "oracle", "chrf", *[n for n in result["rules"] if n != "chrf"]]
    return [
        [
            name,
            block[name]["mean_mqm"],
            block[name]["bad_share"],
            block[name]["regret"],
            block[name].get("area"),
            block[name].get("area_by_risk"),
        ]
        for name in names
        if name in block
    ]


def lcb_verdict(result: dict[str, Any], model: str) -> tuple[list[str], list[str]]:
    """Subsets where the lcb pick's mean MQM is above / not above the mu pick's (the 95 % interval
    of the difference excluding 0 is marked with *)."""
    wins, losses = [], []
    for subset, c in result["lcb_vs_mu"].get(model, {}).items():
        if subset == "all":
            continue
        lo, hi = c["mqm_difference_95"]
        label = f"{subset} ({c['mqm_difference']:+.3f}{'*' if lo > 0 or hi < 0 else ''})"
        (wins if c["mqm_difference"] > 0 else losses).append(label)
    return wins, losses


def rankings(result: dict[str, Any]) -> dict[str, Any]:
    """What the text says: the pooled ranking of the rules by mean MQM (with random and chrF), the
    rule with the lowest pooled selective-prediction area, and per rule the subsets where its picks
    are worse than a random pick."""
    pooled = result["results"]["all"]
    names = [n for n in pooled if n != "oracle"]
    by_mqm = sorted(names, key=lambda n: -pooled[n]["mean_mqm"])
    areas = {n: pooled[n]["area"] for n in names if n != "random" and pooled[n].get("area") is not None}
    worse = {
        name: [s for s, block in result["results"].items() if s != "all" and block[name]["mean_mqm"] < block["random"]["mean_mqm"]]
        for name in names
        if name != "random"
    }
    return {"by_mqm": by_mqm, "best_area": min(areas, key=areas.get), "worse_than_random": {k: v for k, v in worse.items() if v}}


def render(result: dict[str, Any]) -> str:
    """The markdown section of reports/experiments.md (``templates/rerank.md.j2``)."""
    model = result["settings"]["method"]
    return rendering.render(
        NAME,
        result,
        subsets=list(result["results"]),
        table_rows=table_rows,
        lcb_wins=lcb_verdict(result, model),
        ranks=rankings(result),
        figure=FIGURE,
        section=section_number(NAME),
    )


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Whether choosing by the lower bound beats choosing by mu (mean human MQM of the picks)."""
    model = result["settings"]["method"]
    wins, losses = lcb_verdict(result, model)
    cells = len(wins) + len(losses)
    pooled = result["lcb_vs_mu"][model]["all"]
    # Held only when the lower bound wins in >= 3/4 of the LPs *and* the pooled gain is significant.
    significant = pooled["mqm_difference_95"][0] > 0
    verdict = (
        "n/a" if not cells
        else "held" if len(wins) * 4 >= 3 * cells and significant
        else "partly" if wins
        else "not held"
    )
    return [
        (
            "Choosing the candidate with the highest served lower bound gives better translations than the highest mu",
            "(no paper number; the decision this tool exists for)",
            f"{verdict}: lcb above mu in {len(wins)}/{cells} LPs; pooled mean MQM difference "
            f"{pooled['mqm_difference']:+.3f} (95 % [{pooled['mqm_difference_95'][0]:+.3f}, "
            f"{pooled['mqm_difference_95'][1]:+.3f}]), same pick in {100 * pooled['same_pick']:.0f} % of sources",
        )
    ]
