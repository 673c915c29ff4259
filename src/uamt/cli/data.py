"""``uamt data fetch | prepare | summary``: the data layer from the command line."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from uamt.cli import params_subcommand


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def _fetch(args: argparse.Namespace) -> int:
    from uamt.data.fetch import fetch_all, load_fetch_config

    _setup_logging()
    cfg = load_fetch_config(args.params)
    fetch_all(cfg)
    print(f"fetched into {Path(cfg.raw_dir)}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from uamt.core.config import load_section
    from uamt.data.prepare import PrepareConfig, format_summary, prepare, read_summary

    _setup_logging()
    paths = prepare(load_section(PrepareConfig, "prepare", args.params))
    print(format_summary(read_summary(paths["summary"].parent)))
    return 0


def _summary(args: argparse.Namespace) -> int:
    from uamt.data.prepare import format_summary, read_summary

    prepared = args.prepared
    if prepared is None:
        from uamt.core.config import load_section
        from uamt.data.prepare import PrepareConfig

        prepared = Path(load_section(PrepareConfig, "prepare", args.params).out_dir)
    print(format_summary(read_summary(prepared)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="fetch the public data, prepare the splits, summarise them")
    sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)

    def add(name: str, help_text: str, handler) -> argparse.ArgumentParser:
        return params_subcommand(sub, name, help_text, handler)

    add(
        "fetch",
        "copy (offline mirror) or download the pinned files into fetch.raw_dir, sha256-checked",
        _fetch,
    )
    add("prepare", "load every source and write document-disjoint splits to prepare.out_dir", _prepare)
    summary = add("summary", "print row counts per dataset x LP x split", _summary)
    summary.add_argument(
        "--prepared", type=Path, default=None, help="prepared folder (default: prepare.out_dir)"
    )
