"""The ``uamt`` command line.

Each command family lives in its own module of this package and exposes
``register(subparsers)``; handlers import heavy libraries lazily so ``uamt --help`` stays fast.
A handler returns an exit code (or None for 0).  :class:`uamt.core.errors.UamtError` and
:class:`uamt.core.config.ConfigError` are printed as one line on stderr with exit code 2; so is an
option argparse refuses (``uamt score: error: argument --seed: must be >= 0, got -1``), before
any handler runs.

Run inside a uamt checkout whose own code is not the code running (a virtual environment copied
or moved from another checkout: its scripts and editable install still point there), every
command first warns on stderr and says how to recreate the environment (:func:`foreign_code_warning`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from uamt import __version__

#: Modules of ``uamt.cli`` that add sub-commands, in the order they appear in ``--help``.
COMMAND_MODULES = (
    "data",
    "incoming",
    "metrics",
    "lexical",
    "models",
    "registry",
    "scoring",
    "hypotheses",
    "decisions",
)


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line on stderr, exit code 2 (no usage block)."""

    def error(self, message: str):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def params_subcommand(
    sub: argparse._SubParsersAction, name: str, help_text: str, handler
) -> argparse.ArgumentParser:
    """Add sub-command ``name`` (help = description = ``help_text``) with the ``--params`` option every
    pipeline-facing command takes, dispatching to ``handler``."""
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.add_argument(
        "--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)"
    )
    parser.set_defaults(handler=handler)
    return parser


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


def foreign_code_warning(folder: Path | None = None) -> str | None:
    """A warning when ``folder`` (default: the working folder) is a uamt checkout but the ``uamt``
    package running is another checkout's (a ``.venv`` copied with ``cp -a`` runs the original's
    Python and code), else None."""
    import uamt

    root = Path.cwd() if folder is None else Path(folder)
    own = root / "src" / "uamt" / "__init__.py"
    running = Path(uamt.__file__).resolve()
    if not own.is_file() or running == own.resolve():
        return None
    return (
        f"this is the checkout {root.resolve()}, but the uamt code running is {running.parent} "
        f"(Python {sys.executable}): a virtual environment copied or moved from another checkout still "
        "runs that checkout's code and Python; recreate it here: rm -rf .venv && make setup"
    )


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import ConfigError
    from uamt.core.errors import UamtError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a refused option (already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    warning = foreign_code_warning()
    if warning:
        print(f"uamt: warning: {warning}", file=sys.stderr)
    try:
        code = args.handler(args)
    except (UamtError, ConfigError) as exc:
        print(f"uamt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
