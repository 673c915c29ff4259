"""Stage ``exp_noisy_refs``: does the lower-uncertainty reference coincide with the better-rated one?
(uamt.experiments.noisy_refs, *Better Uncertainty Quantification* §5.5).

Reads the prepared held-out splits (``dev`` + ``test``), the trained ``models/<method>``, their
``calibration/<method>.json`` and the embedding cache; writes ``metrics/experiments/noisy_refs.json``
and ``reports/figures/noisy_refs.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments.noisy_refs import NoisyRefsSettings, write_findings
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "exp_noisy_refs"


@dataclass(frozen=True)
class ExpNoisyRefsConfig:
    exp: NoisyRefsSettings
    pipeline: PipelineConfig
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpNoisyRefsConfig:
    return ExpNoisyRefsConfig(
        load_section(NoisyRefsSettings, NAME, path),
        load_pipeline(path),
        load_section(EncodeConfig, "encode", path),
    )


def run(cfg: ExpNoisyRefsConfig) -> dict[str, Path]:
    """Write ``noisy_refs.json`` and its figure; returns ``{"result": ..., "figure": ...}``."""
    return write_findings(cfg.exp, cfg.pipeline, cfg.encode)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
