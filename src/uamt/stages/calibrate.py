"""Stage ``calibrate``: predict dev with every model and fit its calibration there (never on test).

Writes ``predictions/dev/<model>.parquet``, ``calibration/<model>.json`` (standardisation + affine
sigma^2 + fixed variance + conformal thresholds + reference factors + the unseen-LP widening, fitted
with the train_lolo stage's models where it trained the model without each LP) and ``metrics/dev.json``
(:func:`uamt.model_evaluation.calibrate_models`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.leave_one_lp_out import LeaveOneLpOutConfig
from uamt.model_evaluation import calibrate_models
from uamt.pipeline_config import CALIBRATION_DIR, PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "calibrate"


@dataclass(frozen=True)
class CalibrateConfig:
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    encode: EncodeConfig
    lolo: LeaveOneLpOutConfig
    calibration_dir: str = CALIBRATION_DIR


def load_config(path: str | Path = DEFAULT_PARAMS) -> CalibrateConfig:
    return CalibrateConfig(
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
        load_section(EncodeConfig, "encode", path),
        load_section(LeaveOneLpOutConfig, "train_lolo", path),
    )


def run(cfg: CalibrateConfig) -> dict[str, Path]:
    """Fit and save every model's dev calibration; returns ``{model: calibration path}``."""
    return calibrate_models(cfg.pipeline, cfg.evaluate, cfg.encode, cfg.calibration_dir, cfg.lolo.out_dir)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
