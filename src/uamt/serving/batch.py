"""Batch scoring of a Parquet/CSV dataset into partitioned Parquet, in one process or on Dask.

Input
    A ``.parquet`` or ``.csv`` file (UTF-8) with columns ``src``, ``mt`` (str, required), ``ref``
    (str; required by a reference-based model, refused by a reference-free one) and ``lp``
    (optional: each row's language pair, which selects its calibration).  It is streamed in
    partitions of ``partition_rows`` rows (:meth:`pyarrow.parquet.ParquetFile.iter_batches`,
    :func:`pandas.read_csv` with ``chunksize``): the whole input is never in memory, only the
    partitions being scored.  The whole input is checked (:func:`check_input`) before the output
    folder is made: a missing or empty text, a byte that is not UTF-8, an ``lp`` that is not a
    language pair is refused naming the row and column, never after some parts were written.
Language pairs
    Per row: ``--lp`` (``settings.lp``) for every row; else the row's ``lp``; a row without one (no
    ``lp`` column, or an empty or null value in it) gets the pair detected from its own ``src`` and
    ``mt`` (:func:`row_language_pairs`), so a table mixing pairs gets each row's calibration.  ``--lp``
    beside an ``lp`` column is refused (which one wins would be a guess).  ``_batch.json`` records
    how many rows got which pair and how (``given``, ``column``, ``detected``, ``undetermined``).
Output
    ``out_dir/part-00000.parquet``, ``part-00001.parquet``, ... one per partition, with ``row`` (the
    0-based number of the input data row) and the predictor's columns (``mu``, ``sigma``, ``lower``,
    ``upper``, ``risk``; ``epistemic_var``, ``aleatoric_var``, ``clipped`` where the model gives
    them; with ``settings.flag_below``: ``flag_risk`` (when it differs from ``risk_threshold``) and
    ``flagged``, by :func:`uamt.serving.scorer.score_flags` as ``uamt score --flag-below`` does);
    ``_batch.json`` (the input, the settings, the model pinned to its registry version and
    calibration sha256, and per part its sha256 and row range) and, once every part is written,
    ``_SUCCESS``.  ``pandas.read_parquet(out_dir)`` reads the whole result (files whose name starts
    with ``_`` or ``.`` are not data).
Restart
    Each part is written to a temporary file, renamed into place, then recorded in ``_batch.json``
    with its sha256 and row range.  A run started again on the same ``out_dir`` with the same input
    and settings skips a part only when its bytes have the recorded sha256 and it reads back with
    exactly its partition's rows; any other part is scored again and named in a warning (left-over
    temporary files of a killed run are removed).  The model is resolved once (``@champion`` to its
    version) and the workers load that version; a restart whose model resolves to another version
    or ships another calibration is refused, so one output never mixes two models or settings.
Workers
    Every partition is scored by :func:`score_partition`, in this process or on a Dask worker; a
    worker loads the model once (:func:`cached_predictor`, one per process and model URI) and
    scores all its partitions with it.  The numbers are those of ``uamt score`` with the same
    ``--lp``: the same :class:`~uamt.serving.predictor.Predictor` and ``predict_frame`` call.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from uamt.core.errors import DataError, UamtError

# How the pair of a row was chosen (``_batch.json`` ``lps[].how``) and the choice itself belong to
# the one scoring use case; the names stay importable from here.
from uamt.serving.scorer import (  # noqa: F401
    LP_COLUMN,
    LP_CONTRADICTED,
    LP_DETECTED,
    LP_GIVEN,
    LP_GLOBAL_ONLY,
    LP_UNDETERMINED,
    row_language_pairs,
)

#: Input suffix -> reader.
INPUT_FORMATS = {".parquet": "parquet", ".csv": "csv"}
REQUIRED_COLUMNS = ("src", "mt")
OPTIONAL_COLUMNS = ("ref", "lp", "campaign")
ROW_COLUMN = "row"
DEFAULT_PARTITION_ROWS = 10_000
MANIFEST = "_batch.json"
SUCCESS = "_SUCCESS"
PART_PATTERN = "part-{:05d}.parquet"
#: Version of the ``_batch.json`` layout; a folder written by another one is refused, not trusted.
MANIFEST_FORMAT = 2
#: A language pair: two lower-case ISO 639 codes joined by "-" (what the datasets and the
#: calibration use).  Anything else in an ``lp`` field (a path, a newline, "English") is refused.
LP_FORMAT = re.compile(r"[a-z]{2,3}-[a-z]{2,3}")
#: Schemes of a running Dask scheduler's address (``inproc://`` only reaches this very process).
DASK_SCHEMES = ("tcp", "tls", "ucx", "ws", "wss")
@dataclass(frozen=True)
class BatchSettings:
    """What the numbers depend on; recorded in ``_batch.json`` and compared on a restart."""

    model: str
    confidence: float = 0.9
    risk_threshold: float | None = None
    batch_size: int = 64
    partition_rows: int = DEFAULT_PARTITION_ROWS
    #: ``--lp``: the language pair of every row (refused beside an ``lp`` column).
    lp: str | None = None
    #: The MLflow tracking URI the workers load ``model`` from (a remote worker has no environment
    #: of ours).  Not part of the comparison on restart: the same model may be read from a copy.
    tracking_uri: str | None = field(default=None, compare=False)
    #: ``--flag-below``: add ``flagged`` = served P(Q <= flag_below) > max_risk (and ``flag_risk``,
    #: that probability, when it differs from ``risk_threshold``) to every part.
    flag_below: float | None = None
    #: ``--max-risk`` (default 0.5 with ``flag_below``).
    max_risk: float | None = None

    def __post_init__(self) -> None:
        from uamt.serving.scorer import FlagSettings

        if self.flag_below is None:
            if self.max_risk is not None:
                raise DataError("max_risk needs flag_below (the quality threshold the risk is about)")
            return
        if self.max_risk is None:
            object.__setattr__(self, "max_risk", 0.5)
        FlagSettings(self.flag_below, self.max_risk)  # refuses a non-finite chi or a max_risk outside [0, 1]

    def flag(self):
        """The :class:`uamt.serving.scorer.FlagSettings` in force, or None."""
        from uamt.serving.scorer import FlagSettings

        return None if self.flag_below is None else FlagSettings(self.flag_below, self.max_risk)


@dataclass(frozen=True)
class BatchLanguagePairs:
    """Which calibration the rows of a batch got: ``lps`` holds one record per (pair, how chosen)
    with its row count and ``seen_in_training`` (None: no pair, the global calibration)."""

    lps: tuple[dict[str, Any], ...] = ()
    known_lps: tuple[str, ...] = ()
    sigma_factor: float = 1.0
    lp_column: bool = False

    def _rows_by_lp(self, keep: Callable[[dict[str, Any]], bool]) -> dict[str, int]:
        rows: Counter[str] = Counter()
        for item in self.lps:
            if item["lp"] is not None and keep(item):
                rows[item["lp"]] += item["rows"]
        return dict(sorted(rows.items()))

    @property
    def unseen(self) -> dict[str, int]:
        """Pair -> rows, for the pairs the model has no calibration of its own for (widened); rows
        whose pair is undetermined or contradicts ``--lp`` are counted apart (:meth:`messages`)."""
        return self._rows_by_lp(
            lambda item: item["seen_in_training"] is False and item["how"] not in (LP_UNDETERMINED, LP_CONTRADICTED)
        )

    def _widening(self) -> str:
        if self.sigma_factor > 1:
            return f"their intervals are widened x{self.sigma_factor:.2f}"
        return "the global calibration is used for them without widening (the unseen-LP widening fitted for this model is 1)"

    @property
    def detected(self) -> dict[str, int]:
        return self._rows_by_lp(lambda item: item["how"] == LP_DETECTED)

    def messages(self) -> list[str]:
        """What the user should read on stderr, most important first."""
        out = []
        for item in self.lps:
            if item["how"] == LP_CONTRADICTED:
                found = ", ".join(f"{pair} ({k})" for pair, k in sorted((item.get("detected") or {}).items()))
                out.append(
                    f"the text of {_rows(item['rows'])} contradicts --lp {item.get('given')}: detected {found}; "
                    f"they are scored as an unseen language pair and {self._widening()}; check --lp"
                )
        for lp, n in self.unseen.items():
            widened = self._widening()
            out.append(
                f"language pair {lp} was never seen in training (the model knows {', '.join(self.known_lps)}): "
                f"{_rows(n)} are less reliable and {widened}"
            )
        if self.detected:
            pairs = ", ".join(f"{lp} on {_rows(n)}" for lp, n in self.detected.items())
            out.append(f"detected language pair {pairs} (per row, from the texts)" + ("" if self.lp_column else "; --lp overrides"))
        undetermined = sum(item["rows"] for item in self.lps if item["how"] == LP_UNDETERMINED)
        if undetermined:
            out.append(
                f"could not determine the language pair of {_rows(undetermined)} confidently: they are scored "
                f"as an unseen language pair and {self._widening()}; "
                + ("give their lp in the lp column" if self.lp_column else "pass --lp or add an lp column")
            )
        return out

    def note(self) -> str:
        """The clause of the one-line summary on stderr ("" when there is nothing to say)."""
        doubtful = sum(item["rows"] for item in self.lps if item["how"] in (LP_UNDETERMINED, LP_CONTRADICTED))
        if doubtful and not self.unseen:
            widened = f": intervals widened x{self.sigma_factor:.2f}" if self.sigma_factor > 1 else ""
            return f"; {_rows(doubtful)} of an undetermined or contradicted language pair{widened}"
        if self.unseen:
            widened = f": intervals widened x{self.sigma_factor:.2f}" if self.sigma_factor > 1 else ""
            label = "LP" if len(self.unseen) == 1 else "LPs"
            return f"; {label} {', '.join(self.unseen)} never seen in training{widened}"
        if self.detected:
            label = "LP" if len(self.detected) == 1 else "LPs"
            return f"; detected {label} {', '.join(self.detected)}"
        return ""


@dataclass(frozen=True)
class BatchResult:
    out_dir: Path
    n_rows: int
    n_partitions: int
    n_skipped: int
    seconds: float
    #: Parts that existed but failed verification (checksum, rows, readability) and were scored again.
    n_rescored: int = 0
    lps: BatchLanguagePairs = BatchLanguagePairs()

    @property
    def rows_per_second(self) -> float:
        return self.n_rows / self.seconds if self.seconds > 0 else float("nan")


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


# ----------------------------------------------------------------------------- input
def input_format(path: str | Path) -> str:
    """``parquet`` or ``csv`` by the suffix of ``path``; DataError naming the file otherwise."""
    path = Path(path)
    fmt = INPUT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(
            f"{path}: input format {path.suffix!r} not supported; choose from {sorted(INPUT_FORMATS)}"
        )
    if not path.is_file():
        raise DataError(f"{path}: file not found" if not path.exists() else f"{path}: is not a file")
    return fmt


#: Bytes that are not UTF-8 come out of the CSV reader as these (``surrogateescape``), so the row
#: and column of the first one can be named; decoded UTF-8 text never holds them.
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


def _not_utf8(text: str) -> str | None:
    """``byte 0xNN at character K`` for the first undecodable byte of ``text``, else None."""
    found = _NOT_UTF8.search(text)
    if found is None:
        return None
    return f"byte 0x{ord(found.group()) - 0xDC00:02x} at character {found.start() + 1}"


def input_columns(path: str | Path) -> list[str]:
    """The column names of the input (its schema or CSV header), checked for ``src`` and ``mt``.

    Raises
    ------
    uamt.core.errors.DataError
        Unsupported suffix, unreadable file, a CSV in UTF-16/32 or with a header that is not
        UTF-8, or a required column missing (file and column named).
    """
    from uamt.core.fileio import wide_encoding_hint

    path = Path(path)
    fmt = input_format(path)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            columns = list(pq.read_schema(path).names)
        else:
            with open(path, "rb") as handle:
                hint = wide_encoding_hint(handle.read(4096))
            if hint:
                raise DataError(f"{path}: {hint}")
            columns = [
                str(c) for c in pd.read_csv(path, nrows=0, encoding="utf-8", encoding_errors="surrogateescape").columns
            ]
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # ArrowInvalid and ParserError are ValueErrors
        raise DataError(f"{path}: cannot read as {fmt} ({type(exc).__name__}: {exc})") from None
    for column in columns:
        where = _not_utf8(column)
        if where:
            raise DataError(
                f"{path}: line 1 (the header) is not valid UTF-8 ({where} of {column!r}); convert the file "
                "to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
            )
    for column in REQUIRED_COLUMNS:
        if column not in columns:
            raise DataError(
                f"{path}: missing column {column!r}; batch input needs columns "
                f"{list(REQUIRED_COLUMNS)} (optional {list(OPTIONAL_COLUMNS)}), found {columns}"
            )
    return columns


def _record_batches(path: Path, fmt: str, columns: list[str], rows: int) -> Iterator[pd.DataFrame]:
    """The input in frames of at most ``rows`` rows (any sizes), never the whole file at once."""
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            with pq.ParquetFile(path) as handle:
                for batch in handle.iter_batches(batch_size=rows, columns=columns):
                    yield batch.to_pandas()
        else:
            # Every field as text, "NA"/"null" included: a translation reading "NA" is a translation.
            # Bytes that are not UTF-8 are kept (as surrogates) for check_rows to name their row.
            reader = pd.read_csv(
                path,
                usecols=columns,
                dtype=str,
                keep_default_na=False,
                chunksize=rows,
                encoding="utf-8",
                encoding_errors="surrogateescape",
            )
            with reader:
                yield from reader
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read as {fmt} ({type(exc).__name__}: {exc})") from None


def iter_partitions(path: str | Path, partition_rows: int) -> Iterator[tuple[int, pd.DataFrame]]:
    """``(index, frame)`` for consecutive partitions of exactly ``partition_rows`` rows (the last
    may be shorter), each with the input row numbers in column ``row`` and the used columns only,
    checked by :func:`check_rows`; an ``lp`` column holds a language pair or None (no value).

    The partition boundaries depend only on the row count, never on the file's row groups or the
    reader's chunking, so a restarted run finds the same partitions.
    """
    if partition_rows < 1:
        raise UamtError(f"partition_rows must be >= 1, got {partition_rows}")
    path = Path(path)
    fmt = input_format(path)
    present = input_columns(path)
    columns = [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in present]
    pending: list[pd.DataFrame] = []
    n_pending = 0
    start = 0  # input row number of the first pending row
    index = 0

    def emit(frames: list[pd.DataFrame]) -> pd.DataFrame:
        frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].reset_index(drop=True)
        frame.insert(0, ROW_COLUMN, range(start, start + len(frame)))
        check_rows(frame, path)
        if "lp" in frame.columns:
            frame["lp"] = pd.Series(
                [language_pair_value(v, f"{path}: row {r}") for r, v in zip(frame[ROW_COLUMN], frame["lp"], strict=True)],
                dtype=object,
            )
        return frame

    for chunk in _record_batches(path, fmt, columns, partition_rows):
        while len(chunk):
            take = min(partition_rows - n_pending, len(chunk))
            pending.append(chunk.iloc[:take])
            n_pending += take
            chunk = chunk.iloc[take:]
            if n_pending == partition_rows:
                yield index, emit(pending)
                index += 1
                start += n_pending
                pending, n_pending = [], 0
    if n_pending:
        yield index, emit(pending)
    elif index == 0:
        raise DataError(f"{path}: no data rows")


def check_rows(frame: pd.DataFrame, path: str | Path) -> None:
    """Refuse a missing or empty text field or one that is not UTF-8, naming the file, the input
    row and the column (an ``lp`` value is checked by :func:`language_pair_value`)."""
    from uamt.core.textcheck import blank_detail, is_blank

    for column in ("src", "mt", "ref", "lp"):
        if column not in frame.columns:
            continue
        for row, value in zip(frame[ROW_COLUMN].tolist(), frame[column].tolist(), strict=True):
            if isinstance(value, str):
                where = _not_utf8(value)
                if where:
                    raise DataError(
                        f"{path}: row {row}: column {column!r} is not valid UTF-8 ({where}); convert the "
                        "file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                    )
            if column == "lp":
                continue
            if not isinstance(value, str):
                null = value is None or value != value
                hint = (
                    "; a table with a 'ref' column is scored with references in every row: score the rows "
                    "without one from a table without the column (the reference-free model)"
                    if column == "ref" and null
                    else ""
                )
                raise DataError(
                    f"{path}: row {row}: column {column!r} must be text, got "
                    f"{'nothing (null)' if null else type(value).__name__}{hint}"
                )
            if is_blank(value):
                detail = blank_detail(value)
                raise DataError(f"{path}: row {row}: column {column!r} is empty" + (f" ({detail})" if detail else ""))


def language_pair_value(value: Any, where: str) -> str | None:
    """The language pair of an ``lp`` field: ``xx-yy``, or None for an empty, blank or null one
    (that row's pair is detected from its text).

    Raises
    ------
    uamt.core.errors.DataError
        ``where`` (file and row) named: not text, or text that is not a language pair.
    """
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if not isinstance(value, str):
        raise DataError(f"{where}: column 'lp' must be text, got {type(value).__name__}")
    text = value.strip()
    if not text:
        return None
    if not LP_FORMAT.fullmatch(text):
        raise DataError(
            f"{where}: column 'lp' is {value!r}, not a language pair like 'en-de' (two lower-case ISO 639 "
            "codes joined by '-'); leave it empty to have the pair detected from the row's text"
        )
    return text


def check_lp_option(lp: str) -> None:
    """Refuse a ``--lp`` that is not ``xx-yy`` (a path, a newline, an empty string)."""
    if not isinstance(lp, str) or not LP_FORMAT.fullmatch(lp):
        raise UamtError(
            f"--lp {lp!r} is not a language pair like 'en-de' (two lower-case ISO 639 codes joined by '-')"
        )


@dataclass(frozen=True)
class InputSummary:
    """What :func:`check_input` found: sizes, and the rows of an ``lp`` column without a value."""

    n_rows: int
    n_partitions: int
    lp_column: bool
    rows_without_lp: int = 0
    #: The first few of them (input row numbers), for the warning.
    first_rows_without_lp: tuple[int, ...] = ()


def check_input(path: str | Path, partition_rows: int) -> InputSummary:
    """Read the whole input once, partition by partition, and check every row (:func:`check_rows`,
    :func:`language_pair_value`) before anything is written: a bad row 450 is refused before part 0.

    Raises
    ------
    uamt.core.errors.DataError
        Naming the file, the row and the column of the first bad field.
    """
    lp_column = "lp" in input_columns(path)
    n_rows = n_partitions = without = 0
    first: list[int] = []
    for _, frame in iter_partitions(path, partition_rows):
        n_partitions += 1
        n_rows += len(frame)
        if lp_column:
            rows = frame.loc[frame["lp"].isna(), ROW_COLUMN].tolist()
            without += len(rows)
            first.extend(rows[: max(0, 10 - len(first))])
    return InputSummary(n_rows, n_partitions, lp_column, without, tuple(first))


# ----------------------------------------------------------------------------- the model, pinned
@dataclass(frozen=True)
class ModelPin:
    """The model a batch is scored with, resolved once at the start: ``models:/NAME@ALIAS`` to its
    version (the workers load ``load_uri``, so moving the alias during a run changes nothing), and
    the sha256 of the calibration artifact it ships (a folder recalibrated in place is another model)."""

    #: ``--model`` as given.
    uri: str
    #: What the workers load: ``models:/NAME/VERSION`` for a registered model, an absolute folder path.
    loaded_as: str
    name: str | None = None
    version: str | None = None
    calibration_sha256: str | None = None
    #: Where the model's files are on this file system (None: a remote store).
    folder: str | None = None

    def identity(self) -> dict[str, Any]:
        """What must be the same for a restart to continue the parts (not how it was named)."""
        if self.version is not None:
            return {"name": self.name, "version": self.version, "calibration_sha256": self.calibration_sha256}
        return {"source": self.loaded_as, "calibration_sha256": self.calibration_sha256}

    def describe(self) -> str:
        return f"{self.name} version {self.version}" if self.version is not None else self.loaded_as


def _artifact_sha256(path: Path) -> str:
    """sha256 of a file, or of a folder's files (relative names and contents, in name order)."""
    from uamt.core.fileio import sha256_file, sha256_text

    if path.is_file():
        return sha256_file(path)
    listing = [f"{p.relative_to(path).as_posix()} {sha256_file(p)}" for p in sorted(path.rglob("*")) if p.is_file()]
    return sha256_text("\n".join(listing))


def pin_model(model: str, tracking_uri: str | None = None) -> ModelPin:
    """Resolve ``model`` once (see :class:`ModelPin`); reads the registry, never writes it.

    Raises
    ------
    uamt.core.errors.UamtError
        The tracking store does not exist, or the model or alias cannot be resolved (named).
    """
    from uamt.registry.store import check_store_exists, registry_origin, registry_uri
    from uamt.registry.store import tracking_uri as configured_tracking_uri
    from uamt.serving.predictor import _resolve_local_folder, uamt_artifacts

    uri = tracking_uri or configured_tracking_uri()
    name = version = None
    loaded_as = model
    if model.startswith(("models:/", "runs:/")):
        check_store_exists(uri)
    if model.startswith("models:/"):
        from mlflow.store.artifact.utils.models import get_model_name_and_version

        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri, registry_uri=registry_uri(uri))
        try:
            resolved = get_model_name_and_version(client, model)
            if len(resolved) == 2:  # (name, version); a logged-model id (models:/m-...) is already fixed
                name, version = resolved[0], str(resolved[1])
                client.get_model_version(name, version)  # models:/NAME/9 is not checked by the above
        except Exception as exc:  # noqa: BLE001 - MLflow's errors for a missing model, version or alias
            raise UamtError(f"could not load model {model!r} from {registry_origin(uri)}: {exc}") from None
        if version is not None:
            loaded_as = f"models:/{name}/{version}"
    elif "://" not in model and not model.startswith("runs:/"):
        loaded_as = str(Path(model).resolve())
        if not Path(loaded_as).is_dir():
            raise UamtError(f"could not load model {model!r}: no model folder at {loaded_as}")
    try:
        folder = _resolve_local_folder(loaded_as, uri)
    except Exception:  # noqa: BLE001 - a remote store or a missing folder: loading names the problem
        folder = None
    calibration = None
    if folder is not None and folder.is_dir():
        artifact = (uamt_artifacts(folder) or {}).get("calibration")
        if artifact and Path(artifact).exists():
            calibration = _artifact_sha256(Path(artifact))
    else:
        folder = None
    return ModelPin(model, loaded_as, name, version, calibration, None if folder is None else str(folder))


