"""Registering the pipeline's models in MLflow (stage ``register``): log, register, gate, alias.

The model of ``pipeline.register_method`` (and the reference-free model of
``pipeline.register_qe_method``, as ``<model_name>-qe``) becomes an MLflow pyfunc carrying its
checkpoint, calibration and encoder spec; every candidate is registered
(``validation_status=pending``), the promotion gate compares its test metrics with the champion's,
and the ``champion`` alias moves last, only if the gate passes.  The MLflow calls themselves are
:mod:`uamt.registry.store`'s.  The out-of-domain numbers, which no gate reads, are measured after
``register`` and attached to the versions' runs then (:func:`attach_to_registered`, tag
:data:`OOD_TAG`).

Before anything is logged, the registry is checked (:func:`uamt.registry.store.prepare_store`): a
registry that existed (its marker beside the SQLite database, or the previous summary
:data:`SUMMARY_PATH`) and is gone is an error, and a new one is only created with
``register.allow_new_registry: true`` (or by ``uamt registry init``); a store copied or moved
from another checkout, or a corrupt or locked one, is refused.

Each version's ``data_version`` tag is the content hash of the prepared splits it was trained,
calibrated and tested on (:func:`prepared_data_version`): without them (``data/prepared`` missing
or empty) registration is refused rather than tagged with the hash of nothing.  The encoder export
and spec a version carries are written to a temporary folder that is removed once MLflow has copied
them into the store.

The summary of a registration (:data:`SUMMARY_PATH`, the stage's DVC output) lives with the
registry in the git-ignored ``mlflow/``, never in git: a fresh clone, or a checkout whose
``mlflow/`` is gone, has no summary, so ``dvc repro`` always runs ``register`` there, even when
every model it would register hashes as ``dvc.lock`` recorded.  A committed summary made DVC skip
the stage on a fresh clone and leave its empty registry without a champion.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from uamt.campaigns import CAMPAIGN_CALIBRATION_DIR, CAMPAIGNS_ARTIFACT
from uamt.core.errors import DataError, UamtError
from uamt.core.naming import qe_model_name, qe_registered_name
from uamt.encoders import EncodeConfig
from uamt.pipeline_config import PipelineConfig
from uamt.registry.store import SUMMARY_PATH, Gates

log = logging.getLogger(__name__)
#: MLflow run name of a registration (= the dvc stage and Prefect task name).
RUN_NAME = "register"
#: Version tag set once the out-of-domain numbers are attached (stage ``evaluate_ood``,
#: :func:`attach_to_registered`): until then a version carries its test and dev numbers only.
OOD_TAG = "ood_evaluated"
#: Version tag set once the per-campaign calibrations' numbers are attached (stage ``evaluate_campaigns``).
CAMPAIGNS_TAG = "campaigns_evaluated"


@dataclass(frozen=True)
class RegisterSettings:
    """params.yaml ``register:`` section."""

    model_name: str = "uamt-comet"
    experiment: str = "uamt"
    tracking_uri: str | None = None
    gates: Gates = field(default_factory=Gates)
    #: Create the registry when there is none and nothing says one existed (a fresh project).
    allow_new_registry: bool = False
    #: Encoder runtime of the registered model (:data:`uamt.encoders.RUNTIMES`): ``onnx`` ships the
    #: encoder exported to ONNX inside the model (same embeddings to ~1e-6, ~2x faster, scoring starts
    #: without transformers / unbabel-comet); ``torch`` loads it from encode.encoder at scoring time.
    #: Models that run the encoder inside the network (fine-tuned, MC dropout through the encoder)
    #: and the numpy ``use`` encoder are always served with ``torch``.  With an ONNX runtime a
    #: deterministic network (point, hts, kl) is exported too (:mod:`uamt.serving.onnx_head`), so
    #: scoring imports no torch.
    serving_runtime: str = "onnx"

    def __post_init__(self) -> None:
        from uamt.encoders import RUNTIMES

        if self.serving_runtime not in RUNTIMES:
            raise ValueError(
                f"register.serving_runtime={self.serving_runtime!r} not supported; choose from {sorted(RUNTIMES)}"
            )


def flat_metrics(metrics: dict, prefix: str) -> dict[str, float]:
    """``{method: {lp: {key: value}}}`` as flat MLflow metric names ``<prefix>.<method>.<lp>.<key>``."""
    out = {}
    for method, by_lp in metrics.items():
        for lp, values in by_lp.items():
            for key, value in values.items():
                if isinstance(value, (int, float)) and value is not None:
                    name = f"{prefix}.{method}.{lp}.{key}".replace("@", "_at_")
                    out[name] = float(value)
    return out


def conditional_headlines(path: Path) -> dict[str, float]:
    """The headline interval metrics of every model (``conditional.<method>.<goal>``) from the
    evaluate stage's ``metrics/conditional.json``; none (with a warning) where an older evaluate
    stage did not write it."""
    from uamt.uncertainty.goals import headline_metrics

    if not Path(path).is_file():
        log.warning("%s missing (run `dvc repro evaluate`): no conditional-coverage metrics logged", path)
        return {}
    return headline_metrics(json.loads(Path(path).read_text(encoding="utf-8")))


def calibration_params(path: Path) -> dict[str, float]:
    """alpha, beta (affine sigma^2) and sigma^2_fixed per LP and global, as flat MLflow params."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out = {}
    for block, keys in (("affine_variance", ("alpha", "beta")), ("fixed_variance", ("var",))):
        fitted = data.get(block) or {}
        groups = {"global": fitted.get("global") or {}, **(fitted.get("lps") or {})}
        for group, values in groups.items():
            for key in keys:
                if isinstance(values.get(key), (int, float)):
                    name = "sigma2_fixed" if key == "var" else key
                    out[f"calibration.{group}.{name}"] = float(values[key])
    return out


