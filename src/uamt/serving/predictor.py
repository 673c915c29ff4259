"""What scoring code (CLI, REST, experiments) talks to: a calibrated predictor.

A :class:`Predictor` turns segments into calibrated Gaussian quality predictions on the scale of
the human scores it was calibrated on.  The registered MLflow pyfunc wraps one
(:mod:`uamt.serving.calibrated_predictor`); :func:`load_predictor` resolves ``models:/<name>@<alias>``, ``runs:/...``
or a local pyfunc folder to it.

Input frame columns
    ``src``, ``mt`` (str, required); ``ref`` (str, optional) or ``refs`` (list of str, optional).
    Several references are combined inside the predictor (see ``combine_references``).
Output frame columns
    ``mu``, ``sigma`` (standard deviation), ``lower``, ``upper`` (central interval at
    ``confidence``), ``risk`` (= P(Q <= risk_threshold)); and, where the method gives them,
    ``epistemic_var``, ``aleatoric_var`` (variances); where the scale has bounds, ``clipped``
    (bool: mu or the interval was clipped to them).

Loading never writes: a registered model whose artifacts are on the local file system is loaded
from there (MLflow would otherwise write a ``registered_model_meta`` file into the registry's
artifact folder), any other is downloaded to a temporary folder; and a tracking store that does
not exist, is empty, corrupt, locked or of an older MLflow schema is an error, never created,
initialised or migrated.  A SQLite store copied or moved from another checkout (its marker names
another place, or the model's files lie outside the database's folder) is refused: it would
serve the original checkout's files.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Protocol, runtime_checkable

import pandas as pd

from uamt.core.errors import UamtError
from uamt.core.scale import ScoreScale

OUTPUT_COLUMNS = ("mu", "sigma", "lower", "upper", "risk")


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
        interval: str = "gaussian",
    ) -> pd.DataFrame:
        """Score ``frame`` (see module docstring) and return the output columns, same row order.

        ``interval`` is how ``lower``/``upper`` are built: ``"gaussian"`` (the calibrated Gaussian)
        or ``"conformal"`` (the dev-fitted conformal thresholds); see
        :data:`uamt.serving.model_calibration.INTERVAL_MODES`.
        """
        ...


def _file_path(uri: str) -> Path | None:
    """The local path of a ``file:`` URI or a plain path, else None (a remote store)."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and ":" in uri):  # a path (or a drive letter)
        return Path(uri)
    return None


