"""What does a point mass at the top of the scale buy?  The served calibration with and without it, on test.

MQM puts 21-73 % of the news test rows per LP at exactly 0.  For each model this takes the
calibration the calibrate stage wrote (``calibration/<model>.json``), strips or keeps its top atom
(:func:`uamt.serving.model_calibration.with_top_atom`, refitted on the same calibration rows), answers
the test rows with each as served (clipped to the scale) and prints per LP: CRPS (the proper score
of the whole distribution), ECE over 100 levels (atoms randomised) and as closed intervals, coverage
and misses at 0.9 (randomised) and the closed interval's coverage, the mean 90 % width, the served
P(MQM = 0) against its frequency, coverage of MQM <= -5 and the risk's Brier score and largest
decile gap at chi = -1 and -5.

    python benchmarks/top_atom.py [--models hts hts_qe point]
"""

from __future__ import annotations

import argparse
import dataclasses

COLUMNS = (
    ("crps", "CRPS"), ("ece", "ECE"), ("ece_interval", "ECE closed"), ("coverage@0.9", "cov@.9"),
    ("closed_coverage@0.9", "closed cov"), ("miss_below@0.9", "miss below"), ("miss_above@0.9", "miss above"),
    ("width@0.9", "width"), ("top_probability", "P(top)"), ("top_frequency", "share top"),
    ("low_score_coverage", "cov MQM≤−5"),
)


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import DEFAULT_PARAMS
    from uamt.model_evaluation import ask, calibration_rows, measure
    from uamt.pipeline_config import CALIBRATION_DIR
    from uamt.quality import read_model, served_setting
    from uamt.serving.model_calibration import with_top_atom
    from uamt.uncertainty.served import summary_row

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "hts_qe", "point"])
    args = parser.parse_args(argv)
    pipe, settings, bounds = served_setting(args.params)
    for model in args.models:
        test, served = read_model(pipe.predictions_dir, args.calibration_dir, model)
        without = dataclasses.replace(served, top_atom=None, below_top=None)
        rows = calibration_rows(pipe, model, served.calibrated_on)
        variants = {
            "without": without,
            "with": served if served.top_atom is not None else with_top_atom(without, rows, model, settings, bounds[1]),
        }
        results = {name: measure(cal, ask(cal, test, settings, bounds), test, settings) for name, cal in variants.items()}
        print(f"\n{model} (test, {len(test):,} rows; calibrated on {'+'.join(served.calibrated_on)})")
        print("| LP | top atom | " + " | ".join(label for _, label in COLUMNS) + " | Brier / gap χ=−1 | Brier / gap χ=−5 |")
        print("|---|---|" + "---|" * (len(COLUMNS) + 2))
        for lp in [k for k in results["without"] if k not in ("avg", "worst_cells")] + ["avg"]:
            for name, full in results.items():
                m = full[lp]
                cells = ["–" if m.get(key) is None else f"{m[key]:.3f}" for key, _ in COLUMNS]
                risk = []
                for chi in ("-1", "-5"):
                    r = (m.get("risk") or {}).get(chi)
                    risk.append("–" if r is None else f"{r['brier']:.3f} / {r['max_gap']:.3f}")
                print(f"| {lp} | {name} | " + " | ".join(cells + risk) + " |")
        print("\n| top atom | PPS | CRPS | ECE | worst sd cell | worst μ cell | miss balance | risk max gap χ=−5 |")
        print("|---|---|---|---|---|---|---|---|")
        for name, full in results.items():
            row = summary_row(full)
            lps = [k for k in full if k not in ("avg", "worst_cells")]
            balance = max(abs(full[lp][f"miss_{side}@0.9"] - 0.05) for lp in lps for side in ("below", "above"))
            print(
                f"| {name} | {row['pps']:.3f} | {row['crps']:.3f} | {row['ece']:.3f} | {row['worst_sd_cell_gap']:+.3f} | "
                f"{row['worst_mu_cell_gap']:+.3f} | {balance:.3f} | {row['risk_max_gap@-5']:.3f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
