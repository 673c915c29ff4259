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
``annotator_scores`` no      list, JSON list or ``|``-separated numbers on the ``score`` scale,
                             each inside ``score_bounds``
=================== ======== ===============================================================

Numbers written as text must be plain decimals (``-1.5``, ``2e-3``): no ``_``, hex, ``inf`` or
``nan``, at most :data:`MAX_NUMBER_CHARS` characters.  Text must be valid Unicode (no lone
surrogates), at most :data:`MAX_TEXT_CHARS` characters.  Only regular files are read: symbolic
links, hard links and other non-regular entries are refused unread.  Files are picked up only
when complete (write-then-rename; names starting with ``.``/``~`` or with another suffix, such as
``batch.csv.part``, are ignored; ``incoming.settle_s``: a file modified less than that many seconds
ago waits for the next tick).

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
name are rejected or flagged (``incoming.on_published_conflict``).  A file whose sha256 was ingested
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
import decimal
import io
import json
import logging
import math
import os
import re
import reprlib
import shutil
import stat
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import filelock
import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from uamt.core.config import DEFAULT_PARAMS, ConfigError, load_section, read_params
from uamt.core.errors import DataError, UamtError
from uamt.core.fileio import atomic_path, atomic_write_bytes, sha256_bytes, wide_encoding_hint
from uamt.data.datasets import DATASET_SPECS, DATASETS, DatasetSpec
from uamt.data.schema import COLUMNS, decode_text, sample_std, to_arrow

log = logging.getLogger(__name__)

SECTION = "incoming"
SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet")
REQUIRED = ("dataset", "lp", "src", "mt", "score", "system")
OPTIONAL = ("ref", "doc", "seg_id", "score_std", "n_annotators", "annotator_scores", "score_raw", "domain")
#: Column kept in the pool (not in the canonical table) so a file is never ingested twice.
SHA_COLUMN = "source_sha256"
#: A number written as text longer than this is refused (a 5,000-digit "score" is not a score).
MAX_NUMBER_CHARS = 40
#: Longest ``src``/``mt``/``ref`` accepted (as ``uamt score``: longer is almost always lost line breaks).
MAX_TEXT_CHARS = 100_000
#: Most annotators one judgement may claim.
MAX_ANNOTATORS = 10_000
#: ``seg_id`` must fit the pool's int64 column.
SEG_ID_RANGE = (0, 2**63 - 1)

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
        OS file lock held during ingestion + retrain: a second retrain waits ``lock_timeout_s``
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
        dataset -> [low, high] (finite): scores and annotator scores outside are rejected (MQM
        [-25, 0], DA z [-20, 20], ...).
    lps : dict
        dataset -> accepted language pairs.
    pending_path : str
        The pending-retrain marker: written before new rows reach the pool, removed by the
        retrain flow once ``register`` has finished; while it exists every tick retrains.
    settle_s : float
        A file modified less than this many seconds ago is left for the next tick (it may still be
        being copied; the convention is write-then-rename, see docs/orchestration.md).
    max_file_bytes : int
        A larger file is refused unread (validation holds ~11x a text file's size in memory:
        100,000 rows of 63 MB took 690 MB); split it.
    max_rows : int
        A file with more data rows is refused before its rows are validated (a parquet file is
        checked on its metadata, before it is decompressed).
    on_published_conflict : {"reject", "flag"}
        A row whose (src, mt) has a published label (``published_dir``) and that contradicts it (a
        score more than ``published_tolerance`` of the scale away) or repeats it under another
        system name: ``reject`` makes it a bad row (``on_bad_rows`` decides the file), ``flag``
        takes it and lists it in the report and the manifest (``rows_flagged``).
    published_tolerance : float
        Share of the dataset's ``score_bounds`` width (0.2: 5 MQM points) an incoming score may be
        from every published score of the same (src, mt) before it contradicts them.
    journal_path : str or None
        Write-ahead record of the ingestion or withdrawal in progress (null: ``<manifest>.journal``
        beside the manifest); a tick that finds one finishes or undoes that change first.
    trained_datasets : tuple of str or None
        Datasets a model trains on: rows of any other dataset are refused (they would never be
        trained).  Not a key of the ``incoming`` section: :func:`load_config` reads it from
        ``pipeline.datasets``; None accepts every dataset.
    published_dir : str or None
        The prepared splits holding the published labels (:func:`load_config`: ``prepare.out_dir``);
        None or a missing folder: no comparison with published labels.
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
    pending_path: str = "data/.retrain.pending"
    settle_s: float = 0.0
    max_file_bytes: int = 20_000_000
    max_rows: int = 50_000
    on_published_conflict: Literal["reject", "flag"] = "reject"
    published_tolerance: float = 0.2
    journal_path: str | None = None
    trained_datasets: tuple[str, ...] | None = None
    published_dir: str | None = None

    def __post_init__(self) -> None:
        for name in (*self.score_bounds, *self.lps):
            if name not in DATASETS:
                raise ConfigError(
                    f"{SECTION}: dataset={name!r} not supported; choose from {sorted(DATASETS)}"
                )
        for name, bounds in self.score_bounds.items():
            if len(bounds) != 2 or not bounds[0] < bounds[1]:
                raise ConfigError(f"{SECTION}.score_bounds.{name} must be [low, high] with low < high")
            if not all(math.isfinite(b) for b in bounds):
                raise ConfigError(
                    f"{SECTION}.score_bounds.{name} must be finite numbers, got {list(bounds)} "
                    "(an infinite bound accepts any score)"
                )
        if not math.isfinite(self.settle_s) or self.settle_s < 0:
            raise ConfigError(f"{SECTION}.settle_s must be a finite number >= 0")
        for name in self.trained_datasets or ():
            if name not in DATASETS:
                raise ConfigError(f"pipeline.datasets: dataset={name!r} not supported; choose from {sorted(DATASETS)}")
        if self.max_file_bytes < 1:
            raise ConfigError(f"{SECTION}.max_file_bytes must be >= 1")
        if self.max_rows < 1:
            raise ConfigError(f"{SECTION}.max_rows must be >= 1")
        if not (math.isfinite(self.published_tolerance) and self.published_tolerance >= 0):
            raise ConfigError(f"{SECTION}.published_tolerance must be a finite number >= 0")
        if self.interval_minutes < 1:
            raise ConfigError(f"{SECTION}.interval_minutes must be >= 1")
        if self.dask_workers < 1:
            raise ConfigError(f"{SECTION}.dask_workers must be >= 1")


