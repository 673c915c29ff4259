"""Stage ``exp_noisy_refs``: does the lower-uncertainty reference coincide with the better-rated one?
(uamt.experiments.noisy_refs, *Better Uncertainty Quantification* §5.5).

Reads the prepared held-out splits (``dev`` + ``test``), the trained ``models/<method>``, their
``calibration/<method>.json`` and the embedding cache; writes ``metrics/experiments/noisy_refs.json``
and ``reports/figures/noisy_refs.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from uamt.calibrated import load_calibrations
from uamt.config import DEFAULT_PARAMS, ConfigError, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments import noisy_refs
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, save_figure, write_result
from uamt.experiments.references import read_rows
from uamt.pipeline import (
    CALIBRATION_DIR,
    PipelineConfig,
    load_models,
    load_pipeline,
    open_features,
)
from uamt.stages._cli import stage_main

NAME = "exp_noisy_refs"
FIGURE = "noisy_refs.png"


@dataclass(frozen=True)
class ExpNoisyRefsSettings:
    """params.yaml ``exp_noisy_refs:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``noisy_refs.json`` and ``noisy_refs.png`` go.
    dataset, lp : str
        Rows analysed: a dataset whose references are MQM-rated pseudo-systems ``ref-X``.
    references : tuple of str
        Reference names in the order of the system rows' ``refs`` (WMT21 en-de: A, C, D).
    splits : tuple of str
        Prepared splits used; never the training pools ``d_q`` / ``d_e``.
    methods : tuple of str
        Pipeline models (``models/<method>``); ``point`` is reported as skipped (no sigma).
    thresholds : tuple of float
        MQM gaps MQM(r_good) - MQM(r_bad) > t reported (the paper: 10).
    min_segments : int
        The headline is the strictest threshold keeping at least this many segments.
    calibration_dir : str
        ``<dir>/<method>.json`` (calibrate stage) for the calibrated-sigma pick.
    mc_samples : int or null
        MC-dropout passes (null: each model's own ``mc_samples``).
    n_boot, seed : int
        Segment-bootstrap resamples and their seed.
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    dataset: str = "wmt21_mqm"
    lp: str = "en-de"
    references: tuple[str, ...] = ("A", "C", "D")
    splits: tuple[str, ...] = ("dev", "test")
    methods: tuple[str, ...] = ("point", "mcd_head", "ensemble", "hts", "hts_mcd", "dup")
    thresholds: tuple[float, ...] = (10.0, 5.0, 2.0, 1.0, 0.0)
    min_segments: int = 30
    calibration_dir: str = CALIBRATION_DIR
    mc_samples: int | None = None
    n_boot: int = 2000
    seed: int = 13

    def __post_init__(self) -> None:
        from uamt.models.specs import METHODS

        for method in self.methods:
            if method not in METHODS:
                raise ConfigError(f"{NAME}: method={method!r} not supported; choose from {sorted(METHODS)}")
        for split in self.splits:
            if split in ("d_q", "d_e"):
                raise ConfigError(f"{NAME}.splits: {split!r} is a training pool; use held-out splits")
        if not self.thresholds:
            raise ConfigError(f"{NAME}.thresholds is empty")


@dataclass(frozen=True)
class ExpNoisyRefsConfig:
    exp: ExpNoisyRefsSettings
    pipeline: PipelineConfig
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpNoisyRefsConfig:
    return ExpNoisyRefsConfig(
        load_section(ExpNoisyRefsSettings, NAME, path),
        load_pipeline(path),
        load_section(EncodeConfig, "encode", path),
    )


def run(cfg: ExpNoisyRefsConfig) -> dict[str, Path]:
    exp, pipe = cfg.exp, cfg.pipeline
    frame = pd.concat(
        [read_rows(pipe.prepared_dir, split, exp.dataset, exp.lp) for split in exp.splits], ignore_index=True
    )
    models = load_models(pipe, exp.methods)
    calibrations = load_calibrations(exp.calibration_dir, [m for m in exp.methods if m not in noisy_refs.NO_SIGMA])
    timings: dict[str, float] = {}
    result = noisy_refs.run_noisy_refs(
        models,
        frame,
        open_features(cfg.encode),
        calibrations=calibrations,
        names=exp.references,
        thresholds=exp.thresholds,
        min_segments=exp.min_segments,
        n_samples=exp.mc_samples,
        n_boot=exp.n_boot,
        seed=exp.seed,
        timings=timings,
    )
    result["runtime_s"] = {method: round(seconds, 1) for method, seconds in timings.items()}
    return {
        "result": write_result(noisy_refs.NAME, result, exp.metrics_dir),
        "figure": save_figure(noisy_refs.figure(result), Path(exp.figures_dir) / FIGURE),
    }


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
