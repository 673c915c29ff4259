"""dvc.yaml's code deps are the ones generated from each stage's imports (uamt.dev.stage_deps), and
the generator follows the imports a stage runs: lazy ones, relative ones, declared dynamic ones and
package data; it leaves out what never runs and refuses what it cannot see."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from uamt.dev import stage_deps
from uamt.dev.stage_deps import MARKER, StageDepsError, code_deps, differences, generated


def test_dvc_yaml_code_deps_are_the_generated_ones():
    """Fails when an import changed and dvc.yaml was not regenerated: a stale result would go
    unnoticed (a dep missing) or a stage would re-run for nothing (a dep it does not import)."""
    problems = differences(REPO_ROOT, REPO_ROOT / "dvc.yaml")
    assert not problems, "\n".join([*problems, "run: python -m uamt.dev.stage_deps --write"])
    text = (REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8")
    assert generated(REPO_ROOT, text) == text


def test_the_real_stages_import_what_we_know_they_run():
    train_base = code_deps(REPO_ROOT, "uamt.stages.train_base")
    assert train_base[0] == "src/uamt/stages/train_base.py"
    assert {"src/uamt/models", "src/uamt/encoders", "src/uamt/__init__.py"} <= set(train_base)
    assert not any(dep.startswith("src/uamt/uncertainty") for dep in train_base)
    # report imports every analysis by computed name, and each analysis imports uamt.decisions
    report = code_deps(REPO_ROOT, "uamt.stages.report")
    assert {"src/uamt/experiments", "src/uamt/decisions"} <= set(report)
    # the analyses' stages read paper_numbers.yaml but never render a template
    methods = code_deps(REPO_ROOT, "uamt.stages.exp_methods")
    assert "src/uamt/experiments/paper_numbers.yaml" in methods
    assert not any("templates" in dep for dep in methods)


# ------------------------------------------------------------------ a small package, rule by rule


def make_repo(tmp_path: Path, files: dict[str, str], dvc: str | None = None) -> Path:
    """A repository with ``src/uamt/<files>`` (every package folder gets an ``__init__.py``)."""
    root = tmp_path / "repo"
    files = {"__init__.py": "", "stages/__init__.py": "", **files}
    for name, text in files.items():
        path = root / "src" / "uamt" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        if path.suffix == ".py":
            for parent in path.relative_to(root / "src" / "uamt").parents:
                init = root / "src" / "uamt" / parent / "__init__.py"
                if not init.exists():
                    init.write_text("")
    (root / "dvc.yaml").write_text(textwrap.dedent(dvc or DVC))
    return root


DVC = """\
stages:
  one:
    cmd: python -m uamt.stages.one
    deps:
      - data/raw
      # a hand comment on a data dep
      - data/extra.json
      - src/uamt/stale.py
    params:
      - one
    outs:
      - out

  other:
    cmd: echo not a uamt stage
    deps:
      - src/uamt/anything.py
