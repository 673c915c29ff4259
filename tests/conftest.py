"""Shared fixtures: where the offline data mirror is, an isolated working folder, the MLflow stores
of the scoring tests, and the smoke profile's ``make run`` (:func:`smoke`, built once per session)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def find_mirror() -> Path:
    """The offline mirror root: $UAMT_DATA_MIRROR, else ../shared/data/github beside the repo."""
    env = os.environ.get("UAMT_DATA_MIRROR")
    candidate = Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "github"
    if not candidate.is_dir():
        raise RuntimeError(
            f"offline data mirror not found at {candidate}; set UAMT_DATA_MIRROR to the folder laid "
            "out as <owner>/<repo>/<path> (CI: ../shared/data/github)"
        )
    return candidate


@pytest.fixture(scope="session")
def mirror_root() -> Path:
    return find_mirror()


@pytest.fixture(scope="session")
def _uamt_cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("uamt-cache")


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch, _uamt_cache_dir):
    # Tests must never reach a model hub, and must never write to the user's MLflow store or cache
    # (the model-resolution cache of uamt.serving.predictor).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("UAMT_CACHE_DIR", str(_uamt_cache_dir))


# ----------------------------------------------------------------------------- the smoke clone

#: Marks a test that changes the clone of :func:`smoke` (a second ``make run`` in it): it runs after
#: every other test that uses the fixture, whatever order the files were given in.
SMOKE_MUTATES = "smoke_mutates"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{SMOKE_MUTATES}: changes the shared smoke clone; runs after the tests that read it"
    )


def pytest_collection_modifyitems(config, items):
    """Move the :data:`SMOKE_MUTATES` tests right after the last other test using :func:`smoke`
    (collected in order -- tests/test_pipeline_e2e.py, then tests/test_smoke_make_run.py -- they are
    there already; ``pytest tests/test_smoke_make_run.py tests/test_pipeline_e2e.py`` would otherwise
    read the clone after its second ``make run``); then, in an xdist worker (``make test``), put the
    slowest worker groups first (:func:`slowest_groups_first`).  A run in one process keeps the
    collection order."""
    mutating = [item for item in items if item.get_closest_marker(SMOKE_MUTATES)]
    if mutating:
        rest = [item for item in items if not item.get_closest_marker(SMOKE_MUTATES)]
        readers = [n for n, item in enumerate(rest) if "smoke" in getattr(item, "fixturenames", ())]
        at = readers[-1] + 1 if readers else len(rest)
        items[:] = [*rest[:at], *mutating, *rest[at:]]
    if hasattr(config, "workerinput"):  # set by pytest-xdist in its workers only
        items[:] = slowest_groups_first(items)


# ----------------------------------------------------------------------------- parallel runs (make test)

#: The test files that read the :func:`smoke` clone: one worker group, so the clone is built once.
SMOKE_FILES = ("tests/test_pipeline_e2e.py", "tests/test_smoke_make_run.py")
SMOKE_GROUP = "smoke-clone"


def worker_group(nodeid: str) -> str:
    """The group a test runs in under ``make test`` (``pytest -n N --dist loadfile``): its file, the
    files of :data:`SMOKE_FILES` together.  A group runs whole on one worker, in collection order, so a
    module fixture (a Prefect test server, a trained project) is built once and the session fixture
    :func:`smoke` too."""
    path = nodeid.split("::", 1)[0]
    return SMOKE_GROUP if path in SMOKE_FILES else path


def slowest_groups_first(items: list) -> list:
    """``items`` with the :func:`worker_group` of a ``slow`` test first, :data:`SMOKE_GROUP` before
    them (the longest: a whole pipeline in a clone), so the end-to-end runs start at once instead of
    ending the session alone on one worker; each group's tests in their order.  xdist hands out the
    groups in this order (``--no-loadscope-reorder``).  A test that reads :func:`smoke` outside
    :data:`SMOKE_FILES` is refused: its worker would build a second clone."""
    groups: dict[str, list] = {}
    for item in items:
        group = worker_group(item.nodeid)
        if "smoke" in getattr(item, "fixturenames", ()) and group != SMOKE_GROUP:
            raise pytest.UsageError(f"{item.nodeid} reads the smoke clone: add its file to SMOKE_FILES in tests/conftest.py")
        groups.setdefault(group, []).append(item)
    slow = [name for name, members in groups.items() if any(m.get_closest_marker("slow") for m in members)]
    slow.sort(key=lambda name: name != SMOKE_GROUP)
    return [item for name in [*slow, *(g for g in groups if g not in slow)] for item in groups[name]]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with :func:`worker_group` as the unit (xdist's ``loadgroup`` would need
    its node-id suffix, which pytest 9 no longer reads: it stores ids in ``Node._id``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class WorkerGroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return WorkerGroupScheduling(config, log)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory, mirror_root):
    """A fresh ``git clone`` of the committed tree after its first ``make run`` on the smoke profile
    (tests/smoke/harness.py): ``(clone, environment, output of make run)``.

    Built once per session and shared: tests/test_smoke_make_run.py checks the run itself (stages,
    champions, ``uamt score``, a second ``make run``), tests/test_pipeline_e2e.py the outputs it left
    (metrics, registered models).  The tests that change the clone are marked :data:`SMOKE_MUTATES`.
    """
    import shutil

    from tests.smoke import harness
    from uamt.registry.store import SUMMARY_PATH

    root = tmp_path_factory.mktemp("smoke")
    clone = root / "clone"
    env = harness.prepare_clone(clone, mirror_root)
    assert not (clone / "mlflow" / "mlflow.db").exists() and not (clone / SUMMARY_PATH).exists()
    code, seconds, log = harness.make_run(clone, env, root / "make-run-1.log")
    print(f"smoke make run: {seconds:.0f} s")
    assert code == 0, f"make run failed (exit {code}) after {seconds:.0f} s; its output ends:\n{log[-6000:]}"
    yield clone, env, log
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch intra-op thread for a module of tiny models (two thrash on a loaded 2-core machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------- MLflow stores


@pytest.fixture(scope="module")
def scoring_store(tmp_path_factory) -> str:
    """Tracking URI of a sqlite MLflow store in a temp folder holding the fake scoring models.

    One per test module (registering the models takes seconds): REF_MODEL and QE_MODEL with alias
    ``champion``, NO_ALIAS_MODEL without (see ``test_scoring_support.build_store``).
    """
    from test_scoring_support import build_store

    return build_store(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture
def scoring_tracking(scoring_store, monkeypatch) -> str:
    """``MLFLOW_TRACKING_URI`` pointed at :func:`scoring_store` for one test; returns the URI."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", scoring_store)
    return scoring_store


