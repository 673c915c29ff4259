"""flows/experiments.py: task names = the dvc.yaml experiment stages, wiring from dvc.yaml, order, caching."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import test_flows_harness as harness
import yaml
from test_flows_harness import REPO_ROOT

from flows import experiments as fe
from flows import pipeline as fp
from uamt.experiments import SECTIONS

prefect_api = harness.prefect_api  # session fixture: a temporary Prefect API
DVC = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8"))


def test_pipeline_and_experiment_tasks_are_the_dvc_stages_in_order():
    names = [s.name for s in fp.STAGES] + [s.name for s in fe.STAGES]
    assert names == list(DVC["stages"])
    for stage in fe.STAGES:
        wrapped = fp.stage_task(stage, cache_key_fn=fe.experiment_cache_key)
        assert wrapped.name == stage.name and wrapped.retries == 0
        assert wrapped.fn is stage.run  # the function dvc runs, no second copy
        assert stage.run.__module__ == f"uamt.stages.{stage.name}"
        assert DVC["stages"][stage.name]["cmd"] == f"python -m uamt.stages.{stage.name}"
        assert dataclasses.is_dataclass(stage.load_config(REPO_ROOT / "params.yaml"))


def test_code_inputs_and_outputs_come_from_dvc_yaml():
    stage = fe.STAGE_BY_NAME["exp_ood"]
    assert {"stages/exp_ood.py", "experiments/ood.py", "experiments/common.py"} <= set(stage.code)
    assert all(not str(p).startswith("src/") for p in stage.inputs(None))
    assert Path("metrics/ood.json") in stage.inputs(None)
    assert Path("metrics/experiments/ood.json") in stage.outputs(None)
    assert Path("reports/figures/ood_sharpness.png") in stage.outputs(None)
    report = fe.STAGE_BY_NAME["report"]
    assert report.outputs(None) == [Path("reports/experiments.md")]
    assert Path("metrics/experiments/cost.json") in report.inputs(None)


class _Ctx:
    def __init__(self, name):
        self.task = type("T", (), {"name": name})()


def test_cache_key_follows_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stage = fe.STAGE_BY_NAME["exp_ood"]
    cfg = stage.load_config(REPO_ROOT / "params.yaml")
    key = fe.experiment_cache_key(_Ctx("exp_ood"), {"cfg": cfg})
    assert key.startswith("exp_ood-") and fe.experiment_cache_key(_Ctx("exp_ood"), {"cfg": cfg}) == key
    Path("metrics").mkdir()
    Path("metrics/ood.json").write_text("{}")
    assert fe.experiment_cache_key(_Ctx("exp_ood"), {"cfg": cfg}) != key
    with pytest.raises(KeyError):  # pipeline stages are not looked up in the experiments' table
        fe.experiment_cache_key(_Ctx("evaluate"), {"cfg": cfg})


def _fake_stages(calls: list, monkeypatch) -> None:
    """Each stage's run records the call and writes its dvc outputs (content = its inputs' hash)."""

    def make(stage):
        def run(cfg):
            calls.append(stage.name)
            inputs = "".join(fp.content_hash(p) for p in stage.inputs(cfg))
            for out in stage.outputs(cfg):
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(f"# {stage.name}\n{inputs}\n")
            return {"outputs": [str(p) for p in stage.outputs(cfg)]}

        run.__name__ = f"fake_{stage.name}"
        return run

    stages = tuple(dataclasses.replace(stage, run=make(stage)) for stage in fe.STAGES)
    monkeypatch.setattr(fe, "STAGES", stages)
    monkeypatch.setattr(fe, "STAGE_BY_NAME", {s.name: s for s in stages})


def test_flow_runs_the_stages_in_order_and_caches(prefect_api, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    calls: list = []
    _fake_stages(calls, monkeypatch)
    artifacts = []
    real_artifact = fe.create_markdown_artifact
    monkeypatch.setattr(
        fe, "create_markdown_artifact", lambda **kw: artifacts.append(kw) or real_artifact(**kw)
    )

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
