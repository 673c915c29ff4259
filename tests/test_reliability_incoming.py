"""Reliability, round 2: retraining on new annotations (docs/guarantees.md, "Retraining on new
annotations (round 2)").

The promise: a bad incoming file gets a clear error naming file, row and field; nothing is lost
(the good files beside it are ingested, rows ingested are always trained); the champion is never
degraded.

* :data:`BAD_FILES` -- one bad file placed before a good one: the bad one goes to ``rejected/`` with
  a report matching ``match``, the good one is ingested, the folder is empty afterwards (no file
  blocks later ticks);
* :data:`ACCEPTED` -- inputs that must NOT be errors;
* duplicates by content (the same file re-exported with CRLF line ends), the write-then-rename
  convention and ``settle_s``, withdrawing a file;
* a retrain interrupted after ingestion (a stage raising) is finished by the next tick;
* the Prefect API server started by ``python -m flows.retrain`` survives Ctrl-C and dies with a
  SIGKILLed parent; Prefect's telemetry is off;
* params: a section given as a list, non-finite score bounds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_flows_harness as harness
import yaml
from test_flows_harness import REPO_ROOT

from uamt.core.config import ConfigError, load_section
from uamt.ingest import (
    IncomingConfig,
    ingest_incoming,
    load_config,
    read_pending,
    read_pool,
    validate_file,
    withdraw,
)
from uamt.ingest.config import DERIVED, journal_file
from uamt.registry.store import SUMMARY_PATH

prefect_api = harness.prefect_api  # module fixture: a temporary Prefect API

HEADER = "dataset,lp,src,mt,ref,score,system"
ROW = {"dataset": "wmt21_mqm", "lp": "en-de", "src": "Hallo.", "mt": "Hello.", "ref": "Hi.", "system": "s"}
SECRET = "SECRET-LINE-must-never-be-copied"


def good_csv(n: int = 3, first: int = 0, newline: str = "\n") -> str:
    rows = [
        f"wmt21_mqm,en-de,Source {i}.,Translation {i}.,Reference {i}.,-{i % 5},sysA" for i in range(first, n)
    ]
    return newline.join([HEADER, *rows]) + newline


def jsonl(**over) -> str:
    return json.dumps({**ROW, "score": -1, **over}) + "\n"


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def outside_file(tmp: Path) -> Path:
    return write(tmp / "elsewhere" / "private.csv", f"{HEADER}\n{SECRET},en-de,a,b,c,-1,s\n")


def symlink(tmp: Path, name: str, target: Path) -> None:
    (tmp / "incoming").mkdir(parents=True, exist_ok=True)
    os.symlink(target, tmp / "incoming" / name)


# ============================================================================ one bad file, one good
@dataclass(frozen=True)
class Bad:
    """``make(tmp)`` puts one bad entry named ``a-bad.<ext>`` into ``tmp/incoming``."""

    id: str
    make: Callable[[Path], object]
    match: str  # regex on the report


def _bad(name: str, data: str | bytes) -> Callable[[Path], object]:
    return lambda t: write(t / "incoming" / name, data)


BAD_FILES = [
    # -- item 1: inputs that used to raise and block every later tick
    Bad(
        "json-5000-digit-integer-score",
        _bad("a-bad.jsonl", jsonl()[:-2].replace('"score": -1', '"score": ' + "9" * 5000) + "}\n"),
        r"a-bad\.jsonl: row 1 \(line 1\): field 'score': .*an integer of 5000 digits",
    ),
    Bad(
        "json-10k-deep-nesting",
        _bad("a-bad.jsonl", "[" * 10_000 + "]" * 10_000 + "\n"),
        r"a-bad\.jsonl: field '\*': line 1: JSON nested too deeply",
    ),
    Bad(
        "json-10k-deep-annotator-scores",
        _bad("a-bad.jsonl", jsonl(annotator_scores="[" * 10_000 + "]" * 10_000)),
        r"a-bad\.jsonl: row 1 \(line 1\): field 'annotator_scores': must be a list",
    ),
    Bad(
        "json-lone-surrogate",
        _bad("a-bad.jsonl", jsonl(src="X").replace('"X"', '"ok \\ud800"')),
        r"a-bad\.jsonl: row 1 \(line 1\): field 'src': not valid Unicode text: lone surrogate '\\ud800' "
        r"at character 4",
    ),
    Bad(
        "json-lone-surrogate-in-system",
        _bad("a-bad.jsonl", jsonl(system="X").replace('"X"', '"\\udfff"')),
        r"row 1 \(line 1\): field 'system': not valid Unicode text",
    ),
    Bad(
        "csv-surrogate-bytes",
        _bad("a-bad.csv", f"{HEADER}\n".encode() + b"wmt21_mqm,en-de,\xed\xa0\x80,b,c,-1,s\n"),
        r"a-bad\.csv: field '\*': line 2: not valid UTF-8",
    ),
    Bad(
        "csv-huge-seg-id",
        _bad("a-bad.csv", f"{HEADER},seg_id\nwmt21_mqm,en-de,a,b,c,-1,s,{'9' * 30}\n"),
        r"row 1 \(line 2\): field 'seg_id': must be an integer in \[0, 2\*\*63 - 1\]",
    ),
    Bad(
        "json-huge-seg-id",
        _bad("a-bad.jsonl", jsonl(seg_id=10**30)),
        r"row 1 \(line 1\): field 'seg_id': must be an integer",
    ),
    Bad(
        "csv-huge-n-annotators",
        _bad("a-bad.csv", f"{HEADER},n_annotators\nwmt21_mqm,en-de,a,b,c,-1,s,1e30\n"),
        r"row 1 \(line 2\): field 'n_annotators': must be an integer in \[1, 10000\], got '1e30'",
    ),
    Bad(
        "json-huge-n-annotators",
        _bad("a-bad.jsonl", jsonl(n_annotators=2**70)),
        r"row 1 \(line 1\): field 'n_annotators': must be an integer in \[1, 10000\]",
    ),
    # -- item 4: bounds of each annotator, plain decimal numbers only
    Bad(
        "annotator-score-off-the-mqm-scale",
        _bad("a-bad.csv", f"{HEADER},annotator_scores\nwmt21_mqm,en-de,a,b,c,-1,s,-1|500\n"),
        r"row 1 \(line 2\): field 'annotator_scores': 1 of 2 annotator scores outside the wmt21_mqm "
        r"scale \[-25.0, 0.0\] \(score 2 is 500.0\)",
    ),
    Bad(
        "annotator-score-json-list-off-scale",
        _bad("a-bad.jsonl", jsonl(annotator_scores=[-1, -30])),
        r"field 'annotator_scores': 1 of 2 annotator scores outside",
    ),
    Bad(
        "score-std-wider-than-the-scale",
        _bad("a-bad.csv", f"{HEADER},score_std\nwmt21_mqm,en-de,a,b,c,-1,s,354\n"),
        r"field 'score_std': 354.0 is wider than the whole wmt21_mqm scale",
    ),
    Bad(
        "n-annotators-fewer-than-scores",
        _bad("a-bad.csv", f"{HEADER},n_annotators,annotator_scores\nwmt21_mqm,en-de,a,b,c,-1,s,1,-1|-2\n"),
        r"field 'n_annotators': 1, but 2 annotator_scores are given",
    ),
    # -- a user's campaign: a name that would break its calibration key, or take a published one
    Bad(
        "campaign-with-the-key-separator",
        _bad("a-bad.csv", f"{HEADER},campaign\nwmt21_mqm,en-de,a,b,c,-1,s,en-de|acme\n"),
        r"row 1 \(line 2\): field 'campaign': must be a campaign name \(letters, digits",
    ),
    Bad(
        "campaign-named-like-a-dataset",
        _bad("a-bad.jsonl", jsonl(campaign="wmt23_mqm")),
        r"row 1 \(line 1\): field 'campaign': 'wmt23_mqm' names a published dataset",
    ),
    Bad(
        "score-with-underscore",
        _bad("a-bad.csv", f"{HEADER}\nwmt21_mqm,en-de,a,b,c,-1_0,s\n"),
        r"row 1 \(line 2\): field 'score': must be a finite number, a plain decimal number .*got '-1_0'",
    ),
    Bad(
        "score-hex", _bad("a-bad.csv", f"{HEADER}\nwmt21_mqm,en-de,a,b,c,-0x1,s\n"), r"field 'score'.*'-0x1'"
    ),
    Bad(
        "score-infinity-word", _bad("a-bad.csv", f"{HEADER}\nwmt21_mqm,en-de,a,b,c,-Infinity,s\n"), r"'score'"
    ),
    Bad(
        "score-overflow", _bad("a-bad.csv", f"{HEADER}\nwmt21_mqm,en-de,a,b,c,-1e999,s\n"), r"'score'.*1e999"
    ),
    Bad("score-fullwidth-digit", _bad("a-bad.csv", f"{HEADER}\nwmt21_mqm,en-de,a,b,c,-１,s\n"), r"'score'"),
    Bad(
        "score-5000-digits-csv",
        _bad("a-bad.csv", f"{HEADER}\nwmt21_mqm,en-de,a,b,c,-{'1' * 5000},s\n"),
        r"'score'",
    ),
    Bad(
        "annotator-score-underscore",
        _bad("a-bad.csv", f"{HEADER},annotator_scores\nwmt21_mqm,en-de,a,b,c,-1,s,-1_0|-1\n"),
        r"field 'annotator_scores': must be a list",
    ),
    Bad(
        "seg-id-underscore",
        _bad("a-bad.csv", f"{HEADER},seg_id\nwmt21_mqm,en-de,a,b,c,-1,s,1_000\n"),
        r"'seg_id'",
    ),
    # -- item 5: links and other non-regular entries are refused unread
    Bad(
        "symlink-to-a-file-outside",
        lambda t: symlink(t, "a-bad.csv", outside_file(t)),
        r"a-bad\.csv: field '\*': a symbolic link: not followed",
    ),
    Bad(
        "symlink-to-etc-hosts",
        lambda t: symlink(t, "a-bad.csv", Path("/etc/hosts")),
        r"a symbolic link: not followed",
    ),
    Bad(
        "dangling-symlink",
        lambda t: symlink(t, "a-bad.tsv", t / "gone.tsv"),
        r"a symbolic link: not followed",
    ),
    Bad(
        "hard-link-to-a-file-outside",
        lambda t: (
            Path(t / "incoming").mkdir(parents=True),
            os.link(outside_file(t), t / "incoming/a-bad.csv"),
        ),
        r"a file with 2 hard links .*not read",
    ),
    Bad(
        "fifo",
        lambda t: (Path(t / "incoming").mkdir(parents=True), os.mkfifo(t / "incoming/a-bad.csv")),
        r"FIFO",
    ),
    Bad(
        "folder-named-csv",
        lambda t: Path(t / "incoming/a-bad.csv").mkdir(parents=True),
        r"a folder: not read",
    ),
    # -- UX
    Bad(
        "utf16-with-bom",
        _bad("a-bad.csv", good_csv().encode("utf-16")),
        r"a-bad\.csv: field '\*': encoded as UTF-16 \(byte-order mark FF FE\), not UTF-8; "
        r"convert it, e.g. iconv -f UTF-16 -t UTF-8",
    ),
    Bad("utf16-without-bom", _bad("a-bad.tsv", good_csv().encode("utf-16-le")), r"looks like UTF-16"),
    Bad(
        "unknown-dataset-blank-ref",
        _bad("a-bad.tsv", f"{HEADER}\n\t\t\t\t\t\t\nwmt99\t\t\t\t\t\t\n".replace(",", "\t")),
        r"row 2 \(line 3\): field 'dataset': unknown dataset 'wmt99'",
    ),
]


@pytest.mark.parametrize("case", BAD_FILES, ids=[c.id for c in BAD_FILES])
def test_one_bad_file_is_rejected_with_a_report_and_the_good_one_is_ingested(case, tmp_path, incoming_config):
    cfg = incoming_config()
    case.make(tmp_path)
    write(tmp_path / "incoming" / "b-good.csv", good_csv())
    bad_name = next(p.name for p in (tmp_path / "incoming").iterdir() if p.name.startswith("a-bad"))

    result = ingest_incoming(cfg)  # never raises for a bad file

    assert result.ingested == ["b-good.csv"] and result.rows_added == 3
    assert result.rejected == [bad_name]
    report = (tmp_path / "incoming/rejected" / f"{bad_name}.report.txt").read_text(encoding="utf-8")
    assert re.search(case.match, report), report
    assert str(tmp_path / "incoming" / bad_name) in report  # the file is named
    assert SECRET not in report and "localhost" not in report  # a link's target is never read
    assert os.path.lexists(tmp_path / "incoming/rejected" / bad_name)
    left = {p.name for p in (tmp_path / "incoming").iterdir()}
    assert left == {"processed", "rejected"}, left  # nothing stays to block the next tick
    pool = read_pool(cfg.pool_path)
    assert len(pool) == 3 and SECRET not in pool.to_string()
    assert ingest_incoming(cfg) == type(result)()  # the next tick: nothing waiting, nothing to fail


def test_a_validator_crash_rejects_that_file_only(tmp_path, monkeypatch, incoming_config):
    """An error the validator does not foresee refuses the one file, named, and the tick goes on."""
    import uamt.ingest.validation as inc  # validate_file (the ingestion's check of a file) calls it

    cfg = incoming_config()
    write(tmp_path / "incoming/a-odd.csv", good_csv(3, first=10))
    write(tmp_path / "incoming/b-good.csv", good_csv())
    real = inc.validate_frame

    def flaky(frame, path, *args):
        if path.name == "a-odd.csv":
            raise MemoryError("simulated")
        return real(frame, path, *args)

    monkeypatch.setattr(inc, "validate_frame", flaky)
    result = ingest_incoming(cfg)
    assert result.ingested == ["b-good.csv"] and result.rejected == ["a-odd.csv"]
    report = Path(result.reports["a-odd.csv"]).read_text()
    assert "a-odd.csv: field '*': could not be validated (MemoryError: 'simulated'); not ingested" in report


# ============================================================================ must NOT be errors
ACCEPTED = [
    ("csv-one-trailing-blank-line", "x.csv", good_csv() + "\n"),
    ("csv-crlf-trailing-blank-line", "x.csv", good_csv(newline="\r\n") + "\r\n"),
    ("tsv-trailing-blank-line", "x.tsv", good_csv().replace(",", "\t") + "\n"),
    ("tsv-trailing-whitespace-line", "x.tsv", good_csv().replace(",", "\t") + " \t\n"),
    ("jsonl-trailing-blank-line", "x.jsonl", jsonl() + "\n"),
    ("numbers-with-spaces-and-exponent", "x.csv", f"{HEADER},seg_id\nwmt21_mqm,en-de,a,b,c, -1.5e0 ,s, 7 \n"),
    ("integral-float-seg-id", "x.jsonl", jsonl(seg_id=7.0, n_annotators=2, annotator_scores=[-1, -2])),
    (
        "annotator-scores-on-the-scale",
        "x.csv",
        f"{HEADER},annotator_scores\nwmt21_mqm,en-de,a,b,c,-1,s,-25|0\n",
    ),
]


@pytest.mark.parametrize(("name", "data"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted_inputs(name, data, tmp_path):
    check = validate_file(write(tmp_path / name, data))
    assert check.ok, check.report()
    assert len(check.good) >= 1


def test_lines_are_named_right_after_blank_jsonl_lines(tmp_path):
    check = validate_file(write(tmp_path / "x.jsonl", jsonl() + "\n\n" + jsonl(src="b", score=5)))
    assert [(p.row, p.line, p.field) for p in check.row_problems] == [(2, 4, "score")]


# ============================================================================ item 3: duplicates by content
def test_the_same_rows_resubmitted_with_crlf_are_skipped_and_counted(tmp_path, incoming_config):
    cfg = incoming_config()
    write(tmp_path / "incoming/batch.csv", good_csv(60))
    assert ingest_incoming(cfg).rows_added == 60
    # Re-exported: CRLF line ends, a different name, extra spaces inside a segment.
    again = good_csv(60, newline="\r\n").replace("Source 7.", " Source  7. ")
    write(tmp_path / "incoming/batch-export.csv", again)
    result = ingest_incoming(cfg)
    assert result.rows_added == 0 and result.rows_duplicate == 60 and result.rejected == ["batch-export.csv"]
    report = Path(result.reports["batch-export.csv"]).read_text()
    assert "nothing new: all 60 row(s) are already in the pool" in report
    assert "row 8 (line 9): field '*': already in the pool (from batch.csv): skipped" in report
    assert len(read_pool(cfg.pool_path)) == 60
    # 60 old rows + 1 new one (and a repeat of it inside the file): only the new row is added.
    write(tmp_path / "incoming/batch-plus.csv", good_csv(61) + good_csv(61, first=60).split("\n", 1)[1])
    result = ingest_incoming(cfg)
    assert result.rows_added == 1 and result.rows_duplicate == 61 and result.ingested == ["batch-plus.csv"]
    report = (tmp_path / "incoming/processed/batch-plus.csv.report.txt").read_text()
    assert (
        "duplicates skipped: 61" in report
        and "row 62 (line 63): field '*': same judgement as row 61" in report
    )
    assert len(read_pool(cfg.pool_path)) == 61
    manifest = json.loads(Path(cfg.manifest_path).read_text())
    assert [f["rows_duplicate"] for f in manifest["files"]] == [0, 61]


# ============================================================================ item 4: only complete files
def test_partial_files_are_left_alone_until_complete(tmp_path, incoming_config):
    cfg = incoming_config(settle_s=60)
    folder = tmp_path / "incoming"
    for name in (".batch.csv", "batch.csv.part", "batch.csv.tmp", "~batch.csv"):  # being written
        write(folder / name, good_csv()[:40])
    young = write(folder / "young.csv", good_csv())  # being copied in with cp: modified just now
    result = ingest_incoming(cfg)
    assert result.deferred == ["young.csv"] and not result.ingested and not result.rejected
    assert sorted(p.name for p in folder.iterdir()) == [
        ".batch.csv",
        "batch.csv.part",
        "batch.csv.tmp",
        "young.csv",
        "~batch.csv",
    ]
    old = time.time() - 120
    os.utime(young, (old, old))  # untouched for two minutes: complete
    assert ingest_incoming(cfg).ingested == ["young.csv"]
    (folder / "batch.csv.part").rename(folder / "batch.csv")  # the rename that publishes it
    os.utime(folder / "batch.csv", (old, old))
    assert ingest_incoming(cfg).rejected == ["batch.csv"]  # truncated by design here: checked, refused


def test_withdraw_takes_a_files_rows_out_and_owes_a_retrain(tmp_path, capsys, incoming_config):
    from uamt.cli import main

    cfg = incoming_config()
    write(tmp_path / "incoming/one.csv", good_csv(3))
    write(tmp_path / "incoming/two.csv", good_csv(5, first=3))
    ingest_incoming(cfg)
    Path(cfg.pending_path).unlink()  # as after a finished retrain
    out = withdraw(cfg, "one.csv")
    assert out["rows_removed"] == 3 and len(read_pool(cfg.pool_path)) == 2
    assert read_pending(cfg)["changes"][-1]["withdrawn"] == "one.csv"
    manifest = json.loads(Path(cfg.manifest_path).read_text())
    assert manifest["files"][0]["withdrawn_at"] and manifest["files"][0]["rows_withdrawn"] == 3
    with pytest.raises(Exception, match="no ingested file named 'one.csv'"):
        withdraw(cfg, "one.csv")
    # Withdrawn, the same file may come back.
    (tmp_path / "incoming/processed/one.csv").rename(tmp_path / "incoming/one.csv")
    assert ingest_incoming(cfg).rows_added == 3
    params = write(
        tmp_path / "params.yaml",
        yaml.safe_dump(
            {
                "incoming": {
                    k: v
                    for k, v in dataclasses.asdict(cfg).items()
                    if k.endswith(("dir", "path")) and k not in DERIVED  # those come from other sections
                }
            }
        ),
    )
    sha = manifest["files"][1]["sha256"][:10]
    assert main(["incoming", "withdraw", sha, "--params", str(params)]) == 0
    assert json.loads(capsys.readouterr().out)["file"] == "two.csv"



def _incoming_params(tmp_path: Path, cfg) -> Path:
    """A params file whose ``incoming`` section is ``cfg``'s folders and files."""
    section = {k: v for k, v in dataclasses.asdict(cfg).items() if k.endswith(("dir", "path")) and k not in DERIVED}
    return write(tmp_path / "params.yaml", yaml.safe_dump({"incoming": section}))


