"""Stage ``evaluate``: every model on the in-domain test set.

Measures the served calibration the ``calibrate`` stage wrote (``calibration/<model>.json``, the
artifact the register stage ships), never a refit; writes ``metrics/test.json``,
``metrics/intervals.json``, ``metrics/conditional.json`` (the interval goals, with, per model the
train_lolo stage trained without each LP, how such a held-out LP's test rows are served) and the
plots (reliability, error vs sigma) (:func:`uamt.model_evaluation.evaluate_models`).  The
out-of-domain split is measured after ``register`` (stage ``evaluate_ood``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.leave_one_lp_out import LeaveOneLpOutConfig
from uamt.model_evaluation import evaluate_models
from uamt.pipeline_config import CALIBRATION_DIR, PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "evaluate"


@dataclass(frozen=True)
class EvaluateConfig:
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    encode: EncodeConfig
    lolo: LeaveOneLpOutConfig
    calibration_dir: str = CALIBRATION_DIR


def load_config(path: str | Path = DEFAULT_PARAMS) -> EvaluateConfig:
    return EvaluateConfig(
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
        load_section(EncodeConfig, "encode", path),
        load_section(LeaveOneLpOutConfig, "train_lolo", path),
    )


def run(cfg: EvaluateConfig) -> dict[str, Path]:
    """Write the test metrics and plots; returns their paths."""
    return evaluate_models(cfg.pipeline, cfg.evaluate, cfg.encode, cfg.calibration_dir, cfg.lolo.out_dir)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
