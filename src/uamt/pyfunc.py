"""The deployable model: an MLflow pyfunc that carries its checkpoint, calibration and encoder spec.

Artifacts (copied into the MLflow store at registration, so the registered version is
self-contained): ``model`` (the model folder of :mod:`uamt.models.api`), ``calibration`` (JSON of
:class:`uamt.calibrated.Calibration`), ``spec`` (JSON: encoder config, score scale, method).

``predict`` takes a DataFrame with ``src``, ``mt`` and, for reference-based models, ``ref`` (str)
or ``refs`` (list of str); optional ``lp`` selects per-LP calibration. It returns ``mu, sigma,
lower, upper, risk`` (+ ``epistemic_var``, ``aleatoric_var`` where the method gives them) on the
human scale of the calibration data.  MLflow params: ``confidence`` (default 0.9),
``risk_threshold`` (default: the scale's), ``interval`` (``gaussian`` | ``conformal``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

from uamt.errors import DataError
from uamt.predictor import ScoreScale
from uamt.references import N_REFS, distinct_references


def scale_for(datasets: tuple[str, ...]) -> ScoreScale:
    """The one human score scale of ``datasets`` (from their declarations), else DataError."""
    from uamt.data.datasets import DATASET_SPECS

    scales = {DATASET_SPECS[d].scale for d in datasets if d in DATASET_SPECS}
    if len(scales) != 1:
        raise DataError(f"datasets {list(datasets)} do not share one known human score scale")
    return scales.pop()


def _text_column(frame: pd.DataFrame, column: str, row_label: str = "row") -> list[str]:
    values = frame[column].tolist()
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise DataError(f"{row_label} {i}: field {column!r} must be a string, got {type(value).__name__}")
        if not value.strip():
            raise DataError(f"{row_label} {i}: field {column!r} is empty")
    return values


class CalibratedPredictor:
    """A trained model + its dev calibration + an encoder: the :class:`uamt.predictor.Predictor`."""

    def __init__(
        self, model, calibration, encoder, scale: ScoreScale, method: str, encode_batch: int = 64
    ) -> None:
        from uamt.models.data import features_from_encoder

        self.model = model
        self.calibration = calibration
        self.encoder = encoder
        self.features = features_from_encoder(encoder, batch_size=encode_batch)
        self.scale = scale
        self.method = method
        self.uses_references = not model.cfg.reference_free

    def _references(self, frame: pd.DataFrame) -> list[list[str]]:
        if "refs" in frame.columns:
            refs = []
            for i, value in enumerate(frame["refs"].tolist()):
                items = [value] if isinstance(value, str) else list(value) if value is not None else []
                if not items or not all(isinstance(r, str) and r.strip() for r in items):
                    raise DataError(f"row {i}: field 'refs' must be a non-empty list of non-empty strings")
                # The same reference given twice is one reference (n_refs picks the calibration).
                refs.append(distinct_references(items))
            return refs
        return [[r] for r in _text_column(frame, "ref")]

    def raw_predict(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Uncalibrated predictions on the training score scale; several references are combined by
        averaging the per-reference predictive distributions' means and standard deviations (the
        quantile average, the analogue for Gaussians of §3.4's pointwise average of aligned samples),
        and ``n_refs`` says how many each row used (the calibration is chosen by it)."""
        src = _text_column(frame, "src")
        mt = _text_column(frame, "mt")
        if not self.uses_references:
            if "ref" in frame.columns or "refs" in frame.columns:
                raise DataError("this is a reference-free (QE) model: drop the ref/refs fields")
            return self.model.predict(pd.DataFrame({"src": src, "mt": mt}), self.features)
        if "ref" not in frame.columns and "refs" not in frame.columns:
            raise DataError("this model needs references: add a 'ref' (or 'refs') field, or use a QE model")
        from uamt.references import predict_with_references

        return predict_with_references(
            self.model, pd.DataFrame({"src": src, "mt": mt}), self._references(frame), self.features
        )

    def predict_frame(
        self,
        frame: pd.DataFrame,
        *,
        confidence: float = 0.9,
        risk_threshold: float | None = None,
        batch_size: int = 64,
        progress: bool = False,
        interval: str = "gaussian",
    ) -> pd.DataFrame:
        if not 0 < confidence < 1:
            raise DataError(f"confidence={confidence} must be in (0, 1)")
        for column in ("src", "mt"):
            if column not in frame.columns:
                raise DataError(f"missing field {column!r}; each segment needs src and mt")
        threshold = self.scale.default_risk_threshold if risk_threshold is None else float(risk_threshold)
        lp = frame["lp"].astype(str).to_numpy() if "lp" in frame.columns else None
        outputs = []
        starts = range(0, len(frame), max(int(batch_size), 1) * 16)
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc="scoring", unit="batch", file=None)
        for start in starts:
            chunk = frame.iloc[start : start + max(int(batch_size), 1) * 16].reset_index(drop=True)
            outputs.append(self.raw_predict(chunk))
        raw = pd.concat(outputs, ignore_index=True) if outputs else pd.DataFrame(columns=["mu", "sigma"])
        sigma_raw = raw["sigma"].to_numpy(dtype=float)
        n_refs = raw[N_REFS].to_numpy(dtype=int) if N_REFS in raw.columns else None
        mu, sigma = self.calibration.apply(raw["mu"].to_numpy(dtype=float), sigma_raw, lp, n_refs=n_refs)
        lower, upper = self.calibration.interval(
            raw["mu"].to_numpy(dtype=float), sigma_raw, confidence, lp, interval, n_refs=n_refs
        )
        from uamt.uncertainty import translation_risk

        out = pd.DataFrame(
            {
                "mu": mu,
                "sigma": sigma,
                "lower": lower,
                "upper": upper,
                "risk": translation_risk(mu, sigma, threshold),
            }
        )
        # Epistemic/aleatoric parts, rescaled like sigma^2 so that they add up to the calibrated variance.
        if {"epistemic", "aleatoric"} <= set(raw.columns):
            total = (raw["epistemic"] + raw["aleatoric"]).to_numpy(dtype=float)
            share = np.divide(
                raw["epistemic"].to_numpy(dtype=float), total, out=np.zeros_like(total), where=total > 0
            )
            out["epistemic_var"] = share * sigma**2
            out["aleatoric_var"] = (1 - share) * sigma**2
        return out


