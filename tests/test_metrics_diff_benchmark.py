"""benchmarks/metrics_diff.py: two metrics files compared number by number."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.metrics_diff import compare, main, relative_difference


def test_relative_difference_hand_values():
    assert relative_difference(1.0, 1.0) == 0.0
    assert relative_difference(0.0, 0.0) == 0.0
    assert relative_difference(2.0, 1.0) == 0.5
    assert relative_difference(-1.0, 1.0) == 2.0
    assert relative_difference(math.nan, math.nan) == 0.0
    assert relative_difference(math.nan, 1.0) == math.inf


def test_compare_counts_numbers_and_names_every_other_change():
    a = {"hts": {"served": "signed", "pps": 0.5, "n": 3, "goals": [{"met": True, "value": 0.05}], "seconds": 9.0}}
    b = {"hts": {"served": "scale_nll", "pps": 0.5005, "n": 3, "goals": [{"met": False, "value": 0.05}, {}], "seconds": 7.0}}
    diff = compare(a, b, ignore=frozenset({"seconds"}))
    assert diff.equal == 2  # n, goals[0].value
    assert diff.moved == [(pytest.approx(0.0005 / 0.5005), "hts.pps")]
    assert sorted(w for w, _, _ in diff.changed) == ["hts.goals", "hts.goals[0].met", "hts.served"]
    s = diff.summary()
    assert (s["numbers"], s["equal"], s["moved"], s["changed"]) == (3, 2, 1, 3)
    assert s["max_at"] == "hts.pps"
    # a boolean is not a number: True -> 1 would otherwise count as a numeric move
    assert compare({"x": True}, {"x": 1}).changed == [("x", "true", "1")]


def test_main_compares_two_folders_file_by_file(tmp_path, capsys):
    for side, pps in (("a", 0.4), ("b", 0.4)):
        (tmp_path / side / "experiments").mkdir(parents=True)
        (tmp_path / side / "test.json").write_text(json.dumps({"hts": {"pps": pps}}))
        (tmp_path / side / "experiments" / "ood.json").write_text(json.dumps({"r": [1, 2]}))
    (tmp_path / "b" / "experiments" / "ood.json").write_text(json.dumps({"r": [1, 2.5]}))
    (tmp_path / "a" / "only.json").write_text("{}")
    out = tmp_path / "report.json"
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "test.json: 1 of 1 numbers equal; 0 non-numbers differ" in printed
    assert "experiments/ood.json: 1 of 2 numbers equal; the other 1 relative median 2.0e-01" in printed
    assert "only.json: only in a" in printed
    report = json.loads(out.read_text())
    assert report["experiments/ood.json"]["max_at"] == "r[1]"


def test_main_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(SystemExit, match="no such file or folder"):
        main([str(tmp_path / "missing.json"), str(tmp_path)])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SystemExit, match=r"bad\.json: not JSON"):
        main([str(tmp_path / "bad.json"), str(tmp_path / "bad.json")])
    with pytest.raises(SystemExit, match="write git:<ref>:<path>"):
        main(["git:HEAD", str(tmp_path)])


def test_main_reads_a_committed_file():
    # the committed metrics against themselves: every number equal
    assert main(["git:HEAD:metrics/test.json", "git:HEAD:metrics/test.json"]) == 0
