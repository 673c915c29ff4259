"""Stage ``register``: log the run to MLflow, register the model as a new version, gate it.

The model of ``pipeline.register_method`` (and the QE model of ``pipeline.register_qe_method``, as
``<model_name>-qe``) is registered, gated against the champion and aliased only if the gate passes
(:mod:`uamt.registry.register`); writes ``mlflow/registration.json``, beside the registry and not in
git, so that a fresh clone always registers.  A registry that existed and is gone is an error; a
new one is only created with ``register.allow_new_registry: true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.pipeline_config import CALIBRATION_DIR, PipelineConfig, load_pipeline
from uamt.registry.register import RegisterSettings, register_pipeline_models
from uamt.stages._cli import stage_main

NAME = "register"


@dataclass(frozen=True)
class RegisterConfig:
    pipeline: PipelineConfig
    register: RegisterSettings
    encode: EncodeConfig
    calibration_dir: str = CALIBRATION_DIR


def load_config(path: str | Path = DEFAULT_PARAMS) -> RegisterConfig:
    return RegisterConfig(
        load_pipeline(path),
        load_section(RegisterSettings, "register", path),
        load_section(EncodeConfig, "encode", path),
    )


def run(cfg: RegisterConfig) -> dict:
    """Register and gate the models; returns the summary written to ``mlflow/registration.json``."""
    return register_pipeline_models(cfg.pipeline, cfg.register, cfg.encode, cfg.calibration_dir)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
