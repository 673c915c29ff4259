"""The quality goals of the served models, per news dataset x LP, on the test split (+ OOD PPS).

Reads the pipeline's outputs (nothing is re-predicted): ``<predictions>/test/<model>.parquet`` and
``<predictions>/ood/<model>.parquet``, ``<calibration>/<model>.json`` and
``<prepared>/test.parquet`` (the texts, for sentence chrF against the reference), and prints per
model one markdown table: rows, PPS, chrF r, AUROC for "MQM <= chi" of the served risk / of -mu /
of -chrF, recall of the worst 2 % (model / chrF), mean 90 % width and coverage, and the goals each
row meets (uamt.quality.QualityGoals). The QE model is scored with the same chrF column (it does not
read the reference; chrF is the floor either way).

    python benchmarks/quality.py [--models hts hts_qe] [--root .] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from uamt.data.datasets import scale_bounds
from uamt.quality import QualityGoals, goal_checks, join_texts, quality_table, read_model

GOAL_LABELS = {
    "pps_vs_chrf": "PPS≥chrF+.15",
    "pps_floor": "PPS≥paper",
    "auroc_risk": "AUROC≥.80",
    "recall_worst": "recall≥.30",
    "width": "width≤75 %",
}


def fmt(value, spec: str = ".3f") -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def mark(value) -> str:
    return "–" if value is None else ("✓" if value else "✗")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["hts", "hts_qe"])
    parser.add_argument("--root", type=Path, default=Path("."), help="pipeline folder (predictions/, calibration/, data/)")
    parser.add_argument("--chi", type=float, default=-5.0)
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    goals = QualityGoals()
    prepared = pd.read_parquet(args.root / "data" / "prepared" / "test.parquet")
    out: dict[str, dict] = {}
    for model in args.models:
        test, calibration = read_model(args.root / "predictions", args.root / "calibration", model)
        bounds = scale_bounds(sorted(test["dataset"].unique()))
        table = quality_table(
            join_texts(test, prepared, f"predictions/test/{model}"), calibration, bounds, chi=args.chi, gamma=args.gamma
        )
        print(f"\n### {model} (served: {'fixed variance' if calibration.fixed else calibration.selected}), test\n")
        print(
            "| dataset × LP | rows | bad | PPS | chrF r | AUROC bad: risk / −μ / chrF | recall worst 2 %: model / chrF "
            "| width@.9 | cov@.9 | goals |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        records = table.to_dict("records")
        for row in records:
            checks = goal_checks(row, goals, args.gamma)
            row["goals"] = checks
            goal_text = " ".join(f"{GOAL_LABELS[k]} {mark(v)}" for k, v in checks.items())
            print(
                f"| {row['dataset']} {row['lp']} | {row['n']:,} | {row['n_bad']:,} | {fmt(row['pps'])} | "
                f"{fmt(row['chrf_r'])} | {fmt(row['auroc_risk'])} / {fmt(row['auroc_mu'])} / {fmt(row['auroc_chrf'])} | "
                f"{fmt(row['recall_worst'], '.2f')} / {fmt(row['recall_worst_chrf'], '.2f')} | "
                f"{fmt(row['width'], '.2f')} | {fmt(row['coverage'])} | {goal_text} |"
            )
        met = [v for r in records for v in r["goals"].values() if v is not None]
        print(f"\ngoals met: {sum(met)} / {len(met)}")
        out[model] = {"test": records}
        ood_path = args.root / "predictions" / "ood" / f"{model}.parquet"
        if ood_path.is_file():
            ood, _ = read_model(args.root / "predictions", args.root / "calibration", model, split="ood")
            ood_table = quality_table(ood, calibration, scale_bounds(sorted(ood["dataset"].unique())), with_chrf=False)
            print(f"\nOOD ({model}): PPS per LP beside the in-domain (news, pooled over news datasets) PPS\n")
            print("| dataset × LP | rows | PPS | AUROC risk | news PPS of the LP (max over datasets) | gap |")
            print("|---|---|---|---|---|---|")
            for row in ood_table.to_dict("records"):
                if row["dataset"] == "all":
                    continue
                same = [r["pps"] for r in records if r["lp"] == row["lp"] and r["dataset"] != "all"]
                ref_pps = max(same) if same else None
                gap = None if ref_pps is None else row["pps"] - ref_pps
                print(
                    f"| {row['dataset']} {row['lp']} | {row['n']:,} | {fmt(row['pps'])} | {fmt(row['auroc_risk'])} | "
                    f"{fmt(ref_pps)} | {fmt(gap, '+.3f')} |"
                )
            out[model]["ood"] = ood_table.to_dict("records")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
