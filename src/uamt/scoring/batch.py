"""Batch scoring of a Parquet/CSV dataset into partitioned Parquet, in one process or on Dask.

Input
    A ``.parquet`` or ``.csv`` file with columns ``src``, ``mt`` (str, required), ``ref`` (str;
    required by a reference-based model, refused by a reference-free one) and ``lp`` (optional,
    selects per-LP calibration; without it, ``--lp`` or the pair detected on the first partition,
    :func:`batch_language_pair`).  It is streamed in partitions of ``partition_rows`` rows
    (:meth:`pyarrow.parquet.ParquetFile.iter_batches`, :func:`pandas.read_csv` with ``chunksize``):
    the whole input is never in memory, only the partitions being scored.
Output
    ``out_dir/part-00000.parquet``, ``part-00001.parquet``, ... one per partition, with ``row`` (the
    0-based number of the input data row) and the predictor's columns (``mu``, ``sigma``, ``lower``,
    ``upper``, ``risk``; ``epistemic_var``, ``aleatoric_var``, ``clipped`` where the model gives
    them); ``_batch.json`` (the settings the parts were scored with) and, once every part is
    written, ``_SUCCESS``.  ``pandas.read_parquet(out_dir)`` reads the whole result (files whose
    name starts with ``_`` or ``.`` are not data).
Restart
    Each part is written to a temporary file and renamed into place, so a part that exists is
    complete; a run started again on the same ``out_dir`` with the same input and settings skips
    the parts whose Parquet footer says they hold the expected number of rows, rescoring only the
    others (left-over temporary files of a killed run are removed).  Other settings are refused, so
    one output never mixes two models or confidence levels.
Workers
    Every partition is scored by :func:`score_partition`, in this process or on a Dask worker; a
    worker loads the model once (:func:`cached_predictor`, one per process and model URI) and
    scores all its partitions with it.  The numbers are those of ``uamt score``: the same
    :class:`~uamt.predictor.Predictor` and ``predict_frame`` call.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from uamt.errors import DataError, UamtError

#: Input suffix -> reader.
INPUT_FORMATS = {".parquet": "parquet", ".csv": "csv"}
REQUIRED_COLUMNS = ("src", "mt")
OPTIONAL_COLUMNS = ("ref", "lp")
ROW_COLUMN = "row"
DEFAULT_PARTITION_ROWS = 10_000
MANIFEST = "_batch.json"
SUCCESS = "_SUCCESS"
PART_PATTERN = "part-{:05d}.parquet"


@dataclass(frozen=True)
class BatchSettings:
    """What the numbers depend on; recorded in ``_batch.json`` and compared on a restart."""

    model: str
    confidence: float = 0.9
    risk_threshold: float | None = None
    batch_size: int = 64
    partition_rows: int = DEFAULT_PARTITION_ROWS
    lp: str | None = None
    #: The MLflow tracking URI the workers load ``model`` from (a remote worker has no environment
    #: of ours).  Not part of the comparison on restart: the same model may be read from a copy.
    tracking_uri: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class BatchResult:
    out_dir: Path
    n_rows: int
    n_partitions: int
    n_skipped: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.n_rows / self.seconds if self.seconds > 0 else float("nan")


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


def input_columns(path: str | Path) -> list[str]:
    """The column names of the input (its schema or CSV header), checked for ``src`` and ``mt``.

    Raises
    ------
    uamt.errors.DataError
        Unsupported suffix, unreadable file, or a required column missing (file and column named).
    """
    path = Path(path)
    fmt = input_format(path)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            columns = list(pq.read_schema(path).names)
        else:
            columns = list(pd.read_csv(path, nrows=0, encoding="utf-8").columns)
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # ArrowInvalid and ParserError are ValueErrors
        raise DataError(f"{path}: cannot read as {fmt} ({type(exc).__name__}: {exc})") from None
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
            reader = pd.read_csv(
                path, usecols=columns, dtype=str, keep_default_na=False, chunksize=rows, encoding="utf-8"
            )
            with reader:
                yield from reader
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read as {fmt} ({type(exc).__name__}: {exc})") from None


def iter_partitions(path: str | Path, partition_rows: int) -> Iterator[tuple[int, pd.DataFrame]]:
    """``(index, frame)`` for consecutive partitions of exactly ``partition_rows`` rows (the last
    may be shorter), each with the input row numbers in column ``row`` and the used columns only.

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
        return frame

    for chunk in _record_batches(path, fmt, columns, partition_rows):
        while len(chunk):
            take = min(partition_rows - n_pending, len(chunk))
            pending.append(chunk.iloc[:take])
            n_pending += take
            chunk = chunk.iloc[take:]
            if n_pending == partition_rows:
                frame = emit(pending)
                check_rows(frame, path)
                yield index, frame
                index += 1
                start += n_pending
                pending, n_pending = [], 0
    if n_pending:
        frame = emit(pending)
        check_rows(frame, path)
        yield index, frame
    elif index == 0:
        raise DataError(f"{path}: no data rows")


