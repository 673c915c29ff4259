"""Stage ``evaluate_ood``: every model on the out-of-domain split (TED, biomedical), after ``register``.

No promotion gate reads the out-of-domain numbers, so they are measured once the champions are
registered: the stage encodes the split's texts (``encode`` leaves them out), measures each
model's served ``calibration/<model>.json`` there, writes ``predictions/ood``, ``metrics/ood.json``,
``metrics/held_out.json`` (the LPs without a dev calibration of their own: the
``unseen_coverage_error`` goal) and ``plots/sharpness.png``
(:func:`uamt.ood_evaluation.evaluate_ood_models`), and attaches them to the registered versions'
MLflow runs (:func:`uamt.registry.register.attach_to_registered`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.encoders import EncodeConfig
from uamt.ood_evaluation import evaluate_ood_models, registered_metrics
from uamt.pipeline_config import CALIBRATION_DIR, PipelineConfig, load_pipeline
from uamt.registry.register import RegisterSettings, attach_to_registered
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "evaluate_ood"


@dataclass(frozen=True)
class EvaluateOodConfig:
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    encode: EncodeConfig
    register: RegisterSettings
    calibration_dir: str = CALIBRATION_DIR


def load_config(path: str | Path = DEFAULT_PARAMS) -> EvaluateOodConfig:
    return EvaluateOodConfig(
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
        load_section(EncodeConfig, "encode", path),
        load_section(RegisterSettings, "register", path),
    )


def run(cfg: EvaluateOodConfig) -> dict:
    """Write the out-of-domain predictions, metrics and plot, attach them to the registered
    versions; returns the paths and the versions completed."""
    out = evaluate_ood_models(cfg.pipeline, cfg.evaluate, cfg.encode, cfg.calibration_dir)
    out["attached_to"] = attach_to_registered(
        cfg.register,
        registered_metrics(cfg.pipeline.metrics_dir),
        {"metrics": [out["ood"], out["held_out"]], "plots": [out["sharpness"]]},
    )
    return out


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
