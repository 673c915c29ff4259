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
    ``epistemic_var``, ``aleatoric_var`` (variances); where the scale has bounds, ``clipped``
    (bool: mu or the interval was clipped to them).

Loading never writes: a registered model whose artifacts are on the local file system is loaded
from there (MLflow would otherwise write a ``registered_model_meta`` file into the registry's
artifact folder), any other is downloaded to a temporary folder; and a tracking store that does
not exist is an error, never created.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Protocol, runtime_checkable

import pandas as pd

from uamt.errors import UamtError
from uamt.scale import ScoreScale

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
        :data:`uamt.calibrated.INTERVAL_MODES`.
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
    """Where the artifacts of ``model`` lie on this file system, if they do (None: download them)."""
    if model.startswith("models:/"):
        from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

        underlying = ModelsArtifactRepository.get_underlying_uri(model)
        folder = _file_path(underlying)
        return folder if folder is not None and folder.is_dir() else None
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


def load_predictor(model: str) -> Predictor:
    """Load a :class:`Predictor` from a model URI (``models:/name@champion``, ``runs:/..``) or a folder.

    Only the configured tracking store / local folders are read: a client of the REST server can
    never make it load a path.  Nothing is written: not the tracking store (a missing SQLite
    database is an error, see :func:`uamt.registry.check_store_exists`), not the registry's
    artifact folder (see the module docstring).

    Raises
    ------
    uamt.errors.UamtError
        The store, model or alias does not exist, a model file is corrupt (named), or the model
        is not a uamt model.
    """
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    from uamt.registry import check_store_exists, tracking_uri

    uri = tracking_uri()
    if model.startswith(("models:/", "runs:/")):
        check_store_exists(uri)
    mlflow.set_tracking_uri(uri)
    try:
        folder = _local_model_folder(model)
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
