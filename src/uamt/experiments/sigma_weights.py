"""The pinned σ weights, re-checked after ``register`` (stage ``exp_sigma_weights``).

The served distribution tempers each model's σ towards its LP's median, ``m_LP^(1-λ) * σ^λ``
(:mod:`uamt.uncertainty.tempering`; λ = 1 the model's own σ, 0 one σ per LP).  The calibrate stage
used to choose λ from a grid by the CRPS cross-fitted over the calibration rows' documents, and a
λ of its own for pairs the calibration never saw by the CRPS of LPs held out of model and
calibration -- 54 % of a model's calibration time, on the critical path to ``register``
(docs/pipeline.md, "Where a cold run's time goes").  Six σ-models chose λ = 0 for both on two
hosts, so ``params.yaml`` pins it for them (``evaluate.pinned_sigma_weights``) and ``calibrate``
fits one distribution for each; the others (DUP, whose choice follows the candidate its dev rule
picks, and is cheap) still choose from ``evaluate.sigma_weights``.

This analysis makes the same choices the calibrate stage made before the pin -- the same function
(:func:`uamt.model_evaluation.fit_with_choices`) on the same calibration rows, with the grid of
``exp_sigma_weights.weights`` -- and reports, per model, each weight's CRPS, the one chosen and
whether the served (pinned) weight is still it.  A model whose pin is no longer chosen is logged
as a warning naming ``params.yaml:evaluate.pinned_sigma_weights``: new judgements can move the optimum, and
the pin is then a decision for whoever retrains (set it, and ``dvc repro`` refits the calibration).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uamt.experiments import rendering
from uamt.experiments.common import METRICS_DIR, write_result
from uamt.experiments.rendering import section_number

if TYPE_CHECKING:
    from uamt.encoders import EncodeConfig
    from uamt.pipeline_config import PipelineConfig
    from uamt.uncertainty import EvaluationSettings

log = logging.getLogger(__name__)
NAME = "sigma_weights"


@dataclass(frozen=True)
class SigmaWeightSettings:
    """params.yaml ``exp_sigma_weights:`` section.

    Attributes
    ----------
    weights : tuple of float
        The grid the weights are re-chosen from: at least two distinct λ in [0, 1].
    metrics_dir : str
        Where ``sigma_weights.json`` goes.
    """

    weights: tuple[float, ...] = (0.0, 0.5, 1.0)
    metrics_dir: str = METRICS_DIR

    def __post_init__(self) -> None:
        weights = list(self.weights)
        if len(weights) < 2 or len(set(weights)) != len(weights) or not all(0.0 <= w <= 1.0 for w in weights):
            raise ValueError(f"weights={weights!r} not supported; choose at least two distinct weights in [0, 1]")


def check_sigma_weights(
    settings: SigmaWeightSettings,
    pipeline: PipelineConfig,
    evaluate: EvaluationSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    lolo_dir: str | Path | None,
) -> dict[str, Any]:
    """The findings: the re-check of every model of the pipeline whose weight
    ``evaluate.pinned_sigma_weights`` pins (:func:`uamt.model_evaluation.check_model_sigma_weights`,
    the models in ``pipeline.workers`` processes), and ``disagree``, the models whose served weight
    is no longer the one chosen (each logged as a warning naming the pin)."""
    from uamt.core.parallel import map_in_processes
    from uamt.model_evaluation import calibration_inputs, check_model_sigma_weights, check_pinned_models

    check_pinned_models(evaluate)
    methods = [method for method in pipeline.all_methods if method in evaluate.pinned_sigma_weights]
    checked = map_in_processes(
        functools.partial(check_model_sigma_weights, pipeline, evaluate, encode, calibration_dir, tuple(settings.weights), lolo_dir=lolo_dir),
        methods,
        pipeline.workers,
        load=functools.partial(calibration_inputs, pipeline, evaluate, encode),
    )
    models = {method: result for method, result in zip(methods, checked, strict=True) if result is not None}
    disagree = sorted(method for method, result in models.items() if not result["agrees"])
    for method in disagree:
        result = models[method]
        unseen = result["unseen"] or {}
        log.warning(
            "exp_sigma_weights: %s serves sigma weight %g (unseen pairs %g) but the grid now chooses %g (unseen pairs %s); "
            "set params.yaml:evaluate.pinned_sigma_weights.%s (or drop the pin) and re-run dvc repro",
            method, result["served"]["seen"], result["served"]["unseen"], result["seen"]["chosen"], unseen.get("chosen", "-"), method,
        )
    return {
        "weights": [float(w) for w in settings.weights],
        "pinned": {method: float(evaluate.pinned_sigma_weights[method]) for method in methods},
        "unseen_sigma_margin": evaluate.unseen_sigma_margin,
        "models": models,
        "disagree": disagree,
    }


def write_findings(
    settings: SigmaWeightSettings,
    pipeline: PipelineConfig,
    evaluate: EvaluationSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    lolo_dir: str | Path | None,
) -> dict[str, Path]:
    """The stage ``exp_sigma_weights``: write ``sigma_weights.json``; returns ``{"result": path}``."""
    result = check_sigma_weights(settings, pipeline, evaluate, encode, calibration_dir, lolo_dir)
    return {"result": write_result(NAME, result, settings.metrics_dir)}


def render(result: dict[str, Any]) -> str:
    """The report section: per model, each weight's CRPS, the one chosen, the served one."""
    weights = [f"{float(w)}" for w in result["weights"]]
    return rendering.render(NAME, result, section=section_number(NAME), grid=weights)
