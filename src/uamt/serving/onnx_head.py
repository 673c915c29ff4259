"""The trained network as an ONNX graph, so that scoring runs without torch.

A model registered with an ONNX encoder (``register.serving_runtime`` ``onnx`` / ``onnx-int8``) also
carries its network exported to ONNX (artifact ``head``): COMET's layer mix, the sentence features,
the head and the method's ``predict_distribution``.  ``uamt score`` and ``uamt serve`` then load
onnxruntime, numpy and pandas only: torch alone cost ~190 MB and ~1.3 s of every start-up
(``benchmarks/cli_startup.py``).  The checkpoint (artifact ``model``) stays in the registered model,
and the torch path serves models without a head export.

Folder::

    head.onnx        inputs src, mt [, ref]: float32 [batch, num_layers, dim], the pooled layers of
                     each side [, rows: float32 [batch, k], the config's row features on their fixed
                     scales (uamt.models.row_features), computed from the texts as torch computes
                     them]; outputs the method's predict_distribution keys (mu, var [, aleatoric,
                     epistemic]): float32 [batch], on the standardised training scale
    head_meta.json   format_version, method, config (the TrainConfig), encoder_id, num_layers, dim,
                     target_mean, target_std, outputs, sha256 of head.onnx and of the checkpoint's
                     weights.pt, max_error of the export check, onnxruntime_version

Only deterministic single networks are exported (point, hts, kl: one pass, no sampling; with or
without row features); MC dropout, ensembles, DUP and fine-tuned encoders keep the torch path
(:func:`export_refusal` says why).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError, UamtError
from uamt.core.fileio import atomic_write_json, check_recorded_sha256, read_meta_json, sha256_file_cached

log = logging.getLogger(__name__)

MODEL_FILE = "head.onnx"
#: The graph input holding a head's row features [batch, k] (in the config's ``row_features`` order).
ROWS_INPUT = "rows"
#: The checkpoint's weights file (:data:`uamt.models.api.WEIGHTS`; importing it from there loads torch).
CHECKPOINT_WEIGHTS = "weights.pt"
META_FILE = "head_meta.json"
FORMAT_VERSION = 1
#: Largest |ONNX - torch| / max(1, |torch|) the export check accepts on any output (standardised
#: units: an absolute bound near 0, a relative one on large variances).
EXPORT_TOLERANCE = 1e-4
_META_KEYS = (
    "format_version",
    "method",
    "config",
    "encoder_id",
    "num_layers",
    "dim",
    "target_mean",
    "target_std",
    "outputs",
    "sha256",
    "weights_sha256",
)


def export_refusal(model) -> str | None:
    """Why the loaded model (:func:`uamt.models.api.load`) cannot be served by an exported head, or
    None when it can: one deterministic network on frozen embeddings."""
    spec, cfg = model.spec, model.cfg
    if spec.layout != "network":
        return f"method {model.method!r} is a {spec.layout} of networks"
    if cfg.finetune:
        return "the model fine-tunes its encoder"
    if spec.yields_samples or spec.estimator.dropout_scope(cfg) is not None:
        return f"method {model.method!r} samples (MC dropout) at inference"
    return None


def export_head(model_dir: str | Path, folder: str | Path, *, check_rows: int = 64, seed: int = 0) -> Path | None:
    """Export the network of ``model_dir`` to ``folder`` (created); None (logged) when
    :func:`export_refusal` gives a reason.

    The export is checked before it is written: on ``check_rows`` rows of random pooled layers
    (standard normal times 0.25, about the spread of real pooled embeddings; the graph is the same
    for any input), every output of ONNX Runtime must be within :data:`EXPORT_TOLERANCE` of torch's
    (relative where the output exceeds 1: float32 sums in another order differ by ~1e-7 of it).

    Raises
    ------
    UamtError
        The exported graph disagrees with torch (the message gives the largest difference).
    """
    import torch

    from uamt.encoders.onnx_runtime import OPSET
    from uamt.models.api import load
    from uamt.models.row_features import COLUMN_PREFIX

    model_dir, folder = Path(model_dir), Path(folder)
    model = load(model_dir)
    reason = export_refusal(model)
    if reason is not None:
        log.info("%s: no ONNX head (%s); served through torch", model_dir, reason)
        return None
    module = model.module.eval()
    sides = ["src", "mt"] + ([] if model.cfg.reference_free else ["ref"])
    row_features = list(model.cfg.row_features)
    inputs = sides + ([ROWS_INPUT] if row_features else [])
    generator = torch.Generator().manual_seed(seed)
    example = {side: 0.25 * torch.randn((check_rows, *model.shape), generator=generator) for side in sides}
    if row_features:  # the fixed scales put every row feature in [-3, 3]; most in [0, 1]
        example[ROWS_INPUT] = torch.rand((check_rows, len(row_features)), generator=generator)

    def as_batch(values: dict) -> dict:
        batch = {side: values[side] for side in sides}
        batch.update({f"{COLUMN_PREFIX}{name}": values[ROWS_INPUT][:, j] for j, name in enumerate(row_features)})
        return batch

    with torch.no_grad():
        reference = module.predict_distribution(as_batch(example))
    outputs = list(reference)

    class HeadGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.network = module

        def forward(self, *tensors):
            out = self.network.predict_distribution(as_batch(dict(zip(inputs, tensors, strict=True))))
            return tuple(out[name] for name in outputs)

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MODEL_FILE
    with torch.no_grad():
        torch.onnx.export(
            HeadGraph().eval(),
            tuple(example[name] for name in inputs),
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes={name: {0: "batch"} for name in inputs + outputs},
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    session = _session(path, threads=1)
    found = session.run(outputs, {name: example[name].numpy() for name in inputs})
    error = max(
        float(np.nanmax(np.abs(np.asarray(got, dtype=np.float64) - want) / np.maximum(1.0, np.abs(want)), initial=0.0))
        for name, got in zip(outputs, found, strict=True)
        for want in [reference[name].double().numpy()]
    )
    nan_mismatch = any(
        not np.array_equal(np.isnan(got), torch.isnan(reference[name]).numpy())
        for name, got in zip(outputs, found, strict=True)
    )
    if not error <= EXPORT_TOLERANCE or nan_mismatch:
        raise UamtError(
            f"{model_dir}: the ONNX export of the network differs from torch by {error:.2e} (relative above 1) "
            f"(tolerance {EXPORT_TOLERANCE:.0e}{'; NaN in other places' if nan_mismatch else ''})"
        )
    import onnxruntime as ort

    meta = {
        "format_version": FORMAT_VERSION,
        "method": model.method,
        "config": model.meta["config"],
        "encoder_id": model.encoder_id,
        "num_layers": int(model.shape[0]),
        "dim": int(model.shape[1]),
        "target_mean": float(model.scaler.mean),
        "target_std": float(model.scaler.std),
        "outputs": outputs,
        "sha256": sha256_file_cached(path),
        "weights_sha256": sha256_file_cached(model_dir / CHECKPOINT_WEIGHTS),
        "max_error": error,
        "onnxruntime_version": ort.__version__,
    }
    atomic_write_json(folder / META_FILE, meta, indent=2)
    log.info("%s: network exported to ONNX (%s; max |ONNX - torch| / max(1, |torch|) %.1e)", model_dir, ", ".join(outputs), error)
    return folder


def _session(path: Path, threads: int | None = None):
    import onnxruntime as ort

    from uamt.core.parallel import default_threads

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's load errors are its own Fail / InvalidGraph classes
        raise UamtError(f"{path}: ONNX Runtime cannot load it ({exc})") from None


def _read_meta(folder: Path, model_dir: Path | None) -> dict[str, Any]:
    """The checked ``head_meta.json`` of ``folder``: head.onnx and (with ``model_dir``) the
    checkpoint's weights must have the recorded sha256, so a head never serves another network."""
    meta_path = folder / META_FILE
    meta = read_meta_json(meta_path, _META_KEYS, FORMAT_VERSION, "an exported network")
    recorded = {folder / MODEL_FILE: meta["sha256"]}
    if model_dir is not None:
        recorded[Path(model_dir) / CHECKPOINT_WEIGHTS] = meta["weights_sha256"]
    for path in recorded:
        if not path.is_file():
            raise UamtError(f"{path}: missing (needed by the exported network in {folder})")
    check_recorded_sha256(recorded, meta_path, ", or the head belongs to another checkpoint")
    return meta


