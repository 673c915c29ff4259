"""Load every source into one canonical table, split it, and write ``<out_dir>/<split>.parquet``.

Output (atomic: written to a temporary folder beside ``out_dir`` and swapped in only when
complete, so a failure leaves the previous outputs untouched):

* ``<split>.parquet`` for every split in ``fractions`` and ``forced_splits`` (possibly empty),
  columns and scales as in :mod:`uamt.data.schema`;
* ``summary.json``: ``counts[dataset][lp][split]`` row counts, totals and the settings used.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from uamt.core.columns import filled, optional_columns
from uamt.core.config import ConfigError
from uamt.core.fileio import atomic_dir, sha256_file, sha256_text
from uamt.data import loaders
from uamt.data.datasets import DATASET_SPECS, DATASETS, LoadOptions, dataset_spec, default_forced_splits
from uamt.data.guard import GuardConfig, check_signal, chrf_signal, format_signal
from uamt.data.schema import COLUMNS, SPLITS, to_arrow
from uamt.data.splits import DEFAULT_FRACTIONS, assign_splits, check_disjoint, check_fractions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepareConfig:
    """``prepare:`` section of params.yaml.

    raw_dir: data root laid out ``<owner>/<repo>/<path>`` (output of ``uamt data fetch``).
    out_dir: where ``<split>.parquet`` and ``summary.json`` go.
    datasets: which sources to load (default: all).
    fractions: target share of rows per split, per language pair (sum 1).
    forced_splits: dataset -> split for whole datasets (TED -> ood, multihyp -> test).
    seed: seed of the stable component order.
    pseudo_doc_size: segments per pseudo-document where no document ids are published.
    max_rows_per_lp: keep at most about this many rows per dataset x LP (whole documents,
        chosen by a stable hash); null = all data.  One number for every dataset, or a mapping
        dataset -> number for some (the others keep all their rows).
    drop_systems: dataset -> {system glob: reason} of systems to skip.
    human_reference: WMT21 DA LP -> reference letter that the ``HUMAN`` system is.
    drop_empty_mt: drop rated rows whose published system output line is empty (else error).
    annotations_pool: parquet file of newly ingested human annotations (written by
        :mod:`uamt.ingest`); null or a missing file = none.  Pool rows only ever join the
        training pools (see :func:`place_pool_rows`), so dev/test/ood stay fixed.
    pool_calibration_share: of the new documents of pool rows that name a ``campaign`` (a user's
        rater group), the share held out of training in ``d_e`` (whole documents, by a stable
        hash), so the campaign gets calibration rows of its own (:mod:`uamt.campaigns`).
    chrf_guard: the join guard (:mod:`uamt.data.guard`): sentence chrF vs human score per
        dataset x LP must reach ``floor``, else prepare fails naming them.
    """

    raw_dir: str = "data/raw"
    out_dir: str = "data/prepared"
    datasets: tuple[str, ...] = DATASETS
    fractions: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_FRACTIONS))
    forced_splits: dict[str, str] = field(default_factory=default_forced_splits)
    seed: int = 13
    pseudo_doc_size: int = 10
    max_rows_per_lp: int | dict[str, int] | None = None
    drop_systems: dict[str, dict[str, str]] = field(
        default_factory=lambda: {k: dict(v) for k, v in loaders.DEFAULT_DROP_SYSTEMS.items()}
    )
    human_reference: dict[str, str] = field(default_factory=lambda: dict(loaders.DEFAULT_HUMAN_REFERENCE))
    drop_empty_mt: bool = True
    annotations_pool: str | None = None
    pool_calibration_share: float = 0.3
    chrf_guard: GuardConfig = field(default_factory=GuardConfig)

    def __post_init__(self) -> None:
        if not 0.0 <= self.pool_calibration_share < 1.0:
            raise ConfigError(
                f"prepare.pool_calibration_share must be in [0, 1), got {self.pool_calibration_share!r}"
            )
        for name in (*self.datasets, *self.forced_splits, *self.drop_systems):
            if name not in DATASETS:
                raise ConfigError(f"prepare: dataset={name!r} not supported; choose from {sorted(DATASETS)}")
        try:
            check_fractions(self.fractions, self.forced_splits)
        except ValueError as exc:
            raise ConfigError(f"prepare: {exc}") from exc
        if self.pseudo_doc_size < 1:
            raise ConfigError("prepare.pseudo_doc_size must be >= 1")
        caps = self.max_rows_per_lp if isinstance(self.max_rows_per_lp, dict) else {"": self.max_rows_per_lp}
        for name, cap in caps.items():
            if name and name not in DATASETS:
                raise ConfigError(
                    f"prepare.max_rows_per_lp: dataset={name!r} not supported; choose from {sorted(DATASETS)}"
                )
            if cap is not None and cap < 1:
                raise ConfigError(f"prepare.max_rows_per_lp{'.' + name if name else ''} must be >= 1 or null")


def load_dataset(name: str, cfg: PrepareConfig) -> pd.DataFrame:
    """Run the loader declared for dataset ``name`` on ``cfg.raw_dir`` with the settings of ``cfg``.

    Language pairs a loader leaves out on purpose (e.g. WMT21 DA without document ids) are in
    the frame's ``attrs["left_out"]`` (``{lp: reason}``).
    """
    options = LoadOptions(
        pseudo_doc_size=cfg.pseudo_doc_size,
        drop_systems=cfg.drop_systems.get(name, {}),
        human_reference=cfg.human_reference,
        drop_empty_mt=cfg.drop_empty_mt,
    )
    return dataset_spec(name).load(Path(cfg.raw_dir), options)


def limit_rows(df: pd.DataFrame, max_rows_per_lp: int | Mapping[str, int] | None, seed: int) -> pd.DataFrame:
    """Keep whole documents, in stable-hash order, until each dataset x LP has >= its cap of rows.

    ``max_rows_per_lp``: one cap for every dataset, a mapping dataset -> cap (datasets not named
    keep every row), or None (no cap).
    """
    if max_rows_per_lp is None or df.empty:
        return df
    keep = []
    for (dataset, _), part in df.groupby(["dataset", "lp"], sort=True):
        cap = max_rows_per_lp.get(dataset) if isinstance(max_rows_per_lp, Mapping) else max_rows_per_lp
        if cap is None:
            keep.append(part)
            continue
        sizes = part.groupby("doc").size()
        order = sorted(sizes.index, key=lambda d: sha256_text(f"{seed}:{d}"))
        total, chosen = 0, []
        for doc in order:
            if total >= cap:
                break
            chosen.append(doc)
            total += int(sizes[doc])
        keep.append(part[part["doc"].isin(chosen)])
    return pd.concat(keep)


def build_table(cfg: PrepareConfig) -> pd.DataFrame:
    """Load ``cfg.datasets``, apply ``max_rows_per_lp``, assign and check the splits, add the pool."""
    return build_table_with_stats(cfg)[0]


def build_table_with_stats(cfg: PrepareConfig) -> tuple[pd.DataFrame, dict[str, Any]]:
    """:func:`build_table` plus what ``summary.json`` reports about it.

    The join guard (:mod:`uamt.data.guard`) runs on the loaded rows before anything is split
    and raises :class:`~uamt.core.errors.DataError` naming every dataset x LP below its floor.  The
    published data is split first, on its own, so the annotation pool never changes which split
    a published row lands in (the test set stays fixed as annotations arrive).

    Returns
    -------
    table : DataFrame
    stats : dict
        ``annotation_pool`` (rows placed and dropped), ``left_out`` (dataset -> {lp: reason}
        the loaders could not join) and ``chrf_guard`` (dataset -> lp -> r, n, status).
    """
    frames, left_out = [], {}
    for name in cfg.datasets:
        frame = load_dataset(name, cfg)
        if frame.attrs.get("left_out"):
            left_out[name] = dict(frame.attrs["left_out"])
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    signal = chrf_signal(
        table,
        {n: DATASET_SPECS[n].higher_is_better for n in cfg.datasets},
        {n: DATASET_SPECS[n].reference_based for n in cfg.datasets},
        cfg.chrf_guard,
    )
    log.info("%s", format_signal(signal))
    check_signal(signal, cfg.chrf_guard)
    table = limit_rows(table, cfg.max_rows_per_lp, cfg.seed)
    table = assign_splits(table, cfg.fractions, cfg.forced_splits, cfg.seed)
    pool_stats: dict[str, Any] = {"path": cfg.annotations_pool, "rows": 0}
    if cfg.annotations_pool is not None:
        pool = read_pool_as_canonical(cfg.annotations_pool)
        if len(pool):
            table, pool_stats = place_pool_rows(table, pool, cfg.pool_calibration_share)
            pool_stats["path"] = cfg.annotations_pool
    check_disjoint(table)
    return sort_table(table), {"annotation_pool": pool_stats, "left_out": left_out, "chrf_guard": signal}


#: Training pools that new annotations may join; every other split is fixed.
POOL_SPLITS = ("d_q", "d_e")


def read_pool_as_canonical(path: str | Path) -> pd.DataFrame:
    """The annotation pool (canonical columns, ``split``/``group`` ignored); empty if the file is absent."""
    from uamt.core.errors import DataError
    from uamt.data.schema import empty_table, finish_table, require_columns

    path = Path(path)
    if not path.is_file():
        log.info("prepare: no annotation pool at %s", path)
        return empty_table()
    try:
        pool = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise DataError(f"{path}: cannot read the annotation pool as parquet ({exc})") from exc
    require_columns(pool, [c for c in COLUMNS if c not in ("split", "group")], str(path))
    pool = pool.drop(columns=["split", "group"], errors="ignore")
    return finish_table(pool)


def place_pool_rows(
    base: pd.DataFrame, pool: pd.DataFrame, calibration_share: float = 0.0
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Add annotation-pool rows to a split table without moving any published row or leaking.

    Components (rows linked by a shared document or normalised source sentence, as in
    :mod:`uamt.data.splits`) are recomputed over published + pool rows.  A component with pool rows
    whose published rows are

    * absent (new documents and sentences) and whose pool rows name a ``campaign``: its pool rows
      go to ``d_e`` for a ``calibration_share`` of such components (chosen by a stable hash of the
      component), so the campaign's raters have calibration rows the model never trained on, else
      to ``d_q``;
    * all in ``d_q``, or absent: its pool rows go to ``d_q``;
    * all in ``d_e``: its pool rows go to ``d_e`` (still a training pool, never evaluated on);
    * in ``dev``, ``test`` or ``ood``, or in both training pools (a pool row bridging two
      components): its pool rows are **dropped** and counted, because placing them anywhere
      would either leak a sentence/document across splits or change a fixed evaluation split.

    Returns
    -------
    table : DataFrame
        ``base`` (unchanged rows and splits) plus the placed pool rows (``group`` filled).
    stats : dict
        ``rows`` (pool size), ``placed`` per split, ``dropped`` per blocking split set.
    """
    from uamt.data.splits import components

    pool = pool.copy()
    pool["split"] = ""
    pool["group"] = ""
    both = pd.concat([base, pool], ignore_index=True)
    labels = components(both)
    is_pool = np.zeros(len(both), dtype=bool)
    is_pool[len(base) :] = True
    base_splits = (
        pd.DataFrame({"label": labels[~is_pool], "split": both["split"].to_numpy()[~is_pool]})
        .groupby("label")["split"]
        .agg(lambda s: tuple(sorted(set(s))))
        .to_dict()
    )
    base_group = dict(zip(labels[~is_pool], both["group"].to_numpy()[~is_pool], strict=True))
    min_doc = pd.Series(both["doc"].to_numpy()).groupby(labels).min().to_dict()
    pool_labels = labels[is_pool]
    named = set(pool_labels[filled(pool["campaign"])]) if "campaign" in optional_columns(pool) else set()
    splits, groups, dropped = [], [], {}
    for label in pool_labels:
        found = base_splits.get(label, ())
        group = base_group.get(label) or "g-" + sha256_text(min_doc[label])[:16]
        if found == () and label in named and _hash_share(group) < calibration_share:
            split = "d_e"
        elif found in ((), ("d_q",)):
            split = "d_q"
        elif found == ("d_e",):
            split = "d_e"
        else:
            split = None
            key = "+".join(found)
            dropped[key] = dropped.get(key, 0) + 1
        splits.append(split)
        groups.append(group)
    pool["split"] = splits
    pool["group"] = groups
    kept = pool[pool["split"].notna()]
    placed = {s: int(n) for s, n in kept["split"].value_counts().sort_index().items()}
    stats = {"rows": int(len(pool)), "placed": placed, "dropped": dropped}
    if named:
        campaigns = kept[filled(kept["campaign"])]
        stats["campaigns"] = {
            str(name): {s: int(n) for s, n in rows["split"].value_counts().sort_index().items()}
            for name, rows in campaigns.groupby(campaigns["campaign"].astype(str).str.strip())
        }
        stats["calibration_share"] = calibration_share
    if dropped:
        log.warning(
            "prepare: dropped %d annotation-pool row(s) that share a document or source sentence with "
            "a fixed split: %s",
            sum(dropped.values()),
            dropped,
        )
    log.info("prepare: annotation pool: %d row(s), placed %s", len(pool), placed)
    return pd.concat([base, kept], ignore_index=True), stats