def check_pickle(path: Path) -> None:
    """Refuse a ``python_model.pkl`` that is not a complete pickle stream, without unpickling it."""
    import pickletools

    try:
        with open(path, "rb") as handle:
            for _ in pickletools.genops(handle):
                pass
    except OSError as exc:
        raise UamtError(f"{path}: cannot read the model's python object: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - genops raises ValueError, struct.error, ... on garbage
        raise UamtError(
            f"{path}: not a valid pickle ({type(exc).__name__}: {exc}); the model's python object is "
            "corrupt or truncated: re-register the model (or restore the file)"
        ) from None


def _check_model_folder(folder: Path) -> None:
    """Check the files MLflow is about to unpickle, so a corrupt one is named (not a traceback)."""
    import yaml

    mlmodel = folder / "MLmodel"
    if not mlmodel.is_file():
        return  # mlflow says what is missing
    try:
        flavor = (yaml.safe_load(mlmodel.read_text(encoding="utf-8")) or {}).get("flavors", {})
        pickled = (flavor.get("python_function") or {}).get("python_model")
    except (yaml.YAMLError, AttributeError, UnicodeDecodeError) as exc:
        raise UamtError(f"{mlmodel}: not a valid MLmodel file ({exc})") from None
    if isinstance(pickled, str):
        check_pickle(folder / pickled)


def _local_model_folder(model: str) -> Path | None:
    """Where the artifacts of a run or folder ``model`` lie on this file system (None: download them);
    ``models:/`` URIs are resolved by :func:`_resolve_local_folder`."""
    if "://" in model or model.startswith("runs:/"):
        return None
    return Path(model)


def warn_requirement_mismatches(folder: Path) -> list[str]:
    """Warn (logging) about each requirement in the model's ``requirements.txt`` that this environment
    does not meet, and return them.

    The check MLflow runs on every load does the same but first maps every installed distribution
    to its modules (~2 CPU s of each ``uamt score``); here each pinned name is looked up directly.
    """
    import logging
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import InvalidRequirement, Requirement

    path = folder / "requirements.txt"
    if not path.is_file():
        return []
    unmet = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        try:
            requirement = Requirement(line)
        except InvalidRequirement:  # blank lines, pip options (-r, --index-url)
            continue
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            installed = None
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(f"{requirement.name} (current: {installed or 'uninstalled'}, required: {line})")
    if unmet:
        logging.getLogger(__name__).warning(
            "%s: the model was logged with requirements this environment does not meet: %s", folder, "; ".join(unmet)
        )
    return unmet


#: Pickled classes that mark an MLflow model folder as a uamt model: the class's current home and the
#: two it had before (models registered then still pickle those; see :mod:`uamt.pyfunc_model`).
UAMT_PYFUNC_CLASSES = {
    ("uamt.serving.mlflow_pyfunc", "UamtPyfunc"),
    ("uamt.pyfunc_model", "UamtPyfunc"),
    ("uamt.pyfunc", "UamtPyfunc"),
}


def uamt_artifacts(folder: Path) -> dict[str, str] | None:
    """The artifacts (name -> local path) of a uamt pyfunc folder, or None when ``folder`` is some
    other MLflow model (then MLflow loads it).  Reads ``MLmodel`` and the opcodes of
    ``python_model.pkl`` (checked complete, never unpickled)."""
    import pickletools

    import yaml

    mlmodel = folder / "MLmodel"
    if not mlmodel.is_file():
        return None
    try:
        flavor = ((yaml.safe_load(mlmodel.read_text(encoding="utf-8")) or {}).get("flavors") or {}).get(
            "python_function"
        ) or {}
    except (yaml.YAMLError, AttributeError, UnicodeDecodeError) as exc:
        raise UamtError(f"{mlmodel}: not a valid MLflow MLmodel file ({exc})") from None
    pickled, entries = flavor.get("python_model"), flavor.get("artifacts")
    if flavor.get("loader_module") != "mlflow.pyfunc.model" or flavor.get("code") or not isinstance(pickled, str):
        return None
    if not isinstance(entries, dict) or not all(isinstance(e, dict) and "path" in e for e in entries.values()):
        return None
    check_pickle(folder / pickled)
    strings, classes = [], set()
    with open(folder / pickled, "rb") as handle:
        for opcode, arg, _ in pickletools.genops(handle):
            if opcode.name == "GLOBAL":
                classes.add(tuple(str(arg).split(" ", 1)))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                classes.add((strings[-2], strings[-1]))
            elif isinstance(arg, str):
                strings.append(arg)
    if not classes & UAMT_PYFUNC_CLASSES:
        return None
    return {name: str(folder / entry["path"]) for name, entry in entries.items()}


def _resolution_cache() -> Path:
    root = os.environ.get("UAMT_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "uamt") / "resolved-models.json"


def _store_stamp(uri: str) -> list | None:
    """Size and modification time of a SQLite store's files: any registry write changes them."""
    from uamt.registry.store import sqlite_path

    db = sqlite_path(uri)
    if db is None:
        return None
    stamp = []
    for path in (db, db.with_name(db.name + "-wal")):
        if path.exists():
            stat = path.stat()
            stamp.append([str(path), stat.st_size, stat.st_mtime_ns])
    return stamp


def _cached_folder(uri: str, model: str) -> Path | None:
    """The folder ``model`` resolved to last time, while the SQLite store is unchanged since."""
    stamp = _store_stamp(uri)
    if stamp is None:
        return None
    try:
        entry = json.loads(_resolution_cache().read_text(encoding="utf-8")).get(f"{uri} {model}")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict) or entry.get("stamp") != stamp:
        return None
    folder = Path(str(entry.get("folder")))
    return folder if folder.is_dir() else None


def _remember_folder(uri: str, model: str, folder: Path) -> None:
    """Record the resolution (best effort: an unwritable cache only costs the next start-up)."""
    from uamt.core.fileio import atomic_write_json

    stamp = _store_stamp(uri)
    if stamp is None:
        return
    path = _resolution_cache()
    try:
        cache = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        if not isinstance(cache, dict):
            cache = {}
        cache[f"{uri} {model}"] = {"stamp": stamp, "folder": str(folder)}
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, cache, indent=1)
    except (OSError, ValueError):
        pass


def _resolve_local_folder(model: str, uri: str) -> Path | None:
    """Where the artifacts of ``model`` lie on this file system (None: download them); for
    ``models:/`` URIs remembered per unchanged SQLite store: resolving an alias imports MLflow's
    SQL store (~1.5 s of every ``uamt score``).

    Raises UamtError when a ``models:/`` model's files lie outside the SQLite store's folder (a
    store copied or moved from another checkout, :func:`uamt.registry.store.check_artifacts_inside`).
    """
    from uamt.registry.store import check_artifacts_inside, check_store_schema, registry_uri, use_store

    if not model.startswith("models:/"):
        return _local_model_folder(model)
    # Aliases live in the registry store: the user's $MLFLOW_REGISTRY_URI where set, else the
    # tracking store.
    registry = registry_uri(uri)
    folder = _cached_folder(registry, model)
    if folder is not None:
        check_artifacts_inside(registry, str(folder), f"the files of {model}")
        return folder
    check_store_schema(registry)  # MLflow would initialise or migrate an incomplete store
    from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

    # MLflow resolves the alias in its process-wide registry URI: set both, so that a process that
    # used another store before (the retrain deployment, tests) resolves it in this one.
    use_store(uri)
    underlying = ModelsArtifactRepository.get_underlying_uri(model)
    check_artifacts_inside(registry, underlying, f"the files of {model}")
    folder = _file_path(underlying)
    if folder is None or not folder.is_dir():
        return None
    _remember_folder(registry, model, folder)
    return folder


