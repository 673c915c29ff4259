"""The ``uamt`` command line.

Each command family lives in its own module of this package and exposes
``register(subparsers)``; handlers import heavy libraries lazily so ``uamt --help`` stays fast.
A handler returns an exit code (or None for 0).  :class:`uamt.errors.UamtError` and
:class:`uamt.config.ConfigError` are printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from uamt import __version__

#: Modules of ``uamt.cli`` that add sub-commands, in the order they appear in ``--help``.
COMMAND_MODULES = ("data", "metrics", "lexical", "models", "pipeline", "scoring", "hypotheses")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="uamt",
        description="Uncertainty-aware MT evaluation: quality scores with calibrated intervals and risk.",
    )
    parser.add_argument("--version", action="version", version=f"uamt {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"uamt.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"uamt.cli.{name}":
                continue  # command family not installed in this build
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from uamt.config import ConfigError
    from uamt.errors import UamtError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        code = args.handler(args)
    except (UamtError, ConfigError) as exc:
        print(f"uamt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
