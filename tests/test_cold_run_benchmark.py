"""benchmarks/cold_run.py reads a timestamped ``make run`` log into stage times and the champions' time."""

from __future__ import annotations

import json

import pytest

from benchmarks.cold_run import ColdRun, main, parse_log, report

LOG = """\
1000 test -x .venv/bin/python || python3.11 -m venv .venv
1003 .venv/bin/uamt registry init
1170 Running stage 'fetch':
1171 stage fetch: done in 1.1 s
1172 Updating lock file 'dvc.lock'
1172 Running stage 'encode':
1180 encoded 4096/104160 new texts\rDownloading artifacts: 100%
2064 Updating lock file 'dvc.lock'

2065 Running stage 'register':
3400 Updating lock file 'dvc.lock'
3401 Running stage 'exp_methods':
4020 Updating lock file 'dvc.lock'
4030 uamt-comet: @champion is version 1
"""

def test_stage_times_champions_and_total_are_read_from_the_stamps():
    run = parse_log([line + "\n" for line in LOG.split("\n")], exit_code=0)
    # from each "Running stage" to its "Updating lock file": encode prints no "done in" line of its own
    assert run.stages == {"fetch": 2.0, "encode": 892.0, "register": 1335.0, "exp_methods": 619.0}
    assert run.setup_s == 170.0  # the first stage starts 170 s after the first line
    assert run.champions_s == 2400.0  # register done at 3400, the run started at 1000
    assert run.total_s == 3030.0
    assert run.within_bound(40.0) is True  # exactly 40 min counts as within
    assert run.within_bound(39.9) is False


def test_a_run_that_never_registered_is_not_within_the_bound():
    run = parse_log(["10 Running stage 'fetch':\n", "12 Updating lock file 'dvc.lock'\n", "13 Running stage 'prepare':\n", "20 error\n"])
    assert run.champions_s is None and run.within_bound() is None
    assert run.stages == {"fetch": 2.0, "prepare": 7.0}  # the failed stage: until the last line
    assert "not reached" in report(run)


def test_a_line_without_a_time_is_refused_with_its_number():
    with pytest.raises(ValueError, match=r"log line 2: expected '<unix seconds> <text>'"):
        parse_log(["10 make run\n", "stage fetch: done in 1.0 s\n"])
    with pytest.raises(ValueError, match="empty"):
        parse_log(["\n"])


def test_from_log_prints_the_table_and_writes_json(tmp_path, capsys):
    log = tmp_path / "make-run.log"
    log.write_text(LOG, encoding="utf-8", newline="\n")  # its "\r" (a progress bar) stays inside a line
    out = tmp_path / "cold.json"
    assert main(["--from-log", str(log), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "both champions registered after 40.0 min (within the 40-min bound)" in printed
    assert json.loads(out.read_text())["stages"]["encode"] == 892.0
    assert ColdRun(**{k: v for k, v in json.loads(out.read_text()).items() if k != "bound_min"}).champions_s == 2400.0


def test_dest_and_from_log_are_exclusive(tmp_path):
    with pytest.raises(SystemExit):
        main([])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "x"), "--from-log", str(tmp_path / "log")])


def test_a_run_clones_the_commit_and_stamps_make_runs_output(tmp_path, monkeypatch, capsys):
    """:func:`run_cold` on a stand-in repository whose ``make run`` prints what DVC prints."""
    import subprocess

    import benchmarks.cold_run as cold_run

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "Makefile").write_text(
        "run:\n"
        "\t@echo \"Running stage 'register':\"\n"
        "\t@echo \"HOME=$$HOME\"\n"
        "\t@echo \"Updating lock file 'dvc.lock'\"\n"
        "\t@printf 'Downloading artifacts: 50%%\\rDownloading artifacts: 100%%\\n'\n"
        "\t@exit 3\n",
        encoding="utf-8",
    )
    for command in (["init", "-q"], ["add", "Makefile"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"]):
        subprocess.run(["git", *command], cwd=repo, check=True)
    monkeypatch.setattr(cold_run, "REPO_ROOT", repo)
    dest = tmp_path / "cold"
    assert cold_run.main([str(dest), "--fresh-home"]) == 2  # make's exit code when a recipe fails
    log = (dest / "make-run.log").read_text(encoding="utf-8")
    assert f"HOME={dest / 'home'}" in log  # --fresh-home: an empty HOME of its own
    assert (dest / "clone" / "Makefile").is_file()
    assert "register" in capsys.readouterr().out
    assert "make run exited 2" in log
