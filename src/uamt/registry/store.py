"""The MLflow model registry: register every candidate, gate it, move ``@champion`` last.

Life of a model version (all recorded as version tags, never the deprecated stages):

1. ``register_candidate`` creates the version with ``validation_status=pending``.
2. ``promotion_decision`` compares the candidate's metrics on the fixed test set with the
   current champion's and with the reference's -- the first champion, alias ``@reference``, a
   floor that does not move as champions replace each other (CRPS, PPS, ECE and bad-segment
   coverage not worse beyond tolerances) -- and its dev ECE with a ceiling (see :class:`Gates`).
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
* Read-only commands never initialise or migrate a store either: a SQLite file that is empty
  (0 bytes), corrupt, locked by another process, or lacks tables this MLflow expects is an error
  naming the file, before MLflow opens it (:func:`check_store_exists`, :func:`check_store_schema`);
  SQLite errors inside MLflow calls become one line too (:func:`store_errors`).
* A SQLite store and its artifacts are one thing that moves together: the artifacts lie beside the
  database (``<db folder>/artifacts``, :func:`artifact_location`), and MLflow records their
  absolute paths.  A store copied or moved with its checkout (``cp -a A B``) would still read and
  write the original's files, so it is refused (:func:`check_store_location`: the marker records
  where the database was made; :func:`check_artifacts_inside`: model files or an experiment's
  artifact root outside the database's folder), with the way out: a new registry for the copy.
* A SQLite registry has a marker beside it, ``<db>.uamt-registry.json``, recording which models
  and versions it held, and where the database is (``db_path``).  Registration refuses a registry
  that existed (marker present, or a previous registration summary ``mlflow/registration.json`` naming a version) and is
  gone or does not hold those versions any more: a new empty database would restart the version
  numbers at 1, so that ``models:/uamt-comet/1`` would silently name another model.  A new
  registry is only created on purpose: ``uamt registry init`` or
  ``register.allow_new_registry: true``.
* The gate never passes a candidate *because* there is no champion, except the very first
  version of a model (none of its versions was ever promoted); a registry whose ``@champion``
  alias was removed rejects candidates until the alias is set again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from uamt.core.errors import UamtError

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
#: Alias of the model's first champion: the floor every candidate is also compared with.
REFERENCE = "reference"
STATUS_TAG = "validation_status"
REASON_TAG = "promotion_reason"
METRIC_TAG_PREFIX = "test."

DEFAULT_STORE = Path("mlflow")
#: What the last registration did: the register stage's DVC output, kept beside the default registry
#: (git-ignored) so that wherever there is no registry there is no output and DVC registers again.
SUMMARY_PATH = DEFAULT_STORE / "registration.json"


@dataclass(frozen=True)
class Gates:
    """Promotion thresholds (params.yaml ``register.gates``).

    The candidate is compared with two baselines, on the metrics of the same held-out split (the
    caller's ``candidate`` dict: ``crps``, ``pps``, ``ece``, ``low_score_coverage``; the register
    stage passes the test split's):

    * the current champion: ``<metric>_tolerance``, how much worse than the champion it may be;
    * the reference, the model's first champion (alias ``@reference``): ``reference_<metric>_tolerance``.
      The reference does not move when champions replace each other, so a run of candidates each
      slightly worse than the last cannot ratchet the quality down: the total loss is bounded by
      the reference tolerance, not by the number of promotions.

    Relative rules need no number chosen by looking at test results.  The one absolute threshold,
    ``max_dev_ece``, is checked on the candidate's *dev* ECE (``dev_ece``), never a test one.
    A tolerance of None switches that comparison off.
    """

    #: Ceiling on the candidate's dev ECE (``candidate["dev_ece"]``): catches a broken calibration
    #: before any comparison; set from dev numbers.
    max_dev_ece: float | None = 0.08
    crps_tolerance: float | None = 0.02
    pps_tolerance: float | None = 0.01
    ece_tolerance: float | None = 0.01
    low_score_coverage_tolerance: float | None = 0.02
    reference_crps_tolerance: float | None = 0.02
    reference_pps_tolerance: float | None = 0.01
    reference_ece_tolerance: float | None = 0.01
    reference_low_score_coverage_tolerance: float | None = 0.02

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(
                    f"register.gates.{name}={value!r} must be a finite number >= 0 (or null: off)"
                )

    def tolerance(self, metric: str, baseline: str) -> float | None:
        """The tolerance of ``metric`` against ``baseline`` (``champion`` or ``reference``)."""
        prefix = "" if baseline == CHAMPION else f"{baseline}_"
        return getattr(self, f"{prefix}{metric}_tolerance")


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
    """Refuse a local tracking store that does not exist or that MLflow could not read without
    changing it, before MLflow opens (and creates or initialises) it.

    For a SQLite store the database is opened read-only with the standard library (no MLflow
    import): an empty file, a file that is not a SQLite database, a database locked by another
    process (after :data:`LOCK_WAIT_S`), or one without MLflow's tables is refused.

    Raises
    ------
    uamt.core.errors.UamtError
        Naming the missing, empty, corrupt or locked SQLite database file or store folder.
    """
    db = sqlite_path(uri)
    if db is not None:
        if not db.is_file():
            raise UamtError(
                f"tracking store {uri}: database {db} does not exist (nothing was created); check "
                "--tracking-uri / $MLFLOW_TRACKING_URI / register.tracking_uri, or create a new "
                "registry with `uamt registry init`"
            )
        if not sqlite_tables(db) & CORE_TABLES:
            raise UamtError(
                f"tracking store {uri}: database {db} holds no MLflow tables ({db.stat().st_size} bytes): "
                "it is not an MLflow store, and a read-only command does not make it one (nothing was "
                "changed); restore the store from a backup, or move the file aside and create a new "
                "registry with `uamt registry init`"
            )
        return
    folder = _file_store_path(uri)
    if folder is not None and not folder.is_dir():
        raise UamtError(
            f"tracking store {uri}: folder {folder} does not exist (nothing was created); check "
            "--tracking-uri / $MLFLOW_TRACKING_URI"
        )


# ----------------------------------------------------------------------------- a SQLite store's health
#: Seconds a command waits for another process's lock on a SQLite store before it gives up.
LOCK_WAIT_S = 5.0
#: Tables every MLflow database with registered-model aliases has (MLflow >= 2.3): a database
#: holding none of them is not an MLflow store.
CORE_TABLES = frozenset({"experiments", "runs", "registered_models", "model_versions"})


def _sqlite_message(db: Path | str, exc: BaseException) -> str:
    """One line saying what is wrong with SQLite database ``db`` (from a ``sqlite3`` error)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "locked" in text or "busy" in text:
        return (
            f"tracking store {db}: the database is locked by another process ({text}; waited "
            f"{LOCK_WAIT_S:g} s): try again when that process has finished (nothing was changed)"
        )
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return (
            f"tracking store {db}: the database is corrupt ({text}): restore it from a backup, or move "
            "it aside and create a new registry with `uamt registry init` (nothing was changed)"
        )
    return f"tracking store {db}: cannot read the database ({text})"


def sqlite_tables(db: Path) -> set[str]:
    """Names of the tables of SQLite database ``db``, read without writing anything.

    The file is opened read-only (``mode=ro``): a read never creates, initialises or migrates it.

    Raises
    ------
    uamt.core.errors.UamtError
        ``db`` is not a SQLite database, is locked by another process for more than
        :data:`LOCK_WAIT_S` seconds, or cannot be read.
    """
    import sqlite3

    try:
        connection = sqlite3.connect(f"{Path(db).resolve().as_uri()}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
        try:
            rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise UamtError(_sqlite_message(db, exc)) from None
    return {str(name) for (name,) in rows}


def check_store_schema(uri: str) -> None:
    """Refuse, for a read-only command, a SQLite store that MLflow would initialise or migrate when
    it opens it (some of the tables this MLflow version defines are missing).

    Imports MLflow's database models (call it right before MLflow opens the store).
    """
    db = sqlite_path(uri)
    if db is None:
        return
    check_store_exists(uri)
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.db.utils import _all_tables_exist  # noqa: F401 - registers every table of Base

    missing = sorted(set(Base.metadata.tables) - {t for t in sqlite_tables(db) if not t.startswith("alembic_")})
    if missing:
        import mlflow

        raise UamtError(
            f"tracking store {db}: lacks the tables {missing} that MLflow {mlflow.__version__} expects "
            "(a store of an older MLflow); opening it would migrate it, and a read-only command does "
            f"not change a store (nothing was changed): back it up and run `mlflow db upgrade {uri}`"
        )


def _sqlite_error(exc: BaseException | None) -> BaseException | None:
    """The ``sqlite3`` error behind ``exc`` (through SQLAlchemy's ``orig`` and exception chains)."""
    import sqlite3

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, sqlite3.Error):
            return exc
        orig = getattr(exc, "orig", None)
        if isinstance(orig, sqlite3.Error):
            return orig
        exc = exc.__cause__ or exc.__context__
    return None


@contextmanager
def store_errors(uri: str) -> Iterator[None]:
    """Turn a SQLite error raised inside MLflow calls on store ``uri`` (locked, corrupt, unreadable)
    into one :class:`~uamt.core.errors.UamtError` line naming the database; other errors pass."""
    try:
        yield
    except UamtError:
        raise
    except Exception as exc:
        cause = _sqlite_error(exc)
        if cause is None:
            raise
        raise UamtError(_sqlite_message(sqlite_path(uri) or uri, cause)) from None


# ----------------------------------------------------------------------------- a SQLite store's place
def _local_path(location: str) -> Path | None:
    """The local path of a ``file:`` URI or a plain absolute path; None for remote locations."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and location.startswith("/"):
        return Path(location)
    return None


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _copied_store_message(db: Path, evidence: str, original: Path) -> str:
    return (
        f"registry {db} was copied or moved from another place: {evidence}. MLflow keeps absolute "
        f"paths, so this store reads and writes the model files under {original}, not beside {db}. "
        f"For a copied or moved checkout, start a new registry here: move {db.parent} aside, then run "
        "`uamt registry init` and `dvc repro -f -s register` (version numbers restart at 1); or point "
        "$MLFLOW_TRACKING_URI / register.tracking_uri at the original store"
    )


def check_store_location(uri: str) -> None:
    """Refuse a SQLite store whose marker says its database was made at another path (a checkout
    copied with ``cp -a`` or moved).  Stores without a marker, or whose marker records no absolute
    location, pass (see :func:`check_artifacts_inside`)."""
    db = sqlite_path(uri)
    marker = read_marker(uri) if db is not None else None
    if db is None or marker is None:
        return
    recorded = marker.get("db_path")
    if recorded:
        made_at = Path(str(recorded))
    else:  # markers written before db_path: their tracking URI, when it is absolute
        made_at = sqlite_path(str(marker.get("tracking_uri") or ""))
        if made_at is None or not made_at.is_absolute():
            return
    if not _same_file(made_at, db):
        raise UamtError(
            _copied_store_message(db, f"its marker {marker_path(uri)} records it at {made_at}", made_at.parent)
        )


def check_artifacts_inside(uri: str, location: str, what: str) -> None:
    """Refuse ``location`` (model files, or an experiment's artifact root) of SQLite store ``uri``
    when it is a local path outside the database's folder: the files of another copy of the store.

    ``what`` names the location in the message.  Remote locations (``s3://``, ``mlflow-artifacts:``)
    and other kinds of store pass.
    """
    db = sqlite_path(uri)
    path = _local_path(location) if db is not None else None
    if db is None or path is None or _inside(path, db.parent):
        return
    raise UamtError(_copied_store_message(db, f"{what} are at {path}, outside {db.parent}", path))


def artifact_location(uri: str) -> str | None:
    """Where a new experiment of SQLite store ``uri`` keeps its artifacts: ``artifacts/`` beside the
    database (``mlflow/artifacts`` for the default store); None for other stores (their own root)."""
    db = sqlite_path(uri)
    if db is None:
        return None
    return (db.parent / "artifacts").resolve().as_uri()


def check_experiment_location(client, uri: str, experiment: str) -> None:
    """Refuse registering into ``experiment`` of SQLite store ``uri`` when its artifact root lies
    outside the database's folder (registering would write into another copy's files)."""
    if sqlite_path(uri) is None:
        return
    found = client.get_experiment_by_name(experiment)
    if found is not None and found.artifact_location:
        check_artifacts_inside(uri, found.artifact_location, f"the artifacts of experiment {experiment!r}")


#: The metrics compared with the champion and the reference: name in reasons, and whether higher is better.
GATED_METRICS: dict[str, tuple[str, bool]] = {
    "crps": ("CRPS", False),
    "pps": ("PPS", True),
    "ece": ("ECE", False),
    "low_score_coverage": ("bad-segment coverage", True),
}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def promotion_decision(
    candidate: dict[str, float],
    champion: dict[str, float] | None,
    gates: Gates,
    *,
    first_version: bool = True,
    reference: dict[str, float] | None = None,
    champion_version: str | None = None,
    reference_version: str | None = None,
) -> Decision:
    """Decide whether ``candidate`` may replace ``champion``.

    Parameters
    ----------
    candidate, champion, reference : dict
        Metrics with the keys of :data:`GATED_METRICS` on one held-out split (the caller chooses
        which; the register stage: test), and for the candidate also ``dev_ece`` (dev split).
        ``champion``: the current champion's (None when there is none); ``reference``: the first
        champion's (``@reference``; None when no version was ever promoted).
    gates : Gates
    first_version : bool
        With no champion: whether this is the model's first version (none ever promoted), the one
        case where the comparisons are skipped.  Otherwise a missing champion fails the gate: a
        candidate never passes *because* the champion is gone.
    champion_version, reference_version : str, optional
        Named in the reason and the checks.

    Returns
    -------
    Decision
        ``promote`` and a one-line ``reason`` naming every failed check with its numbers and the
        baseline it failed against (``dev``, ``champion vN`` or ``reference vM``).  A comparison
        that could not be made (a baseline registered without that metric) is listed in
        ``checks["not_compared"]``.
    """
    required = [
        m
        for m in GATED_METRICS
        if gates.tolerance(m, CHAMPION) is not None or gates.tolerance(m, REFERENCE) is not None
    ]
    if gates.max_dev_ece is not None:
        required.append("dev_ece")
    for key in required:
        value = candidate.get(key)
        if not _finite(value):
            return Decision(False, f"candidate metric {key}={value!r} is missing or not finite")
    failures = []
    checks: dict[str, Any] = {key: candidate[key] for key in required}
    not_compared: list[str] = []
    if gates.max_dev_ece is not None:
        checks["max_dev_ece"] = gates.max_dev_ece
        if candidate["dev_ece"] > gates.max_dev_ece:
            failures.append(f"dev ECE {candidate['dev_ece']:.4f} > max_dev_ece {gates.max_dev_ece:.4f}")
    for baseline, metrics, version in (
        (CHAMPION, champion, champion_version),
        (REFERENCE, reference, reference_version),
    ):
        if not metrics:
            continue
        label = f"{baseline} v{version}" if version else baseline
        checks[f"{baseline}_version"] = version
        for metric, (name, higher_is_better) in GATED_METRICS.items():
            tolerance = gates.tolerance(metric, baseline)
            if tolerance is None:
                continue
            base = metrics.get(metric)
            checks[f"{baseline}_{metric}"] = base
            if not _finite(base):
                not_compared.append(f"{metric} ({label} has none)")
                continue
            value = candidate[metric]
            if higher_is_better and value < base - tolerance:
                failures.append(f"{name} {value:.4f} worse than {label} {base:.4f} - {tolerance:g}")
            elif not higher_is_better and value > base + tolerance:
                failures.append(f"{name} {value:.4f} worse than {label} {base:.4f} + {tolerance:g}")
    if not_compared:
        checks["not_compared"] = not_compared
    if not champion and not first_version:
        failures.append(
            "no @champion to compare with, although versions of this model were promoted before "
            "(the alias was removed, or this is not the registry they were promoted in); set "
            "@champion to the version to compare against, then register again"
        )
    if failures:
        return Decision(False, "; ".join(failures), checks)
    if champion:
        against = f"champion v{champion_version}" if champion_version else "the current champion"
        if reference:
            against += f" and reference v{reference_version}" if reference_version else " and the reference"
        return Decision(True, f"passed all gates against {against}", checks)
    return Decision(
        True, "first version: no champion yet; passed the dev ECE gate; it becomes the reference", checks
    )


def _same_store(a: str, b: str) -> bool:
    """Whether URIs ``a`` and ``b`` name one store (``sqlite:////x.db`` and ``sqlite:///../x.db`` may)."""
    if a == b:
        return True
    db_a, db_b = sqlite_path(a), sqlite_path(b)
    return db_a is not None and db_b is not None and _same_file(db_a, db_b)


def registry_uri(tracking: str) -> str:
    """The model-registry store read with tracking store ``tracking``: ``$MLFLOW_REGISTRY_URI`` where the
    user set it (MLflow's own rule), else ``tracking`` itself."""
    return os.environ.get("MLFLOW_REGISTRY_URI") or tracking


def registry_origin(tracking: str) -> str:
    """Where the models of tracking store ``tracking`` are looked up, for messages: ``tracking`` itself,
    or the other registry ``$MLFLOW_REGISTRY_URI`` names."""
    registry = registry_uri(tracking)
    if _same_store(registry, tracking):
        return tracking
    return f"{registry} (the registry $MLFLOW_REGISTRY_URI names; tracking store {tracking})"


def use_store(tracking: str) -> str:
    """Point MLflow's process-wide tracking and registry URIs at ``tracking`` and its registry
    (:func:`registry_uri`); returns the registry URI."""
    import mlflow

    registry = registry_uri(tracking)
    users = os.environ.get("MLFLOW_REGISTRY_URI")
    mlflow.set_tracking_uri(tracking)
    mlflow.set_registry_uri(registry)
    # MLflow also exports it to $MLFLOW_REGISTRY_URI, where it would pass for the user's choice and
    # name this store as the registry of the next one; MLflow's process-wide setting is enough.
    if users is None:
        os.environ.pop("MLFLOW_REGISTRY_URI", None)
    else:
        os.environ["MLFLOW_REGISTRY_URI"] = users
    return registry


def _client(uri: str):
    """A client that registers into, and manages, the registry of tracking store ``uri``.

    Raises
    ------
    uamt.core.errors.UamtError
        ``$MLFLOW_REGISTRY_URI`` names another store: registering there would put the champions where
        this project's marker, artifact checks and ``make run``'s champion check do not look.
    """
    from mlflow import MlflowClient

    registry = registry_uri(uri)
    if not _same_store(registry, uri):
        raise UamtError(
            f"$MLFLOW_REGISTRY_URI={registry} names another registry than the tracking store {uri}: uamt "
            "registers, gates and moves @champion in the tracking store's own registry (its marker and "
            "artifact folder live beside it), so it does not write a separate registry; unset "
            f"$MLFLOW_REGISTRY_URI, or set it to {uri} (serving reads a separate registry: `uamt score` and "
            "`uamt serve` honour it)"
        )
    use_store(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _metric_tags(version) -> dict[str, float]:
    """A version's gated metrics, from its ``test.*`` tags (a tag that is not a number is left out)."""
    metrics = {}
    for key, value in version.tags.items():
        if key.startswith(METRIC_TAG_PREFIX):
            try:
                metrics[key[len(METRIC_TAG_PREFIX) :]] = float(value)
            except ValueError:  # "None": a metric the evaluation could not compute
                continue
    return metrics


def champion_metrics(client, name: str) -> tuple[str | None, dict[str, float] | None]:
    """The champion's version and its test metrics (from its ``test.*`` tags), or (None, None)."""
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException as exc:
        if _sqlite_error(exc) is not None:  # a locked or corrupt store is not "no champion"
            raise
        return None, None
    return str(version.version), _metric_tags(version)


def reference_metrics(
    client, name: str, exclude: str | None = None
) -> tuple[str | None, dict[str, float] | None, bool]:
    """The reference (floor) version, its metrics, and whether the ``@reference`` alias names it.

    The reference is the model's first champion, aliased ``@reference`` when it was promoted.  A
    registry from before the alias (or one whose alias was removed) falls back to the earliest
    version ever promoted (or the champion), so the floor never disappears and never moves up by
    itself.  To set the floor on purpose (e.g. after the test set changed, when old metrics are no
    longer comparable), point the alias at another version.  ``exclude``: the candidate.
    """
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(name, REFERENCE)
        if str(version.version) != str(exclude):
            return str(version.version), _metric_tags(version), True
    except MlflowException:
        pass
    champion_version, _ = champion_metrics(client, name)
    earlier = promoted_versions(client, name, exclude=exclude)
    if champion_version is not None and champion_version != str(exclude):
        earlier.append(champion_version)
    if not earlier:
        return None, None, False
    first = min(earlier, key=int)
    return first, _metric_tags(client.get_model_version(name, first)), False


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

    The candidate is compared with the champion and with the reference (``@reference``, the first
    champion; see :class:`Gates`).  On a pass the ``champion`` alias moves first and the ``passed``
    status follows, so an interruption at any point never shows a ``passed`` version that is not
    champion (see the module docstring); on a fail the version is tagged ``rejected`` and gets
    ``challenger``.  The first version promoted becomes ``@reference``; a registry without the
    alias gets it on its earliest promoted version.
    """
    champion_version, champion = champion_metrics(client, name)
    if champion_version == version:
        champion_version, champion = None, None
    reference_version, reference, aliased = reference_metrics(client, name, exclude=version)
    if reference_version is not None and not aliased:  # a registry from before the alias: adopt its floor
        client.set_registered_model_alias(name, REFERENCE, reference_version)
    first = champion_version is None and not promoted_versions(client, name, exclude=version)
    decision = promotion_decision(
        metrics,
        champion,
        gates,
        first_version=first,
        reference=reference,
        champion_version=champion_version,
        reference_version=reference_version,
    )
    client.set_model_version_tag(name, version, REASON_TAG, decision.reason)
    client.set_model_version_tag(name, version, "gate_checks", json.dumps(decision.checks, default=str))
    if decision.promote:
        client.set_registered_model_alias(name, CHAMPION, str(version))  # the commit point
        client.set_model_version_tag(name, version, STATUS_TAG, "passed")
        if champion_version is not None:
            client.set_model_version_tag(name, champion_version, "replaced_by", str(version))
        if reference_version is None:  # the first champion: the floor from now on
            client.set_registered_model_alias(name, REFERENCE, str(version))
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
    check_store_location(uri)
    check_store_schema(uri)
    with store_errors(uri):
        client = _client(uri)
        try:
            model = client.get_registered_model(name)
        except MlflowException as exc:
            if _sqlite_error(exc) is not None:
                raise
            raise UamtError(f"no registered model named {name!r} in {uri}") from exc
        versions = client.search_model_versions(f"name='{name}'")
    aliases_by_version: dict[str, list[str]] = {}
    for alias, version in (model.aliases or {}).items():
        aliases_by_version.setdefault(str(version), []).append(alias)
    rows = []
    for version in sorted(versions, key=lambda v: -int(v.version)):
        tags = version.tags
        rows.append(
            {
                "version": str(version.version),
                "aliases": ",".join(sorted(aliases_by_version.get(str(version.version), []))),
                "status": tags.get(STATUS_TAG, ""),
                "method": tags.get("method", ""),
                "data_version": tags.get("data_version", ""),
                "ece": tags.get(f"{METRIC_TAG_PREFIX}ece", ""),
                "crps": tags.get(f"{METRIC_TAG_PREFIX}crps", ""),
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
    uamt.core.errors.UamtError
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
        The average test metrics the gate compares (``ece``, ``crps``, ``pps``, ...); stored as
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
    from uamt.serving.calibrated_predictor import pip_requirements

    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)  # registering writes; reading never creates
    client = _client(uri)
    if mlflow.get_experiment_by_name(experiment) is None:
        mlflow.create_experiment(experiment, artifact_location=artifact_location(uri))
    check_experiment_location(client, uri, experiment)  # a copied store: never write the original's files
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
    _share_with_earlier_versions(client, uri, getattr(info, "model_id", None))
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


def _share_with_earlier_versions(client, uri: str, model_id: str | None) -> None:
    """Store the new model's large files once with identical ones of earlier versions (hard links,
    :mod:`uamt.registry.shared_files`); only for a SQLite store's own local artifact root."""
    from uamt.registry.shared_files import share_identical_files

    root = _local_artifact_root(uri)
    if root is None or model_id is None:
        return
    location = urlparse(client.get_logged_model(model_id).artifact_location)
    folder = Path(unquote(location.path))
    if location.scheme != "file" or not folder.is_relative_to(root):
        return  # an artifact root of its own (remote, or set elsewhere): left as MLflow wrote it
    saved = share_identical_files(folder, root)
    if saved:
        log.info("%s: %.0f MB stored once with earlier versions (hard links)", folder, saved / 1e6)


def _local_artifact_root(uri: str) -> Path | None:
    root = artifact_location(uri)
    return None if root is None else Path(unquote(urlparse(root).path))


def share_stored_files(uri: str) -> tuple[int, int]:
    """``uamt registry compact``: every model folder of SQLite store ``uri`` (those holding an
    ``MLmodel``) through :func:`~uamt.registry.shared_files.share_identical_files`, oldest first.

    Returns
    -------
    (int, int)
        Bytes now stored once, and model folders visited.

    Raises
    ------
    UamtError
        ``uri`` is no SQLite store, or its artifact folder does not exist.
    """
    from uamt.registry.shared_files import SHARED_DIR, share_identical_files

    root = _local_artifact_root(uri)
    if root is None:
        raise UamtError(f"{uri}: compacting works on a SQLite store with local artifacts (mlflow/artifacts)")
    if not root.is_dir():
        raise UamtError(f"{root}: no artifact folder; nothing registered in {uri}")
    folders = sorted(
        (path.parent for path in root.rglob("MLmodel") if SHARED_DIR not in path.relative_to(root).parts),
        key=lambda folder: (folder / "MLmodel").stat().st_mtime,
    )
    return sum(share_identical_files(folder, root) for folder in folders), len(folders)


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
    from uamt.core.fileio import atomic_write_json

    path = marker_path(uri)
    if path is not None:
        # Where the database is: a copy of the store (with its marker) is told apart by this.
        data = {**data, "db_path": str(sqlite_path(uri).resolve())}
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
    existed = db is None or holds_store(db)
    if db is not None and not existed and marker is not None and not replace_missing:
        raise UamtError(
            f"registry {db} {_absence(db)} but existed ({marker_path(uri)} records "
            f"{_describe_models(marker.get('models', {})) or 'it'}): restore the database, or pass "
            "--replace-missing to start a new registry on purpose (version numbers restart at 1)"
        )
    if db is not None and existed and marker is not None:
        check_store_location(uri)  # a copied store is not this checkout's registry
    if db is not None and not existed:
        db.parent.mkdir(parents=True, exist_ok=True)
        _forget_open_store(uri)
    with store_errors(uri):
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


def holds_store(db: Path) -> bool:
    """Whether SQLite file ``db`` exists and holds an MLflow store (an empty file does not);
    UamtError when it is corrupt or locked."""
    return db.is_file() and bool(sqlite_tables(db) & CORE_TABLES)


def _absence(db: Path) -> str:
    """``is gone`` or ``is empty (N bytes, no MLflow tables)``: how a registry is not at ``db``."""
    if not db.is_file():
        return "is gone"
    return f"is empty ({db.stat().st_size} bytes, no MLflow tables)"


def prepare_store(
    uri: str, *, allow_new: bool, expected: dict[str, str] | None = None, experiment: str | None = None
) -> str:
    """Check, before registering anything, that ``uri`` is the registry this project registers into.

    Parameters
    ----------
    allow_new : bool
        ``register.allow_new_registry``: create a missing SQLite registry when nothing says one
        existed (no marker, no ``expected`` version).  Never replaces one that existed.
    expected : dict, optional
        model name -> a version the registry must hold (from the previous :data:`SUMMARY_PATH`).
    experiment : str, optional
        The MLflow experiment the registration logs to: its artifact root must lie beside the
        database (:func:`check_experiment_location`).

    Raises
    ------
    uamt.core.errors.UamtError
        The registry existed and is gone (or its database is empty), or does not hold the versions
        its marker (or ``expected``) names; there is none and ``allow_new`` is false; the store was
        copied or moved from another checkout; its database is corrupt or locked.
    """
    db = sqlite_path(uri)
    if db is not None:
        _forget_open_store(uri)  # check (and then write) the file that is there now, not a cached one
    marker = read_marker(uri)
    expected = dict(expected or {})
    hint_new = (
        f"create it with `uamt registry init --tracking-uri {uri}` (or set register.allow_new_registry: true)"
    )
    if db is not None and not holds_store(db):
        if marker is not None or expected:
            known = _describe_models(marker.get("models", {})) if marker else ""
            known = known or ", ".join(f"{n} version {v}" for n, v in sorted(expected.items())) or "it"
            source = marker_path(uri) if marker is not None else f"the previous {SUMMARY_PATH}"
            raise UamtError(
                f"registry {db} {_absence(db)}, but it existed ({source} records {known}); a new empty "
                "registry would restart version numbers at 1, so models:/NAME/1 would silently name "
                "another model. Restore the database (or point register.tracking_uri at it); to start "
                f"a new registry on purpose run `uamt registry init --tracking-uri {uri} --replace-missing`"
            )
        if not allow_new:
            empty = f" ({db.name} {_absence(db)})" if db.is_file() else ""
            raise UamtError(f"no registry at {db}{empty}: {hint_new}")
        return init_store(uri, created_by="register.allow_new_registry")
    check_store_location(uri)
    with store_errors(uri):
        return _check_registered_versions(uri, marker, expected, allow_new, experiment, hint_new)


def _check_registered_versions(
    uri: str,
    marker: dict[str, Any] | None,
    expected: dict[str, str],
    allow_new: bool,
    experiment: str | None,
    hint_new: str,
) -> str:
    """:func:`prepare_store` on an existing store: the versions its record names are there."""
    db = sqlite_path(uri)
    client = _client(uri)
    if experiment is not None:
        check_experiment_location(client, uri, experiment)
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
        except MlflowException as exc:
            if _sqlite_error(exc) is not None:  # locked or corrupt: not an absent version
                raise
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
    with store_errors(uri):
        state = _model_state(_client(uri), name)
    if state is not None:
        marker.setdefault("models", {})[name] = {**state, "recorded": _now()}
    _write_marker(uri, marker)
