"""COMET-style uncertainty-aware estimators (point, MC dropout, ensembles, HTS, KL, HTS+MCD, DUP).

Public API::

    from uamt.models import train, load, TrainConfig, METHODS, LOSSES, features_from_cache
    METHODS["hts"].label                                # one MethodSpec per method (uamt.models.specs)
    path = train("hts", cfg, train_df, dev_df, features, "models/hts")
    preds = load(path).predict(df, features)            # DataFrame[mu, sigma, ...]
    table = load(path).predictions_table(df, features)  # dataset, lp, seg_id, system, human, mu, sigma, ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: Public name -> the module that defines it.  Imported on first use (PEP 562): ``uamt.models.data``
#: and ``uamt.models.config`` are read by scoring, which must not pay for torch and the estimators.
_EXPORTS = {
    "load": "uamt.models.api",
    "train": "uamt.models.api",
    "Estimator": "uamt.models.base",
    "NonFiniteLossError": "uamt.models.base",
    "TrainConfig": "uamt.models.config",
    "load_train_config": "uamt.models.config",
    "FeatureSource": "uamt.models.data",
    "features_from_cache": "uamt.models.data",
    "features_from_encoder": "uamt.models.data",
    "LOSSES": "uamt.models.specs",
    "METHODS": "uamt.models.specs",
    "MethodSpec": "uamt.models.specs",
    "get_loss": "uamt.models.specs",
    "get_method": "uamt.models.specs",
    "get_spec": "uamt.models.specs",
}

__all__ = [
    "LOSSES",
    "METHODS",
    "Estimator",
    "FeatureSource",
    "MethodSpec",
    "NonFiniteLossError",
    "TrainConfig",
    "features_from_cache",
    "features_from_encoder",
    "get_loss",
    "get_method",
    "get_spec",
    "load",
    "load_train_config",
    "train",
]

if TYPE_CHECKING:
    from uamt.models.api import load, train
    from uamt.models.base import Estimator, NonFiniteLossError
    from uamt.models.config import TrainConfig, load_train_config
    from uamt.models.data import FeatureSource, features_from_cache, features_from_encoder
    from uamt.models.specs import LOSSES, METHODS, MethodSpec, get_loss, get_method, get_spec


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'uamt.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
