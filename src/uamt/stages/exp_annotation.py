"""Stage ``exp_annotation``: simulate active annotation on the ``d_e`` pool and measure learning curves
on test, and the new-domain case: news ``d_q`` rows plus annotated TED / biomedical rows, measured on
held-out documents of the new domain (uamt.experiments.annotation).

Reads ``data/prepared/{d_e,test,d_q,ood}.parquet`` and ``cache/embeddings``; writes
``metrics/experiments/annotation.json``, ``reports/figures/annotation_curves.png`` and
``reports/figures/annotation_domain.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments.annotation import AnnotationSettings, write_findings
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "exp_annotation"


@dataclass(frozen=True)
class ExpAnnotationConfig:
    exp: AnnotationSettings
    pipeline: PipelineConfig
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpAnnotationConfig:
    return ExpAnnotationConfig(
        load_section(AnnotationSettings, NAME, path), load_pipeline(path), load_section(EncodeConfig, "encode", path)
    )


def run(cfg: ExpAnnotationConfig) -> dict[str, Path]:
    """Write ``annotation.json`` and its figures; returns ``{"result", "figure", "domain_figure"}`` paths."""
    return write_findings(cfg.exp, cfg.pipeline, cfg.encode)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
