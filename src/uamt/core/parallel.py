"""Independent pieces of a stage in worker processes, with the results of one process.

The calibrate and evaluate stages fit and measure each model on its own; most of that time is numpy
on one core (the calibration grid searches, the cross-fitting, the leave-one-LP-out refits), so on
a machine with two cores two models at a time take about half as long.  Workers are *spawned*
(fresh interpreters: no fork of a process whose torch / OpenMP thread pools already run), log like
the stage, and share the cores: torch in each runs ``cores // workers`` threads.  Results equal
those of one process up to float rounding: torch's thread count changes the order of float32 sums
(measured on the pipeline: calibration files identical, test PPS equal to 12 digits).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

#: The log line of every stage (``uamt.stages._cli.stage_main``) and of its workers.
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

Item = TypeVar("Item")


def default_threads() -> int:
    """Threads an encoder without a setting of its own uses: torch's (``torch.get_num_threads()``:
    ``OMP_NUM_THREADS``, ``torch.set_num_threads``, one on a Dask worker) when torch is loaded, else
    ``OMP_NUM_THREADS``, else the CPUs this process may run on.  Scoring an ONNX export does not load
    torch (~190 MB and ~1.3 s of start-up) to ask it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return max(1, int(torch.get_num_threads()))
    configured = os.environ.get("OMP_NUM_THREADS", "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


#: What a worker's ``load`` returned (:func:`map_in_processes`), once per worker process.
_LOADED: dict[str, Any] = {}


def _worker_setup(threads: int, level: int, load: Callable[[], Any] | None) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    logging.basicConfig(level=level, format=LOG_FORMAT)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None:
        torch.set_num_threads(threads)
    _LOADED["value"] = load() if load is not None else None


def _run_loaded(work: Callable[[Any, Any], Any], item: Any) -> Any:
    return work(item, _LOADED["value"])


def map_in_processes(
    work: Callable[[Item, Any], Any], items: Iterable[Item], workers: int, load: Callable[[], Any] | None = None
) -> list[Any]:
    """``[work(item, inputs) for item in items]`` with ``inputs = load()``, in ``workers`` spawned
    processes when ``workers`` > 1.

    ``load`` (optional; ``inputs`` is then None) reads what every item needs -- tables, an encoder
    -- once per process: once here, or once in each worker.  ``work`` and ``load`` must be picklable
    (module-level functions or :func:`functools.partial` of them), and so must the results.  The
    results come in the order of ``items`` whatever finishes first; an exception in a worker is
    raised here.  With ``workers`` <= 1 or a single item, everything runs in this process.
    """
    items = list(items)
    workers = min(int(workers), len(items))
    if workers <= 1:
        inputs = load() if load is not None else None
        return [work(item, inputs) for item in items]
    import functools
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, default_threads() // workers)
    context = multiprocessing.get_context("spawn")
    level = logging.getLogger().getEffectiveLevel()
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_worker_setup, initargs=(threads, level, load)
    ) as pool:
        return list(pool.map(functools.partial(_run_loaded, work), items))
