"""How much do more calibration rows buy?  The served calibration fitted on each set of splits, measured on test.

From the pipeline's predictions (``predictions/<split>/<model>.parquet``: dev, ``d_e`` and test, as the
calibrate and evaluate stages wrote them), this fits each model's calibration exactly as the calibrate
stage does (:func:`uamt.serving.model_calibration.fit_calibration` with params.yaml's ``evaluate:``
section; the rule picks the candidate) once per ``--splits`` set, answers the test rows with it as
served (clipped to the scale) and prints the served-distribution goals of
:mod:`uamt.uncertainty.goals` side by side, with the candidate picked, the mean 90 % width and the
pooled coverage.  A set that includes a split the model was trained on is skipped (DUP and ``d_e``).
The reference factors and the unseen-LP widening are left out (neither moves a test row of a seen LP).

    python benchmarks/calibration_splits.py [--models hts point] [--splits dev dev+d_e]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import DEFAULT_PARAMS, load_section
    from uamt.data.datasets import scale_bounds
    from uamt.model_evaluation import (
        ask,
        calibration_rows,
        dev_effective_sizes,
        measure,
        served_settings,
        training_splits,
    )
    from uamt.pipeline_config import load_pipeline
    from uamt.serving.model_calibration import fit_calibration, with_model_sigma
    from uamt.uncertainty import EvaluationSettings
    from uamt.uncertainty.goals import goal_rows, served_summary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--models", nargs="+", default=["hts", "point"])
    parser.add_argument("--splits", nargs="+", default=["dev", "dev+d_e"], help="sets of splits joined by +")
    args = parser.parse_args(argv)
    pipe = load_pipeline(args.params)
    settings = load_section(EvaluationSettings, "evaluate", args.params)
    bounds = scale_bounds(pipe.datasets)
    for model in args.models:
        test = with_model_sigma(pd.read_parquet(Path(pipe.predictions_dir) / "test" / f"{model}.parquet"), model)
        trained = training_splits(pipe.model_dir(model))
        columns: dict[str, dict] = {}
        for spec in args.splits:
            splits = tuple(spec.split("+"))
            if set(splits) & trained:
                print(f"{model}: {spec} skipped (trained on {sorted(set(splits) & trained)})")
                continue
            rows = calibration_rows(pipe, model, splits)
            started = time.perf_counter()
            calibration, _ = fit_calibration(rows, model, settings=settings, source=f"{spec}/{model}")
            seconds = time.perf_counter() - started
            n_eff = dev_effective_sizes(calibration, with_model_sigma(rows, model), settings, bounds)
            full = measure(calibration, ask(calibration, test, settings, bounds), test, settings, dev_n_eff=n_eff)
            summary = served_summary(
                full, None, served="fixed_variance" if calibration.fixed else calibration.selected,
                rule=settings.calibration_rule, known_lps=calibration.known_lps, settings=served_settings(settings),
            )
            columns[spec] = {
                "rows": len(rows), "seconds": seconds, "served": summary["served"], "width": summary["width"],
                "coverage": summary["coverage"], "goals": {r["key"]: r for r in goal_rows(summary)},
            }
        if not columns:
            continue
        specs = list(columns)
        print(f"\n{model} (test, {len(test):,} rows)")
        print("| | " + " | ".join(specs) + " |")
        print("|---|" + "---|" * len(specs))
        for label, get in (
            ("calibration rows", lambda c: f"{c['rows']:,}"),
            ("fit (s)", lambda c: f"{c['seconds']:.0f}"),
            ("served", lambda c: c["served"]),
            ("coverage@0.9", lambda c: f"{c['coverage']:.3f}"),
            ("mean width@0.9", lambda c: f"{c['width']:.2f}"),
        ):
            print(f"| {label} | " + " | ".join(get(columns[s]) for s in specs) + " |")
        for key in columns[specs[0]]["goals"]:
            cells = []
            for s in specs:
                row = columns[s]["goals"][key]
                value = "–" if row["value"] is None else f"{row['value']:.3f}"
                cells.append(value + (" ✓" if row["met"] else ""))
            print(f"| {key} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