def test_uamt_incoming_commands_create_the_pool_validate_and_ingest(tmp_path, capsys, incoming_config):
    """``uamt incoming`` (was ``python -m uamt.incoming``): ``make run`` calls ``init-pool``."""
    from uamt.cli import main

    cfg = incoming_config()
    params = _incoming_params(tmp_path, cfg)
    Path(cfg.pool_path).unlink(missing_ok=True)
    assert main(["incoming", "init-pool", "--params", str(params)]) == 0
    assert capsys.readouterr().out == f"{cfg.pool_path}: created (empty)\n"
    assert len(read_pool(cfg.pool_path)) == 0
    assert main(["incoming", "init-pool", "--params", str(params)]) == 0
    assert capsys.readouterr().out == f"{cfg.pool_path}: exists\n"
    good = write(tmp_path / "incoming/good.csv", good_csv(3))
    bad = write(tmp_path / "bad.csv", good_csv(2).replace(",-1,sysA", ",high,sysA"))
    assert main(["incoming", "validate", str(good), "--params", str(params)]) == 0
    assert main(["incoming", "validate", str(good), str(bad), "--params", str(params)]) == 1
    assert "bad.csv" in capsys.readouterr().out
    assert main(["incoming", "ingest", "--params", str(params)]) == 0
    assert json.loads(capsys.readouterr().out)["ingested"] == ["good.csv"]
    assert len(read_pool(cfg.pool_path)) == 3
    assert main(["incoming", "withdraw", "nothing-like-it", "--params", str(params)]) == 2
    assert "uamt incoming: error: " in capsys.readouterr().err


