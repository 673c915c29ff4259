"""The MLflow model registry: register every candidate, gate it, move ``@champion`` last.

Life of a model version (all recorded as version tags, never the deprecated stages):

1. ``register_candidate`` creates the version with ``validation_status=pending``.
2. ``promotion_decision`` compares the candidate's metrics on the fixed test set with the
   current champion's (calibrated ECE under a ceiling, NLL and PPS not worse beyond tolerances).
3. The verdict is written as tags (``validation_status=passed|rejected``, ``promotion_reason``);
   on a pass the ``champion`` alias moves to the candidate (the old champion keeps its version),
   otherwise the candidate gets the ``challenger`` alias.

The alias switch is the commit point: every write before it (the version, its metrics, the
verdict's reason) leaves the old champion untouched, and the candidate stays ``pending`` until the
alias has moved (``passed`` and the old champion's ``replaced_by`` are written after it).  The next
registration marks versions still ``pending`` as ``orphaned`` -- except one that already holds
``@champion`` (interrupted right after the switch), whose status is repaired to ``passed``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uamt.errors import UamtError

CHAMPION = "champion"
CHALLENGER = "challenger"
STATUS_TAG = "validation_status"
REASON_TAG = "promotion_reason"
METRIC_TAG_PREFIX = "test."

DEFAULT_STORE = Path("mlflow")


@dataclass(frozen=True)
class Gates:
    """Promotion thresholds, all computed on the same fixed test set.

    ``max_ece``: calibrated ECE (averaged over LPs) must not exceed it.
    ``nll_tolerance``: candidate NLL may exceed the champion's by at most this (nats).
    ``pps_tolerance``: candidate PPS may fall below the champion's by at most this.
    """

    max_ece: float = 0.05
    nll_tolerance: float = 0.02
    pps_tolerance: float = 0.01


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    checks: dict[str, Any] = field(default_factory=dict)


def tracking_uri(explicit: str | None = None, root: str | Path = ".") -> str:
    """The tracking URI: ``explicit``, else ``$MLFLOW_TRACKING_URI``, else SQLite under ``mlflow/``."""
    if explicit:
        return explicit
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    store = (Path(root) / DEFAULT_STORE).resolve()
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


def artifact_location(root: str | Path = ".") -> str:
    """Where a new experiment keeps artifacts when the store is the local default."""
    return (Path(root) / DEFAULT_STORE / "artifacts").resolve().as_uri()


def promotion_decision(
    candidate: dict[str, float], champion: dict[str, float] | None, gates: Gates
) -> Decision:
    """Decide whether ``candidate`` may replace ``champion``.

    Parameters
    ----------
    candidate, champion : dict
        Average test metrics with keys ``ece``, ``nll``, ``pps`` (champion None when there is none).
    gates : Gates

    Returns
    -------
    Decision
        ``promote`` and a one-line ``reason`` naming every failed check with its numbers.
    """
    for key in ("ece", "nll", "pps"):
        value = candidate.get(key)
        if value is None or not math.isfinite(value):
            return Decision(False, f"candidate metric {key}={value!r} is missing or not finite")
    failures = []
    checks: dict[str, Any] = {"ece": candidate["ece"], "max_ece": gates.max_ece}
    if candidate["ece"] > gates.max_ece:
        failures.append(f"ECE {candidate['ece']:.4f} > max_ece {gates.max_ece:.4f}")
    if champion:
        checks.update(champion_nll=champion.get("nll"), champion_pps=champion.get("pps"))
        if candidate["nll"] > champion["nll"] + gates.nll_tolerance:
            failures.append(
                f"NLL {candidate['nll']:.4f} worse than champion {champion['nll']:.4f} + {gates.nll_tolerance}"
            )
        if candidate["pps"] < champion["pps"] - gates.pps_tolerance:
            failures.append(
                f"PPS {candidate['pps']:.4f} worse than champion {champion['pps']:.4f} - {gates.pps_tolerance}"
            )
    if failures:
        return Decision(False, "; ".join(failures), checks)
    if champion:
        return Decision(True, "passed all gates against the current champion", checks)
    return Decision(True, "first version: no champion yet; passed the ECE gate", checks)


def _client(uri: str):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def champion_metrics(client, name: str) -> tuple[str | None, dict[str, float] | None]:
    """The champion's version and its test metrics (from its ``test.*`` tags), or (None, None)."""
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None, None
    metrics = {
        key[len(METRIC_TAG_PREFIX) :]: float(value)
        for key, value in version.tags.items()
        if key.startswith(METRIC_TAG_PREFIX)
    }
    return str(version.version), metrics


def mark_orphans(client, name: str, keep_version: str | None = None) -> list[str]:
    """Tag versions left ``pending`` by an interrupted registration as ``orphaned``.

    A pending version that holds ``@champion`` was interrupted after its alias switch (the commit
    point): it is the champion, so its status is repaired to ``passed`` instead.
    """
    champion_version, _ = champion_metrics(client, name)
    orphans = []
    for version in client.search_model_versions(f"name='{name}'"):
        if str(version.version) == str(keep_version):
            continue
        if version.tags.get(STATUS_TAG) == "pending" and str(version.version) == champion_version:
            client.set_model_version_tag(name, version.version, STATUS_TAG, "passed")
            continue
        if version.tags.get(STATUS_TAG) == "pending":
            client.set_model_version_tag(name, version.version, STATUS_TAG, "orphaned")
            client.set_model_version_tag(
                name, version.version, REASON_TAG, "registration was interrupted before the gate ran"
            )
            orphans.append(str(version.version))
    return orphans


