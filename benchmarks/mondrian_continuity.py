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
* since v12 the served distribution is rearranged in μ (:mod:`uamt.uncertainty.rearrangement`):
  the readings above are of the artifact without its grid, and ``served`` reads it as served;
  ``--dev`` reads the risk of both cross-fitted on the calibration rows too (each document fold
  from the calibration refitted on the others, :func:`uamt.model_evaluation.cross_fitted_rows`),
  which is what a choice between them may read.  (Until v11 this benchmark carried a prototype
  of the rearranged risk; ``benchmarks/rearrangement.py`` measures the served one.)
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
    whose point mass at the top its bin's rate, not rearranged in μ."""
    from uamt.uncertainty.candidates import MondrianConformalCalibrator

    out = unrearranged(calibration)
    for part in (out, out.below_top):
        if part is not None and isinstance(part.served, MondrianConformalCalibrator):
            part.served.interpolate = False
    if out.top_atom is not None:
        out.top_atom.interpolate = False
    return out


def unrearranged(calibration):
    """A copy of ``calibration`` without its grid: the answers as its calibrators give them."""
    out = copy.deepcopy(calibration)
    out.rearrangement_mu = {}
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
    from uamt.model_evaluation import ask, calibration_rows, cross_fitted_rows, measure
    from uamt.pipeline_config import CALIBRATION_DIR
    from uamt.quality import read_model, served_quantities, served_setting

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "hts_qe", "point+signed_mondrian_conformal"])
    parser.add_argument("--profile", default=None, help="an LP whose risk and bounds to print along mu")
    parser.add_argument("--chi", type=float, default=-5.0)
    parser.add_argument("--dev", action="store_true", help="also the risk cross-fitted on the calibration rows, not rearranged and served")
    args = parser.parse_args(argv)
    pipe, settings, bounds = served_setting(args.params)
    for model in args.models:
        test, served = read_model(pipe.predictions_dir, args.calibration_dir, model)
        readings = {"stepwise": stepwise(served), "interpolated": unrearranged(served), "served": served}
        print(f"\n## {model}: test, {len(test):,} rows (served: {'rearranged in μ' if served.rearrangement_mu else 'not rearranged'})\n")
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
        center = answers["served"]["center"]
        fitted_on = calibration_rows(pipe, model.split("+")[0], served.calibrated_on)
        print_risk_tables(news, risks, center, args.chi, "−μ")
        if args.dev:
            method = model.split("+")[0]
            xfit = {
                name: cross_fitted_rows(fitted_on, method, readings[name], settings, bounds)[0].risk[args.chi]
                for name in ("interpolated", "served")
            }
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