# ============================================================================ item 2: crash after ingestion
def _tick_params(tmp_path: Path) -> Path:
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["pipeline"]["methods"] = ["point", "hts"]
    params["incoming"]["settle_s"] = 0
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    return path


def test_a_retrain_killed_after_ingestion_is_finished_by_the_next_tick(prefect_api, tmp_path, monkeypatch):
    """train_dup dies (as under SIGKILL: no register); the rows are in the pool and the file in
    processed/, so only the pending-retrain marker remembers them: the next tick, with no new file,
    retrains (prepare/encode/train_base from cache, train_dup onwards run) and clears it."""
    from test_flows import _fake_stages

    import flows.pipeline as fp
    from flows.retrain import retrain_on_new_annotations

    monkeypatch.chdir(tmp_path)
    _tick_params(tmp_path)
    calls: list = []
    _fake_stages(calls, monkeypatch)
    real_dup = fp.STAGE_BY_NAME["train_dup"].run
    crash = {"on": True}

    def dying_dup(cfg):
        if crash["on"]:
            raise RuntimeError("train_dup killed")
        return real_dup(cfg)

    stages = tuple(dataclasses.replace(s, run=dying_dup) if s.name == "train_dup" else s for s in fp.STAGES)
    monkeypatch.setattr(fp, "STAGES", stages)
    monkeypatch.setattr(fp, "STAGE_BY_NAME", {s.name: s for s in stages})
    write(Path("data/incoming/new.csv"), good_csv(4))

    with pytest.raises(RuntimeError, match="train_dup killed"):
        retrain_on_new_annotations("params.yaml")
    assert [c[0] for c in calls] == ["prepare", "encode", "train_base"]
    assert not SUMMARY_PATH.exists()  # register never ran: the registry is unchanged
    assert (
        Path("data/incoming/processed/new.csv").is_file()
        and len(read_pool("data/annotations/pool.parquet")) == 4
    )
    pending = json.loads(Path("data/.retrain.pending").read_text())
    assert pending["changes"] == [
        {"file": "new.csv", "sha256": pending["changes"][0]["sha256"], "rows_added": 4}
    ]

    # What a SIGKILL in train_dup leaves: a temp folder named with a pid that no longer runs.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = Path(f"models/.dup.tmp-{int(dead.stdout)}-x")
    stale.mkdir(parents=True)
    crash["on"] = False
    calls.clear()
    out = retrain_on_new_annotations("params.yaml")
    assert out["status"] == "retrained" and out["resumed"] is True, out
    assert out["ingest"]["rows_added"] == 0 and out["cleaned"] == [str(stale)]
    assert [c[0] for c in calls] == [
        "train_dup", "train_lolo", "calibrate", "evaluate", "calibrate_campaigns", "register",
        # after the marker: the versions completed per campaign and out of domain
        "evaluate_campaigns", "evaluate_ood",
    ]
    assert not stale.exists() and not Path("data/.retrain.pending").exists()
    assert retrain_on_new_annotations("params.yaml") == {"status": "no new annotations"}


