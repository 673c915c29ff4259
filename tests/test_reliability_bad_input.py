"""Reliability: how users break uamt with bad input, as one table of cases.

Each :class:`Case` writes one kind of bad input into ``tmp_path`` and runs it the way a user would:

* ``cli``  -- ``uamt.cli.main(argv)``: exit code 2, one ``uamt <command>: error: ...`` line on stderr
  matching ``match`` (naming the file / line / field), nothing on stdout, and NO partial output:
  the case's output file is created beforehand and must be byte-identical afterwards, and the
  output folder must hold exactly the files it held before (no temp files left);
* ``call`` -- a library call (the data loaders): raises ``expect`` with a message matching ``match``;
* ``validate`` -- the incoming-annotations validator: the file is refused and its report matches;
* ``rest`` -- ``POST /invocations`` on a live loopback server: HTTP ``expect`` (4xx) with a JSON
  ``{"error": ...}`` matching ``match``, and the server keeps serving.

Inputs that must NOT be errors (a UTF-8 byte-order mark) are checked at the end.
"""

from __future__ import annotations

import http.client
import io
import json
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_scoring_support import REF_MODEL, running_server, write_lines

from uamt.core.errors import DataError
from uamt.data import loaders
from uamt.serving.predictor import load_predictor
from uamt.serving.rest import ScoringService, ServeSettings

TEN_MB = 10_000_000
PREVIOUS = b"previous output: must survive a failed run byte for byte\n"


@dataclass(frozen=True)
class Case:
    """One bad input: ``setup(tmp_path)`` writes it and returns what to run (see module docstring)."""

    id: str
    kind: str  # "cli", "call", "validate" or "rest"
    setup: Callable[[Path], Any]
    expect: Any  # exit code (cli), exception class (call), HTTP status (rest); unused (validate)
    match: str  # regex the error message must match
    out: str | None = None  # cli: output path (relative to tmp_path) that must stay untouched
    xfail: str | None = None  # a known gap, reported to the lead (strict: fails once fixed)


# ============================================================================ input builders
WMT = loaders.WMT_REPO
DA_SCORES = "SYS SID RAW.SCR Z.SCR N \nSysA.1 1 80 0.5 1 \nSysA.1 2 60 -0.5 2 \n"
MQM_SCORES = "system\tmqm_avg_score\tseg_id\nSysA\t-1.5\t1\nSysA\t-0.0\t2\n"


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def make_newstest(root: Path, lp: str, hyp: bytes = b"Hullo.\nHey.\n", src: str = "Ahoj.\nNazdar.\n") -> None:
    """A two-segment newstest2021 text layout for ``lp`` with system SysA and reference A."""
    s, t = lp.split("-")
    base = root / WMT / "txt"
    write(base / "sources" / f"newstest2021.{lp}.src.{s}", src)
    write(base / "references" / f"newstest2021.{lp}.ref.A.{t}", "Hello.\nHi.\n")
    write(base / "system-outputs" / f"newstest2021.{lp}.hyp.SysA.{t}", hyp)
    # Document ids (one document per line, in id order, so DA segment id k is line k): without
    # them a WMT21 DA language pair cannot be joined and is left out.
    segs = "".join(
        f'<doc id="d{i}"><src lang="{s}"><p><seg id="1">{line}</seg></p></src></doc>'
        for i, line in enumerate(src.split("\n")[:2], start=1)
    )
    write(root / WMT / "xml" / f"newstest2021.{lp}.all.xml", f'<dataset id="newstest2021">{segs}</dataset>')


def make_da(root: Path, scores: str = DA_SCORES, **text) -> Callable[[], pd.DataFrame]:
    make_newstest(root, "cs-en", **text)
    write(root / WMT / "humaneval/newstest2021-toen/ad-seg-scores-cs-en.csv", scores)
    return lambda: loaders.load_wmt21_da(root, lps=("cs-en",))


def make_mqm(root: Path, scores: str = MQM_SCORES) -> Callable[[], pd.DataFrame]:
    make_newstest(root, "en-de")
    write(root / loaders.MQM_REPO / "newstest2021/ende/mqm_newstest2021_ende.avg_seg_scores.tsv", scores)
    return lambda: loaders.load_wmt21_mqm(root, lps=("en-de",))


