"""Prefect flow ``uamt-experiments``: the ``exp_*`` stages and ``report`` of dvc.yaml, as Prefect tasks.

Every task is ``task(name=<stage name>)(uamt.stages.<name>.run)`` built by
:func:`flows.pipeline.stage_task` (same retries / caching machinery as ``uamt-pipeline``), in dvc.yaml
order: ``exp_<name>`` for each of :data:`uamt.experiments.SECTIONS`, then ``report``.  This module holds
wiring only.

* Cache keys (:func:`flows.pipeline.stage_cache_key` over :data:`STAGE_BY_NAME`): stage name, project,
  config, the source of the code the stage runs and the content of its inputs.  Code and inputs are
  read from the stage's ``deps`` in dvc.yaml (``src/uamt/...`` entries are code, the others inputs),
  and its outputs from ``outs`` / ``metrics`` / ``plots``, so the flow and ``dvc repro`` agree on
  what a stage depends on.  A stage whose outputs are missing runs with ``refresh_cache``.
* Report: the assembled ``reports/experiments.md`` becomes the markdown artifact ``uamt-experiments``.

Run: ``python -m flows.experiments [--params params.yaml] [--only exp_ood report] [--refresh-cache]``
(after ``uamt-pipeline`` / ``dvc repro register`` has produced the models and metrics).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import yaml
from prefect import flow
from prefect.artifacts import create_markdown_artifact

import uamt.experiments
from flows.pipeline import Stage, outputs_missing, stage_cache_key, stage_task
from uamt.config import DEFAULT_PARAMS

REPO_ROOT = Path(__file__).resolve().parents[1]
DVC_FILE = REPO_ROOT / "dvc.yaml"
CODE_PREFIX = "src/uamt/"
REPORT = "report"


def _entry_path(entry: str | dict) -> str:
    """A dvc.yaml deps/outs entry: a path, or ``{path: {options}}``."""
    return entry if isinstance(entry, str) else next(iter(entry))


def stage_from_dvc(name: str, spec: dict[str, Any]) -> Stage:
    """The :class:`flows.pipeline.Stage` of dvc.yaml stage ``name`` (its module ``uamt.stages.<name>``)."""
    module = importlib.import_module(f"uamt.stages.{name}")
    deps = [_entry_path(d) for d in spec.get("deps", [])]
    code = tuple(d[len(CODE_PREFIX) :] for d in deps if d.startswith(CODE_PREFIX))
    inputs = [Path(d) for d in deps if not d.startswith(CODE_PREFIX)]
    outputs = [Path(_entry_path(o)) for key in ("outs", "metrics", "plots") for o in spec.get(key, [])]
    return Stage(
        name,
        module.run,
        module.load_config,
        inputs=lambda cfg, inputs=inputs: list(inputs),
        outputs=lambda cfg, outputs=outputs: list(outputs),
        code=code,
    )


def experiment_stages(dvc_file: str | Path = DVC_FILE) -> tuple[Stage, ...]:
    """``exp_<name>`` for each of :data:`uamt.experiments.SECTIONS`, then ``report``."""
    spec = yaml.safe_load(Path(dvc_file).read_text(encoding="utf-8"))["stages"]
    names = [f"exp_{name}" for name in uamt.experiments.SECTIONS] + [REPORT]
    missing = [name for name in names if name not in spec]
    if missing:
        raise ValueError(f"{dvc_file}: stage(s) {missing} missing; every experiment needs its dvc stage")
    return tuple(stage_from_dvc(name, spec[name]) for name in names)


STAGES: tuple[Stage, ...] = experiment_stages()
STAGE_BY_NAME = {stage.name: stage for stage in STAGES}
STAGE_NAMES = tuple(STAGE_BY_NAME)


def experiment_cache_key(context, parameters: dict[str, Any]) -> str | None:
    """Prefect ``cache_key_fn`` of an experiment task (:func:`flows.pipeline.stage_cache_key`)."""
    return stage_cache_key(context, parameters, stages=STAGE_BY_NAME)


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
        cfg = stage.load_config(params)
        run_task = stage_task(stage, refresh_cache or outputs_missing(stage, cfg), experiment_cache_key)
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
