"""Validation of new human annotations: every problem of an incoming file, named by file, row and field.

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
``campaign``        no       the rater group whose judgements these are (letters, digits, ``_``,
                             ``-``, ``.``; at most 64; not a dataset name): its rows of new
                             documents are partly held out for its own calibration
                             (``prepare.pool_calibration_share``), served by ``--campaign``
=================== ======== ===============================================================

Numbers written as text must be plain decimals (``-1.5``, ``2e-3``): no ``_``, hex, ``inf`` or
``nan``, at most :data:`MAX_NUMBER_CHARS` characters.  Text must be valid Unicode (no lone
surrogates), at most :data:`MAX_TEXT_CHARS` characters.  Only regular files are read: symbolic
links, hard links and other non-regular entries are refused unread.  Files are picked up only
when complete (write-then-rename; names starting with ``.``/``~`` or with another suffix, such as
``batch.csv.part``, are ignored; ``incoming.settle_s``: a file modified less than that many seconds
ago waits for the next tick).

:func:`validate_file` reads one file and returns every problem it finds, each naming the file,
the row (1-based data row; ``line`` = line of a text file) and the field (:class:`Validation`);
:func:`validate_frame` checks rows already read.  Ingestion (:mod:`uamt.ingest.pool`) decides what to
do with the bad rows.
"""


from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import math
import re
import reprlib
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from uamt.campaigns import CAMPAIGN_NAME, CAMPAIGN_NAME_RULE
from uamt.core.columns import OPTIONAL_COLUMNS, optional_columns
from uamt.core.errors import DataError
from uamt.core.fileio import sha256_bytes, wide_encoding_hint
from uamt.data.datasets import DATASET_SPECS, DATASETS, DatasetSpec
from uamt.data.schema import COLUMNS, decode_text, sample_std, to_arrow
from uamt.ingest.config import (
    DEFAULT_BOUNDS,
    DEFAULT_LPS,
    MAX_ANNOTATORS,
    MAX_NUMBER_CHARS,
    MAX_TEXT_CHARS,
    OPTIONAL,
    REQUIRED,
    SEG_ID_RANGE,
    IncomingConfig,
)

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


def norm_text(value: Any) -> str:
    """Text as compared for duplicates: NFC, whitespace runs collapsed, ends stripped (case kept)."""
    if not isinstance(value, str):
        return ""
    return " ".join(unicodedata.normalize("NFC", value).split())


def campaign_of(row: Any) -> str:
    """The rater campaign a row names (stripped), or ``""`` for none (missing, None, NaN or blank)."""
    value = row.get("campaign") if hasattr(row, "get") else None
    return value.strip() if isinstance(value, str) else ""


def judgement_key(row: Any) -> tuple:
    """(dataset, lp, system, src, mt, campaign), normalised: one translation by one system has one
    score per campaign.  Two campaigns (rater groups, :mod:`uamt.campaigns`) may rate the same
    translation differently, as the published campaigns do; within one campaign, or among rows that
    name none, a second score contradicts the first."""
    return (
        row["dataset"],
        row["lp"],
        norm_text(row["system"]),
        norm_text(row["src"]),
        norm_text(row["mt"]),
        campaign_of(row),
    )


def judged_by(row: Any) -> str:
    """How a duplicate message names the judgement: ``system, src, mt`` plus the campaign if any."""
    campaign = campaign_of(row)
    return "system, src, mt" + (f" and campaign {campaign!r}" if campaign else "")


def content_key(row: Any) -> tuple:
    """What makes two rows the same judgement, whatever file, name, bytes or line ends they came in:
    :func:`judgement_key` + the reference (normalised) + the score."""
    return (*judgement_key(row), norm_text(row.get("ref")), float(row["score"]))


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
    campaign: str | None = None

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


    @field_validator("campaign", mode="plain")
    @classmethod
    def _campaign(cls, value: Any) -> str | None:
        if _blank(value):
            return None
        if not (isinstance(value, str) and CAMPAIGN_NAME.fullmatch(value.strip())):
            raise _reason(f"must be a campaign name ({CAMPAIGN_NAME_RULE}), got {show(value)}")
        if value.strip() in DATASET_SPECS:
            raise _reason(
                f"{value.strip()!r} names a published dataset, whose raters are a campaign of their own; "
                "name your raters' campaign differently"
            )
        return value.strip()


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
                "campaign": row.campaign,
            }
        )
    # Same (dataset, lp, system, src, mt, campaign) with different scores: every copy is rejected, since
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
            same = judged_by(row)
            problem(i, "score", f"duplicate of row {other + 1} (same {same}) with a different score")
            for j in earlier:
                if rows[j] is not None:
                    problem(j, "score", f"duplicate of row {i + 1} (same {same}) with a different score")
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
    result.good = pd.DataFrame([rows[i] for i in kept], index=kept, columns=[*COLUMNS, *OPTIONAL_COLUMNS])
    result.good = result.good[[*COLUMNS, *optional_columns(result.good)]]
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
            result.file_problems.append(Problem(None, "*", size_message(size, cfg.max_file_bytes)))
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


def size_message(size: int, limit: int) -> str:
    return (
        f"{size:,} bytes, over the limit of incoming.max_file_bytes = {limit:,}; not read: split it "
        "into smaller files (or raise the limit in params.yaml)"
    )
