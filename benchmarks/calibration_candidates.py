"""Which calibration gives intervals that adapt per segment?  Every candidate, from existing predictions.

From the pipeline's dev and test predictions (``predictions/{dev,test}/<method>.parquet``, joined to
``data/prepared`` for ``doc`` and ``domain``), this runs :func:`uamt.uncertainty.evaluate_predictions`
(standardisation by the sigma-source rule, every candidate of
:mod:`uamt.uncertainty.candidates` fitted on dev, the rule's choice cross-fitted over dev documents)
and prints, per method and candidate, on test:

* ``cov`` coverage@0.9 pooled, and per LP (``lp min..max``, ``lp err`` = max |cov - 0.9|);
* ``sq err`` / ``mq err``: max |cov - 0.9| over sigma / predicted-mu quintiles (within each LP);
* ``low``: coverage of the segments with human score <= -5 (MQM major errors);
* ``ENCE`` (mean over LPs, 5 sigma bins), ``P90/P10`` of calibrated sigma (smallest over LPs);
* ``ECE`` fixed dev -> test (mean over LPs) and, per method, the papers' 5-fold cross-fitted ECE on test;
* ``PPS`` (mean over LPs), checked against ``metrics/test.json`` of the run (calibration must not move it).

The candidate the rule picks (``evaluate.calibration_rule`` in params.yaml) is marked ``*``; then
the goals of the served calibration, met or not (:mod:`uamt.uncertainty.goals`; the held-out
LPs from ``predictions/ood``; the ECE floor here is the i.i.d. one, the evaluate stage's
``metrics/conditional.json`` uses the clustered floor).

    python benchmarks/calibration_candidates.py [--root /work/main] [--methods hts hts_mcd dup hts_qe]
        [--candidates affine_ece ... signed_mondrian_conformal] [--json out.json]

``--candidates`` replaces ``evaluate.calibration_candidates`` of the params file for this run only
(e.g. to try a candidate the pipeline does not fit yet); the rule still picks among them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd

KEYS = ["dataset", "lp", "seg_id", "system"]


def with_documents(table: pd.DataFrame, prepared: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the ``doc`` and ``domain`` of its rows (row order kept; every row must match).

    Tables written since predictions tables carry ``doc``/``domain`` are returned as they are."""
    if {"doc", "domain"} <= set(table.columns):
        return table
    info = prepared[[*KEYS, "doc", "domain"]].drop_duplicates(KEYS)
    merged = table.merge(info, on=KEYS, how="left", validate="many_to_one")
    missing = int(merged["doc"].isna().sum())
    if missing:
        raise SystemExit(f"{missing} prediction rows have no document in data/prepared")
    merged["doc"] = merged["dataset"] + "/" + merged["lp"] + "/" + merged["doc"].astype(str)
    return merged


def summarise(block: dict, gamma_key: str = "coverage@0.9") -> dict[str, float]:
    per_lp = block["per_lp"]
    cond = block["conditional"]
    lp_cov = [m[gamma_key] for m in per_lp.values()]
    return {
        "cov": block["pooled"][gamma_key],
        "lp_min": min(lp_cov),
        "lp_max": max(lp_cov),
        "lp_err": cond["lp_coverage_error"],
        "sq_err": cond["sigma_quintile_coverage_error"],
        "mq_err": cond["mu_quintile_coverage_error"],
        "low": cond["low_score"]["coverage"],
        "n_low": cond["low_score"]["n"],
        "ence": block["macro_avg"]["ence"],
        "p90_p10": min(m["sigma_p90_p10"] for m in per_lp.values()),
        "ece": block["macro_avg"]["ece"],
        "pps": block["macro_avg"]["pps"],
    }