#: Fields of :class:`IncomingConfig` read from other sections, never from ``incoming``.
DERIVED = {"trained_datasets": "pipeline.datasets", "published_dir": "prepare.out_dir"}


def load_config(path: str | Path = DEFAULT_PARAMS) -> IncomingConfig:
    """The ``incoming`` section, with ``trained_datasets`` from ``pipeline.datasets`` and
    ``published_dir`` from ``prepare.out_dir`` (each None when its section is absent)."""
    params = read_params(path)
    section = params.get(SECTION)
    if isinstance(section, dict):
        for key, source in DERIVED.items():
            if key in section:
                raise ConfigError(f"{path}:{SECTION}.{key} is read from {source}; remove it from {SECTION}")
    cfg = load_section(IncomingConfig, SECTION, path)
    derived: dict[str, Any] = {}
    if "pipeline" in params:
        from uamt.pipeline_config import PipelineConfig

        derived["trained_datasets"] = tuple(load_section(PipelineConfig, "pipeline", path).datasets)
    if "prepare" in params:
        from uamt.data.prepare import PrepareConfig

        derived["published_dir"] = str(load_section(PrepareConfig, "prepare", path).out_dir)
    return dataclasses.replace(cfg, **derived) if derived else cfg


def journal_file(cfg: IncomingConfig) -> Path:
    """Where the write-ahead record of an ingestion or withdrawal lives (``cfg.journal_path``)."""
    if cfg.journal_path:
        return Path(cfg.journal_path)
    manifest = Path(cfg.manifest_path)
    return manifest.with_name(manifest.name + ".journal")


# ----------------------------------------------------------------------------- validation

_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlong = 2, 80, 80, 40
_SHOW.maxlist = _SHOW.maxtuple = _SHOW.maxdict = 6


