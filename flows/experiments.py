"""Prefect flow ``uamt-experiments``: the ``exp_*`` stages and ``report`` of dvc.yaml, as Prefect tasks.

The stages are read from dvc.yaml by :mod:`flows.dvc_stages`, as for ``uamt-pipeline``: every task is
``task(name=<stage name>)(uamt.stages.<name>.run)`` with the same retries and caching, in dvc.yaml
order: ``exp_<name>`` for each of :data:`uamt.experiments.SECTIONS`, then ``report``.  This module
holds wiring only.

* Caching: Prefect's ``INPUTS + TASK_SOURCE`` + the DVC md5 of each of the stage's dvc.yaml deps
  (:class:`flows.dvc_stages.DvcDeps`), so the flow and ``dvc repro`` agree on what a stage depends
  on.  A stage with a dvc.yaml out (``outs`` / ``metrics`` / ``plots``) missing runs with
  ``refresh_cache``.
* Report: the assembled ``reports/experiments.md`` becomes the markdown artifact ``uamt-experiments``.

Run: ``python -m flows.experiments [--params params.yaml] [--only exp_ood report] [--refresh-cache]``
(after ``uamt-pipeline`` / ``dvc repro register`` has produced the models and metrics).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

import uamt.experiments
from flows.dvc_stages import Stage, read_stages, stage_task
from uamt.core.config import DEFAULT_PARAMS

REPORT = "report"

STAGES: tuple[Stage, ...] = read_stages([f"exp_{name}" for name in uamt.experiments.SECTIONS] + [REPORT])
STAGE_BY_NAME = {stage.name: stage for stage in STAGES}
STAGE_NAMES = tuple(STAGE_BY_NAME)


@flow(name="uamt-experiments", flow_run_name="uamt-experiments", log_prints=True)
def uamt_experiments(
    params: str = str(DEFAULT_PARAMS), only: list[str] | None = None, refresh_cache: bool = False
) -> dict[str, Any]:
    """Run the experiment stages (all, or those in ``only``) in dvc.yaml order with ``params``.

    Returns ``{stage name: what its run returned}``.
    """
    chosen = list(STAGE_NAMES) if only is None else list(only)
    unknown = [name for name in chosen if name not in STAGE_BY_NAME]
    if unknown:
        raise ValueError(f"stage={unknown[0]!r} not supported; choose from {list(STAGE_NAMES)}")
    outputs: dict[str, Any] = {}
    for stage in STAGES:
        if stage.name not in chosen:
            continue
        stage.check_params(params)
        cfg = stage.load_config(params)
        run_task = stage_task(stage, refresh_cache or stage.outputs_missing())
        outputs[stage.name] = run_task(cfg)
        if stage.name == REPORT:
            report_path = Path(cfg.report.out)
            create_markdown_artifact(
                key="uamt-experiments",
                markdown=report_path.read_text(encoding="utf-8"),
                description=f"the papers' analyses on real data ({report_path})",
            )
    return outputs


if __name__ == "__main__":  # pragma: no cover
    import argparse

    parser = argparse.ArgumentParser(prog="python -m flows.experiments", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--only", nargs="+", choices=STAGE_NAMES, default=None)
    parser.add_argument("--refresh-cache", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    print(uamt_experiments(args.params, only=args.only, refresh_cache=args.refresh_cache))
