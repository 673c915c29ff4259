"""The layering of the package, read from the source with ``ast`` (nothing is imported):

* no module of ``uamt`` outside ``uamt.stages`` imports ``uamt.stages`` (stages call the library,
  never the other way round);
* no stage imports another stage (what two stages share lives in the library); the package's
  private helpers (``uamt.stages._cli``) are not stages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "uamt"
STAGES = "uamt.stages"


def module_name(path: Path, root: Path) -> str:
    """Dotted name of the module at ``path`` in the package at ``root`` (``root.name`` is the package)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Every module ``source`` imports, absolute and dotted (``from a import b`` gives ``a`` and ``a.b``),
    wherever the import statement is (functions included)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _is_stage(name: str) -> bool:
    """A stage module ``uamt.stages.<name>`` (not the package, not a private helper)."""
    prefix = f"{STAGES}."
    return name.startswith(prefix) and not name[len(prefix) :].split(".")[0].startswith("_")


def layering_violations(root: Path) -> list[str]:
    """``"<module> imports <target>"`` for every arrow the layering forbids, in the package at ``root``."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        targets = imported_modules(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
        inside_stages = module == STAGES or module.startswith(f"{STAGES}.")
        for target in sorted(targets):
            into_stages = target == STAGES or target.startswith(f"{STAGES}.")
            if not inside_stages and into_stages:
                problems.append(f"{module} imports {target}: the library must not depend on a stage")
            elif _is_stage(module) and _is_stage(target) and target.split(".")[2] != module.split(".")[2]:
                problems.append(f"{module} imports {target}: a stage must not import another stage")
    return problems


def test_no_library_module_imports_a_stage_and_no_stage_imports_another():
    assert PACKAGE_DIR.is_dir()
    assert layering_violations(PACKAGE_DIR) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "uamt"
    for name, text in {"__init__.py": "", "stages/__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"lib.py": "from uamt.stages.fetch import run\n"}, "uamt.lib imports uamt.stages.fetch: the library"),
        ({"lib.py": "def f():\n    from uamt import stages\n"}, "uamt.lib imports uamt.stages: the library"),
        ({"cli/x.py": "import uamt.stages.encode\n"}, "uamt.cli.x imports uamt.stages.encode: the library"),
        (
            {"stages/evaluate.py": "from uamt.stages.calibrate import CALIBRATION_DIR\n"},
            "uamt.stages.evaluate imports uamt.stages.calibrate: a stage must not import another stage",
        ),
        (
            {"stages/evaluate.py": "from .calibrate import predict_split\n"},
            "uamt.stages.evaluate imports uamt.stages.calibrate: a stage",
        ),
        (
            {"stages/evaluate.py": "from uamt.stages import calibrate\n"},
            "uamt.stages.evaluate imports uamt.stages.calibrate: a stage",
        ),
    ],
)
def test_a_forbidden_import_is_reported(tmp_path, files, expected):
    problems = layering_violations(_package(tmp_path, files))
    assert any(problem.startswith(expected) for problem in problems), problems


def test_library_imports_and_the_private_stage_helper_are_allowed(tmp_path):
    root = _package(
        tmp_path,
        {
            "lib.py": "from uamt.pipeline_config import read_split\nimport uamt.stagesque\n",
            "stages/_cli.py": "from uamt.core.config import DEFAULT_PARAMS\n",
            "stages/fetch.py": "from uamt.data.fetch import fetch_all\nfrom uamt.stages._cli import stage_main\n",
        },
    )
    assert layering_violations(root) == []
