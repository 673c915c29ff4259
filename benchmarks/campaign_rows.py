"""How many judgements does a campaign need before its own calibration beats the LP's?

A user who ingests their raters' judgements with a ``campaign`` name gets a calibration fitted on the
share of them held out of training (``prepare.pool_calibration_share``).  This benchmark plays that
user with a published campaign whose raters differ from the rest of their LP (default: WMT21 zh-en,
harsher than WMT23 zh-en at the same predicted quality): it keeps only ``n`` of the campaign's
calibration rows (whole documents, seeded), fits the served model's calibration keyed by
``lp|campaign`` (:func:`uamt.campaigns.fit_campaign_calibration`, every other campaign's rows as
they are) and measures it on the campaign's **test** rows beside the served per-LP calibration:
coverage of the 90 % interval, lower / upper misses, ECE, CRPS and width.

    python benchmarks/campaign_rows.py [--model hts] [--lp zh-en] [--campaign wmt21_mqm] \
        [--sizes 50 100 200 400 800 0] [--seeds 3] [--min-rows 50] [--json out.json]

``0`` in ``--sizes`` is every calibration row of the campaign.  A campaign is served from
``calibrate_campaigns.min_rows`` rows (300); ``--min-rows 50`` shows what smaller ones would get.  Reads the pipeline's outputs
(``calibration/<model>.json``, ``predictions/{dev,d_e,test}/<model>.parquet``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd


def subsample_documents(rows: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """About ``n`` rows of ``rows``: whole documents in a seeded order until ``n`` is reached."""
    from uamt.model_evaluation import row_documents

    docs = row_documents(rows)
    order = np.random.default_rng(seed).permutation(np.unique(docs))
    sizes = pd.Series(docs).value_counts()
    taken, total = [], 0
    for doc in order:
        if total >= n:
            break
        taken.append(doc)
        total += int(sizes[doc])
    return rows[np.isin(docs, taken)]


def measure(calibration, test: pd.DataFrame, keys: pd.Series, settings, bounds) -> dict[str, float]:
    """The served metrics of ``calibration`` asked with ``keys`` on ``test`` (one group)."""
    from uamt.model_evaluation import ask, row_documents, served_settings
    from uamt.uncertainty.served import served_metrics

    answers = ask(calibration, test.assign(lp=keys), settings, bounds)
    m = served_metrics(
        answers, test["human"].to_numpy(float), np.full(len(test), "campaign"),
        docs=row_documents(test), settings=served_settings(settings),
    )["campaign"]  # fmt: skip
    tag = f"{settings.coverage_gamma:g}"
    return {
        "coverage": m[f"coverage@{tag}"], "miss_below": m[f"miss_below@{tag}"], "miss_above": m[f"miss_above@{tag}"],
        "ece": m["ece"], "crps": m["crps"], "width": m[f"width@{tag}"],
    }  # fmt: skip


#: How the campaign-keyed calibration is fitted (``--fit``).
FITS = ("campaign", "lp-shape", "lp-slope", "refit")


def fit_keyed(fit: str, rows: pd.DataFrame, model: str, settings, bounds, min_rows: int, served):
    """The campaign-keyed calibration of ``rows`` fitted the ``fit`` way (:data:`FITS`)."""
    from uamt.campaigns import LPAnchor, fit_campaign_calibration, fit_keys
    from uamt.model_evaluation import pinned
    from uamt.serving.model_calibration import refit_served

    if fit == "campaign":  # as the stage: the served candidate and its σ weight
        weight = None if served.sigma_tempering is None else served.sigma_tempering.weight
        return fit_campaign_calibration(rows, model, pinned(settings, served.selected), bounds, min_rows, sigma_weight=weight)
    anchor = None if fit == "refit" else LPAnchor(served, shape=fit == "lp-shape")
    keys = fit_keys(rows, max(int(min_rows), int(settings.min_lp_rows)))
    return refit_served(rows.assign(lp=keys), model, served, settings, anchor=anchor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--model", default="hts")
    parser.add_argument("--lp", default="zh-en")
    parser.add_argument("--campaign", default="wmt21_mqm")
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 400, 800, 0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--min-rows", type=int, default=None,
                        help="fewest rows a campaign is served with (default: calibrate_campaigns.min_rows; 50 shows what smaller campaigns would get)")
    parser.add_argument("--fit", choices=sorted(FITS), default="campaign",
                        help="campaign: the stage's fit (uamt.campaigns.fit_campaign_calibration); refit: the served "
                        "candidate refitted per key (refit_served); lp-slope: the same, each campaign on its LP's mu slope; "
                        "lp-shape: its LP's distribution at its own level and scale (uamt.campaigns.LPAnchor)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from uamt.campaigns import campaign_key, campaign_keys
    from uamt.core.config import load_section
    from uamt.data.datasets import scale_bounds
    from uamt.model_evaluation import calibration_rows
    from uamt.pipeline_config import CALIBRATION_DIR, load_pipeline
    from uamt.serving.model_calibration import Calibration, with_model_sigma
    from uamt.stages.calibrate_campaigns import load_config
    from uamt.uncertainty import EvaluationSettings

    min_rows = load_config(args.params).campaigns.min_rows if args.min_rows is None else args.min_rows
    pipe = load_pipeline(args.params)
    settings = load_section(EvaluationSettings, "evaluate", args.params)
    bounds = scale_bounds(pipe.datasets)
    served = Calibration.load(Path(CALIBRATION_DIR) / f"{args.model}.json")
    rows = with_model_sigma(calibration_rows(pipe, args.model, served.calibrated_on), args.model)
    test = with_model_sigma(pd.read_parquet(Path(pipe.predictions_dir) / "test" / f"{args.model}.parquet"), args.model)
    key = campaign_key(args.lp, args.campaign)
    mine = campaign_keys(rows) == key
    test = test[(campaign_keys(test) == key).to_numpy()].reset_index(drop=True)
    if not mine.any() or test.empty:
        raise SystemExit(f"{key}: no calibration rows ({int(mine.sum())}) or no test rows ({len(test)})")

    per_lp = measure(served, test, test["lp"], settings, bounds)
    print(f"{args.model}, {key}, fit {args.fit}: {int(mine.sum())} calibration rows, {len(test)} test rows (the per-LP calibration: "
          f"coverage {per_lp['coverage']:.3f}, ECE {per_lp['ece']:.3f}, CRPS {per_lp['crps']:.3f}, width {per_lp['width']:.2f})")
    print("| rows | seeds | coverage | miss below / above | ECE | CRPS | width | fit s |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| per-LP | – | {per_lp['coverage']:.3f} | {per_lp['miss_below']:.3f} / {per_lp['miss_above']:.3f} | "
          f"{per_lp['ece']:.3f} | {per_lp['crps']:.3f} | {per_lp['width']:.2f} | – |")
    results = {"fit": args.fit, "min_rows": min_rows, "key": key, "calibration_rows": int(mine.sum()), "test_rows": len(test), "per_lp": per_lp, "by_size": []}
    for size in args.sizes:
        runs = []
        for seed in range(args.seeds if size else 1):
            kept = subsample_documents(rows[mine], size, seed) if size else rows[mine]
            subset = pd.concat([rows[~mine], kept], ignore_index=True)
            started = time.perf_counter()
            keyed = fit_keyed(args.fit, subset, args.model, settings, bounds, min_rows, served)
            seconds = time.perf_counter() - started
            if key not in keyed.known_lps:  # fewer rows than min_rows: not served
                runs.append({"rows": len(kept), "served": False})
                continue
            runs.append({"rows": len(kept), "served": True, "fit_s": seconds,
                         **measure(keyed, test, campaign_keys(test), settings, bounds)})  # fmt: skip
        done = [r for r in runs if r["served"]]
        mean = {k: float(np.mean([r[k] for r in done])) for k in ("rows", "coverage", "miss_below", "miss_above", "ece", "crps", "width", "fit_s")} if done else {}
        spread = float(np.ptp([r["coverage"] for r in done])) if len(done) > 1 else 0.0
        results["by_size"].append({"size": size, "runs": runs, "mean": mean})
        if not done:
            print(f"| {size} | {len(runs)} | not served (under {min_rows} rows) | | | | | |")
            continue
        print(f"| {mean['rows']:.0f}{'' if size else ' (all)'} | {len(done)} | {mean['coverage']:.3f} (±{spread / 2:.3f}) | "
              f"{mean['miss_below']:.3f} / {mean['miss_above']:.3f} | {mean['ece']:.3f} | {mean['crps']:.3f} | "
              f"{mean['width']:.2f} | {mean['fit_s']:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
