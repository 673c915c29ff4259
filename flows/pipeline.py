"""Prefect flow ``uamt-pipeline``: the dvc.yaml stages, chained as Prefect tasks.

Every task is ``task(name=<stage name>)(uamt.stages.<name>.run)``: the same function ``dvc repro``
runs, so this module holds wiring only (order, retries, caching, names, reports).

* Retries: ``fetch`` (network) and ``register`` (MLflow database) retry 3 times, 10/30/60 s apart.
* Caching: :func:`stage_cache_key` = sha256 of the stage name, the project folder, the stage's
  config (the frozen dataclass of params.yaml), the source of the code the stage runs and the
  content (sha256 of every file) of its input paths (:data:`STAGES`): the prepared data for every
  model stage, the embedding-cache manifest, the upstream models, calibration and metrics.  New
  annotations change ``data/prepared`` and so every key downstream of ``prepare``.  A stage
  whose outputs are missing runs with ``refresh_cache`` (so deleting ``models/`` re-trains and
  the fresh result replaces the cached one).  ``refresh_cache=True`` forces every stage to run.
* Flow run name: renamed to ``uamt-data-<data_version>`` once ``prepare`` has run (the content
  hash of the prepared splits, the ``data_version`` tag the registered model gets).
* Report: a markdown artifact ``uamt-test-metrics`` with the average test metrics per method.
* Dask: with ``parallel=True`` each method of ``pipeline.methods`` is its own ``train_base`` task
  (and ``train_dup`` starts as soon as its base model is trained); :func:`run_pipeline` picks a
  :class:`prefect_dask.DaskTaskRunner` when ``incoming.task_runner`` is ``dask``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

import uamt
from uamt.config import DEFAULT_PARAMS
from uamt.data.prepare import data_version as prepared_data_version
from uamt.stages import (
    calibrate,
    encode,
    evaluate,
    fetch,
    prepare,
    register,
    train_base,
    train_dup,
)

log = logging.getLogger(__name__)
PACKAGE_DIR = Path(uamt.__file__).resolve().parent
REPORTED_METRICS = ("pps", "ups", "nll", "ece", "sharpness", "coverage@0.9", "width@0.9", "crps", "n")


def _models(cfg) -> list[Path]:
    return [cfg.pipeline.model_dir(m) for m in cfg.pipeline.all_methods]


@dataclass(frozen=True)
class Stage:
    """One dvc stage as the flow sees it.

    ``inputs(cfg)``: paths whose content keys the task cache (dvc.yaml's deps, minus code);
    ``outputs(cfg)``: paths that must exist for a cache hit; ``code``: package folders/files
    (relative to ``src/uamt``) whose source keys the cache.
    """

    name: str
    run: Callable
    load_config: Callable[[str | Path], Any]
    inputs: Callable[[Any], list[Path]]
    outputs: Callable[[Any], list[Path]]
    code: tuple[str, ...]
    retries: int = 0


STAGES: tuple[Stage, ...] = (
    Stage(
        "fetch",
        fetch.run,
        fetch.load_config,
        inputs=lambda cfg: [],  # every file is pinned by sha256 in the config itself
        outputs=lambda cfg: [Path(cfg.raw_dir)],
        code=("data/fetch.py",),
        retries=3,
    ),
    Stage(
        "prepare",
        prepare.run,
        prepare.load_config,
        inputs=lambda cfg: (
            [Path(cfg.raw_dir)] + ([Path(cfg.annotations_pool)] if cfg.annotations_pool else [])
        ),
        outputs=lambda cfg: [Path(cfg.out_dir)],
        code=("data",),
    ),
    Stage(
        "encode",
        encode.run,
        encode.load_config,
        inputs=lambda cfg: [Path(cfg.prepared_dir)],
        outputs=lambda cfg: [Path(cfg.cache_dir) / "manifest.json"],
        code=("encoders", "stages/encode.py"),
    ),
    Stage(
        train_base.NAME,
        train_base.run,
        train_base.load_config,
        inputs=lambda cfg: [Path(cfg.pipeline.prepared_dir), Path(cfg.encode.cache_dir) / "manifest.json"],
        outputs=lambda cfg: [
            cfg.pipeline.model_dir(m) for m in (*cfg.pipeline.methods, *cfg.pipeline.qe_models)
        ],
        code=("models", "pipeline.py", "stages/train_base.py"),
    ),
    Stage(
        train_dup.NAME,
        train_dup.run,
        train_dup.load_config,
        inputs=lambda cfg: [
            Path(cfg.pipeline.prepared_dir),
            Path(cfg.encode.cache_dir) / "manifest.json",
            cfg.pipeline.model_dir(cfg.pipeline.dup_base),
        ],
        outputs=lambda cfg: [cfg.pipeline.model_dir("dup")],
        code=("models", "pipeline.py", "stages/train_dup.py"),
    ),
    Stage(
        calibrate.NAME,
        calibrate.run,
        calibrate.load_config,
        inputs=lambda cfg: [Path(cfg.pipeline.prepared_dir), *_models(cfg)],
        outputs=lambda cfg: [
            Path(cfg.calibration_dir),
            Path(cfg.pipeline.predictions_dir) / "dev",
            Path(cfg.pipeline.metrics_dir) / "dev.json",
        ],
        code=("uncertainty", "calibrated.py", "model_evaluation.py", "references.py", "pipeline.py", "stages/calibrate.py"),
    ),
    Stage(
        evaluate.NAME,
        evaluate.run,
        evaluate.load_config,
        inputs=lambda cfg: [
            Path(cfg.pipeline.prepared_dir),
            *_models(cfg),
            Path(cfg.pipeline.predictions_dir) / "dev",
        ],
        outputs=lambda cfg: [
            Path(cfg.pipeline.metrics_dir) / "test.json",
            Path(cfg.pipeline.metrics_dir) / "ood.json",
        ],
        code=("uncertainty", "calibrated.py", "model_evaluation.py", "pipeline.py", "stages/evaluate.py"),
    ),
    Stage(
        register.NAME,
        register.run,
        register.load_config,
        inputs=lambda cfg: [
            cfg.pipeline.model_dir(cfg.pipeline.register_method),
            Path(cfg.calibration_dir),
            Path(cfg.pipeline.metrics_dir) / "test.json",
            Path(cfg.pipeline.metrics_dir) / "ood.json",
        ],
        outputs=lambda cfg: [Path(cfg.pipeline.metrics_dir) / "registry.json"],
        code=("registry.py", "registration.py", "pyfunc.py", "stages/register.py"),
        retries=3,
    ),
)
STAGE_BY_NAME = {stage.name: stage for stage in STAGES}
STAGE_NAMES = tuple(STAGE_BY_NAME)


# ----------------------------------------------------------------------------- cache keys

_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def _file_sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _FILE_HASHES:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _FILE_HASHES[key] = digest.hexdigest()
    return _FILE_HASHES[key]


def content_hash(path: str | Path, suffix: str | None = None) -> str:
    """sha256 over the relative names and contents of a file or every file under a folder.

    ``suffix`` restricts a folder to files ending with it (``.py`` for code).  A missing path
    hashes to the marker ``missing``, so it appearing later changes the key.
    """
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        digest.update(_file_sha256(path).encode())
    elif path.is_dir():
        for item in sorted(p for p in path.rglob("*") if p.is_file()):
            if suffix and not item.name.endswith(suffix):
                continue
            if "__pycache__" in item.parts:
                continue
            digest.update(str(item.relative_to(path)).encode())
            digest.update(_file_sha256(item).encode())
    else:
        digest.update(b"missing")
    return digest.hexdigest()


def stage_cache_key(context, parameters: dict[str, Any], stages: dict[str, Stage] | None = None) -> str | None:
    """Prefect ``cache_key_fn``: stage name + project + config + code + input content (see module doc).

    ``stages``: the name -> :class:`Stage` table the task is looked up in (default :data:`STAGE_BY_NAME`;
    flows/experiments.py passes its own).
    """
    stage = (STAGE_BY_NAME if stages is None else stages)[context.task.name]
    cfg = parameters["cfg"]
    digest = hashlib.sha256()
    digest.update(stage.name.encode())
    digest.update(str(Path.cwd().resolve()).encode())
    digest.update(repr(cfg).encode())
    for item in stage.code:
        digest.update(content_hash(PACKAGE_DIR / item, ".py").encode())
    for path in stage.inputs(cfg):
        digest.update(str(path).encode())
        digest.update(content_hash(path).encode())
    return f"{stage.name}-{digest.hexdigest()}"


def outputs_missing(stage: Stage, cfg) -> bool:
    return not all(Path(p).exists() for p in stage.outputs(cfg))


def stage_task(stage: Stage, refresh_cache: bool = False, cache_key_fn: Callable = stage_cache_key):
    """The Prefect task of ``stage``: its ``run`` function, wrapped and nothing else."""
    return task(
        name=stage.name,
        retries=stage.retries,
        retry_delay_seconds=[10, 30, 60] if stage.retries else 0,
        cache_key_fn=cache_key_fn,
        persist_result=True,
        refresh_cache=refresh_cache,
    )(stage.run)


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
    stop: str = "register",
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
        cfg = stage.load_config(params)
        run_task = stage_task(stage, refresh_cache or outputs_missing(stage, cfg))
        if stage.name == "train_base" and parallel:
            futures = {}
            for method in cfg.pipeline.methods:
                one = per_method_config(cfg, method)
                futures[method] = run_task.with_options(
                    task_run_name=f"train_base[{method}]",
                    refresh_cache=refresh_cache or outputs_missing(stage, one),
                ).submit(one)
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
            version = prepared_data_version(cfg.out_dir)
            _rename_flow_run(f"uamt-data-{version}")
    if parallel and "train_base" in outputs and "train_dup" not in outputs:  # stopped before train_dup
        trained = {}
        for future in outputs["train_base"].values():
            trained.update(future.result())
        outputs["train_base"] = trained
    if "evaluate" in outputs or "register" in outputs:
        pipe = evaluate.load_config(params).pipeline
        test_path = Path(pipe.metrics_dir) / "test.json"
        registry_path = Path(pipe.metrics_dir) / "registry.json"
        create_markdown_artifact(
            key="uamt-test-metrics",
            markdown=metrics_markdown(
                json.loads(test_path.read_text(encoding="utf-8")),
                version or prepared_data_version(pipe.prepared_dir),
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
    from uamt.incoming import load_config as load_incoming

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
    parser.add_argument("--stop", default="register", choices=STAGE_NAMES)
    parser.add_argument("--refresh-cache", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    print(run_pipeline(args.params, start=args.start, stop=args.stop, refresh_cache=args.refresh_cache))
