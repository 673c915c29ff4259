"""The training pool of new annotations and its all-or-nothing transactions (ingest, withdraw, recover).

:func:`validate_file` reads one file and returns every problem it finds, each naming the file,
the row (1-based data row; ``line`` = line of a text file) and the field.  :func:`ingest_incoming`
validates every new file and, per ``incoming.on_bad_rows``, either rejects a file with any bad row
(``reject_file``) or takes its good rows (``keep_good``); nothing is half-ingested: each accepted
file is one transaction -- a write-ahead record (:func:`journal_file`), the pool rewritten
atomically (temp file + ``os.replace``: the commit point), the manifest, the move to
``processed/`` (or ``rejected/`` with ``<name>.report.txt``) -- and a tick that finds the record
of a killed one rolls it forward or back first (:func:`recover_interrupted`).  A file over
``incoming.max_file_bytes`` is refused unread, one over ``incoming.max_rows`` before validation.
Rows of a dataset no model trains on (outside ``pipeline.datasets``) are refused; rows about a
published item (``prepare.out_dir``) that contradict its label or repeat it under another system
name are rejected or flagged (``incoming.on_published_conflict``); a row naming a ``campaign`` is its
raters' own judgement and never contradicts a label, the published ones being another campaign's.  A file whose sha256 was ingested
before (recorded in the pool's ``source_sha256`` column and in ``manifest.json``) is never
ingested again, and rows whose content (:func:`content_key`) is already in the pool are skipped
and counted, whatever the file's name or bytes (a re-export with CRLF line ends, say).

Ingestion and retraining are one recoverable unit: before the pool is written, the
pending-retrain marker ``incoming.pending_path`` is written; the retrain flow clears it only once
``register`` has finished, so a tick interrupted after ingestion is finished by the next one.
"""


from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock
import pandas as pd

from uamt.core.errors import DataError, UamtError
from uamt.core.fileio import atomic_path, atomic_write_bytes, sha256_bytes
from uamt.data.datasets import DATASET_SPECS
from uamt.data.schema import COLUMNS, to_arrow
from uamt.ingest.config import DEFAULT_BOUNDS, SHA_COLUMN, SUFFIXES, IncomingConfig, journal_file
from uamt.ingest.validation import (
    Problem,
    Validation,
    campaign_of,
    content_key,
    judged_by,
    judgement_key,
    norm_text,
    show,
    size_message,
    validate_file,
)

