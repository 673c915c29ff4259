"""Is the risk goal out of reach for the served family?  The served calibration against isotonic
distributional regression (IDR, ``evaluate.distribution: isotonic``) on the same served mu.

The goal "risk :math:`P(Q \\le \\chi)` within ±0.05 of the observed share in every decile, every LP
and :math:`\\chi \\in \\{-1, -5, -10\\}`" failed on test.  Two causes are possible: the served family
(one residual distribution per LP x mu bin, shifted along mu, plus the point mass at 0) cannot
express the risk, or test differs from the calibration rows.  This script separates them.  For each
model it takes the distribution the calibrate stage wrote (``calibration/<model>.json``) and the
same calibration serving IDR instead (:func:`uamt.serving.model_calibration.with_isotonic`, fitted
on the same calibration rows), and measures both with the evaluate stage's own code
(:func:`uamt.model_evaluation.measure`: randomised PIT at every point mass, document-clustered bands):

* ``in sample``: on the calibration rows, as fitted.  IDR's risk is calibrated there by construction
  (up to deciles that split tied predictions); the served family's is not, and its gaps there are
  the family's, not a shift's;
* ``cross-fitted``: on the calibration rows, each document fold answered by the distribution refitted
  on the other folds (:func:`uamt.model_evaluation.cross_fitted_rows`, as the gate's dev metrics);
* ``test``: as served;
* ``ood``: the out-of-domain rows (``predictions/ood``), whose language pairs the calibration mostly
  never saw: they get the global fallback widened by the unseen-LP factor, each distribution its own
  (fitted as the calibrate stage fits it, :func:`uamt.serving.model_calibration.fit_model_unseen_lp_sigma_factor`).

Per LP: coverage and misses at 0.9, mean width, CRPS, ECE, coverage of MQM <= -5, the worst
quintile cell of the served sd and mu, and the risk's largest decile gap at chi = -1, -5, -10 with
the number of deciles beyond ±0.05 + 1.96 document-clustered se.  The ``all`` row: means over LPs,
the MQM <= -5 coverage pooled over LPs (as the gate reads it), the worst cell and the largest gaps
over LPs, the deciles out summed.

    python benchmarks/isotonic_distribution.py [--models hts hts_qe point] [--splits in-sample cross-fitted test ood]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

THRESHOLDS = ("-1", "-5", "-10")
COLUMNS = (
    ("coverage@0.9", "cov@.9", "{:.3f}"), ("miss_below@0.9", "below", "{:.3f}"), ("miss_above@0.9", "above", "{:.3f}"),
    ("width@0.9", "width", "{:.2f}"), ("crps", "CRPS", "{:.3f}"), ("ece", "ECE", "{:.3f}"),
    ("low_score_coverage", "cov ≤−5", "{:.3f}"),
)


def risk_summary(m: dict) -> tuple[str, int]:
    """``"gap@-1/gap@-5/gap@-10"`` and the deciles beyond ±0.05 + 1.96 se, of one LP's metrics."""
    gaps, beyond = [], 0
    for chi in THRESHOLDS:
        r = m["risk"][chi]
        gaps.append(f"{r['max_gap']:.3f}")
        beyond += sum(abs(b["observed"] - b["predicted"]) > 0.05 + 1.96 * b.get("se", 0.0) for b in r["bins"])
    return " / ".join(gaps), beyond


def cell_gap(m: dict, kind: str) -> float:
    return m["cells"][kind]["worst_gap"]


def print_block(title: str, results: dict[str, dict]) -> None:
    print(f"\n{title}")
    print("| LP | distribution | " + " | ".join(label for _, label, _ in COLUMNS) + " | sd cell | μ cell | risk gap χ = −1 / −5 / −10 | deciles out |")
    print("|---|---|" + "---|" * (len(COLUMNS) + 4))
    lps = [k for k in next(iter(results.values())) if k not in ("avg", "worst_cells")]
    for lp in [*lps, "all"]:
        for name, full in results.items():
            rows = [full[x] for x in lps] if lp == "all" else [full[lp]]
            cells = []
            for key, _, fmt in COLUMNS:
                values = [m.get(key) for m in rows if m.get(key) is not None]
                if key == "low_score_coverage" and values:  # pooled over LPs, as the gate reads it
                    weights = [m.get("low_score_n") or 0 for m in rows if m.get(key) is not None]
                    values = [float(np.average(values, weights=weights))] if sum(weights) else values
                cells.append(fmt.format(float(np.mean(values))) if values else "–")
            sd_gap = max((cell_gap(m, "sd") for m in rows), key=abs)
            mu_gap = max((cell_gap(m, "mu") for m in rows), key=abs)
            risk = [risk_summary(m) for m in rows]
            gaps = risk[0][0] if lp != "all" else " / ".join(
                f"{max(float(r[0].split(' / ')[i]) for r in risk):.3f}" for i in range(3)
            )
            out = sum(r[1] for r in risk)
            print(f"| {lp} | {name} | " + " | ".join(cells) + f" | {sd_gap:+.3f} | {mu_gap:+.3f} | {gaps} | {out} |")


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import DEFAULT_PARAMS
    from uamt.model_evaluation import ask, calibration_rows, cross_fitted_rows, measure
    from uamt.pipeline_config import CALIBRATION_DIR
    from uamt.quality import read_model, served_setting
    from uamt.serving.model_calibration import (
        fit_model_unseen_lp_sigma_factor,
        with_isotonic,
        with_model_sigma,
        with_unseen_factor,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "hts_qe", "point"])
    parser.add_argument("--splits", nargs="+", default=["in-sample", "cross-fitted", "test"],
                        choices=["in-sample", "cross-fitted", "test", "ood"])
    args = parser.parse_args(argv)
    pipe, settings, bounds = served_setting(args.params)
    for model in args.models:
        test, served = read_model(pipe.predictions_dir, args.calibration_dir, model)
        calib = with_model_sigma(calibration_rows(pipe, model, served.calibrated_on), model)
        started = time.perf_counter()
        isotonic = served
        if served.isotonic is None:
            isotonic = with_isotonic(served, calib, None, settings)
            factor, _ = fit_model_unseen_lp_sigma_factor(calib, None, isotonic, settings=settings, bounds=bounds)
            isotonic = with_unseen_factor(isotonic, factor)
        fit_s = time.perf_counter() - started
        variants = {("served" if served.isotonic is None else "served (isotonic)"): served, "isotonic": isotonic}
        on = "+".join(served.calibrated_on)
        print(
            f"\n## {model} (calibrated on {on}, {len(calib):,} rows; test {len(test):,}; isotonic fit {fit_s:.1f} s;"
            f" unseen-LP factor served {served.unseen_lp_sigma_factor:.3f}, isotonic {isotonic.unseen_lp_sigma_factor:.3f})"
        )
        ood = read_model(pipe.predictions_dir, args.calibration_dir, model, "ood")[0] if "ood" in args.splits else None
        for split in args.splits:
            results = {}
            for name, cal in variants.items():
                if split == "in-sample":
                    rows, table = ask(cal, calib, settings, bounds), calib
                elif split == "cross-fitted":
                    rows, table = cross_fitted_rows(calib, None, cal, settings, bounds)[0], calib
                elif split == "test":
                    rows, table = ask(cal, test, settings, bounds), test
                else:
                    rows, table = ask(cal, ood, settings, bounds), ood
                results[name] = measure(cal, rows, table, settings)
            print_block(f"{model}: {split} ({on if split in ('in-sample', 'cross-fitted') else split})", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