def gate_and_alias(client, name: str, version: str, metrics: dict[str, float], gates: Gates) -> Decision:
    """Run the promotion gate for ``version`` and write the verdict.

    On a pass the ``champion`` alias moves first and the ``passed`` status follows, so an
    interruption at any point never shows a ``passed`` version that is not champion (see the
    module docstring); on a fail the version is tagged ``rejected`` and gets ``challenger``.
    """
    champion_version, champion = champion_metrics(client, name)
    if champion_version == version:
        champion_version, champion = None, None
    decision = promotion_decision(metrics, champion, gates)
    client.set_model_version_tag(name, version, REASON_TAG, decision.reason)
    client.set_model_version_tag(name, version, "gate_checks", json.dumps(decision.checks, default=str))
    if decision.promote:
        client.set_registered_model_alias(name, CHAMPION, str(version))  # the commit point
        client.set_model_version_tag(name, version, STATUS_TAG, "passed")
        if champion_version is not None:
            client.set_model_version_tag(name, champion_version, "replaced_by", str(version))
    else:
        client.set_model_version_tag(name, version, STATUS_TAG, "rejected")
        client.set_registered_model_alias(name, CHALLENGER, str(version))
    return decision


def describe(uri: str, name: str) -> list[dict[str, Any]]:
    """Versions of ``name`` with aliases, status, reason and key metrics (newest first)."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    try:
        model = client.get_registered_model(name)
    except MlflowException as exc:
        raise UamtError(f"no registered model named {name!r} in {uri}") from exc
    aliases_by_version: dict[str, list[str]] = {}
    for alias, version in (model.aliases or {}).items():
        aliases_by_version.setdefault(str(version), []).append(alias)
    rows = []
    for version in sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: -int(v.version)):
        tags = version.tags
        rows.append(
            {
                "version": str(version.version),
                "aliases": ",".join(sorted(aliases_by_version.get(str(version.version), []))),
                "status": tags.get(STATUS_TAG, ""),
                "method": tags.get("method", ""),
                "data_version": tags.get("data_version", ""),
                "ece": tags.get(f"{METRIC_TAG_PREFIX}ece", ""),
                "nll": tags.get(f"{METRIC_TAG_PREFIX}nll", ""),
                "pps": tags.get(f"{METRIC_TAG_PREFIX}pps", ""),
                "reason": tags.get(REASON_TAG, ""),
            }
        )
    return rows


def register_candidate(
    uri: str,
    name: str,
    *,
    run_name: str,
    python_model,
    artifacts: dict[str, str],
    signature,
    test_metrics: dict[str, float],
    params: dict[str, Any] | None = None,
    run_metrics: dict[str, float] | None = None,
    tags: dict[str, str] | None = None,
    log_artifacts: dict[str, str] | None = None,
    experiment: str = "uamt",
    input_example=None,
    code_paths: list[str] | None = None,
) -> str:
    """Log a run with the model as an MLflow pyfunc and register it as a new, pending version.

    Parameters
    ----------
    test_metrics
        The average test metrics the gate compares (``ece``, ``nll``, ``pps``, ...); stored as
        ``test.<name>`` tags on the version so the next candidate can be compared without
        re-reading runs.
    log_artifacts
        Extra files to attach to the run: ``{artifact_dir: local_path}`` (plots, metrics JSON).

    Returns
    -------
    str
        The new version number. Its ``validation_status`` is ``pending`` until
        :func:`gate_and_alias` runs.
    """
    import mlflow

    client = _client(uri)
    if mlflow.get_experiment_by_name(experiment) is None:
        location = artifact_location() if uri.startswith("sqlite:") else None
        mlflow.create_experiment(experiment, artifact_location=location)
    mlflow.set_experiment(experiment)
    tags = dict(tags or {})
    with mlflow.start_run(run_name=run_name) as run:
        if params:
            mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        if run_metrics:
            mlflow.log_metrics({k: float(v) for k, v in run_metrics.items() if math.isfinite(float(v))})
        mlflow.set_tags(tags)
        for artifact_dir, local_path in (log_artifacts or {}).items():
            if Path(local_path).is_dir():
                mlflow.log_artifacts(local_path, artifact_path=artifact_dir)
            elif Path(local_path).is_file():
                mlflow.log_artifact(local_path, artifact_path=artifact_dir)
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=python_model,
            artifacts=artifacts,
            signature=signature,
            input_example=input_example,
            code_paths=code_paths,
        )
        run_id = run.info.run_id
    try:
        client.get_registered_model(name)
    except Exception:  # noqa: BLE001 - MLflow raises a generic exception when absent
        client.create_registered_model(name, description="uamt quality estimator with calibrated uncertainty")
    version_tags = {STATUS_TAG: "pending", **tags}
    version_tags.update({f"{METRIC_TAG_PREFIX}{k}": str(v) for k, v in test_metrics.items()})
    version = client.create_model_version(
        name,
        source=info.model_uri,
        run_id=run_id,
        tags=version_tags,
        model_id=getattr(info, "model_id", None),
    )
    return str(version.version)
