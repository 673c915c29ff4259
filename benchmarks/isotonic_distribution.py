"""Is the risk goal out of reach for the served family?  The served calibration against isotonic
distributional regression (IDR) on the same served mu, on the calibration rows and on test.

The goal "risk :math:`P(Q \\le \\chi)` within ±0.05 of the observed share in every decile, every LP
and :math:`\\chi \\in \\{-1, -5, -10\\}`" failed on test (largest gap 0.169).  Two causes are
possible: the served family (one residual distribution per LP x mu bin, shifted along mu, plus the
point mass at 0) cannot express the risk, or test differs from the calibration rows.  This script
separates them.  For each model it answers, with the distribution the calibrate stage wrote
(``calibration/<model>.json``) and with :class:`uamt.uncertainty.isotonic.IsotonicDistribution`
fitted on the same calibration rows against the same served mu (:class:`ServedIsotonic`):

* ``calibration rows (in sample)``: both as fitted.  IDR's risk is calibrated here by construction;
  the served family's is not, and its gaps here are the family's, not a shift's;
* ``calibration rows (cross-fitted)``: IDR refitted on 4/5 of the documents, answering the fifth
  (the served calibration's cross-fitted numbers are the calibrate stage's, ``metrics/dev.json``);
* ``test``: both as served.

One definition for both, per LP: coverage and misses at 0.9 and ECE over 100 levels from the
randomised PIT (a score on a point mass counts by the share of the mass inside the band, as
:func:`uamt.uncertainty.served.randomised_shares` does at the scale's bounds; IDR has point masses
inside the scale too), the closed interval's mean width, CRPS from 100 quantiles, coverage of
MQM <= -5, the worst LP x quintile cell of the served mu and of the served sd, and the risk at
chi = -1, -5, -10: Brier score, largest decile gap and the deciles beyond ±0.05 + 1.96 binomial se.

    python benchmarks/isotonic_distribution.py [--models hts point] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

GAMMA = 0.9
THRESHOLDS = (-1.0, -5.0, -10.0)
LOW_SCORE = -5.0
N_LEVELS = 100
N_QUANTILES = 100


def pit_range(dist, table: pd.DataFrame, bounds) -> tuple[np.ndarray, np.ndarray]:
    """Per row :math:`(F(y^-), F(y))` of ``dist`` at the row's human score, as served (clipped to
    ``bounds``: 1 at or above the top, 0 below the bottom)."""
    low, high = bounds
    mu, sigma = table["mu"].to_numpy(dtype=float), table["sigma"].to_numpy(dtype=float)
    lp = table["lp"].astype(str).to_numpy(dtype=object)
    human = table["human"].to_numpy(dtype=float)
    lo, hi = np.zeros(human.size), np.zeros(human.size)

    def served_cdf(rows, chi):
        if chi >= high:
            return np.ones(int(rows.sum()))
        if chi < low:
            return np.zeros(int(rows.sum()))
        return np.asarray(dist.risk(mu[rows], sigma[rows], chi, lp[rows]), dtype=float)

    for value in np.unique(human):
        rows = human == value
        hi[rows] = served_cdf(rows, float(value))
        lo[rows] = served_cdf(rows, float(np.nextafter(value, -np.inf)))
    return lo, np.maximum(hi, lo)


def band_shares(lo: np.ndarray, hi: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shares of each row's PIT range [lo, hi] below, inside and above the band of level ``gamma``."""
    a, b = (1.0 - gamma) / 2.0, (1.0 + gamma) / 2.0
    width = hi - lo
    point = width <= 1e-12
    safe = np.where(point, 1.0, width)
    below = np.where(point, (lo < a).astype(float), np.clip(np.minimum(hi, a) - lo, 0.0, None) / safe)
    above = np.where(point, (lo > b).astype(float), np.clip(hi - np.maximum(lo, b), 0.0, None) / safe)
    return below, 1.0 - below - above, above


def quintile_cells(values: np.ndarray) -> np.ndarray:
    rank = np.empty(values.size, dtype=np.int64)
    rank[np.argsort(values, kind="stable")] = np.arange(values.size)
    return (rank * 5) // max(values.size, 1)