def _hash_share(group: str) -> float:
    """A stable number in [0, 1) per split group: which new campaign documents are held out."""
    return int(sha256_text(f"pool-calibration:{group}")[:12], 16) / 16**12


def sort_table(df: pd.DataFrame) -> pd.DataFrame:
    """Canonical row order, so the same rows always give byte-identical files."""
    keys = ["split", "dataset", "lp", "system", "seg_id", "doc", "src", "mt"]
    return df.sort_values(keys, kind="mergesort").reset_index(drop=True)[[*COLUMNS, *optional_columns(df)]]


def summarise(df: pd.DataFrame) -> dict[str, Any]:
    """``counts[dataset][lp][split]`` and per-split totals of a split table."""
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for (dataset, lp, split), n in df.groupby(["dataset", "lp", "split"]).size().items():
        counts.setdefault(dataset, {}).setdefault(lp, {})[split] = int(n)
    totals = {s: int(n) for s, n in df["split"].value_counts().sort_index().items()}
    return {"n_rows": int(len(df)), "split_totals": totals, "counts": counts}


def write_prepared(
    df: pd.DataFrame, out_dir: Path, splits: list[str], extra: Mapping[str, Any]
) -> dict[str, Path]:
    """Write every split and ``summary.json`` into a temporary folder, then swap it in for ``out_dir``."""
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        for split in splits:
            pq.write_table(to_arrow(df[df["split"] == split]), tmp / f"{split}.parquet")
        summary = {**summarise(df), **extra}
        (tmp / "summary.json").write_text(
            json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
    paths = {split: out_dir / f"{split}.parquet" for split in splits}
    paths["summary"] = out_dir / "summary.json"
    return paths


def prepare(cfg: PrepareConfig) -> dict[str, Path]:
    """Build the split table from ``cfg.raw_dir`` and write it to ``cfg.out_dir``; returns the paths."""
    table, stats = build_table_with_stats(cfg)
    splits = [s for s in SPLITS if s in cfg.fractions or s in cfg.forced_splits.values()]
    extra = {"settings": asdict(cfg), **stats}
    paths = write_prepared(table, Path(cfg.out_dir), splits, extra)
    log.info("prepare: %d rows -> %s", len(table), cfg.out_dir)
    return paths


def read_summary(prepared_dir: str | Path) -> dict[str, Any]:
    """The summary of a prepared folder: ``summary.json``, else computed from the parquet files."""
    prepared_dir = Path(prepared_dir)
    path = prepared_dir / "summary.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    files = sorted(prepared_dir.glob("*.parquet"))
    if not files:
        from uamt.core.errors import DataError

        raise DataError(f"{prepared_dir}: no summary.json and no *.parquet (run `uamt data prepare`)")
    df = pd.concat([pd.read_parquet(f, columns=["dataset", "lp", "split"]) for f in files])
    return summarise(df)


def data_version(prepared_dir: str | Path) -> str:
    """Content hash of the prepared splits (the ``data_version`` tag of a registered model, trained,
    calibrated and tested on them; also names the report's data and the pipeline flow's run)."""
    digest = hashlib.sha256()
    for path in sorted(Path(prepared_dir).glob("*.parquet")):
        digest.update(path.name.encode())
        digest.update(bytes.fromhex(sha256_file(path)))
    return digest.hexdigest()[:12]


def format_summary(summary: Mapping[str, Any]) -> str:
    """A readable table: one line per dataset x LP, one column per split, plus totals."""
    counts = summary["counts"]
    splits = [s for s in SPLITS if s in summary.get("split_totals", {})] or list(SPLITS)
    header = ["dataset", "lp", *splits, "total"]
    lines = []
    for dataset in sorted(counts):
        for lp in sorted(counts[dataset]):
            row = [counts[dataset][lp].get(s, 0) for s in splits]
            lines.append([dataset, lp, *map(str, row), str(sum(row))])
    totals = [summary.get("split_totals", {}).get(s, 0) for s in splits]
    lines.append(["TOTAL", "", *map(str, totals), str(sum(totals))])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=True)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < 2 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "  ".join("-" * w for w in widths)
    out = [fmt(header), rule, *map(fmt, lines[:-1]), rule, fmt(lines[-1])]
    for dataset, lps in sorted(summary.get("left_out", {}).items()):
        for lp, reason in sorted(lps.items()):
            out.append(f"left out: {dataset} {lp}: {reason}")
    if summary.get("chrf_guard"):
        out.append(format_signal(summary["chrf_guard"]))
    return "\n".join(out)
