"""dvc.yaml's code deps, generated from the import graph of each stage module.

A stage ``cmd: python -m uamt.stages.<name>`` runs that module and every ``uamt`` module it
imports, transitively (with the ``__init__.py`` of each package on the way, which runs on import).
Those files are the stage's code deps: ``dvc repro`` re-runs the stage when one changes and the
Prefect flows key their cache on them (``flows/dvc_stages.py``).  Listing them by hand rots; this
tool writes them, and ``tests/test_stage_deps.py`` fails when dvc.yaml differs from what it writes::

    python -m uamt.dev.stage_deps --write   # rewrite the code deps of every stage in dvc.yaml
    python -m uamt.dev.stage_deps --check   # list the stages whose code deps differ; exit 1 if any

Rules:

* Imports are read with :mod:`ast` (nothing is imported): ``import uamt.x``, ``from uamt.x import y``
  (``uamt.x.y`` too when it is a module), relative imports, at module level or inside a function
  (a lazy import runs when the stage calls it).  Not counted: imports under ``if TYPE_CHECKING:``
  (never run), and the lazy imports inside the functions of the top-level ``uamt/__init__.py`` (its
  Python API, ``uamt.load_model``, which no stage calls).
* A module that imports by computed name (``importlib.import_module(f"uamt.x.{name}")``) must be
  named in :data:`DYNAMIC_IMPORTS` with the package it imports from (all of whose modules then
  count); one that is not is an error, so no such import is silently missed.
* Package data is read, not imported: :data:`PACKAGE_DATA` names, for each data file or folder
  under ``src/uamt``, the module that reads it while a stage runs; it is a dep of the stages that
  import that module.  A data file missing from the table is an error.
* A folder is listed instead of its files when the stage depends on every file in it (bytecode
  aside, as ``.dvcignore`` has it); otherwise the files are listed one by one.
* In dvc.yaml the generated entries follow the marker comment :data:`MARKER`, at the end of each
  stage's ``deps``; the data deps above it are written by hand and left alone.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from uamt.core.fileio import atomic_write_text

PACKAGE = "uamt"
SRC = "src"
MARKER = "# code: generated from the stage's imports by `python -m uamt.dev.stage_deps --write`"
#: Package data (repository path) -> the module that reads it while a stage runs.
PACKAGE_DATA = {
    # read at import by every analysis that quotes the papers (module-level paper_numbers.values)
    "src/uamt/experiments/paper_numbers.yaml": "uamt.experiments.paper_numbers",
    # the analyses' render() functions are called only by the report builder (the stages exp_*
    # write JSON and figures; the report stage renders the sections)
    "src/uamt/experiments/templates": "uamt.experiments.report",
}
#: Modules that import by computed name (``importlib.import_module(f"...{name}")``) -> the package
#: whose modules they may import that way; every module of it counts as imported.
DYNAMIC_IMPORTS = {
    # render_section imports uamt.experiments.<name> for each name of uamt.experiments.SECTIONS
    "uamt.experiments.report": "uamt.experiments",
    # the package's public names are imported on first use (PEP 562 __getattr__, _EXPORTS)
    "uamt.models": "uamt.models",
}
_DYNAMIC_CALLS = {"import_module", "__import__"}
_STAGE_CMD = re.compile(rf"python -m ({PACKAGE}\.stages\.[A-Za-z0-9_]+)")
_IGNORED = ("__pycache__",)


class StageDepsError(ValueError):
    """An import names a ``uamt`` module that does not exist, or package data no table names."""


def module_file(root: Path, name: str) -> Path | None:
    """The source file of module ``name`` under ``root/src`` (module or package), or None."""
    base = root / SRC / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.Module, top_level_only: bool) -> Iterable[ast.Import | ast.ImportFrom]:
    """The import statements that run: everywhere (functions too), minus ``if TYPE_CHECKING:`` bodies;
    only the module body's own statements when ``top_level_only``."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
        elif not top_level_only or isinstance(node, (ast.If, ast.Try)):
            todo.extend(ast.iter_child_nodes(node))