def check_rows(frame: pd.DataFrame, path: str | Path) -> None:
    """Refuse a missing or empty text field, naming the file, the input row and the column."""
    from uamt.textcheck import blank_detail, is_blank

    for column in ("src", "mt", "ref"):
        if column not in frame.columns:
            continue
        for row, value in zip(frame[ROW_COLUMN].tolist(), frame[column].tolist(), strict=True):
            if not isinstance(value, str):
                raise DataError(
                    f"{path}: row {row}: column {column!r} must be text, got "
                    f"{'nothing (null)' if value is None or value != value else type(value).__name__}"
                )
            if is_blank(value):
                detail = blank_detail(value)
                raise DataError(f"{path}: row {row}: column {column!r} is empty" + (f" ({detail})" if detail else ""))


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
            from uamt.predictor import load_predictor

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


def score_partition(frame: pd.DataFrame, out_path: str, settings: BatchSettings) -> int:
    """Score one partition with the cached predictor and write it atomically to ``out_path``.

    Returns
    -------
    int
        The number of rows written.
    """
    from uamt.fileio import atomic_path
    from uamt.scoring.score import check_signature, predict

    predictor = cached_predictor(settings.model, settings.tracking_uri)
    check_signature(predictor, has_references="ref" in frame.columns, model=settings.model)
    model_input = frame.drop(columns=[ROW_COLUMN])
    if settings.lp is not None and "lp" not in model_input.columns:
        model_input["lp"] = settings.lp
    out = predict(
        predictor,
        model_input,
        confidence=settings.confidence,
        risk_threshold=settings.risk_threshold,
        batch_size=settings.batch_size,
        progress=False,
    )
    out.insert(0, ROW_COLUMN, frame[ROW_COLUMN].to_numpy())
    with atomic_path(out_path) as tmp:
        out.to_parquet(tmp, index=False)
    return len(out)


def batch_language_pair(input_path: str | Path, settings: BatchSettings):
    """The LP choice of a batch without an ``lp`` column (:func:`predictor_language_pair`): the
    ``settings.lp`` given, else the pair detected on the first partition's texts; None when the
    input has its own ``lp`` column (rows of an unseen LP are widened there, without a warning).

    Loads the model in this process (:func:`cached_predictor`: in-process scoring reuses it; with
    Dask it is one more load, on the driver) to know which LPs it was calibrated on.
    """
    from uamt.scoring.language_pair import predictor_language_pair

    if "lp" in input_columns(input_path):
        return None
    predictor = cached_predictor(settings.model, settings.tracking_uri)
    _, first = next(iter_partitions(input_path, settings.partition_rows))
    return predictor_language_pair(predictor, first["src"].tolist(), first["mt"].tolist(), settings.lp)


# ----------------------------------------------------------------------------- output folder
def _manifest(input_path: Path, settings: BatchSettings) -> dict[str, Any]:
    stat = input_path.stat()
    return {
        "input": str(input_path.resolve()),
        "input_bytes": stat.st_size,
        "input_mtime_ns": stat.st_mtime_ns,
        "settings": {k: v for k, v in asdict(settings).items() if k != "tracking_uri"},
    }


def _flat(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in manifest.items() if k != "settings"}, **(manifest.get("settings") or {})}


def prepare_out_dir(out_dir: Path, input_path: Path, settings: BatchSettings) -> None:
    """Create ``out_dir`` or check it holds parts of the same job; remove left-over temp files.

    Raises
    ------
    uamt.errors.DataError
        ``out_dir`` is a file, holds files that are not ours, or parts scored with other settings.
    """
    manifest = _manifest(input_path, settings)
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"{out_dir}: is a file; --out must be a folder for --input")
    out_dir.mkdir(parents=True, exist_ok=True)
    previous_path = out_dir / MANIFEST
    if previous_path.is_file():
        try:
            previous = json.loads(previous_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"{previous_path}: unreadable ({exc}); remove the folder to start again") from None
        if not isinstance(previous, dict) or previous != manifest:
            before, now = _flat(previous if isinstance(previous, dict) else {}), _flat(manifest)
            changed = sorted(k for k in {*before, *now} if before.get(k) != now.get(k))
            raise DataError(
                f"{out_dir}: holds parts of another batch job (differs in {changed}); choose another "
                "--out, or remove the folder to rescore"
            )
    else:
        foreign = [p.name for p in out_dir.iterdir() if not p.name.startswith(".")]
        if foreign:
            raise DataError(
                f"{out_dir}: folder is not empty and holds no {MANIFEST} ({foreign[:5]}); choose an "
                "empty or new folder for --out"
            )
        from uamt.fileio import atomic_write_text

        atomic_write_text(previous_path, json.dumps(manifest, indent=2) + "\n")
    for tmp in out_dir.glob(".part-*"):  # temp files of a run killed while writing
        tmp.unlink(missing_ok=True)
    (out_dir / SUCCESS).unlink(missing_ok=True)


