"""Stage ``calibrate_campaigns``: the served models' calibration keyed by LP x annotation campaign.

For each registered model (``pipeline.register_method`` and its QE model) the served calibration's
family fitted again on the same calibration rows with the key ``lp|dataset``
(:func:`uamt.campaigns.calibrate_campaigns`), written to ``calibration_campaigns/<model>.json``
and registered with the model: a request naming its campaign gets it.  A campaign with fewer than
``calibrate_campaigns.min_rows`` calibration rows is not served (``benchmarks/campaign_rows.py``).
How the calibrations do is measured after ``register`` (stage ``evaluate_campaigns``): no gate reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.campaigns import CAMPAIGN_CALIBRATION_DIR, DEFAULT_MIN_CAMPAIGN_ROWS, calibrate_campaigns
from uamt.core.config import DEFAULT_PARAMS, ConfigError, load_section
from uamt.pipeline_config import CALIBRATION_DIR, PipelineConfig, load_pipeline
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "calibrate_campaigns"


@dataclass(frozen=True)
class CampaignSettings:
    """The ``calibrate_campaigns`` section.

    min_rows: fewest calibration rows a campaign needs for a calibration of its own; one with fewer
        is not served (listed in ``metrics/campaigns.json`` as ``below_min_rows``).
    """

    min_rows: int = DEFAULT_MIN_CAMPAIGN_ROWS

    def __post_init__(self) -> None:
        if isinstance(self.min_rows, bool) or not isinstance(self.min_rows, int) or self.min_rows < 2:
            raise ConfigError(f"{NAME}.min_rows must be an integer >= 2, got {self.min_rows!r}")


@dataclass(frozen=True)
class CalibrateCampaignsConfig:
    pipeline: PipelineConfig
    evaluate: EvaluationSettings
    campaigns: CampaignSettings = CampaignSettings()
    calibration_dir: str = CALIBRATION_DIR
    out_dir: str = CAMPAIGN_CALIBRATION_DIR


def load_config(path: str | Path = DEFAULT_PARAMS) -> CalibrateCampaignsConfig:
    return CalibrateCampaignsConfig(
        load_pipeline(path), load_section(EvaluationSettings, "evaluate", path), load_section(CampaignSettings, NAME, path)
    )


def run(cfg: CalibrateCampaignsConfig) -> dict[str, Path]:
    """Fit and save every served model's per-campaign calibration; returns ``{model: path}``."""
    return calibrate_campaigns(cfg.pipeline, cfg.evaluate, cfg.calibration_dir, cfg.out_dir, cfg.campaigns.min_rows)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
