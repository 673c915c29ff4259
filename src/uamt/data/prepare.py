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
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from uamt.config import ConfigError
from uamt.data import loaders
from uamt.data.schema import COLUMNS, DATASETS, SPLITS, to_arrow
from uamt.data.splits import DEFAULT_FORCED, DEFAULT_FRACTIONS, assign_splits, check_disjoint, check_fractions

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
        chosen by a stable hash); null = all data.
    drop_systems: dataset -> {system glob: reason} of systems to skip.
    human_reference: WMT21 DA LP -> reference letter that the ``HUMAN`` system is.
    drop_empty_mt: drop rated rows whose published system output line is empty (else error).
    """

    raw_dir: str = "data/raw"
    out_dir: str = "data/prepared"
    datasets: tuple[str, ...] = DATASETS
    fractions: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_FRACTIONS))
    forced_splits: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_FORCED))
    seed: int = 13
    pseudo_doc_size: int = 10
    max_rows_per_lp: int | None = None
    drop_systems: dict[str, dict[str, str]] = field(
        default_factory=lambda: {k: dict(v) for k, v in loaders.DEFAULT_DROP_SYSTEMS.items()}
    )
    human_reference: dict[str, str] = field(default_factory=lambda: dict(loaders.DEFAULT_HUMAN_REFERENCE))
    drop_empty_mt: bool = True

    def __post_init__(self) -> None:
        for name in (*self.datasets, *self.forced_splits, *self.drop_systems):
            if name not in DATASETS:
                raise ConfigError(f"prepare: dataset={name!r} not supported; choose from {sorted(DATASETS)}")
        try:
            check_fractions(self.fractions, self.forced_splits)
        except ValueError as exc:
            raise ConfigError(f"prepare: {exc}") from exc
        if self.pseudo_doc_size < 1:
            raise ConfigError("prepare.pseudo_doc_size must be >= 1")
        if self.max_rows_per_lp is not None and self.max_rows_per_lp < 1:
            raise ConfigError("prepare.max_rows_per_lp must be >= 1 or null")


def load_dataset(name: str, cfg: PrepareConfig) -> pd.DataFrame:
    """Run the loader of dataset ``name`` on ``cfg.raw_dir`` with the settings of ``cfg``."""
    root = Path(cfg.raw_dir)
    drops = cfg.drop_systems.get(name, {})
    if name == "wmt21_da":
        return loaders.load_wmt21_da(
            root,
            pseudo_doc_size=cfg.pseudo_doc_size,
            drop_systems=drops,
            human_reference=cfg.human_reference,
            drop_empty_mt=cfg.drop_empty_mt,
        )
    if name == "wmt21_mqm":
        return loaders.load_wmt21_mqm(
            root, pseudo_doc_size=cfg.pseudo_doc_size, drop_systems=drops, drop_empty_mt=cfg.drop_empty_mt
        )
    if name == "ted_mqm":
        return loaders.load_ted_mqm(root, drop_systems=drops)
    if name == "mlqe":
        return loaders.load_mlqe(root)
    if name == "qt21_hter":
        return loaders.load_qt21_hter(root, pseudo_doc_size=cfg.pseudo_doc_size)
    if name == "multihyp_eten":
        return loaders.load_multihyp_eten(root, pseudo_doc_size=cfg.pseudo_doc_size)
    raise ValueError(f"dataset={name!r} not supported; choose from {sorted(DATASETS)}")


def limit_rows(df: pd.DataFrame, max_rows_per_lp: int | None, seed: int) -> pd.DataFrame:
    """Keep whole documents, in stable-hash order, until each dataset x LP has >= ``max_rows_per_lp`` rows."""
    if max_rows_per_lp is None or df.empty:
        return df
    keep = []
    for (_, _), part in df.groupby(["dataset", "lp"], sort=True):
        sizes = part.groupby("doc").size()
        order = sorted(sizes.index, key=lambda d: hashlib.sha256(f"{seed}:{d}".encode()).hexdigest())
        total, chosen = 0, []
        for doc in order:
            if total >= max_rows_per_lp:
                break
            chosen.append(doc)
            total += int(sizes[doc])
        keep.append(part[part["doc"].isin(chosen)])
    return pd.concat(keep)


def build_table(cfg: PrepareConfig) -> pd.DataFrame:
    """Load ``cfg.datasets``, apply ``max_rows_per_lp``, assign and check the splits."""
    frames = [load_dataset(name, cfg) for name in cfg.datasets]
    table = pd.concat(frames, ignore_index=True)
    table = limit_rows(table, cfg.max_rows_per_lp, cfg.seed)
    table = assign_splits(table, cfg.fractions, cfg.forced_splits, cfg.seed)
    check_disjoint(table)
    return sort_table(table)


def sort_table(df: pd.DataFrame) -> pd.DataFrame:
    """Canonical row order, so the same rows always give byte-identical files."""
    keys = ["split", "dataset", "lp", "system", "seg_id", "doc", "src", "mt"]
    return df.sort_values(keys, kind="mergesort").reset_index(drop=True)[list(COLUMNS)]


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
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; the final folder gets normal permissions
    try:
        for split in splits:
            pq.write_table(to_arrow(df[df["split"] == split]), tmp / f"{split}.parquet")
        summary = {**summarise(df), **extra}
        (tmp / "summary.json").write_text(
            json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rmdir(old)
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    paths = {split: out_dir / f"{split}.parquet" for split in splits}
    paths["summary"] = out_dir / "summary.json"
    return paths


def prepare(cfg: PrepareConfig) -> dict[str, Path]:
    """Build the split table from ``cfg.raw_dir`` and write it to ``cfg.out_dir``; returns the paths."""
    table = build_table(cfg)
    splits = [s for s in SPLITS if s in cfg.fractions or s in cfg.forced_splits.values()]
    extra = {"settings": asdict(cfg)}
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
        from uamt.errors import DataError

        raise DataError(f"{prepared_dir}: no summary.json and no *.parquet (run `uamt data prepare`)")
    df = pd.concat([pd.read_parquet(f, columns=["dataset", "lp", "split"]) for f in files])
    return summarise(df)


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
    return "\n".join([fmt(header), rule, *map(fmt, lines[:-1]), rule, fmt(lines[-1])])