def test_ingest_from_the_command_line_owes_a_retrain(tmp_path, incoming_config):
    """``uamt incoming ingest`` alone: the next tick retrains (it used to say 'no new annotations')."""
    cfg = incoming_config()
    write(tmp_path / "incoming/new.csv", good_csv())
    assert read_pending(cfg) is None
    ingest_incoming(cfg)
    assert read_pending(cfg)["changes"][0]["rows_added"] == 3
    write(tmp_path / "incoming/dup.csv", good_csv(newline="\r\n"))
    Path(cfg.pending_path).unlink()
    ingest_incoming(cfg)  # nothing new: no retrain owed
    assert read_pending(cfg) is None


# ============================================================================ the Prefect API server
SERVER_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    # Ctrl-C as in a terminal, even when the test runner was started in the background (a
    # non-interactive shell starts background jobs with SIGINT ignored, and children inherit that)
    # (a disposition and a blocked mask are both inherited; an earlier test in the run may leave either)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    from flows.retrain import QUIET_PREFECT_ENV, start_api_server
    os.environ.update(QUIET_PREFECT_ENV)
    server = start_api_server()
    try:  # the pid is printed inside the try: a Ctrl-C right after it is still caught
        print("SERVER", server.server_process.pid, flush=True)
        time.sleep(600)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        time.sleep(2)  # the flow records its end: the API must still answer
        import httpx
        print("HEALTH", httpx.get(server.api_url + "/health").status_code, flush=True)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie (exited, not yet reaped) is not alive
        return handle.read().split(")")[-1].split()[0] != "Z"


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.2)
    return False


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _expect(lines: queue.Queue, marker: str, seconds: float) -> str:
    """The rest of the next stdout line starting with ``marker`` (the server's own output is skipped)."""
    deadline = time.monotonic() + seconds
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        if line.startswith(marker + " ") or line.strip() == marker:
            return line[len(marker) :].strip()
        seen.append(line)
    raise AssertionError(f"no {marker!r} line within {seconds} s; output: {seen[-20:]}")


