"""flows/experiments.py: task names = the dvc.yaml experiment stages, wiring from dvc.yaml, order, caching."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import test_flows_harness as harness
import yaml
from test_flows_harness import REPO_ROOT, cache_key

from flows import experiments as fe
from flows import pipeline as fp
from flows.dvc_stages import dvc_md5, stage_task
from uamt.experiments import SECTIONS

prefect_api = harness.prefect_api  # module fixture: a temporary Prefect API
DVC = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8"))


def test_pipeline_and_experiment_tasks_are_the_dvc_stages_in_order():
    names = [s.name for s in fp.STAGES] + [s.name for s in fe.STAGES]
    assert names == list(DVC["stages"])
    for stage in fe.STAGES:
        wrapped = stage_task(stage)
        assert wrapped.name == stage.name and wrapped.retries == 0
        assert wrapped.fn is stage.run  # the function dvc runs, no second copy
        assert stage.run.__module__ == f"uamt.stages.{stage.name}"
        assert DVC["stages"][stage.name]["cmd"] == f"python -m uamt.stages.{stage.name}"
        assert dataclasses.is_dataclass(stage.load_config(REPO_ROOT / "params.yaml"))


def test_deps_and_outputs_come_from_dvc_yaml():
    stage = fe.STAGE_BY_NAME["exp_ood"]
    code = {"src/uamt/stages/exp_ood.py", "src/uamt/experiments/ood.py", "src/uamt/experiments/common.py"}
    assert code <= set(stage.deps) and "metrics/ood.json" in stage.deps
    assert {"metrics/experiments/ood.json", "reports/figures/ood_sharpness.png"} <= set(stage.outs)
    assert stage.params == tuple(DVC["stages"]["exp_ood"]["params"])
    report = fe.STAGE_BY_NAME["report"]
    assert report.outs == ("reports/experiments.md",)
    assert "metrics/experiments/cost.json" in report.deps


def test_cache_key_follows_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stage = fe.STAGE_BY_NAME["exp_ood"]
    cfg = stage.load_config(REPO_ROOT / "params.yaml")
    key = cache_key(stage, cfg)
    assert cache_key(stage, cfg) == key
    Path("metrics").mkdir()
    Path("metrics/ood.json").write_text("{}")  # a dvc.yaml dep of exp_ood appears
    with_metrics = cache_key(stage, cfg)
    assert with_metrics != key
    Path("metrics/ood.json").write_text('{"hts": {}}')
    assert cache_key(stage, cfg) not in (key, with_metrics)
    changed = cache_key(stage, cfg)
    Path("metrics/other.json").write_text("{}")  # not a dep of exp_ood
    assert cache_key(stage, cfg) == changed


def _fake_stages(calls: list, monkeypatch) -> None:
    """Each stage's run records the call and writes its dvc outputs (content = its inputs' hash)."""

    def make(stage):
        def run(cfg):
            calls.append(stage.name)
            inputs = "".join(dvc_md5(d) for d in stage.deps if not d.startswith("src/"))
            for out in map(Path, stage.outs):
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(f"# {stage.name}\n{inputs}\n")
            return {"outputs": list(stage.outs)}

        run.__name__ = f"fake_{stage.name}"
        return run

    stages = tuple(dataclasses.replace(stage, run=make(stage)) for stage in fe.STAGES)
    monkeypatch.setattr(fe, "STAGES", stages)
    monkeypatch.setattr(fe, "STAGE_BY_NAME", {s.name: s for s in stages})


def test_flow_runs_the_stages_in_order_and_caches(prefect_api, tmp_path, monkeypatch, markdown_artifacts):
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    calls: list = []
    _fake_stages(calls, monkeypatch)
    artifacts = markdown_artifacts(fe)

    state = fe.uamt_experiments("params.yaml", return_state=True)
    assert state.is_completed()
    assert calls == list(fe.STAGE_NAMES) == [*(f"exp_{n}" for n in SECTIONS), "report"]
    assert artifacts[-1]["key"] == "uamt-experiments" and artifacts[-1]["markdown"].startswith("# report")

    # Same config and inputs: every task is a cache hit.
    calls.clear()
    assert fe.uamt_experiments("params.yaml", return_state=True).is_completed()
    assert calls == []
    # New evaluate metrics: exp_ood re-runs, and report, whose input ood.json changed, after it.
    Path("metrics").mkdir(exist_ok=True)
    Path("metrics/ood.json").write_text(json.dumps({"hts": {}}))
    calls.clear()
    fe.uamt_experiments("params.yaml")
    assert calls == ["exp_ood", "report"]
    # A deleted output re-runs its stage; `only` restricts the run.
    Path("reports/figures/cost.png").unlink()
    calls.clear()
    fe.uamt_experiments("params.yaml", only=["exp_cost", "exp_ood"])
    assert calls == ["exp_cost"]


def test_unknown_stage_is_refused(prefect_api):
    with pytest.raises(ValueError, match=r"stage='train_base' not supported; choose from \['exp_methods'"):
        fe.uamt_experiments("params.yaml", only=["train_base"])
