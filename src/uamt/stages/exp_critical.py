"""Stage ``exp_critical``: critical-error retrieval by q_hat, mu and risk, with other systems' outputs
as pseudo-references and with the human reference (uamt.experiments.critical; paper §5.5, App. F).

Reads the MQM rows of ``data/prepared/{dev,test}.parquet``, the models ``models/<method>`` and the
pipeline's ``calibration/<method>.json`` (standard setting), embeddings from ``cache/embeddings``;
writes ``metrics/experiments/critical.json`` and ``reports/figures/critical_{recall,precision}.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments.critical import CriticalSettings, check_dataset, write_findings
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "exp_critical"


@dataclass(frozen=True)
class ExpCriticalConfig:
    exp: CriticalSettings
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpCriticalConfig:
    cfg = ExpCriticalConfig(
        load_section(CriticalSettings, NAME, path),
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
        load_section(EncodeConfig, "encode", path),
    )
    check_dataset(cfg.exp, cfg.pipeline, f"{path}:{NAME}")
    return cfg


def run(cfg: ExpCriticalConfig) -> dict[str, Path]:
    """Write ``critical.json`` and its figures; returns ``{"result": ..., "recall": ..., "precision": ...}``."""
    return write_findings(cfg.exp, cfg.pipeline, cfg.evaluate, cfg.encode)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
