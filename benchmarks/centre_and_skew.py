"""Centre, skew and conditional coverage of the *served* calibration, per language pair, on test.

For each model, the calibration is fitted on its dev predictions exactly as the calibrate stage does
(:func:`uamt.serving.model_calibration.fit_calibration` with the ``evaluate:`` section of ``--params``) and applied
to its test predictions through what serving calls (:meth:`Calibration.interval`,
:meth:`Calibration.risk`, :meth:`Calibration.apply`), with mu and the interval clipped to the MQM
scale [-25, 0] as :func:`uamt.serving.calibrated_predictor.clip_to_scale` does.  Per LP and pooled it prints:

* ``cov`` coverage of the 90 % interval, ``lo``/``hi`` the shares of human scores below / above it
  (goal: 0.05 each), ``width`` the mean served (clipped) width in MQM points and ``raw w`` unclipped;
* ``mu@0`` the share of rows whose served mu is exactly the scale's top (0 = "no error"), ``r``
  the Pearson correlation of the served (clipped) mu with the human scores (``r raw``: of the model's
  own mu, which an affine map per LP leaves as it is: only the clipping moves ``r``), ``mse`` of the
  served mu (MQM^2); the share at 0 and ``r`` by dataset x LP too;
* ``worst mu-cell`` / ``worst s-cell``: the LP x quintile cell (quintiles of the model's mu / of the
  served interval's width, within the LP) farthest from 0.9, with its n and binomial standard error
  sqrt(0.9*0.1/n);
* risk at chi = -5: ``brier`` and, in the decile of lowest predicted risk, predicted vs observed
  P(MQM <= -5); ``max dec`` the largest |observed - predicted| over the 10 deciles.

Then the dev rule's choice and its cross-fitted dev numbers (``evaluate_predictions``' selection).

    PYTHONPATH=src python benchmarks/centre_and_skew.py --root /work/main [--params params.yaml]
        [--methods hts dup point] [--mu-scaling spread|regression] [--json out.json]

The point model is fitted twice: as the pipeline serves it (``point``: fixed-variance Gaussian) and
with the served candidate on a constant sigma (``point+served``, method None and sigma 1), the
baseline an uncertainty method has to beat.  To measure the code before a change, run the script
with ``PYTHONPATH`` pointing at the old tree's ``src`` and its params (options the old code lacks
must be left out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

GAMMA = 0.9
MQM_BOUNDS = (-25.0, 0.0)
RISK_THRESHOLD = -5.0


def _quintiles(values: np.ndarray) -> np.ndarray:
    rank = np.empty(values.size, dtype=np.int64)
    rank[np.argsort(values, kind="stable")] = np.arange(values.size)
    return (rank * 5) // values.size


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def served_numbers(calibration, test: pd.DataFrame, sigma: np.ndarray) -> dict:
    """Every number of the module docstring, per LP and ``all``, for one fitted calibration."""
    lp = test["lp"].astype(str).to_numpy(dtype=object)
    human = test["human"].to_numpy(dtype=float)
    raw_mu = test["mu"].to_numpy(dtype=float)
    low, high = calibration.interval(raw_mu, sigma, GAMMA, lp)
    served_mu, _ = calibration.apply(raw_mu, sigma, lp)
    risk = calibration.risk(raw_mu, sigma, RISK_THRESHOLD, lp)
    clipped_mu = np.clip(served_mu, *MQM_BOUNDS)
    clipped_low, clipped_high = np.clip(low, *MQM_BOUNDS), np.clip(high, *MQM_BOUNDS)
    inside = (low <= human) & (human <= high)
    bad = human <= RISK_THRESHOLD
    mu_q = np.zeros(lp.size, dtype=np.int64)
    width_q = np.zeros(lp.size, dtype=np.int64)
    for name in set(lp.tolist()):
        rows = lp == name
        mu_q[rows] = _quintiles(raw_mu[rows])
        width_q[rows] = _quintiles((high - low)[rows])

    def block(rows: np.ndarray) -> dict:
        out = {
            "n": int(rows.sum()),
            "cov": float(inside[rows].mean()),
            "lo": float((human[rows] < low[rows]).mean()),
            "hi": float((human[rows] > high[rows]).mean()),
            "width": float((clipped_high - clipped_low)[rows].mean()),
            "raw_width": float((high - low)[rows].mean()),
            "mu_at_top": float((clipped_mu[rows] == MQM_BOUNDS[1]).mean()),
            "r": _pearson(clipped_mu[rows], human[rows]),
            "r_raw": _pearson(raw_mu[rows], human[rows]),
            "mse": float(((clipped_mu - human)[rows] ** 2).mean()),
            "brier": float(((risk - bad)[rows] ** 2).mean()),
            "bad_cov": float(inside[rows & bad].mean()) if (rows & bad).any() else float("nan"),
        }
        order = np.argsort(risk[rows], kind="stable")
        deciles = np.array_split(order, 10)
        gaps = [abs(float(bad[rows][d].mean() - risk[rows][d].mean())) for d in deciles if d.size]
        out["risk_low_decile"] = (float(risk[rows][deciles[0]].mean()), float(bad[rows][deciles[0]].mean()))
        out["risk_max_decile_gap"] = max(gaps)
        for key, groups in (("mu_cell", mu_q), ("s_cell", width_q)):
            worst = None
            for name in sorted(set(lp[rows].tolist())):
                for k in range(5):
                    cell = rows & (lp == name) & (groups == k)
                    if not cell.any():
                        continue
                    cov, n = float(inside[cell].mean()), int(cell.sum())
                    if worst is None or abs(cov - GAMMA) > abs(worst[1] - GAMMA):
                        worst = (f"{name}/{k}", cov, n, math.sqrt(GAMMA * (1 - GAMMA) / n))
            out[key] = worst
        return out

    result = {"all": block(np.ones(lp.size, dtype=bool))}
    for name in sorted(set(lp.tolist())):
        result[name] = block(lp == name)
    if "dataset" in test:  # the clipping ties by dataset x LP (datasets differ in their share of MQM 0)
        dataset = test["dataset"].astype(str).to_numpy(dtype=object)
        result["by_dataset"] = {
            f"{d}/{name}": {
                "n": int(rows.sum()),
                "mu_at_top": float((clipped_mu[rows] == MQM_BOUNDS[1]).mean()),
                "r": _pearson(clipped_mu[rows], human[rows]),
                "r_raw": _pearson(raw_mu[rows], human[rows]),
            }
            for d, name in sorted(set(zip(dataset.tolist(), lp.tolist(), strict=True)))
            for rows in [(dataset == d) & (lp == name)]
        }
    return result


def print_block(label: str, numbers: dict) -> None:
    print(
        f"{label:14} {'lp':7} {'n':>5} {'cov':>5} {'lo':>5} {'hi':>5} {'width':>6} {'raw w':>6} {'mu@0':>5} "
        f"{'r':>5} {'r raw':>5} {'mse':>6} {'badcov':>6} {'brier':>6} {'lowdec p/o':>11} {'maxdec':>6} "
        f"{'worst mu-cell':>24} {'worst s-cell':>24}"
    )
    by_dataset = numbers.get("by_dataset", {})
    for name, b in numbers.items():
        if name == "by_dataset":
            continue
        cells = [f"{c[0]:>10} {c[1]:.3f} n{c[2]:<4d}±{c[3]:.3f}" for c in (b["mu_cell"], b["s_cell"])]
        print(
            f"{label:14} {name:7} {b['n']:5d} {b['cov']:5.3f} {b['lo']:5.3f} {b['hi']:5.3f} {b['width']:6.2f} "
            f"{b['raw_width']:6.2f} {b['mu_at_top']:5.3f} {b['r']:5.3f} {b['r_raw']:5.3f} {b['mse']:6.2f} "
            f"{b['bad_cov']:6.3f} {b['brier']:6.4f} {b['risk_low_decile'][0]:5.3f}/{b['risk_low_decile'][1]:5.3f} "
            f"{b['risk_max_decile_gap']:6.3f} {cells[0]:>24} {cells[1]:>24}"
        )
    for name, b in by_dataset.items():
        print(f"{label:14} {name:24} n {b['n']:5d} mu@0 {b['mu_at_top']:5.3f} r {b['r']:5.3f} r raw {b['r_raw']:5.3f}")


def print_selection(label: str, selection: dict) -> None:
    print(f"{label:14} dev rule {selection['rule']} picks {selection['rule_choice']} ({selection['on']})")
    for name, s in selection["summaries"].items():
        if s is None:
            continue
        extra = ""
        if "miss_balance_error" in s:
            extra = (
                f" miss lo/hi {s['lower_miss']:.3f}/{s['upper_miss']:.3f} (err {s['miss_balance_error']:.3f})"
                f" width_z {s['mean_width']:.3f} mse_z {s['mu_mse']:.3f}"
            )
        print(
            f"{label:14}   {name:26} lp err {s['lp_coverage_error']:.3f} sq err {s['sigma_quintile_error']:.3f} "
            f"mq err {s['mu_quintile_error']:.3f} ence {s['ence']:.3f}{extra}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="pipeline workspace with predictions/")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params.yaml with evaluate:")
    parser.add_argument("--methods", nargs="+", default=["hts", "dup", "point"])
    parser.add_argument("--mu-scaling", help="override evaluate.mu_scaling (code with the option only)")
    parser.add_argument("--candidates", nargs="+", help="override evaluate.calibration_candidates")
    parser.add_argument("--json", type=Path, help="also write every number as JSON here")
    args = parser.parse_args(argv)

    from uamt.core.config import load_section
    from uamt.serving.model_calibration import fit_calibration, is_fixed_variance
    from uamt.uncertainty import EvaluationSettings

    settings = load_section(EvaluationSettings, "evaluate", args.params)
    if args.mu_scaling:
        settings = dataclasses.replace(settings, mu_scaling=args.mu_scaling)
    if args.candidates:
        settings = dataclasses.replace(settings, calibration_candidates=tuple(args.candidates))
    print(f"settings: {settings}")
    out = {}
    for method in args.methods:
        tables = {s: pd.read_parquet(args.root / "predictions" / s / f"{method}.parquet") for s in ("dev", "test")}
        variants = [(method, method)]
        if is_fixed_variance(method):  # the baseline: the served candidate on a constant sigma
            variants.append(("point+served", None))
            tables = {s: t.assign(sigma=1.0) for s, t in tables.items()}
        for label, as_method in variants:
            start = time.perf_counter()
            calibration, in_sample = fit_calibration(tables["dev"], as_method, settings=settings, source=f"dev/{method}")
            test = tables["test"]
            sigma = test["sigma"].to_numpy(dtype=float) if "sigma" in test else np.ones(len(test))
            numbers = served_numbers(calibration, test, np.nan_to_num(sigma, nan=1.0))
            selection = in_sample["calibration"]["selection"]
            served = "fixed-variance Gaussian" if calibration.fixed else calibration.selected
            print(f"\n== {label}: serves {served} (fit {time.perf_counter() - start:.0f} s)")
            print_block(label, numbers)
            print_selection(label, selection)
            out[label] = {"served": served, "numbers": numbers, "selection": selection}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
