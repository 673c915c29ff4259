"""Stage ``train_dup``: DUP's second stage M_E, trained on D_E to predict the base model's error.

The base model M_Q is ``pipeline.dup_base`` from ``train_base``; the ``train_dup`` section sets the
loss (abs / sq / hts), the bottleneck size and the pool (``d_e``), over ``train_base``'s settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.models.config import TrainConfig, load_train_config
from uamt.pipeline_config import PipelineConfig, load_pipeline, open_features, read_split
from uamt.stages._cli import stage_main

NAME = "train_dup"


@dataclass(frozen=True)
class TrainDupConfig:
    pipeline: PipelineConfig
    train: TrainConfig
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> TrainDupConfig:
    return TrainDupConfig(
        load_pipeline(path), load_train_config("dup", path), load_section(EncodeConfig, "encode", path)
    )


def run(cfg: TrainDupConfig) -> Path:
    from uamt.models.api import train

    pipe = cfg.pipeline
    train_df = read_split(pipe.prepared_dir, cfg.train.train_split, pipe.datasets)
    dev_df = read_split(pipe.prepared_dir, cfg.train.dev_split, pipe.datasets)
    return train(
        "dup",
        cfg.train,
        train_df,
        dev_df,
        open_features(cfg.encode),
        pipe.model_dir("dup"),
        base_model_dir=pipe.model_dir(pipe.dup_base),
    )


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
