"""Reliability, round 3: the registry's store -- where it is, what state it is in, who reads it.

A tiny but real project (a 2-epoch ``hts`` on fake embeddings, its calibration, test metrics and
prepared splits) is registered by the register stage into its default store (``mlflow/`` of the
project, ``uamt registry init`` first, as ``make run`` does) and scored with ``uamt score``, every
command run from the project root with no ``MLFLOW_TRACKING_URI``, as a user runs them.

A. A checkout copied (``cp -a``), copied without the registry's marker, or moved: every command
   refuses its store (it would read and write the original's files); the README's way out works.
B. One tracking URI for every command: ``uamt serve`` in a clean environment (a subprocess).
C. A store that is empty (0 bytes), corrupt, locked, or of an older schema: one line, exit 2, the
   file unchanged.
D. Registration leaves no temporary folder; registering without prepared splits is refused.
E. ``uamt registry show`` names the model and rounds metrics; a copied virtual environment is named.
F. ``$MLFLOW_REGISTRY_URI``: the user's, never one MLflow exported; registering into a separate registry is
   refused, serving from one names it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_reliability_scoring import FakeEncoder, _synthetic
from test_scoring_support import write_lines

from uamt.cli import main
from uamt.registry import store as registry

MODEL = "uamt-store-test"
REPO = Path(__file__).resolve().parents[1]
SRC = ["Der Hund schläft.", "Das Wetter ist schön."]
MT = ["The dog sleeps.", "The weather is nice."]
REF = ["The dog is sleeping.", "The weather is beautiful."]


# ============================================================================ a tiny project
@pytest.fixture(scope="module")
def project_template(tmp_path_factory, one_torch_thread) -> Path:
    """A project folder as the pipeline leaves it before ``register``: ``models/hts``,
    ``calibration/hts.json``, ``metrics/{test,ood}.json``, ``data/prepared/*.parquet``, a
    ``params.yaml`` for the register stage (fake encoder, torch runtime) and three input files."""
    from tests.fakes import FEATURES
    from uamt.models import TrainConfig, load, train
    from uamt.serving.model_calibration import Calibration
    from uamt.uncertainty import AffineVarianceCalibrator, FixedVarianceCalibrator, Standardizer

    root = tmp_path_factory.mktemp("template")
    cfg = TrainConfig(hidden_sizes=(16,), max_epochs=2, batch_size=16, patience=2)
    model_dir = train("hts", cfg, _synthetic(160, 1), _synthetic(40, 2), FEATURES, root / "models" / "hts")
    raw = load(model_dir).predict(_synthetic(40, 2), FEATURES)
    standardizer, affine, fixed = Standardizer(), AffineVarianceCalibrator(), FixedVarianceCalibrator()
    pred_std = float(np.sqrt(raw["mu"].var() + (raw["sigma"] ** 2).mean()))
    standardizer.global_params = {"human_mean": -2.0, "human_std": 2.0, "pred_mean": float(raw["mu"].mean()), "pred_std": pred_std}
    affine.global_params = {"alpha": 1.0, "beta": 0.0, "var_floor": 1e-6}
    fixed.global_params = {"var": 1.0}
    (root / "calibration").mkdir()
    Calibration(standardizer, affine, fixed, None).save(root / "calibration" / "hts.json")
    (root / "metrics").mkdir()
    (root / "metrics" / "test.json").write_text(json.dumps({"hts": {"avg": {"ece": 0.01, "crps": 1.0, "pps": 0.3}}}))
    (root / "metrics" / "dev.json").write_text(json.dumps({"hts": {"avg": {"ece": 0.01}}}))  # the gate's dev ECE
    (root / "metrics" / "conditional.json").write_text(json.dumps({"hts": {"low_score_coverage": 0.8}}))
    (root / "metrics" / "ood.json").write_text(json.dumps({"hts": {"avg": {"crps": 1.1}}}))
    (root / "data" / "prepared").mkdir(parents=True)
    _synthetic(20, 3).to_parquet(root / "data" / "prepared" / "test.parquet")
    params = {
        "pipeline": {"datasets": ["wmt21_mqm"], "methods": ["point", "hts"], "register_method": "hts",
                     "qe_methods": ["hts"], "register_qe_method": None},
        "register": {"model_name": MODEL, "serving_runtime": "torch"},
        "encode": {"encoder": {"name": "fake", "runtime": "torch"}},
    }  # fmt: skip
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    for name, lines in (("src", SRC), ("mt", MT), ("ref", REF)):
        write_lines(root / f"{name}.txt", lines)
    return root


@pytest.fixture
def as_user(monkeypatch):
    """A function ``(folder)``: work from ``folder`` with no MLflow URI in the environment (MLflow
    itself exports the URIs it was last given to ``os.environ``)."""

    def enter(folder: Path) -> None:
        monkeypatch.chdir(folder)
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)

    return enter


@pytest.fixture
def fake_encoder(monkeypatch):
    from uamt.encoders import catalog

    monkeypatch.setitem(catalog.ENCODERS, "fake", FakeEncoder)


def _register_stage(folder: Path, as_user, capsys) -> tuple[int, str]:
    """``dvc repro -f -s register`` in ``folder``: the stage, from the project root."""
    from uamt.stages import register as stage

    as_user(folder)
    capsys.readouterr()
    code = stage.main(["--params", "params.yaml"])
    return code, capsys.readouterr().err


@pytest.fixture
def project(project_template, tmp_path, as_user, capsys, fake_encoder) -> Path:
    """Checkout ``A``: ``uamt registry init`` then the register stage (version 1, champion)."""
    folder = Path(shutil.copytree(project_template, tmp_path / "A"))
    as_user(folder)
    assert main(["registry", "init"]) == 0
    code, err = _register_stage(folder, as_user, capsys)
    assert code == 0, err
    return folder


@pytest.fixture
def initialised(project_template, tmp_path, as_user) -> Path:
    """Checkout ``A`` after ``uamt registry init`` only (no version registered yet)."""
    folder = Path(shutil.copytree(project_template, tmp_path / "A"))
    as_user(folder)
    assert main(["registry", "init"]) == 0
    return folder


def _score(folder: Path, as_user, capsys, model: str = f"models:/{MODEL}@champion") -> tuple[int, str, str]:
    as_user(folder)
    capsys.readouterr()
    argv = ["score", "-s", "src.txt", "-t", "mt.txt", "-r", "ref.txt", "--model", model, "--no-progress"]
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _run_id(folder: Path) -> str:
    """The run of the registered version (from the registry's marker)."""
    return registry.read_marker(f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}")["models"][MODEL]["run_id"]


# ============================================================================ A. copied or moved checkouts
def _copy(a: Path, b: Path) -> None:
    shutil.copytree(a, b, symlinks=True)  # cp -a


def _copy_without_marker(a: Path, b: Path) -> None:
    _copy(a, b)
    (b / "mlflow" / f"mlflow.db{registry.MARKER_SUFFIX}").unlink()


def _move(a: Path, b: Path) -> None:
    a.rename(b)


HOW = {"cp -a": _copy, "copied without the marker": _copy_without_marker, "mv": _move}
EVIDENCE = {
    "cp -a": r"its marker .*mlflow\.db\.uamt-registry\.json records it at .*/A/mlflow/mlflow\.db",
    "copied without the marker": r"the (files of models:/|artifacts of run ).* are at .*/A/mlflow/artifacts/.*, outside .*/B/mlflow",
    "mv": r"its marker .*records it at .*/A/mlflow/mlflow\.db",
}


