"""How ``make test`` splits the suite over pytest-xdist workers (tests/conftest.py, ``worker_group``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, SMOKE_FILES, SMOKE_GROUP, slowest_groups_first, worker_group

E2E, MAKE_RUN = SMOKE_FILES


class Item:
    """The parts of a collected pytest item that :func:`slowest_groups_first` reads."""

    def __init__(self, nodeid: str, *, fixtures: tuple[str, ...] = (), slow: bool = False) -> None:
        self.nodeid, self.fixturenames = nodeid, fixtures
        self.markers = [pytest.mark.slow.mark] if slow else []

    def get_closest_marker(self, name: str):
        return next((m for m in self.markers if m.name == name), None)


def test_files_stay_whole_the_smoke_clone_is_one_group_and_goes_first_then_slow_files():
    items = [
        Item("tests/test_a.py::test_one"),
        Item("tests/test_a.py::test_two"),
        Item("tests/test_data.py::test_slow", slow=True),
        Item(f"{E2E}::test_reads", fixtures=("smoke",), slow=True),
        Item(f"{E2E}::test_another", fixtures=("run", "smoke"), slow=True),
        Item("tests/test_b.py::test_quick"),
        Item(f"{MAKE_RUN}::test_reads_too", fixtures=("tmp_path", "smoke"), slow=True),
        Item(f"{MAKE_RUN}::test_changes_the_clone", fixtures=("smoke",), slow=True),
        Item("tests/test_retrain.py::test_slow", slow=True),
    ]
    ordered = slowest_groups_first(list(items))

    assert [item.nodeid for item in ordered] == [
        f"{E2E}::test_reads",
        f"{E2E}::test_another",
        f"{MAKE_RUN}::test_reads_too",
        f"{MAKE_RUN}::test_changes_the_clone",  # the clone's readers keep their order
        "tests/test_data.py::test_slow",
        "tests/test_retrain.py::test_slow",
        "tests/test_a.py::test_one",
        "tests/test_a.py::test_two",
        "tests/test_b.py::test_quick",
    ]
    assert [worker_group(item.nodeid) for item in ordered] == [
        *[SMOKE_GROUP] * 4, "tests/test_data.py", "tests/test_retrain.py", "tests/test_a.py", "tests/test_a.py",
        "tests/test_b.py",
    ]


def test_a_test_reading_the_smoke_clone_elsewhere_is_refused():
    with pytest.raises(pytest.UsageError, match=r"tests/test_new\.py::test_reads reads the smoke clone: add its file to SMOKE_FILES"):
        slowest_groups_first([Item("tests/test_new.py::test_reads", fixtures=("smoke",))])


def test_under_xdist_the_smoke_clone_is_built_once_and_each_file_runs_on_one_worker(tmp_path):
    """The groups reach xdist: in a ``make test``-like run (two workers, ``--dist loadfile``) of a
    stand-in project, a ``smoke`` session fixture read by both :data:`SMOKE_FILES` is built once, and
    every file's tests run on one worker."""
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    log = tmp_path / "log.txt"
    (project / "conftest.py").write_text(
        "import os\n\nimport pytest\n\n"
        "from tests.conftest import pytest_collection_modifyitems, pytest_configure, pytest_xdist_make_scheduler  # noqa: F401\n\n\n"
        "def record(what):\n"
        "    with open(os.environ['WORKER_LOG'], 'a') as f:\n"
        "        f.write(f\"{what} {os.environ.get('PYTEST_XDIST_WORKER')}\\n\")\n\n\n"
        "@pytest.fixture(scope='session')\n"
        "def smoke():\n"
        "    record('build')\n\n\n"
        "@pytest.fixture(autouse=True)\n"
        "def _where(request):\n"
        "    record(request.node.nodeid.split('::')[0])\n"
    )
    reader = "def test_reads_{n}(smoke):\n    pass\n\n\n"
    (project / E2E).write_text("".join(reader.format(n=n) for n in range(3)))
    (project / MAKE_RUN).write_text("import pytest\n\n\n@pytest.mark.slow\n" + "".join(reader.format(n=n) for n in range(3, 6)))
    for k in range(6):
        (project / f"tests/test_other_{k}.py").write_text("".join(f"def test_{n}():\n    pass\n\n\n" for n in range(3)))
    env = {
        **os.environ,
        "WORKER_LOG": str(log),
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
         "--no-loadscope-reorder", "-W", "ignore::pytest.PytestUnknownMarkWarning", "tests"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "24 passed" in done.stdout
    lines = [line.split() for line in log.read_text().splitlines()]
    assert sum(what == "build" for what, _ in lines) == 1, lines
    workers_by_group: dict[str, set] = {}
    for what, worker in lines:
        if what != "build":
            workers_by_group.setdefault(worker_group(what + "::"), set()).add(worker)
    assert len(workers_by_group) == 7 and all(len(workers) == 1 for workers in workers_by_group.values()), workers_by_group
    assert len({w for workers in workers_by_group.values() for w in workers}) == 2  # both workers had work
