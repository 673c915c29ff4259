"""How long a cold ``make run`` takes, stage by stage, against the 40-minute bound (issue 25).

Clones a commit of this repository into ``DEST/clone``, runs the README's ``make run`` there as a new
user would (``env -i``: only ``HOME`` and a plain ``PATH``; ``--fresh-home`` also gives it an empty
``HOME``, so no pip configuration, pip cache or ``~/.cache/uamt`` is reused), prefixes every output
line with the time it arrived (``DEST/make-run.log``) and prints what each stage took, when both
champions were registered and the whole run::

    python benchmarks/cold_run.py /tmp/cold [--commit HEAD] [--fresh-home] [--json out.json]
    python benchmarks/cold_run.py --from-log /tmp/cold/make-run.log    # read an earlier run's log

Each line of the log is ``<unix seconds> <line>``; the start is the first line's time (``make``
echoes its first command at once).  A stage's time is the wall time from DVC's ``Running stage``
line to its ``Updating lock file`` line; "champions" is when ``register``'s ended.
The clone sits beside nothing: it finds the data mirror through ``UAMT_DATA_MIRROR``, which is
passed on when set (else the Makefile looks for ``../shared/data/github`` beside the clone, and
without one the pinned URLs are downloaded).  Run it on a quiet machine: the numbers are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The cost bound of issue 25: a cold ``dvc repro`` on 2 cores.
BOUND_MIN = 40.0
#: What DVC prints once a stage has run and its outputs are recorded.
LOCKED = "Updating lock file"
RUNNING = re.compile(r"Running stage '(?P<stage>[a-z_]+)'")


@dataclass
class ColdRun:
    """What :func:`parse_log` reads from a timestamped ``make run`` log (seconds)."""

    stages: dict[str, float] = field(default_factory=dict)
    setup_s: float | None = None
    champions_s: float | None = None
    total_s: float | None = None
    exit_code: int | None = None

    def within_bound(self, bound_min: float = BOUND_MIN) -> bool | None:
        return None if self.champions_s is None else self.champions_s <= 60.0 * bound_min


def parse_log(lines, exit_code: int | None = None) -> ColdRun:
    """``lines``: ``"<unix seconds> <text>"`` each.  A stage runs from DVC's ``Running stage '<name>'``
    to its ``Updating lock file`` (to the next stage or the last line where a stage failed): wall
    time, the interpreter's start-up included.  A line without a leading time is refused, naming
    its number, so a log of another shape cannot pass for an empty run."""
    run = ColdRun(exit_code=exit_code)
    start = last = None
    current = None  # (stage, started)
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stamp, _, text = line.partition(" ")
        try:
            when = float(stamp)
        except ValueError:
            raise ValueError(f"log line {number}: expected '<unix seconds> <text>', got {line[:80]!r}") from None
        start = when if start is None else start
        last = when
        running = RUNNING.search(text)
        if (running or LOCKED in text) and current is not None:
            run.stages[current[0]] = when - current[1]
            if current[0] == "register":
                run.champions_s = when - start
            current = None
        if running:
            if run.setup_s is None:
                run.setup_s = when - start
            current = (running["stage"], when)
    if start is None:
        raise ValueError("the log is empty")
    if current is not None:  # the run stopped inside a stage
        run.stages[current[0]] = last - current[1]
    run.total_s = last - start
    return run


def report(run: ColdRun, bound_min: float = BOUND_MIN) -> str:
    def minutes(seconds):
        return "-" if seconds is None else f"{seconds / 60:.1f} min"

    rows = [f"{'set-up (before the first stage)':40s} {run.setup_s or 0:8.0f} s"]
    rows += [f"{stage:40s} {seconds:8.0f} s" for stage, seconds in run.stages.items()]
    verdict = {True: "within", False: "OVER", None: "not reached"}[run.within_bound(bound_min)]
    rows += [
        f"both champions registered after {minutes(run.champions_s)} ({verdict} the {bound_min:g}-min bound)",
        f"whole run {minutes(run.total_s)}" + ("" if run.exit_code is None else f", exit code {run.exit_code}"),
    ]
    return "\n".join(rows)


def run_cold(dest: Path, commit: str, fresh_home: bool) -> tuple[Path, int]:
    """Clone ``commit`` into ``dest/clone`` and run ``make run`` there; returns the log and the exit code."""
    dest.mkdir(parents=True, exist_ok=False)
    clone = dest / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    home = dest / "home" if fresh_home else Path(os.environ.get("HOME", "/root"))
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    if os.environ.get("UAMT_DATA_MIRROR"):
        env["UAMT_DATA_MIRROR"] = os.environ["UAMT_DATA_MIRROR"]
    log = dest / "make-run.log"
    with log.open("w", encoding="utf-8") as out:
        out.write(f"{time.time():.0f} make run in {clone} (commit {commit}, HOME={home})\n")
        process = subprocess.Popen(
            ["make", "run"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        for line in process.stdout:
            out.write(f"{time.time():.0f} {line}")
            out.flush()
        code = process.wait()
        out.write(f"{time.time():.0f} make run exited {code}\n")
    return log, code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", nargs="?", type=Path, help="a new folder for the clone and the log")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--fresh-home", action="store_true", help="an empty HOME: no pip configuration or caches")
    parser.add_argument("--from-log", type=Path, help="read a log this script (or `ts`-style stamping) wrote")
    parser.add_argument("--bound-min", type=float, default=BOUND_MIN)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    if (args.dest is None) == (args.from_log is None):
        parser.error("give DEST (run) or --from-log LOG (read), not both")
    code = None
    if args.from_log is None:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", args.commit], check=True, capture_output=True, text=True
        ).stdout.strip()
        log, code = run_cold(args.dest, commit, args.fresh_home)
    else:
        log = args.from_log
    with log.open(encoding="utf-8", newline="\n") as lines:  # a progress bar's "\r" does not end a line
        run = parse_log(lines, exit_code=code)
    print(report(run, args.bound_min))
    if args.json:
        args.json.write_text(json.dumps({**asdict(run), "bound_min": args.bound_min}, indent=2) + "\n", encoding="utf-8")
    return 0 if code in (None, 0) else code


if __name__ == "__main__":
    sys.exit(main())
