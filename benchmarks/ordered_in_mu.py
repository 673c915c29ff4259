"""What does holding the served distribution stochastically ordered in μ cost, and what does it buy?

``evaluate.order_in_mu`` fits the signed Mondrian distribution's quantiles at its bins' centres, its
PIT recalibration and the top atom's rates non-decreasing in μ within each LP
(:meth:`uamt.uncertainty.candidates.MondrianConformalCalibrator._order_in_mu`), so the served risk
P(Q ≤ χ) cannot rise with μ at a given σ; with one σ per LP (λ = 0) it then ranks the rows as −μ.
Each model's served calibration (its candidate, point mass and σ weight) is refitted on its
calibration rows both ways (:func:`uamt.serving.model_calibration.refit_served`) and read:

* **x-fit**: each document fold of the calibration rows answered by the calibration refitted on the
  others (:func:`uamt.model_evaluation.cross_fitted_rows`, what a choice may read);
* **test**: refitted on every calibration row, test answered; per dataset × LP the AUROC of the
  risk for MQM ≤ χ beside −μ's (``benchmarks/quality.py``'s goal);
* **ood**: the same refit on the out-of-domain sets (no unseen-LP widening either way).

Printed per model and reading: the served summary (``uamt.uncertainty.served.summary_row``: CRPS,
ECE, width, MQM ≤ −5 coverage, worst LP × sd / μ quintile cell |coverage − 0.9|, the risk's largest
decile gap), Brier and AUROC of the risk (LP average), and how often the risk rises with μ: the
share of each LP's rows (sorted by raw μ) whose served risk is above the previous row's by more
than 1e-9, and the largest such step (x-fit rows come from five calibrations, so only the test
reading says whether one calibration is monotone).

    python benchmarks/ordered_in_mu.py [--models hts hts_qe] [--chi -5]

Reads what the pipeline wrote; changes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sigma_tempering import scores  # noqa: E402


def rises(risk: np.ndarray, mu: np.ndarray, lp: np.ndarray) -> tuple[float, float]:
    """Share of rows whose risk is above the risk of the row before them in μ order (within their
    LP; ties in μ not counted), and the largest such rise."""
    count, largest, total = 0, 0.0, 0
    for name in np.unique(lp):
        rows = np.flatnonzero(lp == name)
        order = rows[np.argsort(mu[rows], kind="stable")]
        step = np.diff(risk[order])
        distinct = np.diff(mu[order]) > 0
        up = step[distinct] > 1e-9
        count += int(up.sum())
        total += int(distinct.sum())
        largest = max(largest, float(step[distinct].max(initial=0.0)))
    return count / max(total, 1), largest


#: Percentiles of an LP's calibration μ on which :func:`rearranged_rows` reads the served distribution.
GRID = np.linspace(0.02, 0.98, 49)


def rearranged(values: np.ndarray, mu: np.ndarray, grid_mu: np.ndarray, grid_values: np.ndarray) -> np.ndarray:
    """Each row's ``values`` (shape [n]) made non-decreasing in μ by rearrangement on a grid: the
    r-th smallest of the grid's values (``grid_values`` at the sorted ``grid_mu``, shape [G]) and the
    row's own, r the number of grid points below the row's μ (Chernozhukov, Fernández-Val & Galichon
    2009).  A row at the grid's μ gets the grid's sorted value there."""
    ordered = np.sort(grid_values)
    rank = np.searchsorted(grid_mu, mu)
    below = np.searchsorted(ordered, values)  # grid values below the row's own
    before = ordered[np.clip(rank - 1, 0, ordered.size - 1)]
    at = ordered[np.clip(rank, 0, ordered.size - 1)]
    return np.where(rank < below, at, np.where(rank == below, values, before))


def rearranged_rows(rows, part, fit_rows, ask_grid):
    """The served answers ``rows`` for the predictions ``part``, rearranged in μ per LP on the grid of
    its calibration rows ``fit_rows`` (:data:`GRID`; ``ask_grid(table)`` answers a grid table):
    quantiles and interval bounds non-decreasing, risks and the CDF at the scale's ends
    non-increasing.  The grid is read at the LP's median σ: exactly the rearrangement of the served
    distribution where σ has no weight (λ = 0), at fixed σ only approximately otherwise.  LPs without
    calibration rows (unseen) keep their answers."""
    out = dataclasses.replace(
        rows,
        intervals={g: (lo.copy(), hi.copy()) for g, (lo, hi) in rows.intervals.items()},
        quantiles=rows.quantiles.copy(),
        risk={chi: r.copy() for chi, r in rows.risk.items()},
        cdf_at_bounds=None if rows.cdf_at_bounds is None else rows.cdf_at_bounds.copy(),
    )
    for lp, index in part.groupby("lp").indices.items():
        fitted_lp = fit_rows[fit_rows["lp"].astype(str) == str(lp)]
        if fitted_lp.empty:
            continue
        grid_mu = np.quantile(fitted_lp["mu"].to_numpy(dtype=float), GRID)
        grid = ask_grid(pd.DataFrame({"lp": str(lp), "mu": grid_mu, "sigma": float(part["sigma"].iloc[index].median())}))
        mu = part["mu"].to_numpy(dtype=float)[index]

        def up(own, along, mu=mu, grid_mu=grid_mu):
            return rearranged(own, mu, grid_mu, along)

        def down(own, along, mu=mu, grid_mu=grid_mu):
            return -rearranged(-own, mu, grid_mu, -along)

        for gamma, (lo, hi) in out.intervals.items():
            glo, ghi = grid.intervals[gamma]
            lo[index], hi[index] = up(lo[index], glo), up(hi[index], ghi)
        for j in range(out.quantiles.shape[1]):
            out.quantiles[index, j] = up(out.quantiles[index, j], grid.quantiles[:, j])
        for chi, risk in out.risk.items():
            risk[index] = down(risk[index], grid.risk[chi])
        if out.cdf_at_bounds is not None:
            for j in range(out.cdf_at_bounds.shape[1]):
                out.cdf_at_bounds[index, j] = down(out.cdf_at_bounds[index, j], grid.cdf_at_bounds[:, j])
    return out


def reading(calibration, rows, table, settings, chi: float) -> dict[str, float]:
    from uamt.model_evaluation import measure
    from uamt.uncertainty.served import summary_row

    summary = summary_row(measure(calibration, rows, table, settings), settings.coverage_gamma, chi)
    result = scores(calibration, rows, table, settings, chi)
    share, largest = rises(rows.risk[chi], table["mu"].to_numpy(dtype=float), table["lp"].astype(str).to_numpy())
    return {**summary, "auroc": result["avg"]["auroc"], "brier": result["avg"]["brier"], "rise_share": share, "rise_max": largest}


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import DEFAULT_PARAMS
    from uamt.model_evaluation import ask, calibration_rows, cross_fitted_rows
    from uamt.pipeline_config import CALIBRATION_DIR
    from uamt.quality import auroc_score, served_setting
    from uamt.serving.model_calibration import Calibration, refit_served

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "hts_qe"])
    parser.add_argument("--chi", type=float, default=-5.0)
    args = parser.parse_args(argv)
    pipe, settings, bounds = served_setting(args.params)
    if args.chi not in settings.risk_thresholds:
        parser.error(f"--chi {args.chi:g} is not one of params.yaml:evaluate.risk_thresholds {list(settings.risk_thresholds)}")
    for model in args.models:
        calibration = Calibration.load(f"{args.calibration_dir}/{model}.json")
        fitted_on = calibration_rows(pipe, model, calibration.calibrated_on)
        test = pd.read_parquet(f"{pipe.predictions_dir}/test/{model}.parquet")
        ood = pd.read_parquet(f"{pipe.predictions_dir}/ood/{model}.parquet")
        weight = None if calibration.sigma_tempering is None else calibration.sigma_tempering.weight
        print(f"\n## {model} (σ weight {weight}): ordered in μ or not, calibration refitted; χ = {args.chi:g}\n")
        print("| reading | split | CRPS | ECE | width@0.9 | MQM ≤ −5 cov. | worst sd / μ cell | Brier | risk max gap | AUROC | risk rises (share / max) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        by_cell: dict[str, dict[str, float]] = {}
        for label, ordered, rearranging in (("served", False, False), ("ordered", True, False), ("rearranged", False, True)):
            flagged = dataclasses.replace(settings, order_in_mu=ordered)

            def answer(fitted, part, fit_rows, flagged=flagged, rearranging=rearranging):
                rows = ask(fitted, part, flagged, bounds)
                if not rearranging:
                    return rows
                return rearranged_rows(rows, part, fit_rows, lambda grid: ask(fitted, grid, flagged, bounds))

            xfit, _ = cross_fitted_rows(fitted_on, model, calibration, flagged, bounds, answer=answer)
            refitted = refit_served(fitted_on, model, calibration, flagged)
            test_rows = answer(refitted, test, fitted_on)
            for split, rows, table in (("x-fit", xfit, fitted_on), ("test", test_rows, test)):
                r = reading(refitted, rows, table, flagged, args.chi)
                print(
                    f"| {label} | {split} | {r['crps']:.4f} | {r['ece']:.4f} | {r['width@0.9']:.2f} | {r['low_score_coverage']:.3f} "
                    f"| {abs(r['worst_sd_cell_gap']):.3f} / {abs(r['worst_mu_cell_gap']):.3f} | {r['brier']:.4f} "
                    f"| {r[f'risk_max_gap@{args.chi:g}']:.3f} | {r['auroc']:.3f} | {r['rise_share']:.3f} / {r['rise_max']:.4f} |"
                )
            ood_rows = answer(refitted, ood, fitted_on)
            for dataset, index in ood.groupby("dataset").indices.items():
                avg = scores(refitted, ood_rows.take(index), ood.iloc[index], flagged, args.chi)["avg"]
                print(f"| {label} | ood {dataset} | {avg['crps']:.4f} | | | | | {avg['brier']:.4f} | | {avg['auroc']:.3f} | |")
            human = test["human"].to_numpy(dtype=float)
            for (dataset, lp), index in test.groupby(["dataset", "lp"]).indices.items():
                event = human[index] <= args.chi
                if 0 < event.sum() < event.size:
                    cell = by_cell.setdefault(f"{dataset} {lp}", {})
                    cell[label] = auroc_score(test_rows.risk[args.chi][index], event)
                    cell["mu"] = auroc_score(-test["mu"].to_numpy(dtype=float)[index], event)
        print(f"\nTest AUROC of the risk for MQM ≤ {args.chi:g} per dataset × LP\n")
        print("| dataset × LP | served | ordered | rearranged | −μ |\n|---|---|---|---|---|")
        for name, cell in sorted(by_cell.items()):
            print(f"| {name} | {cell['served']:.3f} | {cell['ordered']:.3f} | {cell['rearranged']:.3f} | {cell['mu']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