log = logging.getLogger(__name__)

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
    """Atomic UTF-8 write, creating a missing folder; characters UTF-8 cannot hold (lone surrogates
    in a user's value or file name) are written as backslash escapes, never an error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))


def write_ingest_manifest(path: str | Path, manifest: dict[str, Any]) -> None:
    """Write the ingest manifest atomically."""
    _write_text_creating_folder(Path(path), json.dumps(manifest, indent=2) + "\n")


def _write_journal(cfg: IncomingConfig, record: dict[str, Any]) -> None:
    record = {**record, "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    _write_text_creating_folder(journal_file(cfg), json.dumps(record, indent=2) + "\n")


def _drop_pending_change(cfg: IncomingConfig, sha256: str) -> None:
    """Take an undone change out of the pending-retrain marker (the marker goes once nothing is owed)."""
    path = Path(cfg.pending_path)
    try:
        pending = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, or unreadable: leave it (a retrain too many is harmless)
        return
    changes = [c for c in pending.get("changes", []) if not (c.get("sha256") == sha256 and "rows_added" in c)]
    if changes:
        _write_text_creating_folder(path, json.dumps({**pending, "changes": changes}, indent=2) + "\n")
    else:
        path.unlink(missing_ok=True)


def recover_interrupted(cfg: IncomingConfig) -> str | None:
    """Finish or undo the ingestion or withdrawal whose write-ahead record (:func:`journal_file`)
    is still there (the process died between its steps); call it under :func:`retrain_lock`.

    The pool is the commit point (it is replaced atomically): when it already holds the change,
    the change is rolled forward (manifest entry written, the file moved to ``processed/`` with
    its report); when it does not, it is rolled back (the pending-retrain change dropped; the file
    stays in the incoming folder and is ingested afresh).  Returns what was done, or None.
    """
    path = journal_file(cfg)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        op, sha = record["op"], record["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"{path}: unreadable record of an interrupted ingestion ({exc}); compare {cfg.pool_path} "
            f"with {cfg.manifest_path}, then delete it"
        ) from exc
    pool = read_pool(cfg.pool_path)
    in_pool = bool(len(pool)) and bool((pool[SHA_COLUMN].astype(str) == sha).any())
    manifest_path = Path(cfg.manifest_path)
    manifest = read_ingest_manifest(manifest_path)
    active = [f for f in manifest["files"] if f["sha256"] == sha and not f.get("withdrawn_at")]
    if op == "ingest":
        source = Path(record["path"])
        if in_pool:
            if not active:
                manifest["files"].append(record["entry"])
                write_ingest_manifest(manifest_path, manifest)
            if source.is_file() and not source.is_symlink() and sha256_bytes(source.read_bytes()) == sha:
                target = _move(source, source.parent / "processed")
                if record.get("report"):
                    _write_text_creating_folder(target.with_name(target.name + ".report.txt"), record["report"])
            done = f"rolled forward the ingestion of {record['entry']['file']} ({sha[:12]}): its rows were in the pool"
        else:
            _drop_pending_change(cfg, sha)
            done = (
                f"rolled back the ingestion of {record['entry']['file']} ({sha[:12]}): its rows never "
                "reached the pool; the file is ingested afresh"
            )
    elif op == "withdraw":
        if not in_pool:
            for entry in active:
                entry["withdrawn_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
                entry["rows_withdrawn"] = record.get("rows", 0)
            if active:
                write_ingest_manifest(manifest_path, manifest)
            done = f"rolled forward the withdrawal of {record['file']} ({sha[:12]})"
        else:  # the pool still has the rows: nothing changed but the marker (a retrain too many)
            done = f"rolled back the withdrawal of {record['file']} ({sha[:12]}): its rows are still in the pool"
    else:
        raise DataError(f"{path}: unknown operation {op!r} in the record of an interrupted ingestion")
    path.unlink()
    log.warning("recovered an interrupted change: %s", done)
    return done


def read_ingest_manifest(path: str | Path) -> dict[str, Any]:
    """The ingest manifest (files taken into the pool, with their sha256); no files if it is absent."""
    path = Path(path)
    if not path.is_file():
        return {"files": []}
    return json.loads(path.read_text(encoding="utf-8"))


def _ingested_sha256s(pool: pd.DataFrame, manifest: dict[str, Any]) -> set[str]:
    """sha256 of every file whose rows are in the pool (a withdrawn file may be submitted again)."""
    active = {f["sha256"] for f in manifest["files"] if not f.get("withdrawn_at")}
    return set(pool[SHA_COLUMN].astype(str)) | active


def new_files(folder: str | Path) -> list[Path]:
    """Entries waiting in ``folder`` (not its sub-folders) with an incoming suffix, hidden names skipped.

    Listed without following links: a symbolic link or other non-regular entry is listed so that
    :func:`ingest_incoming` refuses it with a report; it is never read.  A name starting with
    ``.`` or ``~`` or with another suffix (``batch.csv.part``) is a file still being written.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(
        folder / entry.name
        for entry in os.scandir(folder)
        if Path(entry.name).suffix.lower() in SUFFIXES and not entry.name.startswith((".", "~"))
    )


class _Refused(Exception):
    """An entry of the incoming folder that is not read (the message says why, never its content)."""


class _NotReady(Exception):
    """A file modified within ``settle_s``: left for the next tick."""


