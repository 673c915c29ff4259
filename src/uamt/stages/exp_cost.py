"""Stage ``exp_cost``: training and inference time of every method on one slice (uamt.experiments.cost).

Samples ``rows`` d_q / d_e rows, ``dev_rows`` dev rows and ``test_rows`` test rows of
``pipeline.datasets``, trains every method into a temporary folder with the ``train_base`` /
``train_dup`` settings, and writes ``metrics/experiments/cost.json`` and ``reports/figures/cost.png``.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments import cost
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, write_result
from uamt.models.config import TrainConfig, load_train_config
from uamt.pipeline import PipelineConfig, load_pipeline, open_features, read_split
from uamt.stages._cli import stage_main

NAME = "exp_cost"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpCostSettings(cost.CostSettings):
    """params.yaml ``exp_cost:`` section: :class:`uamt.experiments.cost.CostSettings` + output folders."""

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR


@dataclass(frozen=True)
class ExpCostConfig:
    exp: ExpCostSettings
    pipeline: PipelineConfig
    train: TrainConfig
    dup: TrainConfig
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpCostConfig:
    return ExpCostConfig(
        load_section(ExpCostSettings, NAME, path),
        load_pipeline(path),
        load_train_config("point", path),
        load_train_config("dup", path),
        load_section(EncodeConfig, "encode", path),
    )


def run(cfg: ExpCostConfig) -> dict[str, Path]:
    from uamt.encoders import get_encoder

    exp, pipe = cfg.exp, cfg.pipeline
    settings = cost.CostSettings(
        **{k: v for k, v in asdict(exp).items() if k not in ("metrics_dir", "figures_dir")}
    )
    splits = {
        "train": (cfg.train.train_split, exp.rows),
        "dup_train": (cfg.dup.train_split, exp.rows),
        "dev": (cfg.train.dev_split, exp.dev_rows),
        "test": ("test", exp.test_rows),
    }
    tables = {
        name: cost.sample_rows(
            read_split(pipe.prepared_dir, split, pipe.datasets), n, exp.seed, f"{pipe.prepared_dir}/{split}"
        )
        for name, (split, n) in splits.items()
    }
    features = open_features(cfg.encode)
    encoder = getattr(features, "encoder", None) or get_encoder(cfg.encode.encoder)
    with tempfile.TemporaryDirectory(prefix="uamt-cost-") as workdir:
        result = cost.measure_costs(
            settings, cfg.train, cfg.dup, tables, features, encoder, workdir, log=log.info
        )
    return {
        "result": write_result(cost.NAME, result, exp.metrics_dir),
        "figure": cost.plot_costs(result, Path(exp.figures_dir) / cost.FIGURE),
    }


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
