"""Reliability, round 3: batch scoring (``uamt score --input FILE --out DIR``) whose output cannot lie.

A. A resumed batch never mixes two models: the resolved registry version (and the sha256 of the
   calibration the model ships) is pinned in ``_batch.json``, the workers load that version, and a
   restart with another one is refused with the way out.
B. A resumed batch trusts no part blindly: each part's sha256 and row range are recorded when it
   is written; a part that fails the checksum, cannot be read or holds other rows is scored again
   (and the log says so); a file in the folder that is not a part of the job is refused.
C. Refusals are one line, exit 2, and leave nothing behind: bad ``--dask``, ``--out`` under a file
   or inside the model store's artifacts, ``--lp`` beside an ``lp`` column, a bad ``lp`` value, an
   empty field or a non-UTF-8 byte anywhere in the input (checked before any part is written).
D. Language pairs per row: a batch mixing pairs gets each row's own calibration, rows with an empty
   ``lp`` have theirs detected (and are named in a warning), and ``_batch.json`` says what was used.

The models are the fake registered pyfuncs of test_scoring_support (A-C) and the tiny real uamt
pyfunc of test_reliability_scoring with per-LP calibration (A, D).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_reliability_scoring import fake_encoder, uamt_model  # noqa: F401 - fixtures used below
from test_scoring_support import QE_MODEL, REF_MODEL, FakePredictor, FakePyfunc

import mlflow
from uamt.cli import main
from uamt.core.errors import DataError
from uamt.registry import store as registry
from uamt.serving.batch import BatchSettings, score_file

SRC = [f"Satz Nummer {i} über das Wetter in Stadt {i % 7}." for i in range(23)]
MT = [f"Sentence number {i} about the weather in town {i % 7}." for i in range(23)]
REF = [f"Sentence {i} on the weather in city {i % 7}." for i in range(23)]
PARTITION_ROWS = 5  # 23 rows: parts of 5, 5, 5, 5, 3
PARTS = [f"part-{k:05d}.parquet" for k in range(5)]


@pytest.fixture(autouse=True)
def _tracking(scoring_tracking):
    registry.use_store(scoring_tracking)


@pytest.fixture
def table(tmp_path) -> Path:
    path = tmp_path / "segments.parquet"
    pd.DataFrame({"src": SRC, "mt": MT, "ref": REF}).to_parquet(path, row_group_size=4)
    return path


def _settings(scoring_store, model=f"models:/{REF_MODEL}@champion") -> BatchSettings:
    return BatchSettings(model=model, partition_rows=PARTITION_ROWS, tracking_uri=scoring_store)


class Killed(Exception):
    pass


def _kill_after(part: int) -> Callable[[str], None]:
    """A progress log that stops the run once part ``part`` is written (as a kill would)."""

    def log(line: str) -> None:
        if line.startswith(f"part {part}:"):
            raise Killed(line)

    return log


def _read(out_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(out_dir).sort_values("row").reset_index(drop=True)


def _manifest(out_dir: Path) -> dict:
    return json.loads((out_dir / "_batch.json").read_text(encoding="utf-8"))


# ============================================================================ A. one model per output
@pytest.fixture
def moving_champion(scoring_store):
    """A registered model with two versions, @champion on version 1; yields (name, move_to)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=scoring_store, registry_uri=scoring_store)
    name = f"uamt-batch-pin-{len(client.search_registered_models())}"
    client.create_registered_model(name)
    experiment = client.get_experiment_by_name("scoring-tests").experiment_id  # artifacts in the store's folder
    for _ in range(2):
        with mlflow.start_run(experiment_id=experiment) as run:
            info = mlflow.pyfunc.log_model(
                name="model", python_model=FakePyfunc(FakePredictor(True)), pip_requirements=["mlflow"]
            )
        client.create_model_version(
            name, source=info.model_uri, run_id=run.info.run_id, model_id=getattr(info, "model_id", None)
        )
    client.set_registered_model_alias(name, "champion", "1")
    yield name, lambda version: client.set_registered_model_alias(name, "champion", str(version))