# ----------------------------------------------------------------------------- workers
_PREDICTORS: dict[tuple[str, str | None], Any] = {}
_PREDICTORS_LOCK = threading.Lock()
#: How many times this process loaded a model (tests check that a worker loads it once).
LOAD_COUNT = {"n": 0}


def cached_predictor(model: str, tracking_uri: str | None = None):
    """The predictor of ``model``, loaded once per process (a Dask worker keeps it between tasks)."""
    key = (model, tracking_uri)
    with _PREDICTORS_LOCK:
        predictor = _PREDICTORS.get(key)
        if predictor is None:
            from uamt.serving.predictor import load_predictor

            if tracking_uri and os.environ.get("MLFLOW_TRACKING_URI") != tracking_uri:
                # load_predictor reads the store from the environment; a remote worker has its own.
                os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
            predictor = load_predictor(model)
            _PREDICTORS[key] = predictor
            LOAD_COUNT["n"] += 1
        return predictor


def preload_model(model: str, tracking_uri: str | None = None) -> int:
    """Load ``model`` into this process's cache and return :func:`model_loads` (for ``client.run``:
    the predictor itself stays on the worker, its ONNX session cannot be pickled back)."""
    cached_predictor(model, tracking_uri)
    return model_loads()


def model_loads() -> int:
    """Models loaded by this process so far (run on each worker with ``client.run``)."""
    return LOAD_COUNT["n"]


