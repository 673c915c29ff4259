"""Stage ``exp_multihyp``: lexical multi-hypothesis scoring with pseudo-references on WMT21 DA and the
Estonian-English 1K reference rows of *Multi-Hypothesis MT Evaluation* (uamt.experiments.multihyp).

Reads ``data/prepared/*.parquet`` (WMT21 DA rows of every split: the metrics are not trained; the
``multihyp_eten`` rows of ``test``); writes ``metrics/experiments/multihyp.json`` and
``reports/figures/multihyp.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.experiments.multihyp import MultihypSettings, write_findings
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "exp_multihyp"


@dataclass(frozen=True)
class ExpMultihypConfig:
    exp: MultihypSettings
    pipeline: PipelineConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpMultihypConfig:
    return ExpMultihypConfig(load_section(MultihypSettings, NAME, path), load_pipeline(path))


def run(cfg: ExpMultihypConfig) -> dict[str, Path]:
    """Write ``multihyp.json`` and its figure; returns ``{"result": ..., "figure": ...}``."""
    return write_findings(cfg.exp, cfg.pipeline)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
