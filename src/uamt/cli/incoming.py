"""``uamt incoming validate FILE... | ingest | withdraw NAME|SHA256 | init-pool``: new annotations
from the command line (:mod:`uamt.ingest`).

``validate`` only reads (exit 1 when a file has a problem); ``ingest`` and ``withdraw`` take the retrain
lock, change the pool all-or-nothing and leave a retrain owed; ``init-pool`` creates an empty pool
(``make run`` does, since dvc.yaml lists the pool as a dependency).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from uamt.cli import params_subcommand


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def _validate(args: argparse.Namespace) -> int:
    from uamt.ingest import load_config, validate_file

    _setup_logging()
    cfg = load_config(args.params)
    bad = 0
    for name in args.files:
        check = validate_file(name, cfg)
        print(check.report(), end="")
        bad += not check.ok
    return 1 if bad else 0


def _ingest(args: argparse.Namespace) -> int:
    from uamt.ingest import ingest_incoming, load_config, retrain_lock

    _setup_logging()
    cfg = load_config(args.params)
    with retrain_lock(cfg.lock_path, cfg.lock_timeout_s):
        result = ingest_incoming(cfg)
    print(json.dumps(dataclasses.asdict(result), indent=2))
    return 0


def _withdraw(args: argparse.Namespace) -> int:
    from uamt.ingest import load_config, retrain_lock, withdraw

    _setup_logging()
    cfg = load_config(args.params)
    with retrain_lock(cfg.lock_path, cfg.lock_timeout_s):
        print(json.dumps(withdraw(cfg, args.file), indent=2))
    return 0


def _init_pool(args: argparse.Namespace) -> int:
    from uamt.ingest import init_pool, load_config

    _setup_logging()
    cfg = load_config(args.params)
    print(f"{cfg.pool_path}: {'created (empty)' if init_pool(cfg) else 'exists'}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    incoming = subparsers.add_parser(
        "incoming", help="validate, ingest or withdraw new annotations (data/incoming/); create the pool"
    )
    sub = incoming.add_subparsers(dest="incoming_command", metavar="SUBCOMMAND", required=True)

    def add(name: str, help_text: str, handler) -> argparse.ArgumentParser:
        return params_subcommand(sub, name, help_text, handler)

    validate = add("validate", "check files in the incoming format; nothing is moved or written", _validate)
    validate.add_argument("files", nargs="+", help="files to check")
    add("ingest", "take every new file of incoming.dir into the pool (one tick without retraining)", _ingest)
    withdraw = add("withdraw", "take one ingested file's rows out of the pool (a retrain is owed)", _withdraw)
    withdraw.add_argument("file", help="the file's name as ingested, or a prefix of its sha256")
    add("init-pool", "create an empty pool file if there is none", _init_pool)
