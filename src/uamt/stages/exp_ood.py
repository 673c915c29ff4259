"""Stage ``exp_ood``: sharpness in vs out of domain (news vs TED) per method and LP (uamt.experiments.ood).

Reads ``metrics/{test,ood}.json`` and ``predictions/{test,ood}/<method>.parquet`` from ``evaluate``
and ``calibration/<method>.json`` from ``calibrate``;
writes ``metrics/experiments/ood.json`` and ``reports/figures/ood_sharpness.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.experiments import ood
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, write_result
from uamt.pipeline import CALIBRATION_DIR, PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "exp_ood"


@dataclass(frozen=True)
class ExpOodSettings:
    """params.yaml ``exp_ood:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``ood.json`` and ``ood_sharpness.png`` go.
    flat_tolerance : float
        A relative sharpness change within +-this counts as flat (neither rise nor drop).
    n_boot : int
        Bootstrap resamples for the CI of the raw-variance change (0 = none).
    seed : int
        Seed of the bootstrap.
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    flat_tolerance: float = 0.10
    n_boot: int = 1000
    seed: int = 13


@dataclass(frozen=True)
class ExpOodConfig:
    exp: ExpOodSettings
    pipeline: PipelineConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpOodConfig:
    return ExpOodConfig(load_section(ExpOodSettings, NAME, path), load_pipeline(path))


def run(cfg: ExpOodConfig) -> dict[str, Path]:
    test_metrics, ood_metrics, test_tables, ood_tables, calibrations = ood.read_inputs(
        cfg.pipeline.metrics_dir, cfg.pipeline.predictions_dir, CALIBRATION_DIR
    )
    result = ood.ood_analysis(
        test_metrics,
        ood_metrics,
        test_tables,
        ood_tables,
        flat_tolerance=cfg.exp.flat_tolerance,
        n_boot=cfg.exp.n_boot,
        seed=cfg.exp.seed,
        calibrations=calibrations,
    )
    return {
        "result": write_result(ood.NAME, result, cfg.exp.metrics_dir),
        "figure": ood.plot_sharpness(result, Path(cfg.exp.figures_dir) / ood.FIGURE),
    }


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
