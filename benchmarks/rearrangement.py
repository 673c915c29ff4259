"""What does serving the distribution rearranged in μ cost, and what does it buy?

``evaluate.rearrange_in_mu`` serves every interval bound non-decreasing and every risk P(Q ≤ χ)
non-increasing in μ within each known LP (:mod:`uamt.uncertainty.rearrangement`), where σ has no
weight.  Each model's served calibration (its candidate, point mass and σ weight) is read both ways
(:func:`uamt.serving.model_calibration.with_rearrangement` with the setting off and on; refitted
on its calibration rows, :func:`uamt.serving.model_calibration.refit_served`):

* **x-fit**: each document fold of the calibration rows answered by the calibration refitted on the
  others (:func:`uamt.model_evaluation.cross_fitted_rows`, what the gate and a choice read);
* **test**: refitted on every calibration row, test answered; per dataset × LP the AUROC of the
  risk for MQM ≤ χ beside −μ's (``benchmarks/quality.py``'s goal);
* **ood**: the same refit on the out-of-domain sets (no unseen-LP widening either way; the
  biomedical set's unseen LPs have no grid and are answered as calibrated).

Printed per model and reading: the served summary (``uamt.uncertainty.served.summary_row``: CRPS,
ECE, width, MQM ≤ −5 coverage, worst LP × sd / μ quintile cell |coverage − 0.9|, the risk's largest
decile gap), Brier and AUROC of the risk (LP average), and how often the risk rises with μ: the
share of each LP's rows (sorted by raw μ) whose served risk is above the previous row's by more
than 1e-9, and the largest such step (x-fit rows come from five calibrations, so only the test
reading says whether one calibration is monotone).

The first measurement (2026-11-30, v11 artifacts, before v12 served it) also read the distribution
*ordered* in μ by pooling the Mondrian knots, PIT recalibration and point-mass rates (weighted
PAVA); that option (commit e2d798c) cost the cells and was removed: docs/quality.md.

    python benchmarks/rearrangement.py [--models hts hts_qe] [--chi -5]

Reads what the pipeline wrote; changes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sigma_tempering import scores, served_models  # noqa: E402


def rises(risk: np.ndarray, mu: np.ndarray, lp: np.ndarray) -> tuple[float, float]:
    """Share of rows whose risk is above the risk of the row before them in μ order (within their
    LP; ties in μ not counted), and the largest such rise."""
    count, largest, total = 0, 0.0, 0
    for name in np.unique(lp):
        rows = np.flatnonzero(lp == name)
        order = rows[np.argsort(mu[rows], kind="stable")]
        step = np.diff(risk[order])
        distinct = np.diff(mu[order]) > 0
        count += int((step[distinct] > 1e-9).sum())
        total += int(distinct.sum())
        largest = max(largest, float(step[distinct].max(initial=0.0)))
    return count / max(total, 1), largest


def reading(calibration, rows, table, settings, chi: float) -> dict[str, float]:
    from uamt.model_evaluation import measure
    from uamt.uncertainty.served import summary_row

    summary = summary_row(measure(calibration, rows, table, settings), settings.coverage_gamma, chi)
    result = scores(calibration, rows, table, settings, chi)
    share, largest = rises(rows.risk[chi], table["mu"].to_numpy(dtype=float), table["lp"].astype(str).to_numpy())
    return {**summary, "auroc": result["avg"]["auroc"], "brier": result["avg"]["brier"], "rise_share": share, "rise_max": largest}


def main(argv: list[str] | None = None) -> int:
    from uamt.model_evaluation import ask, cross_fitted_rows
    from uamt.quality import auroc_score
    from uamt.serving.model_calibration import refit_served, with_rearrangement

    args, settings, bounds, models = served_models(argv, __doc__.splitlines()[0])
    for model, calibration, fitted_on, test, ood in models:
        weight = None if calibration.sigma_tempering is None else calibration.sigma_tempering.weight
        print(f"\n## {model} (σ weight {weight}): rearranged in μ or not, calibration refitted; χ = {args.chi:g}\n")
        print("| reading | split | CRPS | ECE | width@0.9 | MQM ≤ −5 cov. | worst sd / μ cell | Brier | risk max gap | AUROC | risk rises (share / max) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        by_cell: dict[str, dict[str, float]] = {}
        for label, rearrange in (("as calibrated", False), ("rearranged", True)):
            flagged = dataclasses.replace(settings, rearrange_in_mu=rearrange)
            template = with_rearrangement(calibration, fitted_on, model, flagged)
            if rearrange and not template.rearrangement_mu:
                print(f"| {label} | – | σ has weight {weight}: no grid, served as calibrated |||||||||")
                continue
            xfit, _ = cross_fitted_rows(fitted_on, model, template, flagged, bounds)
            refitted = refit_served(fitted_on, model, template, flagged)
            test_rows = ask(refitted, test, flagged, bounds)
            for split, rows, table in (("x-fit", xfit, fitted_on), ("test", test_rows, test)):
                r = reading(refitted, rows, table, flagged, args.chi)
                print(
                    f"| {label} | {split} | {r['crps']:.4f} | {r['ece']:.4f} | {r['width@0.9']:.2f} | {r['low_score_coverage']:.3f} "
                    f"| {abs(r['worst_sd_cell_gap']):.3f} / {abs(r['worst_mu_cell_gap']):.3f} | {r['brier']:.4f} "
                    f"| {r[f'risk_max_gap@{args.chi:g}']:.3f} | {r['auroc']:.3f} | {r['rise_share']:.3f} / {r['rise_max']:.4f} |"
                )
            ood_rows = ask(refitted, ood, flagged, bounds)
            for dataset, index in ood.groupby("dataset").indices.items():
                avg = scores(refitted, ood_rows.take(index), ood.iloc[index], flagged, args.chi)["avg"]
                print(f"| {label} | ood {dataset} | {avg['crps']:.4f} | | | | | {avg['brier']:.4f} | | {avg['auroc']:.3f} | |")
            human = test["human"].to_numpy(dtype=float)
            for (dataset, lp), index in test.groupby(["dataset", "lp"]).indices.items():
                event = human[index] <= args.chi
                if 0 < event.sum() < event.size:
                    cell = by_cell.setdefault(f"{dataset} {lp}", {})
                    cell[label] = auroc_score(test_rows.risk[args.chi][index], event)
                    cell["−μ"] = auroc_score(-test["mu"].to_numpy(dtype=float)[index], event)
        labels = sorted({key for cell in by_cell.values() for key in cell} - {"−μ"}) + ["−μ"]
        print(f"\nTest AUROC of the risk for MQM ≤ {args.chi:g} per dataset × LP\n")
        print("| dataset × LP | " + " | ".join(labels) + " |\n|---|" + "---|" * len(labels))
        for name, cell in sorted(by_cell.items()):
            print(f"| {name} | " + " | ".join(f"{cell[key]:.3f}" for key in labels) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
