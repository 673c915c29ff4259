"""Stage ``exp_flagging``: flags from the served risk on test, and the conformal risk-control
threshold chosen on dev (uamt.experiments.flagging).

Reads ``predictions/{dev,test}/<model>.parquet`` and ``calibration/<model>.json``; writes
``metrics/experiments/flagging.json`` and ``reports/figures/flagging_tradeoff.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.experiments.flagging import FlaggingSettings, write_findings
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "exp_flagging"


@dataclass(frozen=True)
class ExpFlaggingConfig:
    exp: FlaggingSettings
    pipeline: PipelineConfig
    evaluate: EvaluationSettings


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpFlaggingConfig:
    return ExpFlaggingConfig(
        load_section(FlaggingSettings, NAME, path),
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
    )


def run(cfg: ExpFlaggingConfig) -> dict[str, Path]:
    """Write ``flagging.json`` and its figure; returns ``{"result": ..., "figure": ...}``."""
    return write_findings(cfg.exp, cfg.pipeline, cfg.evaluate)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
