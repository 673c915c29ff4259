"""Stage ``exp_ood``: sharpness in vs out of domain (news vs TED) per method and LP (uamt.experiments.ood).

Reads ``metrics/{test,ood}.json`` and ``predictions/{test,ood}/<method>.parquet`` from ``evaluate``
and ``calibration/<method>.json`` from ``calibrate``;
writes ``metrics/experiments/ood.json`` and ``reports/figures/ood_sharpness.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.experiments.ood import OodSettings, write_findings
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "exp_ood"


@dataclass(frozen=True)
class ExpOodConfig:
    exp: OodSettings
    pipeline: PipelineConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpOodConfig:
    return ExpOodConfig(load_section(OodSettings, NAME, path), load_pipeline(path))


def run(cfg: ExpOodConfig) -> dict[str, Path]:
    """Write ``ood.json`` and its figure; returns ``{"result": ..., "figure": ...}``."""
    return write_findings(cfg.exp, cfg.pipeline)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