def _check_run_artifacts(model: str, uri: str) -> None:
    """Refuse a ``runs:/`` model of a SQLite store whose run's artifacts lie outside the store's
    folder (a copied or moved store); anything else passes."""
    from uamt.registry.store import check_artifacts_inside, check_store_schema, sqlite_path

    if not model.startswith("runs:/") or sqlite_path(uri) is None:
        return
    check_store_schema(uri)
    from mlflow.exceptions import MlflowException

    from mlflow import MlflowClient

    run_id = model[len("runs:/") :].lstrip("/").split("/", 1)[0]
    try:
        artifact_uri = MlflowClient(tracking_uri=uri).get_run(run_id).info.artifact_uri
    except MlflowException:
        return  # an unknown run: MLflow's own message when it loads
    check_artifacts_inside(uri, artifact_uri, f"the artifacts of run {run_id}")


def load_predictor(model: str) -> Predictor:
    """Load a :class:`Predictor` from a model URI (``models:/name@champion``, ``runs:/..``) or a folder.

    Only the configured tracking store / local folders are read: a client of the REST server can
    never make it load a path.  Nothing is written: not the tracking store (a missing SQLite
    database is an error, see :func:`uamt.registry.store.check_store_exists`), not the registry's
    artifact folder (see the module docstring).

    Raises
    ------
    uamt.core.errors.UamtError
        The store, model or alias does not exist, a model file is corrupt (named), or the model
        is not a uamt model.
    """
    from uamt.registry.store import (
        check_store_exists,
        check_store_location,
        registry_origin,
        store_errors,
        tracking_uri,
    )

    uri = tracking_uri()
    if model.startswith(("models:/", "runs:/")):
        check_store_exists(uri)
        check_store_location(uri)
    try:
        with store_errors(uri):
            folder = _resolve_local_folder(model, uri)
            _check_run_artifacts(model, uri)
        artifacts = uamt_artifacts(folder) if folder is not None and folder.is_dir() else None
        if artifacts is not None:
            # A uamt model on this file system: loaded from its artifacts as its load_context would,
            # without importing MLflow's pyfunc machinery.
            from uamt.serving.calibrated_predictor import load_from_artifacts

            warn_requirement_mismatches(folder)
            return load_from_artifacts(artifacts)
    except UamtError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow or a model file failed; name the model
        where = f" from {registry_origin(uri)}" if model.startswith("models:/") else ""
        raise UamtError(f"could not load model {model!r}{where}: {_reason(exc)}") from exc
    return _load_through_mlflow(model, uri, folder)


def _reason(exc: Exception) -> str:
    """MLflow's and the file system's messages as they are; any other failure with its type."""
    if isinstance(exc, OSError) or any(c.__name__ == "MlflowException" for c in type(exc).__mro__):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _load_through_mlflow(model: str, uri: str, folder: Path | None) -> Predictor:
    """Load any other MLflow model with ``mlflow.pyfunc.load_model`` (remote ones downloaded to a
    temporary folder) and return the uamt predictor inside it."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    from uamt.registry.store import use_store

    use_store(uri)
    try:
        if folder is not None:
            if folder.is_dir():
                _check_model_folder(folder)
                warn_requirement_mismatches(folder)
            loaded = mlflow.pyfunc.load_model(
                str(folder) if model.startswith("models:/") else model, suppress_warnings=True
            )
        else:
            download = Path(tempfile.mkdtemp(prefix="uamt-model-"))
            atexit.register(shutil.rmtree, download, True)
            from mlflow.artifacts import download_artifacts

            local = Path(download_artifacts(artifact_uri=model, dst_path=str(download)))
            _check_model_folder(local)
            warn_requirement_mismatches(local)
            loaded = mlflow.pyfunc.load_model(str(local), suppress_warnings=True)
    except UamtError:
        raise
    except (MlflowException, OSError) as exc:
        raise UamtError(f"could not load model {model!r}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - a model's own code failed while loading; name the model
        raise UamtError(f"could not load model {model!r}: {type(exc).__name__}: {exc}") from exc
    python_model = loaded.unwrap_python_model()
    predictor = getattr(python_model, "predictor", None)
    if not isinstance(predictor, Predictor):
        raise UamtError(f"{model!r} is an MLflow model but not a uamt model (no calibrated predictor inside)")
    return predictor
