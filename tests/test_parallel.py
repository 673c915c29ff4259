"""map_in_processes (uamt.core.parallel): the results of a loop, in its order, from spawned workers
that load their shared inputs once; errors come back; one worker or one item stays in-process."""

from __future__ import annotations

import functools
import os

import pytest

from uamt.core.parallel import default_threads, map_in_processes
from uamt.pipeline_config import PipelineConfig


def scaled(item: int, inputs) -> tuple[int, int, int]:
    """(item * factor, the worker's pid, how many times this process loaded the inputs)."""
    factor, loads = inputs
    if item < 0:
        raise ValueError(f"item {item} is negative")
    return item * factor, os.getpid(), loads


_LOADS = {"n": 0}


def load_factor(factor: int) -> tuple[int, int]:
    _LOADS["n"] += 1
    return factor, _LOADS["n"]


def test_in_process_loop_loads_once_and_keeps_order():
    _LOADS["n"] = 0
    out = map_in_processes(scaled, [3, 1, 2], workers=1, load=functools.partial(load_factor, 10))
    assert [value for value, _, _ in out] == [30, 10, 20]
    assert {pid for _, pid, _ in out} == {os.getpid()} and _LOADS["n"] == 1


@pytest.mark.slow
def test_spawned_workers_give_the_loop_results_in_order():
    items = list(range(7))
    out = map_in_processes(scaled, items, workers=2, load=functools.partial(load_factor, 3))
    assert [value for value, _, _ in out] == [3 * i for i in items]
    pids = {pid for _, pid, _ in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert all(loads == 1 for _, _, loads in out)  # each worker loaded the inputs once, whatever it ran
    with pytest.raises(ValueError, match="item -1 is negative"):
        map_in_processes(scaled, [1, -1, 2], workers=2, load=functools.partial(load_factor, 1))


def test_a_single_item_runs_here_without_inputs():
    assert map_in_processes(lambda item, inputs: (item, inputs), ["only"], workers=4) == [("only", None)]
    assert default_threads() >= 1


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_pipeline_workers_must_be_a_positive_integer(workers):
    with pytest.raises(Exception, match=r"pipeline.workers=.* must be an integer >= 1"):
        PipelineConfig(workers=workers)
