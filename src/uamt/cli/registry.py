"""``uamt registry show``: what the model registry holds; ``uamt registry init``: create one on purpose;
``uamt registry check``: every model the pipeline registers has ``@champion`` (how ``make run`` ends);
``uamt registry compact``: identical large files of the stored versions kept once (hard links).

``show`` and ``check`` only read: a tracking URI naming a SQLite database that does not exist, is empty,
corrupt, locked, of an older MLflow schema, or was copied from another checkout is an error
(exit 2), never a new, initialised or migrated database.  It names the model and the store, and
prints metrics to 4 significant digits.  ``init`` is the one command (besides the register stage
with ``register.allow_new_registry: true``) that creates a registry; see :mod:`uamt.registry.store`.
"""

from __future__ import annotations

import argparse
import math

#: Columns of ``uamt registry show`` holding numbers (test-set metrics), printed to 4 significant digits.
METRIC_COLUMNS = ("ece", "crps", "pps")


def significant(value: object, digits: int = 4) -> str:
    """``value`` (a number, or a tag's text) to ``digits`` significant digits; text that is not a
    finite number as it is."""
    try:
        number = float(str(value))
    except ValueError:
        return str(value)
    return f"{number:.{digits}g}" if math.isfinite(number) else str(value)


def _registry_show(args: argparse.Namespace) -> int:
    from uamt.registry import store as registry

    uri = registry.tracking_uri(args.tracking_uri)
    rows = registry.describe(uri, args.name)
    for row in rows:
        row.update({c: significant(row[c]) for c in METRIC_COLUMNS if row[c] != ""})
    champion = next((r["version"] for r in rows if "champion" in r["aliases"].split(",")), None)
    store = registry.sqlite_path(uri) or uri
    print(
        f"model {args.name} in {store}: {len(rows)} version{'s' if len(rows) != 1 else ''}"
        + (f", @champion {champion}" if champion else ", no @champion")
    )
    columns = ["version", "aliases", "status", "method", "data_version", "ece", "crps", "pps", "reason"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) if rows else len(c) for c in columns}
    widths["reason"] = len("reason")
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns))
    return 0


def _registry_init(args: argparse.Namespace) -> int:
    from uamt.registry import store as registry

    uri = registry.tracking_uri(args.tracking_uri)
    print(registry.init_store(uri, replace_missing=args.replace_missing))
    return 0


def pipeline_models(params_path: str) -> tuple[list[str], str | None]:
    """The registered models the register stage of ``params_path`` writes (``register.model_name``,
    and ``<name>-qe`` when ``pipeline.register_qe_method`` is set) and its ``register.tracking_uri``."""
    from uamt.core.config import read_params
    from uamt.core.naming import qe_registered_name
    from uamt.pipeline_config import load_pipeline
    from uamt.serving.scores import model_name_from_params

    name = model_name_from_params(params_path)
    names = [name]
    if load_pipeline(params_path).register_qe_method is not None:
        names.append(qe_registered_name(name))
    return names, (read_params(params_path).get("register") or {}).get("tracking_uri")


def _registry_check(args: argparse.Namespace) -> int:
    from uamt.registry import store as registry

    names, params_uri = pipeline_models(args.params) if not args.name else (args.name, None)
    # The register stage's precedence (register.tracking_uri first), so that the registry checked is
    # the one the stage registered into.
    uri = registry.tracking_uri(args.tracking_uri or params_uri)
    for line in registry.check_champions(uri, names):
        print(line)
    return 0


def _registry_compact(args: argparse.Namespace) -> int:
    from uamt.registry import store as registry

    uri = registry.tracking_uri(args.tracking_uri)
    registry.check_store_exists(uri)
    saved, folders = registry.share_stored_files(uri)
    print(
        f"{registry.sqlite_path(uri) or uri}: {folders} model folder{'s' if folders != 1 else ''}; "
        f"{saved / 1e6:.0f} MB of identical files now stored once (hard links)"
    )
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
    init = reg_sub.add_parser(
        "init",
        help="create a new, empty registry on purpose (a fresh project); an existing one is left as is",
        description=(
            "Create the SQLite registry (and its marker, <db>.uamt-registry.json) so that the register "
            "stage may promote a first version without a champion. An existing registry is left alone. "
            "A registry whose marker says it existed but whose database is gone is only replaced with "
            "--replace-missing: its version numbers restart at 1."
        ),
    )
    init.add_argument(
        "--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow/mlflow.db"
    )
    init.add_argument(
        "--replace-missing",
        action="store_true",
        help="the old registry is gone for good: start a new one (versions restart at 1)",
    )
    init.set_defaults(handler=_registry_init)
    check = reg_sub.add_parser(
        "check",
        help="exit 2 unless every model the pipeline registers has @champion (how make run ends)",
        description=(
            "Print the @champion version of each model the register stage registers (register.model_name "
            "and, with pipeline.register_qe_method, <name>-qe); exit 2 naming each model without one, the "
            "verdict of its latest version and the way out. Reads only; creates nothing."
        ),
    )
    check.add_argument(
        "--name", action="append", default=None, help="registered model name (repeat for several); default: from --params"
    )
    check.add_argument("--params", default="params.yaml", help="params file of the pipeline (default params.yaml)")
    check.add_argument(
        "--tracking-uri",
        default=None,
        help="default: params register.tracking_uri, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow/mlflow.db",
    )
    check.set_defaults(handler=_registry_check)
    compact = reg_sub.add_parser(
        "compact",
        help="store identical large files of the registered versions once (hard links)",
        description=(
            "Registering already does this for each new version; compact applies it to versions registered "
            "before (or copied in): every file of >= 1 MiB identical to one already stored becomes a hard "
            "link to it. Each version stays complete; the database is not touched."
        ),
    )
    compact.add_argument(
        "--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow/mlflow.db"
    )
    compact.set_defaults(handler=_registry_compact)
