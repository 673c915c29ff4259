"""Stage ``exp_cost``: training and inference time of every method on one slice (uamt.experiments.cost).

Samples ``rows`` d_q / d_e rows, ``dev_rows`` dev rows and ``test_rows`` test rows of
``pipeline.datasets``, trains every method into a temporary folder with the ``train_base`` /
``train_dup`` settings, and writes ``metrics/experiments/cost.json`` and ``reports/figures/cost.png``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments.cost import CostStageSettings, write_findings
from uamt.models.config import TrainConfig, load_train_config
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "exp_cost"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpCostConfig:
    exp: CostStageSettings
    pipeline: PipelineConfig
    train: TrainConfig
    dup: TrainConfig
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpCostConfig:
    return ExpCostConfig(
        load_section(CostStageSettings, NAME, path),
        load_pipeline(path),
        load_train_config("point", path),
        load_train_config("dup", path),
        load_section(EncodeConfig, "encode", path),
    )


def run(cfg: ExpCostConfig) -> dict[str, Path]:
    """Write ``cost.json`` and ``cost.png``; returns ``{"result": ..., "figure": ...}``."""
    return write_findings(cfg.exp, cfg.pipeline, cfg.train, cfg.dup, cfg.encode, log=log.info)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