class OnnxHeadModel:
    """A trained network served from its ONNX export: the part of
    :class:`uamt.models.api.TrainedModel` that scoring uses (``cfg``, ``method``, ``predict``),
    with the same outputs (the torch path's to ~1e-6), without torch.

    Parameters
    ----------
    folder : str or Path
        An :func:`export_head` folder.
    model_dir : str or Path, optional
        The checkpoint the head was exported from (the registered model's ``model`` artifact); its
        ``weights.pt`` must be the one the export recorded.
    """

    def __init__(self, folder: str | Path, model_dir: str | Path | None = None) -> None:
        from uamt.core.config import ConfigError, from_dict
        from uamt.models.config import TrainConfig
        from uamt.models.data import TargetScaler

        self.folder = Path(folder)
        self.model_dir = None if model_dir is None else Path(model_dir)
        meta = _read_meta(self.folder, self.model_dir)
        self.meta = meta
        self.method = str(meta["method"])
        try:
            self.cfg = from_dict(TrainConfig, meta["config"], where=f"{self.folder / META_FILE}:config")
        except (ConfigError, TypeError, ValueError) as exc:
            raise UamtError(f"{self.folder / META_FILE}: unusable config ({exc})") from None
        self.scaler = TargetScaler(float(meta["target_mean"]), float(meta["target_std"]))
        self.encoder_id = meta["encoder_id"]
        self.shape = (int(meta["num_layers"]), int(meta["dim"]))
        self.outputs = [str(name) for name in meta["outputs"]]
        self.paragraphs = None
        if self.model_dir is not None:  # the blend is recorded in the checkpoint's manifest
            from uamt.paragraphs import ParagraphBlend

            self.paragraphs = ParagraphBlend.from_model_dir(self.model_dir)
        self.sides = ["src", "mt"] + ([] if self.cfg.reference_free else ["ref"])
        self.row_features = tuple(self.cfg.row_features)
        expected = sorted(self.sides + ([ROWS_INPUT] if self.row_features else []))
        self.session = _session(self.folder / MODEL_FILE)
        found = sorted(item.name for item in self.session.get_inputs())
        if found != expected:
            raise UamtError(f"{self.folder / MODEL_FILE}: inputs {found}, expected {expected}")

    def __repr__(self) -> str:
        return f"OnnxHeadModel(method={self.method!r}, folder={str(self.folder)!r})"

    def check_features(self, features) -> None:
        """DataError when ``features`` come from other encoder weights than the network was trained on."""
        from uamt.encoders.catalog import weights_id
        from uamt.models.data import encoder_id_of

        found = encoder_id_of(features)
        if self.encoder_id is not None and found is not None and weights_id(found) != weights_id(self.encoder_id):
            raise DataError(
                f"{self.folder}: network trained on embeddings of encoder {self.encoder_id!r}, but the "
                f"features come from {found!r}"
            )

    def predict_standardised(
        self, table: np.ndarray, indices: dict[str, np.ndarray], rows: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """The graph's outputs [n_rows] (standardised scale) for rows indexing ``table`` per side;
        ``rows``: their row features [n_rows, k] when the network reads any."""
        n_rows = len(indices["src"])
        step = max(int(self.cfg.predict_batch_size), 1)
        parts: dict[str, list[np.ndarray]] = {name: [] for name in self.outputs}
        for start in range(0, n_rows, step):
            feeds = {side: table[indices[side][start : start + step]] for side in self.sides}
            if self.row_features:
                feeds[ROWS_INPUT] = rows[start : start + step]
            for name, values in zip(self.outputs, self.session.run(self.outputs, feeds), strict=True):
                parts[name].append(np.asarray(values, dtype=np.float64))
        return {
            name: np.concatenate(values) if values else np.empty(0, dtype=np.float64)
            for name, values in parts.items()
        }

    def predict(self, df: pd.DataFrame, features, n_samples: int | None = None, encoder=None) -> pd.DataFrame:
        """Score ``df`` (columns ``src``, ``mt`` [, ``ref``]) like
        :meth:`uamt.models.api.TrainedModel.predict`: ``mu``, ``sigma`` and the method's variance
        parts, on the ``score`` scale, ``mu`` blended on multi-sentence rows where the checkpoint's
        manifest records a paragraph blend.  ``n_samples`` and ``encoder`` are accepted for the same
        signature and unused (the network is deterministic and reads cached embeddings)."""
        from uamt.paragraphs import predict_with_blend

        return predict_with_blend(self, df, features, n_samples, encoder)

    def predict_whole(self, df: pd.DataFrame, features, n_samples: int | None = None, encoder=None) -> pd.DataFrame:
        """:meth:`predict` with every row read whole by the network (no paragraph blend)."""
        from uamt.models.data import index_rows, to_score_scale
        from uamt.models.row_features import row_feature_matrix

        self.check_features(features)
        table, _, indices = index_rows(df, features, self.cfg.reference_free, expected_shape=self.shape)
        rows = row_feature_matrix(df, self.row_features) if self.row_features else None
        return to_score_scale(self.predict_standardised(table, indices, rows), self.scaler)


def load_onnx_head(folder: str | Path, model_dir: str | Path | None = None) -> OnnxHeadModel:
    """Load an :func:`export_head` folder (onnxruntime and numpy only).

    Raises
    ------
    UamtError
        ``head_meta.json`` missing or corrupt, ``head.onnx`` missing or not the recorded file, or
        ``model_dir``'s weights not the ones the head was exported from (the message names the file).
    """
    return OnnxHeadModel(folder, model_dir)