@pytest.mark.slow
def test_api_server_survives_ctrl_c_and_dies_with_a_killed_parent(tmp_path):
    env = dict(
        os.environ,
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="150",
        PYTHONPATH=os.pathsep.join(
            [str(REPO_ROOT), str(REPO_ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    env.pop("PREFECT_API_URL", None)
    for signum in (signal.SIGINT, signal.SIGKILL):
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_SCRIPT],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,  # its own process group, as a terminal's job
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        try:
            server = int(_expect(lines, "SERVER", 180))
            os.killpg(proc.pid, signum)  # Ctrl-C reaches the whole group; SIGKILL the flow process
            if signum == signal.SIGINT:
                _expect(lines, "INTERRUPTED", 30)
                assert _expect(lines, "HEALTH", 30) == "200"  # the server outlived Ctrl-C
                proc.wait(60)
            assert _wait_gone(server, 30), f"Prefect API server {server} outlived its parent ({signum!r})"
        finally:
            proc.kill()
            proc.wait()


def test_prefect_telemetry_is_off_for_retrain(monkeypatch):
    """The names exist in the installed prefect and switch both telemetry paths off."""
    from prefect.settings import Settings

    from flows.retrain import QUIET_PREFECT_ENV

    makefile = (REPO_ROOT / "Makefile").read_text()
    assert (
        "export PREFECT_SERVER_ANALYTICS_ENABLED ?= false" in makefile
        and "export DO_NOT_TRACK ?= 1" in makefile
    )
    for key, value in QUIET_PREFECT_ENV.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.server.analytics_enabled is False
    assert settings.cloud.enable_orchestration_telemetry is False
    from prefect._internal.analytics import is_telemetry_enabled

    assert not is_telemetry_enabled()


# ============================================================================ params
@pytest.mark.parametrize(
    ("section", "match"),
    [
        (
            "incoming: [1, 2]",
            r"params.yaml:incoming: must be a mapping of key: value pairs, got a list \(\[1, 2\]\)",
        ),
        ("incoming: 3", r"must be a mapping of key: value pairs, got a int"),
        (
            "incoming:\n  score_bounds:\n    wmt21_mqm: [-.inf, .inf]",
            r"score_bounds.wmt21_mqm must be finite numbers",
        ),
        ("incoming:\n  score_bounds:\n    wmt21_mqm: [-25, .nan]", r"score_bounds.wmt21_mqm must be"),
        ("incoming:\n  settle_s: -1", r"incoming.settle_s must be a finite number >= 0"),
    ],
    ids=["section-as-list", "section-as-number", "infinite-bounds", "nan-bound", "negative-settle"],
)
def test_bad_params_are_named(section, match, tmp_path):
    path = write(tmp_path / "params.yaml", section + "\n")
    with pytest.raises(ConfigError, match=match):
        load_config(path)


def test_repo_params_have_the_new_keys():
    cfg = load_section(IncomingConfig, "incoming", REPO_ROOT / "params.yaml")
    assert cfg.pending_path == "data/.retrain.pending" and cfg.settle_s > 0


def test_utf16_text_input_to_uamt_score_is_named(tmp_path):
    from uamt.core.errors import DataError
    from uamt.serving.text_io import read_lines

    path = write(tmp_path / "src.txt", "Hallo.\nWelt.\n".encode("utf-16"))
    with pytest.raises(
        DataError, match=r"encoded as UTF-16 \(byte-order mark FF FE\).*iconv -f UTF-16 -t UTF-8"
    ):
        read_lines(path)


# ============================================================================ round 3: ingestion is one transaction
def _die(exc: type[BaseException] = RuntimeError):
    def raiser(*args, **kwargs):
        raise exc("simulated kill")

    return raiser


def _die_after(real):
    """``real``, then a crash: the step is done, the next one never starts."""

    def run(*args, **kwargs):
        real(*args, **kwargs)
        raise RuntimeError("simulated kill")

    return run


# (step that dies, how: the function patched in uamt.ingest.pool, and what the next tick must do)
INTERRUPTED = [
    ("before-the-pool", "write_pool", _die, "rolled back"),
    ("after-the-pool", "write_pool", _die_after, "rolled forward"),  # the case found: rows orphaned
    ("after-the-manifest", "write_ingest_manifest", _die_after, "rolled forward"),
    ("at-the-move", "_move", _die, "rolled forward"),
]


@pytest.mark.parametrize(("step", "target", "how", "recovery"), INTERRUPTED, ids=[c[0] for c in INTERRUPTED])
def test_an_ingestion_interrupted_at_any_step_is_finished_or_undone_by_the_next_tick(
    step, target, how, recovery, tmp_path, monkeypatch, incoming_config
):
    """Killed between the pool write and the manifest write, the rows stayed in the pool, the next
    tick called the file "already ingested (same sha256)" (rows_rejected 3) and withdraw could not
    find it.  Now a write-ahead record makes the next tick roll the change forward or back."""
    import uamt.ingest.pool as inc

    cfg = incoming_config()
    write(tmp_path / "incoming/a.csv", good_csv(3))
    real = getattr(inc, target)
    with monkeypatch.context() as patch:
        patch.setattr(inc, target, how(real) if how is _die_after else how())
        with pytest.raises(RuntimeError, match="simulated kill"):
            ingest_incoming(cfg)
    result = ingest_incoming(cfg)  # the next tick, nothing patched
    assert len(result.recovered) == 1 and result.recovered[0].startswith(recovery), result.recovered
    assert not result.rejected and result.rows_rejected == 0
    assert result.ingested == (["a.csv"] if recovery == "rolled back" else [])
    assert len(read_pool(cfg.pool_path)) == 3
    manifest = json.loads(Path(cfg.manifest_path).read_text())
    assert [(f["file"], f["rows_added"]) for f in manifest["files"]] == [("a.csv", 3)]
    assert {p.name for p in (tmp_path / "incoming").iterdir()} == {"processed"}
    assert (tmp_path / "incoming/processed/a.csv").is_file()
    assert not inc.journal_file(cfg).exists()
    assert withdraw(cfg, "a.csv")["rows_removed"] == 3 and len(read_pool(cfg.pool_path)) == 0


def test_a_withdrawal_interrupted_after_the_pool_is_finished_by_the_next_tick(tmp_path, monkeypatch, incoming_config):
    import uamt.ingest.pool as inc

    cfg = incoming_config()
    write(tmp_path / "incoming/a.csv", good_csv(3))
    ingest_incoming(cfg)
    with monkeypatch.context() as patch:
        patch.setattr(inc, "write_pool", _die_after(inc.write_pool))
        with pytest.raises(RuntimeError, match="simulated kill"):
            withdraw(cfg, "a.csv")
    assert ingest_incoming(cfg).recovered[0].startswith("rolled forward the withdrawal of a.csv")
    manifest = json.loads(Path(cfg.manifest_path).read_text())
    assert manifest["files"][0]["withdrawn_at"] and manifest["files"][0]["rows_withdrawn"] == 3


KILL_AFTER_POOL = textwrap.dedent(
    """
    import json, os, signal, sys
    import uamt.ingest.pool as inc
    real = inc.write_pool
    def write_then_die(*args, **kwargs):
        real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)  # between the pool write and the manifest write
    inc.write_pool = write_then_die
    inc.ingest_incoming(inc.IncomingConfig(**json.loads(sys.argv[1])))
    """
)


@pytest.mark.parametrize("without_journal", [False, True], ids=["recorded", "left-by-an-older-version"])
def test_a_process_killed_between_pool_and_manifest_leaves_nothing_orphaned(without_journal, tmp_path, incoming_config):
    """The case as found, with a real SIGKILL: the next tick recovers, withdraw finds the file."""
    cfg = incoming_config()
    write(tmp_path / "incoming/a.csv", good_csv(3))
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k.endswith(("dir", "path"))}
    run = subprocess.run([sys.executable, "-c", KILL_AFTER_POOL, json.dumps(fields)], timeout=300, check=False)
    assert run.returncode == -signal.SIGKILL
    assert len(read_pool(cfg.pool_path)) == 3 and not Path(cfg.manifest_path).exists()  # the state found
    if without_journal:  # the state a version without the write-ahead record left behind
        journal_file(cfg).unlink()
    result = ingest_incoming(cfg)
    assert len(result.recovered) == 1 and (tmp_path / "incoming/processed/a.csv").is_file()
    assert result.rows_rejected == 0 and not result.rejected  # was: "already ingested (same sha256)", 3 rejected
    assert withdraw(cfg, "a.csv")["rows_removed"] == 3  # was: "no ingested file named 'a.csv'"


# ============================================================================ round 3: size limits
ROWS_6 = good_csv(6)


def _parquet(rows: int) -> bytes:
    import io

    import pandas as pd

    buffer = io.BytesIO()
    pd.read_csv(io.StringIO(good_csv(rows))).to_parquet(buffer)
    return buffer.getvalue()


OVERSIZED = [
    ("bytes-csv", "big.csv", good_csv(40), {"max_file_bytes": 1000},
     r"big\.csv: field '\*': 2,\d{3} bytes, over the limit of incoming\.max_file_bytes = 1,000; not read"),
    ("rows-csv", "many.csv", ROWS_6, {"max_rows": 5}, r"6 data rows, over the limit of incoming\.max_rows = 5"),
    ("rows-tsv", "many.tsv", ROWS_6.replace(",", "\t"), {"max_rows": 5}, r"6 data rows, over the limit"),
    ("rows-jsonl", "many.jsonl", "".join(jsonl(src=f"s{i}") for i in range(6)), {"max_rows": 5}, r"6 data rows"),
    ("rows-parquet", "many.parquet", _parquet(6), {"max_rows": 5}, r"6 data rows, over the limit"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "data", "limits", "match"), [c[1:] for c in OVERSIZED], ids=[c[0] for c in OVERSIZED])
def test_an_oversized_file_is_refused_with_the_limit_named(name, data, limits, match, tmp_path, incoming_config):
    """No limit used to exist: 100,000 rows (63 MB) took 690 MB of memory in validation."""
    cfg = incoming_config(**limits)
    write(tmp_path / "incoming" / name, data)
    result = ingest_incoming(cfg)
    assert result.rejected == [name] and result.rows_added == 0
    assert re.search(match, Path(result.reports[name]).read_text()), Path(result.reports[name]).read_text()
    assert re.search(match, validate_file(tmp_path / "incoming/rejected" / name, cfg).report())
    ok = incoming_config()  # the defaults take the same files
    assert validate_file(tmp_path / "incoming/rejected" / name, ok).ok


# ============================================================================ round 3: rows no model trains on
def test_rows_of_a_dataset_no_model_trains_on_are_refused(tmp_path, incoming_config):
    """200 WMT21 DA ja-en rows were ingested and triggered a retrain, but no trained dataset held them."""
    cfg = incoming_config(trained_datasets=("wmt21_mqm", "wmt23_mqm"))
    rows = [f"wmt21_da,ja-en,源文{i}。,Translation {i}.,Reference {i}.,0.{i},sysA" for i in range(3)]
    write(tmp_path / "incoming/da.csv", "\n".join([HEADER, *rows]) + "\n")
    write(tmp_path / "incoming/mqm.csv", good_csv(3))
    result = ingest_incoming(cfg)
    assert result.ingested == ["mqm.csv"] and result.rejected == ["da.csv"]
    report = Path(result.reports["da.csv"]).read_text()
    assert (
        "da.csv: row 1 (line 2): field 'dataset': no model trains on wmt21_da (pipeline.datasets: "
        "['wmt21_mqm', 'wmt23_mqm']), so its rows would never be trained" in report
    )


def test_trained_datasets_come_from_pipeline_datasets(tmp_path):
    cfg = load_config(REPO_ROOT / "params.yaml")
    pipeline = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["pipeline"]["datasets"]
    assert cfg.trained_datasets == tuple(pipeline) and cfg.published_dir == "data/prepared"
    assert cfg.max_file_bytes >= 1_000_000 and cfg.max_rows >= 10_000
    path = write(tmp_path / "params.yaml", "incoming:\n  trained_datasets: [wmt21_da]\n")
    with pytest.raises(ConfigError, match=r"incoming\.trained_datasets is read from pipeline\.datasets"):
        load_config(path)


# ============================================================================ round 3: published labels
def _published(tmp_path: Path) -> Path:
    """A prepared split holding published labels of Source 0-2 / Translation 0-2 by sysA."""
    import pandas as pd

    folder = tmp_path / "prepared"
    folder.mkdir()
    pd.DataFrame(
        {
            "dataset": "wmt21_mqm",
            "lp": "en-de",
            "src": [f"Source {i}." for i in range(3)],
            "mt": [f"Translation {i}." for i in range(3)],
            "ref": [f"Reference {i}." for i in range(3)],
            "score": [-0.0, -1.0, -2.0],
            "system": "sysA",
        }
    ).to_parquet(folder / "d_q.parquet")
    return folder


def _row(i: int, score: float, system: str = "sysA") -> str:
    return f"wmt21_mqm,en-de,Source {i}.,Translation {i}.,Reference {i}.,{score},{system}"


PUBLISHED = [
    # (id, row, what happens with on_published_conflict=reject, report regex)
    ("contradicts", _row(1, -20), "bad", r"row 1 \(line 2\): field 'score': contradicts the published label of the "
     r"same src and mt \(wmt21_mqm system 'sysA', score -1\): -20 is more than 5 away"),
    ("renamed-system", _row(2, -2, "sysA-v2"), "bad", r"field 'system': repeats a published item \(same src and mt: "
     r"wmt21_mqm system 'sysA', score -2\) under another system name 'sysA-v2'"),
    ("exact-repeat", _row(0, 0), "duplicate", r"field '\*': already published \(wmt21_mqm system 'sysA', score 0\): skipped"),
    ("re-rated-within-tolerance", _row(1, -3), "kept", None),
    ("new-item", _row(7, -3), "kept", None),
]  # fmt: skip


@pytest.mark.parametrize(("row", "outcome", "match"), [c[1:] for c in PUBLISHED], ids=[c[0] for c in PUBLISHED])
@pytest.mark.parametrize("policy", ["reject", "flag"])
def test_rows_that_contradict_or_repeat_published_labels_are_reported(row, outcome, match, policy, tmp_path, incoming_config):
    """An item of the published data rescored (0 for everything) or repeated under a renamed system
    used to join the training pool unnoticed."""
    cfg = incoming_config(published_dir=str(_published(tmp_path)), on_published_conflict=policy)
    write(tmp_path / "incoming/new.csv", f"{HEADER}\n{row}\n")
    result = ingest_incoming(cfg)
    manifest = json.loads(Path(cfg.manifest_path).read_text()) if Path(cfg.manifest_path).exists() else {"files": []}
    report = Path(result.reports["new.csv"]).read_text() if "new.csv" in result.reports else ""
    if match:
        assert re.search(match, report), report
    if outcome == "kept" or (outcome == "bad" and policy == "flag"):
        assert result.rows_added == 1 and len(read_pool(cfg.pool_path)) == 1
        flagged = outcome == "bad"
        assert manifest["files"][0]["rows_conflicting_published"] == int(flagged)
        assert manifest["files"][0].get("rows_flagged") == ([1] if flagged else None)
        assert ("(flagged, kept)" in report) == flagged and result.rows_flagged == int(flagged)
    else:  # rejected (bad row) or skipped (a published row again): nothing reaches the pool
        assert result.rows_added == 0 and result.rejected == ["new.csv"]
        assert (result.rows_duplicate == 1) == (outcome == "duplicate")


def test_a_configured_api_url_starts_no_server():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.retrain import start_api_server

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert start_api_server() is None
