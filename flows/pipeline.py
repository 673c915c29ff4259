"""Prefect flow ``uamt-pipeline``: the dvc.yaml stages ``fetch`` .. ``evaluate_ood``, chained as Prefect tasks.

The stages, their order, deps and outs are read from dvc.yaml (:mod:`flows.dvc_stages`); every task
is ``task(name=<stage name>)(uamt.stages.<name>.run)``: the same function ``dvc repro`` runs, so this
module holds wiring only (order, retries, caching, names, reports).

* Retries: ``fetch`` (network) and ``register`` (MLflow database) retry 3 times, 10/30/60 s apart.
* Caching: Prefect's ``INPUTS + TASK_SOURCE`` (the stage's config dataclass and the source of its
  ``run``) + :class:`flows.dvc_stages.DvcDeps`: the DVC md5 of each of the stage's dvc.yaml deps
  (the prepared data, the embedding-cache manifest, the upstream models, calibration and metrics,
  and the library folders its code imports).  New annotations change ``data/prepared`` and so
  every key downstream of ``prepare``.  A stage with a dvc.yaml out missing runs with
  ``refresh_cache`` (so deleting ``models/`` re-trains and the fresh result replaces the cached
  one).  ``refresh_cache=True`` forces every stage to run.
* Flow run name: renamed to ``uamt-data-<data_version>`` once ``prepare`` has run (the content
  hash of the prepared splits, the ``data_version`` tag the registered model gets).
* Report: a markdown artifact ``uamt-test-metrics`` with the average test metrics per method.
* Dask: with ``parallel=True`` each method of ``pipeline.methods`` is its own ``train_base`` task
  (and ``train_dup`` starts as soon as its base model is trained); :func:`run_pipeline` picks a
  :class:`prefect_dask.DaskTaskRunner` when ``incoming.task_runner`` is ``dask``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.dvc_stages import Stage, dvc_stage_names, read_stages, stage_task
from uamt.core.config import DEFAULT_PARAMS
from uamt.data.prepare import data_version
from uamt.pipeline_config import load_pipeline
from uamt.registry.store import SUMMARY_PATH

log = logging.getLogger(__name__)
REPORTED_METRICS = ("pps", "ups", "nll", "ece", "sharpness", "coverage@0.9", "width@0.9", "crps", "n")
#: The pipeline's stages run fetch .. LAST; ``register`` is where the champions are made, and
#: :data:`AFTER_REGISTER` (the stages after it, which no gate reads) complete the registered versions
#: with the per-campaign and out-of-domain numbers.
FIRST, LAST = "fetch", "evaluate_ood"
AFTER_REGISTER = ("evaluate_campaigns", "evaluate_ood")


def _pipeline_stage_names() -> list[str]:
    """dvc.yaml's stages from :data:`FIRST` to :data:`LAST` (the experiments follow them)."""
    names = dvc_stage_names()
    return names[names.index(FIRST) : names.index(LAST) + 1]


STAGES: tuple[Stage, ...] = read_stages(_pipeline_stage_names())
STAGE_BY_NAME = {stage.name: stage for stage in STAGES}
STAGE_NAMES = tuple(STAGE_BY_NAME)


# ----------------------------------------------------------------------------- reports