@pytest.fixture
def project_store(tmp_path, monkeypatch) -> str:
    """The project's default store of a run from ``tmp_path`` (``registry.tracking_uri``), empty.

    The test runs in ``tmp_path`` with ``MLFLOW_TRACKING_URI`` unset, so nothing reaches the
    user's own store.
    """
    from uamt.registry import store as registry

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return registry.tracking_uri(root=tmp_path)


@pytest.fixture
def register_constant():
    """A function ``(uri, metrics, name="uamt-test") -> version`` that registers a candidate whose
    pyfunc predicts mu = 0 (run ``register``, tag ``method=hts``, no signature, no artefacts)."""
    import pandas as pd

    import mlflow
    from uamt.registry import store as registry

    class ConstantModel(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return pd.DataFrame({"mu": [0.0] * len(model_input)})

    def register(uri: str, metrics: dict, name: str = "uamt-test") -> str:
        return registry.register_candidate(
            uri,
            name,
            run_name="register",
            python_model=ConstantModel(),
            artifacts={},
            signature=None,
            test_metrics=metrics,
            tags={"method": "hts"},
        )

    return register


@pytest.fixture
def incoming_config(tmp_path):
    """A function ``(**overrides) -> IncomingConfig`` with the incoming folder, pool, manifest, lock
    and pending marker all under ``tmp_path``."""
    from uamt.ingest import IncomingConfig

    def make(**overrides) -> IncomingConfig:
        return IncomingConfig(
            dir=str(tmp_path / "incoming"),
            pool_path=str(tmp_path / "annotations" / "pool.parquet"),
            manifest_path=str(tmp_path / "annotations" / "manifest.json"),
            lock_path=str(tmp_path / ".retrain.lock"),
            pending_path=str(tmp_path / ".retrain.pending"),
            **overrides,
        )

    return make


@pytest.fixture
def markdown_artifacts(monkeypatch):
    """A function ``(flow_module) -> list``: the module's ``create_markdown_artifact`` still runs,
    and the keyword arguments of each call are appended to the returned list."""

    def record(flow_module) -> list[dict]:
        artifacts: list[dict] = []
        real_artifact = flow_module.create_markdown_artifact
        monkeypatch.setattr(
            flow_module, "create_markdown_artifact", lambda **kw: artifacts.append(kw) or real_artifact(**kw)
        )
        return artifacts

    return record
