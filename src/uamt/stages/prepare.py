"""Stage ``prepare``: load every source into the canonical table and write document-disjoint splits."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.data.prepare import PrepareConfig, prepare


def run(cfg: PrepareConfig) -> dict[str, Path]:
    """Write ``<out_dir>/<split>.parquet`` and ``summary.json``; returns split name (and "summary") -> path."""
    return prepare(cfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uamt.stages.prepare", description=__doc__)
    parser.add_argument(
        "--params", type=Path, default=DEFAULT_PARAMS, help="params file (default: params.yaml)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run(load_section(PrepareConfig, "prepare", args.params))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
