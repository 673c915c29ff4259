"""Stage ``calibrate``: predict dev with every method and fit its calibration there (never on test).

For each method: the dev predictions table (``predictions/dev/<method>.parquet``), the fitted
standardisation + affine sigma^2 calibration + fixed variance + conformal thresholds
(``calibration/<method>.json``), and the in-sample dev metrics (``metrics/dev.json``).  A
reference-based model also gets, for k = 2, 3, ... references, the factor by which averaging k
references changed its squared error on the dev rows that have that many (``reference_factors``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.fileio import atomic_write_parquet
from uamt.pipeline import PipelineConfig, base_method, load_pipeline, open_features, read_split
from uamt.stages._cli import stage_main
from uamt.stages.encode import EncodeConfig
from uamt.uncertainty import EvaluationSettings, evaluate_predictions, write_json_atomic

NAME = "calibrate"
log = logging.getLogger(__name__)
CALIBRATION_DIR = "calibration"


@dataclass(frozen=True)
class CalibrateConfig:
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    encode: EncodeConfig
    calibration_dir: str = CALIBRATION_DIR


def load_config(path: str | Path = DEFAULT_PARAMS) -> CalibrateConfig:
    return CalibrateConfig(
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
        load_section(EncodeConfig, "encode", path),
    )


def is_fixed_variance(method: str) -> bool:
    """The point estimate (reference-based or QE) has no sigma of its own: it gets the
    fixed-variance Gaussian."""
    return base_method(method) == "point"


def with_model_sigma(table: pd.DataFrame, method: str) -> pd.DataFrame:
    """The table ``evaluate_predictions`` reads: the point estimate's NaN sigma becomes a constant 1,
    which the affine calibration turns into a fitted constant variance."""
    if is_fixed_variance(method):
        table = table.assign(sigma=np.ones(len(table)))
    return table


def predict_split(model_dir: Path, frame: pd.DataFrame, features, out_path: Path) -> pd.DataFrame:
    """The predictions table of one model on one split, written atomically to ``out_path``."""
    from uamt.models.api import load

    table = load(model_dir).predictions_table(frame, features)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(out_path, table, index=False)
    return table


def multi_reference_rows(frame: pd.DataFrame, k: int) -> tuple[pd.DataFrame, list[list[str]]]:
    """Rows of ``frame`` with at least ``k`` distinct references, and the first ``k`` of each."""
    from uamt.references import distinct_references

    options = [
        distinct_references([ref, *(refs if refs is not None else [])])
        for ref, refs in zip(frame["ref"], frame["refs"], strict=True)
    ]
    keep = [i for i, refs in enumerate(options) if len(refs) >= k]
    return frame.iloc[keep].reset_index(drop=True), [options[i][:k] for i in keep]


def fit_reference_factors(
    model_dir: Path, dev_df: pd.DataFrame, features, calibration, cfg: CalibrateConfig
) -> dict[int, dict[str, float]]:
    """``{k: {lp or GLOBAL: variance factor}}`` for predictions averaged over k = 2, 3, ... references.

    On the dev rows that have k distinct references, the factor is the ratio of the mean squared
    errors (in the dev-standardised units of ``calibration``) of the k-reference average and of the
    single-reference prediction on the *same rows*:
    :math:`f_k = \\overline{(q^*_z - \\hat\\mu_{z,k})^2} / \\overline{(q^*_z - \\hat\\mu_{z,1})^2}`.
    Calibrated variances of k-reference predictions are multiplied by it, so intervals narrow with
    more references exactly as much as dev shows the averaged prediction to be more accurate.  Fitted
    for every k with at least ``evaluate.min_lp_rows`` such rows (per LP likewise); empty for a QE model.
    """
    from uamt.models.api import load
    from uamt.references import predict_with_references
    from uamt.uncertainty import GLOBAL

    model = load(model_dir)
    if model.cfg.reference_free or "refs" not in dev_df.columns:
        return {}
    minimum = cfg.evaluate.min_lp_rows
    factors: dict[int, dict[str, float]] = {}
    k = 2
    while True:
        rows, refs = multi_reference_rows(dev_df, k)
        if len(rows) < minimum:
            return factors
        lp = rows["lp"].to_numpy(dtype=object)
        human_z = calibration.standardizer.transform_human(rows["score"].to_numpy(dtype=float), lp)
        squared = {}
        for n_refs in (1, k):
            pred = predict_with_references(model, rows, [r[:n_refs] for r in refs], features)
            mu_z, _ = calibration.standardizer.transform_predictions(pred["mu"].to_numpy(dtype=float), None, lp)
            squared[n_refs] = (human_z - mu_z) ** 2
        groups = {GLOBAL: np.ones(len(rows), dtype=bool)}
        groups.update({name: lp == name for name in sorted(set(lp.tolist())) if (lp == name).sum() >= minimum})
        factors[k] = {
            name: float(squared[k][mask].mean() / squared[1][mask].mean()) for name, mask in groups.items()
        }
        log.info("reference factors for %d references on %d dev rows: %s", k, len(rows), factors[k])
        k += 1


def run(cfg: CalibrateConfig) -> dict[str, Path]:
    from uamt.calibrated import Calibration

    pipe = cfg.pipeline
    dev_df = read_split(pipe.prepared_dir, "dev", pipe.datasets)
    features = open_features(cfg.encode)
    metrics, out = {}, {}
    for method in pipe.all_methods:
        table = predict_split(
            pipe.model_dir(method), dev_df, features, Path(pipe.predictions_dir) / "dev" / f"{method}.parquet"
        )
        table = with_model_sigma(table, method)
        result = evaluate_predictions(
            table, table, settings=cfg.evaluate, pred_source=f"dev/{method}", dev_source=f"dev/{method}"
        )
        calibration = Calibration.from_result(result["calibration"], fixed=is_fixed_variance(method))
        calibration.reference_factors = fit_reference_factors(
            pipe.model_dir(method), dev_df, features, calibration, cfg
        )
        out[method] = Path(cfg.calibration_dir) / f"{method}.json"
        calibration.save(out[method])
        block = result["methods"]["fixed_variance" if is_fixed_variance(method) else "model"]
        metrics[method] = {"avg": block["macro_avg"], **block["per_lp"]}
        log.info("calibrated %s on %d dev rows", method, len(table))
    Path(pipe.metrics_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(metrics, Path(pipe.metrics_dir) / "dev.json")
    return out


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