def previous_versions(path: Path, names: set[str]) -> dict[str, str]:
    """model name -> version that a previous registration's summary (:data:`SUMMARY_PATH`) names, if any."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    found = {}
    for entry in (data, data.get("qe") if isinstance(data, dict) else None):
        if isinstance(entry, dict) and entry.get("model_name") in names and entry.get("version"):
            found[str(entry["model_name"])] = str(entry["version"])
    return found


#: metrics/test.json ``avg`` keys stored on each version (``test.<key>`` tags) and given to the gate.
TEST_GATE_KEYS = ("ece", "crps", "pps", "ups", "sharpness", "nll")


def gate_metrics(metrics_dir: Path, method: str) -> dict[str, float | None]:
    """What the promotion gate (:class:`uamt.registry.store.Gates`) reads for ``method``, and from which split.

    * test split, the served distribution: ``metrics/test.json`` ``<method>.avg`` (``ece``, ``crps``,
      ``pps``, ...; ``nll`` only where the served distribution is Gaussian) and
      ``metrics/conditional.json`` ``<method>.low_score_coverage`` (coverage of the segments rated
      <= -5, all LPs); compared only with the champion's and the reference's numbers on the same
      split, never with a fixed threshold;
    * dev split: ``metrics/dev.json`` ``<method>.avg.ece``, the served calibration's ECE
      *cross-fitted over dev documents*, as ``dev_ece``: the one number checked against an absolute
      ceiling (``max_dev_ece``), so that no threshold is set from test results.

    A missing file or value is None, which the gate refuses (it never passes for lack of a number).
    """

    def read(name: str) -> dict:
        path = Path(metrics_dir) / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    test = read("test.json").get(method, {}).get("avg", {})
    candidate: dict[str, float | None] = {k: v for k, v in test.items() if k in TEST_GATE_KEYS and v is not None}
    candidate["low_score_coverage"] = (read("conditional.json").get(method) or {}).get("low_score_coverage")
    candidate["dev_ece"] = (read("dev.json").get(method) or {}).get("avg", {}).get("ece")
    return candidate


def prepared_data_version(prepared_dir: str | Path) -> str:
    """The ``data_version`` tag of a registration: the content hash of the prepared splits in
    ``prepared_dir`` (:func:`uamt.data.prepare.data_version`).

    Raises
    ------
    uamt.core.errors.UamtError
        ``prepared_dir`` holds no ``*.parquet`` split: the hash would be that of nothing
        (``e3b0c44298fc``), a version whose data cannot be traced.
    """
    from uamt.data.prepare import data_version

    folder = Path(prepared_dir)
    if not any(folder.glob("*.parquet")):
        state = "does not exist" if not folder.exists() else "holds no prepared split (*.parquet)"
        raise UamtError(
            f"{folder}: {state}, so the data the models were trained on cannot be named (the "
            "data_version tag of a registered version); nothing was registered. Restore it first "
            f"(`dvc checkout {folder}`, `dvc pull {folder}`, or `dvc repro prepare`)"
        )
    return data_version(folder)


def register_pipeline_models(
    pipe: PipelineConfig, reg: RegisterSettings, encode: EncodeConfig, calibration_dir: str | Path
) -> dict:
    """Register and gate the reference-based model, then the QE model (``<model_name>-qe``);
    :data:`SUMMARY_PATH` holds the first's summary with the QE one under ``"qe"``."""
    from uamt.registry import store as registry
    from uamt.uncertainty import write_json_atomic

    names = {reg.model_name}
    if pipe.register_qe_method is not None:
        names.add(qe_registered_name(reg.model_name))
    version_tag = prepared_data_version(pipe.prepared_dir)  # before the store is touched
    uri = registry.tracking_uri(reg.tracking_uri)
    status = registry.prepare_store(
        uri,
        allow_new=reg.allow_new_registry,
        expected=previous_versions(SUMMARY_PATH, names),
        experiment=reg.experiment,
    )
    log.info("%s", status)
    with registry.store_errors(uri):
        summary = register_model(
            pipe, reg, encode, calibration_dir, pipe.register_method, reg.model_name, data_version=version_tag
        )
        if pipe.register_qe_method is not None:
            qe_model = qe_model_name(pipe.register_qe_method)
            summary["qe"] = register_model(
                pipe,
                reg,
                encode,
                calibration_dir,
                qe_model,
                qe_registered_name(reg.model_name),
                data_version=version_tag,
            )
    SUMMARY_PATH.parent.mkdir(parents=True, exist_ok=True)  # absent where the registry is elsewhere
    write_json_atomic(summary, SUMMARY_PATH)
    return summary


