"""Reliability, round 2: the registry and scoring (issue items 6-14), as tables of cases.

Promise: a clear error naming file / row / field (exit 2 or HTTP 4xx), nothing lost (inputs and
previous outputs byte-identical, no store created or written by a read-only command), and the
champion never degraded.

A. ``uamt score`` / ``compare`` / ``serve`` refusals before any model is loaded (one table):
   CR-only line ends and invisible-only lines (9), ``--out`` naming an input (10), NaN/inf/negative
   options (11), ``/dev/zero`` and the size limits (12).
B. Invisible-only text over REST and through the pyfunc (9).
C. Read-only commands never create a store (7) and never write into the registry (8).
D. The registry store check and the gate (6): a registry that existed and is gone, or was
   replaced, is refused; a new one only on purpose (``uamt registry init`` /
   ``register.allow_new_registry``); a missing champion never lets a candidate pass.
E. A real uamt pyfunc (tiny trained model, fake encoder): corrupt calibration / pickle named (13),
   predictions clipped to the scale's range (14), lines the encoder truncates named (12).
F. The docs' REST example uses a language pair the model knows (UX).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_scoring_support import REF_MODEL, FakePredictor, FakePyfunc, write_lines

import mlflow
from tests.fakes import FEATURES, embed, synthetic_table
from uamt.cli import main
from uamt.core.errors import DataError, UamtError
from uamt.registry import store as registry
from uamt.registry.store import SUMMARY_PATH, Gates

SRC = [f"Der Satz Nummer {i} ist kurz." for i in range(20)]
MT = [f"Sentence number {i} is short." for i in range(20)]
REF = [f"The sentence number {i} is short." for i in range(20)]


def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _files(tmp: Path, *, src=None, mt=None, ref=None, suffix: str = ".txt") -> dict[str, Path]:
    out = {}
    tmp.mkdir(parents=True, exist_ok=True)
    for name, lines in (("src", src or SRC), ("mt", mt or MT), ("ref", ref or REF)):
        path = tmp / f"{name}{suffix}"
        if isinstance(lines, bytes):
            _write(path, lines)
        else:
            write_lines(path, lines)
        out[name] = path
    return out


def _score_argv(tmp: Path, *extra: str, out: str | None = "out/scores.jsonl", **files) -> list[str]:
    f = _files(tmp, **files)
    argv = ["score", "-s", str(f["src"]), "-t", str(f["mt"]), "-r", str(f["ref"])]
    argv += ["--model", f"models:/{REF_MODEL}@champion", "--no-progress", *extra]
    if out:
        (tmp / out).parent.mkdir(parents=True, exist_ok=True)
        argv += ["--out", str(tmp / out)]
    return argv


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<link/dir>")
        for p in sorted(folder.rglob("*"))
    }


# ============================================================================ A. refusals before loading
@dataclass(frozen=True)
class Refusal:
    """``setup(tmp_path)`` writes the input and returns argv; ``match``: regex on the error line."""

    id: str
    item: int  # the item number
    setup: Callable[[Path], list[str]]
    match: str


def _cr_only(tmp: Path) -> list[str]:
    """20 segments per file with classic-Mac line ends: before, scored as ONE segment, exit 0."""
    return _score_argv(
        tmp,
        src="\r".join(SRC).encode() + b"\r",
        mt="\r".join(MT).encode() + b"\r",
        ref="\r".join(REF).encode() + b"\r",
    )


def _invisible(char: str) -> Callable[[Path], list[str]]:
    return lambda tmp: _score_argv(tmp, mt=[MT[0], char * 3, *MT[2:]])


def _out_is(kind: str) -> Callable[[Path], list[str]]:
    def setup(tmp: Path) -> list[str]:
        f = _files(tmp, suffix=".tsv")
        target = f["mt"]
        if kind == "same":
            out = target
        elif kind == "relative":
            out = tmp / "sub" / ".." / "mt.tsv"
            (tmp / "sub").mkdir()
        elif kind == "symlink":
            out = tmp / "link.tsv"
            out.symlink_to(target)
        else:
            out = tmp / "hard.tsv"
            os.link(target, out)
        argv = ["score", "-s", str(f["src"]), "-t", str(target), "-r", str(f["ref"])]
        return [*argv, "--model", f"models:/{REF_MODEL}@champion", "--out", str(out)]

    return setup


def _compare_argv(tmp: Path, *extra: str) -> list[str]:
    f = _files(tmp)
    return ["compare", "-s", str(f["src"]), "-r", str(f["ref"]), "-t", str(f["mt"]), "-t", str(f["mt"]), *extra]


REFUSALS = [
    # ---- 9: line ends and invisible-only lines
    Refusal("cr-only-line-ends", 9, _cr_only, r"src\.txt:1: carriage return \(\\r\) inside the line \(19 of them\).*CR-only"),
    Refusal("stray-cr", 9, lambda t: _score_argv(t, ref=[*REF[:4], "a\rb", *REF[5:]]), r"ref\.txt:5: carriage return"),
    Refusal("nul-line", 9, _invisible("\x00"), r"mt\.txt:2: empty line \(only invisible characters U\+0000"),
    Refusal("bom-line", 9, _invisible("\ufeff"), r"mt\.txt:2: empty line \(only invisible characters U\+FEFF"),
    Refusal("zwsp-line", 9, _invisible("\u200b"), r"mt\.txt:2: empty line \(only invisible characters U\+200B"),
    Refusal("word-joiner-line", 9, _invisible("\u2060 "), r"mt\.txt:2: empty line \(only invisible characters U\+2060"),
    # ---- 10: --out naming an input
    Refusal("out-is-input", 10, _out_is("same"), r"mt\.tsv: is the input file .*mt\.tsv.*must not overwrite an input"),
    Refusal("out-is-input-via-dotdot", 10, _out_is("relative"), r"is the input file .*mt\.tsv"),
    Refusal("out-symlink-to-input", 10, _out_is("symlink"), r"link\.tsv: is the input file .*mt\.tsv"),
    Refusal("out-hardlink-to-input", 10, _out_is("hard"), r"hard\.tsv: is the input file .*mt\.tsv"),
    # ---- 11: options checked by argparse, before anything is read or loaded
    Refusal("risk-threshold-nan", 11, lambda t: _score_argv(t, "--risk-threshold", "nan"),
            r"uamt score: error: argument --risk-threshold: must be a finite number, got 'nan'"),
    Refusal("risk-threshold-inf", 11, lambda t: _score_argv(t, "--risk-threshold", "inf"),
            r"argument --risk-threshold: must be a finite number, got 'inf'"),
    Refusal("flag-below-nan", 11, lambda t: _score_argv(t, "--flag-below", "nan"),
            r"argument --flag-below: must be a finite number, got 'nan'"),
    Refusal("max-risk-nan", 11, lambda t: _score_argv(t, "--flag-below", "-5", "--max-risk", "nan"),
            r"argument --max-risk: must be a finite number, got 'nan'"),
    Refusal("seed-negative", 11, lambda t: _score_argv(t, "--seed", "-1", "--bootstrap", "10"),
            r"argument --seed: must be >= 0, got -1"),
    Refusal("bootstrap-negative", 11, lambda t: _score_argv(t, "--bootstrap", "-3"),
            r"argument --bootstrap: must be >= 0, got -3"),
    Refusal("compare-seed-negative", 11, lambda t: _compare_argv(t, "--seed", "-1"),
            r"uamt compare: error: argument --seed: must be >= 0"),
    Refusal("serve-risk-threshold-nan", 11,
            lambda t: ["serve", "--model", f"models:/{REF_MODEL}@champion", "--risk-threshold", "nan"],
            r"uamt serve: error: argument --risk-threshold: must be a finite number"),
    # ---- 12: size limits
    Refusal("dev-zero", 12, lambda t: [*_score_argv(t, out=None)[:4], "/dev/zero", *_score_argv(t, out=None)[5:]],
            r"/dev/zero:1: segment of more than 400004 bytes without a line break is over the limit of "
            r"100000 characters \(--max-segment-chars\)"),
    Refusal("file-over-limit", 12, lambda t: _score_argv(t, "--max-file-bytes", "100"),
            r"src\.txt: file is over the limit of 100 bytes \(--max-file-bytes\)"),
    Refusal("segment-over-lowered-limit", 12, lambda t: _score_argv(t, "--max-segment-chars", "20"),
            r"src\.txt:1: segment of 27 characters is over the limit of 20 characters"),
    Refusal("max-file-bytes-zero", 12, lambda t: _score_argv(t, "--max-file-bytes", "0"),
            r"argument --max-file-bytes: must be >= 1, got 0"),
]  # fmt: skip


def test_refusal_table_covers_each_item():
    ids = [case.id for case in REFUSALS]
    assert len(ids) == len(set(ids))
    assert {case.item for case in REFUSALS} == {9, 10, 11, 12}


@pytest.mark.parametrize("case", REFUSALS, ids=[c.id for c in REFUSALS])
def test_scoring_refusal_before_loading_leaves_everything_as_it_was(case, tmp_path, capsys, monkeypatch, scoring_tracking):
    import uamt.serving.predictor

    def no_loading(model):
        raise AssertionError("the model was loaded before the input was refused")

    monkeypatch.setattr(uamt.serving.predictor, "load_predictor", no_loading)
    argv = case.setup(tmp_path)
    previous = tmp_path / "out" / "scores.jsonl"
    if previous.parent.is_dir():
        previous.write_bytes(b"previous output\n")
    before = _snapshot(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"uamt {argv[0]}: error: "), lines[0]
    assert re.search(case.match, lines[0]), lines[0]
    assert _snapshot(tmp_path) == before, "a refused run changed or left files"


def test_raised_segment_limit_accepts_a_long_line(tmp_path, capsys, scoring_tracking):
    long_mt = [MT[0], "word " * 30_000, *MT[2:]]  # 150,000 characters: over the default
    assert main(_score_argv(tmp_path, mt=long_mt, out=None)) == 2
    assert "segment of 150000 characters is over the limit of 100000" in capsys.readouterr().err
    assert main(_score_argv(tmp_path, "--max-segment-chars", "200000", mt=long_mt, out=None)) == 0


def test_serve_settings_refuse_a_non_finite_threshold():
    from uamt.serving.rest import ScoringService, ServeSettings

    for bad in (math.nan, math.inf):
        with pytest.raises(UamtError, match="risk threshold must be a finite number"):
            ScoringService(FakePredictor(), "fake", ServeSettings(risk_threshold=bad))


# ============================================================================ B. invisible text: REST, pyfunc
INVISIBLE = ["\x00", "\ufeff", "\u200b", "\u2060", "\u200b\ufeff \u2060"]


@pytest.mark.parametrize("text", INVISIBLE, ids=["nul", "bom", "zwsp", "word-joiner", "mixed"])
def test_rest_refuses_invisible_only_text_with_400(text):
    from uamt.serving.rest import RequestError, ScoringService

    service = ScoringService(FakePredictor(), "fake")
    record = {"src": "Der Hund schläft.", "mt": text, "ref": "The dog is sleeping."}
    with pytest.raises(RequestError) as error:
        service.invocations(json.dumps({"dataframe_records": [record]}).encode())
    assert error.value.status == 400
    assert re.match(r"record 0\.mt is empty \(only invisible characters U\+", error.value.message)
    ok = service.invocations(json.dumps({"dataframe_records": [{**record, "mt": "The dog\u200bsleeps."}]}).encode())
    assert len(ok["predictions"]) == 1  # a zero-width space inside real text is fine


# ============================================================================ C. read-only: no store created or written
@pytest.mark.parametrize("command", ["registry show", "score"])
def test_read_only_command_on_a_missing_database_creates_nothing(command, tmp_path, capsys, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'nothere' / 'x.db'}"
    if command == "registry show":
        argv = ["registry", "show", "--tracking-uri", uri]
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        argv = _score_argv(tmp_path / "in", out=None)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(rf"uamt {argv[0]}: error: .*database {re.escape(str(tmp_path))}/nothere/x\.db does not exist.*", err), err
    assert not (tmp_path / "nothere").exists()


def test_default_store_is_not_created_by_scoring(tmp_path, capsys, monkeypatch):
    """No tracking URI set: neither a registry lookup nor a local model folder creates ./mlflow/."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    argv = _score_argv(tmp_path / "in", out=None)
    assert main(argv) == 2
    assert "mlflow/mlflow.db does not exist" in capsys.readouterr().err
    folder = tmp_path / "model"
    mlflow.pyfunc.save_model(str(folder), python_model=FakePyfunc(FakePredictor()), pip_requirements=["mlflow"])
    argv[argv.index("--model") + 1] = str(folder)
    assert main(argv) == 0
    assert not (tmp_path / "mlflow").exists()
    assert not (tmp_path / "mlruns").exists()