def score_partition(frame: pd.DataFrame, out_path: str, settings: BatchSettings) -> dict[str, Any]:
    """Score one partition with the cached predictor and write it atomically to ``out_path``.

    Returns
    -------
    dict
        The part's record for ``_batch.json``: ``rows``, ``first_row``, ``last_row``, ``sha256`` of
        the file written, ``lps`` (``[{lp, how, rows, seen_in_training}]``), and the model's
        ``known_lps`` and ``unseen_lp_sigma_factor``.
    """
    from uamt.core.fileio import atomic_path, sha256_file
    from uamt.serving import scorer
    from uamt.serving.language_pair import predictor_language_pair
    from uamt.serving.scores import check_signature

    predictor = cached_predictor(settings.model, settings.tracking_uri)
    check_signature(predictor, has_references="ref" in frame.columns, model=settings.model)
    scoring = scorer.ScoringSettings(settings.confidence, settings.risk_threshold, settings.batch_size)
    # Each pair's rows in a call of their own (a partition may mix pairs).
    texts = frame.drop(columns=[ROW_COLUMN])
    scored = scorer.score_texts(predictor, texts, scoring, lp=settings.lp, group_by_lp=True)
    lps, hows, contradicting = scored.lps, scored.hows, scored.contradicting
    out = scored.out
    flag = settings.flag()
    if flag is not None:
        for column, values in scorer.score_flags(
            predictor, texts, scored, flag, lp=settings.lp, group_by_lp=True
        ).items():
            out[column] = values
    out.insert(0, ROW_COLUMN, frame[ROW_COLUMN].to_numpy())
    with atomic_path(out_path) as tmp:
        out.to_parquet(tmp, index=False)
        digest = sha256_file(tmp)
    model_facts = predictor_language_pair(predictor, [], [], None)  # known pairs and widening; detects nothing
    counts = Counter(zip(lps, hows, strict=True))
    return {
        "rows": len(out),
        "first_row": int(frame[ROW_COLUMN].iloc[0]),
        "last_row": int(frame[ROW_COLUMN].iloc[-1]),
        "sha256": digest,
        "lps": [
            {
                "lp": lp,
                "how": how,
                "rows": n,
                "seen_in_training": None if lp is None else not predictor_language_pair(predictor, [], [], lp).unseen,
                **({"given": settings.lp, "detected": contradicting} if how == LP_CONTRADICTED else {}),
            }
            for (lp, how), n in sorted(counts.items(), key=lambda item: (item[0][0] or "", item[0][1]))
        ],
        "known_lps": list(model_facts.known_lps),
        "unseen_lp_sigma_factor": model_facts.sigma_factor,
    }


