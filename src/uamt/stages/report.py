"""Stage ``report``: assemble ``reports/experiments.md`` from every ``exp_*`` stage's JSON result.

Sections in ``uamt.experiments.SECTIONS`` order (uamt.experiments.report); a missing result stops the
stage naming the ``exp_<name>`` stage to run.  Written atomically, date-free (re-runs are identical).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.core.fileio import atomic_write_text
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, REPORT_PATH
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "report"


@dataclass(frozen=True)
class ReportSettings:
    """params.yaml ``report:`` section: where the results and figures are, where the report goes."""

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    out: str = REPORT_PATH


@dataclass(frozen=True)
class ReportConfig:
    report: ReportSettings
    pipeline: PipelineConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ReportConfig:
    return ReportConfig(load_section(ReportSettings, NAME, path), load_pipeline(path))


def run(cfg: ReportConfig) -> dict[str, Path]:
    from uamt.experiments.report import build_report

    text = build_report(cfg.report.metrics_dir, cfg.report.figures_dir, cfg.pipeline.prepared_dir)
    out = Path(cfg.report.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)
    return {"report": out}


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
