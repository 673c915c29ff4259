"""``uamt registry show``: what the model registry holds."""

from __future__ import annotations

import argparse


def _registry_show(args: argparse.Namespace) -> int:
    from uamt import registry

    uri = registry.tracking_uri(args.tracking_uri)
    rows = registry.describe(uri, args.name)
    columns = ["version", "aliases", "status", "method", "data_version", "ece", "nll", "pps", "reason"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) if rows else len(c) for c in columns}
    widths["reason"] = len("reason")
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns))
    return 0


def register(subparsers) -> None:
    reg = subparsers.add_parser("registry", help="inspect the MLflow model registry")
    reg_sub = reg.add_subparsers(dest="registry_command", metavar="SUBCOMMAND", required=True)
    show = reg_sub.add_parser("show", help="versions, aliases, validation status and key test metrics")
    show.add_argument(
        "--name", default="uamt-comet", help="registered model name (params: register.model_name)"
    )
    show.add_argument(
        "--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow/mlflow.db"
    )
    show.set_defaults(handler=_registry_show)
