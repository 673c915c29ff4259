"""A Prefect test API for the flow tests (imported by tests/test_flows*.py), and its own smoke test.

Workaround, to delete once the dependency pins are fixed: prefect 3.8.8's server modules call
``fastapi.Body(..., min_items=1)``, which fastapi >= 0.142 no longer accepts, so neither
``prefect server start`` nor the ephemeral API nor ``prefect_test_harness`` can start here
(TypeError: Body() got an unexpected keyword argument 'min_items').  :func:`_fastapi_compat`
renames ``min_items``/``max_items`` to ``min_length``/``max_length`` (their pydantic-2 names, the
same constraint) in this process and, through a ``sitecustomize`` on PYTHONPATH, in the API
subprocess the harness starts.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # flows/ lives at the repository root, beside src/
    sys.path.insert(0, str(REPO_ROOT))

SHIM = textwrap.dedent(
    '''
    """Test-only: let prefect 3.8's server import under fastapi without min_items (see tests)."""
    import functools


    def _patch():
        import fastapi
        import fastapi.param_functions as pf

        def wrap(fn):
            if getattr(fn, "_uamt_compat", False):
                return fn

            @functools.wraps(fn)
            def inner(*args, **kwargs):
                if "min_items" in kwargs:
                    kwargs["min_length"] = kwargs.pop("min_items")
                if "max_items" in kwargs:
                    kwargs["max_length"] = kwargs.pop("max_items")
                return fn(*args, **kwargs)

            inner._uamt_compat = True
            return inner

        for name in ("Body", "Query", "Path", "Header", "Cookie", "Form"):
            if hasattr(pf, name):
                setattr(pf, name, wrap(getattr(pf, name)))
                setattr(fastapi, name, getattr(pf, name))


    import importlib.abc
    import sys


    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "prefect.server.api":
                sys.meta_path.remove(self)
                _patch()
            return None


    sys.meta_path.insert(0, _Hook())
    '''
)


def _server_imports() -> bool:
    import subprocess

    probe = subprocess.run(
        [sys.executable, "-c", "import prefect.server.api.server"], capture_output=True, text=True
    )
    return probe.returncode == 0 or "min_items" not in probe.stderr


def _fastapi_compat(folder: Path) -> None:
    """Install the shim for this process and its children (no-op where the server imports as is)."""
    if _server_imports():
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SHIM, encoding="utf-8")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    namespace: dict = {}
    exec(compile(SHIM, str(folder / "sitecustomize.py"), "exec"), namespace)  # same hook, this process
    if "prefect.server.api" in sys.modules:
        namespace["_patch"]()


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A temporary Prefect API (``prefect_test_harness``) with PREFECT_HOME and result storage in tmp.

    Module-scoped: each test module binds this function under its own name, so pytest gives every
    module its own server anyway; a session scope kept all of them (and their background services)
    running to the end of the session, four Prefect servers beside the rest of the suite."""
    home = tmp_path_factory.mktemp("prefect-home")
    saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED", "PYTHONPATH")}
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    _fastapi_compat(home / "compat")
    from prefect.settings import (
        PREFECT_HOME,
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    with temporary_settings(
        {
            PREFECT_HOME: str(home),
            PREFECT_LOCAL_STORAGE_PATH: str(home / "storage"),
            PREFECT_SERVER_ANALYTICS_ENABLED: False,
        }
    ):
        with prefect_test_harness(server_startup_timeout=120):
            yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def cache_key(stage, cfg) -> str:
    """The Prefect cache key the task of ``stage`` (a :class:`flows.dvc_stages.Stage`) gets for ``cfg``."""
    from types import SimpleNamespace

    from flows.dvc_stages import stage_task

    context = SimpleNamespace(task=stage_task(stage))
    return stage.cache_policy().compute_key(task_ctx=context, inputs={"cfg": cfg}, flow_parameters={})


def read_flow_run(flow_run_id):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def test_harness_runs_a_flow_and_creates_an_artifact(prefect_api):
    from prefect import flow, task
    from prefect.artifacts import create_markdown_artifact

    @task
    def add(x: int) -> int:
        return x + 1

    @flow(flow_run_name="tiny-{x}")
    def tiny(x: int):
        return add(add(x)), create_markdown_artifact(markdown="| a |\n|---|\n| 1 |", key="harness-check")

    state = tiny(1, return_state=True)
    value, artifact_id = state.result()
    assert state.is_completed() and value == 3 and artifact_id is not None
    assert read_flow_run(state.state_details.flow_run_id).name == "tiny-1"
