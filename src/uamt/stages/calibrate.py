"""Stage ``calibrate``: predict dev with every method and fit its calibration there (never on test).

For each method: the dev predictions table (``predictions/dev/<method>.parquet``), the fitted
standardisation + affine sigma^2 calibration + fixed variance + conformal thresholds
(``calibration/<method>.json``), and the in-sample dev metrics (``metrics/dev.json``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.pipeline import PipelineConfig, load_pipeline, open_features, read_split
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
    """The point estimate has no sigma of its own: it gets the fixed-variance Gaussian."""
    return method == "point"


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
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    table.to_parquet(tmp, index=False)
    tmp.replace(out_path)
    return table


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
