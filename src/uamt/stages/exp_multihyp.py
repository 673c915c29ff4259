"""Stage ``exp_multihyp``: lexical multi-hypothesis scoring with pseudo-references on WMT21 DA and the
Estonian-English 1K reference rows of *Multi-Hypothesis MT Evaluation* (uamt.experiments.multihyp).

Reads ``data/prepared/*.parquet`` (WMT21 DA rows of every split: the metrics are not trained; the
``multihyp_eten`` rows of ``test``); writes ``metrics/experiments/multihyp.json`` and
``reports/figures/multihyp.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.experiments import multihyp
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, save_figure, write_result
from uamt.pipeline import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "exp_multihyp"
FIGURE = "multihyp.png"


@dataclass(frozen=True)
class ExpMultihypSettings:
    """params.yaml ``exp_multihyp:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``multihyp.json`` and ``multihyp.png`` go.
    metrics : list of {"bleu", "chrf", "ter"}
        Sentence-level similarity functions (sacrebleu defaults, ``uamt.lexical``).
    max_sources_per_lp : int or None
        Source segments sampled per LP (all rated systems of each are kept); None = all.
    max_pseudo_refs : int or None
        Pseudo-references per segment, sampled from the other systems; None = all.
    seed : int
        Seed of both samples.
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    metrics: tuple[str, ...] = ("bleu", "chrf", "ter")
    max_sources_per_lp: int | None = 60
    max_pseudo_refs: int | None = 5
    seed: int = 0


@dataclass(frozen=True)
class ExpMultihypConfig:
    exp: ExpMultihypSettings
    pipeline: PipelineConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpMultihypConfig:
    return ExpMultihypConfig(load_section(ExpMultihypSettings, NAME, path), load_pipeline(path))


def run(cfg: ExpMultihypConfig) -> dict[str, Path]:
    da, eten = multihyp.read_inputs(cfg.pipeline.prepared_dir)
    result = multihyp.analyse(
        da,
        eten,
        metrics=cfg.exp.metrics,
        max_sources_per_lp=cfg.exp.max_sources_per_lp,
        max_pseudo_refs=cfg.exp.max_pseudo_refs,
        seed=cfg.exp.seed,
    )
    return {
        "result": write_result(multihyp.NAME, result, cfg.exp.metrics_dir),
        "figure": save_figure(multihyp.figure(result), Path(cfg.exp.figures_dir) / FIGURE),
    }


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