def metrics_markdown(
    test_metrics: dict, data_version: str | None = None, registry: dict | None = None
) -> str:
    """Markdown table of the average test metrics per method (``metrics/test.json``)."""
    columns = [c for c in REPORTED_METRICS if any(c in m.get("avg", {}) for m in test_metrics.values())]
    lines = ["# uamt test metrics", ""]
    if data_version:
        lines.append(f"data version: `{data_version}`")
    if registry:
        verdict = "promoted to champion" if registry.get("promoted") else "not promoted"
        lines.append(
            f"registered `{registry.get('model_name')}` version {registry.get('version')}: {verdict} "
            f"({registry.get('reason')})"
        )
    lines += ["", "| method | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for method, by_lp in test_metrics.items():
        avg = by_lp.get("avg", {})
        cells = []
        for column in columns:
            value = avg.get(column)
            cells.append(
                "" if value is None else (f"{value:.4f}" if isinstance(value, float) else str(value))
            )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _rename_flow_run(name: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    if run_id is None:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(run_id, name=name)


def per_method_config(cfg, method: str):
    """``train_base``'s config restricted to one method and its QE variant (the independent unit of work)."""
    qe = (method,) if method in cfg.pipeline.qe_methods else ()
    pipe = dataclasses.replace(
        cfg.pipeline,
        methods=(method,),
        dup_base=method,
        register_method=method,
        qe_methods=qe,
        register_qe_method=qe[0] if qe else None,
    )
    return dataclasses.replace(cfg, pipeline=pipe)


# ----------------------------------------------------------------------------- the flow


@flow(name="uamt-pipeline", flow_run_name="uamt-pipeline", log_prints=True)
def uamt_pipeline(
    params: str = str(DEFAULT_PARAMS),
    start: str = "fetch",
    stop: str = LAST,
    parallel: bool = False,
    refresh_cache: bool = False,
) -> dict[str, Any]:
    """Run the stages ``start`` .. ``stop`` (dvc.yaml order) with the config of ``params``.

    Paths in the params file are relative to the working directory, as for ``dvc repro``.
    Returns ``{stage name: what its run returned}``.
    """
    for name in (start, stop):
        if name not in STAGE_BY_NAME:
            raise ValueError(f"stage={name!r} not supported; choose from {list(STAGE_NAMES)}")
    selected = STAGES[STAGE_NAMES.index(start) : STAGE_NAMES.index(stop) + 1]
    outputs: dict[str, Any] = {}
    version = None
    for stage in selected:
        stage.check_params(params)
        cfg = stage.load_config(params)
        run_task = stage_task(stage, refresh_cache or stage.outputs_missing())
        if stage.name == "train_base" and parallel:
            futures = {}
            for method in cfg.pipeline.methods:
                one = per_method_config(cfg, method)
                futures[method] = run_task.with_options(task_run_name=f"train_base[{method}]").submit(one)
            outputs[stage.name] = futures
            continue
        if stage.name == "train_dup" and parallel and isinstance(outputs.get("train_base"), dict):
            futures = outputs["train_base"]
            dup_future = run_task.submit(cfg, wait_for=[futures[cfg.pipeline.dup_base]])
            trained = {}
            for future in futures.values():
                trained.update(future.result())
            outputs["train_base"] = trained
            outputs[stage.name] = dup_future.result()
            continue
        outputs[stage.name] = run_task(cfg)
        if stage.name == "prepare":
            version = data_version(cfg.out_dir)
            _rename_flow_run(f"uamt-data-{version}")
    if parallel and "train_base" in outputs and "train_dup" not in outputs:  # stopped before train_dup
        trained = {}
        for future in outputs["train_base"].values():
            trained.update(future.result())
        outputs["train_base"] = trained
    if "evaluate" in outputs or "register" in outputs:
        pipe = load_pipeline(params)
        test_path = Path(pipe.metrics_dir) / "test.json"
        registry_path = SUMMARY_PATH
        create_markdown_artifact(
            key="uamt-test-metrics",
            markdown=metrics_markdown(
                json.loads(test_path.read_text(encoding="utf-8")),
                version or data_version(pipe.prepared_dir),
                json.loads(registry_path.read_text(encoding="utf-8")) if "register" in outputs else None,
            ),
            description=f"average test metrics per method ({test_path})",
        )
    return outputs


def task_runner_for(kind: str, address: str | None = None, n_workers: int = 2):
    """The task runner for ``incoming.task_runner``: Prefect's default, or a DaskTaskRunner."""
    if kind == "default":
        return None
    if kind != "dask":
        raise ValueError(f"task_runner={kind!r} not supported; choose from ['dask', 'default']")
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={
            "n_workers": n_workers,
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": None,
            "host": "127.0.0.1",
        },
    )


def run_pipeline(params: str = str(DEFAULT_PARAMS), **kwargs) -> dict[str, Any]:
    """Run :func:`uamt_pipeline` on the task runner the ``incoming:`` section asks for."""
    from uamt.ingest import load_config as load_incoming

    cfg = load_incoming(params)
    runner = task_runner_for(cfg.task_runner, cfg.dask_address, cfg.dask_workers)
    if runner is None:
        return uamt_pipeline(params, **kwargs)
    kwargs.setdefault("parallel", True)
    return uamt_pipeline.with_options(task_runner=runner)(params, **kwargs)


if __name__ == "__main__":  # pragma: no cover
    import argparse

    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--start", default="fetch", choices=STAGE_NAMES)
    parser.add_argument("--stop", default=LAST, choices=STAGE_NAMES)
    parser.add_argument("--refresh-cache", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    print(run_pipeline(args.params, start=args.start, stop=args.stop, refresh_cache=args.refresh_cache))