def _store_state(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("model", [f"models:/{REF_MODEL}@champion", f"models:/{REF_MODEL}/1"])
def test_scoring_writes_nothing_into_the_registry(model, tmp_path, capsys, scoring_tracking):
    root = registry.sqlite_path(scoring_tracking).parent
    before = _store_state(root)
    argv = _score_argv(tmp_path, out="scores.jsonl")
    argv[argv.index("--model") + 1] = model
    assert main(argv) == 0, capsys.readouterr().err
    assert not list(root.rglob("registered_model_meta"))
    assert _store_state(root) == before


# ============================================================================ D. the registry (item 6)
class ConstantModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return pd.DataFrame({"mu": [0.0] * len(model_input)})


GOOD = {"ece": 0.01, "crps": 1.0, "pps": 0.30, "low_score_coverage": 0.8, "dev_ece": 0.01}
NAME = "uamt-test"


@pytest.fixture
def quick_log(monkeypatch):
    import functools

    monkeypatch.setattr(
        mlflow.pyfunc, "log_model", functools.partial(mlflow.pyfunc.log_model, pip_requirements=["mlflow"])
    )


def _register(uri: str, metrics: dict = GOOD, *, allow_new: bool = False) -> registry.Decision:
    """What the register stage does for one model: check the store, register, gate, record."""
    registry.prepare_store(uri, allow_new=allow_new)
    version = registry.register_candidate(
        uri, NAME, run_name="register", python_model=ConstantModel(), artifacts={}, signature=None,
        test_metrics=metrics, tags={"method": "hts"},
    )  # fmt: skip
    client = registry._client(uri)
    registry.mark_orphans(client, NAME, keep_version=version)
    decision = registry.gate_and_alias(client, NAME, version, metrics, Gates())
    registry.record_version(uri, NAME)
    return decision


def _stage_params(tmp: Path, uri: str, allow_new: bool = False) -> Path:
    """params.yaml of the register stage; the prepared splits it hashes (``data_version``) exist."""
    prepared = tmp / "prepared"
    prepared.mkdir(exist_ok=True)
    pd.DataFrame({"src": ["a"], "mt": ["b"], "score": [0.0]}).to_parquet(prepared / "test.parquet")
    path = tmp / "params.yaml"
    path.write_text(
        f"pipeline:\n  metrics_dir: {tmp / 'metrics'}\n  prepared_dir: {prepared}\n  register_qe_method: null\n"
        f"register:\n  model_name: {NAME}\n  tracking_uri: {uri}\n  allow_new_registry: {str(allow_new).lower()}\n"
        "encode: {}\n",
        encoding="utf-8",
    )
    return path


def _stage(tmp: Path, uri: str, capsys, allow_new: bool = False) -> tuple[int, str]:
    from uamt.stages import register as stage

    capsys.readouterr()
    code = stage.main(["--params", str(_stage_params(tmp, uri, allow_new))])
    return code, capsys.readouterr().err


@pytest.fixture
def project(tmp_path, monkeypatch, quick_log):
    """A project whose registry holds version 1 (champion) of NAME, registered as the stage does."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    assert main(["registry", "init", "--tracking-uri", uri]) == 0
    assert _register(uri).promote
    return tmp_path, uri


def test_registry_moved_away_is_refused_not_recreated(project, capsys):
    tmp, uri = project
    db = registry.sqlite_path(uri)
    db.rename(tmp / "moved-away.db")  # the issue: mlflow/mlflow.db moved away during a retrain
    code, err = _stage(tmp, uri, capsys, allow_new=True)  # even with allow_new_registry
    assert code == 2
    assert re.search(r"registry .*mlflow\.db is gone, but it existed \(.*uamt-registry\.json records uamt-test versions 1\.\.1 \(@champion 1\)\)", err), err
    assert "models:/NAME/1 would silently name another model" in err
    assert not db.exists(), "a new empty registry was created"
    with pytest.raises(UamtError, match="is gone, but it existed"):
        _register(uri, allow_new=True)
    # A new registry only on purpose: `uamt registry init` refuses without --replace-missing.
    assert main(["registry", "init", "--tracking-uri", uri]) == 2
    assert "--replace-missing" in capsys.readouterr().err and not db.exists()
    assert main(["registry", "init", "--tracking-uri", uri, "--replace-missing"]) == 0
    assert registry.read_marker(uri)["replaces"]["models"][NAME]["latest_version"] == "1"
    # The new marker, not an old registration summary naming the old registry's versions, is the record.
    registry.prepare_store(uri, allow_new=False, expected={NAME: "7"})
    assert _register(uri).promote  # the first version of the new registry, explicitly initialised


def test_previous_registration_summary_also_records_that_a_registry_existed(project, capsys):
    tmp, uri = project
    registry.sqlite_path(uri).unlink()
    registry.marker_path(uri).unlink()
    (tmp / SUMMARY_PATH).write_text(json.dumps({"model_name": NAME, "version": "1"}))
    code, err = _stage(tmp, uri, capsys, allow_new=True)
    assert code == 2 and f"the previous {SUMMARY_PATH} records uamt-test version 1" in err, err
    assert not registry.sqlite_path(uri).exists()


def test_no_registry_needs_init_or_allow_new(tmp_path, capsys, monkeypatch, quick_log):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    code, err = _stage(tmp_path, uri, capsys)
    assert code == 2 and "no registry at" in err and "uamt registry init" in err, err
    assert not (tmp_path / "fresh").exists()
    decision = _register(uri, allow_new=True)
    assert decision.promote and "first version" in decision.reason
    assert registry.read_marker(uri)["created_by"] == "register.allow_new_registry"


def test_a_different_registry_in_its_place_is_refused(project, capsys, quick_log):
    tmp, uri = project
    db = registry.sqlite_path(uri)
    other = f"sqlite:///{tmp / 'other' / 'mlflow.db'}"
    registry.init_store(other)
    _register(other)  # another registry with its own version 1 of the same name
    db.unlink()
    shutil.copy(registry.sqlite_path(other), db)
    with pytest.raises(UamtError, match=r"holds another uamt-test version 1 \(run [0-9a-f]+\).*not the registry"):
        registry.prepare_store(uri, allow_new=True)


def test_unmarked_registry_is_checked_against_the_previous_summary(project):
    """A registry from before markers: the previous registration summary is the record; a mismatch
    is refused and the registry is not adopted (no marker written)."""
    _, uri = project
    registry.marker_path(uri).unlink()
    with pytest.raises(UamtError, match=r"does not hold uamt-test version 3 that the previous mlflow/registration\.json records"):
        registry.prepare_store(uri, allow_new=True, expected={NAME: "3"})
    assert registry.read_marker(uri) is None
    registry.prepare_store(uri, allow_new=False, expected={NAME: "1"})  # the right one: adopted
    assert registry.read_marker(uri)["models"][NAME]["latest_version"] == "1"


def test_empty_unmarked_database_is_not_taken_for_a_registry(tmp_path, quick_log):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    registry._client(uri).search_registered_models()  # an empty database, as old read-only commands made
    with pytest.raises(UamtError, match="holds no model and was not initialised by uamt"):
        registry.prepare_store(uri, allow_new=False)


def test_gate_never_passes_by_absence_of_the_champion(project):
    _, uri = project
    client = registry._client(uri)
    client.delete_registered_model_alias(NAME, "champion")
    decision = _register(uri, {**GOOD, "crps": 5.0, "pps": 0.01})  # far worse than version 1
    assert not decision.promote
    assert "no @champion to compare with, although versions of this model were promoted before" in decision.reason
    assert [r["status"] for r in registry.describe(uri, NAME)] == ["rejected", "passed"]


# ============================================================================ E. a real uamt pyfunc
class FakeEncoder:
    """The test embeddings (tests.fakes) as a PooledEncoder with a whitespace "tokenizer" of 12 tokens."""

    encoder_id = FEATURES.encoder_id
    num_layers, dim = 3, 8
    max_length = 12
    comet_encoder = None

    def __init__(self, config=None):
        self.config = config

    def truncated(self, texts):
        """A word is a token, plus two special tokens."""
        return [i for i, text in enumerate(texts) if len(text.split()) + 2 > self.max_length]

    def pooled_layers(self, texts, batch_size=None, train=False):
        return torch.from_numpy(embed(list(texts)))


def _synthetic(n: int, seed: int) -> pd.DataFrame:
    return synthetic_table(n, seed, texts=("Quelle {seed} {i}", "output {seed} {i}", "reference {seed} {i}"))


@pytest.fixture(scope="module")
def uamt_model(tmp_path_factory, one_torch_thread):
    """A pyfunc folder of UamtPyfunc: a 2-epoch hts on fake embeddings, calibrated onto MQM so that
    the raw Gaussian often goes above 0 (the best MQM score), as the issue measured."""
    from uamt.encoders import EncoderConfig
    from uamt.models import TrainConfig, load, train
    from uamt.serving.calibrated_predictor import scale_for, write_spec
    from uamt.serving.mlflow_pyfunc import UamtPyfunc
    from uamt.serving.model_calibration import Calibration
    from uamt.uncertainty import AffineVarianceCalibrator, FixedVarianceCalibrator, Standardizer

    root = tmp_path_factory.mktemp("uamt-model")
    cfg = TrainConfig(hidden_sizes=(16,), max_epochs=2, batch_size=16, patience=2)
    model_dir = train("hts", cfg, _synthetic(160, 1), _synthetic(40, 2), FEATURES, root / "hts")
    raw = load(model_dir).predict(_synthetic(40, 2), FEATURES)
    standardizer, affine, fixed = Standardizer(), AffineVarianceCalibrator(), FixedVarianceCalibrator()
    pred_std = float(np.sqrt(raw["mu"].var() + (raw["sigma"] ** 2).mean()))
    standardizer.global_params = {"human_mean": 0.0, "human_std": 2.0, "pred_mean": float(raw["mu"].mean()), "pred_std": pred_std}
    affine.global_params = {"alpha": 1.0, "beta": 0.0, "var_floor": 1e-6}
    fixed.global_params = {"var": 1.0}
    Calibration(standardizer, affine, fixed, None).save(root / "calibration.json")
    write_spec(root / "spec.json", EncoderConfig(name="fake"), scale_for(("wmt21_mqm",)), "hts", ("wmt21_mqm",))
    folder = root / "pyfunc"
    mlflow.pyfunc.save_model(
        str(folder),
        python_model=UamtPyfunc(),
        artifacts={"model": str(model_dir), "calibration": str(root / "calibration.json"), "spec": str(root / "spec.json")},
        pip_requirements=["mlflow"],
    )  # fmt: skip
    return folder


@pytest.fixture
def fake_encoder(monkeypatch):
    from uamt.encoders import catalog as encoders

    monkeypatch.setitem(encoders.ENCODERS, "fake", FakeEncoder)


def _corrupt_calibration(change: Callable[[dict], None]) -> Callable[[Path], Path]:
    def apply(folder: Path) -> Path:
        path = folder / "artifacts" / "calibration.json"
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))  # json writes NaN as the literal NaN, as a buggy writer would
        return path

    return apply


def _set(block: str, key: str, value) -> Callable[[dict], None]:
    return lambda data: data[block]["global"].__setitem__(key, value)


def _garbage_pickle(folder: Path) -> Path:
    (folder / "python_model.pkl").write_bytes(b"this is not a pickle\n" * 10)
    return folder / "python_model.pkl"


def _truncated_pickle(folder: Path) -> Path:
    path = folder / "python_model.pkl"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


CORRUPT = {
    "calibration-nan-std": (_corrupt_calibration(_set("standardizer", "human_std", math.nan)),
                            r"calibration\.json: standardizer\[global\]\.human_std = nan is not a number"),
    "calibration-negative-std": (_corrupt_calibration(_set("standardizer", "pred_std", -1.0)),
                                 r"calibration\.json: standardizer\[global\]\.pred_std = -1\.0 must be > 0"),
    "calibration-negative-variance": (_corrupt_calibration(_set("fixed_variance", "var", -0.5)),
                                      r"calibration\.json: fixed_variance\[global\]\.var = -0\.5 must be > 0"),
    "calibration-nan-alpha": (_corrupt_calibration(_set("affine_variance", "alpha", math.nan)),
                              r"calibration\.json: affine_variance\[global\]\.alpha = nan is not a number"),
    "calibration-missing-block": (_corrupt_calibration(lambda d: d.pop("standardizer")),
                                  r"calibration\.json: calibration is missing 'standardizer'"),
    "calibration-not-json": (lambda f: _write(f / "artifacts" / "calibration.json", "{not json"),
                             r"calibration\.json: cannot read calibration"),
    "garbage-python-model-pkl": (_garbage_pickle, r"python_model\.pkl: not a valid pickle"),
    "truncated-python-model-pkl": (_truncated_pickle, r"python_model\.pkl: not a valid pickle"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_model_file_is_named_exit_2(case, uamt_model, fake_encoder, tmp_path, capsys, scoring_tracking):
    folder = Path(shutil.copytree(uamt_model, tmp_path / "model"))
    corrupt, match = CORRUPT[case]
    corrupt(folder)
    argv = _score_argv(tmp_path / "in")
    argv[argv.index("--model") + 1] = str(folder)
    (tmp_path / "in" / "out" / "scores.jsonl").write_bytes(b"previous\n")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("uamt score: error: "), err
    assert re.search(match, err), err
    assert (tmp_path / "in" / "out" / "scores.jsonl").read_bytes() == b"previous\n"


def _jsonl(text: str):
    rows = [json.loads(line) for line in text.splitlines()]
    return rows[:-1], rows[-1]["summary"]


def test_scores_respect_the_scale_bounds(uamt_model, fake_encoder, tmp_path, capsys, scoring_tracking):
    from uamt.serving.predictor import load_predictor

    mt = [*MT[:19], REF[19]]  # the last translation is the reference itself
    argv = _score_argv(tmp_path, "--risk-threshold", "-5", mt=mt, out=None)
    argv[argv.index("--model") + 1] = str(uamt_model)
    assert main(argv) == 0, capsys.readouterr().err
    records, summary = _jsonl(capsys.readouterr().out)
    assert summary["scale"] == "MQM" and summary["scale_range"] == [-25.0, 0.0]
    for r in records:
        assert -25.0 <= r["lower"] <= r["mu"] <= r["upper"] <= 0.0, r
    assert records[-1]["mu"] <= 0.0  # mt = ref: at best 0 (no error), never above
    assert summary["n_clipped"] == sum(r["clipped"] for r in records) > 0
    assert summary["system_upper"] <= 0.0 and "clipped to scale_range" in summary["clipping"]

    # Against the unbounded Gaussian: mu and the interval clipped, risk unchanged inside the range.
    predictor = load_predictor(str(uamt_model))
    frame = pd.DataFrame({"src": SRC, "mt": mt, "ref": REF})
    bounded = predictor.predict_frame(frame, risk_threshold=-5.0)
    predictor.scale = dataclasses.replace(predictor.scale, bounds=None)
    free = predictor.predict_frame(frame, risk_threshold=-5.0)
    assert (free["upper"] > 0).sum() > len(free) // 2 and (free["mu"] > 0).any()  # the numbers
    for column in ("mu", "lower", "upper"):
        np.testing.assert_allclose(bounded[column], np.clip(free[column], -25.0, 0.0))
    np.testing.assert_allclose(bounded["risk"], free["risk"])
    np.testing.assert_allclose(bounded["sigma"], free["sigma"])
    predictor.scale = dataclasses.replace(predictor.scale, bounds=(-25.0, 0.0))
    assert (predictor.predict_frame(frame, risk_threshold=0.0)["risk"] == 1.0).all()  # Q <= 0 always
    assert (predictor.predict_frame(frame, risk_threshold=-30.0)["risk"] == 0.0).all()  # Q >= -25 always


def test_a_spec_without_bounds_takes_them_from_its_datasets(uamt_model, fake_encoder, tmp_path):
    """Models registered before scales carried bounds are clipped too (their spec lists the datasets)."""
    from uamt.serving.predictor import load_predictor

    folder = Path(shutil.copytree(uamt_model, tmp_path / "model"))
    spec_path = folder / "artifacts" / "spec.json"
    spec = json.loads(spec_path.read_text())
    del spec["scale"]["bounds"]
    spec_path.write_text(json.dumps(spec))
    assert load_predictor(str(folder)).scale.bounds == (-25.0, 0.0)


def test_pyfunc_refuses_invisible_only_text(uamt_model, fake_encoder):
    from uamt.serving.predictor import load_predictor

    predictor = load_predictor(str(uamt_model))
    frame = pd.DataFrame({"src": SRC[:2], "mt": [MT[0], "\u200b\u2060"], "ref": REF[:2]})
    with pytest.raises(DataError, match=r"row 1: field 'mt' is empty \(only invisible characters U\+200B, U\+2060\)"):
        predictor.predict_frame(frame)


def test_lines_the_encoder_truncates_are_named(uamt_model, fake_encoder, tmp_path, capsys, scoring_tracking):
    long = "many words " * 20  # 40 words: over the fake encoder's 12 tokens
    argv = _score_argv(tmp_path, mt=[*MT[:3], long, *MT[4:]], ref=[long, *REF[1:]], out="out.jsonl")
    argv[argv.index("--model") + 1] = str(uamt_model)
    assert main(argv) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if ": warning: " in line]
    assert warning == [
        f"uamt score: warning: longer than the encoder reads (12 tokens), scored on their beginning only: "
        f"{tmp_path / 'mt.txt'}: line 4; {tmp_path / 'ref.txt'}: line 1"
    ]
    _, summary = _jsonl((tmp_path / "out.jsonl").read_text())
    assert summary["truncated_lines"] == {str(tmp_path / "mt.txt"): [4], str(tmp_path / "ref.txt"): [1]}
    assert "2 lines truncated by the encoder" in err


# ============================================================================ F. docs
def test_docs_rest_example_uses_a_language_pair_the_model_knows():
    from uamt.data.datasets import DATASET_SPECS
    from uamt.pipeline_config import PipelineConfig

    docs = (Path(__file__).resolve().parents[1] / "docs" / "scoring.md").read_text(encoding="utf-8")
    body = re.search(r"curl .*?-d '(\{.*?\})'", docs, re.S).group(1)
    (record,) = json.loads(body)["dataframe_records"]
    known = {lp for d in PipelineConfig().datasets for lp in DATASET_SPECS[d].lps}
    assert record["lp"] in {"en-de", "zh-en"} and record["lp"] in known


def test_progress_bar_counts_segments(uamt_model, fake_encoder, monkeypatch):
    """The bar counts segments and moves every encoder batch (it used to jump once per 1,024)."""
    import tqdm

    from uamt.serving.predictor import load_predictor

    updates: list[int] = []

    class Recording(tqdm.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(tqdm, "tqdm", Recording)
    predictor = load_predictor(str(uamt_model))
    frame = pd.DataFrame({"src": SRC, "mt": MT, "ref": REF})
    quiet = predictor.predict_frame(frame, risk_threshold=-5.0, batch_size=4)
    shown = predictor.predict_frame(frame, risk_threshold=-5.0, batch_size=4, progress=True)
    pd.testing.assert_frame_equal(quiet, shown)  # chunking does not change a score
    assert updates == [4] * 5  # 20 segments, one update per batch of 4


# ============================================================================ G. REST metadata and LPs (item 17)
def test_metadata_says_what_the_model_was_trained_and_calibrated_on(uamt_model, fake_encoder):
    """/metadata is read from the pyfunc's artefacts: datasets, domains, LPs with their calibration,
    the scale and its range, the calibration in force."""
    from uamt.data.loaders import WMT21_MQM_LPS
    from uamt.serving.predictor import load_predictor
    from uamt.serving.rest import ScoringService

    predictor = load_predictor(str(uamt_model))
    metadata = ScoringService(predictor, str(uamt_model)).metadata()
    assert metadata["method"] == "hts" and metadata["datasets"] == ["wmt21_mqm"]
    assert metadata["domains"] == ["news"]
    assert metadata["language_pairs"] == {lp: "global" for lp in sorted(WMT21_MQM_LPS)}
    assert metadata["scale"] == "MQM" and metadata["scale_range"] == [-25.0, 0.0]
    assert metadata["risk_threshold"] == -5.0 and metadata["max_tokens"] == 12  # FakeEncoder.max_length
    assert metadata["calibration"] == {
        "variance": "affine",
        "conformal": False,
        "reference_factors": {},
        "known_lps": [],
        "unseen_lp_sigma_factor": 1.0,
        "campaigns": {},  # registered without a per-campaign calibration
        "campaigns_too_few_rows": {},
    }
    assert json.loads(json.dumps(metadata)) == metadata  # JSON as it is

    lp = sorted(WMT21_MQM_LPS)[0]
    predictor.calibration.standardizer.lp_params[lp] = dict(predictor.calibration.standardizer.global_params)
    assert ScoringService(predictor, "m").metadata()["language_pairs"][lp] == "per-lp"


@pytest.fixture(scope="module")
def lp_model(uamt_model, tmp_path_factory):
    """``uamt_model`` whose calibration knows en-de and zh-en (the global fit, copied) and widens
    every other LP x1.30, as the calibrate stage fits it."""
    folder = Path(shutil.copytree(uamt_model, tmp_path_factory.mktemp("lp-model") / "model"))
    path = folder / "artifacts" / "calibration.json"
    data = json.loads(path.read_text())
    data["standardizer"]["lps"] = {lp: dict(data["standardizer"]["global"]) for lp in ("en-de", "zh-en")}
    data["unseen_lp_sigma_factor"] = 1.3
    path.write_text(json.dumps(data))
    return folder


def test_unseen_language_pair_is_widened_and_warned_over_rest(lp_model, fake_encoder):
    """An lp the model has no calibration for used to be refused (400), and before that silently got
    the global calibration: now it gets the global calibration widened x1.30, and a warning."""
    from uamt.serving.predictor import load_predictor
    from uamt.serving.rest import ScoringService

    predictor = load_predictor(str(lp_model))
    assert predictor.known_lps == ["en-de", "zh-en"] and predictor.unseen_lp_sigma_factor == 1.3
    service = ScoringService(predictor, str(lp_model))
    metadata = service.metadata()["calibration"]
    assert metadata["known_lps"] == ["en-de", "zh-en"] and metadata["unseen_lp_sigma_factor"] == 1.3
    records = [{"src": SRC[i], "mt": MT[i], "ref": REF[i]} for i in range(3)]
    seen = service.invocations(json.dumps({"dataframe_records": [{**r, "lp": "en-de"} for r in records]}).encode())
    unseen = service.invocations(json.dumps({"dataframe_records": [{**r, "lp": "xx-yy"} for r in records]}).encode())
    assert "warnings" not in seen and [p["lp_seen_in_training"] for p in seen["predictions"]] == [True] * 3
    assert [p["lp_seen_in_training"] for p in unseen["predictions"]] == [False] * 3
    assert [p["calibration"] for p in unseen["predictions"]] == ["global"] * 3
    assert unseen["warnings"] == [
        "language pair xx-yy was never seen in training (the model knows en-de, zh-en): scores are less "
        "reliable and intervals are widened x1.30"
    ]
    # en-de's calibration is the global one copied: the only difference is the widening.
    for a, b in zip(seen["predictions"], unseen["predictions"], strict=True):
        assert b["sigma"] == pytest.approx(1.3 * a["sigma"]) and b["mu"] == pytest.approx(a["mu"])
    plain = service.invocations(json.dumps({"dataframe_records": records}).encode())
    assert "warnings" not in plain and "lp_seen_in_training" not in plain["predictions"][0]  # no lp: global


def test_score_without_lp_detects_the_pair_and_warns_when_unseen(lp_model, fake_encoder, tmp_path, capsys, scoring_tracking):
    """German sources, English translations: de-en is detected, which the model (en-de, zh-en) never
    saw; stderr, the summary line and the summary record say so, and the intervals are widened."""
    argv = _score_argv(tmp_path, out="out.jsonl")
    argv[argv.index("--model") + 1] = str(lp_model)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "uamt score: detected language pair de-en: source de (100% of 20 lines), translation en" in err
    assert "uamt score: language pair de-en was never seen in training (the model knows en-de, zh-en)" in err
    assert "; LP de-en never seen in training: intervals widened x1.30" in err.splitlines()[-1]
    records, summary = _jsonl((tmp_path / "out.jsonl").read_text())
    assert (summary["lp"], summary["lp_source"], summary["lp_seen_in_training"]) == ("de-en", "detected", False)
    assert [w.split(":")[0] for w in summary["warnings"]] == [
        "language pair de-en was never seen in training (the model knows en-de, zh-en)",
        "detected language pair de-en",
    ]
    # --lp of a known pair the German -> English text contradicts: scored as unseen (widened, like
    # the detected de-en), and the warning says so (it used to take en-de's calibration silently).
    argv[argv.index("--out") + 1] = str(tmp_path / "contradicted.jsonl")
    assert main([*argv, "--lp", "en-de"]) == 0
    err = capsys.readouterr().err
    assert "uamt score: the text of 20 of 20 rows contradicts --lp en-de: detected de-en (20)" in err
    contradicted_records, contradicted = _jsonl((tmp_path / "contradicted.jsonl").read_text())
    assert (contradicted["lp"], contradicted["lp_rows_contradicting"]) == ("en-de", 20)
    for a, b in zip(contradicted_records, records, strict=True):
        assert a["sigma"] == pytest.approx(b["sigma"])
    # --lp of an unseen pair the text agrees with: the widened global calibration, and the warning.
    argv[argv.index("--out") + 1] = str(tmp_path / "unseen.jsonl")
    assert main([*argv, "--lp", "de-en"]) == 0
    assert "language pair de-en was never seen in training" in capsys.readouterr().err
    _, unseen = _jsonl((tmp_path / "unseen.jsonl").read_text())
    assert (unseen["lp"], unseen["lp_source"], unseen["lp_seen_in_training"]) == ("de-en", "given", False)
    # English -> German text with --lp en-de: the known pair, no warning, not widened.
    swapped = _score_argv(tmp_path, out="given.jsonl", src=MT, mt=SRC)
    swapped[swapped.index("--model") + 1] = str(lp_model)
    assert main([*swapped, "--lp", "en-de"]) == 0
    assert "language pair" not in capsys.readouterr().err
    given_records, given = _jsonl((tmp_path / "given.jsonl").read_text())
    assert (given["lp"], given["lp_source"], given["lp_seen_in_training"]) == ("en-de", "given", True)
    assert "warnings" not in given
    # The same text with --lp de-en contradicts it: widened x1.30 against en-de (the global fit copied).
    swapped[swapped.index("--out") + 1] = str(tmp_path / "swapped-contradicted.jsonl")
    assert main([*swapped, "--lp", "de-en"]) == 0
    widened_records, _ = _jsonl((tmp_path / "swapped-contradicted.jsonl").read_text())
    for a, b in zip(given_records, widened_records, strict=True):
        assert b["sigma"] == pytest.approx(1.3 * a["sigma"])


def test_batch_score_without_lp_detects_the_pair_and_warns(lp_model, fake_encoder, tmp_path, capsys, scoring_tracking):
    """``uamt score --input`` without ``--lp`` and without an lp column detects the pair on the first
    partition; the parts are scored with it (widened: unseen) and the summary line says so."""
    pd.DataFrame({"src": SRC, "mt": MT, "ref": REF}).to_csv(tmp_path / "in.csv", index=False)
    argv = ["score", "--input", str(tmp_path / "in.csv"), "--out", str(tmp_path / "parts"), "--model", str(lp_model)]
    assert main([*argv, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "uamt score: detected language pair de-en" in err
    assert err.splitlines()[-1].endswith("; LP de-en never seen in training: intervals widened x1.30")
    detected = pd.read_parquet(tmp_path / "parts").sort_values("row")
    # An lp column of a known pair: its calibration, no detection, not widened.
    pd.DataFrame({"src": SRC, "mt": MT, "ref": REF, "lp": "en-de"}).to_csv(tmp_path / "in-lp.csv", index=False)
    argv[argv.index("--input") + 1] = str(tmp_path / "in-lp.csv")
    argv[argv.index("--out") + 1] = str(tmp_path / "given")
    assert main([*argv, "--no-progress"]) == 0
    assert "language pair" not in capsys.readouterr().err
    given = pd.read_parquet(tmp_path / "given").sort_values("row")
    np.testing.assert_allclose(detected["sigma"], 1.3 * given["sigma"])
    # --lp en-de on this German -> English text contradicts it: widened as unseen, with the warning.
    argv[argv.index("--input") + 1] = str(tmp_path / "in.csv")
    argv[argv.index("--out") + 1] = str(tmp_path / "contradicted")
    assert main([*argv, "--no-progress", "--lp", "en-de"]) == 0
    assert "contradicts --lp en-de: detected de-en" in capsys.readouterr().err
    contradicted = pd.read_parquet(tmp_path / "contradicted").sort_values("row")
    np.testing.assert_allclose(contradicted["sigma"], detected["sigma"])


def test_mlflow_predict_still_refuses_an_unknown_language_pair(uamt_model, fake_encoder):
    """MLflow's own predict (``mlflow models serve``) has no channel for a warning: an lp the model
    was neither trained nor calibrated on stays refused there."""
    from uamt.data.loaders import WMT21_MQM_LPS

    lp = sorted(WMT21_MQM_LPS)[0]
    record = {"src": SRC[0], "mt": MT[0], "ref": REF[0]}
    model = mlflow.pyfunc.load_model(str(uamt_model))  # MLflow's own path (mlflow models serve)
    assert len(model.predict(pd.DataFrame([{**record, "lp": lp}]))) == 1
    with pytest.raises(Exception, match=r"row 0: lp 'xx-yy' is not a language pair this model was trained"):
        model.predict(pd.DataFrame([{**record, "lp": "xx-yy"}]))
