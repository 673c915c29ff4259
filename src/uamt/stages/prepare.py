"""Stage ``prepare``: load every source into the canonical table and write document-disjoint splits."""

from __future__ import annotations

from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.data.prepare import PrepareConfig, prepare
from uamt.stages._cli import stage_main

NAME = "prepare"


def run(cfg: PrepareConfig) -> dict[str, Path]:
    """Write ``<out_dir>/<split>.parquet`` and ``summary.json``; returns split name (and "summary") -> path."""
    return prepare(cfg)


def load_config(path: str | Path = DEFAULT_PARAMS) -> PrepareConfig:
    return load_section(PrepareConfig, NAME, path)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
