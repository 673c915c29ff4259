"""`uamt rerank` and `uamt select-for-annotation` end to end through the fake scoring models' store,
and `uamt score --flag-below` reading the served risk at its own threshold."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_scoring_support import REF_MODEL, fake_mu_ref

from uamt.cli import main

pytestmark = pytest.mark.usefixtures("scoring_tracking")

SRC = "Der Hund schläft im Garten."
CANDIDATES = ["The dog sleeps in the garden.", "Dog garden sleep.", "The dog is sleeping in the garden.", "Garden."]
REF = "The dog is sleeping in the garden."


@pytest.fixture
def inputs(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"register:\n  model_name: {REF_MODEL}\n", encoding="utf-8")
    table = pd.DataFrame(
        {
            "group": ["s1"] * 4 + ["s2"] * 2,
            "src": [SRC] * 4 + ["Ich habe keine Zeit."] * 2,
            "mt": [*CANDIDATES, "I have no time.", "Time no."],
            "ref": [REF] * 4 + ["I don't have time."] * 2,
            "system": ["A", "B", "C", "D", "A", "B"],
        }
    )
    path = tmp_path / "candidates.csv"
    table.to_csv(path, index=False)
    return {"dir": tmp_path, "params": params, "candidates": path, "table": table}


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_rerank_mu_picks_the_highest_served_mu_per_group(inputs):
    out = inputs["dir"] / "picks.jsonl"
    argv = ["rerank", "--input", str(inputs["candidates"]), "--out", str(out), "--rule", "mu", "--params", str(inputs["params"])]
    assert main(argv) == 0
    picks = _read_jsonl(out)
    table = inputs["table"]
    expected = [
        table.iloc[[i for i in range(len(table)) if table["group"][i] == g]]
        .assign(mu=lambda t: [fake_mu_ref(m, [r]) for m, r in zip(t["mt"], t["ref"], strict=True)])
        .sort_values("mu", ascending=False, kind="stable")["mt"]
        .iloc[0]
        for g in ("s1", "s2")
    ]
    assert [p["group"] for p in picks] == ["s1", "s2"]
    assert [p["mt"] for p in picks] == expected
    assert {"mu", "lower", "upper", "risk", "abstain", "rule", "system", "risk_threshold"} <= set(picks[0])


def test_rerank_mbr_scores_candidates_against_each_other(inputs):
    out = inputs["dir"] / "picks.csv"
    argv = ["rerank", "--input", str(inputs["candidates"]), "--out", str(out), "--rule", "mbr", "--params", str(inputs["params"])]
    assert main(argv) == 0
    picks = pd.read_csv(out)
    utilities = [fake_mu_ref(m, [o for o in CANDIDATES if o != m]) for m in CANDIDATES]
    assert picks.loc[0, "mt"] == CANDIDATES[int(np.argmax(utilities))]
    assert picks.loc[0, "mu"] == pytest.approx(max(utilities), rel=1e-5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rule", "best"], "rule='best' not supported; choose from ['lcb', 'mbr', 'mbr_lcb', 'mu', 'risk']"),
        (["--group-column", "source"], "no group column 'source'"),
        (["--max-risk", "2"], "argument --max-risk: must be a probability in [0, 1], got '2'"),
    ],
)
def test_rerank_refusals_name_the_problem(inputs, capsys, extra, message):
    out = inputs["dir"] / "picks.jsonl"
    argv = ["rerank", "--input", str(inputs["candidates"]), "--out", str(out), "--params", str(inputs["params"]), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_rerank_mbr_refuses_a_group_of_one(inputs, capsys):
    single = inputs["dir"] / "single.csv"
    inputs["table"].iloc[:5].to_csv(single, index=False)
    argv = ["rerank", "--input", str(single), "--out", str(inputs["dir"] / "p.jsonl"), "--rule", "mbr", "--params", str(inputs["params"])]
    assert main(argv) == 2
    assert "group 's2' has one candidate: MBR needs at least two" in capsys.readouterr().err


def test_select_for_annotation_writes_the_incoming_format(inputs, capsys):
    pool = inputs["table"].drop(columns=["group"]).assign(lp="de-en", doc=["d1", "d1", "d1", "d1", "d2", "d2"])
    pool_path = inputs["dir"] / "pool.parquet"
    pool.to_parquet(pool_path)
    out = inputs["dir"] / "to_annotate.csv"
    argv = [
        "select-for-annotation", "--pool", str(pool_path), "--budget", "3", "--out", str(out),
        "--dataset", "wmt23_mqm", "--params", str(inputs["params"]),
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "by diversity (epistemic sigma of models:/uamt-test@champion)" in err
    chosen = pd.read_csv(out, keep_default_na=False)
    assert list(chosen.columns) == ["dataset", "lp", "src", "mt", "ref", "system", "doc", "seg_id", "score"]
    assert len(chosen) == 3 and set(chosen["doc"]) == {"d1", "d2"}  # diversity: both documents
    assert (chosen["score"] == "").all() and (chosen["dataset"] == "wmt23_mqm").all()


def test_select_for_annotation_needs_a_dataset(inputs, capsys):
    pool = inputs["dir"] / "pool.csv"
    inputs["table"].assign(lp="de-en").to_csv(pool, index=False)
    argv = ["select-for-annotation", "--pool", str(pool), "--budget", "2", "--out", str(inputs["dir"] / "o.csv")]
    assert main(argv) == 2
    assert "no dataset column; pass --dataset" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["rerank", "select-for-annotation"])
def test_help_shows_examples(command, capsys):
    assert main([command, "--help"]) == 0
    assert "examples:" in capsys.readouterr().out


def test_rerank_reads_hypothesis_files_line_by_line(inputs):
    from test_scoring_support import write_lines

    d = inputs["dir"]
    src = write_lines(d / "src.txt", [SRC, "Ich habe keine Zeit."])
    hyps = [
        write_lines(d / "hyp.1.txt", ["Dog garden sleep.", "I have no time."]),
        write_lines(d / "hyp.2.txt", ["The dog is sleeping in the garden.", "Time no."]),
    ]
    ref = write_lines(d / "ref.txt", [REF, "I don't have time."])
    out = d / "picks.jsonl"
    argv = ["rerank", "-s", str(src), "--hyp", str(hyps[0]), "--hyp", str(hyps[1]), "-r", str(ref),
            "--out", str(out), "--rule", "mu", "--params", str(inputs["params"])]
    assert main(argv) == 0
    picks = _read_jsonl(out)
    assert [(p["group"], p["hyp_rank"], p["mt"]) for p in picks] == [
        (1, 2, "The dog is sleeping in the garden."),
        (2, 1, "I have no time."),
    ]


def test_rerank_needs_one_kind_of_input(inputs, capsys):
    out = inputs["dir"] / "p.jsonl"
    assert main(["rerank", "--out", str(out), "--params", str(inputs["params"])]) == 2
    assert "either as --input FILE or as --src FILE with --hyp FILE" in capsys.readouterr().err
