"""The ``incoming`` section of params.yaml: where new annotations arrive and how they are taken in.

:class:`IncomingConfig` (read with :func:`load_config`, which adds ``trained_datasets`` from
``pipeline.datasets`` and ``published_dir`` from ``prepare.out_dir``), the file formats and columns
accepted (:data:`SUFFIXES`, :data:`REQUIRED`, :data:`OPTIONAL`) and the limits on a row's values.
"""


from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from uamt.core.config import DEFAULT_PARAMS, ConfigError, load_section, read_params
from uamt.data.datasets import DATASET_SPECS, DATASETS

SECTION = "incoming"
SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet")
REQUIRED = ("dataset", "lp", "src", "mt", "score", "system")
OPTIONAL = ("ref", "doc", "seg_id", "score_std", "n_annotators", "annotator_scores", "score_raw", "domain", "campaign")
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
        from every published score of the same (src, mt) before it contradicts them.  Rows naming a
        ``campaign`` are exempt: their raters' score may differ from the published campaign's.
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