def serving_runtime(requested: str, encoder_cfg, model_dir: Path) -> str:
    """The encoder runtime the model at ``model_dir`` is registered with: ``requested``, except
    ``torch`` where the model needs the torch encoder itself (fine-tuned, or MC dropout through the
    encoder) or the encoder is not a transformer (``use``): logged, never silent."""
    from uamt.models.api import load

    # What is measured is what is served: int8 embeddings differ from float32 ones by ~0.2 (the
    # model's mu by up to 0.02 PPS), float32 ONNX and torch by ~1e-6.
    if (requested == "onnx-int8") != (encoder_cfg.runtime == "onnx-int8"):
        raise UamtError(
            f"register.serving_runtime={requested!r} would serve other embeddings than the model was trained "
            f"and evaluated on (encode.encoder.runtime={encoder_cfg.runtime!r}); set both to onnx-int8, "
            "or neither"
        )
    if requested == "torch":
        return requested
    model = load(model_dir)
    cfg = model.cfg
    reason = None
    if encoder_cfg.name == "use":
        reason = "encode.encoder.name=use is a numpy model with nothing to export"
    elif cfg.finetune:
        reason = "the model fine-tunes its encoder"
    elif model.spec.estimator is not None and model.spec.estimator.dropout_scope(cfg) == "full":
        reason = "the model runs MC dropout through the encoder"
    if reason is not None:
        log.warning("register.serving_runtime=%s: %s; served with runtime torch", requested, reason)
        return "torch"
    return requested


