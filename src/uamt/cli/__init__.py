"""The ``uamt`` command line.

Each command family lives in its own module of this package and exposes
``register(subparsers)``; handlers import heavy libraries lazily so ``uamt --help`` stays fast.
A handler returns an exit code (or None for 0).  :class:`uamt.errors.UamtError` and
:class:`uamt.config.ConfigError` are printed as one line on stderr with exit code 2; so is an
option argparse refuses (``uamt score: error: argument --seed: must be >= 0, got -1``), before
any handler runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from uamt import __version__

#: Modules of ``uamt.cli`` that add sub-commands, in the order they appear in ``--help``.
COMMAND_MODULES = ("data", "metrics", "lexical", "models", "pipeline", "scoring", "hypotheses")


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line on stderr, exit code 2 (no usage block)."""

    def error(self, message: str):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
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
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a refused option (already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
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