def imports_of(root: Path, name: str) -> set[str]:
    """The ``uamt`` modules that module ``name`` imports (see the module docstring for the rules)."""
    path = module_file(root, name)
    if path is None:
        raise StageDepsError(f"{name}: no such module under {root / SRC}")
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set(_dynamic_imports(root, name, path, tree))
    for node in _import_nodes(tree, top_level_only=name == PACKAGE):
        if isinstance(node, ast.Import):
            targets = [(alias.name, []) for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [(base, [alias.name for alias in node.names])]
        for module, names in targets:
            if module.split(".")[0] != PACKAGE:
                continue
            if module_file(root, module) is None:
                raise StageDepsError(
                    f"{path}:{node.lineno}: imports {module}, which is not a module under {SRC}/"
                )
            found.add(module)
            found.update(f"{module}.{n}" for n in names if module_file(root, f"{module}.{n}") is not None)
    return found


def _dynamic_imports(root: Path, name: str, path: Path, tree: ast.Module) -> set[str]:
    """What ``importlib.import_module(...)`` / ``__import__(...)`` calls in ``tree`` can import."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called not in _DYNAMIC_CALLS or not node.args:
            continue
        target = node.args[0]
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            if target.value.split(".")[0] == PACKAGE:
                found.add(target.value)
        elif name in DYNAMIC_IMPORTS:
            package = DYNAMIC_IMPORTS[name]
            folder = module_file(root, package).parent
            found |= {f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
            found |= {f"{package}.{d.name}" for d in folder.iterdir() if (d / "__init__.py").is_file()}
        else:
            raise StageDepsError(
                f"{path}:{node.lineno}: imports by computed name; name the package it imports from in "
                "uamt.dev.stage_deps.DYNAMIC_IMPORTS"
            )
    return found


def closure(root: Path, module: str, cache: dict[str, set[str]] | None = None) -> set[str]:
    """``module`` and every ``uamt`` module it imports, transitively, with their parent packages.

    ``cache`` (module -> its imports) is shared between the stages of one run: each file is parsed once.
    """
    cache = {} if cache is None else cache
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        parts = name.split(".")
        parents = [".".join(parts[:i]) for i in range(1, len(parts))]
        seen.add(name)
        todo += [p for p in parents if p not in seen]
        if name not in cache:
            cache[name] = imports_of(root, name)
        todo += sorted(cache[name] - seen)
    return seen


def _files_under(path: Path) -> set[Path]:
    if path.is_file():
        return {path}
    return {
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part in _IGNORED for part in p.parts) and p.suffix != ".pyc"
    }


def unlisted_package_data(root: Path) -> list[str]:
    """Files under ``src/uamt`` that are neither Python nor covered by :data:`PACKAGE_DATA`."""
    covered = set().union(*(_files_under(root / data) for data in PACKAGE_DATA))
    return sorted(
        p.relative_to(root).as_posix()
        for p in _files_under(root / SRC / PACKAGE)
        if p.suffix != ".py" and p not in covered
    )


def collapse(root: Path, files: set[Path]) -> list[str]:
    """Repository paths of ``files``, a folder standing for its files where all of them are in."""
    out: set[str] = set()
    left = set(files)
    top = root / SRC / PACKAGE
    folders = sorted(
        (d for d in top.rglob("*") if d.is_dir() and d.name not in _IGNORED), key=lambda d: len(d.parts)
    )
    for folder in folders:
        inside = _files_under(folder)
        if inside and inside <= left:
            out.add(folder.relative_to(root).as_posix())
            left -= inside
    return sorted(out | {p.relative_to(root).as_posix() for p in left})


def code_deps(root: Path, module: str, cache: dict[str, set[str]] | None = None) -> list[str]:
    """The code deps of the stage that runs ``python -m module``: its own file first, then the rest."""
    missing = unlisted_package_data(root)
    if missing:
        raise StageDepsError(
            f"package data no stage is known to read: {missing}; name its reader in PACKAGE_DATA"
        )
    modules = closure(root, module, cache)
    files = {module_file(root, m) for m in modules}
    for data, reader in PACKAGE_DATA.items():
        if reader in modules:
            files |= _files_under(root / data)
    own = module_file(root, module)
    # listed first, and never folded into its folder (which then stands for no other stage's file)
    return [own.relative_to(root).as_posix(), *collapse(root, files - {own})]


def stage_modules(dvc: dict) -> dict[str, str]:
    """Stage name -> the uamt module its ``cmd`` runs (stages running anything else are left out)."""
    out = {}
    for name, stage in (dvc.get("stages") or {}).items():
        match = _STAGE_CMD.fullmatch(str(stage.get("cmd", "")).strip())
        if match:
            out[name] = match.group(1)
    return out


def generated(root: Path, dvc_text: str) -> str:
    """``dvc_text`` with the code deps of every uamt stage regenerated after :data:`MARKER`.

    Only the lines of each stage's ``deps:`` list that name ``src/`` (and the marker) are replaced;
    everything else, comments included, is kept byte for byte.
    """
    modules = stage_modules(yaml.safe_load(dvc_text))
    cache: dict[str, set[str]] = {}
    written: set[str] = set()
    lines = dvc_text.splitlines(keepends=True)
    out: list[str] = []
    stage = None
    i = 0
    while i < len(lines):
        line = lines[i]
        header = re.fullmatch(r"  ([A-Za-z0-9_-]+):\s*", line.rstrip("\n"))
        if header:
            stage = header.group(1)
        out.append(line)
        i += 1
        if stage in modules and line.rstrip() == "    deps:":
            block = []
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > 4):
                block.append(lines[i])
                i += 1
            trailing = []
            while block and not block[-1].strip():
                trailing.insert(0, block.pop())
            items = [b for b in block if b.lstrip().startswith("- ")]
            pad = " " * (_indent(items[0]) if items else 6)
            kept = [b for b in block if not (b.lstrip().startswith("- src/") or b.strip() == MARKER)]
            out += (
                kept
                + [f"{pad}{MARKER}\n"]
                + [f"{pad}- {dep}\n" for dep in code_deps(root, modules[stage], cache)]
            )
            out += trailing
            written.add(stage)
    lacking = sorted(set(modules) - written)
    if lacking:
        raise StageDepsError(
            f"dvc.yaml: stages {lacking} have no `deps:` list (indented 4 spaces) to write into"
        )
    return "".join(out)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def differences(root: Path, dvc_path: Path) -> list[str]:
    """One line per stage whose ``src/`` deps in ``dvc_path`` are not the generated ones: the files
    it lacks (a stale result would go unnoticed), the files it names that the stage does not import
    (needless re-runs), or only the way they are written (run ``--write``)."""
    dvc = yaml.safe_load(dvc_path.read_text(encoding="utf-8"))
    problems = []
    cache: dict[str, set[str]] = {}
    for name, module in stage_modules(dvc).items():
        have = [d if isinstance(d, str) else next(iter(d)) for d in dvc["stages"][name].get("deps") or []]
        have = [d for d in have if d.startswith(f"{SRC}/")]
        want = code_deps(root, module, cache)
        if have == want:
            continue
        have_files = set().union(set(), *(_files_under(root / d) for d in have))
        want_files = set().union(*(_files_under(root / d) for d in want))
        lacking = sorted(p.relative_to(root).as_posix() for p in want_files - have_files)
        extra = sorted(p.relative_to(root).as_posix() for p in have_files - want_files)
        gone = [d for d in have if not (root / d).exists()]
        what = [
            f"lacks {lacking}" if lacking else "",
            f"names files it does not import {extra}" if extra else "",
            f"names paths that do not exist {gone}" if gone else "",
        ]
        problems.append(f"stage {name}: {'; '.join(w for w in what if w) or 'written differently'}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m uamt.dev.stage_deps", description=__doc__.split("\n\n")[0]
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the code deps in dvc.yaml")
    action.add_argument("--check", action="store_true", help="exit 1 when dvc.yaml's code deps differ")
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root (default: .)")
    args = parser.parse_args(argv)
    dvc_path = args.root / "dvc.yaml"
    if not dvc_path.is_file() or not (args.root / SRC / PACKAGE).is_dir():
        parser.error(f"{args.root.resolve()}: not the repository root (needs dvc.yaml and {SRC}/{PACKAGE}/)")
    try:
        if args.write:
            text = dvc_path.read_text(encoding="utf-8")
            new = generated(args.root, text)
            if new != text:
                atomic_write_text(dvc_path, new)
            print(f"{dvc_path}: code deps {'rewritten' if new != text else 'already up to date'}")
            return 0
        problems = differences(args.root, dvc_path)
    except StageDepsError as exc:
        print(f"stage_deps: error: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"{dvc_path}: {problem}", file=sys.stderr)
    if problems:
        print("run: python -m uamt.dev.stage_deps --write", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
