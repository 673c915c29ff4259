"""flows/: task names = dvc.yaml stages, read from dvc.yaml; cache keys, wiring with recorded stage
runs, Dask runner."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
import test_flows_harness as harness
import yaml
from test_flows_harness import REPO_ROOT, cache_key, read_flow_run

from flows import dvc_stages
from flows import pipeline as fp
from uamt.core.config import ConfigError
from uamt.registry.store import SUMMARY_PATH

prefect_api = harness.prefect_api  # module fixture: a temporary Prefect API


def test_task_names_equal_dvc_stage_names():
    dvc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    # The deployable pipeline is dvc.yaml's first stages; the experiments follow
    # (flows/experiments.py, checked with the whole list in tests/test_flows_experiments.py).
    assert list(fp.STAGE_NAMES) == list(dvc["stages"])[: len(fp.STAGE_NAMES)]
    for stage in fp.STAGES:
        wrapped = fp.stage_task(stage)
        assert wrapped.name == stage.name
        assert wrapped.fn is stage.run  # the same function dvc runs, no second copy
        cmd = dvc["stages"][stage.name]["cmd"]
        assert cmd.endswith(f"uamt.stages.{stage.name}")
        assert stage.run.__module__ == f"uamt.stages.{stage.name}"


def test_stage_deps_outs_and_params_are_dvc_yaml_s():
    dvc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    for stage in fp.STAGES:
        spec = dvc[stage.name]
        assert list(stage.deps) == spec["deps"] and list(stage.params) == spec["params"]
        outs = [o if isinstance(o, str) else next(iter(o)) for k in ("outs", "metrics", "plots") for o in spec.get(k, [])]
        assert list(stage.outs) == outs
    train_base = fp.STAGE_BY_NAME["train_base"]
    assert "src/uamt/models" in train_base.deps and "models/hts_qe" in train_base.outs
    assert "metrics/test.json" in fp.STAGE_BY_NAME["evaluate"].outs  # a `metrics:` entry


def test_a_stage_missing_from_dvc_yaml_is_refused(tmp_path):
    dvc_file = tmp_path / "dvc.yaml"
    dvc_file.write_text(yaml.safe_dump({"stages": {"fetch": {"cmd": "python -m uamt.stages.fetch"}}}))
    with pytest.raises(ValueError, match=r"stage\(s\) \['register'\] missing"):
        dvc_stages.read_stages(["fetch", "register"], dvc_file)


def test_retries_only_on_transient_stages():
    retries = {stage.name: fp.stage_task(stage).retries for stage in fp.STAGES}
    assert retries.pop("fetch") == 3 and retries.pop("register") == 3
    assert set(retries.values()) == {0}


def test_every_stage_loads_its_config_from_the_repo_params():
    for stage in fp.STAGES:
        cfg = stage.load_config(REPO_ROOT / "params.yaml")
        assert dataclasses.is_dataclass(cfg)


def test_cache_key_follows_config_content_and_outputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stage = fp.STAGE_BY_NAME["encode"]
    cfg = stage.load_config(REPO_ROOT / "params.yaml")
    prepared = Path("data/prepared")  # encode's dvc.yaml dep
    prepared.mkdir(parents=True)
    (prepared / "d_q.parquet").write_bytes(b"rows v1")
    assert stage.outputs_missing()  # -> the flow runs it with refresh_cache
    Path("cache/embeddings").mkdir(parents=True)  # encode's dvc.yaml out
    assert not stage.outputs_missing()
    key = cache_key(stage, cfg)
    assert key and cache_key(stage, cfg) == key  # deterministic
    (prepared / "d_q.parquet").write_bytes(b"rows v2 (new annotations)")
    key2 = cache_key(stage, cfg)
    assert key2 != key
    other = dataclasses.replace(cfg, shard_size=cfg.shard_size + 1)
    assert cache_key(stage, other) not in (key, key2)
    (prepared / "d_q.parquet").write_bytes(b"rows v1")
    assert cache_key(stage, cfg) == key  # content, not mtime
    renamed = dataclasses.replace(stage, name="encode_again")
    assert cache_key(renamed, cfg) != key  # two stages never share a result


def test_cache_key_follows_the_code_deps(tmp_path, monkeypatch):
    """A changed file in a code dep folder changes the key; a new ``__pycache__`` (.dvcignore) does not."""
    project = tmp_path / "project"
    library = project / "src/uamt/encoders"
    library.mkdir(parents=True)
    (library / "cache.py").write_text("X = 1\n")
    shutil.copy(REPO_ROOT / ".dvcignore", project / ".dvcignore")
    monkeypatch.setattr(dvc_stages, "REPO_ROOT", project)
    monkeypatch.chdir(tmp_path)
    stage = dataclasses.replace(fp.STAGE_BY_NAME["encode"], deps=("src/uamt/encoders",))
    cfg = stage.load_config(REPO_ROOT / "params.yaml")
    key = cache_key(stage, cfg)
    (library / "__pycache__").mkdir()
    (library / "__pycache__/cache.cpython-311.pyc").write_bytes(b"bytecode")
    assert cache_key(stage, cfg) == key
    (library / "cache.py").write_text("X = 2\n")
    assert cache_key(stage, cfg) != key


def test_dvc_md5_is_what_dvc_lock_records(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a.json").write_bytes(b'{"a": 1}')
    assert dvc_stages.dvc_md5("a.json") == hashlib.md5(b'{"a": 1}').hexdigest()
    Path("folder/sub").mkdir(parents=True)
    Path("folder/sub/b.txt").write_text("b")
    digest = dvc_stages.dvc_md5("folder")
    assert digest.endswith(".dir") and dvc_stages.dvc_md5("folder") == digest
    Path("folder/sub/b.txt").write_text("c")
    assert dvc_stages.dvc_md5("folder") != digest
    assert dvc_stages.dvc_md5("not/there") == "missing"
    assert dvc_stages.dep_path("src/uamt/models") == REPO_ROOT / "src/uamt/models"
    assert dvc_stages.dep_path("data/prepared") == Path("data/prepared")


def test_a_params_file_without_a_key_dvc_reads_is_refused(tmp_path):
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    del params["pipeline"]["qe_methods"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    fp.STAGE_BY_NAME["encode"].check_params(path)  # encode does not read pipeline.*
    with pytest.raises(ConfigError, match=r"stage train_base reads 'pipeline.qe_methods' \(dvc.yaml\)"):
        fp.STAGE_BY_NAME["train_base"].check_params(path)


def test_metrics_markdown_table():
    test = {
        "point": {"avg": {"pps": -0.2, "nll": 1.5, "ece": 0.1, "n": 10}, "en-de": {"pps": 0.0}},
        "hts": {"avg": {"pps": -0.1, "nll": 1.25, "ece": 0.05, "n": 10}},
    }
    text = fp.metrics_markdown(
        test, "abc123", {"model_name": "m", "version": "2", "promoted": True, "reason": "ok"}
    )
    lines = text.splitlines()
    assert "| method | pps | nll | ece | n |" in lines
    assert "| hts | -0.1000 | 1.2500 | 0.0500 | 10 |" in lines
    assert "data version: `abc123`" in text and "version 2: promoted to champion" in text


def test_task_runner_choice():
    assert fp.task_runner_for("default") is None
    runner = fp.task_runner_for("dask", n_workers=3)
    assert type(runner).__name__ == "DaskTaskRunner"
    assert runner.cluster_kwargs["n_workers"] == 3 and runner.cluster_kwargs["threads_per_worker"] == 1
    with pytest.raises(ValueError, match="task_runner='ray' not supported"):
        fp.task_runner_for("ray")


# ----------------------------------------------------------------------------- wiring with fake stages


def _fake_stages(calls: list, monkeypatch) -> None:
    """Replace each stage's run by one that records the call and writes the stage's outputs."""

    def make(stage):
        def run(cfg):
            methods = getattr(getattr(cfg, "pipeline", None), "methods", None)
            calls.append((stage.name, methods))
            with open("calls.jsonl", "a") as log:  # survives Dask's pickled copy of the closure
                log.write(json.dumps([stage.name, methods]) + "\n")
            data = dvc_stages.dvc_md5("data/prepared")  # outputs depend on the data, as real ones do
            for out in stage.outs:
                out = Path(out)
                if out.suffix:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps({"stage": stage.name, "data": data}))
                else:
                    out.mkdir(parents=True, exist_ok=True)
                    (out / "x.parquet").write_text(f"{stage.name}:{data}")
            if stage.name == "evaluate":
                metrics = Path(cfg.pipeline.metrics_dir)
                test = {"hts": {"avg": {"pps": -0.5, "ece": 0.04}}, "data": {"avg": {"n": len(data)}}}
                (metrics / "test.json").write_text(json.dumps(test))
            if stage.name == "register":
                SUMMARY_PATH.write_text(
                    json.dumps({"model_name": "m", "version": "1", "promoted": True, "reason": "first"})
                )
            if stage.name == "train_base":
                return {m: str(cfg.pipeline.model_dir(m)) for m in cfg.pipeline.methods}
            return stage.name

        run.__name__ = f"fake_{stage.name}"
        return run

    stages = tuple(dataclasses.replace(stage, run=make(stage)) for stage in fp.STAGES)
    monkeypatch.setattr(fp, "STAGES", stages)
    monkeypatch.setattr(fp, "STAGE_BY_NAME", {s.name: s for s in stages})


def _small_params(tmp_path: Path) -> Path:
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["pipeline"]["methods"] = ["point", "hts"]
    params["fetch"]["sources_file"] = str(REPO_ROOT / "data_sources.yaml")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    return path


def test_pipeline_flow_wiring_caching_and_name(prefect_api, tmp_path, monkeypatch, markdown_artifacts):
    monkeypatch.chdir(tmp_path)
    params = _small_params(tmp_path)
    calls: list = []
    _fake_stages(calls, monkeypatch)
    artifacts = markdown_artifacts(fp)
    state = fp.uamt_pipeline(str(params), start="prepare", return_state=True)
    assert state.is_completed()
    assert [c[0] for c in calls] == list(fp.STAGE_NAMES[1:])
    version = fp.data_version("data/prepared")
    assert read_flow_run(state.state_details.flow_run_id).name == f"uamt-data-{version}"
    assert artifacts and "| hts | -0.5000 | 0.0400 |" in artifacts[-1]["markdown"]
    assert f"`{version}`" in artifacts[-1]["markdown"]

    # Same config, same data: every stage is a cache hit.
    calls.clear()
    assert fp.uamt_pipeline(str(params), start="prepare", return_state=True).is_completed()
    assert calls == []
    # New prepared data (as after an ingestion): prepare is cached but everything downstream re-runs.
    Path("data/prepared/d_q.parquet").write_bytes(b"new annotations")
    calls.clear()
    fp.uamt_pipeline(str(params), start="encode")
    assert [c[0] for c in calls] == list(fp.STAGE_NAMES[2:])
    # A deleted output re-runs its stage even though the inputs did not change.
    shutil.rmtree("models/hts")
    calls.clear()
    fp.uamt_pipeline(str(params), start="train_base", stop="train_base")
    assert [c[0] for c in calls] == ["train_base"]


def test_pipeline_on_dask_runs_methods_as_parallel_tasks(prefect_api, tmp_path, monkeypatch):
    from distributed import LocalCluster
    from prefect_dask import DaskTaskRunner

    monkeypatch.chdir(tmp_path)
    params = _small_params(tmp_path)
    calls: list = []
    _fake_stages(calls, monkeypatch)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        runner = DaskTaskRunner(address=cluster.scheduler_address)
        out = fp.uamt_pipeline.with_options(task_runner=runner)(
            str(params), start="train_base", stop="train_dup", parallel=True
        )
    recorded = [json.loads(line) for line in Path("calls.jsonl").read_text().splitlines()]
    per_method = sorted(methods for name, methods in recorded if name == "train_base")
    assert per_method == [["hts"], ["point"]]
    assert [name for name, _ in recorded].count("train_dup") == 1  # one train_base task per method
    assert out["train_base"] == {"point": "models/point", "hts": "models/hts"}
    assert out["train_dup"] == "train_dup"


def test_dask_task_runner_runs_independent_tasks_on_workers(prefect_api):
    from distributed import LocalCluster
    from prefect import flow, task
    from prefect_dask import DaskTaskRunner

    @task
    def where(i: int) -> tuple[int, str]:
        from distributed import get_worker

        time.sleep(0.2)
        return i, get_worker().address

    @flow
    def fan_out(n: int) -> list:
        return [f.result() for f in [where.submit(i) for i in range(n)]]

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        results = fan_out.with_options(task_runner=DaskTaskRunner(address=cluster.scheduler_address))(4)
        workers = set(cluster.scheduler_info["workers"])
    assert [i for i, _ in results] == [0, 1, 2, 3]
    assert {address for _, address in results} <= workers


def test_retrain_without_new_files_returns_at_once(prefect_api, tmp_path, monkeypatch):
    from flows.retrain import retrain_on_new_annotations

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    started = time.perf_counter()
    assert retrain_on_new_annotations("params.yaml") == {"status": "no new annotations"}
    assert time.perf_counter() - started < 10
    assert not Path("data").exists()  # no lock, pool or folder created


def test_retrain_refuses_a_pool_prepare_does_not_read(prefect_api, tmp_path, monkeypatch):
    from flows.retrain import check_pool_wiring
    from uamt.core.config import ConfigError

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["prepare"]["annotations_pool"] = None
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match="prepare.annotations_pool"):
        check_pool_wiring("params.yaml")


def test_retrain_with_dvc_ingests_then_versions_the_pool_and_runs_dvc_repro(
    prefect_api, tmp_path, monkeypatch
):
    import flows.retrain as fr

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["incoming"]["retrain_with"] = "dvc"
    params["incoming"]["settle_s"] = 0  # the file below is written just before the tick
    Path("params.yaml").write_text(yaml.safe_dump(params))
    Path("data/incoming").mkdir(parents=True)
    Path("data/incoming/new.csv").write_text(
        "dataset,lp,src,mt,ref,score,system\nwmt21_mqm,en-de,Hello there.,Hallo.,Hallo da.,-1,sysA\n"
    )
    commands = []

    def fake_run(cmd, check):
        commands.append(cmd)
        if cmd[:2] == ["dvc", "repro"]:  # what the register stage leaves behind
            SUMMARY_PATH.parent.mkdir(exist_ok=True)
            SUMMARY_PATH.write_text(json.dumps({"version": "7"}))

    monkeypatch.setattr(fr.subprocess, "run", fake_run)
    out = fr.retrain_on_new_annotations("params.yaml")
    assert out["status"] == "retrained" and out["registry"] == {"version": "7"}
    assert commands == [
        ["dvc", "add", "data/annotations/pool.parquet"],
        ["dvc", "repro", "register"],
        # after the marker: the versions completed per campaign and out of domain
        ["dvc", "repro", "evaluate_campaigns", "evaluate_ood"],
    ]
    assert Path("data/incoming/processed/new.csv").is_file()


# ----------------------------------------------------------------------------- faults (a killed run)


def test_transient_failure_is_retried_and_a_permanent_one_fails_the_run(prefect_api, tmp_path, monkeypatch):
    """A flaky fetch (network) succeeds on Prefect's retry; a stage that keeps failing marks the flow
    run failed with its reason, and register -- the only stage that touches the registry -- never runs."""
    monkeypatch.chdir(tmp_path)
    params = _small_params(tmp_path)
    calls: list = []
    _fake_stages(calls, monkeypatch)
    fetch = fp.STAGE_BY_NAME["fetch"]
    attempts = []

    def flaky_fetch(cfg):
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("raw.githubusercontent.com: connection reset")
        return fetch.run(cfg)

    # Same retries as production, without the 10 s back-off.
    real_stage_task = fp.stage_task
    monkeypatch.setattr(
        fp,
        "stage_task",
        lambda stage, refresh=False: real_stage_task(stage, refresh).with_options(retry_delay_seconds=0),
    )
    stages = tuple(dataclasses.replace(s, run=flaky_fetch) if s.name == "fetch" else s for s in fp.STAGES)
    monkeypatch.setattr(fp, "STAGES", stages)
    monkeypatch.setattr(fp, "STAGE_BY_NAME", {s.name: s for s in stages})
    state = fp.uamt_pipeline(str(params), stop="prepare", return_state=True, refresh_cache=True)
    assert state.is_completed()
    assert len(attempts) == 2 and [c[0] for c in calls] == ["fetch", "prepare"]

    def broken_train(cfg):
        raise RuntimeError("disk full while writing models/point")

    stages = tuple(
        dataclasses.replace(s, run=broken_train) if s.name == "train_base" else s for s in fp.STAGES
    )
    monkeypatch.setattr(fp, "STAGES", stages)
    monkeypatch.setattr(fp, "STAGE_BY_NAME", {s.name: s for s in stages})
    calls.clear()
    state = fp.uamt_pipeline(str(params), start="encode", return_state=True, refresh_cache=True)
    assert state.is_failed()
    assert "disk full" in str(state.message) or "disk full" in repr(state.result(raise_on_failure=False))
    assert "register" not in [c[0] for c in calls] and not SUMMARY_PATH.exists()
