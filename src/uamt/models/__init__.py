"""COMET-style uncertainty-aware estimators (point, MC dropout, ensembles, HTS, KL, HTS+MCD, DUP).

Public API::

    from uamt.models import train, load, TrainConfig, METHODS, LOSSES, features_from_cache
    METHODS["hts"].label                                # one MethodSpec per method (uamt.models.specs)
    path = train("hts", cfg, train_df, dev_df, features, "models/hts")
    preds = load(path).predict(df, features)            # DataFrame[mu, sigma, ...]
    table = load(path).predictions_table(df, features)  # dataset, lp, seg_id, system, human, mu, sigma, ...
"""

from uamt.models.api import load, train
from uamt.models.base import Estimator, NonFiniteLossError
from uamt.models.config import TrainConfig, load_train_config
from uamt.models.data import FeatureSource, features_from_cache, features_from_encoder
from uamt.models.specs import LOSSES, METHODS, MethodSpec, get_loss, get_method, get_spec

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
