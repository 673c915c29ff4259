"""Stage ``evaluate``: every method on the in-domain test set and the out-of-domain (TED) set.

Predicts ``test`` and ``ood`` with each model, calibrates with the dev fit of the ``calibrate``
stage (standardisation, affine sigma^2, fixed variance for the point estimate), and writes
``metrics/test.json`` and ``metrics/ood.json`` (method x LP x PPS/UPS/NLL/ECE/sharpness/coverage/
CRPS, with averages), ``metrics/intervals.json`` (Gaussian-calibrated vs conformal coverage and
width per LP) and the plots: reliability diagram, sharpness in- vs out-of-domain, error vs sigma.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.pipeline import PipelineConfig, load_pipeline, open_features, read_split
from uamt.plots import pyplot, save_figure
from uamt.stages._cli import stage_main
from uamt.stages.calibrate import is_fixed_variance, predict_split, with_model_sigma
from uamt.stages.encode import EncodeConfig
from uamt.uncertainty import EvaluationSettings, evaluate_predictions, write_json_atomic
from uamt.uncertainty.evaluate import clustered_ece_floor

NAME = "evaluate"
log = logging.getLogger(__name__)
EVAL_SPLITS = ("test", "ood")
REPORTED = ("pps", "ups", "nll", "ece", "ece_floor", "n_eff", "sharpness", "coverage@0.9", "width@0.9", "crps", "ence", "sigma_p90_p10", "n")


@dataclass(frozen=True)
class EvaluateConfig:
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> EvaluateConfig:
    return EvaluateConfig(
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
        load_section(EncodeConfig, "encode", path),
    )


def _keep(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k in REPORTED or k.startswith(("coverage@", "width@"))}


def method_metrics(result: dict, method: str, table: pd.DataFrame | None = None, n_levels: int = 100) -> dict:
    """``{"avg": {...}, lp: {...}}`` for the calibrated model (fixed variance for the point estimate).

    With the predictions ``table``, ``ece_floor`` is the sampling floor at the effective sample size
    ``n_eff`` (rows of one source segment are correlated: :func:`clustered_ece_floor`), not at n rows.
    """
    block = result["methods"]["fixed_variance" if is_fixed_variance(method) else "model"]
    per_lp = {lp: _keep(m) for lp, m in block["per_lp"].items()}
    avg = _keep(block["macro_avg"])
    if table is not None and "seg_id" in table.columns:
        for lp, floor in clustered_ece_floor(table, n_levels).items():
            if lp in per_lp:
                per_lp[lp].update(floor)
        for key in ("ece_floor", "n_eff"):
            values = [m[key] for m in per_lp.values() if m.get(key) is not None]
            avg[key] = float(np.mean(values)) if values else None
    return {"avg": avg, **per_lp}


def run(cfg: EvaluateConfig) -> dict[str, Path]:
    pipe = cfg.pipeline
    features = open_features(cfg.encode)
    frames = {
        "test": read_split(pipe.prepared_dir, "test", pipe.datasets),
        "ood": read_split(pipe.prepared_dir, "ood", pipe.ood_datasets),
    }
    metrics: dict[str, dict] = {split: {} for split in EVAL_SPLITS}
    intervals, reliability, scatter = {}, {}, {}
    for method in pipe.all_methods:
        dev = pd.read_parquet(Path(pipe.predictions_dir) / "dev" / f"{method}.parquet")
        dev = with_model_sigma(dev, method)
        for split, frame in frames.items():
            table = predict_split(
                pipe.model_dir(method),
                frame,
                features,
                Path(pipe.predictions_dir) / split / f"{method}.parquet",
            )
            result = evaluate_predictions(
                with_model_sigma(table, method),
                dev,
                settings=cfg.evaluate,
                pred_source=f"{split}/{method}",
                dev_source=f"dev/{method}",
            )
            metrics[split][method] = method_metrics(result, method, table, cfg.evaluate.n_levels)
            if split == "test":
                block = result["methods"]["fixed_variance" if is_fixed_variance(method) else "model"]
                reliability[method] = block["reliability"]
                intervals[method] = result.get("intervals")
                scatter[method] = table
        log.info("evaluated %s", method)
    metrics_dir = Path(pipe.metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(metrics["test"], metrics_dir / "test.json")
    write_json_atomic(metrics["ood"], metrics_dir / "ood.json")
    write_json_atomic(intervals, metrics_dir / "intervals.json")
    plots = write_plots(Path(pipe.plots_dir), reliability, metrics, scatter)
    return {"test": metrics_dir / "test.json", "ood": metrics_dir / "ood.json", **plots}


def write_plots(plots_dir: Path, reliability: dict, metrics: dict, scatter: dict) -> dict[str, Path]:
    """Reliability diagram, sharpness in- vs out-of-domain, and |error| vs sigma, as PNG."""
    plt = pyplot()
    plots_dir.mkdir(parents=True, exist_ok=True)
    out = {}

    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="ideal")
    for method, curve in reliability.items():
        if curve:
            ax.plot(curve["expected"], curve["observed"], label=method)
    ax.set(
        xlabel="expected coverage (confidence level)", ylabel="observed coverage", title="Reliability on test"
    )
    ax.legend(fontsize=8)
    out["reliability"] = save_figure(fig, plots_dir / "reliability.png")

    methods = list(metrics["test"])
    lps = sorted({lp for split in metrics.values() for m in split.values() for lp in m if lp != "avg"})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        values = [
            metrics["test"][method]["avg"].get("sharpness") or np.nan,
            metrics["ood"][method]["avg"].get("sharpness") or np.nan,
        ]
        ax.bar(np.arange(2) + i * width, values, width, label=method)
    ax.set_xticks(
        np.arange(2) + width * (len(methods) - 1) / 2, ["in-domain (news test)", "out-of-domain (TED)"]
    )
    ax.set(ylabel="sharpness (mean calibrated sigma^2, z units)", title=f"Sharpness, LPs {', '.join(lps)}")
    ax.legend(fontsize=8)
    out["sharpness"] = save_figure(fig, plots_dir / "sharpness.png")

    shown = [m for m in scatter if not is_fixed_variance(m)]
    fig, axes = plt.subplots(1, max(len(shown), 1), figsize=(3 * max(len(shown), 1), 3), squeeze=False)
    for ax, method in zip(axes[0], shown, strict=False):
        table = scatter[method]
        ax.scatter(table["sigma"], (table["human"] - table["mu"]).abs(), s=3, alpha=0.3)
        ax.set(title=method, xlabel="predicted sigma (raw)", ylabel="|human - mu|")
    out["error_vs_sigma"] = save_figure(fig, plots_dir / "error_vs_sigma.png")
    return out


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