class UamtPyfunc(mlflow.pyfunc.PythonModel):
    """MLflow wrapper; ``self.predictor`` is the :class:`CalibratedPredictor` (see ``load_predictor``)."""

    def load_context(self, context) -> None:
        from uamt.calibrated import Calibration
        from uamt.encoders import EncoderConfig, get_encoder
        from uamt.models.api import load

        spec = json.loads(Path(context.artifacts["spec"]).read_text(encoding="utf-8"))
        from uamt.config import from_dict

        encoder = get_encoder(from_dict(EncoderConfig, spec["encoder"], where="spec.encoder"))
        model = load(context.artifacts["model"])
        calibration = Calibration.load(context.artifacts["calibration"])
        self.predictor = CalibratedPredictor(
            model,
            calibration,
            encoder,
            ScoreScale(**spec["scale"]),
            spec["method"],
            spec.get("encode_batch", 64),
        )

    def predict(
        self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        params = params or {}
        return self.predictor.predict_frame(
            pd.DataFrame(model_input),
            confidence=float(params.get("confidence", 0.9)),
            risk_threshold=params.get("risk_threshold"),
            interval=str(params.get("interval", "gaussian")),
        )


def write_spec(path: Path, encoder_cfg, scale: ScoreScale, method: str, datasets: tuple[str, ...]) -> Path:
    spec = {
        "encoder": asdict(encoder_cfg),
        "scale": asdict(scale),
        "method": method,
        "datasets": list(datasets),
    }
    path.write_text(json.dumps(spec, indent=2), encoding="utf-8")
    return path


def signature(reference_free: bool, default_risk_threshold: float):
    """Input: src, mt[, ref] strings; output: the calibrated fields; params: confidence, risk_threshold."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    inputs = [ColSpec("string", "src"), ColSpec("string", "mt")]
    if not reference_free:
        inputs.append(ColSpec("string", "ref"))
    inputs.append(ColSpec("string", "lp", required=False))
    outputs = Schema([ColSpec("double", c) for c in ("mu", "sigma", "lower", "upper", "risk")])
    params = ParamSchema(
        [
            ParamSpec("confidence", "double", 0.9),
            ParamSpec("risk_threshold", "double", float(default_risk_threshold)),
            ParamSpec("interval", "string", "gaussian"),
        ]
    )
    return ModelSignature(inputs=Schema(inputs), outputs=outputs, params=params)
