"""uamt.ingest: validation reports, all-or-nothing ingestion, the lock; prepare's pool placement."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from uamt.data.prepare import place_pool_rows
from uamt.data.schema import normalise_source
from uamt.ingest import RetrainBusy, ingest_incoming, read_pool, retrain_lock, validate_file

GOOD = [
    {
        "dataset": "wmt21_mqm",
        "lp": "en-de",
        "src": f"The committee met on day {i}.",
        "mt": f"Der Ausschuss tagte am Tag {i}.",
        "ref": f"Das Komitee traf sich am Tag {i}.",
        "score": -1.5 * (i % 3),
        "system": "sysA",
    }
    for i in range(6)
]


def write_csv(path: Path, rows: list[dict], sep: str = ",") -> Path:
    pd.DataFrame(rows).to_csv(path, index=False, sep=sep)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_good_file_in_every_format(tmp_path, suffix):
    path = tmp_path / f"new{suffix}"
    frame = pd.DataFrame(GOOD).assign(annotator_scores=["-1|-2"] * len(GOOD))
    if suffix == ".parquet":
        frame.to_parquet(path)
    elif suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in frame.to_dict(orient="records")) + "\n")
    else:
        frame.to_csv(path, index=False, sep="\t" if suffix == ".tsv" else ",")
    check = validate_file(path)
    assert check.ok, check.report()
    good = check.good
    assert len(good) == len(GOOD)
    assert good["refs"].iloc[0] == [GOOD[0]["ref"]]
    assert good["annotator_scores"].iloc[0] == [-1.0, -2.0]
    assert good["score_std"].iloc[0] == pytest.approx(np.std([-1, -2], ddof=1))
    assert good["n_annotators"].iloc[0] == 2 and good["domain"].iloc[0] == "news"


def test_every_bad_row_is_named_with_row_line_and_field(tmp_path):
    rows = [dict(r) for r in GOOD]
    rows[0]["score"] = "nan"
    rows[1]["score"] = "very bad"
    rows[2]["score"] = 3.0  # MQM above 0
    rows[3]["src"] = "   "
    rows[4]["lp"] = "xx-yy"
    rows.append(dict(GOOD[5], score=-7.0))  # same system/src/mt as row 6, other score
    rows.append(dict(GOOD[0], dataset="wmt99", src="Another sentence."))
    rows.append(dict(GOOD[0], dataset="wmt21_da", lp="de-en", src="Zwei.", score=21.0))  # DA z > 20
    rows.append(dict(GOOD[0], src="inf row", score="inf"))
    rows.append(dict(GOOD[0], src="no ref", ref=""))
    check = validate_file(write_csv(tmp_path / "bad.csv", rows))
    report = check.report()
    expected = {
        (1, "score"),
        (2, "score"),
        (3, "score"),
        (4, "src"),
        (5, "lp"),
        (6, "score"),
        (7, "score"),
        (8, "dataset"),
        (9, "score"),
        (10, "score"),
        (11, "ref"),
    }
    assert {(p.row, p.field) for p in check.row_problems} == expected, report
    assert "bad.csv: row 3 (line 4): field 'score': 3.0 outside the wmt21_mqm scale [-25.0, 0.0]" in report
    assert "row 9 (line 10): field 'score': 21.0 outside the wmt21_da scale [-20.0, 20.0]" in report
    assert "duplicate of row 7" in report
    assert check.bad_rows == set(range(1, 12)) - set()  # every row here is bad
    assert check.good.empty


def test_missing_renamed_column_and_non_utf8(tmp_path):
    rows = [{("Score" if k == "score" else k): v for k, v in r.items()} for r in GOOD]
    check = validate_file(write_csv(tmp_path / "renamed.csv", rows))
    assert not check.ok and not check.row_problems
    assert "field 'score': required column missing (found 'Score': wrong case?)" in check.report()
    path = tmp_path / "latin1.tsv"
    write_csv(path, GOOD, sep="\t")
    path.write_bytes(path.read_bytes() + "wmt21_mqm\ten-de\tK\xf6ln\tx\ty\t-1\ts\n".encode("latin-1"))
    check = validate_file(path)
    assert "line 8: not valid UTF-8" in check.report()


def test_reject_file_ingests_nothing_and_writes_a_report(tmp_path, incoming_config):
    cfg = incoming_config()
    Path(cfg.dir).mkdir()
    rows = [dict(r) for r in GOOD]
    rows[2]["score"] = float("inf")
    write_csv(Path(cfg.dir) / "batch1.csv", rows)
    result = ingest_incoming(cfg)
    assert result.rejected == ["batch1.csv"] and not result.changed
    assert not Path(cfg.pool_path).exists()
    assert not (Path(cfg.dir) / "batch1.csv").exists()
    report = (Path(cfg.dir) / "rejected" / "batch1.csv.report.txt").read_text()
    assert "row 3 (line 4): field 'score'" in report
    assert (Path(cfg.dir) / "rejected" / "batch1.csv").is_file()


def test_keep_good_takes_good_rows_and_same_file_never_twice(tmp_path, incoming_config):
    cfg = incoming_config(on_bad_rows="keep_good")
    Path(cfg.dir).mkdir()
    rows = [dict(r) for r in GOOD]
    rows[2]["mt"] = ""
    write_csv(Path(cfg.dir) / "batch1.csv", rows)
    result = ingest_incoming(cfg)
    assert result.ingested == ["batch1.csv"] and result.rows_added == 5 and result.rows_rejected == 1
    pool = read_pool(cfg.pool_path)
    assert len(pool) == 5 and set(pool["src"]) == {r["src"] for i, r in enumerate(GOOD) if i != 2}
    assert (Path(cfg.dir) / "processed" / "batch1.csv.report.txt").is_file()
    manifest = json.loads(Path(cfg.manifest_path).read_text())
    assert [f["rows_added"] for f in manifest["files"]] == [5]
    # The same bytes again (under another name): recognised by sha256, not added.
    write_csv(Path(cfg.dir) / "batch1-again.csv", rows)
    again = ingest_incoming(cfg)
    assert again.rejected == ["batch1-again.csv"] and not again.changed
    assert "already ingested" in (Path(cfg.dir) / "rejected" / "batch1-again.csv.report.txt").read_text()
    assert len(read_pool(cfg.pool_path)) == 5
    # A row conflicting with the pool (same system/src/mt, other score) is a bad row.
    conflict = [dict(GOOD[0], score=-20.0), dict(GOOD[0], src="A brand new sentence.")]
    write_csv(Path(cfg.dir) / "batch2.csv", conflict)
    third = ingest_incoming(cfg)
    assert third.rows_added == 1 and third.rows_rejected == 1
    assert len(read_pool(cfg.pool_path)) == 6
    assert not list(Path(cfg.pool_path).parent.glob(".*tmp*"))  # no temp file left behind


def test_lock_lets_one_retrain_at_a_time(tmp_path):
    lock = tmp_path / "data" / ".retrain.lock"
    order = []
    with retrain_lock(lock):
        with pytest.raises(RetrainBusy, match="another retrain is running"):
            with retrain_lock(lock, timeout_s=0.3):
                pass

        def second():
            with retrain_lock(lock, timeout_s=10):
                order.append("second")

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.5)
        order.append("first done")
    thread.join(10)
    assert order == ["first done", "second"]


def test_lock_of_a_killed_holder_is_free_at_once(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    lock = tmp_path / ".retrain.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from uamt.ingest import retrain_lock\nimport time\nwith retrain_lock({str(lock)!r}):\n"
         "    print('held', flush=True)\n    time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lock.read_text().startswith(f"pid {holder.pid} since ")
        with pytest.raises(RetrainBusy, match="another retrain is running"), retrain_lock(lock):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    with retrain_lock(lock):  # the OS dropped the dead holder's lock: no stale lock to clear
        assert lock.read_text().startswith(f"pid {os.getpid()} since ")
    assert lock.is_file()  # kept, as before filelock


def _table(rows):
    frame = pd.DataFrame(rows, columns=["dataset", "lp", "src", "doc", "split"])
    frame["group"] = ["g-" + d for d in frame["doc"]]
    return frame


def test_pool_rows_join_training_pools_never_a_fixed_split():
    base = _table(
        [
            ("wmt21_mqm", "en-de", "Sentence in train.", "docQ", "d_q"),
            ("wmt21_mqm", "en-de", "Sentence in d_e.", "docE", "d_e"),
            ("wmt21_mqm", "en-de", "Sentence in test.", "docT", "test"),
            ("wmt21_mqm", "en-de", "Sentence in dev.", "docD", "dev"),
            ("wmt21_mqm", "en-de", "Second train sentence.", "docQ2", "d_q"),
            ("wmt21_mqm", "en-de", "Other d_e sentence.", "docE2", "d_e"),
        ]
    )
    pool = _table(
        [
            ("wmt21_mqm", "en-de", "A new sentence.", "new1", ""),  # new -> d_q
            ("wmt21_mqm", "en-de", "Another one.", "new1", ""),  # same new doc -> d_q
            ("wmt21_mqm", "en-de", "  sentence IN train. ", "new2", ""),  # source of d_q -> d_q
            ("wmt21_mqm", "en-de", "x", "docE", ""),  # document of d_e -> d_e
            ("wmt21_mqm", "en-de", "Sentence in test.", "new3", ""),  # test source -> dropped
            ("wmt21_mqm", "en-de", "y", "docD", ""),  # dev document -> dropped
            ("wmt21_mqm", "en-de", "Other d_e sentence.", "docQ2", ""),  # bridges d_q and d_e -> dropped
        ]
    ).assign(group="")
    table, stats = place_pool_rows(base, pool)
    assert table.iloc[: len(base)].equals(base)  # published rows untouched
    added = table.iloc[len(base) :]
    assert added["split"].tolist() == ["d_q", "d_q", "d_q", "d_e"]
    assert stats == {
        "rows": 7,
        "placed": {"d_e": 1, "d_q": 3},
        "dropped": {"test": 1, "dev": 1, "d_e+d_q": 1},
    }
    assert added["group"].iloc[2] == "g-docQ" and added["group"].iloc[0] == added["group"].iloc[1]
    keys = table["src"].map(normalise_source)
    assert (table.groupby(keys)["split"].nunique() == 1).all()
    assert (table.groupby("doc")["split"].nunique() == 1).all()
