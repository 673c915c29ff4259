"""The README's results table and docs/results.md's per-LP table say what the committed metrics say.

The README's table is written by hand from ``metrics/test.json`` and ``metrics/conditional.json``,
docs/results.md's first table is ``benchmarks/served_tables.py``'s; a cold run that re-records the
metrics (or a change of the served model) must not leave either stale.  Each row is read back and
every number compared with the metrics file at the digits the page shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.served_tables import per_lp_table

ROOT = Path(__file__).resolve().parents[1]

#: README row label -> the metrics key it reports.
MODELS = {
    "`uamt-comet` (HTS)": "hts",
    "`uamt-comet-qe` (HTS, no reference)": "hts_qe",
}
#: README row label -> the served model whose baseline (its point estimate + the same calibration) it is.
BASELINES = {
    "point estimate + the same calibration": "hts",
    "point estimate, no reference + the same calibration": "hts_qe",
}
COLUMNS = ["model", "LP", "segments", "PPS (Pearson)", "90 % coverage", "90 % width (MQM)",
           "misses below / above", "CRPS"]


def results_rows(readme: str) -> list[dict[str, str]]:
    """The rows of the first table under ``## Results``, as ``{column: cell}``; a blank model cell
    repeats the row above's (the README groups a model's LPs)."""
    section = readme.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    if header != COLUMNS:
        raise AssertionError(f"README ## Results: columns {header}, expected {COLUMNS}")
    rows, model = [], None
    for line in lines[2:]:
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        model = cells["model"] or model
        rows.append({**cells, "model": model})
    return rows


def expected_cells(model_label: str, lp: str, test: dict, conditional: dict) -> dict[str, str]:
    if model_label in MODELS:
        m = test[MODELS[model_label]]["avg" if lp == "average" else lp]
        return {
            "segments": f"{m['n']:,}",
            "PPS (Pearson)": f"{m['pps']:.3f}",
            "90 % coverage": f"{m['coverage@0.9']:.3f}",
            "90 % width (MQM)": f"{m['width@0.9']:.2f}",
            "misses below / above": f"{m['miss_below@0.9']:.3f} / {m['miss_above@0.9']:.3f}",
            "CRPS": f"{m['crps']:.3f}",
        }
    base = conditional[BASELINES[model_label]]["baseline"]
    assert lp == "average", f"README baseline row {model_label!r} has LP {lp!r}; only the average is kept"
    return {
        "segments": f"{test[BASELINES[model_label]]['avg']['n']:,}",
        "PPS (Pearson)": f"{base['pps']:.3f}",
        "90 % coverage": f"{base['coverage']:.3f}",
        "90 % width (MQM)": f"{base['width']:.2f}",
        "CRPS": f"{base['crps']:.3f}",
    }


def test_readme_results_table_matches_the_committed_metrics():
    rows = results_rows((ROOT / "README.md").read_text(encoding="utf-8"))
    test = json.loads((ROOT / "metrics" / "test.json").read_text())
    conditional = json.loads((ROOT / "metrics" / "conditional.json").read_text())
    assert {row["model"] for row in rows} == set(MODELS) | set(BASELINES)
    stale = []
    for row in rows:
        for column, want in expected_cells(row["model"], row["LP"], test, conditional).items():
            if row[column] != want:
                stale.append(f"{row['model']} {row['LP']} {column}: README {row[column]!r}, metrics {want!r}")
    assert not stale, "README ## Results is stale:\n" + "\n".join(stale)


def test_a_changed_header_is_refused():
    with pytest.raises(AssertionError, match="columns"):
        results_rows("x\n## Results\n\n| model | LP |\n|---|---|\n| a | b |\n## Next\n")


def test_results_page_per_lp_table_is_served_tables_output():
    """docs/results.md's first table, line for line, is what ``python benchmarks/served_tables.py``
    prints from the committed ``metrics/test.json``."""
    want = per_lp_table(json.loads((ROOT / "metrics" / "test.json").read_text()))
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8").splitlines()
    start = page.index(want[0])
    got = page[start : start + len(want)]
    stale = [f"docs/results.md line {start + i + 1}: {g!r}, metrics give {w!r}" for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w]
    assert not stale and len(got) == len(want), "docs/results.md's per-LP table is stale (paste served_tables.py's):\n" + "\n".join(stale[:10])


def test_served_tables_refuses_a_metrics_path_that_is_not_the_folder(capsys):
    from benchmarks.served_tables import main

    with pytest.raises(SystemExit):
        main(["--metrics", str(ROOT / "metrics" / "test.json")])
    assert "no test.json there (--metrics names the folder of the metrics files)" in capsys.readouterr().err
