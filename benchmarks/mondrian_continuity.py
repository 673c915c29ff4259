"""Does the Mondrian distribution's continuity in μ pay?  The served calibration as fitted
(interpolated between bin centres, :meth:`uamt.uncertainty.candidates.MondrianConformalCalibrator._row_knots`)
against the same artifact read stepwise (each row its bin's quantiles, as every calibration fitted
before 2026-11-30 is served).

Both read the one file ``calibration/<model>.json``: the stepwise reading turns ``interpolate`` off
in its Mondrian distributions (the served candidate and the one below the point mass at 0), whose
per-bin quantiles are fitted the same way either way, and in the point mass at 0 (interpolated in
μ too since 2026-11-30), whose rates were fitted for the interpolation; so the stepwise reading is
close to, not exactly, the artifact a stepwise fit writes.  Measured on test with the evaluate stage's code
(:func:`uamt.model_evaluation.measure`) and :mod:`uamt.quality`:

* per LP: CRPS, ECE, coverage at 0.9 and the misses, the mean width, coverage of MQM <= -5;
  the worst LP x sd and LP x μ quintile cell;
* per dataset x LP: AUROC for MQM <= -5 of the served risk and of −μ (the ranking the risk should
  at least match);
* a prototype reading of the risk only, ``risk rearranged in μ``: each row's served risk made
  non-increasing in μ at its own σ by rearrangement (Chernozhukov, Fernández-Val & Galichon 2009):
  the row's risk at the 2nd..98th percentiles of its LP's calibration μ and at its own μ, sorted in
  decreasing order, read at its own μ's rank.  Ranked by the served risk, bad translations are
  found less well than by −μ (test and cross-fitted dev, every dataset x LP: docs/quality.md);
  this measures what a distribution stochastically monotone in μ would buy in ranking (AUROC) and
  what it costs in reliability (Brier, largest decile gap).  Intervals are not rearranged, so it
  is not a served distribution: a design study; ``--dev`` reads the served and the rearranged risk
  cross-fitted on the calibration rows too (each document fold from the calibration refitted on
  the others), which is what a choice between them may read;
* ``--profile LP``: the served risk P(MQM <= -5) and the 90 % bounds along the LP's raw μ (5th to
  95th percentile, the LP's median σ): where the risk does not rise as μ falls.

    python benchmarks/mondrian_continuity.py [--models hts hts_qe] [--profile en-ru] [--dev]

Reads what the pipeline wrote; changes nothing.
"""

from __future__ import annotations

import argparse
import copy

import numpy as np

COLUMNS = (
    ("crps", "CRPS", "{:.4f}"), ("ece", "ECE", "{:.4f}"), ("coverage@0.9", "cov@.9", "{:.3f}"),
    ("miss_below@0.9", "below", "{:.3f}"), ("miss_above@0.9", "above", "{:.3f}"), ("width@0.9", "width", "{:.2f}"),
    ("low_score_coverage", "MQM≤−5 cov", "{:.3f}"),
)


def stepwise(calibration):
    """A copy of ``calibration`` whose Mondrian distributions serve each row its bin's quantiles and
    whose point mass at the top its bin's rate."""
    from uamt.uncertainty.candidates import MondrianConformalCalibrator

    out = copy.deepcopy(calibration)
    for part in (out, out.below_top):
        if part is not None and isinstance(part.served, MondrianConformalCalibrator):
            part.served.interpolate = False
    if out.top_atom is not None:
        out.top_atom.interpolate = False
    return out


#: Percentiles of each LP's calibration μ at which :func:`rearranged_risk` reads every row's risk.
GRID = np.linspace(0.02, 0.98, 49)


