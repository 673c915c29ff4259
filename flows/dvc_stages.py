"""The dvc.yaml stages as Prefect tasks: the one pipeline definition both flows read.

A dvc.yaml stage ``<name>`` (``cmd: python -m uamt.stages.<name>``) becomes a :class:`Stage` whose
``run`` is ``uamt.stages.<name>.run``, and its task is ``task(name=<name>)(run)``: the function
``dvc repro`` runs, under the stage's name.  Its ``deps``, ``outs`` (with ``metrics`` and
``plots``) and ``params`` are read from dvc.yaml, never written down a second time.

Caching (:meth:`Stage.cache_policy`): Prefect's ``INPUTS`` (the stage's config, the frozen
dataclass loaded from params.yaml) + ``TASK_SOURCE`` (the source of ``run``) + :class:`DvcDeps`
(the md5 of every dvc.yaml dep, computed by DVC's own hashing, so a key part is what ``dvc.lock``
records for that dep).  The code deps (``src/...``) are read in the repository beside this file;
the data deps relative to the working directory, as the params.yaml paths are.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prefect import Task, task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy
from prefect.utilities.hashing import hash_objects

from uamt.core.config import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
DVC_FILE = REPO_ROOT / "dvc.yaml"
#: Deps under this prefix are code, read in the repository (the others are data, read in the cwd).
CODE_PREFIX = "src/"
#: Stages that talk to the network (fetch) or the MLflow database (register): Prefect retries them.
RETRIES = {"fetch": 3, "register": 3}
RETRY_DELAYS_S = [10, 30, 60]


def dvc_md5(path: str | Path) -> str:
    """md5 of a file, or ``<md5>.dir`` of a folder, as ``dvc.lock`` records it; ``missing`` if absent.

    DVC's own hashing (``dvc_data``), with the ``.dvcignore`` of the repository (code) or of the
    working directory (data) applied, so ``__pycache__`` never changes a key.
    """
    from dvc.ignore import DvcIgnoreFilter
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs import LocalFileSystem, MemoryFileSystem

    path = Path(path).resolve()
    if not path.exists():
        return "missing"
    root = REPO_ROOT if path.is_relative_to(REPO_ROOT) else Path.cwd().resolve()
    fs = LocalFileSystem()
    staging = HashFileDB(MemoryFileSystem(), "/uamt-flows-staging")  # tree objects only; no file copies
    _, _, obj = build(staging, str(path), fs, "md5", dry_run=True, ignore=DvcIgnoreFilter(fs, str(root)))
    return obj.hash_info.value


def dep_path(dep: str) -> Path:
    """Where a dvc.yaml dep is read: code in the repository, data relative to the working directory."""
    return REPO_ROOT / dep if dep.startswith(CODE_PREFIX) else Path(dep)


@dataclass
class DvcDeps(CachePolicy):
    """Cache-key part: the stage, the working directory and the DVC md5 of each of its ``deps``.

    New data (``data/prepared`` after an ingestion), a retrained upstream model or a changed
    library folder changes the key; a file rewritten with the same bytes does not.  The stage
    name keeps two stages apart, the working directory two checkouts.
    """

    stage: str = ""
    deps: tuple[str, ...] = ()

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        digests = [(dep, dvc_md5(dep_path(dep))) for dep in self.deps]
        return hash_objects(self.stage, str(Path.cwd().resolve()), digests, raise_on_failure=True)


def _entry_path(entry: str | dict) -> str:
    """A dvc.yaml deps/outs entry: a path, or ``{path: {options}}``."""
    return entry if isinstance(entry, str) else next(iter(entry))


@dataclass(frozen=True)
class Stage:
    """One dvc.yaml stage as the flows see it.

    Attributes
    ----------
    name : str
        The dvc stage name = Prefect task name = module ``uamt.stages.<name>``.
    run, load_config : callable
        ``uamt.stages.<name>.run`` and ``.load_config`` (params file -> config dataclass).
    deps, outs, params : tuple of str
        The stage's dvc.yaml ``deps``; ``outs``, ``metrics`` and ``plots``; ``params`` keys.
    retries : int
        Prefect retries (:data:`RETRIES`).
    """

    name: str
    run: Callable
    load_config: Callable[[str | Path], Any]
    deps: tuple[str, ...]
    outs: tuple[str, ...]
    params: tuple[str, ...]
    retries: int = 0

    def cache_policy(self) -> CachePolicy:
        """``INPUTS + TASK_SOURCE + DvcDeps(deps)`` (see the module doc)."""
        return INPUTS + TASK_SOURCE + DvcDeps(stage=self.name, deps=self.deps)

    def outputs_missing(self) -> bool:
        """Whether any dvc.yaml out is absent (then the task runs with ``refresh_cache``)."""
        return not all(Path(out).exists() for out in self.outs)

    def check_params(self, params: str | Path) -> None:
        """Refuse a params file without a key dvc.yaml lists for this stage, as ``dvc repro`` does."""
        values = yaml.safe_load(Path(params).read_text(encoding="utf-8")) or {}
        for key in self.params:
            node = values
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    raise ConfigError(f"{params}: stage {self.name} reads {key!r} (dvc.yaml), which is missing")
                node = node[part]


def stage_from_dvc(name: str, spec: dict[str, Any]) -> Stage:
    """The :class:`Stage` of dvc.yaml stage ``name`` (spec: its mapping in dvc.yaml)."""
    module = importlib.import_module(f"uamt.stages.{name}")
    return Stage(
        name,
        module.run,
        module.load_config,
        deps=tuple(_entry_path(d) for d in spec.get("deps", [])),
        outs=tuple(_entry_path(o) for key in ("outs", "metrics", "plots") for o in spec.get(key, [])),
        params=tuple(spec.get("params", [])),
        retries=RETRIES.get(name, 0),
    )


def read_stages(names: Iterable[str], dvc_file: str | Path = DVC_FILE) -> tuple[Stage, ...]:
    """The stages ``names`` of ``dvc_file``, in the order given."""
    spec = yaml.safe_load(Path(dvc_file).read_text(encoding="utf-8"))["stages"]
    names = list(names)
    missing = [name for name in names if name not in spec]
    if missing:
        raise ValueError(f"{dvc_file}: stage(s) {missing} missing; every flow task needs its dvc stage")
    return tuple(stage_from_dvc(name, spec[name]) for name in names)


def dvc_stage_names(dvc_file: str | Path = DVC_FILE) -> list[str]:
    """Every stage name of ``dvc_file``, in its order."""
    return list(yaml.safe_load(Path(dvc_file).read_text(encoding="utf-8"))["stages"])


def stage_task(stage: Stage, refresh_cache: bool = False) -> Task:
    """The Prefect task of ``stage``: its ``run`` function, wrapped and nothing else."""
    return task(
        name=stage.name,
        retries=stage.retries,
        retry_delay_seconds=RETRY_DELAYS_S if stage.retries else 0,
        cache_policy=stage.cache_policy(),
        persist_result=True,
        refresh_cache=refresh_cache,
    )(stage.run)