def language_pairs_of(records: list[dict[str, Any]], lp_column: bool) -> BatchLanguagePairs:
    """The rows per (pair, how chosen) over the part ``records`` of a whole batch."""
    rows: Counter[tuple[str | None, str]] = Counter()
    seen: dict[tuple[str | None, str], bool | None] = {}
    extra: dict[tuple[str | None, str], dict[str, Any]] = {}
    known: tuple[str, ...] = ()
    factor = 1.0
    for record in records:
        known = tuple(record.get("known_lps") or known)
        factor = float(record.get("unseen_lp_sigma_factor", factor))
        for item in record.get("lps", []):
            key = (item["lp"], item["how"])
            rows[key] += int(item["rows"])
            seen[key] = item["seen_in_training"]
            if item["how"] == LP_CONTRADICTED:  # the given pair and what the texts said instead
                merged = extra.setdefault(key, {"given": item.get("given"), "detected": Counter()})
                merged["detected"].update(item.get("detected") or {})
    lps = tuple(
        {
            "lp": lp,
            "how": how,
            "rows": rows[(lp, how)],
            "seen_in_training": seen[(lp, how)],
            **({"given": extra[(lp, how)]["given"], "detected": dict(extra[(lp, how)]["detected"])} if (lp, how) in extra else {}),
        }
        for lp, how in sorted(rows, key=lambda key: (key[0] or "", key[1]))
    )
    return BatchLanguagePairs(lps, known, factor, lp_column)