def rearranged_risk(calibration, mu, sigma, lp, chi: float, grid: dict) -> np.ndarray:
    """Each row's risk P(Q <= chi), shape [n], made non-increasing in μ at the row's own σ: its
    served risk at its LP's ``grid`` of raw μ (sorted, shape [G]) and at its own μ, sorted in
    decreasing order and read at the rank of its μ among them (the rearrangement on that grid)."""
    out = np.empty(mu.size)
    for name in np.unique(lp):
        rows = lp == name
        points = grid[name]
        own = calibration.risk(mu[rows], sigma[rows], chi, lp[rows])
        along = [calibration.risk(np.full(rows.sum(), m), sigma[rows], chi, lp[rows]) for m in points]
        values = -np.sort(-np.column_stack([*along, own]), axis=1)
        out[rows] = values[np.arange(rows.sum()), np.searchsorted(points, mu[rows])]
    return out


def cross_fitted_risks(table, method: str, calibration, settings, bounds, chi: float) -> dict[str, np.ndarray]:
    """The served and the rearranged risk P(Q <= chi) of every calibration row (``table``), each
    from the calibration refitted on the other document folds (as the calibrate stage cross-fits,
    :func:`uamt.model_evaluation.cross_fitted_rows`), the rearrangement's grid from those folds' μ."""
    from uamt.model_evaluation import row_documents
    from uamt.quality import served_quantities
    from uamt.serving.model_calibration import refit_served, with_model_sigma
    from uamt.uncertainty.candidates import document_folds

    table = with_model_sigma(table, method)
    folds = document_folds(row_documents(table), settings.cross_fit_folds)
    out = {"served": np.empty(len(table)), "risk rearranged in μ": np.empty(len(table))}
    for fold in np.unique(folds):
        held = folds == fold
        fitted = refit_served(table[~held], method, calibration, settings)
        part = table[held]
        grid = {str(lp): np.quantile(rows["mu"].to_numpy(dtype=float), GRID) for lp, rows in table[~held].groupby("lp")}
        out["served"][held] = served_quantities(fitted, part, bounds, chi, 0.9)["risk"]
        out["risk rearranged in μ"][held] = rearranged_risk(
            fitted, part["mu"].to_numpy(dtype=float), part["sigma"].to_numpy(dtype=float),
            part["lp"].astype(str).to_numpy(dtype=object), chi, grid,
        )
    return out


