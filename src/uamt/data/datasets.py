"""One declaration per dataset, read by every consumer.

A :class:`DatasetSpec` says how to load a source (its loader), which language pairs it has, the
human score scale (name, range, direction, the default "bad translation" threshold), its domain,
whether its model input has references, whether it publishes per-annotator scores, and whether
the whole dataset is forced into one split.  ``uamt data prepare`` (loading, the chrF guard),
:mod:`uamt.ingest` (bounds, LPs, domains of new annotations) and :mod:`uamt.serving.calibrated_predictor` (the scale a
registered model predicts on) all read :data:`DATASET_SPECS`; nothing else lists datasets.

Adding a source: a loader module in :mod:`uamt.data.sources` and one entry below, plus its files'
pins in ``data_sources.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from uamt.core.scale import ScoreScale
from uamt.data import loaders
from uamt.data.schema import DA_Z_RANGE, HTER_RANGE, MQM_RANGE
from uamt.data.sources import bio_mqm, wmt23


@dataclass(frozen=True)
class LoadOptions:
    """The ``prepare:`` settings a loader may use (see :class:`uamt.data.prepare.PrepareConfig`)."""

    pseudo_doc_size: int = 10
    drop_systems: Mapping[str, str] = field(default_factory=dict)
    human_reference: Mapping[str, str] | None = None
    drop_empty_mt: bool = True


Loader = Callable[[Path, LoadOptions], pd.DataFrame]


@dataclass(frozen=True)
class DatasetSpec:
    """Everything the project knows about one dataset.

    name: the ``dataset`` column value.  load: ``(root, options) -> canonical table``.
    lps: language pairs the loader reads by default.  scale: the human score scale (its
    ``default_risk_threshold`` is the "bad translation" cut-off χ).  score_range: plausible
    ``score`` values, inclusive.  higher_is_better: direction of ``score``.  domain: the
    ``domain`` of new rows that do not name one.  reference_based: the model input includes a
    reference (new rows must carry one; the chrF guard can run).  multi_rater: some rows carry
    several annotators' scores (the KL objective).  forced_split: the split every row goes to
    (None = split by documents).
    """

    name: str
    load: Loader
    lps: tuple[str, ...]
    scale: ScoreScale
    score_range: tuple[float, float]
    domain: str
    reference_based: bool = True
    multi_rater: bool = False
    higher_is_better: bool = True
    forced_split: str | None = None


MQM = ScoreScale("MQM", "MQM score: 0 = no error, negative = weighted error penalty", -5.0)
DA_Z = ScoreScale("DA-z", "direct assessment z-score (per-annotator standardised)", -1.0)
HTER = ScoreScale("HTER", "human-targeted translation error rate: 0 = no edits, higher is worse", 0.3)


def _wmt21_da(root: Path, o: LoadOptions) -> pd.DataFrame:
    return loaders.load_wmt21_da(
        root,
        pseudo_doc_size=o.pseudo_doc_size,
        drop_systems=o.drop_systems,
        human_reference=o.human_reference,
        drop_empty_mt=o.drop_empty_mt,
    )


def _wmt21_mqm(root: Path, o: LoadOptions) -> pd.DataFrame:
    return loaders.load_wmt21_mqm(
        root, pseudo_doc_size=o.pseudo_doc_size, drop_systems=o.drop_systems, drop_empty_mt=o.drop_empty_mt
    )


_SPECS = (
    DatasetSpec("wmt21_da", _wmt21_da, loaders.WMT21_DA_LPS, DA_Z, DA_Z_RANGE, "news", multi_rater=True),
    DatasetSpec("wmt21_mqm", _wmt21_mqm, loaders.WMT21_MQM_LPS, MQM, MQM_RANGE, "news"),
    DatasetSpec(
        "ted_mqm",
        lambda root, o: loaders.load_ted_mqm(root, drop_systems=o.drop_systems),
        loaders.TED_MQM_LPS,
        MQM,
        MQM_RANGE,
        "ted",
        forced_split="ood",
    ),
    DatasetSpec(
        "wmt23_mqm",
        lambda root, o: wmt23.load_wmt23_mqm(root, drop_systems=o.drop_systems),
        wmt23.WMT23_MQM_LPS,
        MQM,
        wmt23.WMT23_MQM_RANGE,
        "news",
        multi_rater=True,
    ),
    DatasetSpec(
        "wmt23_sxs_mqm",
        lambda root, o: wmt23.load_wmt23_sxs_mqm(root),
        wmt23.WMT23_SXS_LPS,
        MQM,
        wmt23.WMT23_MQM_RANGE,
        "news",
        multi_rater=True,
    ),
    DatasetSpec(
        "bio_mqm",
        lambda root, o: bio_mqm.load_bio_mqm(root, drop_systems=o.drop_systems),
        bio_mqm.BIO_MQM_LPS,
        MQM,
        bio_mqm.BIO_MQM_RANGE,
        "biomedical",
        multi_rater=True,
        forced_split="ood",
    ),
    DatasetSpec(
        "mlqe",
        lambda root, o: loaders.load_mlqe(root),
        loaders.MLQE_LPS,
        DA_Z,
        DA_Z_RANGE,
        "wiki",
        reference_based=False,
        multi_rater=True,
    ),
    DatasetSpec(
        "qt21_hter",
        lambda root, o: loaders.load_qt21_hter(root, pseudo_doc_size=o.pseudo_doc_size),
        ("en-de", "en-cs", "en-lv", "de-en"),
        HTER,
        HTER_RANGE,
        "life_sciences",
        higher_is_better=False,
    ),
    DatasetSpec(
        "multihyp_eten",
        lambda root, o: loaders.load_multihyp_eten(root, pseudo_doc_size=o.pseudo_doc_size),
        ("et-en",),
        DA_Z,
        DA_Z_RANGE,
        "wiki",
        forced_split="test",
    ),
)

#: name -> declaration, in the order datasets are loaded.
DATASET_SPECS: dict[str, DatasetSpec] = {spec.name: spec for spec in _SPECS}
DATASETS: tuple[str, ...] = tuple(DATASET_SPECS)


def dataset_spec(name: str) -> DatasetSpec:
    """The declaration of dataset ``name``; an unknown name raises ``ValueError`` listing the known ones."""
    if name not in DATASET_SPECS:
        raise ValueError(f"dataset={name!r} not supported; choose from {sorted(DATASET_SPECS)}")
    return DATASET_SPECS[name]


def default_forced_splits() -> dict[str, str]:
    """dataset -> split for the datasets declared ``forced_split``."""
    return {s.name: s.forced_split for s in _SPECS if s.forced_split is not None}


def scale_bounds(datasets) -> tuple[float, float] | None:
    """The widest ``score_range`` of the declared ``datasets`` (None when none is declared)."""
    ranges = [DATASET_SPECS[d].score_range for d in datasets if d in DATASET_SPECS]
    if not ranges:
        return None
    return (float(min(r[0] for r in ranges)), float(max(r[1] for r in ranges)))
