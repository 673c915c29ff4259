"""New human annotations: validate incoming files and append them to the training pool.

Files dropped into ``incoming.dir`` (``data/incoming``) as ``.csv``, ``.tsv``, ``.jsonl`` or
``.parquet`` hold one rated (source, translation) pair per row in the canonical format:

=================== ======== ===============================================================
column              required meaning
=================== ======== ===============================================================
``dataset``         yes      one of :data:`uamt.data.datasets.DATASETS` (the score scale)
``lp``              yes      a language pair of that dataset (``incoming.lps``)
``src``, ``mt``     yes      source and translation (non-blank)
``ref``             ref-based required (non-blank) for the reference-based datasets
``score``           yes      finite number on the dataset's ``score`` scale, inside ``score_bounds``
``system``          yes      MT system name (non-blank)
``doc``             no       document id (default: one pseudo-document per row, keyed by file)
``seg_id``          no       integer segment id (default: the row number)
``score_std``       no       std of the per-annotator scores (>= 0)
``n_annotators``    no       integer >= 1 (default: len(annotator_scores) or 1)
``annotator_scores`` no      list, JSON list or ``|``-separated numbers on the ``score`` scale
=================== ======== ===============================================================

:func:`validate_file` reads one file and returns every problem it finds, each naming the file,
the row (1-based data row; ``line`` = line of a text file) and the field.  :func:`ingest_incoming`
validates every new file and, per ``incoming.on_bad_rows``, either rejects a file with any bad row
(``reject_file``) or takes its good rows (``keep_good``); nothing is half-ingested: the pool is
rewritten atomically (temp file + ``os.replace``), then the manifest, then the file is moved to
``processed/`` (or ``rejected/`` with ``<name>.report.txt``).  A file whose sha256 was ingested
before (recorded in the pool's ``source_sha256`` column and in ``manifest.json``) is never
ingested again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import hashlib
import io
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from uamt.config import DEFAULT_PARAMS, ConfigError, load_section
from uamt.data.datasets import DATASET_SPECS, DATASETS
from uamt.data.schema import COLUMNS, decode_text, sample_std, to_arrow
from uamt.errors import DataError, UamtError
from uamt.fileio import atomic_path, atomic_write_text

log = logging.getLogger(__name__)

SECTION = "incoming"
SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet")
REQUIRED = ("dataset", "lp", "src", "mt", "score", "system")
OPTIONAL = ("ref", "doc", "seg_id", "score_std", "n_annotators", "annotator_scores", "score_raw", "domain")
#: Column kept in the pool (not in the canonical table) so a file is never ingested twice.
SHA_COLUMN = "source_sha256"

# Bounds, language pairs and domains of new rows come from the dataset declarations.
DEFAULT_BOUNDS = {name: spec.score_range for name, spec in DATASET_SPECS.items()}
DEFAULT_LPS = {name: spec.lps for name, spec in DATASET_SPECS.items()}


@dataclass(frozen=True)
class IncomingConfig:
    """params.yaml ``incoming:`` section (the scheduled retrain on new annotations).

    Attributes
    ----------
    dir : str
        Folder watched for new files; ``processed/`` and ``rejected/`` are created inside it.
    pool_path : str
        The training pool parquet (DVC-tracked; ``prepare.annotations_pool`` must name it).
    manifest_path : str
        JSON record of every ingested file: name, sha256, rows taken/rejected, time.
    on_bad_rows : {"reject_file", "keep_good"}
        A file with bad rows is rejected whole, or only its good rows are taken.
    interval_minutes : int
        How often the deployment ``uamt-retrain`` runs.
    lock_path : str
        ``fcntl`` lock held during ingestion + retrain: a second retrain waits ``lock_timeout_s``
        seconds (0: at once) and then exits without touching anything.
    retrain_with : {"flow", "dvc"}
        ``flow``: run the stage tasks prepare -> register in-process (Prefect tasks, cached);
        ``dvc``: ``dvc repro register`` in a subprocess (keeps ``dvc.lock`` in step).
    task_runner : {"default", "dask"}
        ``dask``: the independent tasks (one ``train_base`` per method) run on a Dask cluster.
    dask_address : str or None
        Scheduler address of an existing cluster; null = a LocalCluster started by the flow.
    dask_workers : int
        Workers of that LocalCluster (one thread each).
    score_bounds : dict
        dataset -> [low, high]: scores outside are rejected (MQM [-25, 0], DA z [-10, 10], ...).
    lps : dict
        dataset -> accepted language pairs.
    """

    dir: str = "data/incoming"
    pool_path: str = "data/annotations/pool.parquet"
    manifest_path: str = "data/annotations/manifest.json"
    on_bad_rows: Literal["reject_file", "keep_good"] = "reject_file"
    interval_minutes: int = 60
    lock_path: str = "data/.retrain.lock"
    lock_timeout_s: float = 0.0
    retrain_with: Literal["flow", "dvc"] = "flow"
    task_runner: Literal["default", "dask"] = "default"
    dask_address: str | None = None
    dask_workers: int = 2
    score_bounds: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_BOUNDS))
    lps: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_LPS))

    def __post_init__(self) -> None:
        for name in (*self.score_bounds, *self.lps):
            if name not in DATASETS:
                raise ConfigError(
                    f"{SECTION}: dataset={name!r} not supported; choose from {sorted(DATASETS)}"
                )
        for name, bounds in self.score_bounds.items():
            if len(bounds) != 2 or not bounds[0] < bounds[1]:
                raise ConfigError(f"{SECTION}.score_bounds.{name} must be [low, high] with low < high")
        if self.interval_minutes < 1:
            raise ConfigError(f"{SECTION}.interval_minutes must be >= 1")
        if self.dask_workers < 1:
            raise ConfigError(f"{SECTION}.dask_workers must be >= 1")


def load_config(path: str | Path = DEFAULT_PARAMS) -> IncomingConfig:
    return load_section(IncomingConfig, SECTION, path)


# ----------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Problem:
    """One bad row (``row`` 1-based data row, ``line`` file line where the format has lines)."""

    row: int | None
    field: str
    message: str
    line: int | None = None

    def describe(self, file: str) -> str:
        where = file
        if self.row is not None:
            where += f": row {self.row}"
            if self.line is not None:
                where += f" (line {self.line})"
        return f"{where}: field {self.field!r}: {self.message}"


@dataclass
class Validation:
    """What :func:`validate_file` found in one file."""

    path: Path
    sha256: str
    n_rows: int = 0
    first_line: int | None = None
    file_problems: list[Problem] = field(default_factory=list)
    row_problems: list[Problem] = field(default_factory=list)
    good: pd.DataFrame | None = None  # canonical rows that passed every check

    @property
    def bad_rows(self) -> set[int]:
        return {p.row for p in self.row_problems if p.row is not None}

    @property
    def ok(self) -> bool:
        return not self.file_problems and not self.row_problems

    def report(self) -> str:
        name = str(self.path)
        lines = [
            f"file: {name}",
            f"sha256: {self.sha256}",
            f"rows: {self.n_rows}, bad rows: {len(self.bad_rows)}",
        ]
        lines += [p.describe(name) for p in self.file_problems + self.row_problems]
        return "\n".join(lines) + "\n"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_table(path: Path, data: bytes) -> tuple[pd.DataFrame, int | None]:
    """The rows of an incoming file as strings/objects, and the file line of data row 1 (None: no lines).

    Raises
    ------
    DataError
        Not UTF-8 (names the line), or not parseable in its format.
    """
    suffix = path.suffix.lower()
    name = str(path)
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            return pq.read_table(io.BytesIO(data)).to_pandas(), None
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
            raise DataError(f"{name}: cannot read as parquet ({exc})") from exc
    text = decode_text(data, name)  # DataError naming the line of a non-UTF-8 byte
    if suffix == ".jsonl":
        records = []
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{name}: line {number}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise DataError(f"{name}: line {number}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
        return pd.DataFrame.from_records(records), 1
    # TSV is read verbatim (no quoting: MT text often starts with a quote mark); CSV is standard CSV.
    sep = "\t" if suffix == ".tsv" else ","
    try:
        frame = pd.read_csv(
            io.StringIO(text), sep=sep, dtype=str, keep_default_na=False, quoting=3 if sep == "\t" else 0
        )
    except Exception as exc:  # noqa: BLE001 - the csv parser raises several types
        raise DataError(f"{name}: cannot parse as {suffix[1:]} ({exc})") from exc
    return frame, 2


def _blank(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _number(value: Any) -> float | None:
    """A finite float, or None for NaN / inf / text / blank."""
    if isinstance(value, bool) or _blank(value):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _score_list(value: Any) -> list[float] | None:
    """``annotator_scores`` as floats (list, JSON list or ``|``-separated); None if malformed."""
    if _blank(value):
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return None
        else:
            value = text.split("|")
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        return None
    numbers = [_number(v) for v in value]
    return None if any(n is None for n in numbers) else numbers  # type: ignore[return-value]


def validate_frame(
    frame: pd.DataFrame, path: Path, sha256: str, first_line: int | None, cfg: IncomingConfig
) -> Validation:
    """Check every row of an incoming table; see the module docstring for the rules."""
    result = Validation(path=path, sha256=sha256, n_rows=len(frame), first_line=first_line)
    frame = frame.rename(columns=lambda c: str(c).strip())
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        lower = {str(c).lower(): c for c in frame.columns}
        unknown = sorted(set(map(str, frame.columns)) - set(REQUIRED) - set(OPTIONAL))
        for column in missing:
            hint = f" (found {lower[column]!r}: wrong case?)" if column in lower else ""
            result.file_problems.append(
                Problem(
                    None,
                    column,
                    f"required column missing{hint}; unrecognised columns {unknown} (renamed?)",
                )
            )
        return result
    if frame.empty:
        result.file_problems.append(Problem(None, "*", "no data rows"))
        return result

    def problem(i: int, column: str, message: str) -> None:
        line = None if first_line is None else first_line + i
        result.row_problems.append(Problem(i + 1, column, message, line))

    stem = path.stem
    rows: list[dict[str, Any] | None] = []
    for i, record in enumerate(frame.to_dict(orient="records")):
        before = len(result.row_problems)
        dataset = record.get("dataset")
        dataset = dataset.strip() if isinstance(dataset, str) else dataset
        lp = record.get("lp")
        lp = lp.strip() if isinstance(lp, str) else lp
        if dataset not in DATASETS:
            problem(i, "dataset", f"unknown dataset {dataset!r}; choose from {sorted(DATASETS)}")
        elif lp not in cfg.lps.get(dataset, ()):
            problem(
                i,
                "lp",
                f"unknown language pair {lp!r} for {dataset}; known: {list(cfg.lps.get(dataset, ()))}",
            )
        texts = {}
        for column in ("src", "mt", "system"):
            value = record.get(column)
            if _blank(value) or not isinstance(value, str):
                problem(i, column, f"empty or whitespace-only ({value!r})")
            texts[column] = value
        ref = record.get("ref")
        if _blank(ref):
            ref = None
            if DATASET_SPECS[dataset].reference_based:
                problem(i, "ref", f"empty, but {dataset} is reference-based")
        elif not isinstance(ref, str):
            problem(i, "ref", f"must be text, got {ref!r}")
        score = _number(record.get("score"))
        if score is None:
            problem(i, "score", f"must be a finite number, got {record.get('score')!r}")
        elif dataset in cfg.score_bounds:
            low, high = cfg.score_bounds[dataset]
            if not low <= score <= high:
                problem(i, "score", f"{score} outside the {dataset} scale [{low}, {high}]")
        annotator_scores = _score_list(record.get("annotator_scores"))
        if annotator_scores is None:
            problem(
                i,
                "annotator_scores",
                f"must be a list of finite numbers, got {record.get('annotator_scores')!r}",
            )
            annotator_scores = []
        score_std = math.nan
        if not _blank(record.get("score_std")):
            value = _number(record.get("score_std"))
            if value is None or value < 0:
                problem(i, "score_std", f"must be a finite number >= 0, got {record.get('score_std')!r}")
            else:
                score_std = value
        elif len(annotator_scores) >= 2:
            score_std = sample_std(annotator_scores)
        n_annotators = max(len(annotator_scores), 1)
        if not _blank(record.get("n_annotators")):
            value = _number(record.get("n_annotators"))
            if value is None or value < 1 or value != int(value):
                problem(i, "n_annotators", f"must be an integer >= 1, got {record.get('n_annotators')!r}")
            else:
                n_annotators = int(value)
        seg_id = i + 1
        if not _blank(record.get("seg_id")):
            value = _number(record.get("seg_id"))
            if value is None or value != int(value):
                problem(i, "seg_id", f"must be an integer, got {record.get('seg_id')!r}")
            else:
                seg_id = int(value)
        score_raw = score
        if not _blank(record.get("score_raw")):
            score_raw = _number(record.get("score_raw"))
            if score_raw is None:
                problem(i, "score_raw", f"must be a finite number, got {record.get('score_raw')!r}")
        doc = record.get("doc")
        doc = doc.strip() if isinstance(doc, str) and doc.strip() else f"incoming/{stem}/{sha256[:8]}/{i + 1}"
        domain = record.get("domain")
        if len(result.row_problems) > before:
            rows.append(None)
            continue
        rows.append(
            {
                "dataset": dataset,
                "split": "",
                "lp": lp,
                "src": texts["src"],
                "mt": texts["mt"],
                "ref": ref,
                "refs": [ref] if ref is not None else [],
                "score": score,
                "score_raw": score_raw,
                "score_std": score_std,
                "n_annotators": n_annotators,
                "annotator_scores": annotator_scores or [score],
                "doc": doc,
                "system": texts["system"].strip(),
                "seg_id": seg_id,
                "domain": domain.strip()
                if isinstance(domain, str) and domain.strip()
                else DATASET_SPECS[dataset].domain,
                "year": dt.datetime.now(dt.UTC).year,
                "group": "",
            }
        )
    # Same (dataset, lp, system, src, mt) with different scores: every copy is rejected, since
    # there is no telling which judgement is right.  Exact repeats keep the first copy.
    seen: dict[tuple, tuple[int, float]] = {}
    for i, row in enumerate(rows):
        if row is None:
            continue
        key = (row["dataset"], row["lp"], row["system"], row["src"], row["mt"])
        if key in seen:
            first, first_score = seen[key]
            if first_score != row["score"]:
                problem(
                    i, "score", f"duplicate of row {first + 1} (same system, src, mt) with a different score"
                )
                if rows[first] is not None:
                    problem(
                        first,
                        "score",
                        f"duplicate of row {i + 1} (same system, src, mt) with a different score",
                    )
                    rows[first] = None
            rows[i] = None
        else:
            seen[key] = (i, row["score"])
    kept = [i for i, row in enumerate(rows) if row is not None]
    # Indexed by the 0-based data row, so later checks can still name the row.
    result.good = pd.DataFrame([rows[i] for i in kept], index=kept, columns=list(COLUMNS))
    return result


def validate_file(path: str | Path, cfg: IncomingConfig | None = None) -> Validation:
    """Read and validate one incoming file; never raises for bad content (it is in the result)."""
    cfg = cfg or IncomingConfig()
    path = Path(path)
    data = path.read_bytes()
    sha = sha256_bytes(data)
    try:
        frame, first_line = read_table(path, data)
    except DataError as exc:
        result = Validation(path=path, sha256=sha)
        message = str(exc)
        message = message[len(str(path)) + 2 :] if message.startswith(f"{path}: ") else message
        result.file_problems.append(Problem(None, "*", message))
        return result
    return validate_frame(frame, path, sha, first_line, cfg)


# ----------------------------------------------------------------------------- the pool


def read_pool(path: str | Path) -> pd.DataFrame:
    """The pool with its ``source_sha256`` column (empty frame if the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return pd.DataFrame(columns=[*COLUMNS, SHA_COLUMN])
    return pd.read_parquet(path)


def write_pool(frame: pd.DataFrame, path: str | Path) -> None:
    """Write the pool atomically: a temp file in the same folder, then ``os.replace``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = to_arrow(frame)
    table = table.append_column(SHA_COLUMN, pa.array(frame[SHA_COLUMN].astype(str).tolist(), pa.string()))
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _write_text_creating_folder(path: Path, text: str) -> None:
    """Atomic write; unlike :func:`uamt.fileio.atomic_write_text`, a missing folder is created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


def read_manifest(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        return {"files": []}
    return json.loads(path.read_text(encoding="utf-8"))


def new_files(folder: str | Path) -> list[Path]:
    """Incoming files waiting in ``folder`` (not in its sub-folders; hidden/partial files skipped)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.suffix.lower() in SUFFIXES and not p.name.startswith((".", "~"))
    )


def _move(path: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    if target.exists():
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")
        target = folder / f"{stamp}-{path.name}"
    shutil.move(str(path), target)
    return target


@dataclass
class IngestResult:
    """What one ingestion pass did."""

    ingested: list[str] = field(default_factory=list)  # files whose rows joined the pool
    rejected: list[str] = field(default_factory=list)  # files moved to rejected/
    rows_added: int = 0
    rows_rejected: int = 0
    reports: dict[str, str] = field(default_factory=dict)  # file name -> report path

    @property
    def changed(self) -> bool:
        return self.rows_added > 0


def ingest_incoming(cfg: IncomingConfig) -> IngestResult:
    """Validate every new file in ``cfg.dir`` and append the accepted rows to the pool.

    Per file: all rows good -> all appended; some bad -> ``reject_file``: nothing appended, file
    to ``rejected/`` with ``<name>.report.txt``; ``keep_good``: the good rows appended, file to
    ``processed/`` with the report beside it.  The pool (then the manifest) is written once per
    accepted file, atomically, before the file is moved, so an interruption leaves either the
    old pool or the new one, and a file ingested but not yet moved is recognised by its sha256.
    Call it under :func:`retrain_lock`.
    """
    result = IngestResult()
    incoming = Path(cfg.dir)
    processed, rejected = incoming / "processed", incoming / "rejected"
    manifest_path = Path(cfg.manifest_path)
    for path in new_files(incoming):
        pool = read_pool(cfg.pool_path)
        manifest = read_manifest(manifest_path)
        known = set(pool[SHA_COLUMN].astype(str)) | {f["sha256"] for f in manifest["files"]}
        check = validate_file(path, cfg)
        if check.sha256 in known:
            check.file_problems.append(Problem(None, "*", "already ingested (same sha256): not added again"))
        elif check.good is not None and len(check.good) and len(pool):
            _check_against_pool(check, pool)
        accept = not check.file_problems and (check.ok or cfg.on_bad_rows == "keep_good")
        usable = check.good.reset_index(drop=True) if accept and check.good is not None else None
        if usable is not None and len(usable):
            usable = usable.assign(**{SHA_COLUMN: check.sha256})
            merged = pd.concat([pool, usable], ignore_index=True) if len(pool) else usable
            write_pool(merged.reset_index(drop=True), cfg.pool_path)
            manifest["files"].append(
                {
                    "file": path.name,
                    "sha256": check.sha256,
                    "rows": check.n_rows,
                    "rows_added": len(usable),
                    "rows_rejected": len(check.bad_rows),
                    "ingested_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                }
            )
            _write_text_creating_folder(manifest_path, json.dumps(manifest, indent=2) + "\n")
            result.ingested.append(path.name)
            result.rows_added += len(usable)
            result.rows_rejected += len(check.bad_rows)
            target = _move(path, processed)
            if not check.ok:
                report = target.with_name(target.name + ".report.txt")
                _write_text_creating_folder(report, check.report())
                result.reports[path.name] = str(report)
            log.info("ingested %s: %d row(s) added, %d rejected", path.name, len(usable), len(check.bad_rows))
        else:
            if check.ok and not len(check.good):
                check.file_problems.append(Problem(None, "*", "no usable rows"))
            target = _move(path, rejected)
            report = target.with_name(target.name + ".report.txt")
            _write_text_creating_folder(report, check.report())
            result.rejected.append(path.name)
            result.rows_rejected += check.n_rows
            result.reports[path.name] = str(report)
            log.warning("rejected %s: see %s", path.name, report)
    return result


def _check_against_pool(check: Validation, pool: pd.DataFrame) -> None:
    """Rows repeating a pooled (dataset, lp, system, src, mt) with another score are bad rows too."""
    keys = ["dataset", "lp", "system", "src", "mt"]
    pooled = {tuple(k): float(v) for *k, v in pool[[*keys, "score"]].itertuples(index=False)}
    conflicts = []
    for index, row in check.good.iterrows():
        previous = pooled.get(tuple(row[k] for k in keys))
        if previous is not None and previous != float(row["score"]):
            conflicts.append(index)
            line = None if check.first_line is None else check.first_line + int(index)
            check.row_problems.append(
                Problem(
                    int(index) + 1,
                    "score",
                    f"same system, src and mt already in the pool with score {previous}, here {row['score']}",
                    line,
                )
            )
    if conflicts:
        check.good = check.good.drop(index=conflicts)


# ----------------------------------------------------------------------------- locking


class RetrainBusy(UamtError):
    """Another retrain holds the lock."""


@contextlib.contextmanager
def retrain_lock(path: str | Path, timeout_s: float = 0.0, poll_s: float = 0.2) -> Iterator[Path]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created if needed) for the block.

    Waits up to ``timeout_s`` seconds for another holder to finish, then raises
    :class:`RetrainBusy`.  The lock is the OS's, so a crashed holder never leaves it stuck.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with open(path, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RetrainBusy(f"{path}: another retrain is running; try again later") from None
                time.sleep(poll_s)
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} since {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}\n")
            handle.flush()
            yield path
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- command line


def init_pool(cfg: IncomingConfig) -> bool:
    """Create an empty pool file if there is none (dvc.yaml lists it as a dep); True if created."""
    if Path(cfg.pool_path).exists():
        return False
    empty = pd.DataFrame({c: pd.Series(dtype=object) for c in [*COLUMNS, SHA_COLUMN]})
    write_pool(empty, cfg.pool_path)
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m uamt.incoming {validate FILE... | ingest | init-pool} [--params params.yaml]``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m uamt.incoming", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["validate", "ingest", "init-pool"])
    parser.add_argument("files", nargs="*", help="validate: files to check (nothing is moved or written)")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.params)
        if args.action == "validate":
            bad = 0
            for name in args.files:
                check = validate_file(name, cfg)
                print(check.report(), end="")
                bad += not check.ok
            return 1 if bad else 0
        if args.action == "init-pool":
            print(f"{cfg.pool_path}: {'created (empty)' if init_pool(cfg) else 'exists'}")
            return 0
        with retrain_lock(cfg.lock_path, cfg.lock_timeout_s):
            result = ingest_incoming(cfg)
        print(json.dumps(dataclasses.asdict(result), indent=2))
        return 0
    except (UamtError, ConfigError) as exc:
        print(f"uamt.incoming: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