def make_hter(root: Path, rows: str) -> Callable[[], pd.DataFrame]:
    folder = root / loaders.HTER_REPO / "evaluation/data/human_scores/hter"
    write(folder / "test.smt.de-en.csv", "src,mt,pe,ref,lp,score\n" + rows)
    return lambda: loaders.load_qt21_hter(root, files=[("smt", "de-en")])


def make_multihyp_tar(
    root: Path, n: int = 40, scores: list[str] | None = None, short: str | None = None
) -> Path:
    """The et-en multi-hypothesis tarball; ``short`` names a member that loses its last line."""
    scores = scores or [f"{(i % 7) / 7 - 0.4:.3f}" for i in range(n)]
    members = {
        "src.et": [f"Lause {i}." for i in range(n)],
        "mt.en": [f"Sentence {i}." for i in range(n)],
        "ref-1.en": [f"Clause {i}." for i in range(n)],
        "ref-2.en": [f"Phrase {i}." for i in range(n)],
        "DA-z.scores": scores,
    }
    if short:
        members[short] = members[short][:-1]
    path = root / loaders.MLQE_REPO / "data-multi-hyp" / "data.tar.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, lines in members.items():
            data = "".join(f"{x}\n" for x in lines).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def prepare_argv(tmp: Path, extra: str = "", scores: list[str] | None = None) -> list[str]:
    make_multihyp_tar(tmp / "raw", scores=scores)
    params = write(
        tmp / "params.yaml",
        f"prepare:\n  raw_dir: {tmp / 'raw'}\n  out_dir: {tmp / 'prep'}\n  datasets: [multihyp_eten]\n"
        f"  forced_splits: {{}}\n  pseudo_doc_size: 2\n{extra}",
    )
    return ["data", "prepare", "--params", str(params)]


def fetch_argv(tmp: Path) -> list[str]:
    """A mirror whose file differs from the pinned sha256; raw_dir already holds an older copy."""
    write(tmp / "mirror/acme/corpus/scores.tsv", "tampered\n")
    pins = write(
        tmp / "data_sources.yaml", f"acme/corpus:\n  commit: {'a' * 40}\n  files:\n    scores.tsv: '{'0' * 64}'\n"
    )
    params = write(
        tmp / "params.yaml",
        f"fetch:\n  mirror: {tmp / 'mirror'}\n  raw_dir: {tmp / 'raw'}\n  sources_file: {pins}\n",
    )
    return ["data", "fetch", "--params", str(params)]


PRED_HEADER = "dataset,lp,seg_id,system,human,mu,sigma\n"
PRED_ROWS = "".join(
    f"mlqe,en-de,{i},s,{np.sin(i):.3f},{np.sin(i) + 0.1 * np.cos(3 * i):.3f},{0.2 + 0.01 * (i % 5):.3f}\n"
    for i in range(1, 61)
)


def eval_argv(tmp: Path, text: str | bytes, name: str = "pred.csv") -> list[str]:
    write(tmp / name, text)
    return ["evaluate-predictions", "--predictions", str(tmp / name), "--out", str(tmp / "out/metrics.json")]


