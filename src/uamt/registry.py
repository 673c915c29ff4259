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

The store itself (``prepare_store``, ``uamt registry init``):

* Read-only commands (``uamt registry show``, ``uamt score``) never create a store: a SQLite
  database that does not exist is an error naming it (:func:`check_store_exists`).
* A SQLite registry has a marker beside it, ``<db>.uamt-registry.json``, recording which models
  and versions it held.  Registration refuses a registry that existed (marker present, or a
  previous registration summary ``mlflow/registration.json`` naming a version) and is gone or does not hold those
  versions any more: a new empty database would restart the version numbers at 1, so that
  ``models:/uamt-comet/1`` would silently name another model.  A new registry is only created on
  purpose: ``uamt registry init`` or ``register.allow_new_registry: true``.
* The gate never passes a candidate *because* there is no champion, except the very first
  version of a model (none of its versions was ever promoted); a registry whose ``@champion``
  alias was removed rejects candidates until the alias is set again.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from uamt.errors import UamtError

CHAMPION = "champion"
CHALLENGER = "challenger"
STATUS_TAG = "validation_status"
REASON_TAG = "promotion_reason"
METRIC_TAG_PREFIX = "test."

DEFAULT_STORE = Path("mlflow")
#: What the last registration did: the register stage's DVC output, kept beside the default registry
#: (git-ignored) so that wherever there is no registry there is no output and DVC registers again.
SUMMARY_PATH = DEFAULT_STORE / "registration.json"


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
    """The tracking URI: ``explicit``, else ``$MLFLOW_TRACKING_URI``, else SQLite under ``mlflow/``.

    Creates nothing (see :func:`check_store_exists`, :func:`prepare_store`).
    """
    if explicit:
        return explicit
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    store = (Path(root) / DEFAULT_STORE).resolve()
    return f"sqlite:///{store / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:`` tracking URI (None for other stores and in-memory SQLite).

    ``sqlite:////abs/x.db`` -> ``/abs/x.db``; ``sqlite:///rel/x.db`` -> ``rel/x.db`` (SQLAlchemy's rules).
    """
    if not uri.startswith("sqlite:"):
        return None
    rest = uri[len("sqlite:") :].split("?", 1)[0]
    if not rest.startswith("///"):
        return None  # sqlite:// (in memory)
    path = unquote(rest[3:])
    if not path or path == ":memory:":
        return None
    return Path(path)


def _file_store_path(uri: str) -> Path | None:
    """The folder of a file-based tracking store (``file:///...`` or a plain path), else None."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri:
        return Path(uri)
    return None


def check_store_exists(uri: str) -> None:
    """Refuse a local tracking store that does not exist, before MLflow opens (and creates) it.

    Raises
    ------
    uamt.errors.UamtError
        Naming the missing SQLite database file or store folder.
    """
    db = sqlite_path(uri)
    if db is not None:
        if not db.is_file():
            raise UamtError(
                f"tracking store {uri}: database {db} does not exist (nothing was created); check "
                "--tracking-uri / $MLFLOW_TRACKING_URI / register.tracking_uri, or create a new "
                "registry with `uamt registry init`"
            )
        return
    folder = _file_store_path(uri)
    if folder is not None and not folder.is_dir():
        raise UamtError(
            f"tracking store {uri}: folder {folder} does not exist (nothing was created); check "
            "--tracking-uri / $MLFLOW_TRACKING_URI"
        )


def artifact_location(root: str | Path = ".") -> str:
    """Where a new experiment keeps artifacts when the store is the local default."""
    return (Path(root) / DEFAULT_STORE / "artifacts").resolve().as_uri()


def promotion_decision(
    candidate: dict[str, float],
    champion: dict[str, float] | None,
    gates: Gates,
    *,
    first_version: bool = True,
) -> Decision:
    """Decide whether ``candidate`` may replace ``champion``.

    Parameters
    ----------
    candidate, champion : dict
        Average test metrics with keys ``ece``, ``nll``, ``pps`` (champion None when there is none).
    gates : Gates
    first_version : bool
        With no champion: whether this is the model's first version (none ever promoted), the one
        case where the comparison is skipped.  Otherwise a missing champion fails the gate: a
        candidate never passes *because* the champion is gone.

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
    elif not first_version:
        failures.append(
            "no @champion to compare with, although versions of this model were promoted before "
            "(the alias was removed, or this is not the registry they were promoted in); set "
            "@champion to the version to compare against, then register again"
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
    first = champion_version is None and not promoted_versions(client, name, exclude=version)
    decision = promotion_decision(metrics, champion, gates, first_version=first)
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


def promoted_versions(client, name: str, exclude: str | None = None) -> list[str]:
    """Versions of ``name`` (other than ``exclude``) that were ever promoted: status ``passed``
    or a ``replaced_by`` tag (a former champion)."""
    found = []
    for version in client.search_model_versions(f"name='{name}'"):
        if str(version.version) == str(exclude):
            continue
        if version.tags.get(STATUS_TAG) == "passed" or "replaced_by" in version.tags:
            found.append(str(version.version))
    return found


def describe(uri: str, name: str) -> list[dict[str, Any]]:
    """Versions of ``name`` with aliases, status, reason and key metrics (newest first)."""
    from mlflow.exceptions import MlflowException

    check_store_exists(uri)
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


#: Registers the pipeline's models again, whatever DVC recorded (``-f``), and nothing else (``-s``).
REGISTER_AGAIN = "dvc repro -f -s register"


def check_champions(uri: str, names: list[str]) -> list[str]:
    """One line per model of ``names`` naming its ``@champion`` version (the last step of ``make run``).

    Only reads: a SQLite database that does not exist is an error (:func:`check_store_exists`).

    Raises
    ------
    uamt.errors.UamtError
        Some model is not registered or has no ``@champion``: names each such model, the verdict of
        its latest version, and the way out.
    """
    from mlflow.exceptions import MlflowException

    check_store_exists(uri)
    client = _client(uri)
    found, missing = [], []
    for name in names:
        try:
            model = client.get_registered_model(name)
            versions = client.search_model_versions(f"name='{name}'")
        except MlflowException:
            versions = []
        if not versions:
            missing.append(
                f"{name} is not registered in {uri} (the register stage did not run against this registry: "
                f"DVC found it up to date, or register.tracking_uri / $MLFLOW_TRACKING_URI named another "
                f"registry); register it with `{REGISTER_AGAIN}`"
            )
            continue
        champion = (model.aliases or {}).get(CHAMPION)
        if champion is None:
            latest = max(versions, key=lambda v: int(v.version))
            status = latest.tags.get(STATUS_TAG) or "untagged"
            reason = latest.tags.get(REASON_TAG) or "no verdict recorded: registration interrupted?"
            missing.append(
                f"{name} has no @{CHAMPION}: its latest version {latest.version} is {status} ({reason}); only "
                "a version that passes the promotion gate (params.yaml register.gates) becomes champion: fix "
                f"what the verdict names, then `{REGISTER_AGAIN}` (versions: `uamt registry show --name {name}`)"
            )
            continue
        version = client.get_model_version(name, champion)
        found.append(
            f"{name}: @{CHAMPION} is version {champion} ({version.tags.get(STATUS_TAG, '')}: "
            f"{version.tags.get(REASON_TAG, '')})"
        )
    if missing:
        raise UamtError(f"no champion to serve in {uri}: " + "; ".join(missing))
    return found


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
    from uamt.pyfunc import pip_requirements

    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)  # registering writes; reading never creates
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
            pip_requirements=pip_requirements(),
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


# ----------------------------------------------------------------------------- the store's marker
MARKER_SUFFIX = ".uamt-registry.json"


def marker_path(uri: str) -> Path | None:
    """``<db>.uamt-registry.json`` beside a SQLite registry; None for other stores."""
    db = sqlite_path(uri)
    return None if db is None else db.with_name(db.name + MARKER_SUFFIX)


def read_marker(uri: str) -> dict[str, Any] | None:
    path = marker_path(uri)
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UamtError(f"{path}: registry marker unreadable ({exc}); restore it or remove it by hand") from None
    if not isinstance(data, dict) or not isinstance(data.get("models", {}), dict):
        raise UamtError(f"{path}: registry marker malformed (expected an object with 'models')")
    return data


def _write_marker(uri: str, data: dict[str, Any]) -> None:
    from uamt.fileio import atomic_write_json

    path = marker_path(uri)
    if path is not None:
        atomic_write_json(path, data, indent=2, sort_keys=True)


def _forget_open_store(uri: str) -> None:
    """Drop MLflow's cached store objects and SQLite connections for ``uri``.

    MLflow caches one store (and one SQLAlchemy engine with open connections) per URI for the life
    of the process; after the database file was moved away those connections still write to the
    moved file, and a cached store would not see a new database's tables.  Called before a new
    database is created at ``uri`` in a process that may have opened the old one (the retrain
    deployment, tests).  Private MLflow attributes: a missing one is skipped.
    """
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore
    from mlflow.tracking._model_registry.registry import ModelRegistryStoreRegistry
    from mlflow.tracking._tracking_service.registry import TrackingStoreRegistry

    for store_class in (TrackingStore, RegistryStore):
        engine = getattr(store_class, "_engine_map", {}).pop(uri, None)
        if engine is not None:
            engine.dispose()
    for registry_class in (TrackingStoreRegistry, ModelRegistryStoreRegistry):
        cached = getattr(registry_class, "_get_store_with_resolved_uri", None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _model_state(client, name: str) -> dict[str, Any] | None:
    """{latest_version, run_id, champion} of registered model ``name``, or None when it has no versions."""
    versions = client.search_model_versions(f"name='{name}'")
    if not versions:
        return None
    latest = max(versions, key=lambda v: int(v.version))
    champion, _ = champion_metrics(client, name)
    return {"latest_version": str(latest.version), "run_id": latest.run_id, "champion": champion}


def _registry_state(client) -> dict[str, dict[str, Any]]:
    models = {}
    for model in client.search_registered_models():
        state = _model_state(client, model.name)
        if state is not None:
            models[model.name] = state
    return models


def _describe_models(models: dict[str, Any]) -> str:
    return ", ".join(
        f"{name} versions 1..{state.get('latest_version')}"
        + (f" (@champion {state['champion']})" if state.get("champion") else "")
        for name, state in sorted(models.items())
    )


def init_store(uri: str, *, replace_missing: bool = False, created_by: str = "uamt registry init") -> str:
    """Create a new, empty registry at ``uri`` on purpose (``uamt registry init``); return what was done.

    An existing registry is left alone (a SQLite one without a marker gets one).  A SQLite
    registry whose marker says it existed but whose database is gone is only replaced with
    ``replace_missing`` (the new registry's versions restart at 1; the old marker is kept inside
    the new one under ``replaces``).
    """
    db = sqlite_path(uri)
    marker = read_marker(uri)
    if db is not None and not db.is_file() and marker is not None and not replace_missing:
        raise UamtError(
            f"registry {db} is gone but existed ({marker_path(uri)} records "
            f"{_describe_models(marker.get('models', {})) or 'it'}): restore the database, or pass "
            "--replace-missing to start a new registry on purpose (version numbers restart at 1)"
        )
    existed = db.is_file() if db is not None else True
    if db is not None and not existed:
        db.parent.mkdir(parents=True, exist_ok=True)
        _forget_open_store(uri)
    client = _client(uri)
    state = _registry_state(client)  # opening the store creates a missing SQLite database
    if db is None:
        return f"{uri}: not a SQLite store; nothing to initialise (it holds {len(state)} models)"
    if existed and marker is not None:
        return f"{db}: registry already initialised ({_describe_models(state) or 'no versions yet'})"
    data: dict[str, Any] = {
        "tracking_uri": uri,
        "created": _now(),
        "created_by": created_by if not existed else f"{created_by} (adopted an existing registry)",
        "models": state,
    }
    if marker is not None:
        data["replaces"] = marker
    _write_marker(uri, data)
    return f"{db}: {'adopted existing' if existed else 'created new'} registry; marker {marker_path(uri)}"


def prepare_store(uri: str, *, allow_new: bool, expected: dict[str, str] | None = None) -> str:
    """Check, before registering anything, that ``uri`` is the registry this project registers into.

    Parameters
    ----------
    allow_new : bool
        ``register.allow_new_registry``: create a missing SQLite registry when nothing says one
        existed (no marker, no ``expected`` version).  Never replaces one that existed.
    expected : dict, optional
        model name -> a version the registry must hold (from the previous :data:`SUMMARY_PATH`).

    Raises
    ------
    uamt.errors.UamtError
        The registry existed and is gone, or does not hold the versions its marker (or
        ``expected``) names; or there is none and ``allow_new`` is false.
    """
    db = sqlite_path(uri)
    if db is not None:
        _forget_open_store(uri)  # check (and then write) the file that is there now, not a cached one
    marker = read_marker(uri)
    expected = dict(expected or {})
    hint_new = (
        f"create it with `uamt registry init --tracking-uri {uri}` (or set register.allow_new_registry: true)"
    )
    if db is not None and not db.is_file():
        if marker is not None or expected:
            known = _describe_models(marker.get("models", {})) if marker else ""
            known = known or ", ".join(f"{n} version {v}" for n, v in sorted(expected.items()))
            source = marker_path(uri) if marker is not None else f"the previous {SUMMARY_PATH}"
            raise UamtError(
                f"registry {db} is gone, but it existed ({source} records {known}); a new empty "
                "registry would restart version numbers at 1, so models:/NAME/1 would silently name "
                "another model. Restore the database (or point register.tracking_uri at it); to start "
                f"a new registry on purpose run `uamt registry init --tracking-uri {uri} --replace-missing`"
            )
        if not allow_new:
            raise UamtError(f"no registry at {db}: {hint_new}")
        return init_store(uri, created_by="register.allow_new_registry")
    client = _client(uri)
    # The marker is the record of this registry (it survives `uamt registry init --replace-missing`,
    # after which the previous registration summary names versions of the old one); without a
    # marker (a store from before markers, or another kind of store), the previous
    # registration summary is the record.
    if marker is not None:
        source = str(marker_path(uri))
        wanted: dict[str, tuple[str, str | None]] = {
            name: (str(state.get("latest_version")), state.get("run_id"))
            for name, state in marker.get("models", {}).items()
        }
    else:
        source = f"the previous {SUMMARY_PATH}"
        wanted = {name: (str(version), None) for name, version in expected.items()}
    from mlflow.exceptions import MlflowException

    for name, (version, run_id) in sorted(wanted.items()):
        try:
            found = client.get_model_version(name, version)
        except MlflowException:
            found = None
        if found is None or (run_id and found.run_id != run_id):
            what = "does not hold" if found is None else "holds another"
            raise UamtError(
                f"registry {uri} {what} {name} version {version}"
                + (f" (run {run_id})" if run_id else "")
                + f" that {source} records: it is not the registry this project registered into "
                "(replaced, or restored from an older backup?). Point register.tracking_uri at the right "
                "one; to start a new registry on purpose move this one away and run "
                "`uamt registry init --replace-missing`"
            )
    if marker is None and db is not None:
        if not _registry_state(client) and not allow_new:
            raise UamtError(
                f"registry {db} holds no model and was not initialised by uamt (no {marker_path(uri).name}); "
                f"{hint_new}"
            )
        init_store(uri, created_by="register")  # a registry from before markers: adopt it
    return f"{uri}: registry checked ({len(wanted)} models)"


def record_version(uri: str, name: str) -> None:
    """Update the marker of a SQLite registry with ``name``'s latest version, run and champion."""
    if marker_path(uri) is None:
        return
    marker = read_marker(uri) or {"tracking_uri": uri, "created": _now(), "created_by": "register", "models": {}}
    state = _model_state(_client(uri), name)
    if state is not None:
        marker.setdefault("models", {})[name] = {**state, "recorded": _now()}
    _write_marker(uri, marker)
