"""Method registry: name -> estimator class.  Unknown names are refused with the list of choices."""

from __future__ import annotations

from uamt.models.dup import DUPEstimator
from uamt.models.hts import HTSEstimator
from uamt.models.hts_mcd import HTSMCDEstimator
from uamt.models.kl import KLEstimator
from uamt.models.losses import LOSSES, get_loss
from uamt.models.mcd import MCDFullEstimator, MCDHeadEstimator
from uamt.models.point import PointEstimator

#: Single-network methods (one Lightning module each).
SINGLE_METHODS = {
    "point": PointEstimator,
    "mcd_head": MCDHeadEstimator,
    "mcd_full": MCDFullEstimator,
    "hts": HTSEstimator,
    "kl": KLEstimator,
    "hts_mcd": HTSMCDEstimator,
}

#: Every method ``uamt train --method`` accepts.  ``ensemble`` trains ``ensemble_size`` members of
#: ``ensemble_member``; ``dup`` is the second stage on top of a trained base model.
METHODS = {**SINGLE_METHODS, "ensemble": PointEstimator, "dup": DUPEstimator}

#: Methods an ensemble member may use (each trained with its own seed).
ENSEMBLE_MEMBERS = ("point", "hts", "kl")


def get_method(name: str):
    """The estimator class of ``name``; unknown names raise ValueError listing the choices."""
    if name not in METHODS:
        raise ValueError(f"method={name!r} not supported; choose from {sorted(METHODS)}")
    return METHODS[name]


__all__ = ["ENSEMBLE_MEMBERS", "LOSSES", "METHODS", "SINGLE_METHODS", "get_loss", "get_method"]