# ----------------------------------------------------------------------------- output folder
def store_folders(tracking_uri: str, pin: ModelPin | None = None) -> list[tuple[Path, str]]:
    """Folders batch output must never go into, each with what it is: the model store's artifacts
    (beside a SQLite registry, the project's default ``mlflow/artifacts``, a file store) and the
    model's own files."""
    from urllib.parse import unquote, urlparse

    from uamt.registry.store import DEFAULT_STORE, sqlite_path

    # the project's default store (mlflow/artifacts of the working folder), whatever store is used
    folders = [((DEFAULT_STORE / "artifacts").resolve(), "the model store's artifacts")]
    db = sqlite_path(tracking_uri)
    if db is not None:
        folders.append((db.parent / "artifacts", "the model store's artifacts"))
    elif tracking_uri.startswith("file:"):
        folders.append((Path(unquote(urlparse(tracking_uri).path)), "the tracking store"))
    elif "://" not in tracking_uri and Path(tracking_uri).is_dir():  # a file store named by its path
        folders.append((Path(tracking_uri), "the tracking store"))
    if pin is not None and pin.folder is not None:
        folders.append((Path(pin.folder), f"the files of model {pin.uri}"))
    return folders


def check_out_path(out_dir: Path, protected: list[tuple[Path, str]] = ()) -> None:
    """Refuse, before anything is made, an ``out_dir`` that cannot become our folder: one under a
    file (``file.csv/x``), inside a folder of ``protected`` (:func:`store_folders`), or whose
    nearest existing parent is not writable."""
    resolved = out_dir.resolve()
    for folder, what in protected:
        folder = folder.resolve()
        if resolved == folder or folder in resolved.parents:
            raise DataError(f"{out_dir}: is inside {folder}, {what}; write the parts elsewhere")
    for ancestor in (out_dir, *out_dir.parents):
        if not (ancestor.exists() or ancestor.is_symlink()):
            continue
        if ancestor == out_dir and not ancestor.is_dir():
            raise DataError(f"{out_dir}: is a file; --out must be a folder for --input")
        if not ancestor.is_dir():
            raise DataError(f"{out_dir}: {ancestor} is a file, not a folder; --out must be a folder for --input")
        if ancestor != out_dir and not os.access(ancestor, os.W_OK | os.X_OK):
            raise DataError(f"{out_dir}: cannot be created: {ancestor} is not writable")
        return


