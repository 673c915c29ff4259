"""Stage ``train_base``: train the base model M_Q and every single-stage uncertainty method.

Reads the ``d_q`` (training) and ``dev`` (early stopping) rows of ``pipeline.datasets`` from the
prepared splits, the cached embeddings of the ``encode`` section, and writes one model folder per
method of ``pipeline.methods`` under ``pipeline.models_dir``, plus a reference-free (QE) model
``<method>_qe`` for each of ``pipeline.qe_methods`` (what ``uamt score`` uses without references).
Methods that share another's training get its weights copied (:mod:`uamt.models.shared_training`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from uamt.challenge import with_synthetic_failures
from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.core.naming import QE_MODEL_SUFFIX
from uamt.encoders import EncodeConfig
from uamt.models.config import TrainConfig, load_train_config
from uamt.models.shared_training import train_jobs
from uamt.pipeline_config import PipelineConfig, load_pipeline, open_features, paragraph_rows, read_split
from uamt.stages._cli import stage_main

NAME = "train_base"


@dataclass(frozen=True)
class TrainBaseConfig:
    pipeline: PipelineConfig
    train: TrainConfig
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> TrainBaseConfig:
    return TrainBaseConfig(
        load_pipeline(path), load_train_config("point", path), load_section(EncodeConfig, "encode", path)
    )


def training_inputs(cfg: TrainBaseConfig) -> tuple:
    """``(train_df, dev_df, features, paragraph_df)``: d_q with the synthetic failure rows, dev, the
    cached embeddings, the rows the paragraph blend is fitted on (:func:`paragraph_rows`)."""
    pipe = cfg.pipeline
    train_df = with_synthetic_failures(
        read_split(pipe.prepared_dir, cfg.train.train_split, pipe.datasets), cfg.train.synthetic_failures, cfg.train.seed
    )
    dev_df = read_split(pipe.prepared_dir, cfg.train.dev_split, pipe.datasets)
    return train_df, dev_df, open_features(cfg.encode), paragraph_rows(pipe, cfg.train, dev_df)


def run(cfg: TrainBaseConfig) -> dict[str, Path]:
    """Train each method of ``cfg.pipeline.methods``, then each of ``qe_methods`` reference-free
    (as ``<method>_qe``), in ``pipeline.workers`` processes (the same weights for any number);
    returns ``{model name: model_dir}``."""
    pipe = cfg.pipeline
    qe_cfg = cfg.train.as_reference_free()
    jobs = [(method, cfg.train, "") for method in pipe.methods]
    jobs += [(method, qe_cfg, QE_MODEL_SUFFIX) for method in pipe.qe_methods]
    return train_jobs(jobs, functools.partial(training_inputs, cfg), pipe.model_dir, pipe.workers)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
