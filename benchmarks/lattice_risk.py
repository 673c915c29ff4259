"""Is the risk goal missed because MQM scores sit on a lattice?  The served risk at χ against the
served CDF half a point above χ (a continuity correction).

MQM scores are weighted error counts: 78-100 % of the test rows per LP are whole numbers (0, -1,
-2, ..., -5 for a major error), the rest rater averages.  The served distribution is continuous
below the top of the scale, so where its CDF is calibrated on such scores it passes *through* each
step of the true CDF: at a whole χ it reads about :math:`P(Q < \\chi) + \\tfrac12 P(Q = \\chi)`, not
:math:`P(Q \\le \\chi)` -- low by half the point mass at χ (the randomised PIT the pipeline fits and
measures on splits each point mass evenly).  Reading the same distribution at χ + ½,
:math:`F(\\chi + \\tfrac12)`, is the risk of the served distribution rounded to whole MQM points.

For each model this measures, with the evaluate stage's own code (:func:`uamt.model_evaluation.ask`
on ``calibration/<model>.json``; :func:`uamt.uncertainty.served.risk_reliability` with
document-clustered se), on the calibration rows in sample, cross-fitted over document folds (as the
gate reads dev) and on test, per LP and χ ∈ {-1, -5, -10}: the Brier score and the largest decile gap
of the served risk :math:`F(\\chi)` and of :math:`F(\\chi + \\delta)` for each offset δ; and how many
of the 120 deciles lie beyond ±0.05 by more than 1.96 and by more than the family's Bonferroni z
(:func:`uamt.uncertainty.goals.family_z`) of their se.  The event is always ``human <= chi``.  A
second table shows the mechanism over all rows: the mean served :math:`F(\\chi)` beside the observed
shares :math:`P(Q < \\chi)` and :math:`P(Q \\le \\chi)`.

    python benchmarks/lattice_risk.py [--models hts hts_qe dup kl mcd_head] [--offsets 0 0.25 0.5]
        [--splits in-sample cross-fitted test]

Run it where the pipeline's ``predictions/`` and ``calibration/`` are (the working tree after
``dvc repro``, or a copy of them).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

THRESHOLDS = (-1.0, -5.0, -10.0)
TOLERANCE = 0.05


def reliability(rows, table, offsets, settings) -> tuple[dict, dict]:
    """``({offset: {"by_lp": {lp: {chi: (brier, max_gap)}}, "deciles": [(excess, se)], "brier": mean}},
    {chi: (mean served F(chi), share below chi, share at or below chi)})``: the risk read at
    chi + offset, and the mechanism over all rows at chi itself."""
    from uamt.model_evaluation import row_documents, served_settings
    from uamt.uncertainty.served import risk_reliability

    human = table["human"].to_numpy(dtype=float)
    lp = table["lp"].astype(str).to_numpy()
    docs = row_documents(table)
    n_bins = served_settings(settings).n_risk_bins
    out = {}
    for offset in offsets:
        by_lp, deciles, briers = {}, [], []
        for name in sorted(set(lp.tolist())):
            mask = lp == name
            by_lp[name] = {}
            for chi in THRESHOLDS:
                risk = rows.risk[chi + offset][mask]
                r = risk_reliability(risk, (human[mask] <= chi).astype(float), n_bins, docs[mask])
                by_lp[name][chi] = (r["brier"], r["max_gap"])
                briers.append(r["brier"])
                deciles += [(abs(b["observed"] - b["predicted"]) - TOLERANCE, b["se"]) for b in r["bins"]]
        out[offset] = {"by_lp": by_lp, "deciles": deciles, "brier": float(np.mean(briers))}
    steps = {
        chi: (float(np.mean(rows.risk[chi])), float(np.mean(human < chi)), float(np.mean(human <= chi))) for chi in THRESHOLDS
    }
    return out, steps


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import DEFAULT_PARAMS
    from uamt.model_evaluation import ask, calibration_rows, cross_fitted_rows
    from uamt.pipeline_config import CALIBRATION_DIR
    from uamt.quality import read_model, served_setting
    from uamt.serving.model_calibration import with_model_sigma
    from uamt.uncertainty.goals import family_z

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "hts_qe", "dup", "kl", "mcd_head"])
    parser.add_argument("--offsets", nargs="+", type=float, default=[0.0, 0.25, 0.5])
    parser.add_argument("--splits", nargs="+", default=["in-sample", "cross-fitted", "test"],
                        choices=["in-sample", "cross-fitted", "test"])
    args = parser.parse_args(argv)
    pipe, settings, bounds = served_setting(args.params)
    offsets = [float(o) for o in args.offsets]
    settings = dataclasses.replace(
        settings, risk_thresholds=tuple(sorted({chi + o for chi in THRESHOLDS for o in offsets}))
    )
    steps = []
    print("| model | split | offset δ | Brier (mean of 12) | largest gap per LP, χ = −1 / −5 / −10 | deciles beyond 1.96 se | beyond the family's z |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        test, served = read_model(pipe.predictions_dir, args.calibration_dir, model)
        calib = with_model_sigma(calibration_rows(pipe, model, served.calibrated_on), model)
        for split in args.splits:
            if split == "in-sample":
                rows, table = ask(served, calib, settings, bounds), calib
            elif split == "cross-fitted":
                rows, table = cross_fitted_rows(calib, None, served, settings, bounds)[0], calib
            else:
                rows, table = ask(served, test, settings, bounds), test
            result, mechanism = reliability(rows, table, offsets, settings)
            steps.append(
                f"| {model} | {split} | "
                + " | ".join(f"{f:.3f} ({below:.3f} / {at:.3f})" for f, below, at in mechanism.values())
                + " |"
            )
            for offset, r in result.items():
                z = family_z(len(r["deciles"]))
                gaps = ", ".join(
                    f"{lp} " + "/".join(f"{gap:.3f}" for _, gap in per_chi.values()) for lp, per_chi in r["by_lp"].items()
                )
                beyond = sum(excess > 1.96 * se for excess, se in r["deciles"])
                decided = sum(excess > z * se for excess, se in r["deciles"])
                print(f"| {model} | {split} | {offset:g} | {r['brier']:.4f} | {gaps} | {beyond}/{len(r['deciles'])} | {decided} |")
    print("\nMean served F(χ), all rows (observed share below χ / at or below χ):\n")
    print("| model | split | χ = −1 | χ = −5 | χ = −10 |")
    print("|---|---|---|---|---|")
    print("\n".join(steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
