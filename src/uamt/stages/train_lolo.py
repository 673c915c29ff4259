"""Stage ``train_lolo``: every model of ``train_lolo.models`` retrained without each language pair.

Reads what ``train_base`` reads (the ``d_q`` and ``dev`` rows of ``pipeline.datasets``, the cached
embeddings, the ``train_base`` hyper-parameters) and writes ``<train_lolo.out_dir>/<lp>/<model>``
for each LP of the training rows, plus the manifest the calibrate stage reads: it fits these models'
unseen-LP widening with the model held out as well as the calibration
(:mod:`uamt.leave_one_lp_out`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.leave_one_lp_out import LeaveOneLpOutConfig, train_leave_one_lp_out
from uamt.models.config import TrainConfig, load_train_config
from uamt.pipeline_config import PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main

NAME = "train_lolo"


@dataclass(frozen=True)
class TrainLoloConfig:
    pipeline: PipelineConfig
    train: TrainConfig
    encode: EncodeConfig
    lolo: LeaveOneLpOutConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> TrainLoloConfig:
    return TrainLoloConfig(
        load_pipeline(path),
        load_train_config("point", path),
        load_section(EncodeConfig, "encode", path),
        load_section(LeaveOneLpOutConfig, "train_lolo", path),
    )


def run(cfg: TrainLoloConfig) -> dict[str, dict[str, Path]]:
    """Train the leave-one-LP-out models; returns ``{model: {held-out lp: model folder}}``."""
    return train_leave_one_lp_out(cfg.pipeline, cfg.train, cfg.encode, cfg.lolo)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