def show(value: Any) -> str:
    """A short rendering of a user's value for a report: never the whole of a huge or deeply nested one."""
    try:
        return _SHOW.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still reported, by its type
        return f"<{type(value).__name__}>"


NUMBER_RULE = "a plain decimal number (like -1.5 or 2e-3; no '_', hex, inf or nan)"
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")


class _LongInteger:
    """A JSON integer too long to be a number here; kept (not raised) so the row and field are named."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _json_int(text: str) -> int | _LongInteger:
    return int(text) if len(text) <= MAX_NUMBER_CHARS else _LongInteger(len(text))


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
    """What :func:`validate_file` found in one file.

    ``duplicates`` are rows skipped, not bad: the same judgement (:func:`content_key`) earlier in
    the file or already in the pool.
    """

    path: Path
    sha256: str
    n_rows: int = 0
    row_lines: list[int] | None = None  # file line of each data row (None: a format without lines)
    file_problems: list[Problem] = field(default_factory=list)
    row_problems: list[Problem] = field(default_factory=list)
    duplicates: list[Problem] = field(default_factory=list)
    #: rows kept but listed: they contradict or repeat a published label (``on_published_conflict: flag``)
    flagged: list[Problem] = field(default_factory=list)
    #: rows that contradict or repeat a published label (rejected or flagged)
    published_conflicts: int = 0
    good: pd.DataFrame | None = None  # canonical rows that passed every check

    @property
    def first_line(self) -> int | None:
        return self.row_lines[0] if self.row_lines else None

    def line_of(self, index: int) -> int | None:
        """File line of the 0-based data row ``index``."""
        if not self.row_lines or index >= len(self.row_lines):
            return None
        return self.row_lines[index]

    @property
    def bad_rows(self) -> set[int]:
        return {p.row for p in self.row_problems if p.row is not None}

    @property
    def ok(self) -> bool:
        return not self.file_problems and not self.row_problems

    def report(self) -> str:
        name = str(self.path)
        counts = f"rows: {self.n_rows}, bad rows: {len(self.bad_rows)}"
        if self.duplicates:
            counts += f", duplicates skipped: {len(self.duplicates)}"
        if self.flagged:
            counts += f", flagged (kept): {len(self.flagged)}"
        lines = [f"file: {name}", f"sha256: {self.sha256}", counts]
        problems = self.file_problems + self.row_problems + self.duplicates + self.flagged
        lines += [p.describe(name) for p in problems]
        return "\n".join(lines) + "\n"


def _too_many_rows(n: int, max_rows: int | None) -> None:
    if max_rows is not None and n > max_rows:
        raise DataError(
            f"{n} data rows, over the limit of incoming.max_rows = {max_rows}; split the file into "
            f"files of at most {max_rows} rows"
        )


def read_table(
    path: Path, data: bytes, max_rows: int | None = None
) -> tuple[pd.DataFrame, list[int] | None]:
    """The rows of an incoming file as strings/objects, and the file line of each row (None: no lines).

    Blank lines at the end of a text file (an editor's extra newline) are ignored.  More than
    ``max_rows`` data rows are refused before they are parsed (parquet: from its metadata).

    Raises
    ------
    DataError
        UTF-16/32 (says so, with the conversion), not UTF-8 (names the line), or not parseable in
        its format (JSON: names the line; nesting too deep or a number too long included).
    """
    suffix = path.suffix.lower()
    name = str(path)
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            parquet = pq.ParquetFile(io.BytesIO(data))
            _too_many_rows(parquet.metadata.num_rows, max_rows)
            return parquet.read().to_pandas(), None
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
            raise DataError(f"{name}: cannot read as parquet ({show(str(exc))})") from exc
    hint = wide_encoding_hint(data)
    if hint:
        raise DataError(f"{name}: {hint}")
    lines = decode_text(data, name).split("\n")  # DataError naming the line of a non-UTF-8 byte
    while lines and not lines[-1].strip():
        lines.pop()
    if suffix in (".jsonl", ".tsv"):  # one row per non-blank line (TSV is read unquoted): before parsing
        _too_many_rows(sum(1 for line in lines if line.strip()) - (suffix == ".tsv"), max_rows)
    if suffix == ".jsonl":
        records, numbers = [], []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line, parse_int=_json_int)
            except RecursionError:
                raise DataError(f"{name}: line {number}: JSON nested too deeply") from None
            except ValueError as exc:  # JSONDecodeError and number conversion errors
                raise DataError(f"{name}: line {number}: not valid JSON ({show(str(exc))})") from None
            if not isinstance(record, dict):
                raise DataError(f"{name}: line {number}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
            numbers.append(number)
        return pd.DataFrame.from_records(records), numbers
    # TSV is read verbatim (no quoting: MT text often starts with a quote mark); CSV is standard CSV.
    sep = "\t" if suffix == ".tsv" else ","
    try:
        frame = pd.read_csv(
            io.StringIO("\n".join(lines)),
            sep=sep,
            dtype=str,
            keep_default_na=False,
            quoting=3 if sep == "\t" else 0,
        )
    except Exception as exc:  # noqa: BLE001 - the csv parser raises several types
        raise DataError(f"{name}: cannot parse as {suffix[1:]} ({show(str(exc))})") from exc
    _too_many_rows(len(frame), max_rows)
    return frame, list(range(2, 2 + len(frame)))


def _blank(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _number(value: Any) -> float | None:
    """A finite float from a number or a plain decimal string (:data:`NUMBER_RULE`); None otherwise."""
    if isinstance(value, (bool, np.bool_)) or _blank(value):
        return None
    if isinstance(value, str):
        value = value.strip()
        if len(value) > MAX_NUMBER_CHARS or not _DECIMAL.fullmatch(value):
            return None
    elif not isinstance(value, (int, float, np.integer, np.floating, decimal.Decimal)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _integer(value: Any) -> int | None:
    """An int from an integer, an integral float or such a plain decimal string; None otherwise."""
    if isinstance(value, (bool, np.bool_)) or _blank(value):
        return None
    if (
        isinstance(value, str)
        and _INTEGER.fullmatch(value.strip())
        and len(value.strip()) <= MAX_NUMBER_CHARS
    ):
        return int(value.strip())
    if isinstance(value, (int, np.integer)):
        return int(value)
    number = _number(value)
    if number is None or number != int(number):
        return None
    return int(number)


def _score_list(value: Any) -> list[float] | None:
    """``annotator_scores`` as floats (list, JSON list or ``|``-separated); None if malformed."""
    if _blank(value):
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text, parse_int=_json_int)
            except (ValueError, RecursionError):
                return None
        else:
            value = text.split("|")
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or len(value) > MAX_ANNOTATORS:
        return None
    numbers = [_number(v) for v in value]
    return None if any(n is None for n in numbers) else numbers  # type: ignore[return-value]


def _text_problem(value: Any, *, limit: int = MAX_TEXT_CHARS) -> str | None:
    """Why ``value`` is not usable text (blank, not text, too long, lone surrogates), or None."""
    if _blank(value):
        return f"empty or whitespace-only ({show(value)})"
    if not isinstance(value, str):
        return f"must be text, got {type(value).__name__} {show(value)}"
    if len(value) > limit:
        return f"text of {len(value)} characters is over the limit of {limit} (line breaks lost?)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"not valid Unicode text: lone surrogate {value[exc.start]!r} at character {exc.start + 1}"
    return None


def _norm_text(value: Any) -> str:
    """Text as compared for duplicates: NFC, whitespace runs collapsed, ends stripped (case kept)."""
    if not isinstance(value, str):
        return ""
    return " ".join(unicodedata.normalize("NFC", value).split())


def judgement_key(row: Any) -> tuple:
    """(dataset, lp, system, src, mt), normalised: one translation by one system, which has one score."""
    return (
        row["dataset"],
        row["lp"],
        _norm_text(row["system"]),
        _norm_text(row["src"]),
        _norm_text(row["mt"]),
    )


def content_key(row: Any) -> tuple:
    """What makes two rows the same judgement, whatever file, name, bytes or line ends they came in:
    :func:`judgement_key` + the reference (normalised) + the score."""
    return (*judgement_key(row), _norm_text(row.get("ref")), float(row["score"]))


def _reason(message: str) -> PydanticCustomError:
    """A schema error whose message is ``message`` verbatim (read back by :func:`validate_frame`)."""
    return PydanticCustomError("incoming_row", "{reason}", {"reason": message})


def _known_dataset(info: ValidationInfo) -> str | None:
    """The row's dataset if it passed its own check (fields are validated in declaration order)."""
    return info.data.get("dataset")


def _known_spec(info: ValidationInfo) -> DatasetSpec | None:
    dataset = _known_dataset(info)
    return None if dataset is None else DATASET_SPECS[dataset]


def _bounds(info: ValidationInfo) -> tuple[float, float] | tuple[None, None]:
    dataset = _known_dataset(info)
    if dataset is None:
        return None, None
    return info.context["cfg"].score_bounds.get(dataset, DEFAULT_BOUNDS[dataset])


def _given_annotator_scores(info: ValidationInfo) -> list[float]:
    """The row's annotator scores, parsed, also when outside the scale (``n_annotators`` is still
    checked against their count); [] when malformed."""
    if "annotator_scores" in info.data:
        return info.data["annotator_scores"]
    return _score_list(info.context["record"].get("annotator_scores")) or []


def _text(limit: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if why := _text_problem(value, limit=limit):
            raise _reason(why)
        return value

    return check


def _optional_text(limit: int) -> Callable[[Any], str | None]:
    """Blank -> None (the field's default is filled in by the row), else text as :func:`_text`."""
    check = _text(limit)

    def optional(value: Any) -> str | None:
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            value = str(value)  # a numeric document id read from JSON or parquet
        return None if _blank(value) else check(value).strip()

    return optional


def _optional_number(value: Any) -> float | None:
    if _blank(value):
        return None
    number = _number(value)
    if number is None:
        raise _reason(f"must be a finite number, {NUMBER_RULE}; got {show(value)}")
    return number


def _optional_integer(low: int, high: int, shown_range: str) -> Callable[[Any], int | None]:
    def check(value: Any) -> int | None:
        if _blank(value):
            return None
        number = _integer(value)
        if number is None or not low <= number <= high:
            raise _reason(f"must be an integer in {shown_range}, got {show(value)}")
        return number

    return check


#: Non-blank text of at most :data:`MAX_TEXT_CHARS` characters, valid Unicode.
Text = Annotated[str, PlainValidator(_text(MAX_TEXT_CHARS))]


class IncomingRow(BaseModel):
    """The schema of one incoming row (see the module docstring's table).

    Fields are validated in this order and every field's problem is reported, so one row may yield
    several; checks that depend on the dataset (language pair, score scale, reference required)
    run only once ``dataset`` itself passed.  Validate with
    ``context={"cfg": IncomingConfig, "record": the row as given}``.
    Defaults that depend on the row's position (``seg_id``, ``doc``) are left ``None`` here.
    """

    model_config = ConfigDict(validate_default=True, frozen=True)

    # Every field defaults to None (column absent) and its validator turns that into its default
    # or its "required" problem.
    dataset: str = None  # type: ignore[assignment]
    lp: Any = None
    src: Text = None  # type: ignore[assignment]
    mt: Text = None  # type: ignore[assignment]
    system: Text = None  # type: ignore[assignment]
    ref: str | None = None
    score: float = None  # type: ignore[assignment]
    annotator_scores: list[float] = None  # type: ignore[assignment]
    score_std: float = None  # type: ignore[assignment]
    n_annotators: int = None  # type: ignore[assignment]
    seg_id: Annotated[int | None, PlainValidator(_optional_integer(*SEG_ID_RANGE, "[0, 2**63 - 1]"))] = None
    score_raw: Annotated[float | None, PlainValidator(_optional_number)] = None
    doc: Annotated[str | None, PlainValidator(_optional_text(1000))] = None
    domain: str | None = None

    @field_validator("dataset", mode="plain")
    @classmethod
    def _dataset(cls, value: Any, info: ValidationInfo) -> str:
        value = value.strip() if isinstance(value, str) else value
        if not (isinstance(value, str) and value in DATASET_SPECS):
            raise _reason(f"unknown dataset {show(value)}; choose from {sorted(DATASETS)}")
        trained = info.context["cfg"].trained_datasets
        if trained is not None and value not in trained:
            raise _reason(
                f"no model trains on {value} (pipeline.datasets: {list(trained)}), so its rows would "
                "never be trained; send rows of those datasets, or add it to pipeline.datasets in params.yaml"
            )
        return value

    @field_validator("lp", mode="plain")
    @classmethod
    def _lp(cls, value: Any, info: ValidationInfo) -> Any:
        value = value.strip() if isinstance(value, str) else value
        dataset = _known_dataset(info)
        if dataset is not None:
            known = info.context["cfg"].lps.get(dataset, DEFAULT_LPS[dataset])
            if value not in known:
                raise _reason(f"unknown language pair {show(value)} for {dataset}; known: {list(known)}")
        return value

    @field_validator("ref", mode="plain")
    @classmethod
    def _ref(cls, value: Any, info: ValidationInfo) -> str | None:
        if _blank(value):
            spec = _known_spec(info)
            if spec is not None and spec.reference_based:
                raise _reason(f"empty, but {spec.name} is reference-based")
            return None
        if why := _text_problem(value):
            raise _reason(why)
        return value

    @field_validator("score", mode="plain")
    @classmethod
    def _score(cls, value: Any, info: ValidationInfo) -> float:
        score = _number(value)
        if score is None:
            raise _reason(f"must be a finite number, {NUMBER_RULE}; got {show(value)}")
        low, high = _bounds(info)
        if low is not None and not low <= score <= high:
            raise _reason(f"{score} outside the {info.data['dataset']} scale [{low}, {high}]")
        return score

    @field_validator("annotator_scores", mode="plain")
    @classmethod
    def _annotator_scores(cls, value: Any, info: ValidationInfo) -> list[float]:
        scores = _score_list(value)
        if scores is None:
            raise _reason(
                f"must be a list of at most {MAX_ANNOTATORS} finite numbers, each {NUMBER_RULE}; "
                f"got {show(value)}"
            )
        low, high = _bounds(info)
        if low is not None:
            outside = [(k, v) for k, v in enumerate(scores, start=1) if not low <= v <= high]
            if outside:
                k, v = outside[0]
                raise _reason(
                    f"{len(outside)} of {len(scores)} annotator scores outside the {info.data['dataset']} "
                    f"scale [{low}, {high}] (score {k} is {v})"
                )
        return scores

    @field_validator("score_std", mode="plain")
    @classmethod
    def _score_std(cls, value: Any, info: ValidationInfo) -> float:
        if _blank(value):  # a malformed annotator_scores counts as none given
            return sample_std(_given_annotator_scores(info))
        std = _number(value)
        if std is None or std < 0:
            raise _reason(f"must be a finite number >= 0, {NUMBER_RULE}; got {show(value)}")
        low, high = _bounds(info)
        if low is not None and std > high - low:
            raise _reason(f"{std} is wider than the whole {info.data['dataset']} scale [{low}, {high}]")
        return std

    @field_validator("n_annotators", mode="plain")
    @classmethod
    def _n_annotators(cls, value: Any, info: ValidationInfo) -> int:
        given = len(_given_annotator_scores(info))
        if _blank(value):
            return max(given, 1)
        number = _integer(value)
        if number is None or not 1 <= number <= MAX_ANNOTATORS:
            raise _reason(f"must be an integer in [1, {MAX_ANNOTATORS}], got {show(value)}")
        if number < given:
            raise _reason(f"{number}, but {given} annotator_scores are given")
        return number

    @field_validator("domain", mode="plain")
    @classmethod
    def _domain(cls, value: Any, info: ValidationInfo) -> str | None:
        if not _blank(value):
            if why := _text_problem(value, limit=100):
                raise _reason(why)
            return value.strip()
        spec = _known_spec(info)
        return None if spec is None else spec.domain


#: The columns :class:`IncomingRow` reads, in its order.
ROW_FIELDS = tuple(IncomingRow.model_fields)


def validate_frame(
    frame: pd.DataFrame,
    path: Path,
    sha256: str,
    row_lines: list[int] | None,
    cfg: IncomingConfig,
) -> Validation:
    """Check every row of an incoming table against :class:`IncomingRow`; every bad row is reported.

    Each problem names the row (1-based), the file line where there is one, the field and the reason
    (:meth:`Validation.report` lists them all); rows that pass become canonical pool rows.
    """
    result = Validation(path=path, sha256=sha256, n_rows=len(frame), row_lines=row_lines)
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
                    f"required column missing{hint}; unrecognised columns {show(unknown)} (renamed?)",
                )
            )
        return result
    if frame.empty:
        result.file_problems.append(Problem(None, "*", "no data rows"))
        return result

    def problem(i: int, column: str, message: str) -> None:
        result.row_problems.append(Problem(i + 1, column, message, result.line_of(i)))

    default_doc = f"incoming/{path.stem}/{sha256[:8]}/{{}}"
    year = dt.datetime.now(dt.UTC).year
    rows: list[dict[str, Any] | None] = []
    for i, record in enumerate(frame.to_dict(orient="records")):
        try:
            row = IncomingRow.model_validate(record, context={"cfg": cfg, "record": record})
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                problem(i, str(error["loc"][0]), error.get("ctx", {}).get("reason", error["msg"]))
            rows.append(None)
            continue
        rows.append(
            {
                "dataset": row.dataset,
                "split": "",
                "lp": row.lp,
                "src": row.src,
                "mt": row.mt,
                "ref": row.ref,
                "refs": [row.ref] if row.ref is not None else [],
                "score": row.score,
                "score_raw": row.score if row.score_raw is None else row.score_raw,
                "score_std": row.score_std,
                "n_annotators": row.n_annotators,
                "annotator_scores": row.annotator_scores or [row.score],
                "doc": default_doc.format(i + 1) if row.doc is None else row.doc,
                "system": row.system.strip(),
                "seg_id": i + 1 if row.seg_id is None else row.seg_id,
                "domain": row.domain,
                "year": year,
                "group": "",
            }
        )
    # Same (dataset, lp, system, src, mt) with different scores: every copy is rejected, since
    # there is no telling which judgement is right.  Exact repeats (same content key) keep the
    # first copy; the others are counted as duplicates.
    by_key: dict[tuple, list[int]] = {}
    score_of: dict[int, float] = {}
    contents: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        if row is None:
            continue
        key, content = judgement_key(row), content_key(row)
        earlier = by_key.setdefault(key, [])
        other = next((j for j in earlier if score_of[j] != row["score"]), None)
        if other is not None:
            problem(i, "score", f"duplicate of row {other + 1} (same system, src, mt) with a different score")
            for j in earlier:
                if rows[j] is not None:
                    problem(
                        j, "score", f"duplicate of row {i + 1} (same system, src, mt) with a different score"
                    )
                    rows[j] = None
            rows[i] = None
        elif content in contents:
            result.duplicates.append(
                Problem(
                    i + 1, "*", f"same judgement as row {contents[content] + 1}: skipped", result.line_of(i)
                )
            )
            rows[i] = None
            continue
        score_of[i] = row["score"]
        earlier.append(i)
        contents.setdefault(content, i)
    kept = [i for i, row in enumerate(rows) if row is not None]
    # Indexed by the 0-based data row, so later checks can still name the row.
    result.good = pd.DataFrame([rows[i] for i in kept], index=kept, columns=list(COLUMNS))
    if len(result.good):
        try:  # what write_pool will do: a value the pool cannot hold refuses the file now, not mid-write
            to_arrow(result.good)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
            result.file_problems.append(
                Problem(None, "*", f"rows cannot be stored in the pool ({show(str(exc))})")
            )
            result.good = result.good.iloc[:0]
    return result


