"""Stage ``exp_rerank``: choose one translation per multi-system test source by each rule of
:mod:`uamt.decisions.rerank` and judge the picks by their human MQM (uamt.experiments.rerank).

Reads ``data/prepared/test.parquet``, ``predictions/test/<model>.parquet`` and
``calibration/<model>.json`` (the served distribution), the reference-based model ``models/<method>``
and ``cache/embeddings`` (MBR: candidates as pseudo-references); writes
``metrics/experiments/rerank.json`` and ``reports/figures/rerank_selective.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments.rerank import RerankExperimentSettings, write_findings
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "exp_rerank"


@dataclass(frozen=True)
class ExpRerankConfig:
    exp: RerankExperimentSettings
    pipeline: PipelineConfig
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpRerankConfig:
    return ExpRerankConfig(
        load_section(RerankExperimentSettings, NAME, path), load_pipeline(path), load_section(EncodeConfig, "encode", path)
    )


def run(cfg: ExpRerankConfig) -> dict[str, Path]:
    """Write ``rerank.json`` and its figure; returns ``{"result": ..., "figure": ...}``."""
    return write_findings(cfg.exp, cfg.pipeline, cfg.encode)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