@pytest.mark.parametrize("how", sorted(HOW))
def test_a_copied_or_moved_checkout_never_uses_the_original_store(how, project, as_user, capsys):
    """Before: in B, `uamt score` read A's MLmodel and pickle (exit 0), registering wrote ~200 MB into
    A's mlflow/artifacts; with A moved away, "Could not find MLmodel at /tmp/uamt-model-...". Now
    every command refuses B's store, names the evidence and the way out, and writes nothing."""
    a, b = project, project.parent / "B"
    run_id = _run_id(a)
    HOW[how](a, b)
    original = a if a.exists() else None
    before = _tree(original / "mlflow") if original else None
    refusal = rf"registry .*/B/mlflow/mlflow\.db was copied or moved from another place: {EVIDENCE[how]}.*" \
              r"move .*/B/mlflow aside, then run `uamt registry init` and `dvc repro -f -s register`"  # fmt: skip
    for model in (f"models:/{MODEL}@champion", f"models:/{MODEL}/1", f"runs:/{run_id}/model"):
        code, out, err = _score(b, as_user, capsys, model)
        assert code == 2 and out == "", err
        assert len(err.strip().splitlines()) == 1 and re.search(refusal, err), (model, err)
    code, err = _register_stage(b, as_user, capsys)
    stage_refusal = refusal.replace(r"the (files of models:/|artifacts of run )", "the artifacts of experiment 'uamt'")
    assert code == 2 and re.search(stage_refusal.replace("artifacts/.*", "artifacts"), err), err
    if how != "copied without the marker":  # show has no model files to look at without a marker
        as_user(b)
        assert main(["registry", "show", "--name", MODEL]) == 2
        assert re.search(refusal, capsys.readouterr().err)
        assert main(["registry", "init"]) == 2
        assert re.search(refusal, capsys.readouterr().err)
    if original:
        assert _tree(original / "mlflow") == before, "the original store was written"