def validate_file(
    path: str | Path, cfg: IncomingConfig | None = None, *, data: bytes | None = None
) -> Validation:
    """Read (or take ``data``, the file's bytes) and validate one incoming file.

    Never raises for bad content: every problem is in the result.
    """
    cfg = cfg or IncomingConfig()
    path = Path(path)
    if data is None:
        size = path.stat().st_size
        if size > cfg.max_file_bytes:
            result = Validation(path=path, sha256="(not read)")
            result.file_problems.append(Problem(None, "*", _size_message(size, cfg.max_file_bytes)))
            return result
        data = path.read_bytes()
    sha = sha256_bytes(data)
    try:
        frame, row_lines = read_table(path, data, cfg.max_rows)
    except DataError as exc:
        result = Validation(path=path, sha256=sha)
        message = str(exc)
        message = message[len(str(path)) + 2 :] if message.startswith(f"{path}: ") else message
        result.file_problems.append(Problem(None, "*", message))
        return result
    return validate_frame(frame, path, sha, row_lines, cfg)


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


def _size_message(size: int, limit: int) -> str:
    return (
        f"{size:,} bytes, over the limit of incoming.max_file_bytes = {limit:,}; not read: split it "
        "into smaller files (or raise the limit in params.yaml)"
    )


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
        raise _Refused(_size_message(info.st_size, max_bytes))
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
            raise _Refused(_size_message(os.fstat(handle.fileno()).st_size, max_bytes))
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
                    f"same system, src and mt already in the pool with score {previous}, here {row['score']}",
                    check.line_of(index),
                )
            )
    if dropped:
        check.good = check.good.drop(index=dropped)


