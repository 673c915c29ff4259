"""The MLflow face of a uamt model: ``mlflow.pyfunc.PythonModel`` around :func:`uamt.serving.calibrated_predictor.load_from_artifacts`.

Its own module so that :mod:`uamt.serving.calibrated_predictor` (the predictor) imports no MLflow: ``uamt score`` loads a
local uamt model straight from its artifacts (:func:`uamt.serving.predictor.load_predictor`), about two
seconds of start-up less.
"""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc
import pandas as pd

from uamt.serving.calibrated_predictor import load_from_artifacts


class UamtPyfunc(mlflow.pyfunc.PythonModel):
    """MLflow wrapper; ``self.predictor`` is the :class:`~uamt.serving.calibrated_predictor.CalibratedPredictor`."""

    def load_context(self, context) -> None:
        """Load spec, calibration, model and encoder from the model's artifacts."""
        self.predictor = load_from_artifacts(dict(context.artifacts))

    def predict(
        self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        params = params or {}
        frame = pd.DataFrame(model_input)
        if "lp" in frame.columns:
            self.predictor.check_lps(frame["lp"].tolist())
        return self.predictor.predict_frame(
            frame,
            confidence=float(params.get("confidence", 0.9)),
            risk_threshold=params.get("risk_threshold"),
            interval=str(params.get("interval", "gaussian")),
        )
