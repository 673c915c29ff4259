"""Calibrate the pipeline's models on dev and evaluate them in- and out-of-domain (stages
``calibrate`` and ``evaluate``).

:func:`calibrate_models` predicts dev with every model and fits its calibration there (never on
test): the dev predictions table (``predictions/dev/<model>.parquet``), the fitted standardisation +
affine sigma^2 calibration + fixed variance + conformal thresholds (``calibration/<model>.json``),
and the in-sample dev metrics (``metrics/dev.json``).  A reference-based model also gets, for
k = 2, 3, ... references, the factor by which averaging k references changed its squared error on
the dev rows that have that many (:func:`uamt.references.fit_reference_factors`).  Every model
gets the sigma factor for LPs absent from its dev data, fitted by leaving each dev LP out
(:func:`uamt.calibrated.fit_model_unseen_lp_sigma_factor`; ``metrics/dev.json``: ``<model>.unseen_lp``).

:func:`evaluate_models` predicts ``test`` and ``ood`` with each model, calibrates with the dev fit
(standardisation, affine sigma^2, fixed variance for the point estimate), and writes
``metrics/test.json`` and ``metrics/ood.json`` (model x LP x PPS/UPS/NLL/ECE/sharpness/coverage/CRPS,
with averages), ``metrics/intervals.json`` (Gaussian-calibrated vs conformal coverage and width per
LP), ``metrics/conditional.json`` (issue 15: conditional coverage, ENCE, sigma spread, the
candidates table, fixed vs cross-fitted ECE, held-out LPs and the goals met;
:func:`uamt.uncertainty.goals.interval_summary`) and the plots: reliability diagram, sharpness in- vs out-of-domain, error vs sigma.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.calibrated import (
    fit_calibration,
    fit_model_unseen_lp_sigma_factor,
    is_fixed_variance,
    with_model_sigma,
)
from uamt.encoders import EncodeConfig
from uamt.pipeline import PipelineConfig, open_features, predict_split, read_split
from uamt.plots import pyplot, save_figure
from uamt.references import fit_reference_factors
from uamt.uncertainty import EvaluationSettings, evaluate_predictions, write_json_atomic
from uamt.uncertainty.evaluate import clustered_ece_floor
from uamt.uncertainty.goals import interval_summary

log = logging.getLogger(__name__)
EVAL_SPLITS = ("test", "ood")
#: What :func:`evaluate_predictions` computes per split: the candidates table and the papers'
#: k-fold ECE are reported on test only; ood needs the served calibration's metrics.
SPLIT_SCOPES = {"test": "full", "ood": "served"}
REPORTED = ("pps", "ups", "nll", "ece", "ece_floor", "n_eff", "sharpness", "coverage@0.9", "width@0.9", "crps", "ence", "sigma_p90_p10", "n")


def _calibrated_block(result: dict, method: str) -> dict:
    """The metrics block of the calibrated model (the fixed-variance Gaussian for the point estimate)."""
    return result["methods"]["fixed_variance" if is_fixed_variance(method) else "model"]


def calibrate_models(
    pipe: PipelineConfig, settings: EvaluationSettings, encode: EncodeConfig, calibration_dir: str | Path
) -> dict[str, Path]:
    """Fit every model's dev calibration; writes the dev predictions, ``<calibration_dir>/<model>.json``
    and ``<metrics_dir>/dev.json``; returns ``{model: calibration path}``."""
    dev_df = read_split(pipe.prepared_dir, "dev", pipe.datasets)
    features = open_features(encode)
    metrics, out = {}, {}
    for method in pipe.all_methods:
        table = predict_split(
            pipe.model_dir(method), dev_df, features, Path(pipe.predictions_dir) / "dev" / f"{method}.parquet"
        )
        calibration, in_sample = fit_calibration(table, method, settings=settings, source=f"dev/{method}")
        calibration.reference_factors = fit_reference_factors(
            pipe.model_dir(method), dev_df, features, calibration, settings.min_lp_rows
        )
        started = time.perf_counter()
        factor, held_out = fit_model_unseen_lp_sigma_factor(table, method, calibration, settings=settings)
        calibration.unseen_lp_sigma_factor = factor
        log.info(
            "%s: unseen-LP sigma factor %.3f (leave-one-LP-out: %s; %.1f s)",
            method,
            factor,
            ", ".join(f"{lp} {c:.3f}" for lp, c in held_out.items()) or "fewer than two LPs",
            time.perf_counter() - started,
        )
        out[method] = Path(calibration_dir) / f"{method}.json"
        calibration.save(out[method])
        block = _calibrated_block(in_sample, method)
        metrics[method] = {
            "avg": block["macro_avg"],
            **block["per_lp"],
            "unseen_lp": {"sigma_factor": factor, "held_out": held_out},
        }
        log.info("calibrated %s on %d dev rows", method, len(table))
    Path(pipe.metrics_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(metrics, Path(pipe.metrics_dir) / "dev.json")
    return out


def _keep(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k in REPORTED or k.startswith(("coverage@", "width@"))}


def method_metrics(result: dict, method: str, table: pd.DataFrame | None = None, n_levels: int = 100) -> dict:
    """``{"avg": {...}, lp: {...}}`` for the calibrated model (fixed variance for the point estimate).

    With the predictions ``table``, ``ece_floor`` is the sampling floor at the effective sample size
    ``n_eff`` (rows of one source segment are correlated: :func:`clustered_ece_floor`), not at n rows.
    """
    block = _calibrated_block(result, method)
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


def evaluate_models(pipe: PipelineConfig, settings: EvaluationSettings, encode: EncodeConfig) -> dict[str, Path]:
    """Evaluate every calibrated model on ``test`` and ``ood``; writes the predictions, the metrics
    and the plots; returns ``{"test": ..., "ood": ..., plot name: ...}`` paths."""
    features = open_features(encode)
    frames = {
        "test": read_split(pipe.prepared_dir, "test", pipe.datasets),
        "ood": read_split(pipe.prepared_dir, "ood", pipe.ood_datasets),
    }
    metrics: dict[str, dict] = {split: {} for split in EVAL_SPLITS}
    intervals, reliability, scatter, conditional = {}, {}, {}, {}
    for method in pipe.all_methods:
        dev = pd.read_parquet(Path(pipe.predictions_dir) / "dev" / f"{method}.parquet")
        dev = with_model_sigma(dev, method)
        results = {}
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
                settings=settings,
                pred_source=f"{split}/{method}",
                dev_source=f"dev/{method}",
                scope=SPLIT_SCOPES[split],
            )
            metrics[split][method] = method_metrics(result, method, table, settings.n_levels)
            results[split] = result
            if split == "test":
                reliability[method] = _calibrated_block(result, method)["reliability"]
                intervals[method] = result.get("intervals")
                scatter[method] = table
        conditional[method] = interval_summary(
            results["test"],
            metrics["test"][method],
            results["ood"],
            metrics["ood"][method],
            block="fixed_variance" if is_fixed_variance(method) else "model",
        )
        log.info("evaluated %s", method)
    metrics_dir = Path(pipe.metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(metrics["test"], metrics_dir / "test.json")
    write_json_atomic(metrics["ood"], metrics_dir / "ood.json")
    write_json_atomic(intervals, metrics_dir / "intervals.json")
    write_json_atomic(conditional, metrics_dir / "conditional.json")
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