def test_the_readme_way_out_of_a_copied_checkout_works(project, as_user, capsys):
    """README: move mlflow/ aside, `uamt registry init`, `dvc repro -f -s register` (versions restart
    at 1); afterwards B scores with its own files and A's store is untouched."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for step in ("rm -rf .venv && make setup", "uamt registry init", "dvc repro -f -s register"):
        assert step in readme, step
    a, b = project, project.parent / "B"
    _copy(a, b)
    before = _tree(a / "mlflow")
    (b / "mlflow").rename(b / "mlflow.copied")
    as_user(b)
    assert main(["registry", "init"]) == 0
    code, err = _register_stage(b, as_user, capsys)
    assert code == 0, err
    assert json.loads((b / "mlflow" / "registration.json").read_text())["version"] == "1"
    code, out, err = _score(b, as_user, capsys)
    assert code == 0, err
    assert len([line for line in out.splitlines() if '"mu"' in line]) == len(SRC)
    assert list((b / "mlflow" / "artifacts").rglob("MLmodel"))
    assert _tree(a / "mlflow") == before
    code, out, err = _score(a, as_user, capsys)  # and A still serves its own
    assert code == 0, err


# ============================================================================ B. one tracking URI for every command
LAUNCHER = (
    "import sys; sys.path[:0] = {paths!r}; "
    "from uamt.encoders import catalog; from test_reliability_scoring import FakeEncoder; "
    "catalog.ENCODERS['fake'] = FakeEncoder; from uamt.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _user_env(cache: Path) -> dict[str, str]:
    """The environment of a user who activated the virtual environment: no MLflow URI exported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return {**env, "UAMT_CACHE_DIR": str(cache), "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}


def test_serve_uses_the_projects_store_in_a_clean_environment(project, tmp_path):
    """Before: without MLFLOW_TRACKING_URI, `uamt serve` loaded the model (from the resolution cache
    `uamt score` left), then looked the alias up in MLflow's default store: a traceback, and a stray
    mlflow.db in the working folder. Now /health names version and alias from the project's store."""
    launcher = [sys.executable, "-c", LAUNCHER.format(paths=[str(REPO / "src"), str(REPO), str(REPO / "tests")])]
    env = _user_env(tmp_path / "cache")
    store = project / "mlflow" / "mlflow.db"
    before = store.stat().st_size
    scored = subprocess.run(
        [*launcher, "score", "-s", "src.txt", "-t", "mt.txt", "-r", "ref.txt", "--no-progress",
         "--model", f"models:/{MODEL}@champion"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr[-3000:]
    proc = subprocess.Popen(
        [*launcher, "serve", "--port", "0", "--model", f"models:/{MODEL}@champion"],
        cwd=project, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines, deadline = [], time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "http://" in line or (not line and proc.poll() is not None):
                break
        match = re.search(r"http://127\.0\.0\.1:(\d+)", lines[-1])
        assert match, "".join(lines)[-3000:]
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=60)
        conn.request("GET", "/health")
        response = conn.getresponse()
        health = json.loads(response.read())
        conn.close()
        assert response.status == 200
        assert (health["model"], health["version"], health["alias"]) == (f"models:/{MODEL}@champion", "1", "champion")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stderr.close()
    assert not (project / "mlflow.db").exists(), "a stray mlflow.db in the working folder"
    assert not (project / "mlruns").exists()
    assert store.stat().st_size == before


# ============================================================================ C. empty, corrupt, locked, old stores
def _empty(db: Path) -> None:
    db.write_bytes(b"")


def _corrupt(db: Path) -> None:
    db.write_bytes(b"this is not an MLflow database\n" * 200)


def _older_schema(db: Path) -> None:
    with sqlite3.connect(db) as connection:
        connection.execute("DROP TABLE registered_model_aliases")
    connection.close()


STATES = {
    "empty": (_empty, r"database .*/mlflow\.db holds no MLflow tables \(0 bytes\)"),
    "corrupt": (_corrupt, r"tracking store .*/mlflow\.db: the database is corrupt \(file is not a database\)"),
    "locked": (None, r"tracking store .*/mlflow\.db: the database is locked by another process"),
    "older-schema": (_older_schema, r"tracking store .*/mlflow\.db: lacks the tables \['registered_model_aliases'\]"),
}
STAGE_REFUSALS = {  # the register stage's words where they differ from the read-only commands'
    "empty": r"registry .*/mlflow\.db is empty \(0 bytes, no MLflow tables\), but it existed",
}
COMMANDS = ["registry show", "score", "register stage"]
#: Registering may migrate a store of an older schema, as MLflow does; only reads must not.
CASES = [(s, c) for s in sorted(STATES) for c in COMMANDS if (s, c) != ("older-schema", "register stage")]


@pytest.mark.parametrize(("state", "command"), CASES, ids=[f"{s}-{c}" for s, c in CASES])
def test_a_broken_store_is_one_line_and_left_as_it_was(state, command, request, as_user, capsys, monkeypatch):
    """Before: a 76-line SQLAlchemy traceback (corrupt, locked), and a 0-byte mlflow.db grew to
    954 KB under the read-only `registry show` / `score` (MLflow initialised it); a store of an
    older schema would be migrated. Now: exit 2, one line naming the file, the file byte-identical.
    Every refusal comes before a model is looked up, so only the register stage needs one registered."""
    project = request.getfixturevalue("project" if command == "register stage" else "initialised")
    db = project / "mlflow" / "mlflow.db"
    make, match = STATES[state]
    holder = None
    if make is None:
        monkeypatch.setattr(registry, "LOCK_WAIT_S", 0.2)
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
    else:
        make(db)
    content = db.read_bytes() if holder is None else None
    try:
        as_user(project)
        capsys.readouterr()
        if command == "registry show":
            code, err = main(["registry", "show", "--name", MODEL]), capsys.readouterr().err
        elif command == "score":
            code, _, err = _score(project, as_user, capsys)
        else:
            code, err = _register_stage(project, as_user, capsys)
            match = STAGE_REFUSALS.get(state, match)
    finally:
        if holder is not None:
            holder.execute("ROLLBACK")
            holder.close()
    lines = [line for line in err.strip().splitlines() if not line.startswith("INFO ")]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert re.search(match, lines[0]), lines[0]
    if content is not None:
        assert db.read_bytes() == content, "the store was changed"


# ============================================================================ D. what a registration leaves
def test_registration_leaves_no_temporary_folder(project_template, tmp_path, as_user, capsys, monkeypatch, fake_encoder):
    """Before: every registration left a /tmp/uamt-spec-* folder per model (87 MB with the ONNX encoder)."""
    folder = Path(shutil.copytree(project_template, tmp_path / "A"))
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    as_user(folder)
    assert main(["registry", "init"]) == 0
    code, err = _register_stage(folder, as_user, capsys)
    assert code == 0, err
    assert not list(temp.glob("uamt-spec-*"))


@pytest.mark.parametrize("missing", ["folder", "splits"])
def test_registering_without_prepared_splits_is_refused(missing, project_template, tmp_path, as_user, capsys, fake_encoder):
    """Before: registered, with data_version e3b0c44298fc (the hash of nothing). Now refused before
    the store is touched: a registered version must name the data it was trained on."""
    folder = Path(shutil.copytree(project_template, tmp_path / "A"))
    prepared = folder / "data" / "prepared"
    shutil.rmtree(prepared)
    if missing == "splits":
        prepared.mkdir()
    as_user(folder)
    assert main(["registry", "init"]) == 0
    db = folder / "mlflow" / "mlflow.db"
    before = db.read_bytes()
    code, err = _register_stage(folder, as_user, capsys)
    state = "does not exist" if missing == "folder" else r"holds no prepared split \(\*\.parquet\)"
    assert code == 2 and re.search(rf"stage register: error: data/prepared: {state}, .*nothing was registered", err), err
    assert db.read_bytes() == before
    assert not (folder / "mlflow" / "registration.json").exists()


# ============================================================================ E. registry show, the environment
def test_registry_show_names_the_model_and_rounds_metrics(project_store, register_constant, capsys):
    """Before: no model name, and `0.012345678901234567`-style 17-digit floats."""
    register_constant(project_store, {"ece": 0.012345678901234567, "crps": 1.2345678901234567, "pps": 0.30000000000000004})
    capsys.readouterr()
    assert main(["registry", "show", "--name", "uamt-test", "--tracking-uri", project_store]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"model uamt-test in .*/mlflow/mlflow\.db: 1 version, no @champion", out[0]), out[0]
    row = out[2].split()
    assert row[:2] == ["1", "pending"] and row[-3:] == ["0.01235", "1.235", "0.3"], out[2]
    assert not re.search(r"\d{6,}", "\n".join(out[1:]))


@pytest.mark.parametrize(
    ("layout", "warns"),
    [("another checkout's code", True), ("this checkout's code", False), ("not a checkout", False)],
)
def test_a_virtual_environment_from_another_checkout_is_named(layout, warns, tmp_path, monkeypatch, capsys):
    """A `.venv` copied with `cp -a` runs the original's Python and code: said on every command."""
    import uamt

    folder = tmp_path / "B"
    if layout == "another checkout's code":
        (folder / "src" / "uamt").mkdir(parents=True)
        (folder / "src" / "uamt" / "__init__.py").write_text("")
    elif layout == "this checkout's code":
        folder.mkdir()
        (folder / "src").symlink_to(Path(uamt.__file__).resolve().parents[1])
    else:
        folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["registry", "show", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    err = capsys.readouterr().err
    warning = re.search(r"uamt: warning: this is the checkout .*/B, but the uamt code running is .*src/uamt .*rm -rf \.venv && make setup", err)
    assert bool(warning) == warns, err


# ============================================================================ F. a separate registry
def test_the_registry_uri_is_the_users_not_one_mlflow_exported(tmp_path, monkeypatch):
    """MLflow's ``set_registry_uri`` exports ``$MLFLOW_REGISTRY_URI``: a store used earlier in the
    process must not become the registry of the next one; a value the user set is honoured."""
    first, second = (f"sqlite:///{tmp_path / name / 'mlflow.db'}" for name in ("first", "second"))
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    assert registry.registry_uri(first) == first
    assert registry.use_store(first) == first
    assert "MLFLOW_REGISTRY_URI" not in os.environ  # MLflow's export is taken back
    assert registry.registry_uri(second) == second
    assert registry.registry_origin(second) == second
    user = f"sqlite:///{tmp_path / 'user' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", user)
    assert registry.registry_uri(second) == user
    assert registry.registry_origin(second) == (
        f"{user} (the registry $MLFLOW_REGISTRY_URI names; tracking store {second})"
    )


def test_a_separate_registry_is_refused_for_registering_and_named_when_serving(
    project, tmp_path, as_user, capsys, monkeypatch
):
    """Before: the register stage wrote the tracking store's registry while `uamt score` looked the
    champion up in the registry $MLFLOW_REGISTRY_URI names, and its error named neither."""
    other = f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}"
    assert main(["registry", "init", "--tracking-uri", other]) == 0
    db = project / "mlflow" / "mlflow.db"
    before = db.read_bytes()
    as_user(project)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", other)
    from uamt.stages import register as stage

    capsys.readouterr()
    assert stage.main(["--params", "params.yaml"]) != 0
    err = capsys.readouterr().err
    assert f"$MLFLOW_REGISTRY_URI={other} names another registry than the tracking store" in err, err
    assert db.read_bytes() == before
    argv = ["score", "-s", "src.txt", "-t", "mt.txt", "-r", "ref.txt", "--model", f"models:/{MODEL}@champion"]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"from {other} (the registry $MLFLOW_REGISTRY_URI names; tracking store" in err, err
    # The same store spelled another way (a relative path) is the tracking store's own registry.
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", "sqlite:///mlflow/mlflow.db")
    assert main([*argv, "--no-progress"]) == 0, capsys.readouterr().err
    assert main(["registry", "show", "--name", MODEL]) == 0, capsys.readouterr().err


def test_numbers_measured_after_register_are_attached_to_the_registered_version(project, as_user):
    """evaluate_ood runs after register: what it measured is logged to the registered version's run
    and the version tagged; a registration the store does not hold, or a broken summary, is refused
    naming the summary; without one there is nothing to attach to."""
    from uamt.core.config import load_section
    from uamt.core.errors import DataError
    from uamt.registry.register import OOD_TAG, RegisterSettings, attach_to_registered

    as_user(project)
    reg = load_section(RegisterSettings, "register", project / "params.yaml")
    extra = project / "metrics" / "held_out.json"
    extra.write_text(json.dumps({"hts": {"lps": ["aa-zz"]}}))
    assert attach_to_registered(reg, {"ood.hts.avg.pps": 0.25, "nan": float("nan")}, {"metrics": [extra]}) == [f"{MODEL}/1"]
    client = registry._client(registry.tracking_uri(None))
    version = client.get_model_version(MODEL, "1")
    assert version.tags[OOD_TAG] == "true"
    run = client.get_run(version.run_id)
    assert run.data.metrics["ood.hts.avg.pps"] == 0.25 and "nan" not in run.data.metrics
    assert "test.hts.avg.pps" in run.data.metrics  # what register logged stays
    assert "metrics/held_out.json" in [f.path for f in client.list_artifacts(version.run_id, "metrics")]

    summary = project / "mlflow" / "registration.json"
    kept = summary.read_text()
    summary.write_text(json.dumps({**json.loads(kept), "version": "9"}))
    with pytest.raises(DataError, match=rf"registration\.json: {MODEL} version 9 is not in the store"):
        attach_to_registered(reg, {"x": 1.0}, {})
    summary.write_text("{")
    with pytest.raises(DataError, match=r"registration\.json: not valid JSON"):
        attach_to_registered(reg, {"x": 1.0}, {})
    summary.unlink()
    assert attach_to_registered(reg, {"x": 1.0}, {}) == []