def answers(dist, table: pd.DataFrame, bounds, quantile_fn) -> dict[str, np.ndarray]:
    """What ``dist`` says about each row of ``table``, as served (clipped to ``bounds``): the PIT
    range, the served mu, 100 quantiles, the interval at 0.9 and the risk at each threshold."""
    mu, sigma = table["mu"].to_numpy(dtype=float), table["sigma"].to_numpy(dtype=float)
    lp = table["lp"].astype(str).to_numpy(dtype=object)
    lo, hi = pit_range(dist, table, bounds)
    low, high = dist.interval(mu, sigma, GAMMA, lp)
    out = {
        "pit_lo": lo,
        "pit_hi": hi,
        "center": np.clip(np.asarray(dist.center(mu, sigma, lp), dtype=float), *bounds),
        "quantiles": np.clip(quantile_fn((np.arange(N_QUANTILES) + 0.5) / N_QUANTILES), *bounds),
        "width": np.clip(high, *bounds) - np.clip(low, *bounds),
    }
    for chi in THRESHOLDS:
        out[f"risk@{chi:g}"] = np.asarray(dist.risk(mu, sigma, chi, lp), dtype=float)
    return out


def measure(ans: dict[str, np.ndarray], table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per LP (and the mean over LPs) the numbers of the module docstring from :func:`answers`."""
    lo, hi = ans["pit_lo"], ans["pit_hi"]
    human = table["human"].to_numpy(dtype=float)
    lp = table["lp"].astype(str).to_numpy()
    probs = (np.arange(N_QUANTILES) + 0.5) / N_QUANTILES
    u = human[:, None] - ans["quantiles"]
    crps = 2.0 * (u * (probs[None, :] - (u < 0))).mean(axis=1)
    sd = ans["quantiles"].std(axis=1)
    below, inside, above = band_shares(lo, hi, GAMMA)
    levels = np.linspace(0.01, 0.99, 99)
    out: dict[str, dict[str, float]] = {}
    for name in sorted(set(lp.tolist())):
        rows = lp == name
        row = {
            "n": int(rows.sum()),
            "coverage": float(inside[rows].mean()),
            "miss_below": float(below[rows].mean()),
            "miss_above": float(above[rows].mean()),
            "width": float(ans["width"][rows].mean()),
            "crps": float(crps[rows].mean()),
            "ece": float(np.mean([abs(band_shares(lo[rows], hi[rows], g)[1].mean() - g) for g in levels])),
        }
        bad = rows & (human <= LOW_SCORE)
        row["low_score_coverage"] = float(inside[bad].mean()) if bad.any() else float("nan")
        for kind, values in (("mu", ans["center"]), ("sd", sd)):
            cells = quintile_cells(values[rows])
            cover = [float(inside[rows][cells == c].mean()) for c in range(5) if np.any(cells == c)]
            row[f"worst_{kind}_cell_gap"] = max(cover, key=lambda c: abs(c - GAMMA)) - GAMMA
        for chi in THRESHOLDS:
            r = ans[f"risk@{chi:g}"][rows]
            observed = (human[rows] <= chi).astype(float)
            gaps, beyond = [], 0
            for decile in np.array_split(np.argsort(r, kind="stable"), 10):
                p, o = float(r[decile].mean()), float(observed[decile].mean())
                se = np.sqrt(max(o * (1 - o), 1e-12) / decile.size)
                gaps.append(abs(o - p))
                beyond += int(abs(o - p) > 0.05 + 1.96 * se)
            row[f"brier@{chi:g}"] = float(np.mean((r - observed) ** 2))
            row[f"risk_gap@{chi:g}"] = max(gaps)
            row[f"risk_beyond@{chi:g}"] = beyond
        out[name] = row
    out["avg"] = {k: float(np.nanmean([m[k] for m in out.values()])) for k in next(iter(out.values()))}
    return out


def served_quantiles(calibration, table, settings, bounds):
    from uamt.model_evaluation import ask

    rows = ask(calibration, table, settings, bounds)
    return lambda probs: rows.quantiles


def idr_quantiles(dist, table):
    center = dist.center(table["mu"].to_numpy(dtype=float), table["sigma"].to_numpy(dtype=float), table["lp"].astype(str).to_numpy(dtype=object))
    lp = table["lp"].astype(str).to_numpy(dtype=object)
    return lambda probs: np.column_stack([dist.distribution.quantile(center, lp, float(p)) for p in probs])


def fit_idr(calibration, table, settings):
    from uamt.uncertainty.isotonic import IsotonicDistribution, ServedIsotonic

    mu, sigma = table["mu"].to_numpy(dtype=float), table["sigma"].to_numpy(dtype=float)
    lp = table["lp"].astype(str).to_numpy(dtype=object)
    idr = IsotonicDistribution.fit(
        table["human"].to_numpy(dtype=float), calibration.center(mu, sigma, lp), lp,
        keep_thresholds=THRESHOLDS, min_lp_rows=settings.min_lp_rows,
    )
    return ServedIsotonic(calibration, idr)


def cross_fitted_idr(calibration, table, settings, bounds, n_folds: int = 5) -> tuple[dict[str, np.ndarray], pd.DataFrame]:
    """IDR's answers for each document fold from a fit on the other folds, stacked, with the rows
    in the same (fold) order."""
    from uamt.model_evaluation import row_documents
    from uamt.uncertainty.candidates import document_folds

    folds = document_folds(row_documents(table), n_folds)
    parts, tables = [], []
    for k in range(n_folds):
        fit = fit_idr(calibration, table[folds != k], settings)
        part = table[folds == k]
        parts.append(answers(fit, part, bounds, idr_quantiles(fit, part)))
        tables.append(part)
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}, pd.concat(tables)


COLUMNS = (
    ("coverage", "cov@.9", "{:.3f}"), ("miss_below", "below", "{:.3f}"), ("miss_above", "above", "{:.3f}"),
    ("width", "width", "{:.2f}"), ("crps", "CRPS", "{:.3f}"), ("ece", "ECE", "{:.3f}"),
    ("low_score_coverage", "cov ≤−5", "{:.3f}"), ("worst_mu_cell_gap", "μ cell", "{:+.3f}"),
    ("worst_sd_cell_gap", "sd cell", "{:+.3f}"),
) + tuple(
    (f"risk_gap@{chi:g}", f"gap χ={chi:g}", "{:.3f}") for chi in THRESHOLDS
) + tuple((f"risk_beyond@{chi:g}", f"out χ={chi:g}", "{:.0f}") for chi in THRESHOLDS) + (("brier@-5", "Brier −5", "{:.4f}"),)


def print_table(title: str, results: dict[str, dict[str, dict[str, float]]]) -> None:
    print(f"\n{title}")
    print("| LP | distribution | " + " | ".join(label for _, label, _ in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    lps = [k for k in next(iter(results.values())) if k != "avg"] + ["avg"]
    for lp in lps:
        for name, full in results.items():
            m = full[lp]
            print(f"| {lp} | {name} | " + " | ".join(fmt.format(m[key]) for key, _, fmt in COLUMNS) + " |")


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import DEFAULT_PARAMS, load_section
    from uamt.data.datasets import scale_bounds
    from uamt.model_evaluation import calibration_rows
    from uamt.pipeline_config import CALIBRATION_DIR, load_pipeline
    from uamt.serving.model_calibration import Calibration, with_model_sigma
    from uamt.uncertainty import EvaluationSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "point"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    pipe = load_pipeline(args.params)
    settings = load_section(EvaluationSettings, "evaluate", args.params)
    bounds = scale_bounds(pipe.datasets)
    report = {}
    for model in args.models:
        served = Calibration.load(Path(args.calibration_dir) / f"{model}.json")
        calib = with_model_sigma(calibration_rows(pipe, model, served.calibrated_on), model).reset_index(drop=True)
        test = with_model_sigma(pd.read_parquet(Path(pipe.predictions_dir) / "test" / f"{model}.parquet"), model).reset_index(drop=True)
        idr = fit_idr(served, calib, settings)
        splits = "+".join(served.calibrated_on)
        results = {
            f"calibration rows ({splits}), in sample": {
                "served": measure(answers(served, calib, bounds, served_quantiles(served, calib, settings, bounds)), calib),
                "IDR": measure(answers(idr, calib, bounds, idr_quantiles(idr, calib)), calib),
            },
            f"calibration rows ({splits}), IDR cross-fitted over 5 document folds": {
                "IDR": measure(*cross_fitted_idr(served, calib, settings, bounds)),
            },
            "test": {
                "served": measure(answers(served, test, bounds, served_quantiles(served, test, settings, bounds)), test),
                "IDR": measure(answers(idr, test, bounds, idr_quantiles(idr, test)), test),
            },
        }
        for title, block in results.items():
            print_table(f"{model}: {title}", block)
        report[model] = results
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