def _new_manifest(input_path: Path, settings: BatchSettings, pin: ModelPin, lp_column: bool) -> dict[str, Any]:
    stat = input_path.stat()
    return {
        "format": MANIFEST_FORMAT,
        "input": str(input_path.resolve()),
        "input_bytes": stat.st_size,
        "input_mtime_ns": stat.st_mtime_ns,
        "lp_column": lp_column,
        "settings": {k: v for k, v in asdict(settings).items() if k != "tracking_uri"},
        "model": asdict(pin),
        "parts": {},
    }


def _job(manifest: dict[str, Any]) -> dict[str, Any]:
    """The input and settings of a manifest, flat; the model is compared by its pin, not its name."""
    settings = {k: v for k, v in (manifest.get("settings") or {}).items() if k != "model"}
    return {**{k: manifest.get(k) for k in ("input", "input_bytes", "input_mtime_ns", "lp_column")}, **settings}


def _read_previous(out_dir: Path) -> dict[str, Any] | None:
    """The ``_batch.json`` of an existing ``out_dir`` (None for a new or empty folder)."""
    if not out_dir.is_dir():
        return None
    path = out_dir / MANIFEST
    if not path.is_file():
        foreign = sorted(p.name for p in out_dir.iterdir() if not p.name.startswith("."))
        if foreign:
            raise DataError(
                f"{out_dir}: folder is not empty and holds no {MANIFEST} ({foreign[:5]}); choose an "
                "empty or new folder for --out"
            )
        return None
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable ({exc}); remove the folder to start again") from None
    if not isinstance(previous, dict) or previous.get("format") != MANIFEST_FORMAT or not isinstance(
        previous.get("model"), dict
    ):
        raise DataError(
            f"{out_dir}: {MANIFEST} was written by an earlier uamt that recorded neither the model version "
            "nor part checksums, so its parts cannot be verified: choose a new --out, or remove the folder "
            "to rescore"
        )
    if not isinstance(previous.get("parts"), dict):
        previous["parts"] = {}
    return previous


def _model_changed(out_dir: Path, before: dict[str, Any], now: ModelPin) -> DataError:
    """The refusal of a restart whose model is not the one the parts were scored with."""
    name, version = before.get("name"), before.get("version")
    same = "one output never mixes two models"
    if version is not None and now.version is not None and name == now.name and version != now.version:
        return DataError(
            f"{out_dir}: its parts were scored with {name} version {version} ({before.get('uri')} then), "
            f"but {now.uri} is now version {now.version}; {same}: finish this batch with --model "
            f"models:/{name}/{version}, or choose a new --out to score everything with version {now.version}"
        )
    described = f"{name} version {version}" if version is not None else str(before.get("loaded_as"))
    if described == now.describe():
        old, new = before.get("calibration_sha256"), now.calibration_sha256
        return DataError(
            f"{out_dir}: its parts were scored with {described} with calibration sha256 {str(old)[:12]}, but "
            f"{now.uri} now ships calibration sha256 {str(new)[:12]} (the model changed since); {same}: "
            "choose a new --out, or restore the model the parts were scored with"
        )
    return DataError(
        f"{out_dir}: its parts were scored with model {described}, not {now.describe()}; {same}: finish "
        f"this batch with --model {before.get('loaded_as')}, or choose a new --out"
    )


def check_same_job(out_dir: Path, previous: dict[str, Any], manifest: dict[str, Any], pin: ModelPin, n_partitions: int) -> None:
    """Refuse to continue ``previous`` (an existing ``_batch.json``) with another model, input or
    settings, or in a folder holding files that ``pandas.read_parquet`` would read as data but that
    are no part of this job."""
    try:
        before = ModelPin(**previous["model"])
    except TypeError:
        raise DataError(f"{out_dir / MANIFEST}: unreadable model record; remove the folder to start again") from None
    if before.identity() != pin.identity():
        raise _model_changed(out_dir, previous["model"], pin)
    old, new = _job(previous), _job(manifest)
    changed = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
    if changed:
        raise DataError(
            f"{out_dir}: holds parts of another batch job (differs in {changed}); choose another "
            "--out, or remove the folder to rescore"
        )
    parts = {PART_PATTERN.format(index) for index in range(n_partitions)}
    foreign = sorted(p.name for p in out_dir.iterdir() if not p.name.startswith(("_", ".")) and p.name not in parts)
    if foreign:
        raise DataError(
            f"{out_dir}: holds files that are not parts of this batch job {foreign[:5]}; pandas.read_parquet "
            "would read them as data: move them out of the folder"
        )