def _item_key(scale: str, row: Any) -> tuple:
    """(score scale, lp, src, mt), normalised: the translation a label is about, whatever system name."""
    return (scale, row["lp"], _norm_text(row["src"]), _norm_text(row["mt"]))


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
            {"dataset": record["dataset"], "system": _norm_text(record["system"]), "score": float(record["score"])}
        )
    return index


def _check_against_published(
    check: Validation, published: dict[tuple, list[dict[str, Any]]], cfg: IncomingConfig
) -> None:
    """Rows about a published item (same scale, lp, src and mt): an exact repeat (same system and
    score) is a skipped duplicate; a score more than ``published_tolerance`` of the scale from every
    published one contradicts it; another system name with a close score repeats it under a renamed
    system.  Conflicts are bad rows or flagged rows per ``cfg.on_published_conflict``."""
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
        score, system = float(row["score"]), _norm_text(row["system"])
        nearest = min(labels, key=lambda label: abs(label["score"] - score))
        where = f"{nearest['dataset']} system {nearest['system']!r}, score {nearest['score'] + 0.0:g}"
        line = check.line_of(index)
        if any(label["system"] == system and label["score"] == score for label in labels):
            dropped.append(index)
            check.duplicates.append(Problem(index + 1, "*", f"already published ({where}): skipped", line))
            continue
        if abs(nearest["score"] - score) > tolerance:
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