def truncated_parquet() -> bytes:
    """A predictions parquet cut off half-way (an interrupted copy)."""
    buffer = io.BytesIO()
    pd.read_csv(io.StringIO(PRED_HEADER + PRED_ROWS)).to_parquet(buffer, index=False)
    data = buffer.getvalue()
    return data[: len(data) // 2]


def multihyp_argv(tmp: Path, *, mt=None, ref=None, human=None) -> list[str]:
    mt = mt if mt is not None else "The cat sat.\nA dog barked.\nRain fell today.\n"
    ref = ref if ref is not None else "The cat sat down.\nThe dog barked.\nIt rained today.\n"
    human = human if human is not None else "0.5\n-0.2\n0.1\n"
    write(tmp / "mt.txt", mt)
    write(tmp / "ref.txt", ref)
    write(tmp / "human.txt", human)
    return [
        "multihyp",
        *("--mt", str(tmp / "mt.txt"), "--ref", str(tmp / "ref.txt"), "--human", str(tmp / "human.txt")),
        *("--metric", "chrf", "--out", str(tmp / "out/corr.json")),
    ]


SRC = ["Der Hund schläft.", "Das Wetter ist schön.", "Ich habe Zeit."]
MT = ["The dog sleeps.", "The weather is nice.", "I have time."]
REF = ["The dog is sleeping.", "The weather is beautiful.", "I have got time."]


def score_argv(tmp: Path, *, src=None, mt=None, ref=None, model=None) -> list[str]:
    for name, lines in (("src", src or SRC), ("mt", mt or MT), ("ref", ref or REF)):
        if isinstance(lines, bytes):
            write(tmp / f"{name}.txt", lines)
        else:
            write_lines(tmp / f"{name}.txt", lines)
    argv = ["score", "-s", str(tmp / "src.txt"), "-t", str(tmp / "mt.txt"), "-r", str(tmp / "ref.txt")]
    argv += ["--model", model or f"models:/{REF_MODEL}@champion", "--no-progress"]
    return [*argv, "--out", str(tmp / "out/scores.jsonl")]


def not_a_model(tmp: Path) -> Path:
    folder = tmp / "notamodel"
    write(folder / "README.txt", "just some folder\n")
    return folder


def predict_argv(tmp: Path, *, model: Path | None = None, truncated: bool = False) -> list[str]:
    prep = tmp / "prep"
    prep.mkdir(parents=True, exist_ok=True)
    if truncated:
        data = pd.DataFrame({"src": ["a"] * 50, "mt": ["b"] * 50, "ref": ["c"] * 50, "score": 0.0})
        data.to_parquet(prep / "whole.parquet")
        write(prep / "test.parquet", (prep / "whole.parquet").read_bytes()[:200])
        (prep / "whole.parquet").unlink()
    else:
        pd.DataFrame({"src": ["a"], "mt": ["b"], "ref": ["c"], "score": [0.0]}).to_parquet(
            prep / "test.parquet"
        )
    params = write(tmp / "params.yaml", f"encode:\n  prepared_dir: {prep}\n")
    model = model or not_a_model(tmp)
    return ["predict", "--model", str(model), "--split", "test", "--params", str(params)] + [
        "--out",
        str(tmp / "out/pred.parquet"),
    ]


def incoming_file(tmp: Path, body: str, name: str = "batch.csv") -> Path:
    return write(tmp / "incoming" / name, body)


INCOMING_HEADER = "dataset,lp,src,mt,ref,score,system\n"


def record(**over) -> dict:
    return {"src": "Der Hund schläft.", "mt": "The dog sleeps.", "ref": "The dog is sleeping.", **over}


def body(payload) -> bytes:
    return json.dumps(payload).encode("utf-8")


# ============================================================================ the table
CASES = [
    # ---------------------------------------------------------------- data loaders
    Case(
        "loader-renamed-column",
        "call",
        lambda t: make_da(t, DA_SCORES.replace("Z.SCR", "ZSCORE")),
        DataError,
        r"ad-seg-scores-cs-en\.csv: missing column\(s\) \['Z\.SCR'\]; found .*'ZSCORE'.*renamed",
    ),
    Case(
        "loader-nan-score",
        "call",
        lambda t: make_da(t, DA_SCORES.replace("-0.5", "nan")),
        DataError,
        r"ad-seg-scores-cs-en\.csv: line 3: column 'Z\.SCR' must be a finite number, got 'nan'",
    ),
    Case(
        "loader-inf-score",
        "call",
        lambda t: make_mqm(t, MQM_SCORES.replace("-1.5", "-inf")),
        DataError,
        r"mqm_newstest2021_ende\.avg_seg_scores\.tsv: line 2: column 'mqm_avg_score' must be a finite number",
    ),
    Case(
        "loader-text-score",
        "call",
        lambda t: make_hter(t, "a,b,c,d,de-en,0.1\ne,f,g,h,de-en,high\n"),
        DataError,
        r"test\.smt\.de-en\.csv: line 3: column 'score' must be a finite number, got 'high'",
    ),
    Case(
        "loader-da-z-off-scale",  # a raw 0-100 DA score in the z-score column
        "call",
        lambda t: make_da(t, DA_SCORES.replace("-0.5", "75")),
        DataError,
        r"ad-seg-scores-cs-en\.csv: line 3: column 'Z\.SCR' = 75 is outside \[-20, 20\], the range of a DA z-score",
    ),
    Case(
        "loader-da-raw-off-scale",
        "call",
        lambda t: make_da(t, DA_SCORES.replace(" 80 ", " 800 ")),
        DataError,
        r"ad-seg-scores-cs-en\.csv: line 2: column 'RAW\.SCR' = 800 is outside \[0, 100\]",
    ),
    Case(
        "loader-mqm-sign-flipped",
        "call",
        lambda t: make_mqm(t, MQM_SCORES.replace("-1.5", "1.5")),
        DataError,
        r"avg_seg_scores\.tsv: line 2: column 'mqm_avg_score' = 1\.5 is outside \[-25, 0\], the range of a MQM",
    ),
    Case(
        "loader-hter-as-percent",
        "call",
        lambda t: make_hter(t, "a,b,c,d,de-en,0.1\ne,f,g,h,de-en,35\n"),
        DataError,
        r"test\.smt\.de-en\.csv: line 3: column 'score' = 35 is outside \[0, 5\], the range of a HTER",
    ),
    Case(
        "loader-duplicate-rating",
        "call",
        lambda t: make_da(t, DA_SCORES + "SysA.1 2 70 0.3 1 \n"),
        DataError,
        r"ad-seg-scores-cs-en\.csv: line 4: \(system, segment\) \('SysA\.1', 2\) is rated twice "
        r"\(lines 3 and 4, scores -0\.5 and 0\.3\)",
    ),
    Case(
        "loader-mqm-duplicate-rating",
        "call",
        lambda t: make_mqm(t, MQM_SCORES + "SysA\t-3\t1\n"),
        DataError,
        r"avg_seg_scores\.tsv: line 4: \(system, segment\) \('SysA', 1\) is rated twice \(lines 2 and 4",
    ),
    Case(
        "loader-unknown-lp",
        "call",
        lambda t: (make_da(t), lambda: loaders.load_wmt21_da(t, lps=("xx-yy",)))[1],
        DataError,
        r"wmt21_da: lp='xx-yy' not supported; choose from \['cs-en'",
    ),
    Case(
        "loader-whitespace-segment",
        "call",
        lambda t: make_da(t, hyp=b"Hullo.\n \t \n"),
        DataError,
        r"newstest2021\.cs-en\.hyp\.SysA\.en: line 2: system SysA output is empty or whitespace-only",
    ),
    Case(
        "loader-non-utf8",
        "call",
        lambda t: make_da(t, hyp=b"Hullo.\nH\xe9y.\n"),
        DataError,
        r"hyp\.SysA\.en: line 2: not valid UTF-8 \(byte 0xe9",
    ),
    Case(
        "loader-mismatched-line-counts",
        "call",
        lambda t: (make_multihyp_tar(t, n=5, short="mt.en"), lambda: loaders.load_multihyp_eten(t))[1],
        DataError,
        r"data\.tar\.gz:mt\.en: 4 lines, but DA-z\.scores has 5 scores",
    ),
    # ---------------------------------------------------------------- uamt data fetch / prepare
    Case(
        "fetch-sha256-mismatch",
        "cli",
        fetch_argv,
        2,
        r"uamt data: error: .*mirror/acme/corpus/scores\.tsv: sha256 mismatch: expected 0{64}, got [0-9a-f]{64}",
        out="raw/acme/corpus/scores.tsv",
    ),
    Case(
        "prepare-params-wrong-type",
        "cli",
        lambda t: prepare_argv(t, "  seed: thirteen\n"),
        2,
        r"params\.yaml:prepare\.seed: expected int, got 'thirteen'",
        out="prep/summary.json",
    ),
    Case(
        "prepare-params-unknown-key",
        "cli",
        lambda t: prepare_argv(t, "  max_row_per_lp: 10\n"),
        2,
        r"params\.yaml:prepare: unknown key\(s\) \['max_row_per_lp'\]; known keys are",
        out="prep/summary.json",
    ),
    Case(
        "prepare-text-in-score",
        "cli",
        lambda t: prepare_argv(t, scores=["0.1", "0.2", "good", *["0.0"] * 37]),
        2,
        r"data\.tar\.gz:DA-z\.scores: line 3: column 'DA-z' must be a finite number, got 'good'",
        out="prep/summary.json",
    ),
    # ---------------------------------------------------------------- uamt evaluate-predictions
    Case(
        "eval-renamed-column",
        "cli",
        lambda t: eval_argv(t, PRED_HEADER.replace("sigma", "std") + PRED_ROWS),
        2,
        r"pred\.csv: missing column\(s\) \['sigma'\]; expected columns lp, human, mu, sigma",
        out="out/metrics.json",
    ),
    Case(
        "eval-nan-human",
        "cli",
        lambda t: eval_argv(t, PRED_HEADER + "mlqe,en-de,1,s,NaN,0.1,0.2\n" + PRED_ROWS),
        2,
        r"pred\.csv: row 1 \(line 2\), column 'human': 'NaN' is not finite",
        out="out/metrics.json",
    ),
    Case(
        "eval-text-in-mu",
        "cli",
        lambda t: eval_argv(t, PRED_HEADER + PRED_ROWS + "mlqe,en-de,99,s,0.3,good,0.2\n"),
        2,
        r"pred\.csv: row 61 \(line 62\), column 'mu': 'good' is not a number",
        out="out/metrics.json",
    ),
    Case(
        "eval-inf-sigma",
        "cli",
        lambda t: eval_argv(t, PRED_HEADER + "mlqe,en-de,1,s,0.3,0.1,inf\n" + PRED_ROWS),
        2,
        r"pred\.csv: row 1 \(line 2\), column 'sigma': 'inf' is not finite",
        out="out/metrics.json",
    ),
    Case(
        "eval-truncated-parquet",
        "cli",
        lambda t: eval_argv(t, truncated_parquet(), "pred.parquet"),
        2,
        r"pred\.parquet: not a readable parquet file \(truncated or corrupt\?\)",
        out="out/metrics.json",
    ),
    Case(
        "eval-empty-table",
        "cli",
        lambda t: eval_argv(t, PRED_HEADER),
        2,
        r"pred\.csv: no data rows",
        out="out/metrics.json",
    ),
    # ---------------------------------------------------------------- uamt multihyp
    Case(
        "multihyp-mismatched-lines",
        "cli",
        lambda t: multihyp_argv(t, human="0.5\n-0.2\n"),
        2,
        r"line counts differ: .*mt\.txt has 3 lines but .*human\.txt has 2",
        out="out/corr.json",
    ),
    Case(
        "multihyp-text-score",
        "cli",
        lambda t: multihyp_argv(t, human="0.5\nbad\n0.1\n"),
        2,
        r"human\.txt:2: human score 'bad' is not a number",
        out="out/corr.json",
    ),
    Case(
        "multihyp-nan-score",
        "cli",
        lambda t: multihyp_argv(t, human="0.5\n-0.2\nnan\n"),
        2,
        r"human\.txt:3: human score 'nan' is not finite",
        out="out/corr.json",
    ),
    Case(
        "multihyp-non-utf8",
        "cli",
        lambda t: multihyp_argv(t, ref=b"The cat sat down.\nThe d\xf6g barked.\nIt rained today.\n"),
        2,
        r"ref\.txt:2: not valid UTF-8",
        out="out/corr.json",
    ),
    # ---------------------------------------------------------------- uamt score
    Case(
        "score-10mb-segment",  # decision: refused (MAX_SEGMENT_CHARS), naming the line
        "cli",
        lambda t: score_argv(t, mt=[MT[0], "x" * TEN_MB, MT[2]]),
        2,
        # refused while reading, after 4 x 100,000 bytes without a line break (never read whole)
        r"mt\.txt:2: segment of more than \d+ bytes without a line break is over the limit of 100000 "
        r"characters \(--max-segment-chars\); are the line breaks missing",
        out="out/scores.jsonl",
    ),
    Case(
        "score-whitespace-segment",
        "cli",
        lambda t: score_argv(t, src=[SRC[0], "  \t ", SRC[2]]),
        2,
        r"src\.txt:2: empty line \(every line must hold one segment\)",
        out="out/scores.jsonl",
    ),
    Case(
        "score-mismatched-lines",
        "cli",
        lambda t: score_argv(t, ref=REF[:2]),
        2,
        r"different line counts.*ref\.txt \(ref\): 2",
        out="out/scores.jsonl",
    ),
    Case(
        "score-non-utf8",
        "cli",
        lambda t: score_argv(t, mt=b"The dog sleeps.\nThe weather is nice.\nI have t\xefme.\n"),
        2,
        r"mt\.txt:3: not valid UTF-8 \(byte 0xef",
        out="out/scores.jsonl",
    ),
    Case(
        "score-not-a-model",
        "cli",
        lambda t: score_argv(t, model=str(not_a_model(t))),
        2,
        r"could not load model '.*notamodel'.*MLmodel",
        out="out/scores.jsonl",
    ),
    # ---------------------------------------------------------------- uamt predict / train
    Case(
        "predict-not-a-model",
        "cli",
        predict_argv,
        2,
        r"notamodel: not a trained model \(no model\.json",
        out="out/pred.parquet",
    ),
    Case(
        "predict-truncated-parquet",
        "cli",
        lambda t: predict_argv(t, truncated=True),
        2,
        r"test\.parquet",
        out="out/pred.parquet",
    ),
    Case(
        "train-params-wrong-type",
        "cli",
        lambda t: [
            "train",
            "--method",
            "hts",
            "--params",
            str(write(t / "params.yaml", "train_base:\n  max_epochs: many\n")),
            "--out",
            str(t / "out/model"),
        ],
        2,
        r"params\.yaml:train_base\.max_epochs: expected int, got 'many'",
        out="out/model",
    ),
    # ---------------------------------------------------------------- incoming annotations
    Case(
        "incoming-score-off-scale",
        "validate",
        lambda t: incoming_file(t, INCOMING_HEADER + "wmt21_mqm,en-de,Hallo.,Hello.,Hi.,7.5,sysX\n"),
        None,
        r"batch\.csv: row 1 \(line 2\): field 'score': 7\.5 outside the wmt21_mqm scale \[-25\.0, 0\.0\]",
    ),
    Case(
        "incoming-renamed-column",
        "validate",
        lambda t: incoming_file(t, INCOMING_HEADER.replace("score", "Score") + "mlqe,en-de,a,b,,0.1,s\n"),
        None,
        r"field 'score': required column missing \(found 'Score': wrong case\?\)",
    ),
    Case(
        "incoming-unknown-lp",
        "validate",
        lambda t: incoming_file(t, INCOMING_HEADER + "mlqe,xx-yy,a,b,,0.1,s\n"),
        None,
        r"row 1 \(line 2\): field 'lp': unknown language pair 'xx-yy' for mlqe",
    ),
    # ---------------------------------------------------------------- REST /invocations
    Case(
        "rest-malformed-json", "rest", lambda t: b'{"inputs": [{"src": "a", ', 400, r"body is not valid JSON"
    ),
    Case(
        "rest-missing-field",
        "rest",
        lambda t: body({"dataframe_records": [record(), {"src": "x", "ref": "y"}]}),
        400,
        r"record 1: missing field 'mt'",
    ),
    Case(
        "rest-renamed-field",
        "rest",
        lambda t: body({"dataframe_records": [{"src": "x", "translation": "y", "ref": "z"}]}),
        400,
        r"record 0: unknown field\(s\) \['translation'\]",
    ),
    Case(
        "rest-wrong-field-type",
        "rest",
        lambda t: body({"dataframe_records": [record(mt=42)]}),
        400,
        r"record 0\.mt must be a string, got int",
    ),
    Case(
        "rest-refs-not-a-list",
        "rest",
        lambda t: body({"inputs": [{"src": "x", "mt": "y", "refs": "z"}]}),
        400,
        r"record 0\.refs must be a non-empty list of strings",
    ),
    Case("rest-empty-batch", "rest", lambda t: body({"dataframe_records": []}), 400, r"empty batch"),
    Case(
        "rest-whitespace-segment",
        "rest",
        lambda t: body({"dataframe_records": [record(), record(src=" \n\t")]}),
        400,
        r"record 1\.src is empty",
    ),
    Case(
        "rest-10mb-segment",
        "rest",
        lambda t: body({"dataframe_records": [record(mt="y" * TEN_MB)]}),
        413,
        r"record 0\.mt has 10000000 characters, over the limit of 2000",
    ),
    Case("rest-non-utf8", "rest", lambda t: b'{"inputs": [{"src": "\xe9"}]}', 400, r"body is not UTF-8"),
    Case(
        "rest-split-wrong-shape",
        "rest",
        lambda t: body({"dataframe_split": {"columns": ["src", "mt", "ref"], "data": [["a", "b"]]}}),
        400,
        r"dataframe_split\.data\[0\] must be a list of 3 values",
    ),
]


# ============================================================================ fixtures and runners
# Every test runs against the fake scoring models' store (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("scoring_tracking")


@pytest.fixture(scope="module")
def server(scoring_store):
    import os

    os.environ["MLFLOW_TRACKING_URI"] = scoring_store
    uri = f"models:/{REF_MODEL}@champion"
    # Production limits (the `uamt serve` defaults): 2,000 characters per text, 16 MiB per body.
    with running_server(ScoringService(load_predictor(uri), uri, ServeSettings())) as srv:
        yield srv


def post(server, data: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("POST", "/invocations", body=data, headers={"Content-Type": content_type})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


@pytest.fixture
def cheap_features(monkeypatch):
    """`uamt predict` without loading the sentence encoder: the cases are about the model and input."""
    from types import SimpleNamespace

    from uamt.cli import models as cli_models
    from uamt.core.config import load_section
    from uamt.encoders import EncodeConfig
    from uamt.models import FeatureSource

    def features(params):
        cfg = load_section(EncodeConfig, "encode", params)
        fake = FeatureSource(lambda texts: np.zeros((len(texts), 2, 4), np.float32), encoder_id="fake")
        return SimpleNamespace(prepared_dir=cfg.prepared_dir), fake

    monkeypatch.setattr(cli_models, "_features", features)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() if p.is_file() else b"<dir>" for p in folder.iterdir()}


def _run_cli(case: Case, tmp_path: Path, capsys) -> None:
    from uamt.cli import main

    argv = case.setup(tmp_path)
    out = tmp_path / case.out
    write(out, PREVIOUS)  # the previous run's result, which a failed run must not touch
    before = _snapshot(out.parent)
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    assert code == case.expect, captured.err
    lines = captured.err.strip().splitlines()
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1, captured.err
    assert errors[0].startswith(f"uamt {argv[0]}: error: ")
    assert re.search(case.match, errors[0]), errors[0]
    assert out.read_bytes() == PREVIOUS, "a failed run changed the previous output"
    assert _snapshot(out.parent) == before, "a failed run left files (temp or partial) behind"


def _run(case: Case, tmp_path: Path, capsys, request) -> None:
    if case.kind == "cli":
        if case.id.startswith("predict"):
            request.getfixturevalue("cheap_features")
        _run_cli(case, tmp_path, capsys)
    elif case.kind == "call":
        call = case.setup(tmp_path)
        with pytest.raises(case.expect, match=case.match):
            call()
    elif case.kind == "validate":
        from uamt.ingest import validate_file

        check = validate_file(case.setup(tmp_path))
        assert not check.ok
        assert re.search(case.match, check.report()), check.report()
    elif case.kind == "rest":
        srv = request.getfixturevalue("server")
        status, payload = post(srv, case.setup(tmp_path))
        assert status == case.expect, payload
        assert payload.get("status") == status
        assert re.search(case.match, payload["error"]), payload
        ok_status, ok = post(srv, body({"dataframe_records": [record()]}))  # still serving
        assert ok_status == 200 and len(ok["predictions"]) == 1
    else:  # pragma: no cover - a typo in the table
        raise AssertionError(f"unknown case kind {case.kind!r}")


def _params():
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        yield pytest.param(case, id=case.id, marks=marks)


def test_table_is_big_and_ids_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 25
    assert {c.kind for c in CASES} == {"cli", "call", "validate", "rest"}


@pytest.mark.parametrize("case", list(_params()))
def test_bad_input_is_refused_clearly_and_leaves_no_trace(case, tmp_path, capsys, request):
    _run(case, tmp_path, capsys, request)


# ============================================================================ a BOM is not an error
BOM = b"\xef\xbb\xbf"


def test_bom_is_stripped_by_loaders(tmp_path):
    load = make_da(tmp_path, hyp=BOM + b"Hullo.\nHey.\n")
    score_file = tmp_path / WMT / "humaneval/newstest2021-toen/ad-seg-scores-cs-en.csv"
    score_file.write_bytes(BOM + score_file.read_bytes())
    df = load()
    assert df.mt.tolist() == ["Hullo.", "Hey."] and df.score.tolist() == [0.5, -0.5]


def test_bom_is_stripped_by_score(tmp_path, capsys):
    from uamt.cli import main

    argv = score_argv(tmp_path)
    (tmp_path / "out").mkdir()
    assert main(argv) == 0, capsys.readouterr().err
    plain = (tmp_path / "out/scores.jsonl").read_bytes()
    for name in ("src", "mt", "ref"):
        path = tmp_path / f"{name}.txt"
        path.write_bytes(BOM + path.read_bytes())
    assert main(argv) == 0
    assert (tmp_path / "out/scores.jsonl").read_bytes() == plain


def test_bom_is_stripped_by_multihyp(tmp_path, capsys):
    from uamt.cli import main

    argv = multihyp_argv(tmp_path)
    assert main(argv) == 0
    plain = json.loads((tmp_path / "out/corr.json").read_text())
    for name in ("mt", "ref", "human"):
        path = tmp_path / f"{name}.txt"
        path.write_bytes(BOM + path.read_bytes())
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "out/corr.json").read_text())["pearson"] == plain["pearson"]


