"""One verb, one home: every dvc.yaml stage is a module uamt/stages/<name>.py with run() and main(),
and its command calls exactly that module (its code deps: tests/test_stage_deps.py)."""

from __future__ import annotations

import importlib

import pytest
import yaml

from tests.conftest import REPO_ROOT
from uamt.experiments import SECTIONS

DVC = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())
EXPECTED = [
    "fetch",
    "prepare",
    "encode",
    "train_base",
    "train_dup",
    "train_lolo",
    "calibrate",
    "evaluate",
    "calibrate_campaigns",
    "register",
    # after register: no gate reads them
    "evaluate_campaigns",
    "evaluate_ood",
    *(f"exp_{name}" for name in SECTIONS),
    "report",
]


def test_stage_order_is_the_pipeline():
    assert list(DVC["stages"]) == EXPECTED


def test_the_stages_after_register_wait_for_it_and_nothing_before_it_reads_them():
    """What no gate reads runs after ``register`` (its output a dep, so ``dvc repro`` orders them
    after it, and the retrain flow runs them once the champions are made): no stage up to
    ``register`` depends on their outputs."""
    from flows.pipeline import AFTER_REGISTER

    register = EXPECTED.index("register")
    assert list(AFTER_REGISTER) == EXPECTED[register + 1 : register + 1 + len(AFTER_REGISTER)]
    late_outputs = set()
    for name in AFTER_REGISTER:
        stage = DVC["stages"][name]
        assert "mlflow/registration.json" in stage["deps"], name
        for kind in ("outs", "metrics", "plots"):
            late_outputs |= {next(iter(o)) if isinstance(o, dict) else o for o in stage.get(kind, [])}
    for name in EXPECTED[: register + 1]:
        assert not late_outputs & set(DVC["stages"][name]["deps"]), name


@pytest.mark.parametrize("name", EXPECTED)
def test_stage_module_has_run_and_main(name):
    module = importlib.import_module(f"uamt.stages.{name}")
    assert callable(module.run) and callable(module.main)
    assert DVC["stages"][name]["cmd"] == f"python -m uamt.stages.{name}"


def test_fetch_depends_on_the_pinned_sources_file():
    """A changed pin re-runs fetch: the file params.yaml names as fetch.sources_file is a dep."""
    from uamt.stages import fetch

    sources_file = fetch.load_config(REPO_ROOT / "params.yaml").sources_file
    assert sources_file in DVC["stages"]["fetch"]["deps"] and (REPO_ROOT / sources_file).is_file()


@pytest.mark.parametrize("name", EXPECTED)
def test_stage_params_exist_in_params_yaml(name):
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    for entry in DVC["stages"][name].get("params", []):
        node = params
        for part in entry.split("."):
            assert part in node, f"stage {name}: params key {entry!r} not in params.yaml"
            node = node[part]


def test_params_yaml_loads_into_every_stage_config():
    for name in EXPECTED:
        module = importlib.import_module(f"uamt.stages.{name}")
        loader = getattr(module, "load_config", None)
        if loader is not None:
            loader(REPO_ROOT / "params.yaml")


def test_unknown_params_key_is_refused(tmp_path):
    from uamt.core.config import ConfigError
    from uamt.stages import register

    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["register"]["gate"] = {"max_ece": 0.1}  # typo of "gates"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"register: unknown key\(s\) \['gate'\]"):
        register.load_config(path)


def test_wrong_type_is_refused_with_section_and_key(tmp_path):
    from uamt.core.config import ConfigError
    from uamt.stages import register

    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["register"]["gates"]["max_dev_ece"] = "low"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"register\.gates\.max_dev_ece: expected float \| None, got 'low'"):
        register.load_config(path)


def test_the_retired_test_set_ece_ceiling_is_refused_by_name(tmp_path):
    """``max_ece`` (a ceiling on the test ECE, tuned after test numbers were seen) is gone: a params
    file that still sets it fails naming the key, instead of the gate silently not applying it."""
    from uamt.core.config import ConfigError
    from uamt.stages import register

    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["register"]["gates"]["max_ece"] = 0.07
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"register\.gates: unknown key\(s\) \['max_ece'\]"):
        register.load_config(path)