def export_serving_encoder(encoder_cfg, runtime: str, folder: Path) -> Path:
    """``encode.encoder`` exported to ``folder`` for ``runtime`` (onnx / onnx-int8), from the torch
    encoder on the CPU (the export is device-independent)."""
    from uamt.encoders import get_encoder
    from uamt.encoders.onnx_runtime import export_onnx

    torch_encoder = get_encoder(dataclasses.replace(encoder_cfg, runtime="torch", device="cpu"))
    return export_onnx(torch_encoder, folder, quantize=runtime == "onnx-int8")


def register_model(
    pipe: PipelineConfig,
    reg: RegisterSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    method: str,
    model_name: str,
    *,
    data_version: str | None = None,
) -> dict:
    """Log ``models/<method>`` as an MLflow run + pyfunc, register it under ``model_name``, gate it.

    ``data_version``: the tag (default :func:`prepared_data_version` of ``pipe.prepared_dir``).
    The encoder export and the spec are written to a temporary folder, removed when done.
    """
    with tempfile.TemporaryDirectory(prefix="uamt-spec-") as spec_dir:
        return _register_model(
            pipe,
            reg,
            encode,
            calibration_dir,
            method,
            model_name,
            data_version or prepared_data_version(pipe.prepared_dir),
            Path(spec_dir),
        )


def _register_model(
    pipe: PipelineConfig,
    reg: RegisterSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    method: str,
    model_name: str,
    version_tag: str,
    spec_dir: Path,
) -> dict:
    from uamt.models.api import read_manifest
    from uamt.registry import store as registry
    from uamt.serving.calibrated_predictor import (
        ENCODER_ARTIFACT,
        HEAD_ARTIFACT,
        scale_for,
        signature,
        write_spec,
    )
    from uamt.serving.mlflow_pyfunc import UamtPyfunc
    from uamt.serving.onnx_head import export_head

    metrics_dir = Path(pipe.metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    test = json.loads((metrics_dir / "test.json").read_text(encoding="utf-8"))
    conditional = conditional_headlines(metrics_dir / "conditional.json")
    candidate = gate_metrics(metrics_dir, method)
    model_dir = pipe.model_dir(method)
    manifest = read_manifest(model_dir)
    scale = scale_for(pipe.datasets)
    calibration = Path(calibration_dir) / f"{method}.json"
    artifacts = {"model": str(model_dir), "calibration": str(calibration)}
    campaigns = Path(CAMPAIGN_CALIBRATION_DIR) / f"{method}.json"
    if campaigns.is_file():  # the calibrate_campaigns stage's, for the served models
        artifacts[CAMPAIGNS_ARTIFACT] = str(campaigns)
    runtime = serving_runtime(reg.serving_runtime, encode.encoder, model_dir)
    if runtime != "torch":
        artifacts[ENCODER_ARTIFACT] = str(export_serving_encoder(encode.encoder, runtime, spec_dir / "encoder"))
        # and the network, where its method allows, so that scoring needs no torch
        head = export_head(model_dir, spec_dir / "head")
        if head is not None:
            artifacts[HEAD_ARTIFACT] = str(head)
    encoder_cfg = dataclasses.replace(encode.encoder, runtime=runtime)
    artifacts["spec"] = str(write_spec(spec_dir / "spec.json", encoder_cfg, scale, method, pipe.datasets))
    uri = registry.tracking_uri(reg.tracking_uri)
    version = registry.register_candidate(
        uri,
        model_name,
        run_name=RUN_NAME,
        python_model=UamtPyfunc(),
        artifacts=artifacts,
        signature=signature(manifest["config"].get("reference_free", False), scale.default_risk_threshold),
        test_metrics={k: v for k, v in candidate.items() if k != "dev_ece"},
        params={
            "method": method,
            "datasets": ",".join(pipe.datasets),
            "encoder": encode.encoder.name,
            "serving_runtime": runtime,
            **{f"train.{k}": v for k, v in manifest["config"].items()},
            **calibration_params(calibration),
        },
        # the out-of-domain numbers come after registration (evaluate_ood: attach_to_registered)
        run_metrics={**flat_metrics(test, "test"), **conditional},
        tags={
            "method": method,
            "data_version": version_tag,
            "encoder_id": str(manifest.get("encoder_id")),
            "scale": scale.name,
            "dev.ece": str(candidate.get("dev_ece")),
        },
        log_artifacts={"metrics": str(metrics_dir), "plots": pipe.plots_dir},
        experiment=reg.experiment,
    )
    client = registry._client(uri)
    orphans = registry.mark_orphans(client, model_name, keep_version=version)
    decision = registry.gate_and_alias(client, model_name, version, candidate, reg.gates)
    registry.record_version(uri, model_name)
    log.info("registered %s version %s: %s", model_name, version, decision.reason)
    return {
        "model_name": model_name,
        "method": method,
        "version": version,
        "promoted": decision.promote,
        "reason": decision.reason,
        "data_version": version_tag,
        "orphans_marked": orphans,
        "candidate": candidate,
    }


def registered_versions(summary_path: Path = SUMMARY_PATH) -> list[dict[str, str]]:
    """``[{"model_name", "version", "method"}]`` of the last registration (:data:`SUMMARY_PATH`: the
    reference-based model, then the QE one); empty, with a warning, where nothing was registered."""
    path = Path(summary_path)
    if not path.is_file():
        log.warning("%s missing: no registered version to attach to (run `dvc repro register`)", path)
        return []
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc}); run `dvc repro register`") from None
    out = []
    for entry in (summary, summary.get("qe") if isinstance(summary, dict) else None):
        if not isinstance(entry, dict):
            continue
        missing = [key for key in ("model_name", "version", "method") if entry.get(key) is None]
        if missing:
            raise DataError(f"{path}: a registration without {missing}; run `dvc repro register`")
        out.append({key: str(entry[key]) for key in ("model_name", "version", "method")})
    return out


