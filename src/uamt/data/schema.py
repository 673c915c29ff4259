"""The canonical annotation table and the input checks every loader shares.

One row per rated (source, translation) pair; the columns are the contract of
``docs/architecture.md``.  Scales of the score columns, per dataset:

============== ======================== =========================== ==========================================
dataset        ``score``                ``score_raw``               ``annotator_scores`` / ``score_std``
============== ======================== =========================== ==========================================
wmt21_da       DA z-score (``Z.SCR``,   DA 0-100 (``RAW.SCR``,      one score per distinct worker, standardised
               mean of per-worker       mean of the raw             per worker (the ``score`` scale): the mean
               standardised scores)     judgements), higher better  of its SYSTEM and REPEAT judgements
wmt21_mqm      MQM as published: 0      same as ``score``           one averaged score per segment is
               best, negative worse                                 published: ``[score]``, std NaN (en-ru:
               (en-ru: from errors)                                 scored from the QE-2023 error lists)
ted_mqm        MQM as published (one    same as ``score``           ``[score]``, std NaN (en-ru: scored from
               rater per segment)                                   the QE-2023 error lists, one rater)
wmt23_mqm      MQM (0 best; paragraphs  same as ``score``           zh-en: every rater's score where the
               reach -138, no cap)                                  per-rater files have it (8 on 270 items)
wmt23_sxs_mqm  MQM, mean of 3 raters    same as ``score``           the 3 raters' scores
bio_mqm        MQM, mean of 1-2 raters  same as ``score``           each rater's score
mlqe           DA z-score ``z_mean``    mean raw DA 0-100 (``mean``) per-annotator **z-scores** (``z_scores``,
                                                                    the ``score`` scale); std of them
qt21_hter      HTER: 0 best, higher     same as ``score``           ``[score]`` (one post-edit), std NaN
               worse (>= 0)
multihyp_eten  DA z-score               DA z-score (raw not         ``[]``, std NaN
                                        published)
============== ======================== =========================== ==========================================

Each dataset's range, direction and domain are declared once in :mod:`uamt.data.datasets`.
``score_std`` is the sample standard deviation (``ddof=1``) of ``annotator_scores`` and NaN
with fewer than two of them.  ``n_annotators`` is the number of human judgements behind
``score`` (the distinct workers for WMT21 DA, whose ``N`` counts a worker's repeat twice,
``len(scores)`` for MLQE, the raters of the MQM sets that publish them, 1 otherwise).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from uamt.core.columns import filled, optional_columns
from uamt.core.errors import DataError

SPLITS = ("d_q", "d_e", "dev", "test", "ood")

#: Column order of the canonical table.
COLUMNS = (
    "dataset",
    "split",
    "lp",
    "src",
    "mt",
    "ref",
    "refs",
    "score",
    "score_raw",
    "score_std",
    "n_annotators",
    "annotator_scores",
    "doc",
    "system",
    "seg_id",
    "domain",
    "year",
    "group",
)

#: Arrow schema of the parquet files (explicit so empty lists keep their element type).
ARROW_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),
        ("split", pa.string()),
        ("lp", pa.string()),
        ("src", pa.string()),
        ("mt", pa.string()),
        ("ref", pa.string()),
        ("refs", pa.list_(pa.string())),
        ("score", pa.float64()),
        ("score_raw", pa.float64()),
        ("score_std", pa.float64()),
        ("n_annotators", pa.int64()),
        ("annotator_scores", pa.list_(pa.float64())),
        ("doc", pa.string()),
        ("system", pa.string()),
        ("seg_id", pa.int64()),
        ("domain", pa.string()),
        ("year", pa.int64()),
        ("group", pa.string()),
    ]
)


#: Arrow types of the optional columns (:data:`uamt.core.columns.OPTIONAL_COLUMNS`).
OPTIONAL_ARROW = {"campaign": pa.string()}


def sample_std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1) of ``values``; NaN with fewer than two values."""
    if len(values) < 2:
        return math.nan
    return float(np.std(np.asarray(values, dtype=float), ddof=1))


def normalise_source(text: str) -> str:
    """Key under which two source sentences count as the same: NFKC, case-folded, single spaces."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text)).strip().casefold()


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (line N of the file = element N-1), without line ends.

    Splits on ``\\n`` only (``str.splitlines`` would also split on U+2028 and break the
    line = segment alignment).  Non-UTF-8 bytes raise :class:`DataError` naming the line.
    """
    data = Path(path).read_bytes()
    return decode_lines(data, str(path))


def decode_lines(data: bytes, name: str) -> list[str]:
    """Decode UTF-8 ``data`` (from file ``name``) into lines; see :func:`read_lines`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{name}: line {line}: not valid UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start})"
        ) from exc
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def decode_text(data: bytes, name: str) -> str:
    """Decode a whole UTF-8 file, with the line of the first bad byte in the error."""
    return "\n".join(decode_lines(data, name))


def require_columns(df: pd.DataFrame, columns: Iterable[str], name: str) -> None:
    """Raise :class:`DataError` naming the file and the missing column(s)."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(
            f"{name}: missing column(s) {missing}; found {list(map(str, df.columns))} (was a column renamed?)"
        )