def read_incoming_file(
    path: Path, settle_s: float = 0.0, now: float | None = None, max_bytes: int | None = None
) -> bytes:
    """The bytes of one regular file of the incoming folder, read without following links.

    Raises
    ------
    _Refused
        A symbolic link (it may point anywhere: outside the folder, at /etc/hosts), a file with
        other hard links, a folder, FIFO, socket or device: the entry is not opened.
    _NotReady
        Modified less than ``settle_s`` seconds ago (still being copied?).
    FileNotFoundError
        Gone since the folder was listed.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise _Refused(
            "a symbolic link: not followed (it may point outside the folder); copy the file in instead"
        )
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (FIFO, socket or device)"
        raise _Refused(f"{kind}: not read")
    if info.st_nlink > 1:
        raise _Refused(
            f"a file with {info.st_nlink} hard links (another name for it exists, maybe outside the folder): "
            "not read; copy the file in instead"
        )
    if settle_s and (now if now is not None else time.time()) - info.st_mtime < settle_s:
        raise _NotReady(f"modified less than {settle_s:g} s ago")
    if max_bytes is not None and info.st_size > max_bytes:
        raise _Refused(size_message(info.st_size, max_bytes))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _Refused(f"cannot be opened ({exc.strerror}): not read") from None
    with os.fdopen(fd, "rb") as handle:
        opened = os.fstat(handle.fileno())
        if not stat.S_ISREG(opened.st_mode) or opened.st_ino != info.st_ino:
            raise _Refused("replaced while being opened: not read")
        data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:  # grew since it was looked at
            raise _Refused(size_message(os.fstat(handle.fileno()).st_size, max_bytes))
        return data


def _move(path: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    if target.exists() or target.is_symlink():
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")
        target = folder / f"{stamp}-{path.name}"
    shutil.move(str(path), target)  # a rename; a link is moved as a link, never followed
    return target


# ----------------------------------------------------------------------------- the pending retrain


def read_pending(cfg: IncomingConfig) -> dict[str, Any] | None:
    """The pending-retrain marker (rows ingested, retrain not finished), or None."""
    path = Path(cfg.pending_path)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable: still pending, the retrain will rewrite or clear it
        return {"since": None, "changes": []}


def mark_pending(cfg: IncomingConfig, change: dict[str, Any]) -> None:
    """Record that the pool changed and a retrain is owed; written before the pool changes."""
    pending = read_pending(cfg) or {
        "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "changes": [],
    }
    pending.setdefault("changes", []).append(change)
    _write_text_creating_folder(Path(cfg.pending_path), json.dumps(pending, indent=2) + "\n")


def clear_pending(cfg: IncomingConfig) -> None:
    """Called by the retrain flow once ``register`` has finished (hold :func:`retrain_lock`)."""
    Path(cfg.pending_path).unlink(missing_ok=True)


# ----------------------------------------------------------------------------- ingestion


@dataclass
class IngestResult:
    """What one ingestion pass did."""

    ingested: list[str] = field(default_factory=list)  # files whose rows joined the pool
    rejected: list[str] = field(default_factory=list)  # files moved to rejected/
    deferred: list[str] = field(default_factory=list)  # files left for the next tick (settle_s)
    rows_added: int = 0
    rows_rejected: int = 0
    rows_duplicate: int = 0  # rows skipped: the same judgement is already in the pool or the file
    rows_flagged: int = 0  # rows taken but listed: they contradict or repeat a published label
    reports: dict[str, str] = field(default_factory=dict)  # file name -> report path
    errors: dict[str, str] = field(default_factory=dict)  # file name -> why it could not be moved
    recovered: list[str] = field(default_factory=list)  # an interrupted ingestion/withdrawal finished or undone

    @property
    def changed(self) -> bool:
        return self.rows_added > 0


def _check_file(
    path: Path,
    data: bytes,
    cfg: IncomingConfig,
    pool: pd.DataFrame,
    manifest: dict,
    published: Callable[[], dict[tuple, list[dict[str, Any]]]] = dict,
) -> Validation:
    """:func:`validate_file` + the checks against the pool and the published labels (``published``:
    the index of :func:`published_labels`, built on first use); an unexpected error refuses this
    file only."""
    try:
        check = validate_file(path, cfg, data=data)
        if check.sha256 in _ingested_sha256s(pool, manifest):
            check.file_problems.append(Problem(None, "*", "already ingested (same sha256): not added again"))
        elif check.good is not None and len(check.good):
            if len(pool):
                _check_against_pool(check, pool, manifest)
            if len(check.good):
                _check_against_published(check, published(), cfg)
    except Exception as exc:  # noqa: BLE001 - one file that breaks the validator must not block the others
        log.exception("validating %s failed", path)
        check = Validation(path=path, sha256=sha256_bytes(data))
        check.file_problems.append(
            Problem(
                None, "*", f"could not be validated ({type(exc).__name__}: {show(str(exc))}); not ingested"
            )
        )
    return check


def ingest_incoming(cfg: IncomingConfig) -> IngestResult:
    """Validate every new file in ``cfg.dir`` and append the accepted rows to the pool.

    Per file: all rows good -> all appended; some bad -> ``reject_file``: nothing appended, file
    to ``rejected/`` with ``<name>.report.txt``; ``keep_good``: the good rows appended, file to
    ``processed/`` with the report beside it.  Rows already in the pool (same :func:`content_key`)
    are skipped and counted; a file with nothing new goes to ``rejected/``.  Links and other
    non-regular entries are refused unread; a file modified within ``settle_s`` waits.  One bad
    file never stops the others.  Before the pool changes the pending-retrain marker is written;
    then the pool (then the manifest) is written once per accepted file, atomically, before the
    file is moved, so an interruption leaves either the old pool or the new one, and a file
    ingested but not yet moved is recognised by its sha256.  Call it under :func:`retrain_lock`.
    """
    result = IngestResult()
    incoming = Path(cfg.dir)
    processed, rejected = incoming / "processed", incoming / "rejected"
    manifest_path = Path(cfg.manifest_path)
    started = time.time()
    recovered = recover_interrupted(cfg)
    if recovered:
        result.recovered.append(recovered)
    published_index: dict[tuple, list[dict[str, Any]]] | None = None

    def published() -> dict[tuple, list[dict[str, Any]]]:
        nonlocal published_index
        if published_index is None:
            published_index = published_labels(cfg)
        return published_index

    def move(path: Path, folder: Path) -> Path | None:
        try:
            return _move(path, folder)
        except OSError as exc:
            result.errors[path.name] = f"cannot move to {folder}: {exc}"
            log.error("%s: cannot move to %s: %s", path, folder, exc)
            return None

    def reject(path: Path, check: Validation, rows: int) -> None:
        target = move(path, rejected)
        report = (target or rejected / path.name).with_name((target or path).name + ".report.txt")
        _write_text_creating_folder(report, check.report())
        result.rejected.append(path.name)
        result.rows_rejected += rows
        result.reports[path.name] = str(report)
        log.warning("rejected %s: see %s", path.name, report)

    for path in new_files(incoming):
        try:
            data = read_incoming_file(path, cfg.settle_s, started, cfg.max_file_bytes)
        except _NotReady as exc:
            result.deferred.append(path.name)
            log.info("%s: %s; left for the next tick", path.name, exc)
            continue
        except FileNotFoundError:  # withdrawn (deleted, renamed) since the folder was listed
            log.info("%s: gone before it was read", path.name)
            continue
        except _Refused as exc:
            check = Validation(path=path, sha256="(not read)")
            check.file_problems.append(Problem(None, "*", str(exc)))
            reject(path, check, 0)
            continue
        pool = read_pool(cfg.pool_path)
        manifest = read_ingest_manifest(manifest_path)
        adopted = _adopt_orphaned_rows(path, data, pool, manifest, manifest_path)
        if adopted:
            result.recovered.append(adopted)
            move(path, processed)
            continue
        check = _check_file(path, data, cfg, pool, manifest, published)
        accept = not check.file_problems and (check.ok or cfg.on_bad_rows == "keep_good")
        usable = check.good.reset_index(drop=True) if accept and check.good is not None else None
        if usable is not None and len(usable):
            usable = usable.assign(**{SHA_COLUMN: check.sha256})
            merged = pd.concat([pool, usable], ignore_index=True) if len(pool) else usable
            entry = {
                "file": path.name,
                "sha256": check.sha256,
                "rows": check.n_rows,
                "rows_added": len(usable),
                "rows_rejected": len(check.bad_rows),
                "rows_duplicate": len(check.duplicates),
                "rows_conflicting_published": check.published_conflicts,
                "ingested_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            }
            if check.flagged:
                entry["rows_flagged"] = sorted({p.row for p in check.flagged if p.row is not None})
            report_text = check.report() if not check.ok or check.duplicates or check.flagged else None
            # One transaction: the write-ahead record, then the pool (the commit point: an atomic
            # replace), the manifest, the move; a tick that finds the record finishes or undoes it.
            _write_journal(cfg, {"op": "ingest", "path": str(path), "sha256": check.sha256,
                                 "entry": entry, "report": report_text})  # fmt: skip
            mark_pending(cfg, {"file": path.name, "sha256": check.sha256, "rows_added": len(usable)})
            write_pool(merged.reset_index(drop=True), cfg.pool_path)
            manifest["files"].append(entry)
            write_ingest_manifest(manifest_path, manifest)
            result.ingested.append(path.name)
            result.rows_added += len(usable)
            result.rows_rejected += len(check.bad_rows)
            result.rows_duplicate += len(check.duplicates)
            result.rows_flagged += len(check.flagged)
            target = move(path, processed)
            if report_text is not None:
                report = (target or processed / path.name).with_name((target or path).name + ".report.txt")
                _write_text_creating_folder(report, report_text)
                result.reports[path.name] = str(report)
            if target is not None:  # else the next tick retries the move (the record says what to do)
                journal_file(cfg).unlink(missing_ok=True)
            log.info(
                "ingested %s: %d row(s) added, %d rejected, %d duplicate(s) skipped",
                path.name,
                len(usable),
                len(check.bad_rows),
                len(check.duplicates),
            )
        else:
            if check.ok and check.good is not None and not len(check.good):
                if check.duplicates and not check.bad_rows:
                    message = (
                        f"nothing new: all {len(check.duplicates)} row(s) are already in the pool "
                        "(or published) or repeat a row"
                    )
                else:
                    message = "no usable rows"
                check.file_problems.append(Problem(None, "*", message))
            result.rows_duplicate += len(check.duplicates)
            reject(path, check, check.n_rows - len(check.duplicates))
    return result


def _adopt_orphaned_rows(
    path: Path, data: bytes, pool: pd.DataFrame, manifest: dict[str, Any], manifest_path: Path
) -> str | None:
    """A file whose rows are in the pool without a manifest entry (killed between the two writes by
    a version without the write-ahead record): record it now, as ingested; returns what was done."""
    if not len(pool):
        return None
    sha = sha256_bytes(data)
    rows = int((pool[SHA_COLUMN].astype(str) == sha).sum())
    if not rows or any(f["sha256"] == sha for f in manifest["files"]):
        return None
    manifest["files"].append(
        {
            "file": path.name,
            "sha256": sha,
            "rows_added": rows,
            "ingested_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "recovered": "rows found in the pool without a manifest entry",
        }
    )
    write_ingest_manifest(manifest_path, manifest)
    log.warning("%s: its %d row(s) were in the pool without a manifest entry: recorded now", path.name, rows)
    return f"recorded {path.name} ({sha[:12]}): its {rows} row(s) were in the pool without a manifest entry"


def _check_against_pool(check: Validation, pool: pd.DataFrame, manifest: dict[str, Any]) -> None:
    """Rows already in the pool (same :func:`content_key`) are duplicates, skipped; rows repeating a
    pooled (dataset, lp, system, src, mt) with another score are bad rows."""
    origin = {f["sha256"]: f["file"] for f in manifest["files"]}
    scores: dict[tuple, float] = {}
    sources: dict[tuple, str] = {}
    for record in pool.to_dict(orient="records"):
        scores.setdefault(judgement_key(record), float(record["score"]))
        sources.setdefault(content_key(record), origin.get(str(record[SHA_COLUMN]), "an earlier file"))
    dropped = []
    for index, row in check.good.iterrows():
        index = int(index)
        source = sources.get(content_key(row))
        previous = scores.get(judgement_key(row))
        if source is not None:
            dropped.append(index)
            check.duplicates.append(
                Problem(index + 1, "*", f"already in the pool (from {source}): skipped", check.line_of(index))
            )
        elif previous is not None and previous != float(row["score"]):
            dropped.append(index)
            check.row_problems.append(
                Problem(
                    index + 1,
                    "score",
                    f"same {judged_by(row)} already in the pool with score {previous}, here {row['score']}",
                    check.line_of(index),
                )
            )
    if dropped:
        check.good = check.good.drop(index=dropped)


def _item_key(scale: str, row: Any) -> tuple:
    """(score scale, lp, src, mt), normalised: the translation a label is about, whatever system name."""
    return (scale, row["lp"], norm_text(row["src"]), norm_text(row["mt"]))


def published_labels(cfg: IncomingConfig) -> dict[tuple, list[dict[str, Any]]]:
    """The published labels (rows of ``cfg.published_dir``'s ``*.parquet`` that did not come from
    the annotation pool), indexed by :func:`_item_key`; empty when there is no such folder."""
    if cfg.published_dir is None or not Path(cfg.published_dir).is_dir():
        return {}
    columns = ["dataset", "lp", "src", "mt", "ref", "score", "system"]
    frames = [pd.read_parquet(path, columns=columns) for path in sorted(Path(cfg.published_dir).glob("*.parquet"))]
    if not frames:
        return {}
    published = pd.concat(frames, ignore_index=True)
    pool = read_pool(cfg.pool_path)
    from_pool = {content_key(r) for r in pool.to_dict(orient="records")} if len(pool) else set()
    index: dict[tuple, list[dict[str, Any]]] = {}
    for record in published.to_dict(orient="records"):
        if record["dataset"] not in DATASET_SPECS or (from_pool and content_key(record) in from_pool):
            continue
        scale = DATASET_SPECS[record["dataset"]].scale.name
        index.setdefault(_item_key(scale, record), []).append(
            {"dataset": record["dataset"], "system": norm_text(record["system"]), "score": float(record["score"])}
        )
    return index


def _check_against_published(
    check: Validation, published: dict[tuple, list[dict[str, Any]]], cfg: IncomingConfig
) -> None:
    """Rows about a published item (same scale, lp, src and mt): an exact repeat (same system and
    score) is a skipped duplicate; a score more than ``published_tolerance`` of the scale from every
    published one contradicts it; another system name with a close score repeats it under a renamed
    system.  Conflicts are bad rows or flagged rows per ``cfg.on_published_conflict``.

    A row naming a ``campaign`` is another rater group's judgement of the item, as each published
    dataset is its own campaign's: its score may differ from the published one by any amount, and
    agreeing with it is a judgement of its own, kept for the campaign's calibration.  Only the
    system name is still checked: the same src and mt under a system no published label names."""
    if not published:
        return
    dropped = []
    for index, row in check.good.iterrows():
        index = int(index)
        spec = DATASET_SPECS[row["dataset"]]
        labels = published.get(_item_key(spec.scale.name, row))
        if not labels:
            continue
        low, high = cfg.score_bounds.get(spec.name, DEFAULT_BOUNDS[spec.name])
        tolerance = cfg.published_tolerance * (high - low)
        score, system = float(row["score"]), norm_text(row["system"])
        nearest = min(labels, key=lambda label: abs(label["score"] - score))
        where = f"{nearest['dataset']} system {nearest['system']!r}, score {nearest['score'] + 0.0:g}"
        line = check.line_of(index)
        own_raters = bool(campaign_of(row))
        if not own_raters and any(label["system"] == system and label["score"] == score for label in labels):
            dropped.append(index)
            check.duplicates.append(Problem(index + 1, "*", f"already published ({where}): skipped", line))
            continue
        if not own_raters and abs(nearest["score"] - score) > tolerance:
            problem = Problem(
                index + 1,
                "score",
                f"contradicts the published label of the same src and mt ({where}): {score + 0.0:g} is more than "
                f"{tolerance:g} away (incoming.published_tolerance)",
                line,
            )
        elif all(label["system"] != system for label in labels):
            problem = Problem(
                index + 1,
                "system",
                f"repeats a published item (same src and mt: {where}) under another system name "
                f"{row['system']!r}",
                line,
            )
        else:  # the same system re-rated within the tolerance: a new judgement of it
            continue
        check.published_conflicts += 1
        if cfg.on_published_conflict == "reject":
            dropped.append(index)
            check.row_problems.append(problem)
        else:
            check.flagged.append(dataclasses.replace(problem, message=problem.message + " (flagged, kept)"))
    if dropped:
        check.good = check.good.drop(index=dropped)


def withdraw(cfg: IncomingConfig, which: str) -> dict[str, Any]:
    """Take the rows of one ingested file out of the pool; the next retrain tick trains without them.

    ``which``: the file name as ingested (``manifest.json``) or the first 8+ characters of its
    sha256.  The pending-retrain marker is written first, then the pool, then the manifest entry
    gets ``withdrawn_at`` (the same file may then be submitted again).  Call it under
    :func:`retrain_lock`.

    Raises
    ------
    DataError
        No ingested file, or several, match ``which``.
    """
    manifest_path = Path(cfg.manifest_path)
    recover_interrupted(cfg)
    manifest = read_ingest_manifest(manifest_path)
    entries = [
        f
        for f in manifest["files"]
        if not f.get("withdrawn_at")
        and (f["file"] == which or (len(which) >= 8 and f["sha256"].startswith(which)))
    ]
    if not entries:
        raise DataError(f"{manifest_path}: no ingested file named {which!r} or with that sha256")
    if len(entries) > 1:
        raise DataError(
            f"{manifest_path}: {len(entries)} ingested files match {which!r}; give the sha256 of one: "
            + ", ".join(f["sha256"][:12] for f in entries)
        )
    entry = entries[0]
    pool = read_pool(cfg.pool_path)
    keep = pool[pool[SHA_COLUMN].astype(str) != entry["sha256"]].reset_index(drop=True)
    removed = len(pool) - len(keep)
    _write_journal(cfg, {"op": "withdraw", "sha256": entry["sha256"], "file": entry["file"], "rows": removed})
    mark_pending(cfg, {"withdrawn": entry["file"], "sha256": entry["sha256"], "rows_removed": removed})
    if removed:
        write_pool(keep, cfg.pool_path)
    entry["withdrawn_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    entry["rows_withdrawn"] = removed
    write_ingest_manifest(manifest_path, manifest)
    journal_file(cfg).unlink(missing_ok=True)
    log.info(
        "withdrew %s (%s): %d row(s) removed from the pool", entry["file"], entry["sha256"][:12], removed
    )
    return {"file": entry["file"], "sha256": entry["sha256"], "rows_removed": removed}


# ----------------------------------------------------------------------------- locking


class RetrainBusy(UamtError):
    """Another retrain holds the lock."""


def _write_holder(fd: int) -> None:
    """Record who holds the lock in the lock file (for a person wondering why a retrain waits)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} since {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}\n".encode(), 0)


