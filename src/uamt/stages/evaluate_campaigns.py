"""Stage ``evaluate_campaigns``: the served models' per-campaign calibrations measured, after ``register``.

No promotion gate reads how the campaign-keyed calibrations (stage ``calibrate_campaigns``, shipped
with the registered models) do, so they are measured once the champions are registered:
``metrics/campaigns.json`` puts each beside its model's per-LP calibration, per LP x campaign and on
the served goals, on the calibration rows and on test (:func:`uamt.campaigns.evaluate_campaigns`),
and the test summary is attached to the registered versions' MLflow runs with the file
(:func:`uamt.registry.register.attach_to_registered`, tag ``campaigns_evaluated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.campaigns import CAMPAIGN_CALIBRATION_DIR, evaluate_campaigns
from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.pipeline_config import CALIBRATION_DIR, PipelineConfig, load_pipeline
from uamt.registry.register import CAMPAIGNS_TAG, RegisterSettings, attach_to_registered, flat_metrics
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "evaluate_campaigns"
METRICS_FILE = "campaigns.json"


@dataclass(frozen=True)
class EvaluateCampaignsConfig:
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    register: RegisterSettings
    calibration_dir: str = CALIBRATION_DIR
    campaigns_dir: str = CAMPAIGN_CALIBRATION_DIR


def load_config(path: str | Path = DEFAULT_PARAMS) -> EvaluateCampaignsConfig:
    return EvaluateCampaignsConfig(
        load_pipeline(path),
        load_section(EvaluationSettings, "evaluate", path),
        load_section(RegisterSettings, "register", path),
    )


def run(cfg: EvaluateCampaignsConfig) -> dict:
    """Write ``metrics/campaigns.json`` and attach it to the registered versions; returns the
    metrics path and the versions completed."""
    path = Path(cfg.pipeline.metrics_dir) / METRICS_FILE
    metrics = evaluate_campaigns(cfg.pipeline, cfg.evaluate, cfg.calibration_dir, cfg.campaigns_dir, path)
    # per served model and calibration (per_lp, per_campaign): coverage, width and CRPS on test
    summaries = flat_metrics({model: block["summary"] for model, block in metrics.items()}, "campaigns")
    attached = attach_to_registered(cfg.register, summaries, {"metrics": [path]}, tag=CAMPAIGNS_TAG)
    return {"campaigns": path, "attached_to": attached}


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
