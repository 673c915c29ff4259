"""Stage ``exp_methods``: the method comparison of *Better Uncertainty Quantification* Tables 1–3 (with
the fixed-variance baseline of *Uncertainty-Aware MT Evaluation* Table 2) on WMT21 DA and WMT21 MQM.

Reads the prepared splits, the embedding cache (DA texts are encoded on demand), the pipeline's MQM
models and predictions (``models/<method>``, ``predictions/{dev,test}``); trains what is missing under
``exp_methods.models_dir``; writes ``metrics/experiments/methods.json`` and
``reports/figures/methods_*.png``.  The work is :mod:`uamt.experiments.methods`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments.methods import MethodsSettings, write_findings
from uamt.models.config import TrainConfig, load_train_config
from uamt.pipeline_config import load_pipeline
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "exp_methods"


@dataclass(frozen=True)
class ExpMethodsConfig:
    """The ``exp_methods`` section plus what it shares with the pipeline: the ``train_base`` /
    ``train_dup`` hyper-parameters, the ``evaluate`` calibration settings, the encoder and cache."""

    methods: MethodsSettings
    base: TrainConfig
    dup: TrainConfig
    evaluate: EvaluationSettings
    encode: EncodeConfig
    prepared_dir: str = "data/prepared"


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpMethodsConfig:
    return ExpMethodsConfig(
        methods=load_section(MethodsSettings, NAME, path),
        base=load_train_config("point", path),
        dup=load_train_config("dup", path),
        evaluate=load_section(EvaluationSettings, "evaluate", path),
        encode=load_section(EncodeConfig, "encode", path),
        prepared_dir=load_pipeline(path).prepared_dir,
    )


def run(cfg: ExpMethodsConfig) -> dict[str, Path]:
    """Write ``methods.json`` and the figures; returns ``{"metrics": ..., <figure stem>: ...}``."""
    return write_findings(cfg.methods, cfg.base, cfg.dup, cfg.encode, cfg.prepared_dir, cfg.evaluate)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
