"""Stage ``train_base``: train the base model M_Q and every single-stage uncertainty method.

Reads the ``d_q`` (training) and ``dev`` (early stopping) rows of ``pipeline.datasets`` from the
prepared splits, the cached embeddings of the ``encode`` section, and writes one model folder per
method of ``pipeline.methods`` under ``pipeline.models_dir``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.models.config import TrainConfig, load_train_config
from uamt.pipeline import PipelineConfig, load_pipeline, open_features, read_split
from uamt.stages._cli import stage_main
from uamt.stages.encode import EncodeConfig

NAME = "train_base"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainBaseConfig:
    pipeline: PipelineConfig
    train: TrainConfig
    encode: EncodeConfig


def load_config(path: str | Path = DEFAULT_PARAMS) -> TrainBaseConfig:
    return TrainBaseConfig(
        load_pipeline(path), load_train_config("point", path), load_section(EncodeConfig, "encode", path)
    )


def run(cfg: TrainBaseConfig) -> dict[str, Path]:
    """Train each method of ``cfg.pipeline.methods``; returns ``{method: model_dir}``."""
    from uamt.models.api import train

    pipe = cfg.pipeline
    train_df = read_split(pipe.prepared_dir, cfg.train.train_split, pipe.datasets)
    dev_df = read_split(pipe.prepared_dir, cfg.train.dev_split, pipe.datasets)
    features = open_features(cfg.encode)
    out = {}
    for method in pipe.methods:
        started = time.perf_counter()
        out[method] = train(method, cfg.train, train_df, dev_df, features, pipe.model_dir(method))
        log.info("trained %s on %d rows in %.1f s", method, len(train_df), time.perf_counter() - started)
    return out


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
