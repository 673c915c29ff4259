"""Stage ``encode``: fill the embedding cache with every text of the prepared splits.

Reads ``data/prepared/*.parquet`` (whatever splits exist) and writes the embeddings, ``manifest.json``
and ``encode_run.json`` under ``encode.cache_dir`` (:mod:`uamt.encoders.precompute`).

Run it with ``python -m uamt.stages.encode [--params params.yaml] [TABLE.parquet ...]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, ConfigError, load_section
from uamt.core.errors import UamtError
from uamt.encoders.precompute import EncodeConfig, precompute_embeddings

NAME = "encode"


def run(cfg: EncodeConfig, splits: Sequence[str | Path] | None = None) -> Path:
    """Encode every text of ``splits`` (default: ``prepared_dir/*.parquet``) not yet cached; returns
    the encoder's cache folder ``<cache_dir>/<encoder_id>``."""
    return precompute_embeddings(cfg, splits)


def load_config(path: str | Path = DEFAULT_PARAMS) -> EncodeConfig:
    return load_section(EncodeConfig, NAME, path)


def main(argv: list[str] | None = None) -> int:
    """``python -m uamt.stages.encode [--params params.yaml] [TABLE.parquet ...]``."""
    # Not stage_main: this stage also takes tables on the command line and prints the cache folder.
    parser = argparse.ArgumentParser(prog="uamt-encode", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (section encode:)")
    parser.add_argument(
        "tables", nargs="*", help="canonical parquet tables (default: prepared_dir/*.parquet)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        path = run(load_config(args.params), args.tables or None)
    except (UamtError, ConfigError, ValueError) as exc:
        print(f"encode: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
