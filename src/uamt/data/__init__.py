"""Data layer: fetch the pinned public files, load every source into one canonical table, split it.

* :mod:`uamt.data.fetch` - mirror copy or URL download, sha256-checked, atomic.
* :mod:`uamt.data.datasets` - one declaration per dataset (loader, scale, LPs, domain, split policy).
* :mod:`uamt.data.loaders` - one loader per source -> canonical table (:mod:`uamt.data.schema`).
* :mod:`uamt.data.splits` - document- and source-disjoint splits across datasets.
* :mod:`uamt.data.prepare` - load + split + atomic write of ``<split>.parquet`` and ``summary.json``.
"""

from uamt.data.datasets import DATASET_SPECS, DATASETS, DatasetSpec
from uamt.data.fetch import FetchConfig, SourceFiles, fetch_all
from uamt.data.loaders import (
    load_mlqe,
    load_multihyp_eten,
    load_qt21_hter,
    load_ted_mqm,
    load_wmt21_da,
    load_wmt21_mqm,
)
from uamt.data.prepare import PrepareConfig, build_table, format_summary, prepare, read_summary
from uamt.data.schema import COLUMNS, SPLITS
from uamt.data.splits import assign_splits, check_disjoint

__all__ = [
    "COLUMNS",
    "DATASETS",
    "DATASET_SPECS",
    "DatasetSpec",
    "SPLITS",
    "FetchConfig",
    "PrepareConfig",
    "SourceFiles",
    "assign_splits",
    "build_table",
    "check_disjoint",
    "fetch_all",
    "format_summary",
    "load_mlqe",
    "load_multihyp_eten",
    "load_qt21_hter",
    "load_ted_mqm",
    "load_wmt21_da",
    "load_wmt21_mqm",
    "prepare",
    "read_summary",
]
