"""Checks of `uamt score` with the registered champion on real held-out data (issue: "Use it").

1. Coverage: the fraction of MQM test human scores inside the 90 % intervals, per LP (goal 0.85-0.95).
2. Multiple references: WMT21 en-de MQM test rows with references A, C and D -- mean interval width
   with all three references vs with one: the first (A), and each of A, C, D alone (their mean is
   the paper's S-1); goal: narrower with three than with A.
3. Risk flagging: Recall@N of the worst 2 % (length-normalised MQM) when ranking by risk
   P(Q <= chi) versus by the mean score alone, chi = the dev 2 % quantile of MQM (goal: risk >= mean).

Everything goes through the CLI (``uamt score``) exactly as a user runs it. Prints a table; exits 1
when a goal is missed, so it can gate a release.

    python benchmarks/scoring_checks.py [--model models:/uamt-comet@champion] [--prepared data/prepared]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd


def write_lines(path: Path, lines) -> str:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return str(path)


def score(
    work: Path, tag: str, frame: pd.DataFrame, refs: list[list[str]], model: str, lp: str, extra=()
) -> pd.DataFrame:
    from uamt.cli import main

    args = [
        "score",
        "-s",
        write_lines(work / f"{tag}.src", frame["src"]),
        "-t",
        write_lines(work / f"{tag}.mt", frame["mt"]),
    ]
    for k, column in enumerate(refs):
        args += ["-r", write_lines(work / f"{tag}.ref{k}", column)]
    out = work / f"{tag}.jsonl"
    args += ["--model", model, "--lp", lp, "--no-progress", "--out", str(out), *extra]
    code = main(args)
    if code != 0:
        raise SystemExit(f"uamt score failed for {tag} (exit {code})")
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return pd.DataFrame([r for r in rows if "summary" not in r])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="models:/uamt-comet@champion")
    parser.add_argument("--prepared", default="data/prepared")
    parser.add_argument("--worst", type=float, default=0.02, help="share of worst segments to retrieve")
    args = parser.parse_args(argv)

    from uamt.serving.multi_reference import distinct_references

    prepared = Path(args.prepared)
    test = pd.read_parquet(prepared / "test.parquet")
    dev = pd.read_parquet(prepared / "dev.parquet")
    test = test[test["dataset"] == "wmt21_mqm"].reset_index(drop=True)
    dev = dev[dev["dataset"] == "wmt21_mqm"].reset_index(drop=True)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("1. coverage of the 90 % intervals on the MQM test (goal 0.85-0.95)")
        scored = {}
        for lp, frame in test.groupby("lp"):
            frame = frame.reset_index(drop=True)
            dev_lp = dev[dev["lp"] == lp]["score"]
            chi = (
                float(np.quantile(dev_lp, args.worst))
                if len(dev_lp)
                else float(frame["score"].quantile(args.worst))
            )
            out = score(
                work,
                f"cov-{lp}",
                frame,
                [frame["ref"].tolist()],
                args.model,
                lp,
                ["--risk-threshold", str(chi)],
            )
            scored[lp] = (frame, out, chi)
            inside = ((frame["score"] >= out["lower"]) & (frame["score"] <= out["upper"])).mean()
            ok = 0.85 <= inside <= 0.95
            failures += [] if ok else [f"coverage {lp} {inside:.3f}"]
            print(
                f"   {lp}: n={len(frame)} coverage={inside:.3f} mean width={(out['upper'] - out['lower']).mean():.3f} {'ok' if ok else 'MISSED'}"
            )

        print("2. multiple references, WMT21 en-de (A, C, D): mean 90 % interval width")
        ende = test[(test["lp"] == "en-de") & ~test["system"].str.startswith("ref-")].reset_index(drop=True)
        # ``refs`` already holds every reference, ``ref`` included: keep each distinct text once, or
        # "three references" would be A, A, C.
        all_refs = [
            distinct_references([ref, *(refs if refs is not None else [])])
            for ref, refs in zip(ende["ref"], ende["refs"], strict=True)
        ]
        keep = [i for i, refs in enumerate(all_refs) if len(refs) >= 3]
        ende = ende.iloc[keep].reset_index(drop=True)
        refs3 = [[all_refs[i][k] for i in keep] for k in range(3)]
        if len(ende):
            width = {}
            for tag, refs in (("A", refs3[:1]), ("C", refs3[1:2]), ("D", refs3[2:3]), ("A+C+D", refs3)):
                out = score(work, f"multi-{tag}", ende, refs, args.model, "en-de")
                width[tag] = float((out["upper"] - out["lower"]).mean())
                pps = np.corrcoef(out["mu"], ende["score"])[0, 1]
                print(f"   {tag:<6} n={len(ende)} mean width={width[tag]:.4f} PPS={pps:.3f}")
            single = np.mean([width[tag] for tag in "ACD"])
            print(
                f"   3 references vs the first (A): {width['A+C+D'] / width['A'] - 1:+.2%}; "
                f"vs one sampled at random (S-1, mean over A, C, D): {width['A+C+D'] / single - 1:+.2%}"
            )
            # Strictly narrower than with the first reference; the tolerance only excludes float noise.
            if not width["A+C+D"] < width["A"] * (1 - 1e-9):
                failures.append(f"width with 3 refs {width['A+C+D']:.4f} >= with 1 {width['A']:.4f}")
        else:
            print("   no en-de test rows with three distinct references")

        print(f"3. critical errors: Recall@N of the worst {args.worst:.0%} (length-normalised MQM)")
        for lp, (frame, risk_out, chi) in scored.items():
            length = frame["mt"].str.split().str.len().clip(lower=1)
            normalised = frame["score"] / length
            n_worst = max(1, int(round(args.worst * len(frame))))
            worst = set(np.argsort(normalised.to_numpy(), kind="stable")[:n_worst])
            by_risk = set(np.argsort(-risk_out["risk"].to_numpy(), kind="stable")[:n_worst])
            by_mu = set(np.argsort(risk_out["mu"].to_numpy(), kind="stable")[:n_worst])
            recall_risk, recall_mu = len(worst & by_risk) / n_worst, len(worst & by_mu) / n_worst
            ok = recall_risk >= recall_mu
            failures += [] if ok else [f"recall {lp} risk {recall_risk:.3f} < mean {recall_mu:.3f}"]
            print(
                f"   {lp}: N={n_worst} chi={chi:.2f} recall by risk={recall_risk:.3f} by mean={recall_mu:.3f} {'ok' if ok else 'MISSED'}"
            )
    if failures:
        print("goals missed: " + "; ".join(failures))
        return 1
    print("all goals met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
