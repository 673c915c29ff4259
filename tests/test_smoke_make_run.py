"""The README's first command, proven: ``make run`` on a fresh ``git clone`` of the committed tree ends
with ``@champion`` for both models, and ``uamt score`` answers with them.

The smoke profile (tests/smoke/params.smoke.yaml merged onto the clone's params.yaml) is the whole
pipeline -- every dvc.yaml stage, the same code, the Makefile's own ``run`` recipe -- on a tiny slice
of the data mirror (~1,850 WMT21 MQM rows, one biomedical abstract per direction, ~3,050 texts to
encode), offline, reusing the test environment (tests/smoke/harness.py).  A second ``make run`` on
the same tree must register nothing again.  No metric value is checked: the models are tiny; the
numbers are the pipeline's business (other tests).

The clone is the session fixture ``smoke`` of tests/conftest.py, built once and shared with
tests/test_pipeline_e2e.py, which checks the outputs it left (the metrics of every model and LP, the
registered models loaded in-process); the second ``make run`` (marked ``smoke_mutates``) runs after
every test reading the clone, whatever order the files are given in.

Measured (2026-11-25) on a 2-core machine shared with other pipelines and test runs: this module
10.5 min at a load average of 4-6 (the first ``make run`` 586 s: prepare 47 s, encode 87 s at
35 texts/s, calibrate 107 s, evaluate 134 s, ...); by hand (tests/smoke/harness.py) at a load
average of 11-18, 40 min (calibrate 732 s, evaluate 776 s, encode 279 s at 11 texts/s) and 57 s for
the second ``make run``.  On 2 idle cores (ONNX MiniLM ~140 texts/s) it should take less.
With tests/test_pipeline_e2e.py (2026-12-06, load average 3-4): both modules 1,047 s, the shared
first ``make run`` 973 s, the second 33 s.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml

from tests.smoke import harness
from uamt.registry.store import SUMMARY_PATH

pytestmark = pytest.mark.slow

MODELS = ("uamt-comet", "uamt-comet-qe")


def champion_rows(clone, env, name: str) -> list[list[str]]:
    shown = harness.uamt(clone, env, "registry", "show", "--name", name)
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines()[1:]]
    return [row for row in rows if row and row[0].isdigit()]  # version rows, not the column header


def assert_only_version_1_is_champion(clone, env, name: str) -> None:
    rows = champion_rows(clone, env, name)
    assert [(row[0], "champion" in row[1].split(","), row[2]) for row in rows] == [("1", True, "passed")], rows


def test_fresh_clone_make_run_runs_every_stage_and_ends_with_both_champions(smoke):
    clone, _, log = smoke
    stages = yaml.safe_load((clone / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    ran = re.findall(r"Running stage '([a-z_]+)'", log)
    assert sorted(ran) == sorted(stages), f"stages not run: {sorted(set(stages) - set(ran))}"
    assert "didn't change, skipping" not in log
    checked = log.strip().splitlines()[-len(MODELS) :]  # `uamt registry check`, the recipe's last command
    for name, line in zip(MODELS, checked, strict=True):
        assert line.startswith(f"{name}: @champion is version 1 (passed: first version"), checked
    summary = json.loads((clone / SUMMARY_PATH).read_text(encoding="utf-8"))
    assert (summary["model_name"], summary["version"], summary["promoted"]) == ("uamt-comet", "1", True)
    assert (summary["qe"]["model_name"], summary["qe"]["promoted"]) == ("uamt-comet-qe", True)


@pytest.mark.parametrize("name", MODELS)
def test_registry_show_names_the_champion(smoke, name):
    clone, env, _ = smoke
    assert_only_version_1_is_champion(clone, env, name)


@pytest.mark.parametrize(("with_refs", "model"), [(True, "uamt-comet"), (False, "uamt-comet-qe")])
def test_uamt_score_answers_with_the_champion(smoke, with_refs, model):
    clone, env, _ = smoke
    scored = harness.score_segments(clone, env, with_refs)
    assert scored.returncode == 0, scored.stderr
    records = [json.loads(line) for line in scored.stdout.splitlines()]
    segments, summary = records[:-1], records[-1]["summary"]
    assert summary["model"] == f"models:/{model}@champion" and summary["n_segments"] == 2, summary
    assert len(segments) == 2
    for row in segments:
        values = [row[key] for key in ("mu", "sigma", "lower", "upper", "risk")]
        assert all(math.isfinite(v) for v in values), row
        assert row["sigma"] > 0 and row["lower"] <= row["mu"] <= row["upper"] and 0 <= row["risk"] <= 1, row


@pytest.mark.smoke_mutates  # after every reader of the shared clone (tests/conftest.py)
def test_second_make_run_registers_nothing_again(smoke, tmp_path):
    clone, env, _ = smoke
    code, _, log = harness.make_run(clone, env, tmp_path / "make-run-2.log")
    assert code == 0, log[-6000:]
    # No stage runs again, encode included: its output is the persisted embedding cache (dvc.yaml:
    # persist, hashed), and the texts only later stages read (training's synthetic failure rows, the
    # experiments' perturbed translations...) go to caches of their own (uamt.pipeline_config.open_features).
    ran = re.findall(r"Running stage '([a-z_]+)'", log)
    assert ran == [] and "Stage 'register' didn't change, skipping" in log, log[-3000:]
    for name in MODELS:
        assert_only_version_1_is_champion(clone, env, name)
