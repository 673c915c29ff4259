"""One verb, one home: every dvc.yaml stage is a module uamt/stages/<name>.py with run() and main(),
its command calls exactly that module, and its deps cover every uamt module that module imports."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

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
    "calibrate",
    "evaluate",
    "register",
    *(f"exp_{name}" for name in SECTIONS),
    "report",
]


def test_stage_order_is_the_pipeline():
    assert list(DVC["stages"]) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_stage_module_has_run_and_main(name):
    module = importlib.import_module(f"uamt.stages.{name}")
    assert callable(module.run) and callable(module.main)
    assert DVC["stages"][name]["cmd"] == f"python -m uamt.stages.{name}"


# ----------------------------------------------------------------------------- code deps


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # ``uamt.core.config.DEFAULT_PARAMS``: a name inside a module
        return False


def _uamt_imports(path: Path) -> set[str]:
    """The uamt modules ``path`` imports, at module level or inside a function (lazy imports count),
    except the lazy imports of the top-level package's Python API (``uamt.load_model``): every stage
    runs ``uamt/__init__.py`` on import, and none calls the API."""
    names: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level_package = path.resolve() == (REPO_ROOT / "src" / "uamt" / "__init__.py").resolve()
    for node in (tree.body if top_level_package else ast.walk(tree)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.split(".")[0] == "uamt"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "uamt":
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")}
    return names


def imported_files(module: str) -> set[str]:
    """Repository paths of ``module`` and every uamt module it imports, transitively (with the
    packages' ``__init__.py`` on the way, which run on import)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for parent in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
        todo += [m for m in _uamt_imports(Path(importlib.util.find_spec(name).origin)) if m not in seen]
    return {Path(importlib.util.find_spec(m).origin).resolve().relative_to(REPO_ROOT).as_posix() for m in seen}


def uncovered(files: set[str], deps: list[str]) -> tuple[list[str], list[str]]:
    """(files under no dep, ``src/`` deps that hold none of ``files``)."""

    def under(path: str, dep: str) -> bool:
        return path == dep or path.startswith(dep.rstrip("/") + "/")

    code = [d for d in deps if d.startswith("src/")]
    missing = sorted(f for f in files if not any(under(f, d) for d in code))
    # Package data (templates, YAML tables) is read, not imported: the import walk cannot see it.
    modules = [d for d in code if d.endswith(".py") or "." not in Path(d).name and Path(d).name != "templates"]
    unused = [d for d in modules if not any(under(f, d) for f in files)]
    return missing, unused


@pytest.mark.parametrize("name", EXPECTED)
def test_code_deps_cover_every_module_the_stage_imports(name):
    """dvc.yaml's deps (read by ``dvc repro`` and the Prefect flows' cache keys) name every uamt
    module the stage runs, so a library change never leaves a stale result; and no dead code dep."""
    importlib.import_module(f"uamt.stages.{name}")
    deps = [d if isinstance(d, str) else next(iter(d)) for d in DVC["stages"][name]["deps"]]
    missing, unused = uncovered(imported_files(f"uamt.stages.{name}"), deps)
    assert not missing, f"dvc.yaml stage {name}: add to deps (the file or its package folder): {missing}"
    assert not unused, f"dvc.yaml stage {name}: deps {unused} hold no module the stage imports"


def test_the_code_deps_check_can_fail():
    files = imported_files("uamt.stages.train_base")
    assert {"src/uamt/models/hts.py", "src/uamt/encoders/cache.py", "src/uamt/__init__.py"} <= files
    assert "src/uamt/uncertainty/metrics.py" not in files
    deps = [d for d in DVC["stages"]["train_base"]["deps"] if d != "src/uamt/models"]
    missing, unused = uncovered(files, [*deps, "src/uamt/uncertainty"])
    assert "src/uamt/models/hts.py" in missing and unused == ["src/uamt/uncertainty"]


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
