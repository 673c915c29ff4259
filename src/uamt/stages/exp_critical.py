"""Stage ``exp_critical``: critical-error retrieval by q_hat, mu and risk, with other systems' outputs
as pseudo-references and with the human reference (uamt.experiments.critical; paper §5.5, App. F).

Reads the MQM rows of ``data/prepared/{dev,test}.parquet``, the models ``models/<method>`` and the
pipeline's ``calibration/<method>.json`` (standard setting), embeddings from ``cache/embeddings``;
writes ``metrics/experiments/critical.json`` and ``reports/figures/critical_{recall,precision}.png``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from uamt.calibrated import load_calibrations
from uamt.config import DEFAULT_PARAMS, ConfigError, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments import critical
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, save_figure, write_result
from uamt.pipeline import (
    CALIBRATION_DIR,
    PipelineConfig,
    load_models,
    load_pipeline,
    open_features,
    read_split,
)
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "exp_critical"
FIGURES = {"recall": "critical_recall.png", "precision": "critical_precision.png"}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpCriticalSettings:
    """params.yaml ``exp_critical:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``critical.json`` and the two figures go.
    dataset : str
        MQM data the pipeline's models were trained and calibrated on (must be in pipeline.datasets).
    point_method : str
        Model whose prediction is the point estimate q_hat.
    uncertainty_methods : list of str
        Models whose mu and calibrated sigma give the mu and risk rankings.
    target_percents : list of int
        The worst n % per LP (length-normalised MQM) are the retrieval targets.
    max_n_fraction : float
        Recall/Precision curves for N = 1..ceil(max_n_fraction x rows of the LP).
    max_pseudo_refs : int or None
        Pseudo-references per segment (seeded sample of the other systems); None = all.
    seed : int
    scales : list of {"raw", "per_word"}
        Rank by the predicted MQM score (paper) and/or by the prediction per MT word.
    calibration_dir : str
        The pipeline's calibrations (standard setting).
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    dataset: str = "wmt21_mqm"
    point_method: str = "point"
    uncertainty_methods: tuple[str, ...] = ("hts", "mcd_head")
    target_percents: tuple[int, ...] = critical.TARGET_PERCENTS
    max_n_fraction: float = 0.2
    max_pseudo_refs: int | None = None
    seed: int = 0
    scales: tuple[str, ...] = critical.SCALES
    calibration_dir: str = CALIBRATION_DIR


@dataclass(frozen=True)
class ExpCriticalConfig:
    exp: ExpCriticalSettings
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpCriticalConfig:
    cfg = ExpCriticalConfig(
        load_section(ExpCriticalSettings, NAME, path),
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
        load_section(EncodeConfig, "encode", path),
    )
    if cfg.exp.dataset not in cfg.pipeline.datasets:
        raise ConfigError(
            f"{path}:{NAME}.dataset={cfg.exp.dataset!r} is not in pipeline.datasets "
            f"{list(cfg.pipeline.datasets)}: the models were not trained on it"
        )
    return cfg


def run(cfg: ExpCriticalConfig) -> dict[str, Path]:
    exp, pipe = cfg.exp, cfg.pipeline
    models = load_models(pipe, (exp.point_method, *exp.uncertainty_methods))
    calibrations = load_calibrations(exp.calibration_dir, exp.uncertainty_methods)
    result = critical.analyse(
        read_split(pipe.prepared_dir, "dev", (exp.dataset,)),
        read_split(pipe.prepared_dir, "test", (exp.dataset,)),
        models,
        open_features(cfg.encode),
        point_method=exp.point_method,
        uncertainty_methods=exp.uncertainty_methods,
        reference_calibrations=calibrations,
        evaluation_settings=cfg.evaluate,
        target_percents=exp.target_percents,
        max_n_fraction=exp.max_n_fraction,
        max_pseudo_refs=exp.max_pseudo_refs,
        seed=exp.seed,
        scales=exp.scales,
    )
    out = {"result": write_result(critical.NAME, result, exp.metrics_dir)}
    for quantity, name in FIGURES.items():
        out[quantity] = save_figure(critical.figure(result, quantity), Path(exp.figures_dir) / name)
    return out


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