def print_risk_tables(table, risks: dict[str, np.ndarray], center: np.ndarray, chi: float, mu_label: str) -> None:
    """Per dataset x LP of ``table``, the AUROC for MQM <= ``chi`` of −``center`` and of each of
    ``risks`` (name -> shape [n]); then per LP each risk's Brier score and largest decile gap."""
    from uamt.quality import auroc_score
    from uamt.uncertainty.served import risk_reliability

    event = table["human"].to_numpy(dtype=float) <= chi
    print(f"\n| dataset x LP | AUROC MQM ≤ {chi:g}: {mu_label} | " + " | ".join(risks) + " |")
    print("|---|---|" + "---|" * len(risks))
    for (dataset, lp), rows in table.groupby(["dataset", "lp"]).indices.items():
        line = [f"{auroc_score(r[rows], event[rows]):.3f}" for r in risks.values()]
        print(f"| {dataset} {lp} | {auroc_score(-center[rows], event[rows]):.3f} | " + " | ".join(line) + " |")
    print(f"\n| LP | Brier / largest decile gap, P(MQM ≤ {chi:g}): " + " | ".join(risks) + " |")
    print("|---|" + "---|" * len(risks))
    for lp, rows in table.groupby("lp").indices.items():
        line = [risk_reliability(r[rows], event[rows], 10) for r in risks.values()]
        print(f"| {lp} | " + " | ".join(f"{x['brier']:.4f} / {x['max_gap']:.3f}" for x in line) + " |")


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import DEFAULT_PARAMS
    from uamt.model_evaluation import ask, calibration_rows, measure
    from uamt.pipeline_config import CALIBRATION_DIR
    from uamt.quality import read_model, served_quantities, served_setting

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "hts_qe", "point+signed_mondrian_conformal"])
    parser.add_argument("--profile", default=None, help="an LP whose risk and bounds to print along mu")
    parser.add_argument("--chi", type=float, default=-5.0)
    parser.add_argument("--dev", action="store_true", help="also the served and rearranged risk cross-fitted on the calibration rows")
    args = parser.parse_args(argv)
    pipe, settings, bounds = served_setting(args.params)
    for model in args.models:
        test, served = read_model(pipe.predictions_dir, args.calibration_dir, model)
        readings = {"stepwise": stepwise(served), "interpolated (served)": served}
        print(f"\n## {model}: test, {len(test):,} rows\n")
        print("| reading | LP | " + " | ".join(label for _, label, _ in COLUMNS) + " |")
        print("|---|---|" + "---|" * len(COLUMNS))
        cells = {}
        for name, calibration in readings.items():
            full = measure(calibration, ask(calibration, test, settings, bounds), test, settings)
            for lp in [k for k in full if k not in ("avg", "worst_cells")]:
                print(f"| {name} | {lp} | " + " | ".join(fmt.format(full[lp][key]) for key, _, fmt in COLUMNS) + " |")
            print(f"| {name} | mean | {full['avg']['crps']:.4f} |" + " – |" * (len(COLUMNS) - 1))
            cells[name] = {k: f"{v['lp']} {v['cell']} {v['coverage']:.3f}" for k, v in full["worst_cells"].items() if isinstance(v, dict)}
        print("\nworst LP x quintile cell: " + "; ".join(f"{name}: {c}" for name, c in cells.items()))
        news = test[test["dataset"].astype(str).str.contains("mqm")]
        answers = {name: served_quantities(c, news, bounds, args.chi, 0.9) for name, c in readings.items()}
        risks = {name: answer["risk"] for name, answer in answers.items()}
        center = answers["interpolated (served)"]["center"]
        fitted_on = calibration_rows(pipe, model.split("+")[0], served.calibrated_on)
        grid = {str(lp): np.quantile(rows["mu"].to_numpy(dtype=float), GRID) for lp, rows in fitted_on.groupby("lp")}
        sigma = news["sigma"].to_numpy(dtype=float)
        risks["risk rearranged in μ"] = rearranged_risk(
            served, news["mu"].to_numpy(dtype=float), np.where(np.isfinite(sigma), sigma, 1.0),
            news["lp"].astype(str).to_numpy(dtype=object), args.chi, grid,
        )
        print_risk_tables(news, risks, center, args.chi, "−μ")
        if args.dev:
            xfit = cross_fitted_risks(fitted_on, model.split("+")[0], served, settings, bounds, args.chi)
            print(f"\ncross-fitted on the calibration rows ({len(fitted_on):,}):")
            print_risk_tables(fitted_on, xfit, fitted_on["mu"].to_numpy(dtype=float), args.chi, "−raw μ")
        if args.profile and (test["lp"] == args.profile).any():
            rows = test[test["lp"] == args.profile]
            mu = np.quantile(rows["mu"].to_numpy(dtype=float), np.linspace(0.05, 0.95, 19))
            sigma = np.full(mu.size, float(np.median(rows["sigma"].to_numpy(dtype=float))))
            lp = [args.profile] * mu.size
            print(f"\n{args.profile}, σ {sigma[0]:.3f}: raw μ " + " ".join(f"{m:.2f}" for m in mu))
            for name, calibration in readings.items():
                low, _ = calibration.interval(mu, sigma, 0.9, lp)
                print(f"  {name}: risk " + " ".join(f"{r:.3f}" for r in calibration.risk(mu, sigma, args.chi, lp)))
                print(f"  {name}: lower@0.9 " + " ".join(f"{x:.2f}" for x in low))
            rearranged = rearranged_risk(served, mu, sigma, np.array(lp, dtype=object), args.chi, grid)
            print("  risk rearranged in μ: risk " + " ".join(f"{r:.3f}" for r in rearranged))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