def test_resume_after_the_champion_moved_is_refused(scoring_store, table, tmp_path, moving_champion, capsys):
    """Before: killed after 2 of 5 parts, @champion moved 1 -> 2, same command re-run: parts 0-1 from
    version 1, 2-4 from version 2, ``_SUCCESS`` written, ``_batch.json`` naming only the alias."""
    name, move_to = moving_champion
    out = tmp_path / "out"
    settings = _settings(scoring_store, f"models:/{name}@champion")
    with pytest.raises(Killed):
        score_file(table, out, settings, log=_kill_after(1))
    move_to(2)
    with pytest.raises(DataError) as refused:
        score_file(table, out, settings)
    message = str(refused.value)
    assert str(out) in message
    assert f"scored with {name} version 1" in message and "is now version 2" in message
    assert f"--model models:/{name}/1" in message and "new --out" in message
    assert sorted(p.name for p in out.glob("part-*")) == PARTS[:2] and not (out / "_SUCCESS").exists()
    argv = ["score", "--input", str(table), "--out", str(out), "--model", f"models:/{name}@champion"]
    assert main([*argv, "--partition-rows", str(PARTITION_ROWS)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"uamt score: error: {out}: its parts were scored with")
    pinned = _manifest(out)["model"]
    assert (pinned["name"], pinned["version"], pinned["loaded_as"]) == (name, "1", f"models:/{name}/1")

    # The way out the message gives: finish with the pinned version.
    result = score_file(table, out, _settings(scoring_store, f"models:/{name}/1"))
    assert (result.n_partitions, result.n_skipped) == (5, 2)
    assert _manifest(out)["model"]["version"] == "1" and (out / "_SUCCESS").exists()
    assert _read(out)["row"].tolist() == list(range(23))


def test_workers_load_the_pinned_version_not_the_alias(scoring_store, table, tmp_path, moving_champion, monkeypatch):
    """The alias is resolved once, at the start: moving it during the run changes nothing."""
    from uamt.serving import batch

    name, move_to = moving_champion
    loaded = []
    real = batch.cached_predictor
    monkeypatch.setattr(batch, "cached_predictor", lambda model, uri=None: loaded.append(model) or real(model, uri))

    def move_during_the_run(line: str) -> None:
        if line.startswith("part 1:"):
            move_to(2)

    score_file(table, tmp_path / "out", _settings(scoring_store, f"models:/{name}@champion"), log=move_during_the_run)
    assert set(loaded) == {f"models:/{name}/1"}
    assert _manifest(tmp_path / "out")["model"]["version"] == "1"


@pytest.fixture
def model_copy(uamt_model, tmp_path) -> Path:  # noqa: F811
    return Path(shutil.copytree(uamt_model, tmp_path / "model"))


def test_resume_after_the_calibration_changed_is_refused(model_copy, fake_encoder, table, tmp_path):  # noqa: F811
    """A model folder (``--model DIR``) recalibrated in place between the kill and the restart."""
    from uamt.core.fileio import sha256_file

    settings = BatchSettings(model=str(model_copy), partition_rows=PARTITION_ROWS)
    out = tmp_path / "out"
    with pytest.raises(Killed):
        score_file(table, out, settings, log=_kill_after(1))
    calibration = model_copy / "artifacts" / "calibration.json"
    before = sha256_file(calibration)
    data = json.loads(calibration.read_text())
    data["standardizer"]["global"]["human_std"] *= 2
    calibration.write_text(json.dumps(data))
    with pytest.raises(DataError, match=rf"calibration sha256 {before[:12]}.*now ships calibration sha256 "
                       rf"{sha256_file(calibration)[:12]}.*new --out"):  # fmt: skip
        score_file(table, out, settings)
    assert _manifest(out)["model"]["calibration_sha256"] == before


# ============================================================================ B. parts are verified
def _copy_over(source: str, target: str) -> Callable[[Path], str]:
    def damage(out: Path) -> str:
        shutil.copyfile(out / source, out / target)
        return target

    return damage


def _scramble(name: str) -> Callable[[Path], str]:
    """Flip bytes of the first column chunk (right after the leading ``PAR1``), the footer intact:
    it still says the part holds its rows."""

    def damage(out: Path) -> str:
        import pyarrow.parquet as pq

        rows = pq.read_metadata(out / name).num_rows
        data = bytearray((out / name).read_bytes())
        data[8:32] = bytes(b ^ 0x5A for b in data[8:32])
        (out / name).write_bytes(bytes(data))
        assert pq.read_metadata(out / name).num_rows == rows
        return name

    return damage


def _forget_record(name: str) -> Callable[[Path], str]:
    """A part renamed into place by a run killed before it recorded the part's checksum."""

    def damage(out: Path) -> str:
        manifest = _manifest(out)
        del manifest["parts"][name]
        (out / "_batch.json").write_text(json.dumps(manifest))
        return name

    return damage


def _other_rows(name: str) -> Callable[[Path], str]:
    """The right number of rows, other row ids (the part of another job with the same shape)."""

    def damage(out: Path) -> str:
        frame = pd.read_parquet(out / name)
        frame["row"] = frame["row"] + 100
        frame.to_parquet(out / name, index=False)
        return name

    return damage


@pytest.mark.parametrize(
    "damage, reason",
    [
        pytest.param(_copy_over(PARTS[2], PARTS[3]), "sha256 differs", id="part-copied-over-another"),
        pytest.param(_scramble(PARTS[4]), "sha256 differs", id="bytes-scrambled-footer-intact"),
        pytest.param(_other_rows(PARTS[1]), "sha256 differs", id="other-row-ids"),
        pytest.param(_forget_record(PARTS[2]), "no checksum recorded", id="part-without-a-record"),
    ],
)
def test_resume_scores_again_a_part_that_fails_verification(scoring_store, table, tmp_path, capsys, damage, reason):
    """Before: each damaged part was skipped (right row count in its footer), ``_SUCCESS`` written,
    and ``pd.read_parquet(DIR)`` failed or returned duplicated and missing rows."""
    out = tmp_path / "out"
    score_file(table, out, _settings(scoring_store))
    reference = _read(out)
    name = damage(out)
    argv = ["score", "--input", str(table), "--out", str(out), "--partition-rows", str(PARTITION_ROWS)]
    assert main([*argv, "--model", f"models:/{REF_MODEL}@champion", "--no-progress"]) == 0
    pd.testing.assert_frame_equal(_read(out), reference)
    assert (out / "_SUCCESS").exists()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith(f"uamt score: warning: {name}: ") and reason in err[0], err
    assert err[0].endswith("scoring it again")
    assert "(4 already done, 1 scored again after failing verification)" in err[1]


def test_part_records_hold_checksum_and_row_range(scoring_store, table, tmp_path):
    from uamt.core.fileio import sha256_file

    out = tmp_path / "out"
    score_file(table, out, _settings(scoring_store))
    parts = _manifest(out)["parts"]
    assert sorted(parts) == PARTS
    assert parts[PARTS[4]]["sha256"] == sha256_file(out / PARTS[4])
    assert (parts[PARTS[4]]["rows"], parts[PARTS[4]]["first_row"], parts[PARTS[4]]["last_row"]) == (3, 20, 22)


def test_a_file_that_is_not_a_part_of_the_job_is_refused(scoring_store, table, tmp_path):
    """``pd.read_parquet(DIR)`` reads every file not starting with ``_`` or ``.``: a stray copy of a
    part would be read as data."""
    out = tmp_path / "out"
    score_file(table, out, _settings(scoring_store))
    shutil.copyfile(out / PARTS[0], out / "part-00007.parquet")
    with pytest.raises(DataError, match=r"holds files that are not parts of this batch job \['part-00007\.parquet'\]"):
        score_file(table, out, _settings(scoring_store))


def test_a_folder_written_without_checksums_is_refused_not_trusted(scoring_store, table, tmp_path):
    """A ``_batch.json`` of the earlier layout (no model pin, no part records): its parts cannot be
    verified, so they are not skipped on trust."""
    out = tmp_path / "out"
    score_file(table, out, _settings(scoring_store))
    manifest = _manifest(out)
    old = {k: manifest[k] for k in ("input", "input_bytes", "input_mtime_ns", "settings")}
    (out / "_batch.json").write_text(json.dumps(old))
    with pytest.raises(DataError, match=r"recorded neither the model version nor part checksums.*new --out"):
        score_file(table, out, _settings(scoring_store))


# ============================================================================ C. one-line refusals
@dataclass(frozen=True)
class Refusal:
    """``setup(tmp_path, store)`` writes the input and returns the options after ``score``;
    ``match``: regex on the one error line; ``out``: the --out folder that must not appear."""

    id: str
    setup: Callable[[Path, str], list[str]]
    match: str


def _batch_argv(
    tmp: Path, *extra: str, frame: pd.DataFrame | None = None, name: str = "in.parquet", model: str = f"models:/{REF_MODEL}@champion"
) -> list[str]:
    frame = pd.DataFrame({"src": SRC, "mt": MT, "ref": REF}) if frame is None else frame
    path = tmp / name
    if name.endswith(".csv"):
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    out = [] if "--out" in extra else ["--out", str(tmp / "out")]
    return ["--input", str(path), *out, "--model", model, "--no-progress", *extra]


def _with(column: str, row: int, value, n: int = 23) -> pd.DataFrame:
    frame = pd.DataFrame({"src": (SRC * 30)[:n], "mt": (MT * 30)[:n], "ref": (REF * 30)[:n], "lp": "de-en"})
    frame[column] = frame[column].astype(object)
    frame.loc[row, column] = value
    return frame


def _latin1(tmp: Path, store: str) -> list[str]:
    argv = _batch_argv(tmp, "--partition-rows", "5", frame=_with("lp", 0, "de-en"), name="in.csv")
    path = tmp / "in.csv"
    path.write_bytes(path.read_bytes().replace(MT[17].encode(), MT[17].replace("weather", "Wetter café").encode("latin-1")))
    return argv


def _out_under_a_file(tmp: Path, store: str) -> list[str]:
    (tmp / "file.csv").write_text("a,b\n")
    return _batch_argv(tmp, "--out", str(tmp / "file.csv" / "x"))


def _out_in_artifacts(tmp: Path, store: str) -> list[str]:
    from uamt.registry.store import sqlite_path

    return _batch_argv(tmp, "--out", str(sqlite_path(store).parent / "artifacts" / "scores"))


BATCH_REFUSALS = [
    Refusal("dask-inproc", lambda t, s: _batch_argv(t, "--dask", "inproc://x"), r"--dask='inproc://x' not supported; choose from \['local:N', 'tcp://HOST:PORT'"),
    Refusal("dask-http", lambda t, s: _batch_argv(t, "--dask", "http://127.0.0.1:8786"), r"--dask='http://127.0.0.1:8786' not supported"),
    Refusal("dask-no-port", lambda t, s: _batch_argv(t, "--dask", "tcp://127.0.0.1"), r"--dask='tcp://127.0.0.1' needs HOST:PORT"),
    Refusal("dask-unreachable", lambda t, s: _batch_argv(t, "--dask", "tcp://127.0.0.1:9"), r"cannot reach the Dask scheduler"),
    Refusal("out-under-a-file", _out_under_a_file, r"file\.csv/x: .*file\.csv is a file, not a folder"),
    Refusal("out-in-mlflow-artifacts", _out_in_artifacts, r"artifacts/scores: is inside .*artifacts, the model store's artifacts; write the parts elsewhere"),
    Refusal("lp-flag-and-lp-column", lambda t, s: _batch_argv(t, "--lp", "en-de", frame=_with("lp", 0, "de-en")), r"in\.parquet: has an lp column and --lp en-de was given"),
    Refusal("lp-not-a-pair", lambda t, s: _batch_argv(t, frame=_with("lp", 4, "../../etc/passwd")), r"in\.parquet: row 4: column 'lp' is '\.\./\.\./etc/passwd', not a language pair like 'en-de'"),
    Refusal("lp-newline", lambda t, s: _batch_argv(t, frame=_with("lp", 2, "de-en\nuamt score: done")), r"row 2: column 'lp' is 'de-en\\nuamt score: done', not a language pair"),
    Refusal("lp-number", lambda t, s: _batch_argv(t, frame=_with("lp", 0, "x").assign(lp=7)), r"row 0: column 'lp' must be text, got int"),
    Refusal("empty-mt-at-row-450", lambda t, s: _batch_argv(t, "--partition-rows", "50", frame=_with("mt", 450, "", n=500)), r"in\.parquet: row 450: column 'mt' is empty"),
    Refusal("null-src-at-row-20", lambda t, s: _batch_argv(t, "--partition-rows", "5", frame=_with("src", 20, None)), r"row 20: column 'src' must be text, got nothing \(null\)"),
    Refusal("null-ref-at-row-3", lambda t, s: _batch_argv(t, frame=_with("ref", 3, None)), r"row 3: column 'ref' must be text, got nothing \(null\); a table with a 'ref' column is scored with references in every row: .*reference-free model"),
    Refusal("model-version-missing", lambda t, s: _batch_argv(t, model=f"models:/{REF_MODEL}/9", frame=_with("lp", 0, "de-en")), r"could not load model 'models:/uamt-test/9' from sqlite:///.*/mlflow.db: .*not found"),
    Refusal("model-folder-missing", lambda t, s: _batch_argv(t, model=str(t / "no-model")), r"could not load model '.*no-model': no model folder at"),
    Refusal("qe-model-given-references", lambda t, s: _batch_argv(t, model=f"models:/{QE_MODEL}@champion"), r"is a reference-free \(QE\) model .*but references were given"),
    Refusal("latin1-byte-at-row-17", _latin1, r"in\.csv: row 17: column 'mt' is not valid UTF-8 \(byte 0xe9 at character 40\); convert the file to UTF-8"),
]  # fmt: skip


@pytest.mark.parametrize("case", BATCH_REFUSALS, ids=lambda c: c.id)
def test_batch_refusal_is_one_line_and_leaves_nothing(case, scoring_store, tmp_path, capsys):
    """Before: inproc:// and http:// gave tracebacks, an unreachable scheduler left a new --out folder
    with ``_batch.json``, ``file.csv/x`` raised NotADirectoryError, --out inside the artifacts was
    accepted, --lp beside an lp column was ignored (and recorded), bad lp values were taken as pairs,
    the empty mt at row 450 was refused after 9 parts were written, the latin-1 byte without its row."""
    import dask
    import distributed  # noqa: F401 - its config defaults first: set() below must not remove them on exit

    argv = case.setup(tmp_path, scoring_store)
    out = Path(argv[argv.index("--out") + 1])
    before = sorted(p.name for p in tmp_path.iterdir())
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        code = main(["score", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("uamt score: error: "), err
    assert "Traceback" not in err
    assert re.search(case.match, err), err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# ============================================================================ D. language pairs per row
EN = [f"The weather in town number {i} is very nice and warm today." for i in range(20)]
DE = [f"Das Wetter in der Stadt Nummer {i} ist heute sehr schön und warm." for i in range(20)]
# Simplified Chinese with characters Japanese does not write (这): detected as zh, not doubted as kanji-only Japanese.
ZH = [f"这是第{i}号城市，今天这里的天气非常好，也很暖和。" for i in range(20)]


@pytest.fixture
def two_lp_model(uamt_model, tmp_path) -> Path:  # noqa: F811
    """``uamt_model`` calibrated per LP on en-de (the global fit) and zh-en (twice as wide), every
    other LP widened x1.30: which calibration a row got shows in its sigma."""
    folder = Path(shutil.copytree(uamt_model, tmp_path / "two-lp-model"))
    path = folder / "artifacts" / "calibration.json"
    data = json.loads(path.read_text())
    wide = {**data["standardizer"]["global"], "human_std": 2 * data["standardizer"]["global"]["human_std"]}
    data["standardizer"]["lps"] = {"en-de": dict(data["standardizer"]["global"]), "zh-en": wide}
    data["unseen_lp_sigma_factor"] = 1.3
    path.write_text(json.dumps(data))
    return folder


def _line_mode_sigma(tmp: Path, model: Path, src, mt, ref, lp: str) -> np.ndarray:
    """sigma of ``uamt score -s -t -r --lp LP`` (line mode) for the same rows."""
    files = {}
    for name, lines in (("src", src), ("mt", mt), ("ref", ref)):
        files[name] = tmp / f"{name}-{lp}.txt"
        files[name].write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    out = tmp / f"line-{lp}.csv"
    argv = ["score", "-s", str(files["src"]), "-t", str(files["mt"]), "-r", str(files["ref"]), "--lp", lp]
    assert main([*argv, "--model", str(model), "--out", str(out), "--no-progress"]) == 0
    return pd.read_csv(out)["sigma"].to_numpy()


@pytest.mark.parametrize("partition_rows", [5, 10_000], ids=["pairs-in-separate-partitions", "pairs-in-one-partition"])
def test_a_batch_mixing_language_pairs_gets_each_rows_calibration(two_lp_model, fake_encoder, tmp_path, capsys, partition_rows):  # noqa: F811
    """5 en-de rows then 15 zh-en rows, no lp column, no --lp.  Before: the pair detected on the
    first partition (en-de) was used for all 20 rows (zh-en sigma half what line mode gives)."""
    src, mt, ref = EN[:5] + ZH[:15], DE[:5] + EN[:15], DE[5:10] + EN[5:20]
    pd.DataFrame({"src": src, "mt": mt, "ref": ref}).to_csv(tmp_path / "in.csv", index=False)
    argv = ["score", "--input", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out"), "--model", str(two_lp_model)]
    assert main([*argv, "--partition-rows", str(partition_rows), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "uamt score: detected language pair en-de on 5 rows, zh-en on 15 rows (per row, from the texts)" in err
    got = _read(tmp_path / "out")["sigma"].to_numpy()
    np.testing.assert_allclose(got[:5], _line_mode_sigma(tmp_path, two_lp_model, src[:5], mt[:5], ref[:5], "en-de"), rtol=1e-5)
    np.testing.assert_allclose(got[5:], _line_mode_sigma(tmp_path, two_lp_model, src[5:], mt[5:], ref[5:], "zh-en"), rtol=1e-5)
    lps = _manifest(tmp_path / "out")["lps"]
    assert lps == [
        {"lp": "en-de", "how": "detected", "rows": 5, "seen_in_training": True},
        {"lp": "zh-en", "how": "detected", "rows": 15, "seen_in_training": True},
    ]


@pytest.mark.parametrize("empty", ["", None, "  "], ids=["empty-string", "null", "blank"])
def test_rows_with_an_empty_lp_have_their_pair_detected_and_named(two_lp_model, fake_encoder, tmp_path, capsys, empty):  # noqa: F811
    """An lp column naming zh-en, rows 2 and 3 without a value.  Before: ``""`` crashed with a
    traceback, null was silently given the global calibration (neither en-de's nor zh-en's)."""
    src, mt, ref = ZH[:6], EN[:6], EN[6:12]
    frame = pd.DataFrame({"src": src, "mt": mt, "ref": ref, "lp": ["zh-en", "zh-en", empty, empty, "zh-en", "zh-en"]})
    frame.to_parquet(tmp_path / "in.parquet")
    argv = ["score", "--input", str(tmp_path / "in.parquet"), "--out", str(tmp_path / "out"), "--model", str(two_lp_model)]
    assert main([*argv, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "uamt score: warning: 2 rows have no lp (rows 2, 3): their language pair is detected from their text" in err
    got = _read(tmp_path / "out")["sigma"].to_numpy()
    np.testing.assert_allclose(got, _line_mode_sigma(tmp_path, two_lp_model, src, mt, ref, "zh-en"), rtol=1e-5)
    assert _manifest(tmp_path / "out")["lps"] == [
        {"lp": "zh-en", "how": "column", "rows": 4, "seen_in_training": True},
        {"lp": "zh-en", "how": "detected", "rows": 2, "seen_in_training": True},
    ]


def test_batch_json_records_the_language_pairs_truthfully(two_lp_model, fake_encoder, tmp_path, capsys):  # noqa: F811
    """``--lp`` given (no lp column) on text of that pair: recorded as given, with the rows it covered; an unseen LP in
    the column is warned about (it used to be widened silently)."""
    pd.DataFrame({"src": EN[:4], "mt": DE[:4], "ref": DE[4:8]}).to_csv(tmp_path / "in.csv", index=False)  # an en-de text
    argv = ["score", "--input", str(tmp_path / "in.csv"), "--model", str(two_lp_model), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "given"), "--lp", "en-de"]) == 0
    manifest = _manifest(tmp_path / "given")
    assert manifest["settings"]["lp"] == "en-de" and manifest["lp_column"] is False
    assert manifest["lps"] == [{"lp": "en-de", "how": "given", "rows": 4, "seen_in_training": True}]
    capsys.readouterr()

    pd.DataFrame({"src": DE[:4], "mt": EN[:4], "ref": EN[4:8], "lp": "de-en"}).to_csv(tmp_path / "col.csv", index=False)
    argv[2] = str(tmp_path / "col.csv")
    assert main([*argv, "--out", str(tmp_path / "column")]) == 0
    err = capsys.readouterr().err
    assert "uamt score: language pair de-en was never seen in training (the model knows en-de, zh-en): 4 rows" in err
    manifest = _manifest(tmp_path / "column")
    assert manifest["settings"]["lp"] is None and manifest["lp_column"] is True
    assert manifest["lps"] == [{"lp": "de-en", "how": "column", "rows": 4, "seen_in_training": False}]