# ----------------------------------------------------------------------------- command line


def init_pool(cfg: IncomingConfig) -> bool:
    """Create an empty pool file if there is none (dvc.yaml lists it as a dep); True if created."""
    if Path(cfg.pool_path).exists():
        return False
    empty = pd.DataFrame({c: pd.Series(dtype=object) for c in [*COLUMNS, SHA_COLUMN]})
    write_pool(empty, cfg.pool_path)
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m uamt.ingest.pool {validate FILE... | ingest | withdraw NAME|SHA256 | init-pool} [--params ...]``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m uamt.ingest.pool", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["validate", "ingest", "withdraw", "init-pool"])
    parser.add_argument(
        "files",
        nargs="*",
        help="validate: files to check (nothing is moved or written); "
        "withdraw: the name (as ingested) or sha256 prefix of one ingested file",
    )
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
        if args.action == "withdraw":
            if len(args.files) != 1:
                parser.error("withdraw takes one file name or sha256")
            with retrain_lock(cfg.lock_path, cfg.lock_timeout_s):
                print(json.dumps(withdraw(cfg, args.files[0]), indent=2))
            return 0
        with retrain_lock(cfg.lock_path, cfg.lock_timeout_s):
            result = ingest_incoming(cfg)
        print(json.dumps(dataclasses.asdict(result), indent=2))
        return 0
    except (UamtError, ConfigError) as exc:
        print(f"uamt.ingest.pool: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