class _Manifest:
    """``_batch.json`` of a running job: rewritten (atomically) each time a part is recorded."""

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path = path
        self.data = data

    @property
    def parts(self) -> dict[str, dict[str, Any]]:
        return self.data["parts"]

    def save(self) -> None:
        from uamt.core.fileio import atomic_write_text

        atomic_write_text(self.path, json.dumps(self.data, indent=2) + "\n")

    def record(self, name: str, record: dict[str, Any]) -> None:
        self.parts[name] = record
        self.save()

    def forget(self, name: str) -> None:
        if self.parts.pop(name, None) is not None:
            self.save()


def _open_out_dir(out_dir: Path, manifest: dict[str, Any], previous: dict[str, Any] | None) -> _Manifest:
    """Create ``out_dir`` with its ``_batch.json``, or take over ``previous``'s; remove the temp
    files of a killed run and the ``_SUCCESS`` of a finished one (the job is open again)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{out_dir}: cannot create the folder ({exc})") from None
    book = _Manifest(out_dir / MANIFEST, manifest if previous is None else previous)
    if previous is None:
        book.save()
    for tmp in out_dir.glob(".part-*"):  # temp files of a run killed while writing
        tmp.unlink(missing_ok=True)
    (out_dir / SUCCESS).unlink(missing_ok=True)
    return book


def part_problem(path: Path, record: dict[str, Any] | None, rows: list[int]) -> str | None:
    """Why the existing part ``path`` cannot be skipped (None: it is verified complete).

    A part is trusted only when its bytes have the sha256 recorded when it was written, it reads
    back, and its ``row`` column is exactly ``rows`` (the input rows of its partition).
    """
    from uamt.core.fileio import sha256_file

    if not path.is_file():
        return "recorded as written but missing"
    if record is None:
        return "no checksum recorded for it (the run that wrote it stopped before recording it)"
    if sha256_file(path) != record.get("sha256"):
        return "its sha256 differs from the one recorded when it was written (changed or damaged since)"
    import pyarrow.parquet as pq

    try:
        got = pq.read_table(path).column(ROW_COLUMN).to_pylist()
    except Exception as exc:  # noqa: BLE001 - whatever makes it unreadable, the partition is scored again
        return f"unreadable ({type(exc).__name__}: {exc})"
    if got != rows:
        span = f"{got[0]}..{got[-1]}" if got else "none"
        return f"holds {_rows(len(got))} ({span}), not rows {rows[0]}..{rows[-1]} of its partition"
    return None


# ----------------------------------------------------------------------------- driver
def parse_dask(spec: str) -> tuple[str, int | str]:
    """``local:N`` -> ("local", N); ``tcp://HOST:PORT`` (or tls, ucx, ws, wss) -> ("address", spec).

    Raises
    ------
    uamt.core.errors.UamtError
        Another form or scheme (``inproc://`` reaches only this process, ``http://`` is no Dask
        protocol), or an address without HOST:PORT.
    """
    if spec.startswith("local:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 1:
            raise UamtError(f"--dask={spec!r}: local:N needs a number of workers N >= 1")
        return "local", n
    scheme, sep, address = spec.partition("://")
    if not sep or scheme not in DASK_SCHEMES:
        choices = ["local:N", *(f"{s}://HOST:PORT" for s in DASK_SCHEMES)]
        raise UamtError(f"--dask={spec!r} not supported; choose from {choices}")
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UamtError(f"--dask={spec!r} needs HOST:PORT after {scheme}:// (e.g. {scheme}://10.0.0.5:8786)")
    return "address", spec


def _dask_client(spec: str):
    kind, value = parse_dask(spec)
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:  # an install without the pipeline extra scores in this process only
        raise UamtError(
            f"--dask={spec!r} needs Dask ({exc.name or 'distributed'} is not installed): pip install "
            "'uamt[pipeline]', or score without --dask"
        ) from None

    if kind == "local":
        # One thread per worker process: torch is given one core each, so N workers use N cores.
        cluster = LocalCluster(
            n_workers=int(value), threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        )
        return Client(cluster), cluster
    try:
        return Client(value), None
    except (OSError, TimeoutError, ValueError) as exc:
        raise UamtError(f"--dask={spec!r}: cannot reach the Dask scheduler ({type(exc).__name__}: {exc})") from None


def score_file(
    input_path: str | Path,
    out_dir: str | Path,
    settings: BatchSettings,
    *,
    dask: str | None = None,
    client=None,
    log: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> BatchResult:
    """Score ``input_path`` into ``out_dir`` (see the module docstring), skipping verified parts.

    Everything that can be refused is refused before ``out_dir`` is made or changed: ``dask``, the
    input (every row), ``settings.lp`` beside an ``lp`` column, ``out_dir`` under a file or inside
    the model store, an ``out_dir`` holding another job's parts or scored with another model.

    Parameters
    ----------
    dask : str, optional
        ``local:N`` (a LocalCluster of N one-thread worker processes on loopback) or the address
        of a running scheduler; None with no ``client``: score in this process.
    client : distributed.Client, optional
        A client to use instead of ``dask`` (left open).
    log : callable, optional
        Receives one progress line per finished partition.
    warn : callable, optional
        Receives what the user must know: parts scored again (and why), rows without an ``lp``.
    """
    input_path, out_dir = Path(input_path), Path(out_dir)
    warn = warn or (lambda message: None)
    if dask is not None:
        parse_dask(dask)
    columns = input_columns(input_path)  # file type and columns, before any folder is made
    lp_column = "lp" in columns
    if settings.lp is not None:
        check_lp_option(settings.lp)
        if lp_column:
            raise DataError(
                f"{input_path}: has an lp column and --lp {settings.lp} was given: the column gives each "
                "row's language pair; drop --lp, or drop the column to use --lp for every row"
            )
    from uamt.registry.store import tracking_uri

    pin = pin_model(settings.model, settings.tracking_uri)
    check_out_path(out_dir, store_folders(settings.tracking_uri or tracking_uri(), pin))
    previous = _read_previous(out_dir)
    checked = check_input(input_path, settings.partition_rows)
    manifest = _new_manifest(input_path, settings, pin, lp_column)
    if previous is not None:
        check_same_job(out_dir, previous, manifest, pin, checked.n_partitions)
    if client is None and dask is None:
        # Scoring in this process: load the model now (it is cached for the partitions), so a model
        # that cannot be loaded or does not fit the columns is refused before the folder is made.
        # A Dask worker loads it there; the driver does not hold a copy it would not use.
        from uamt.serving.scores import check_signature

        predictor = cached_predictor(pin.loaded_as, settings.tracking_uri)
        check_signature(predictor, has_references="ref" in columns, model=settings.model)

    started = time.perf_counter()
    own_client = own_cluster = None
    if client is None and dask is not None:
        client, own_cluster = _dask_client(dask)
        own_client = client
    tally = _Tally()
    try:
        book = _open_out_dir(out_dir, manifest, previous)
        # The workers load the pinned version: moving @champion during the run changes nothing.
        worker_settings = replace(settings, model=pin.loaded_as)

        def done(index: int, record: dict[str, Any]) -> None:
            book.record(PART_PATTERN.format(index), record)
            if log:
                log(f"part {index}: {record['rows']} rows")

        todo = _unfinished_parts(input_path, out_dir, settings.partition_rows, book, tally, warn)
        if client is None:
            for index, frame, part in todo:
                done(index, score_partition(frame, str(part), worker_settings))
        else:
            _score_on_dask(client, todo, worker_settings, done)
    finally:
        if own_client is not None:
            own_client.close()
        if own_cluster is not None:
            own_cluster.close()
    lps = language_pairs_of([book.parts[PART_PATTERN.format(i)] for i in range(tally.n_parts)], lp_column)
    if checked.rows_without_lp:
        shown = ", ".join(map(str, checked.first_rows_without_lp))
        more = ", ..." if checked.rows_without_lp > len(checked.first_rows_without_lp) else ""
        detected = any(item["how"] in (LP_DETECTED, LP_UNDETERMINED) for item in lps.lps)
        what = (
            "their language pair is detected from their text"
            if detected
            else "the global calibration is used for them (the model is calibrated globally only)"
        )
        warn(f"{_rows(checked.rows_without_lp)} have no lp (rows {shown}{more}): {what}")
    book.data["n_rows"] = tally.n_rows
    book.data["lps"] = list(lps.lps)
    book.save()
    from uamt.core.fileio import atomic_write_text

    atomic_write_text(out_dir / SUCCESS, "")
    return BatchResult(
        out_dir, tally.n_rows, tally.n_parts, tally.n_skipped, time.perf_counter() - started, tally.n_rescored, lps
    )


@dataclass
class _Tally:
    n_rows: int = 0
    n_parts: int = 0
    n_skipped: int = 0
    n_rescored: int = 0


def _unfinished_parts(
    input_path: Path, out_dir: Path, partition_rows: int, book: _Manifest, tally: _Tally, warn: Callable[[str], None]
) -> Iterator[tuple[int, pd.DataFrame, Path]]:
    """``(index, frame, part path)`` of each partition whose part is not verified complete
    (:func:`part_problem`; one that exists but fails is named through ``warn``); counts all."""
    for index, frame in iter_partitions(input_path, partition_rows):
        tally.n_parts += 1
        tally.n_rows += len(frame)
        name = PART_PATTERN.format(index)
        part = out_dir / name
        record = book.parts.get(name)
        if record is None and not part.exists():
            yield index, frame, part
            continue
        problem = part_problem(part, record, frame[ROW_COLUMN].tolist())
        if problem is None:
            tally.n_skipped += 1
            continue
        warn(f"{name}: {problem}; scoring it again")
        tally.n_rescored += 1
        book.forget(name)
        yield index, frame, part


def _score_on_dask(client, todo, settings: BatchSettings, done: Callable[[int, dict[str, Any]], None]) -> None:
    """Submit the partitions of ``todo``, at most two per worker in flight (memory stays bounded);
    ``done(index, record)`` for each as it finishes."""
    from distributed import as_completed

    n_workers = max(len(client.scheduler_info().get("workers", {})), 1)
    limit = 2 * n_workers
    run_id = uuid.uuid4().hex[:8]  # keys unique per run: a reused client must not return old results
    running = as_completed()
    indices: dict[str, int] = {}

    def collect_one() -> None:
        future = next(running)
        record = future.result()  # re-raises the worker's error (DataError, UamtError, ...)
        done(indices.pop(future.key), record)

    for index, frame, part in todo:
        while running.count() >= limit:
            collect_one()
        future = client.submit(score_partition, frame, str(part), settings, key=f"uamt-{run_id}-part-{index:05d}")
        indices[future.key] = index
        running.add(future)
    while running.count():
        collect_one()


def summary_line(result: BatchResult) -> str:
    rescored = f", {result.n_rescored} scored again after failing verification" if result.n_rescored else ""
    return (
        f"scored {result.n_rows} rows in {result.n_partitions} partitions "
        f"({result.n_skipped} already done{rescored}) -> {result.out_dir} in {result.seconds:.1f} s "
        f"({result.rows_per_second:.1f} rows/s)"
    )


def print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
