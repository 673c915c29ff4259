"""How far two runs' metrics files are apart, number by number.

Two runs of the pipeline on different CPUs give models that differ at float rounding, and so metrics
that differ in their last digits; what matters is whether any *choice* moved (a served candidate, a
gate's verdict, a finding) and how large the numeric moves are.  This walks two JSON files (or two
folders of them, file by file) in parallel and prints, per file: how many numbers are equal, the
relative differences of the others (median, 99th percentile, largest, with its path), and every
string, boolean or structure that differs::

    python benchmarks/metrics_diff.py git:c43e9ca:metrics /work/cold/clone/metrics [--top 5] [--json out.json]
    python benchmarks/metrics_diff.py a/test.json b/test.json

``git:<ref>:<path>`` reads a file or folder as committed at ``ref`` in this repository.  The relative
difference of two numbers is ``|a - b| / max(|a|, |b|)`` (0 where both are 0).  Timings and other
fields that differ on every run can be left out by key (``--ignore-key seconds``; repeatable).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class FileDiff:
    """What :func:`compare` found between two JSON documents."""

    equal: int = 0
    #: (relative difference, path) of every pair of numbers that are not equal.
    moved: list[tuple[float, str]] = field(default_factory=list)
    #: (path, a, b) of every non-number that differs, or a key / list length present on one side only.
    changed: list[tuple[str, str, str]] = field(default_factory=list)

    def summary(self) -> dict:
        rel = sorted(r for r, _ in self.moved)
        out = {"numbers": self.equal + len(rel), "equal": self.equal, "moved": len(rel), "changed": len(self.changed)}
        if rel:
            out.update(
                median_rel=rel[len(rel) // 2],
                p99_rel=rel[min(len(rel) - 1, math.ceil(0.99 * len(rel)) - 1)],
                max_rel=rel[-1],
                max_at=max(self.moved)[1],
            )
        return out


def relative_difference(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)``; 0 where a == b (both 0 included), inf where only one is NaN."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def compare(a, b, path: str = "", ignore: frozenset[str] = frozenset(), out: FileDiff | None = None) -> FileDiff:
    """Walk ``a`` and ``b`` (parsed JSON) together; numbers are compared by value, anything else by
    equality.  Keys in ``ignore`` are skipped at any depth."""
    out = FileDiff() if out is None else out
    if _is_number(a) and _is_number(b):
        rel = relative_difference(float(a), float(b))
        if rel == 0.0:
            out.equal += 1
        else:
            out.moved.append((rel, path or "."))
    elif isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key in ignore:
                continue
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                out.changed.append((where, "absent" if key not in a else "present", "absent" if key not in b else "present"))
            else:
                compare(a[key], b[key], where, ignore, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.changed.append((path or ".", f"{len(a)} items", f"{len(b)} items"))
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            compare(x, y, f"{path}[{i}]", ignore, out)
    elif a != b or isinstance(a, bool) != isinstance(b, bool):  # True == 1 in Python; not here
        out.changed.append((path or ".", json.dumps(a)[:80], json.dumps(b)[:80]))
    return out


def _git_files(ref: str, path: str) -> dict[str, str]:
    """``{relative name: text}`` of the JSON file or the folder's JSON files at ``ref``."""
    kind = subprocess.run(["git", "cat-file", "-t", f"{ref}:{path}"], cwd=REPO_ROOT, capture_output=True, text=True)
    if kind.returncode != 0:
        raise SystemExit(f"metrics_diff: git:{ref}:{path}: {kind.stderr.strip() or 'not found'}")

    def show(name: str) -> str:
        return subprocess.run(["git", "show", f"{ref}:{name}"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout

    if kind.stdout.strip() == "blob":
        return {Path(path).name: show(path)}
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", ref, "--", path], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {str(Path(n).relative_to(path)): show(n) for n in names if n.endswith(".json")}


def read_side(spec: str) -> dict[str, str]:
    """``{relative name: text}`` of a JSON file, a folder of them (recursively) or ``git:<ref>:<path>``."""
    if spec.startswith("git:"):
        ref, _, path = spec[4:].partition(":")
        if not path:
            raise SystemExit(f"metrics_diff: {spec!r}: write git:<ref>:<path>")
        return _git_files(ref, path.rstrip("/"))
    p = Path(spec)
    if p.is_file():
        return {p.name: p.read_text(encoding="utf-8")}
    if p.is_dir():
        return {str(f.relative_to(p)): f.read_text(encoding="utf-8") for f in sorted(p.rglob("*.json"))}
    raise SystemExit(f"metrics_diff: {spec}: no such file or folder")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="a JSON file, a folder of them, or git:<ref>:<path>")
    parser.add_argument("b", help="the same kind of thing as a")
    parser.add_argument("--ignore-key", action="append", default=[], help="a key to skip at any depth (repeatable)")
    parser.add_argument("--top", type=int, default=3, help="print this many of each file's changed non-numbers")
    parser.add_argument("--json", type=Path, help="also write the per-file summaries here")
    args = parser.parse_args(argv)
    left, right = read_side(args.a), read_side(args.b)
    ignore = frozenset(args.ignore_key)
    report = {}
    for name in sorted(set(left) | set(right)):
        if name not in left or name not in right:
            report[name] = {"only_in": "a" if name in left else "b"}
            print(f"{name}: only in {'a' if name in left else 'b'}")
            continue
        try:
            diff = compare(json.loads(left[name]), json.loads(right[name]), ignore=ignore)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"metrics_diff: {name}: not JSON ({exc})") from None
        s = report[name] = diff.summary()
        line = f"{name}: {s['equal']} of {s['numbers']} numbers equal"
        if s["moved"]:
            line += (
                f"; the other {s['moved']} relative median {s['median_rel']:.1e}, p99 {s['p99_rel']:.1e}, "
                f"max {s['max_rel']:.1e} ({s['max_at']})"
            )
        line += f"; {s['changed']} non-numbers differ"
        print(line)
        for where, x, y in diff.changed[: args.top]:
            print(f"    {where}: {x} -> {y}")
        if diff.changed:
            report[name]["changed_paths"] = [w for w, _, _ in diff.changed]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
