"""`uamt score` start-up: wall time and peak memory of scoring 10 segments, as a user runs it.

Writes 10 real test segments (``--lp``, with references; and without, for the QE model) to files,
runs ``uamt score`` once to warm the disk cache, then ``--repeats`` more times, and prints the
median wall time, the peak RSS of the scoring process (``RUSAGE_CHILDREN`` of a fresh child per
run), where the time goes (``python -X importtime``: the slowest top-level imports) and whether
the start-up goals are met: <= 5 s wall on a warm machine and <= 600 MB peak RSS.

Usage::

    MLFLOW_TRACKING_URI=sqlite:///mlflow/mlflow.db python benchmarks/cli_startup.py [--model URI]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

WALL_GOAL_S = 5.0
RSS_GOAL_MB = 600.0


def run_once(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, stderr) of one fresh ``uamt score`` process."""
    script = (
        "import resource, subprocess, sys, time;"
        "t = time.perf_counter();"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True);"
        "wall = time.perf_counter() - t;"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024;"
        "sys.stderr.write(done.stderr);"
        "print(wall, rss, done.returncode)"
    )
    # a wrapper process per run: RUSAGE_CHILDREN is then the scoring process's own peak
    done = subprocess.run([sys.executable, "-c", script, *command], capture_output=True, text=True, check=True)
    wall, rss, code = done.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"uamt score failed ({code}):\n{done.stderr}")
    return float(wall), float(rss), done.stderr


def slowest_imports(command: list[str], top: int) -> list[tuple[float, str]]:
    """The ``top`` slowest top-level imports (cumulative seconds, module) of one run."""
    code = "import sys; from uamt.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *command[1:]], capture_output=True, text=True
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|")
        if not name.startswith("  ") and cumulative.strip().isdigit():  # top level only
            rows.append((int(cumulative) / 1e6, name.strip()))
    return sorted(rows, reverse=True)[:top]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=Path("data/prepared/test.parquet"))
    parser.add_argument("--lp", default="en-de")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default=None, help="model URI (default: the registered champion)")
    args = parser.parse_args(argv)

    uamt = shutil.which("uamt") or str(Path(sys.executable).with_name("uamt"))
    df = pd.read_parquet(args.table)
    df = df[(df["lp"] == args.lp) & df["ref"].notna()].head(args.n)
    if len(df) < args.n:
        raise SystemExit(f"{args.table}: fewer than {args.n} {args.lp} rows with a reference")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for column in ("src", "mt", "ref"):
            files[column] = Path(tmp) / f"{column}.txt"
            files[column].write_text("".join(f"{t}\n" for t in df[column]), encoding="utf-8")
        base = [uamt, "score", "-s", str(files["src"]), "-t", str(files["mt"]), "--lp", args.lp, "--no-progress"]
        if args.model:
            base += ["--model", args.model]
        print(f"uamt score on {args.n} {args.lp} segments; {args.repeats} runs after one warm-up")
        for label, command in (("with reference", [*base, "-r", str(files["ref"])]), ("QE (no reference)", base)):
            run_once(command)  # warm the disk cache
            runs = [run_once(command) for _ in range(args.repeats)]
            walls = sorted(r[0] for r in runs)
            rss = max(r[1] for r in runs)
            wall = walls[len(walls) // 2]
            warnings = sorted({line for r in runs for line in r[2].splitlines() if "arn" in line})
            ok_wall, ok_rss = wall <= WALL_GOAL_S, rss <= RSS_GOAL_MB
            failed |= not (ok_wall and ok_rss)
            print(
                f"  {label:18s} wall median {wall:5.2f} s (min {walls[0]:.2f}, max {walls[-1]:.2f}; goal <= "
                f"{WALL_GOAL_S:g} s: {'met' if ok_wall else 'not met'}), peak RSS {rss:4.0f} MB "
                f"(goal <= {RSS_GOAL_MB:g} MB: {'met' if ok_rss else 'not met'})"
            )
            for line in warnings:
                print(f"    stderr: {line[:160]}")
        print("slowest top-level imports (one run, with reference):")
        for seconds, name in slowest_imports([*base, "-r", str(files["ref"])], 8):
            print(f"  {seconds:5.2f} s  {name}")
    print(f"cpu count {os.cpu_count()}; load average {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
