"""Stage ``exp_references``: number of references, S-1 / S-2 / Mul (uamt.experiments.references).

Reads the prepared ``dev`` and ``test`` splits, the trained ``models/<method>`` and the embedding
cache; writes ``metrics/experiments/references.json`` and ``reports/figures/references_sharpness.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from uamt.config import DEFAULT_PARAMS, ConfigError, load_section
from uamt.encoders import EncodeConfig
from uamt.experiments import references
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, save_figure, write_result
from uamt.pipeline import PipelineConfig, load_models, load_pipeline, open_features
from uamt.stages._cli import stage_main
from uamt.uncertainty import EvaluationSettings

NAME = "exp_references"
FIGURE = "references_sharpness.png"


@dataclass(frozen=True)
class ExpReferencesSettings:
    """params.yaml ``exp_references:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``references.json`` and ``references_sharpness.png`` go.
    dataset, lp : str
        The rows analysed (a dataset whose references are rated pseudo-systems ``ref-X``).
    references : tuple of str
        Reference names in the order of the system rows' ``refs`` (WMT21 en-de: A, C, D).
    methods : tuple of str
        Reference-based pipeline models to analyse (``models/<method>``).
    test_split, dev_split : str
        Evaluated split and the split every configuration is calibrated on.
    seed : int
        Seed of the S-N reference sampling (the same draws for every method).
    draws : int
        S-N draws averaged (each calibrated on its own dev draw).
    mc_samples : int or null
        MC-dropout passes (null: each model's own ``mc_samples``).
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    dataset: str = "wmt21_mqm"
    lp: str = "en-de"
    references: tuple[str, ...] = ("A", "C", "D")
    methods: tuple[str, ...] = ("point", "mcd_head", "ensemble", "hts", "hts_mcd", "dup")
    test_split: str = "test"
    dev_split: str = "dev"
    seed: int = 13
    draws: int = 5
    mc_samples: int | None = None

    def __post_init__(self) -> None:
        from uamt.models.specs import METHODS

        for method in self.methods:
            if method not in METHODS:
                raise ConfigError(f"{NAME}: method={method!r} not supported; choose from {sorted(METHODS)}")
        if self.draws < 1:
            raise ConfigError(f"{NAME}.draws={self.draws} must be >= 1")


@dataclass(frozen=True)
class ExpReferencesConfig:
    exp: ExpReferencesSettings
    pipeline: PipelineConfig
    encode: EncodeConfig
    evaluate: EvaluationSettings


def load_config(path: str | Path = DEFAULT_PARAMS) -> ExpReferencesConfig:
    return ExpReferencesConfig(
        load_section(ExpReferencesSettings, NAME, path),
        load_pipeline(path),
        load_section(EncodeConfig, "encode", path),
        load_section(EvaluationSettings, "evaluate", path),
    )


def run(cfg: ExpReferencesConfig) -> dict[str, Path]:
    exp, pipe = cfg.exp, cfg.pipeline
    models = load_models(pipe, exp.methods)
    timings: dict[str, float] = {}
    result = references.run_references(
        models,
        references.read_rows(pipe.prepared_dir, exp.test_split, exp.dataset, exp.lp),
        references.read_rows(pipe.prepared_dir, exp.dev_split, exp.dataset, exp.lp),
        open_features(cfg.encode),
        names=exp.references,
        seed=exp.seed,
        draws=exp.draws,
        n_samples=exp.mc_samples,
        settings=cfg.evaluate,
        timings=timings,
    )
    result["data"].update(test_split=exp.test_split, dev_split=exp.dev_split)
    result["runtime_s"] = {method: round(seconds, 1) for method, seconds in timings.items()}
    return {
        "result": write_result(references.NAME, result, exp.metrics_dir),
        "figure": save_figure(references.figure(result), Path(exp.figures_dir) / FIGURE),
    }


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
