"""Stage ``exp_sigma_weights``: the σ weights pinned in ``evaluate.pinned_sigma_weights``, re-checked
after ``register`` (uamt.experiments.sigma_weights).

Reads ``calibration/<model>.json`` and ``predictions/{dev,d_e}/<model>.parquet`` from ``calibrate``
and the train_lolo stage's models; writes ``metrics/experiments/sigma_weights.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments.sigma_weights import SigmaWeightSettings, write_findings
from uamt.leave_one_lp_out import LeaveOneLpOutConfig
from uamt.pipeline_config import CALIBRATION_DIR, PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "exp_sigma_weights"


@dataclass(frozen=True)
class ExpSigmaWeightsConfig:
    exp: SigmaWeightSettings
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    encode: EncodeConfig
    lolo: LeaveOneLpOutConfig
    calibration_dir: str = CALIBRATION_DIR


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpSigmaWeightsConfig:
    return ExpSigmaWeightsConfig(
        load_section(SigmaWeightSettings, NAME, path),
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
        load_section(EncodeConfig, "encode", path),
        load_section(LeaveOneLpOutConfig, "train_lolo", path),
    )


def run(cfg: ExpSigmaWeightsConfig) -> dict[str, Path]:
    """Write ``sigma_weights.json``; returns ``{"result": path}``."""
    return write_findings(cfg.exp, cfg.pipeline, cfg.evaluate, cfg.encode, cfg.calibration_dir, cfg.lolo.out_dir)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
