"""Prefect flow ``uamt-retrain``: new human annotations in -> validated, pooled, retrained, registered.

One tick (see docs/orchestration.md):

1. list ``incoming.dir`` for ``.csv/.tsv/.jsonl/.parquet`` files; none -> return at once
   (``status: no new annotations``), without taking the lock or touching anything;
2. take the ``fcntl`` lock ``incoming.lock_path`` (a second retrain waits ``lock_timeout_s`` and
   then returns ``status: busy``);
3. task ``ingest`` = :func:`uamt.incoming.ingest_incoming`: validate, append good files to the
   pool atomically, move files to ``processed/`` or ``rejected/`` (+ ``.report.txt``);
4. nothing added -> return ``status: nothing ingested``; else retrain from ``prepare`` to
   ``register``: ``incoming.retrain_with: flow`` runs the stage tasks of :mod:`flows.pipeline` as a
   sub-flow (cached, so unchanged stages are skipped); ``dvc`` runs ``dvc repro register`` in a
   subprocess so ``dvc.lock`` stays in step with the outputs (requires the pool file as a dep of
   the ``prepare`` stage in dvc.yaml).

``prepare`` puts pool rows into ``d_q`` (or ``d_e`` when they share a document/sentence with a
``d_e`` component) and drops, with a count in ``data/prepared/summary.json``, those that share one
with dev/test/ood, so the test set stays fixed (:func:`uamt.data.prepare.place_pool_rows`).

Run as a deployment: ``python -m flows.retrain [--params params.yaml]`` serves it as
``uamt-retrain`` every ``incoming.interval_minutes``.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow, task

from flows.pipeline import run_pipeline
from uamt import incoming
from uamt.config import DEFAULT_PARAMS, ConfigError, load_section
from uamt.data.prepare import PrepareConfig
from uamt.pipeline import load_pipeline

ingest = task(name="ingest", persist_result=False)(incoming.ingest_incoming)


def _dvc_repro(params: str, pool_path: str) -> None:
    """Version the pool (``dvc add``), then ``dvc repro register`` (prepare sees the changed pool)."""
    if Path(params) != Path("params.yaml"):
        raise ConfigError(
            f"{params}: incoming.retrain_with=dvc runs `dvc repro`, which reads params.yaml only"
        )
    subprocess.run(["dvc", "add", pool_path], check=True)
    subprocess.run(["dvc", "repro", "register"], check=True)


dvc_repro = task(name="dvc_repro", persist_result=False)(_dvc_repro)


def check_pool_wiring(params: str) -> incoming.IncomingConfig:
    """The ``incoming`` config, after checking ``prepare`` reads the pool ``incoming`` writes."""
    cfg = incoming.load_config(params)
    prep = load_section(PrepareConfig, "prepare", params)
    if prep.annotations_pool is None or Path(prep.annotations_pool) != Path(cfg.pool_path):
        raise ConfigError(
            f"{params}: prepare.annotations_pool ({prep.annotations_pool!r}) must equal incoming.pool_path "
            f"({cfg.pool_path!r}), or new annotations would never reach training"
        )
    return cfg


@flow(name="uamt-retrain", log_prints=True)
def retrain_on_new_annotations(params: str = str(DEFAULT_PARAMS)) -> dict[str, Any]:
    """One tick of the scheduled retrain; returns ``status`` and what was done."""
    cfg = check_pool_wiring(params)
    waiting = incoming.new_files(cfg.dir)
    if not waiting:
        print(f"no new annotations in {cfg.dir}")
        return {"status": "no new annotations"}
    try:
        with incoming.retrain_lock(cfg.lock_path, cfg.lock_timeout_s):
            result = ingest(cfg)
            summary: dict[str, Any] = {"ingest": asdict(result)}
            if not result.changed:
                print(f"nothing ingested: rejected {result.rejected}, reports {result.reports}")
                return {"status": "nothing ingested", **summary}
            print(f"ingested {result.rows_added} row(s) from {result.ingested}; retraining")
            if cfg.retrain_with == "dvc":
                dvc_repro(params, cfg.pool_path)
            else:
                run_pipeline(params, start="prepare", stop="register")
            metrics_dir = Path(load_pipeline(params).metrics_dir)
            summary["registry"] = json.loads((metrics_dir / "registry.json").read_text(encoding="utf-8"))
            return {"status": "retrained", **summary}
    except incoming.RetrainBusy as exc:
        print(str(exc))
        return {"status": "busy"}


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - starts a long-running server
    import argparse

    parser = argparse.ArgumentParser(prog="python -m flows.retrain", description="serve uamt-retrain")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--once", action="store_true", help="run one tick now instead of serving")
    args = parser.parse_args(argv)
    if args.once:
        print(retrain_on_new_annotations(args.params))
        return
    cfg = check_pool_wiring(args.params)
    retrain_on_new_annotations.serve(
        name="uamt-retrain",
        interval=cfg.interval_minutes * 60,
        parameters={"params": args.params},
        tags=["uamt", "retrain"],
    )


if __name__ == "__main__":  # pragma: no cover
    main()
