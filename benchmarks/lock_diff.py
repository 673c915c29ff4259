"""Which stages two runs of the pipeline agree on: their ``dvc.lock`` files compared stage by stage.

For every stage in either lock it prints whether its outputs have the same content hashes (DVC's
md5 of a file, or of a folder's listing), and which dependencies differ (code, data, params), so a
difference can be traced to its first stage: a stage whose dependencies all match and whose outputs
do not computed something else from the same inputs (another CPU kernel, a non-deterministic sum).

    python benchmarks/lock_diff.py git:HEAD /tmp/cold/clone/dvc.lock      # committed vs a cold run
    python benchmarks/lock_diff.py a/dvc.lock b/dvc.lock --stages encode train_base

A lock is a path or ``git:<ref>`` (``dvc.lock`` at that commit of the repository this script is in),
or a listing this script wrote. DVC's lock hashes a folder as a whole; ``--listing`` writes what a
run's DVC cache knows of every output, file by file, so that a run on another host can be compared
file by file later (which embedding shard, which model's weights or only its ``model.json``)::

    python benchmarks/lock_diff.py --listing /tmp/cold/clone > benchmarks/outputs/<commit>-<host>.json
    python benchmarks/lock_diff.py benchmarks/outputs/<commit>-<host>.json --listing-of /tmp/cold2/clone

Exit status 0 when every compared stage's outputs match, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def listing(repo: str | Path) -> dict:
    """Every output of ``<repo>/dvc.lock`` with, for a folder, the md5 of each file in it: from the
    folder's ``.dir`` entry in ``<repo>/.dvc/cache``, else (an output DVC does not cache) from the
    files in the workspace (``files_from: workspace``: they must be the locked run's); ``files`` is
    None where neither is there."""
    repo = Path(repo)
    stages = yaml.safe_load((repo / "dvc.lock").read_text(encoding="utf-8")).get("stages", {})
    for entry in stages.values():
        for out in entry.get("outs") or []:
            md5 = out.get("md5") or ""
            if md5.endswith(".dir"):
                cached = repo / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]
                folder = repo / out["path"]
                if cached.is_file():
                    out["files"] = {f["relpath"]: f["md5"] for f in json.loads(cached.read_text(encoding="utf-8"))}
                elif folder.is_dir():  # an output DVC does not cache (cache: false): hash what is there
                    out["files"] = {
                        path.relative_to(folder).as_posix(): _md5(path) for path in sorted(folder.rglob("*")) if path.is_file()
                    }
                    out["files_from"] = "workspace"
                else:
                    out["files"] = None
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    # Only the outputs: the inputs are in dvc.lock at that commit.
    outs = {name: {"outs": entry.get("outs") or []} for name, entry in stages.items()}
    return {"format": "uamt-output-listing/1", "commit": head, "cpu": _cpu(), "stages": outs}


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cpu() -> str:
    """The CPU's model name and the instruction sets that decide the numeric kernels' paths."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return f"{model} ({' '.join(f for f in ('avx2', 'avx512f', 'avx512_vnni', 'avx_vnni', 'amx_int8') if f in flags)})"


def read_lock(spec: str) -> dict:
    """The ``stages`` mapping of a ``dvc.lock`` path, ``git:<ref>`` or a listing (:func:`listing`)."""
    if spec.endswith(".json"):
        return json.loads(Path(spec).read_text(encoding="utf-8"))["stages"]
    if spec.startswith("git:"):
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{spec[4:]}:dvc.lock"], capture_output=True, text=True, check=True
        ).stdout
    else:
        text = Path(spec).read_text(encoding="utf-8")
    return (yaml.safe_load(text) or {}).get("stages", {})


def _hashes(entries) -> dict[str, str | None]:
    return {e["path"]: e.get("md5") for e in entries or []}


def differing_files(a: dict | None, b: dict | None) -> list[str]:
    """The files of one folder output whose md5 differs (or that only one side has); both listings needed."""
    if a is None or b is None:
        return []
    return sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))


def compare_stage(a: dict, b: dict) -> dict:
    """``{"outs": {path: (md5_a, md5_b)} for differing outputs, "outs_same": [...], "deps": [...],
    "params": [...]}``: what differs between one stage's two lock entries."""
    outs_a, outs_b = _hashes(a.get("outs")), _hashes(b.get("outs"))
    # A listing has no inputs: compare them only where both sides have them.
    both = "deps" in a and "deps" in b
    deps_a, deps_b = (_hashes(a.get("deps")), _hashes(b.get("deps"))) if both else ({}, {})
    params_a, params_b = (a.get("params", {}), b.get("params", {})) if both else ({}, {})
    return {
        "outs": {p: (outs_a.get(p), outs_b.get(p)) for p in sorted(outs_a.keys() | outs_b.keys()) if outs_a.get(p) != outs_b.get(p)},
        "outs_same": sorted(p for p in outs_a.keys() & outs_b.keys() if outs_a[p] == outs_b[p]),
        "deps": sorted(p for p in deps_a.keys() | deps_b.keys() if deps_a.get(p) != deps_b.get(p)),
        "params": sorted(f for f in params_a.keys() | params_b.keys() if params_a.get(f) != params_b.get(f)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", nargs="?", help="a dvc.lock path, git:<ref> or a listing (.json)")
    parser.add_argument("b", nargs="?", help="a dvc.lock path, git:<ref> or a listing (.json)")
    parser.add_argument("--stages", nargs="*", help="only these stages (default: every stage in either lock)")
    parser.add_argument("--listing", metavar="REPO", help="print REPO's output listing (JSON) and stop")
    parser.add_argument("--listing-of", metavar="REPO", help="compare a with REPO's listing (instead of b)")
    args = parser.parse_args(argv)
    if args.listing:
        print(json.dumps(listing(args.listing), indent=1, sort_keys=True))  # one line per file: diffable
        return 0
    if args.a is None or (args.b is None) == (args.listing_of is None):
        parser.error("give a and b, or a and --listing-of REPO")
    lock_a = read_lock(args.a)
    lock_b = listing(args.listing_of)["stages"] if args.listing_of else read_lock(args.b)
    args.b = args.b or args.listing_of
    names = args.stages or [*lock_a, *(s for s in lock_b if s not in lock_a)]
    differing = 0
    for name in names:
        if name not in lock_a or name not in lock_b:
            print(f"{name:<20} only in {args.a if name in lock_a else args.b}")
            differing += 1
            continue
        diff = compare_stage(lock_a[name], lock_b[name])
        state = "same outputs" if not diff["outs"] else f"{len(diff['outs'])} output(s) differ"
        compared = "deps" in lock_a[name] and "deps" in lock_b[name]
        inputs = "inputs not compared (a listing)" if not compared else "same inputs" if not (diff["deps"] or diff["params"]) else (
            f"inputs differ: {', '.join(diff['deps'] + [f'params:{f}' for f in diff['params']])}"
        )
        print(f"{name:<20} {state:<22} {inputs}")
        files_a = {o["path"]: o.get("files") for o in lock_a[name].get("outs") or []}
        files_b = {o["path"]: o.get("files") for o in lock_b[name].get("outs") or []}
        for path, (ha, hb) in diff["outs"].items():
            print(f"{'':<22}{path}: {ha} -> {hb}")
            files = differing_files(files_a.get(path), files_b.get(path))
            if files:
                print(f"{'':<24}{len(files)} of {len(files_a[path].keys() | files_b[path].keys())} files differ: {', '.join(files[:8])}{' …' if len(files) > 8 else ''}")
        differing += bool(diff["outs"])
    return 0 if differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