def numeric_column(
    df: pd.DataFrame, column: str, name: str, *, first_line: int = 2, rows: pd.Index | None = None
) -> pd.Series:
    """``df[column]`` as float, raising on a NaN, infinite or non-numeric value.

    The error names the file ``name`` and the file line of the bad row: row ``i`` (0-based
    position in ``df``) is on line ``first_line + i`` (2 for a file with one header line).
    ``rows``, if given, holds each row's own file line instead.
    """
    values = pd.to_numeric(df[column], errors="coerce").astype(float)
    bad = ~np.isfinite(values.to_numpy())
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        line = int(rows[pos]) if rows is not None else first_line + pos
        raise DataError(
            f"{name}: line {line}: column {column!r} must be a finite number, got {df[column].iloc[pos]!r}"
        )
    return values


#: Plausible ranges of the ``score`` scales (inclusive), which each dataset's declaration
#: (:mod:`uamt.data.datasets`) names.  Wide enough for every published value (DA z-scores reach
#: -12.8 in WMT21 zh-en; WMT21 MQM is capped at -25 per segment (WMT23 is not: its own range is
#: declared with its loader); HTER can exceed 1 when
#: post-editing takes more edits than the reference has words) and narrow enough to catch a column
#: from another scale (raw DA 0-100 read as a z-score, MQM with its sign flipped, a percentage HTER).
DA_Z_RANGE = (-20.0, 20.0)
MQM_RANGE = (-25.0, 0.0)
HTER_RANGE = (0.0, 5.0)
#: Raw direct-assessment scores (``score_raw`` of wmt21_da and mlqe) are on a 0-100 slider.
RAW_DA_RANGE = (0.0, 100.0)


def check_range(
    values: pd.Series | np.ndarray,
    bounds: tuple[float, float],
    name: str,
    column: str,
    scale: str,
    *,
    first_line: int = 2,
    rows: pd.Index | np.ndarray | None = None,
) -> None:
    """Raise :class:`DataError` naming file, line and column when a value lies outside ``bounds``.

    ``first_line`` / ``rows`` locate the bad row as in :func:`numeric_column`; ``scale`` says
    what the column should hold (e.g. ``"DA z-score"``).
    """
    lo, hi = bounds
    array = np.asarray(values, dtype=float)
    bad = (array < lo) | (array > hi)
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        line = int(rows[pos]) if rows is not None else first_line + pos
        raise DataError(
            f"{name}: line {line}: column {column!r} = {array[pos]:g} is outside [{lo:g}, {hi:g}], the "
            f"range of a {scale}; is the column from another scale?"
        )


def check_unique_keys(
    keys: Sequence[tuple], scores: Sequence[float], lines: Sequence[int], name: str, what: str
) -> None:
    """Raise :class:`DataError` when a key (e.g. (system, segment)) is rated on two lines."""
    seen: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        if key in seen:
            j = seen[key]
            raise DataError(
                f"{name}: line {lines[i]}: {what} {key!r} is rated twice (lines {lines[j]} and {lines[i]}, "
                f"scores {scores[j]:g} and {scores[i]:g}); keep one row per {what}"
            )
        seen[key] = i


def check_text(value: object, name: str, line: int | str, what: str) -> str:
    """Return ``value`` if it is a non-blank string, else raise naming file, line and field."""
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{name}: line {line}: {what} is empty or whitespace-only ({value!r})")
    return value


def empty_table() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})


def finish_table(df: pd.DataFrame) -> pd.DataFrame:
    """Put a loader's frame in canonical column order and dtypes (split and group empty)."""
    out = df.copy()
    for column in ("split", "group"):
        if column not in out.columns:
            out[column] = ""
    missing = [c for c in COLUMNS if c not in out.columns]
    if missing:
        raise AssertionError(f"loader forgot columns {missing}")  # a bug, not bad input
    out = out[[*COLUMNS, *optional_columns(out)]].reset_index(drop=True)
    for column in ("score", "score_raw", "score_std"):
        out[column] = out[column].astype(float)
    for column in ("n_annotators", "seg_id", "year"):
        out[column] = out[column].astype("int64")
    return out


def to_arrow(df: pd.DataFrame) -> pa.Table:
    """The canonical table as an Arrow table with :data:`ARROW_SCHEMA`, plus the optional
    columns some row fills (an empty one is left out, blank values are null)."""
    data = {}
    for field in ARROW_SCHEMA:
        column = df[field.name]
        if field.name == "ref":
            data[field.name] = [
                None if (v is None or (isinstance(v, float) and math.isnan(v))) else v for v in column
            ]
        elif pa.types.is_list(field.type):
            data[field.name] = [list(v) for v in column]
        else:
            data[field.name] = column.tolist()
    schema = ARROW_SCHEMA
    for name in optional_columns(df):
        given = filled(df[name])
        data[name] = [str(v).strip() if g else None for v, g in zip(df[name], given, strict=True)]
        schema = schema.append(pa.field(name, OPTIONAL_ARROW[name]))
    return pa.Table.from_pydict(data, schema=schema)