def print_goals(method: str, root: Path) -> None:
    """The goal table of the served calibration as the evaluate stage measured it
    (``metrics/conditional.json``, :func:`uamt.uncertainty.goals.goal_rows`: LP x quintile cells with
    clustered bands, held-out LPs, risk reliability)."""
    from uamt.uncertainty.goals import goal_rows

    path = root / "metrics" / "conditional.json"
    summary = json.loads(path.read_text()).get(method) if path.is_file() else None
    if summary is None:
        print(f"{method:8} goals: no {path} block for {method} (run the evaluate stage)")
        return
    print(f"{method:8} goals of the served calibration ({summary['served']}, from {path}):")
    for row in goal_rows(summary):
        value = "   -  " if row["value"] is None else f"{row['value']:6.3f}"
        met = {True: "met", False: "NOT met", None: "n/a"}[row["met"]]
        note = f"  ({row['note']})" if row["note"] else ""
        print(f"         {row['goal']:64} {row['target']:>24} {value} {met}{note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="pipeline workspace (predictions/, data/)")
    parser.add_argument("--methods", nargs="+", default=["hts", "hts_mcd", "dup", "hts_qe"])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params.yaml with evaluate:")
    parser.add_argument("--json", type=Path, help="also write every number as JSON here")
    parser.add_argument(
        "--candidates", nargs="+", help="calibration candidates to fit (default: evaluate.calibration_candidates of --params)"
    )
    args = parser.parse_args(argv)

    from uamt.core.config import load_section
    from uamt.uncertainty import EvaluationSettings, evaluate_predictions

    settings = load_section(EvaluationSettings, "evaluate", args.params)
    if args.candidates:
        settings = dataclasses.replace(settings, calibration_candidates=tuple(args.candidates))
    prepared = {
        split: pd.read_parquet(args.root / "data" / "prepared" / f"{split}.parquet") for split in ("dev", "test")
    }
    old_metrics_path = args.root / "metrics" / "test.json"
    old_metrics = json.loads(old_metrics_path.read_text()) if old_metrics_path.is_file() else {}
    out = {}
    header = (
        f"{'method':8} {'candidate':26} {'cov':>5} {'lp min..max':>11} {'lp err':>6} {'sq err':>6} "
        f"{'mq err':>6} {'low':>5} {'ENCE':>6} {'P90/P10':>7} {'ECE':>6} {'PPS':>6}"
    )
    print(header)
    for method in args.methods:
        tables = {
            split: with_documents(
                pd.read_parquet(args.root / "predictions" / split / f"{method}.parquet"), prepared[split]
            )
            for split in ("dev", "test")
        }
        result = evaluate_predictions(
            tables["test"], tables["dev"], settings=settings, pred_source=f"test/{method}", dev_source=f"dev/{method}"
        )
        selected = result["calibration"]["selected"]
        rows = {name: summarise(c["test"]) for name, c in result["candidates"].items()}
        rows["(fixed var)"] = summarise(result["methods"]["fixed_variance"])
        for name, row in rows.items():
            mark = "*" if name == selected else " "
            low = "  -  " if row["low"] is None else f"{row['low']:.2f}"
            print(
                f"{method:8} {mark}{name:25} {row['cov']:5.3f} {row['lp_min']:5.3f}..{row['lp_max']:.3f} "
                f"{row['lp_err']:6.3f} {row['sq_err']:6.3f} {row['mq_err']:6.3f} {low:>5} {row['ence']:6.3f} "
                f"{row['p90_p10']:7.2f} {row['ece']:6.3f} {row['pps']:6.3f}"
            )
        cross = result["cross_fitted_ece"]
        old_pps = old_metrics.get(method, {}).get("avg", {}).get("pps")
        model_pps = result["methods"]["model"]["macro_avg"]["pps"]
        pps_note = "n/a" if old_pps is None else f"{old_pps:.4f} -> {model_pps:.4f} ({'same' if abs(old_pps - model_pps) < 1e-9 else 'CHANGED'})"
        print(
            f"{method:8} rule={result['calibration']['selection']['rule']} picks {selected} "
            f"({result['calibration']['selection']['on']}); n low-score rows={rows[selected]['n_low']}; "
            f"papers' affine ECE: fixed dev->test {rows['affine_ece']['ece']:.3f} vs 5-fold cross-fitted on test "
            f"{'n/a' if cross is None else format(cross['macro_avg'], '.3f')} "
            f"(floor {result['methods']['model']['macro_avg']['ece_floor']:.3f}); PPS {pps_note}"
        )
        print_goals(method, args.root)
        out[method] = {"selected": selected, "rows": rows, "cross_fitted_ece": cross,
                       "selection": result["calibration"]["selection"],
                       "per_lp_coverage": {n: {lp: m["coverage@0.9"] for lp, m in c["test"]["per_lp"].items()}
                                           for n, c in result["candidates"].items()}}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
