"""Stage ``fetch``: copy (offline mirror) or download the pinned public files into ``raw_dir``."""

from __future__ import annotations

from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, load_section
from uamt.data.fetch import FetchConfig, fetch_all
from uamt.stages._cli import stage_main

NAME = "fetch"


def run(cfg: FetchConfig) -> Path:
    """Fetch every file of ``cfg.sources`` into ``cfg.raw_dir`` (sha256-checked); returns ``raw_dir``."""
    fetch_all(cfg)
    return Path(cfg.raw_dir)


def load_config(path: str | Path = DEFAULT_PARAMS) -> FetchConfig:
    return load_section(FetchConfig, NAME, path)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
