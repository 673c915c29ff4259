"""Flagging translations for post-editing from the served risk, with a miss-rate guarantee.

"Flag every translation with MQM <= chi": a translation is flagged when its served risk
P(Q <= chi) exceeds a threshold.  Per model and subset (dataset LP) of the MQM **test** split:
precision and recall of the flags and the share sent to humans at the risk thresholds
``thresholds`` (0.1-0.5).  Then conformal risk control (:mod:`uamt.decisions.flagging`): the
threshold is chosen on dev so that the share of bad translations left unflagged is <= ``alpha``
with a finite-sample guarantee, once pooled over LPs and once per LP, and the realised miss rate
on test is shown beside it.  The dev risks are the pipeline's *cross-fitted* served risks (each dev
document answered by the calibration fitted on the other folds), so the scores are not fitted on
the rows that choose the threshold; test is answered by the served calibration itself.

The same control run on minus the served mu (no uncertainty) shows what the risk adds: at the same
guaranteed miss rate, the score that flags fewer translations is the better one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.decisions.flagging import crc_bound, crc_threshold, flag_quality
from uamt.experiments import rendering
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, save_figure, write_result
from uamt.experiments.rendering import section_number
from uamt.uncertainty.served import served_columns

NAME = "flagging"
FIGURE = "flagging_tradeoff.png"
SCORES = ("risk", "neg_mu")


@dataclass(frozen=True)
class FlaggingSettings:
    """params.yaml ``exp_flagging:`` section (models, chi, thresholds, alpha)."""

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    methods: tuple[str, ...] = ("hts", "hts_qe")
    chi: float = -5.0
    thresholds: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5)
    alpha: float = 0.1
    calibration_dir: str = "calibration"
    predictions_dir: str = "predictions"


def subsets_of(table: pd.DataFrame) -> np.ndarray:
    """``"<dataset without _mqm> <lp>"`` of every row (e.g. ``wmt21 en-de``)."""
    return (table["dataset"].astype(str).str.replace("_mqm", "") + " " + table["lp"].astype(str)).to_numpy()


def analyse(
    dev: dict[str, pd.DataFrame], test: dict[str, pd.DataFrame], *, chi: float, thresholds, alpha: float
) -> dict[str, Any]:
    """Flag quality per model and subset.

    ``dev[model]`` / ``test[model]``: ``subset, human, risk, mu`` per row (the served risk at
    ``chi`` and the served mu; dev cross-fitted).
    """
    out: dict[str, Any] = {}
    for model in test:
        d, t = dev[model], test[model]
        scores = {
            "dev": {"risk": d["risk"].to_numpy(float), "neg_mu": -d["mu"].to_numpy(float)},
            "test": {"risk": t["risk"].to_numpy(float), "neg_mu": -t["mu"].to_numpy(float)},
        }
        dev_bad = d["human"].to_numpy(float) <= chi
        human = t["human"].to_numpy(float)
        subsets = ["all", *sorted(set(t["subset"]))]
        block: dict[str, Any] = {"fixed": {}, "crc": {}}
        for subset in subsets:
            mask = np.ones(len(t), bool) if subset == "all" else (t["subset"] == subset).to_numpy()
            block["fixed"][subset] = {
                f"{th:g}": flag_quality(scores["test"]["risk"][mask], human[mask], th, chi) for th in thresholds
            }
        # The same recall on test for both scores (a descriptive, test-chosen threshold): the share
        # each must flag to catch ``1 - alpha`` of the bad translations; fewer is a better score.
        block["at_recall"] = {}
        for subset in subsets:
            mask = np.ones(len(t), bool) if subset == "all" else (t["subset"] == subset).to_numpy()
            bad = human[mask] <= chi
            if not bad.any():
                continue
            block["at_recall"][subset] = {
                score: float(np.mean(scores["test"][score][mask] >= np.quantile(scores["test"][score][mask][bad], alpha, method="lower")))
                for score in SCORES
            }
        for score in SCORES:
            # No bad dev row: nothing to control with (a tiny dev set); the threshold is reported as none.
            pooled = crc_threshold(scores["dev"][score][dev_bad], alpha) if dev_bad.any() else None
            entry: dict[str, Any] = {
                "pooled_threshold": pooled,
                "pooled_dev_bound": crc_bound(scores["dev"][score][dev_bad], pooled) if pooled is not None else None,
                "dev_bad": int(dev_bad.sum()),
                "subsets": {},
            }
            for subset in subsets:
                mask = np.ones(len(t), bool) if subset == "all" else (t["subset"] == subset).to_numpy()
                row = {
                    "pooled": flag_quality(scores["test"][score][mask], human[mask], pooled, chi)
                    if pooled is not None
                    else {"miss_rate": None, "flagged_share": None, "precision": None, "recall": None}
                }
                if subset != "all":
                    dmask = (d["subset"] == subset).to_numpy() & dev_bad
                    if dmask.sum():
                        own = crc_threshold(scores["dev"][score][dmask], alpha)
                        row["per_lp"] = flag_quality(scores["test"][score][mask], human[mask], own, chi)
                        row["per_lp"].update(threshold=own, dev_bad=int(dmask.sum()))
                    else:
                        row["per_lp"] = None
                entry["subsets"][subset] = row
            block["crc"][score] = entry
        out[model] = block
    return {"settings": {"chi": chi, "alpha": alpha, "thresholds": list(thresholds)}, "models": out}


def served_table(model: str, split: str, settings: FlaggingSettings, evaluation, bounds) -> pd.DataFrame:
    """``subset, human, mu, risk`` of a model's predictions on ``split``: test from the served
    calibration, dev cross-fitted over documents."""
    from uamt.model_evaluation import cross_fitted_rows
    from uamt.serving.model_calibration import Calibration, with_model_sigma

    calibration = Calibration.load(Path(settings.calibration_dir) / f"{model}.json")
    path = Path(settings.predictions_dir) / split / f"{model}.parquet"
    if not path.is_file():
        raise DataError(f"{path}: missing; run `dvc repro evaluate` first")
    table = pd.read_parquet(path)
    table = table[table["human"].notna()].reset_index(drop=True)
    if split == "dev":
        rows, _ = cross_fitted_rows(
            table, model, calibration, dataclasses.replace(evaluation, risk_thresholds=[settings.chi]), bounds
        )
        mu, risk = rows.center, rows.risk[float(settings.chi)]
    else:
        raw = with_model_sigma(table, model)
        served = served_columns(
            calibration, raw["mu"], raw["sigma"], raw["lp"].astype(str).to_numpy(dtype=object),
            confidence=evaluation.coverage_gamma, chi=settings.chi, bounds=bounds,
        )
        mu, risk = served["mu"].to_numpy(), served["risk"].to_numpy()
    return pd.DataFrame({"subset": subsets_of(table), "human": table["human"].to_numpy(float), "mu": mu, "risk": risk})


def write_findings(settings: FlaggingSettings, pipeline, evaluation) -> dict[str, Path]:
    """The stage ``exp_flagging``: write ``flagging.json`` and its figure."""
    from uamt.data.datasets import scale_bounds

    bounds = scale_bounds(pipeline.datasets)
    dev = {m: served_table(m, "dev", settings, evaluation, bounds) for m in settings.methods}
    test = {m: served_table(m, "test", settings, evaluation, bounds) for m in settings.methods}
    result = analyse(dev, test, chi=settings.chi, thresholds=settings.thresholds, alpha=settings.alpha)
    out = {"result": write_result(NAME, result, settings.metrics_dir)}
    out["figure"] = save_figure(figure(result), Path(settings.figures_dir) / FIGURE)
    return out


def figure(result: dict[str, Any]):
    """Share flagged vs recall on test (pooled) at the fixed risk thresholds, per model."""
    from uamt.experiments.common import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for k, (model, block) in enumerate(result["models"].items()):
        points = block["fixed"]["all"]
        ax.plot(
            [p["flagged_share"] for p in points.values()],
            [p["recall"] for p in points.values()],
            "o-",
            color=f"C{k}",
            label=f"{model}: risk > t",
        )
        for t, p in points.items():
            ax.annotate(t, (p["flagged_share"], p["recall"]), fontsize=6)
        for score, marker in (("risk", "*"), ("neg_mu", "x")):
            c = block["crc"][score]["subsets"]["all"]["pooled"]
            ax.plot([c["flagged_share"]], [c["recall"]], marker, color=f"C{k}", markersize=9,
                    label=f"{model}: CRC on {'risk' if score == 'risk' else '-mu'}")
    alpha = result["settings"]["alpha"]
    ax.axhline(1 - alpha, color="0.6", linewidth=0.8)
    ax.set_xlabel("share of translations flagged")
    ax.set_ylabel("recall of bad translations")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def render(result: dict[str, Any]) -> str:
    """The markdown section (``templates/flagging.md.j2``)."""
    return rendering.render(NAME, result, figure=FIGURE, section=section_number(NAME))


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Whether the realised test miss rate is within alpha where the per-LP threshold promised it."""
    alpha = result["settings"]["alpha"]
    rows = []
    for model, block in result["models"].items():
        cells = [
            row["per_lp"]["miss_rate"]
            for subset, row in block["crc"]["risk"]["subsets"].items()
            if subset != "all" and row.get("per_lp") and row["per_lp"]["miss_rate"] is not None
        ]
        within = sum(m <= alpha for m in cells)
        pooled = block["crc"]["risk"]["subsets"]["all"]["pooled"]
        mu = block["crc"]["neg_mu"]["subsets"]["all"]["pooled"]
        if pooled["miss_rate"] is None or mu["miss_rate"] is None:
            rows.append((f"Conformal risk control on the served risk ({model})", "–", "n/a: no bad dev or test rows"))
            continue
        verdict = "n/a" if not cells else "held" if within * 4 >= 3 * len(cells) else "partly" if within else "not held"
        rows.append(
            (
                f"Conformal risk control on the served risk keeps the share of bad translations (MQM <= "
                f"{result['settings']['chi']:g}) left unflagged <= {alpha:g} on test ({model})",
                "finite-sample guarantee in expectation (Angelopoulos et al. 2022), exchangeable dev and test",
                f"{verdict}: per-LP thresholds miss <= {alpha:g} in {within}/{len(cells)} LPs; pooled threshold: "
                f"miss {pooled['miss_rate']:.3f} with {100 * pooled['flagged_share']:.0f} % flagged "
                f"(-mu under the same control: miss {mu['miss_rate']:.3f}, {100 * mu['flagged_share']:.0f} % flagged)",
            )
        )
    return rows