"""

LIB = {
    "lib/__init__.py": "",
    "lib/a.py": "from uamt.lib import b\n",
    "lib/b.py": "X = 1\n",
    "lib/c.py": "Y = 2\n",
}


@pytest.mark.parametrize(
    ("stage", "extra", "expected"),
    [
        # imports every module of uamt.lib: the folder stands for them
        (
            "from uamt.lib import a, c\n",
            {},
            ["src/uamt/stages/one.py", "src/uamt/__init__.py", "src/uamt/lib", "src/uamt/stages/__init__.py"],
        ),
        # part of the package: its files one by one (with the package's __init__, which runs)
        (
            "import uamt.lib.a\n",
            {},
            [
                "src/uamt/stages/one.py",
                "src/uamt/__init__.py",
                "src/uamt/lib/__init__.py",
                "src/uamt/lib/a.py",
                "src/uamt/lib/b.py",
                "src/uamt/stages/__init__.py",
            ],
        ),
        # a lazy import inside a function runs when the stage calls it
        (
            "def run():\n    from uamt.lib import c\n",
            {},
            [
                "src/uamt/stages/one.py",
                "src/uamt/__init__.py",
                "src/uamt/lib/__init__.py",
                "src/uamt/lib/c.py",
                "src/uamt/stages/__init__.py",
            ],
        ),
        # a relative import inside the package
        (
            "from . import helper\n",
            {"stages/helper.py": "from ..lib import b\n"},
            [
                "src/uamt/stages/one.py",
                "src/uamt/__init__.py",
                "src/uamt/lib/__init__.py",
                "src/uamt/lib/b.py",
                "src/uamt/stages/__init__.py",
                "src/uamt/stages/helper.py",
            ],
        ),
        # never run: type-checking imports, and the top-level package's lazy API
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from uamt.lib import a\nelse:\n    import uamt.lib.c\n",
            {"__init__.py": "def load_model():\n    from uamt.lib import a\n"},
            [
                "src/uamt/stages/one.py",
                "src/uamt/__init__.py",
                "src/uamt/lib/__init__.py",
                "src/uamt/lib/c.py",
                "src/uamt/stages/__init__.py",
            ],
        ),
        # the top-level package's own module-level imports do run
        (
            "",
            {"__init__.py": "from uamt.lib import b\n"},
            [
                "src/uamt/stages/one.py",
                "src/uamt/__init__.py",
                "src/uamt/lib/__init__.py",
                "src/uamt/lib/b.py",
                "src/uamt/stages/__init__.py",
            ],
        ),
        # a dynamic import by a constant name is an import
        (
            "import importlib\nimportlib.import_module('uamt.lib.c')\n",
            {},
            [
                "src/uamt/stages/one.py",
                "src/uamt/__init__.py",
                "src/uamt/lib/__init__.py",
                "src/uamt/lib/c.py",
                "src/uamt/stages/__init__.py",
            ],
        ),
    ],
    ids=[
        "whole-package",
        "part-of-package",
        "lazy",
        "relative",
        "never-run",
        "top-level-init",
        "constant-dynamic",
    ],
)
def test_code_deps_follow_the_imports_that_run(tmp_path, stage, extra, expected):
    root = make_repo(tmp_path, {**LIB, "stages/one.py": stage, **extra})
    assert code_deps(root, "uamt.stages.one") == expected


def test_a_declared_dynamic_import_counts_every_module_of_its_package(tmp_path, monkeypatch):
    reader = "import importlib\ndef run(name):\n    return importlib.import_module(f'uamt.lib.{name}')\n"
    root = make_repo(tmp_path, {**LIB, "stages/one.py": "from uamt import reader\n", "reader.py": reader})
    with pytest.raises(StageDepsError, match=r"reader\.py:3: imports by computed name; .*DYNAMIC_IMPORTS"):
        code_deps(root, "uamt.stages.one")
    monkeypatch.setattr(stage_deps, "DYNAMIC_IMPORTS", {"uamt.reader": "uamt.lib"})
    assert "src/uamt/lib" in code_deps(root, "uamt.stages.one")


def test_package_data_is_a_dep_of_the_stages_importing_its_reader(tmp_path, monkeypatch):
    files = {**LIB, "lib/table.yaml": "a: 1\n", "stages/one.py": "from uamt.lib import a\n"}
    root = make_repo(tmp_path, files)
    with pytest.raises(
        StageDepsError, match=r"package data no stage is known to read: \['src/uamt/lib/table\.yaml'\]"
    ):
        code_deps(root, "uamt.stages.one")
    monkeypatch.setattr(stage_deps, "PACKAGE_DATA", {"src/uamt/lib/table.yaml": "uamt.lib.a"})
    assert "src/uamt/lib/table.yaml" in code_deps(root, "uamt.stages.one")
    monkeypatch.setattr(stage_deps, "PACKAGE_DATA", {"src/uamt/lib/table.yaml": "uamt.lib.c"})
    assert not any("table" in dep for dep in code_deps(root, "uamt.stages.one"))


def test_an_import_of_a_missing_module_is_named(tmp_path):
    root = make_repo(tmp_path, {**LIB, "stages/one.py": "\nfrom uamt.lib.gone import x\n"})
    with pytest.raises(StageDepsError, match=r"one\.py:2: imports uamt\.lib\.gone, which is not a module"):
        code_deps(root, "uamt.stages.one")


def test_write_replaces_only_the_code_deps_and_check_then_passes(tmp_path):
    root = make_repo(tmp_path, {**LIB, "stages/one.py": "from uamt.lib import a\n"})
    dvc = root / "dvc.yaml"
    assert differences(root, dvc) == [
        "stage one: lacks ['src/uamt/__init__.py', 'src/uamt/lib/__init__.py', 'src/uamt/lib/a.py', "
        "'src/uamt/lib/b.py', 'src/uamt/stages/__init__.py', 'src/uamt/stages/one.py']; "
        "names paths that do not exist ['src/uamt/stale.py']"
    ]
    assert stage_deps.main(["--check", "--root", str(root)]) == 1
    assert stage_deps.main(["--write", "--root", str(root)]) == 0
    text = dvc.read_text()
    assert text == DVC.replace(
        "      - src/uamt/stale.py\n",
        f"      {MARKER}\n"
        + "".join(
            f"      - {dep}\n"
            for dep in (
                "src/uamt/stages/one.py",
                "src/uamt/__init__.py",
                "src/uamt/lib/__init__.py",
                "src/uamt/lib/a.py",
                "src/uamt/lib/b.py",
                "src/uamt/stages/__init__.py",
            )
        ),
    )  # the data deps, their comment and the non-uamt stage are kept byte for byte
    assert stage_deps.main(["--check", "--root", str(root)]) == 0
    assert generated(root, text) == text  # idempotent


def test_check_names_a_dep_the_stage_no_longer_imports(tmp_path):
    root = make_repo(tmp_path, {**LIB, "stages/one.py": "from uamt.lib import a, c\n"})
    stage_deps.main(["--write", "--root", str(root)])
    (root / "src/uamt/stages/one.py").write_text("from uamt.lib import a\n")
    assert differences(root, root / "dvc.yaml") == [
        "stage one: names files it does not import ['src/uamt/lib/c.py']"
    ]


def test_outside_a_repository_the_tool_says_so(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        stage_deps.main(["--check", "--root", str(tmp_path)])
    assert exc.value.code == 2 and "not the repository root" in capsys.readouterr().err


def test_a_stage_without_a_deps_list_is_named(tmp_path):
    dvc = "stages:\n  one:\n    cmd: python -m uamt.stages.one\n    outs:\n      - out\n"
    root = make_repo(tmp_path, {**LIB, "stages/one.py": ""}, dvc)
    with pytest.raises(StageDepsError, match=r"stages \['one'\] have no `deps:` list"):
        generated(root, dvc)
    assert stage_deps.main(["--write", "--root", str(root)]) == 2
