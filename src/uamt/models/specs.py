"""Method specifications: one :class:`MethodSpec` per method, the only place facts about a method live.

Training and loading (:mod:`uamt.models.api`), the pipeline, the CLI and the analyses
(``uamt.experiments``) read a method's spec instead of testing its name, as COMET's ``str2model``
maps a name to its class.  Unknown names are refused with the list of choices.

Adding a method touches two files: its module ``src/uamt/models/<name>.py`` (an
:class:`~uamt.models.base.Estimator` subclass filling the three hooks) and one ``MethodSpec(...)``
line in :data:`METHODS` below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from uamt.models.base import Estimator
from uamt.models.dup import DUPEstimator
from uamt.models.hts import HTSEstimator
from uamt.models.hts_mcd import HTSMCDEstimator
from uamt.models.kl import KLEstimator
from uamt.models.losses import LOSSES, get_loss
from uamt.models.mcd import MCDFullEstimator, MCDHeadEstimator
from uamt.models.point import PointEstimator

#: What a trained model folder holds, hence how the method is trained and loaded:
#: ``network`` one network on the training split; ``ensemble`` ``ensemble_size`` networks of
#: ``ensemble_member`` (seeds seed..seed+K-1) under ``members/<k>/``; ``second_stage`` a network
#: trained on its own split (``train_dup``, the disjoint ``d_e``) over a trained base model M_Q,
#: copied under ``base/``.
Layout = Literal["network", "ensemble", "second_stage"]


@dataclass(frozen=True)
class CostClass:
    """What a method costs, in units the cost analysis times.

    Attributes
    ----------
    passes : int or str
        Forward passes per segment at inference: a number, or the :class:`TrainConfig` field that
        gives it (``"mc_samples"``, ``"ensemble_size"``).
    networks : int or str
        Networks trained, the same way.
    through_encoder : bool
        Every pass runs the encoder (MC dropout inside the encoder), so the warm embedding cache does
        not help.
    """

    passes: int | str = 1
    networks: int | str = 1
    through_encoder: bool = False

    def count(self, field: str, **sizes: int) -> int:
        """``passes`` or ``networks`` as a number, given the sizes it may name
        (``mc_samples=100, ensemble_size=5``)."""
        value = getattr(self, field)
        return sizes[value] if isinstance(value, str) else value


@dataclass(frozen=True)
class MethodSpec:
    """Everything the code needs to know about one method.

    Attributes
    ----------
    name : str
        ``uamt train --method`` / ``model.json``'s ``method``.
    estimator : type[Estimator]
        The Lightning network (an ensemble's default member class; DUP's error model M_E).
    layout : {"network", "ensemble", "second_stage"}
        How it is trained and loaded (:data:`Layout`).
    label : str
        Row label of the method comparison tables (``experiments.methods``); ``{LOSS}`` is the
        second-stage loss in capitals for methods with ``per_loss``.
    cost_label : str
        Label of the cost figure (``experiments.cost``); may use ``{mc_samples}``, ``{ensemble_size}``
        and ``{loss}``.
    cost : CostClass
        Inference passes and trained networks.
    same_training_as : str or None
        A method whose training is *identical* (same network, loss, data and seed): only inference
        differs, so this method's weights are that method's, copied.
    yields_samples : bool
        Prediction draws several stochastic outputs (MC dropout passes, ensemble members) before the
        Gaussian fit.
    fixed_variance : bool
        The method has no sigma of its own (``sigma`` is NaN): calibration fits a fixed variance.
    per_loss : bool
        The analyses compare one row per second-stage loss (``<name>_<loss>``, losses of
        :data:`uamt.models.losses.LOSSES`).
    ensemble_member : bool
        A deep ensemble may be made of this method's networks (``TrainConfig.ensemble_member``).
    train_keys : tuple of str
        The :class:`~uamt.models.config.TrainConfig` fields only this method reads: a model trained
        elsewhere is reused only where these match too (``experiments.methods``), and an analysis
        that sets one (``exp_cost.kl_missing_std``) applies it to the methods that read it.
    """

    name: str
    estimator: type[Estimator]
    layout: Layout
    label: str
    cost_label: str
    cost: CostClass = CostClass()
    same_training_as: str | None = None
    yields_samples: bool = False
    fixed_variance: bool = False
    per_loss: bool = False
    ensemble_member: bool = False
    train_keys: tuple[str, ...] = ()

    def row_label(self, loss: str | None = None) -> str:
        """The comparison-table label (``loss`` for ``per_loss`` methods)."""
        return self.label.format(LOSS=(loss or "").upper())


_MC = CostClass(passes="mc_samples")

#: Every method ``uamt train --method`` accepts (the order analyses and listings follow).
METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec(
            "point", PointEstimator, "network", label="Baseline (fixed σ²)", cost_label="point",
            fixed_variance=True, ensemble_member=True,
        ),
        MethodSpec(
            "mcd_head", MCDHeadEstimator, "network", label="MCD (head)", cost_label="MCD-{mc_samples} (head)",
            cost=_MC, same_training_as="point", yields_samples=True,
        ),
        MethodSpec(
            "mcd_full", MCDFullEstimator, "network", label="mcd_full",
            cost_label="MCD-{mc_samples} (full, paper's)",
            cost=CostClass(passes="mc_samples", through_encoder=True), same_training_as="point",
            yields_samples=True,
        ),
        MethodSpec(
            "ensemble", PointEstimator, "ensemble", label="DE", cost_label="DE-{ensemble_size}",
            cost=CostClass(passes="ensemble_size", networks="ensemble_size"), yields_samples=True,
            train_keys=("ensemble_size", "ensemble_member"),
        ),
        MethodSpec(
            "hts", HTSEstimator, "network", label="HTS", cost_label="HTS", ensemble_member=True,
            train_keys=("nll_beta", "synthetic_nll_beta"),
        ),
        MethodSpec(
            "hts_mcd", HTSMCDEstimator, "network", label="HTS+MCD", cost_label="HTS+MCD-{mc_samples} (head)",
            cost=_MC, same_training_as="hts", yields_samples=True,
        ),
        MethodSpec(
            "kl", KLEstimator, "network", label="KL", cost_label="KL", ensemble_member=True,
            train_keys=("kl_missing_std", "kl_std_floor", "nll_beta", "synthetic_nll_beta"),
        ),
        MethodSpec(
            "dup", DUPEstimator, "second_stage", label="DUP L_{LOSS}", cost_label="DUP ({loss})",
            cost=CostClass(passes=2, networks=2), per_loss=True, train_keys=("dup_loss", "bottleneck_size"),
        ),
    )
}

#: Methods whose weights are another method's (identical training): trained once, then copied.
SAME_TRAINING = {name: s.same_training_as for name, s in METHODS.items() if s.same_training_as}

#: Methods an ensemble member may use (each trained with its own seed).
ENSEMBLE_MEMBERS = tuple(name for name, s in METHODS.items() if s.ensemble_member)


def methods_where(predicate: Callable[[MethodSpec], bool] | None = None, **facts) -> tuple[str, ...]:
    """Names of the methods (in :data:`METHODS` order, read at call time) whose spec satisfies
    ``predicate`` and has every attribute of ``facts``: ``methods_where(layout="second_stage")``."""
    return tuple(
        name
        for name, spec in METHODS.items()
        if (predicate is None or predicate(spec)) and all(getattr(spec, k) == v for k, v in facts.items())
    )


def get_spec(name: str) -> MethodSpec:
    """The spec of method ``name``; unknown names raise ValueError listing the choices."""
    if name not in METHODS:
        raise ValueError(f"method={name!r} not supported; choose from {sorted(METHODS)}")
    return METHODS[name]


def get_method(name: str) -> type[Estimator]:
    """The estimator class of ``name``; unknown names raise ValueError listing the choices."""
    return get_spec(name).estimator


def row_spec(row: str) -> tuple[MethodSpec, str | None]:
    """``(spec, loss)`` of an analysis row: a method name, or ``<method>_<loss>`` for ``per_loss``
    methods (``dup_hts`` -> DUP with L_HTS); unknown rows raise ValueError."""
    if row in METHODS:
        return METHODS[row], None
    method, _, loss = row.partition("_")
    spec = METHODS.get(method)
    if spec is None or not spec.per_loss or loss not in LOSSES:
        raise ValueError(f"row={row!r} not supported; choose a method of {sorted(METHODS)} or <method>_<loss>")
    return spec, loss


def model_spec(model: str) -> MethodSpec:
    """The spec of a model name: a method (``hts``), its reference-free model (``hts_qe``) or an
    analysis row of a ``per_loss`` method (``dup_hts``); unknown names raise ValueError."""
    from uamt.core.naming import base_method

    return row_spec(base_method(model))[0]


def is_fixed_variance(model: str) -> bool:
    """Whether the model ``model`` has no sigma of its own (:attr:`MethodSpec.fixed_variance`)."""
    return model_spec(model).fixed_variance


def baseline_method() -> str:
    """The method every uncertainty method is judged against: the first fixed-variance one (the
    point estimate, whose sigma calibration fits as a constant)."""
    return methods_where(fixed_variance=True)[0]


def per_loss_rows(rows) -> list[str]:
    """The analysis rows of ``rows`` that are one loss of a ``per_loss`` method (``dup_hts``, ...)."""
    return [row for row in rows if row_spec(row)[1] is not None]


def training_order(methods) -> list[str]:
    """``methods`` with every source of :data:`SAME_TRAINING` before the methods derived from it."""
    first = [m for m in methods if SAME_TRAINING.get(m) not in methods]
    return first + [m for m in methods if m not in first]


__all__ = [
    "ENSEMBLE_MEMBERS",
    "LOSSES",
    "METHODS",
    "SAME_TRAINING",
    "CostClass",
    "MethodSpec",
    "get_loss",
    "get_method",
    "baseline_method",
    "get_spec",
    "is_fixed_variance",
    "methods_where",
    "model_spec",
    "per_loss_rows",
    "row_spec",
    "training_order",
]
