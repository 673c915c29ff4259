"""Which stages two runs of the pipeline agree on: their ``dvc.lock`` files compared stage by stage.

For every stage in either lock it prints whether its outputs have the same content hashes (DVC's
md5 of a file, or of a folder's listing), and which dependencies differ (code, data, params), so a
difference can be traced to its first stage: a stage whose dependencies all match and whose outputs
do not computed something else from the same inputs (another CPU kernel, a non-deterministic sum).

    python benchmarks/lock_diff.py git:HEAD /tmp/cold/clone/dvc.lock      # committed vs a cold run
    python benchmarks/lock_diff.py a/dvc.lock b/dvc.lock --stages encode train_base

A lock is a path or ``git:<ref>`` (``dvc.lock`` at that commit of the repository this script is in).
Exit status 0 when every compared stage's outputs match, 1 otherwise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def read_lock(spec: str) -> dict:
    """The ``stages`` mapping of a ``dvc.lock`` path or ``git:<ref>``."""
    if spec.startswith("git:"):
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{spec[4:]}:dvc.lock"], capture_output=True, text=True, check=True
        ).stdout
    else:
        text = Path(spec).read_text(encoding="utf-8")
    return (yaml.safe_load(text) or {}).get("stages", {})


def _hashes(entries) -> dict[str, str | None]:
    return {e["path"]: e.get("md5") for e in entries or []}


def compare_stage(a: dict, b: dict) -> dict:
    """``{"outs": {path: (md5_a, md5_b)} for differing outputs, "outs_same": [...], "deps": [...],
    "params": [...]}``: what differs between one stage's two lock entries."""
    outs_a, outs_b = _hashes(a.get("outs")), _hashes(b.get("outs"))
    deps_a, deps_b = _hashes(a.get("deps")), _hashes(b.get("deps"))
    params_a, params_b = a.get("params", {}), b.get("params", {})
    return {
        "outs": {p: (outs_a.get(p), outs_b.get(p)) for p in sorted(outs_a.keys() | outs_b.keys()) if outs_a.get(p) != outs_b.get(p)},
        "outs_same": sorted(p for p in outs_a.keys() & outs_b.keys() if outs_a[p] == outs_b[p]),
        "deps": sorted(p for p in deps_a.keys() | deps_b.keys() if deps_a.get(p) != deps_b.get(p)),
        "params": sorted(f for f in params_a.keys() | params_b.keys() if params_a.get(f) != params_b.get(f)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="a dvc.lock path or git:<ref>")
    parser.add_argument("b", help="a dvc.lock path or git:<ref>")
    parser.add_argument("--stages", nargs="*", help="only these stages (default: every stage in either lock)")
    args = parser.parse_args(argv)
    lock_a, lock_b = read_lock(args.a), read_lock(args.b)
    names = args.stages or [*lock_a, *(s for s in lock_b if s not in lock_a)]
    differing = 0
    for name in names:
        if name not in lock_a or name not in lock_b:
            print(f"{name:<20} only in {args.a if name in lock_a else args.b}")
            differing += 1
            continue
        diff = compare_stage(lock_a[name], lock_b[name])
        state = "same outputs" if not diff["outs"] else f"{len(diff['outs'])} output(s) differ"
        inputs = "same inputs" if not (diff["deps"] or diff["params"]) else (
            f"inputs differ: {', '.join(diff['deps'] + [f'params:{f}' for f in diff['params']])}"
        )
        print(f"{name:<20} {state:<22} {inputs}")
        for path, (ha, hb) in diff["outs"].items():
            print(f"{'':<22}{path}: {ha} -> {hb}")
        differing += bool(diff["outs"])
    return 0 if differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
