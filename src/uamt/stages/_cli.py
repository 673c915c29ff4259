"""The one ``main(argv)`` every stage module shares: parse ``--params``, configure logging, run."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from uamt.core.config import DEFAULT_PARAMS, ConfigError
from uamt.core.errors import UamtError
from uamt.core.parallel import LOG_FORMAT


def stage_main(
    name: str, doc: str | None, load_config: Callable, run: Callable, argv: list[str] | None
) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m uamt.stages.{name}", description=doc)
    parser.add_argument(
        "--params", type=Path, default=DEFAULT_PARAMS, help="params file (default: params.yaml)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    started = time.perf_counter()
    try:
        run(load_config(args.params))
    except (UamtError, ConfigError) as exc:
        print(f"stage {name}: error: {exc}", file=sys.stderr)
        return 2
    print(f"stage {name}: done in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0
