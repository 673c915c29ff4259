"""`uamt score --input FILE --out DIR [--dask ...]`: partitioned Parquet, Dask workers, restarts, bad input.

The model is the fake calibrated predictor of test_scoring_support, registered as a real MLflow
pyfunc, so loading and scoring run through the same path as `uamt score`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_scoring_support import QE_MODEL, REF_MODEL, write_lines

import mlflow
from uamt.cli import main
from uamt.core.errors import DataError, UamtError
from uamt.registry import store as registry
from uamt.serving import batch
from uamt.serving.batch import BatchSettings, iter_partitions, score_file

SRC = [f"Satz Nummer {i} über das Wetter in Stadt {i % 7}." for i in range(23)]
MT = [f"Sentence number {i} about the weather in town {i % 7}." for i in range(23)]
REF = [f"Sentence {i} on the weather in city {i % 7}." for i in range(23)]
PARTITION_ROWS = 5  # 23 rows: parts of 5, 5, 5, 5, 3


@pytest.fixture(autouse=True)
def _tracking(scoring_tracking):
    # MLflow keeps the URIs in globals; a test that registers into its own scoring_store must not leak it.
    registry.use_store(scoring_tracking)


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "segments.parquet"
    pd.DataFrame({"src": SRC, "mt": MT, "ref": REF, "lp": "de-en"}).to_parquet(path, row_group_size=4)
    return path


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    # Worker processes (not threads), as `--dask local:N` starts them; on loopback only.
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    )
    with Client(cluster) as dask_client:
        yield dask_client
    cluster.close()


def _settings(scoring_store, model=REF_MODEL) -> BatchSettings:
    return BatchSettings(
        model=f"models:/{model}@champion", partition_rows=PARTITION_ROWS, tracking_uri=scoring_store
    )


def _single_process_reference(scoring_store) -> pd.DataFrame:
    """What `uamt score` computes for the whole table in one predict call."""
    from uamt.serving.scores import load_scoring_predictor, predict

    predictor, _ = load_scoring_predictor(f"models:/{REF_MODEL}@champion", has_references=True)
    frame = pd.DataFrame({"src": SRC, "mt": MT, "ref": REF, "lp": "de-en"})
    out = predict(predictor, frame, confidence=0.9, risk_threshold=None, batch_size=64, progress=False)
    out.insert(0, "row", np.arange(len(frame)))
    return out


def _read(out_dir) -> pd.DataFrame:
    return pd.read_parquet(out_dir).sort_values("row").reset_index(drop=True)


def test_partitions_are_fixed_row_ranges_whatever_the_row_groups(table):
    parts = list(iter_partitions(table, PARTITION_ROWS))
    assert [index for index, _ in parts] == [0, 1, 2, 3, 4]
    assert [frame["row"].tolist() for _, frame in parts][-1] == [20, 21, 22]
    assert pd.concat([f for _, f in parts])["mt"].tolist() == MT


def test_single_process_equals_uamt_score(scoring_store, table, tmp_path):
    result = score_file(table, tmp_path / "out", _settings(scoring_store))
    assert (result.n_rows, result.n_partitions, result.n_skipped) == (23, 5, 0)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["_SUCCESS", "_batch.json", *[f"part-{k:05d}.parquet" for k in range(5)]]
    got = _read(tmp_path / "out")
    pd.testing.assert_frame_equal(got, _single_process_reference(scoring_store), check_dtype=False)


def test_cli_batch_rows_equal_cli_text_scoring(scoring_store, table, tmp_path, capsys):
    model = ["--model", f"models:/{REF_MODEL}@champion"]
    assert main(["score", "--input", str(table), "--out", str(tmp_path / "out"), "--no-progress", *model]) == 0
    assert "scored 23 rows in 1 partitions (0 already done)" in capsys.readouterr().err  # default 10,000 rows
    src, mt, ref = (write_lines(tmp_path / f"{n}.txt", lines) for n, lines in (("s", SRC), ("t", MT), ("r", REF)))
    text_out = tmp_path / "text.csv"
    args = ["score", "-s", str(src), "-t", str(mt), "-r", str(ref), "--lp", "de-en", "--out", str(text_out)]
    assert main([*args, *model]) == 0
    text = pd.read_csv(text_out)
    got = _read(tmp_path / "out")
    assert got["row"].tolist() == (text["line"] - 1).tolist()
    for column in ("mu", "sigma", "lower", "upper", "risk"):
        np.testing.assert_allclose(got[column], text[column], rtol=1e-5)  # the CSV keeps 6 digits


FLAG_CASES = {
    # options -> the flag columns both paths must give
    "flag at the risk threshold": (["--flag-below", "0.56", "--max-risk", "0.48"], ["flagged"]),
    "default max-risk": (["--flag-below", "0.56"], ["flagged"]),
    "flag beside another risk threshold": (
        ["--flag-below", "0.56", "--max-risk", "0.48", "--risk-threshold", "0.2"],
        ["flag_risk", "flagged"],
    ),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_cli_batch_flags_equal_cli_text_flags(scoring_store, table, tmp_path, capsys, case):
    options, columns = FLAG_CASES[case]
    model = ["--model", f"models:/{REF_MODEL}@champion"]
    argv = ["score", "--input", str(table), "--out", str(tmp_path / "out"), "--no-progress", "--partition-rows", "5"]
    assert main([*argv, *model, *options]) == 0
    src, mt, ref = (write_lines(tmp_path / f"{n}.txt", lines) for n, lines in (("s", SRC), ("t", MT), ("r", REF)))
    text_out = tmp_path / "text.csv"
    args = ["score", "-s", str(src), "-t", str(mt), "-r", str(ref), "--lp", "de-en", "--out", str(text_out)]
    assert main([*args, *model, *options]) == 0
    text = pd.read_csv(text_out)
    got = _read(tmp_path / "out")
    assert [c for c in ("flag_risk", "flagged") if c in got.columns] == columns
    assert [c for c in ("flag_risk", "flagged") if c in text.columns] == columns
    assert got["flagged"].dtype == bool and got["flagged"].tolist() == text["flagged"].tolist()
    assert 0 < got["flagged"].sum() < len(got), "the fixture has both kinds"
    for column in ("risk", *columns[:-1]):
        np.testing.assert_allclose(got[column], text[column], rtol=1e-5)
    manifest = json.loads((tmp_path / "out" / "_batch.json").read_text())["settings"]
    assert manifest["flag_below"] == 0.56 and manifest["max_risk"] == (0.48 if "--max-risk" in options else 0.5)


def test_restart_with_other_flag_options_is_refused(scoring_store, table, tmp_path):
    flagged = BatchSettings(
        model=f"models:/{REF_MODEL}@champion", partition_rows=PARTITION_ROWS, flag_below=0.5, max_risk=0.3
    )
    score_file(table, tmp_path / "out", flagged)
    for other, changed in (
        (BatchSettings(model=flagged.model, partition_rows=PARTITION_ROWS), "'flag_below', 'max_risk'"),
        (BatchSettings(model=flagged.model, partition_rows=PARTITION_ROWS, flag_below=0.5), "'max_risk'"),
    ):
        with pytest.raises(DataError, match=rf"another batch job \(differs in \[{changed}\]\)"):
            score_file(table, tmp_path / "out", other)
    assert score_file(table, tmp_path / "out", flagged).n_skipped == 5


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"max_risk": 0.3}, "max_risk needs flag_below"),
        ({"flag_below": float("nan")}, "flag_below must be a finite number"),
        ({"flag_below": 0.5, "max_risk": 1.5}, r"max_risk must be a probability in \[0, 1\]"),
    ],
)
def test_bad_flag_settings_are_refused(options, needle):
    with pytest.raises(DataError, match=needle):
        BatchSettings(model="models:/m@champion", **options)


def test_cli_batch_max_risk_needs_flag_below(tmp_path, table, capsys):
    argv = ["score", "--input", str(table), "--out", str(tmp_path / "out"), "--max-risk", "0.2"]
    assert main(argv) == 2
    assert "--max-risk needs --flag-below" in capsys.readouterr().err
    assert main([*argv[:-2], "--flag-below", "0.56", "--max-risk", "2"]) == 2
    assert "argument --max-risk: must be a probability in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_default_model_follows_the_columns(scoring_store, tmp_path, capsys):
    path = tmp_path / "qe.csv"
    pd.DataFrame({"src": SRC[:4], "mt": MT[:4]}).to_csv(path, index=False)
    params = tmp_path / "params.yaml"
    params.write_text(f"register:\n  model_name: {REF_MODEL}\n", encoding="utf-8")
    assert main(["score", "--input", str(path), "--out", str(tmp_path / "out"), "--params", str(params)]) == 0
    manifest = json.loads((tmp_path / "out" / "_batch.json").read_text())
    assert manifest["settings"]["model"] == f"models:/{QE_MODEL}@champion"
    assert len(_read(tmp_path / "out")) == 4


def test_local_cluster_scores_identically(scoring_store, table, tmp_path, client):
    single = score_file(table, tmp_path / "single", _settings(scoring_store))
    on_dask = score_file(table, tmp_path / "dask", _settings(scoring_store), client=client)
    assert on_dask.n_rows == single.n_rows == 23
    pd.testing.assert_frame_equal(_read(tmp_path / "dask"), _read(tmp_path / "single"))
    # Each worker process loaded the model once for all the partitions it scored.
    loads = client.run(batch.model_loads)
    assert sorted(loads.values()) in ([0, 1], [1, 1])


def test_restart_after_a_killed_run_has_no_missing_or_duplicated_rows(scoring_store, table, tmp_path, client):
    out = tmp_path / "out"

    class Killed(Exception):
        pass

    def kill_after_two(line):
        if line.startswith("part 1"):
            raise Killed(line)

    with pytest.raises(Killed):
        score_file(table, out, _settings(scoring_store), log=kill_after_two)
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00000.parquet", "part-00001.parquet"]
    assert not (out / "_SUCCESS").exists()
    # What a kill in the middle of a write leaves: a temp file, and (another way) a truncated part.
    (out / ".part-00002.parquet.abc123.tmp").write_bytes(b"PAR1 half a file")
    (out / "part-00001.parquet").write_bytes((out / "part-00001.parquet").read_bytes()[:40])
    first = (out / "part-00000.parquet").stat().st_mtime_ns

    result = score_file(table, out, _settings(scoring_store), client=client)
    assert (result.n_partitions, result.n_skipped) == (5, 1)  # only part 0 was complete
    assert (out / "part-00000.parquet").stat().st_mtime_ns == first
    assert not list(out.glob(".part-*")) and (out / "_SUCCESS").exists()
    got = _read(out)
    assert got["row"].tolist() == list(range(23))
    pd.testing.assert_frame_equal(got, _single_process_reference(scoring_store), check_dtype=False)


def test_restart_with_other_settings_is_refused(scoring_store, table, tmp_path):
    score_file(table, tmp_path / "out", _settings(scoring_store))
    other = BatchSettings(model=f"models:/{REF_MODEL}@champion", confidence=0.8, partition_rows=PARTITION_ROWS)
    with pytest.raises(DataError, match=r"another batch job \(differs in \['confidence'\]\)"):
        score_file(table, tmp_path / "out", other)


def test_missing_mt_column_names_file_and_column(scoring_store, tmp_path):
    path = tmp_path / "no_mt.csv"
    pd.DataFrame({"src": SRC[:3], "translation": MT[:3]}).to_csv(path, index=False)
    with pytest.raises(DataError, match=r"no_mt\.csv: missing column 'mt'"):
        score_file(path, tmp_path / "out", _settings(scoring_store))
    assert not (tmp_path / "out").exists()  # refused before anything is written
    assert main(["score", "--input", str(path), "--out", str(tmp_path / "out")]) == 2


def test_bad_file_type_is_refused(scoring_store, tmp_path):
    path = write_lines(tmp_path / "segments.txt", SRC)
    with pytest.raises(DataError, match=r"segments\.txt: input format '\.txt' not supported"):
        score_file(path, tmp_path / "out", _settings(scoring_store))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"broken\.parquet: cannot read as parquet"):
        score_file(broken, tmp_path / "out", _settings(scoring_store))


def test_empty_field_names_file_row_and_column(scoring_store, tmp_path):
    path = tmp_path / "segments.csv"
    mt = list(MT[:8])
    mt[6] = ""
    pd.DataFrame({"src": SRC[:8], "mt": mt, "ref": REF[:8]}).to_csv(path, index=False)
    with pytest.raises(DataError, match=r"segments\.csv: row 6: column 'mt' is empty"):
        score_file(path, tmp_path / "out", _settings(scoring_store))


def test_qe_model_given_references_is_refused(scoring_store, table, tmp_path):
    with pytest.raises(Exception, match="reference-free"):
        score_file(table, tmp_path / "out", _settings(scoring_store, QE_MODEL))


def test_batch_options_need_input(tmp_path, capsys):
    src = write_lines(tmp_path / "s.txt", SRC[:2])
    assert main(["score", "-s", str(src), "-t", str(src), "--dask", "local:2"]) == 2
    assert "--dask only apply to batch scoring with --input" in capsys.readouterr().err
    assert main(["score", "-s", str(src)]) == 2
    assert "required: -s/--src, -t/--mt" in capsys.readouterr().err
    with pytest.raises(Exception, match=r"--dask='local:0'"):
        batch.parse_dask("local:0")


class _ConstantModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return pd.DataFrame({"mu": [0.0] * len(model_input)})


def test_registered_model_lists_installed_requirements(tmp_path, monkeypatch):
    from importlib.metadata import version

    from uamt.registry import store as registry
    from uamt.serving.predictor import warn_requirement_mismatches

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    number = registry.register_candidate(
        uri, "uamt-req", run_name="register", python_model=_ConstantModel(), artifacts={}, signature=None,
        test_metrics={},
    )
    mlflow.set_tracking_uri(uri)
    folder = Path(mlflow.artifacts.download_artifacts(f"models:/uamt-req/{number}", dst_path=str(tmp_path / "m")))
    pinned = (folder / "requirements.txt").read_text().split()
    names = [line.split("==")[0] for line in pinned]
    assert "jaraco-text" not in names and {"torch", "unbabel-comet", "mlflow"} <= set(names)
    assert all(version(name) == line.split("==")[1] for name, line in zip(names, pinned, strict=True))
    assert warn_requirement_mismatches(folder) == []
    # An unmet pin is named (jaraco-text, which the models registered before listed, counts as
    # installed once pkg_resources has put setuptools' vendored packages on sys.path).
    (folder / "requirements.txt").write_text("\n".join([*pinned, "uamt-no-such-distribution==1.0"]))
    assert warn_requirement_mismatches(folder) == [
        "uamt-no-such-distribution (current: uninstalled, required: uamt-no-such-distribution==1.0)"
    ]


def test_loading_checks_requirements_itself_and_names_an_unmet_one(scoring_store, tmp_path, monkeypatch, caplog):
    import mlflow.pyfunc as mlflow_pyfunc

    from uamt.serving.predictor import load_predictor

    calls = []
    monkeypatch.setattr(mlflow_pyfunc, "warn_dependency_requirement_mismatches", calls.append)
    folder = Path(mlflow.artifacts.download_artifacts(f"models:/{REF_MODEL}@champion", dst_path=str(tmp_path)))
    with caplog.at_level("WARNING", logger="uamt.serving.predictor"):
        load_predictor(str(folder))
    assert calls == [] and "does not meet" not in caplog.text  # MLflow's slow scan is not run
    requirements = folder / "requirements.txt"
    requirements.write_text(requirements.read_text() + "\nuamt-no-such-distribution==1.0\nnumpy<1.0\n")
    with caplog.at_level("WARNING", logger="uamt.serving.predictor"):
        load_predictor(str(folder))
    assert "uamt-no-such-distribution (current: uninstalled, required: uamt-no-such-distribution==1.0)" in caplog.text
    assert "numpy (current: " in caplog.text and "required: numpy<1.0)" in caplog.text


def test_unreachable_scheduler_is_named(scoring_store, table, tmp_path):
    import dask

    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        with pytest.raises(UamtError, match=r"--dask='tcp://127.0.0.1:9': cannot reach the Dask scheduler"):
            score_file(table, tmp_path / "out", _settings(scoring_store), dask="tcp://127.0.0.1:9")


def test_cli_dask_local_starts_its_own_cluster(scoring_store, table, tmp_path, capsys):
    model = ["--model", f"models:/{REF_MODEL}@champion", "--partition-rows", str(PARTITION_ROWS)]
    assert main(["score", "--input", str(table), "--out", str(tmp_path / "out"), "--dask", "local:1", *model]) == 0
    assert "scored 23 rows in 5 partitions (0 already done)" in capsys.readouterr().err
    pd.testing.assert_frame_equal(_read(tmp_path / "out"), _single_process_reference(scoring_store), check_dtype=False)


def test_campaign_option_with_an_input_table_asks_for_the_column(scoring_store, tmp_path, capsys):
    path = tmp_path / "rows.csv"
    pd.DataFrame({"src": SRC[:2], "mt": MT[:2]}).to_csv(path, index=False)
    assert main(["score", "--input", str(path), "--out", str(tmp_path / "out"), "--campaign", "wmt21_mqm"]) == 2
    assert "drop --campaign (give a campaign column)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
