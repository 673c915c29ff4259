"""What scoring code (CLI, REST, experiments) talks to: a calibrated predictor.

A :class:`Predictor` turns segments into calibrated Gaussian quality predictions on the scale of
the human scores it was calibrated on.  The registered MLflow pyfunc wraps one
(:mod:`uamt.pyfunc`); :func:`load_predictor` resolves ``models:/<name>@<alias>``, ``runs:/...``
or a local pyfunc folder to it.

Input frame columns
    ``src``, ``mt`` (str, required); ``ref`` (str, optional) or ``refs`` (list of str, optional).
    Several references are combined inside the predictor (see ``combine_references``).
Output frame columns
    ``mu``, ``sigma`` (standard deviation), ``lower``, ``upper`` (central interval at
    ``confidence``), ``risk`` (= P(Q <= risk_threshold)); and, where the method gives them,
    ``epistemic_var``, ``aleatoric_var`` (variances).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pandas as pd

from uamt.errors import UamtError

OUTPUT_COLUMNS = ("mu", "sigma", "lower", "upper", "risk")


@dataclass(frozen=True)
class ScoreScale:
    """Which human scores the predictions are on, e.g. ``name="MQM"``, ``description=...``."""

    name: str
    description: str
    default_risk_threshold: float


@runtime_checkable
class Predictor(Protocol):
    #: whether the model reads references (False: reference-free / QE)
    uses_references: bool
    scale: ScoreScale
    method: str

    def predict_frame(
        self,
        frame: pd.DataFrame,
        *,
        confidence: float = 0.9,
        risk_threshold: float | None = None,
        batch_size: int = 64,
        progress: bool = False,
    ) -> pd.DataFrame:
        """Score ``frame`` (see module docstring) and return the output columns, same row order."""
        ...


def load_predictor(model: str) -> Predictor:
    """Load a :class:`Predictor` from a model URI (``models:/name@champion``, ``runs:/..``) or a folder.

    Only the configured tracking store / local folders are read: a client of the REST server can
    never make it load a path.
    """
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    from uamt.registry import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    try:
        loaded = mlflow.pyfunc.load_model(model)
    except (MlflowException, OSError) as exc:
        raise UamtError(f"could not load model {model!r}: {exc}") from exc
    python_model = loaded.unwrap_python_model()
    predictor = getattr(python_model, "predictor", None)
    if not isinstance(predictor, Predictor):
        raise UamtError(f"{model!r} is an MLflow model but not a uamt model (no calibrated predictor inside)")
    return predictor
