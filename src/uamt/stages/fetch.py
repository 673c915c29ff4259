"""Stage ``fetch``: copy (offline mirror) or download the pinned public files into ``raw_dir``."""

from __future__ import annotations

from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS
from uamt.data.fetch import FetchConfig, fetch_all, load_fetch_config
from uamt.stages._cli import stage_main

NAME = "fetch"


def run(cfg: FetchConfig) -> Path:
    """Fetch every pinned file (``cfg.sources``) into ``cfg.raw_dir`` (sha256-checked); returns ``raw_dir``."""
    fetch_all(cfg)
    return Path(cfg.raw_dir)


def load_config(path: str | Path = DEFAULT_PARAMS) -> FetchConfig:
    """The ``fetch:`` section of ``path`` with the pins of its ``sources_file`` (data_sources.yaml)."""
    return load_fetch_config(path)


def main(argv: list[str] | None = None) -> int:
    return stage_main(NAME, __doc__, load_config, run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
