"""Stage ``fetch``: copy (offline mirror) or download the pinned public files into ``raw_dir``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from uamt.config import DEFAULT_PARAMS, load_section
from uamt.data.fetch import FetchConfig, fetch_all


def run(cfg: FetchConfig) -> Path:
    """Fetch every file of ``cfg.sources`` into ``cfg.raw_dir`` (sha256-checked); returns ``raw_dir``."""
    fetch_all(cfg)
    return Path(cfg.raw_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uamt.stages.fetch", description=__doc__)
    parser.add_argument(
        "--params", type=Path, default=DEFAULT_PARAMS, help="params file (default: params.yaml)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run(load_section(FetchConfig, "fetch", args.params))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