def part_done(path: Path, n_rows: int) -> bool:
    """Whether ``path`` is a complete part of ``n_rows`` rows (a readable Parquet footer says so)."""
    if not path.is_file():
        return False
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows == n_rows
    except (OSError, ValueError):  # a truncated or foreign file: score the partition again
        return False


# ----------------------------------------------------------------------------- driver
def parse_dask(spec: str) -> tuple[str, int | str]:
    """``local:N`` -> ("local", N); ``tcp://HOST:PORT`` (or tls://, ucx://) -> ("address", spec)."""
    if spec.startswith("local:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 1:
            raise UamtError(f"--dask={spec!r}: local:N needs a number of workers N >= 1")
        return "local", n
    if "://" in spec:
        return "address", spec
    raise UamtError(f"--dask={spec!r} not supported; choose from ['local:N', 'tcp://HOST:PORT']")


def _dask_client(spec: str):
    kind, value = parse_dask(spec)
    from distributed import Client, LocalCluster

    if kind == "local":
        # One thread per worker process: torch is given one core each, so N workers use N cores.
        cluster = LocalCluster(
            n_workers=int(value), threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        )
        return Client(cluster), cluster
    try:
        return Client(value), None
    except (OSError, TimeoutError) as exc:
        raise UamtError(f"--dask={spec!r}: cannot reach the Dask scheduler ({type(exc).__name__}: {exc})") from None


def score_file(
    input_path: str | Path,
    out_dir: str | Path,
    settings: BatchSettings,
    *,
    dask: str | None = None,
    client=None,
    log=None,
) -> BatchResult:
    """Score ``input_path`` into ``out_dir`` (see the module docstring), skipping finished parts.

    Parameters
    ----------
    dask : str, optional
        ``local:N`` (a LocalCluster of N one-thread worker processes on loopback) or the address
        of a running scheduler; None with no ``client``: score in this process.
    client : distributed.Client, optional
        A client to use instead of ``dask`` (left open).
    log : callable, optional
        Receives one progress line per finished partition.
    """
    input_path, out_dir = Path(input_path), Path(out_dir)
    input_columns(input_path)  # file type and columns, before any folder is made
    prepare_out_dir(out_dir, input_path, settings)
    started = time.perf_counter()
    own_cluster = None
    if client is None and dask is not None:
        client, own_cluster = _dask_client(dask)
        own_client = client
    else:
        own_client = None
    tally = _Tally()
    todo = _unfinished_parts(input_path, out_dir, settings, tally)
    try:
        if client is None:
            for index, frame, part in todo:
                score_partition(frame, str(part), settings)
                if log:
                    log(f"part {index}: {len(frame)} rows")
        else:
            _score_on_dask(client, todo, settings, log)
    finally:
        if own_client is not None:
            own_client.close()
        if own_cluster is not None:
            own_cluster.close()
    from uamt.fileio import atomic_write_text

    atomic_write_text(out_dir / SUCCESS, "")
    return BatchResult(out_dir, tally.n_rows, tally.n_parts, tally.n_skipped, time.perf_counter() - started)


@dataclass
class _Tally:
    n_rows: int = 0
    n_parts: int = 0
    n_skipped: int = 0


def _unfinished_parts(
    input_path: Path, out_dir: Path, settings: BatchSettings, tally: _Tally
) -> Iterator[tuple[int, pd.DataFrame, Path]]:
    """``(index, frame, part path)`` of each partition whose part is not complete yet; counts all."""
    for index, frame in iter_partitions(input_path, settings.partition_rows):
        tally.n_parts += 1
        tally.n_rows += len(frame)
        part = out_dir / PART_PATTERN.format(index)
        if part_done(part, len(frame)):
            tally.n_skipped += 1
            continue
        yield index, frame, part


def _score_on_dask(client, todo, settings: BatchSettings, log) -> None:
    """Submit the partitions of ``todo``, at most two per worker in flight (memory stays bounded)."""
    from distributed import as_completed

    n_workers = max(len(client.scheduler_info().get("workers", {})), 1)
    limit = 2 * n_workers
    run_id = uuid.uuid4().hex[:8]  # keys unique per run: a reused client must not return old results
    running = as_completed()

    def collect_one() -> None:
        future = next(running)
        rows = future.result()  # re-raises the worker's error (DataError, UamtError, ...)
        if log:
            log(f"{future.key}: {rows} rows")

    for index, frame, part in todo:
        while running.count() >= limit:
            collect_one()
        running.add(
            client.submit(score_partition, frame, str(part), settings, key=f"uamt-{run_id}-part-{index:05d}")
        )
    while running.count():
        collect_one()


def summary_line(result: BatchResult) -> str:
    return (
        f"scored {result.n_rows} rows in {result.n_partitions} partitions "
        f"({result.n_skipped} already done) -> {result.out_dir} in {result.seconds:.1f} s "
        f"({result.rows_per_second:.1f} rows/s)"
    )


def print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
