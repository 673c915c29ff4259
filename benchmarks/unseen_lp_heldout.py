"""How wide must an unseen language pair's interval be when the *model* has not seen it either?

A user's unseen pair is unseen by the model and by its calibration.  The pipeline fits the served
models' unseen-LP widening that way (the ``train_lolo`` stage; ``evaluate`` measures those models on
their held-out LPs' test rows: ``metrics/conditional.json``, ``<model>.unseen_lp_held_out_models``);
for any other method the calibrate stage leaves each LP out of the *calibration* only.  This
retrains any ``--method`` without each LP (leave-one-LP-out models) in a temporary folder, so the
held-out LP is new to the model and to the calibration, and measures on that LP's **test** rows:

* coverage@0.9 of the served distribution refitted on the other LPs' dev rows (the global fallback
  an unseen LP gets; its point masses and all), without widening and with the artifact's factor
  (``calibration/<method>.json``: ``unseen_lp_sigma_factor``), counted as the metrics count it
  (randomised at the point masses, :func:`uamt.serving.model_calibration.served_lp_coverage`);
* the widening the LP alone needed (model held out) next to the one the calibration-only fit gives
  (``metrics/dev.json``: ``<method>.unseen_lp.held_out``);
* the factor the held-out models give when fitted as the calibrate stage does (equal-weight
  coverage of ``level`` over the held-out LPs, :func:`uamt.serving.model_calibration.fit_unseen_lp_sigma_factor`).

    python benchmarks/unseen_lp_heldout.py [--method hts] [--params params.yaml] [--json out.json]

Needs a finished ``dvc repro`` (prepared splits, the embedding cache, ``calibration/``); trains one
model per dev LP into a temporary folder (about a minute each on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import load_section
    from uamt.data.datasets import scale_bounds
    from uamt.encoders import EncodeConfig
    from uamt.models.config import load_train_config
    from uamt.models.shared_training import train_methods
    from uamt.pipeline_config import load_pipeline, open_features, predict_split, read_split
    from uamt.serving.model_calibration import (
        Calibration,
        equal_weight_widening,
        refit_served,
        served_lp_coverage,
        smallest_widening,
        with_model_sigma,
        with_unseen_factor,
    )
    from uamt.uncertainty import EvaluationSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="hts")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    pipe = load_pipeline(args.params)
    settings = load_section(EvaluationSettings, "evaluate", args.params)
    encode = load_section(EncodeConfig, "encode", args.params)
    cfg = load_train_config(args.method, args.params)
    level = settings.coverage_gamma
    served = Calibration.load(Path("calibration") / f"{args.method}.json")
    factor = served.unseen_lp_sigma_factor
    dev_metrics = json.loads(Path(pipe.metrics_dir, "dev.json").read_text())
    calibration_only = dev_metrics.get(args.method, {}).get("unseen_lp", {}).get("held_out", {})
    bounds = scale_bounds(pipe.datasets)

    train_df = read_split(pipe.prepared_dir, cfg.train_split, pipe.datasets)
    dev_df = read_split(pipe.prepared_dir, "dev", pipe.datasets)
    test_df = read_split(pipe.prepared_dir, "test", pipe.datasets)
    features = open_features(encode)
    lps = sorted(set(dev_df["lp"]) & set(test_df["lp"]))
    rows, coverage = {}, {}
    with tempfile.TemporaryDirectory(prefix="uamt-lolo-") as tmp:
        for lp in lps:
            folder = Path(tmp) / lp
            train_methods(
                (args.method,), cfg, train_df[train_df["lp"] != lp], dev_df[dev_df["lp"] != lp], features,
                lambda name, folder=folder: folder / name,
            )
            model_dir = folder / args.method
            dev = with_model_sigma(predict_split(model_dir, dev_df, features, folder / "dev.parquet"), args.method)
            test = with_model_sigma(
                predict_split(model_dir, test_df[test_df["lp"] == lp].reset_index(drop=True), features, folder / "test.parquet"),
                args.method,
            )
            calibration = refit_served(dev[dev["lp"] != lp], None, served, settings)

            def cover(w, calibration=calibration, test=test):
                return served_lp_coverage(with_unseen_factor(calibration, w), test, level, bounds)

            coverage[lp] = cover
            rows[lp] = {
                "n_test": int(len(test)),
                "coverage_without_factor": cover(1.0),
                "coverage_with_served_factor": cover(factor),
                "needed_model_held_out": smallest_widening(cover, level),
                "needed_calibration_only": calibration_only.get(lp),
            }
            print(lp, json.dumps(rows[lp]), flush=True)
    result = {
        "method": args.method,
        "level": level,
        "served_factor": factor,
        "factor_model_held_out": equal_weight_widening(coverage, level),
        "by_lp": rows,
        "mean_coverage_with_served_factor": float(np.mean([r["coverage_with_served_factor"] for r in rows.values()])),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "by_lp"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