@contextlib.contextmanager
def retrain_lock(path: str | Path, timeout_s: float = 0.0, poll_s: float = 0.2) -> Iterator[Path]:
    """Hold an exclusive OS file lock (:class:`filelock.FileLock`, ``flock``) on ``path`` for the block.

    Waits up to ``timeout_s`` seconds (0 or less: not at all) for another holder to finish, then
    raises :class:`RetrainBusy`.  The lock is the OS's (no fallback to a marker-file lock), so a
    crashed holder never leaves it stuck; the file itself is kept and names the holder's pid.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(
        path,
        timeout=max(timeout_s, 0.0),
        poll_interval=poll_s,
        fallback_to_soft=False,
        preserve_lock_file=True,
        on_acquired=_write_holder,
    )
    try:
        lock.acquire()
    except filelock.Timeout:
        raise RetrainBusy(f"{path}: another retrain is running; try again later") from None
    try:
        yield path
    finally:
        lock.release()


def init_pool(cfg: IncomingConfig) -> bool:
    """Create an empty pool file if there is none (dvc.yaml lists it as a dep); True if created."""
    if Path(cfg.pool_path).exists():
        return False
    empty = pd.DataFrame({c: pd.Series(dtype=object) for c in [*COLUMNS, SHA_COLUMN]})
    write_pool(empty, cfg.pool_path)
    return True