def test_bom_is_stripped_by_evaluate_predictions(tmp_path, capsys):
    from uamt.cli import main

    argv = eval_argv(tmp_path, BOM + (PRED_HEADER + PRED_ROWS).encode())
    (tmp_path / "out").mkdir()
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "out/metrics.json").read_text())["n_segments"] == 60


def test_bom_is_stripped_by_incoming_validator(tmp_path):
    from uamt.ingest import validate_file

    path = incoming_file(tmp_path, "")
    path.write_bytes(BOM + (INCOMING_HEADER + "mlqe,en-de,Hallo.,Hello.,,0.1,s\n").encode())
    check = validate_file(path)
    assert check.ok, check.report()


def test_bom_is_stripped_by_rest(server):
    status, payload = post(server, BOM + body({"dataframe_records": [record()]}))
    assert status == 200, payload
    assert len(payload["predictions"]) == 1


def test_evaluate_predictions_reads_predict_parquet(tmp_path, capsys):
    """`uamt predict` writes parquet by default; evaluate-predictions takes it as it is."""
    from uamt.cli import main

    frame = pd.read_csv(io.StringIO(PRED_HEADER + PRED_ROWS))
    frame.to_parquet(tmp_path / "pred.parquet", index=False)
    frame.to_csv(tmp_path / "pred.csv", index=False)
    for name in ("pred.parquet", "pred.csv"):
        out = tmp_path / f"{name}.json"
        assert main(["evaluate-predictions", "--predictions", str(tmp_path / name), "--out", str(out)]) == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("pred.parquet", "pred.csv"))
    assert a["methods"] == b["methods"]
