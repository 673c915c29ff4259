"""`make run` ends with both champions: the register stage's DVC output lives with the registry (so a
fresh clone always registers), and `uamt registry check` refuses a pipeline model without @champion.

The whole `make run` on a fresh clone is tests/test_smoke_make_run.py (slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT
from uamt.cli import main
from uamt.registry import store as registry
from uamt.registry.store import SUMMARY_PATH, Gates

GOOD = {"ece": 0.01, "crps": 1.0, "pps": 0.3, "low_score_coverage": 0.8, "dev_ece": 0.01}
BAD_ECE = {**GOOD, "dev_ece": 0.2}  # over Gates().max_dev_ece: a first version is rejected


def register_stage_outputs() -> dict[str, dict]:
    """path -> options of every output of the register stage in dvc.yaml."""
    stage = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["register"]
    entries = [o if isinstance(o, dict) else {o: {}} for key in ("outs", "metrics", "plots") for o in stage.get(key, [])]
    return {path: options or {} for entry in entries for path, options in entry.items()}


def test_register_stage_output_lives_with_the_registry_not_in_git():
    """A committed output made `dvc repro` skip `register` on a fresh clone whose retrained models
    hashed as dvc.lock recorded ("Stage 'register' didn't change, skipping"): its new registry stayed
    empty. An output that git ignores, inside the registry's folder, is absent wherever the registry
    is, so DVC runs the stage there; persistent, so that DVC's run cache (which restores a stage's
    outputs, uncached ones included, when its deps match an earlier run) never stands in for the
    registration when only the registry is gone."""
    outputs = register_stage_outputs()
    assert outputs == {str(SUMMARY_PATH): {"cache": False, "persist": True}}, outputs
    for out in outputs:
        assert Path(out).parts[0] == str(registry.DEFAULT_STORE), out
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", out], cwd=REPO_ROOT)
        assert ignored.returncode == 0, f"{out} is not git-ignored: a fresh clone would hold it"
    tracked = subprocess.run(["git", "ls-files", str(registry.DEFAULT_STORE)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert tracked.stdout.split() == [f"{registry.DEFAULT_STORE}/.gitkeep"], tracked.stdout


def test_make_run_ends_with_the_champion_check():
    venv = Path(sys.prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under `make test`
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", f"{venv}/.installed", "run", f"VENV={venv}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    commands = [line for line in dry.stdout.splitlines() if line and not line.startswith("#")]
    assert commands[-2:] == [f"{venv}/bin/dvc repro", f"{venv}/bin/uamt registry check"], commands


def params_file(folder: Path, model_name: str, *, qe: bool = True, tracking_uri: str | None = None) -> Path:
    path = folder / "params.yaml"
    text = f"pipeline:\n  register_qe_method: {'hts' if qe else 'null'}\nregister:\n  model_name: {model_name}\n"
    path.write_text(text + (f"  tracking_uri: {tracking_uri}\n" if tracking_uri else ""), encoding="utf-8")
    return path


def registered(uri: str, name: str, metrics: dict) -> None:
    """A version of ``name`` through the promotion gate (no model logged: the check reads the registry only)."""
    client = registry._client(uri)
    if not client.search_registered_models(f"name='{name}'"):
        client.create_registered_model(name)
    version = client.create_model_version(name, source="file:///nowhere", tags={registry.STATUS_TAG: "pending"})
    registry.gate_and_alias(client, name, str(version.version), metrics, Gates())


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A project folder whose default registry (``mlflow/mlflow.db``) holds: ``both`` and ``both-qe``
    champions; ``ref-only`` champion and no ``ref-only-qe``; ``gated`` champion and ``gated-qe``
    rejected by the gate (one database for the module: creating one takes seconds)."""
    root = tmp_path_factory.mktemp("project")
    uri = f"sqlite:///{root / 'mlflow' / 'mlflow.db'}"  # registry.tracking_uri(root=root) without the environment
    registry.init_store(uri)
    for name, metrics in (("both", GOOD), ("both-qe", GOOD), ("ref-only", GOOD), ("gated", GOOD), ("gated-qe", BAD_ECE)):
        registered(uri, name, metrics)
    return root


@pytest.mark.parametrize(
    ("model_name", "qe", "code", "needles"),
    [
        pytest.param(
            "both", True, 0,
            ["both: @champion is version 1 (passed: first version", "both-qe: @champion is version 1"],
            id="both-champions",
        ),
        pytest.param("ref-only", False, 0, ["ref-only: @champion is version 1"], id="no-qe-model-configured"),
        pytest.param(
            "never", True, 2,
            ["never is not registered in sqlite:///", "DVC found it up to date", "`dvc repro -f -s register`",
             "never-qe is not registered"],
            id="register-skipped",
        ),
        pytest.param(
            "ref-only", True, 2, ["ref-only-qe is not registered", "`dvc repro -f -s register`"], id="qe-model-missing"
        ),
        pytest.param(
            "gated", True, 2,
            ["gated-qe has no @champion: its latest version 1 is rejected (dev ECE 0.2000 > max_dev_ece 0.0800)",
             "params.yaml register.gates", "uamt registry show --name gated-qe"],
            id="gate-rejected",
        ),
    ],
)  # fmt: skip
def test_registry_check(store, tmp_path, monkeypatch, capsys, model_name, qe, code, needles):
    monkeypatch.chdir(store)  # the default store, as `make run` leaves it (no MLFLOW_TRACKING_URI)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = params_file(tmp_path, model_name, qe=qe)
    assert main(["registry", "check", "--params", str(params)]) == code
    out, err = capsys.readouterr()
    text = out if code == 0 else err
    for needle in needles:
        assert needle in text, text
    if code:
        assert out == "" and err.startswith("uamt registry: error: no champion to serve in sqlite:///"), err
        assert len(err.strip().splitlines()) == 1


def test_registry_check_names_and_store_from_options(store, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no params.yaml, no default store here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{store / 'mlflow' / 'mlflow.db'}"
    assert main(["registry", "check", "--tracking-uri", uri, "--name", "gated", "--name", "both-qe"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("both-qe: @champion is version 1")


def test_registry_check_reads_the_register_stage_store(store, tmp_path, monkeypatch, capsys):
    """register.tracking_uri (where the register stage registers) comes before $MLFLOW_TRACKING_URI."""
    monkeypatch.chdir(tmp_path)
    params_file(tmp_path, "both", tracking_uri=f"sqlite:///{store / 'mlflow' / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'not-this.db'}")
    assert main(["registry", "check"]) == 0
    assert "both-qe: @champion is version 1" in capsys.readouterr().out


def test_registry_check_on_a_missing_store_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params_file(tmp_path, "both")
    assert main(["registry", "check"]) == 2
    assert "does not exist (nothing was created)" in capsys.readouterr().err
    assert not (tmp_path / "mlflow").exists()
