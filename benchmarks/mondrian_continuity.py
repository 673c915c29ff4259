"""Does the Mondrian distribution's continuity in μ pay?  The served calibration as fitted
(interpolated between bin centres, :meth:`uamt.uncertainty.candidates.MondrianConformalCalibrator._row_knots`)
against the same artifact read stepwise (each row its bin's quantiles, as every calibration fitted
before 2026-11-30 is served).

Both read the one file ``calibration/<model>.json``: the stepwise reading turns ``interpolate`` off
in its Mondrian distributions (the served candidate and the one below the point mass at 0), whose
per-bin quantiles are fitted the same way either way; only the point mass's rates were fitted on
the interpolated distribution below it, so the stepwise reading is close to, not exactly, the
artifact a stepwise fit writes.  Measured on test with the evaluate stage's code
(:func:`uamt.model_evaluation.measure`) and :mod:`uamt.quality`:

* per LP: CRPS, ECE, coverage at 0.9 and the misses, the mean width, coverage of MQM <= -5;
  the worst LP x sd and LP x μ quintile cell;
* per dataset x LP: AUROC for MQM <= -5 of the served risk and of −μ (the ranking the risk should
  at least match);
* a third reading, ``+ point mass interpolated``: the served one with the point mass at 0's
  probability also interpolated in μ between its quintiles' approximate centres (the midpoints of
  its edges; it is a step per quintile as fitted) -- whether that step is what keeps the risk
  from following μ;
* ``--profile LP``: the served risk P(MQM <= -5) and the 90 % bounds along the LP's raw μ (5th to
  95th percentile, the LP's median σ): where the risk does not rise as μ falls.

    python benchmarks/mondrian_continuity.py [--models hts hts_qe] [--profile en-ru]

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
    """A copy of ``calibration`` whose Mondrian distributions serve each row its bin's quantiles."""
    from uamt.uncertainty.candidates import MondrianConformalCalibrator

    out = copy.deepcopy(calibration)
    for part in (out, out.below_top):
        if part is not None and isinstance(part.served, MondrianConformalCalibrator):
            part.served.interpolate = False
    return out


def with_interpolated_atom(calibration):
    """A copy of ``calibration`` whose point mass at the top has its probability interpolated in μ
    between the midpoints of its bins' edges (the outer centres half a bin beyond the outer edges)."""
    from uamt.uncertainty.atom import TopAtom
    from uamt.uncertainty.calibrators import GLOBAL, lp_groups

    class InterpolatedAtom(TopAtom):
        def probability(self, center, lp=None):
            center = np.asarray(center, dtype=float)
            single = lp is None or isinstance(lp, str)
            lps = np.full(center.size, GLOBAL if lp is None else lp, dtype=object) if single else np.asarray(lp, dtype=object)
            out = np.empty(center.size)
            for name, rows in lp_groups(lps):
                params = self.lp_params.get(str(name)) or self.global_params
                edges, rates = np.asarray(params["edges"], dtype=float), np.asarray(params["rates"], dtype=float)
                if edges.size < 2:
                    out[rows] = rates[np.searchsorted(edges, center[rows])]
                    continue
                mids = (edges[1:] + edges[:-1]) / 2
                centres = np.r_[2 * edges[0] - mids[0], mids, 2 * edges[-1] - mids[-1]]
                out[rows] = np.interp(center[rows], centres, rates)
            return out

    out = copy.deepcopy(calibration)
    if out.top_atom is not None:
        atom = out.top_atom
        out.top_atom = InterpolatedAtom(atom.value, atom.n_bins, atom.lp_params, atom.global_params)
    return out


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import DEFAULT_PARAMS
    from uamt.model_evaluation import ask, measure
    from uamt.pipeline_config import CALIBRATION_DIR
    from uamt.quality import auroc_score, read_model, served_quantities, served_setting

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "hts_qe", "point+signed_mondrian_conformal"])
    parser.add_argument("--profile", default=None, help="an LP whose risk and bounds to print along mu")
    parser.add_argument("--chi", type=float, default=-5.0)
    args = parser.parse_args(argv)
    pipe, settings, bounds = served_setting(args.params)
    for model in args.models:
        test, served = read_model(pipe.predictions_dir, args.calibration_dir, model)
        readings = {
            "stepwise": stepwise(served),
            "interpolated (served)": served,
            "+ point mass interpolated": with_interpolated_atom(served),
        }
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
        event = news["human"].to_numpy(dtype=float) <= args.chi
        groups = news.groupby(["dataset", "lp"]).indices
        print(f"\n| dataset x LP | AUROC MQM ≤ {args.chi:g}: −μ | " + " | ".join(f"risk, {name}" for name in readings) + " |")
        print("|---|---|" + "---|" * len(readings))
        risks = {name: served_quantities(c, news, bounds, args.chi, 0.9) for name, c in readings.items()}
        for (dataset, lp), rows in groups.items():
            center = risks["interpolated (served)"]["center"][rows]
            line = [f"{auroc_score(r['risk'][rows], event[rows]):.3f}" for r in risks.values()]
            print(f"| {dataset} {lp} | {auroc_score(-center, event[rows]):.3f} | " + " | ".join(line) + " |")
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
