"""Stage ``exp_references``: number of references, S-1 / S-2 / Mul (uamt.experiments.references).

Reads the prepared ``dev`` and ``test`` splits, the trained ``models/<method>`` and the embedding
cache; writes ``metrics/experiments/references.json`` and ``reports/figures/references_sharpness.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments.references import ReferencesSettings, write_findings
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "exp_references"


@dataclass(frozen=True)
class ExpReferencesConfig:
    exp: ReferencesSettings
    pipeline: PipelineConfig
    encode: EncodeConfig
    evaluate: EvaluationSettings


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpReferencesConfig:
    return ExpReferencesConfig(
        load_section(ReferencesSettings, NAME, path),
        load_pipeline(path),
        load_section(EncodeConfig, "encode", path),
        load_section(EvaluationSettings, "evaluate", path),
    )


def run(cfg: ExpReferencesConfig) -> dict[str, Path]:
    """Write ``references.json`` and its figure; returns ``{"result": ..., "figure": ...}``."""
    return write_findings(cfg.exp, cfg.pipeline, cfg.encode, cfg.evaluate)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