def attach_to_registered(
    reg: RegisterSettings,
    metrics: dict[str, float],
    files: dict[str, list[Path]],
    summary_path: Path = SUMMARY_PATH,
    tag: str = OOD_TAG,
) -> list[str]:
    """Log ``metrics`` and ``files`` (artifact folder -> local files) to the MLflow run of every version the last
    registration made (:func:`registered_versions`), and tag each version ``tag: true``
    (:data:`OOD_TAG`, :data:`CAMPAIGNS_TAG`): what a stage after ``register`` measured completes the
    versions it describes.  Returns
    ``name/version`` of each; none where nothing was registered.  A registration the store does not
    hold is a DataError naming ``summary_path``."""
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException

    from uamt.registry import store as registry

    versions = registered_versions(summary_path)
    if not versions:
        return []
    uri = registry.tracking_uri(reg.tracking_uri)
    done = []
    with registry.store_errors(uri):
        client = registry._client(uri)
        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, 0) for key, value in sorted(metrics.items()) if math.isfinite(float(value))]
        for entry in versions:
            try:
                run_id = client.get_model_version(entry["model_name"], entry["version"]).run_id
            except MlflowException as exc:
                raise DataError(
                    f"{summary_path}: {entry['model_name']} version {entry['version']} is not in the store at {uri} "
                    f"({exc.message}); run `dvc repro register`"
                ) from None
            for start in range(0, len(batch), 1000):  # MLflow's limit per batch
                client.log_batch(run_id, metrics=batch[start : start + 1000])
            for folder, paths in files.items():
                for path in paths:
                    client.log_artifact(run_id, str(path), artifact_path=folder)
            client.set_model_version_tag(entry["model_name"], entry["version"], tag, "true")
            done.append(f"{entry['model_name']}/{entry['version']}")
    log.info("attached %d metrics and %d files to %s", len(batch), sum(map(len, files.values())), ", ".join(done))
    return done
