"""Stage ``train_base``: train the base model M_Q and every single-stage uncertainty method.

Reads the ``d_q`` (training) and ``dev`` (early stopping) rows of ``pipeline.datasets`` from the
prepared splits, the cached embeddings of the ``encode`` section, and writes one model folder per
method of ``pipeline.methods`` under ``pipeline.models_dir``, plus a reference-free (QE) model
``<method>_qe`` for each of ``pipeline.qe_methods`` (what ``uamt score`` uses without references).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.models.config import TrainConfig, load_train_config
from uamt.pipeline import QE_SUFFIX, PipelineConfig, load_pipeline, open_features, read_split
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


#: Methods whose training is *identical* to another's (same network, loss, data and seed): only
#: inference differs (MC dropout passes), so their weights are the source method's, copied.
SAME_TRAINING = {"mcd_head": "point", "hts_mcd": "hts"}


def training_order(methods: tuple[str, ...]) -> list[str]:
    """``methods`` with every source of :data:`SAME_TRAINING` before the methods derived from it."""
    first = [m for m in methods if m not in SAME_TRAINING or SAME_TRAINING[m] not in methods]
    return first + [m for m in methods if m not in first]


def derive(source_dir: Path, method: str, out_dir: Path) -> Path:
    """Copy the trained ``source_dir`` as a model of ``method`` (atomically; manifest says the method)."""
    import shutil

    from uamt.models.api import atomic_dir, read_manifest, write_manifest

    meta = read_manifest(source_dir)
    with atomic_dir(out_dir) as tmp:
        for item in source_dir.iterdir():
            if item.name != "model.json":
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
        meta = {
            **meta,
            "method": method,
            "config": {**meta["config"], "method": method},
            "derived_from": str(source_dir),
        }
        write_manifest(tmp, meta)
    return out_dir


def run(cfg: TrainBaseConfig) -> dict[str, Path]:
    """Train each method of ``cfg.pipeline.methods``, then each of ``qe_methods`` reference-free
    (as ``<method>_qe``); returns ``{model name: model_dir}``."""
    from uamt.models.api import train

    pipe = cfg.pipeline
    train_df = read_split(pipe.prepared_dir, cfg.train.train_split, pipe.datasets)
    dev_df = read_split(pipe.prepared_dir, cfg.train.dev_split, pipe.datasets)
    features = open_features(cfg.encode)
    out: dict[str, Path] = {}
    variants = [(pipe.methods, "", cfg.train), (pipe.qe_methods, QE_SUFFIX, cfg.train.replace(reference_free=True))]
    for methods, suffix, train_cfg in variants:
        for method in training_order(methods):
            name, started = f"{method}{suffix}", time.perf_counter()
            source = f"{SAME_TRAINING.get(method)}{suffix}"
            if source in out:
                out[name] = derive(out[source], method, pipe.model_dir(name))
                log.info("%s: same training as %s, weights reused", name, source)
                continue
            out[name] = train(method, train_cfg, train_df, dev_df, features, pipe.model_dir(name))
            log.info("trained %s on %d rows in %.1f s", name, len(train_df), time.perf_counter() - started)
    return out


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
