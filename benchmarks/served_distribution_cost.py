"""What asking the served distribution costs: a served answer per request, and one measurement.

Loads a calibration file (``calibration/<model>.json``) and that model's predictions
(``predictions/<split>/<model>.parquet``) as the pipeline wrote them, and prints the best of
``--repeats`` wall times of

* what every scored batch asks (``uamt score``, ``uamt predict``, the REST server): the served
  mu and standard deviation (:meth:`Calibration.apply`, whose standard deviation reads 50 central
  intervals), the interval at 0.9 and the served risk at -5, for batches of 1, 32 and 500 rows
  drawn from the table;
* what the calibrate and evaluate stages ask per measurement of one model on the whole table
  (:func:`uamt.model_evaluation.ask`: about 100 interval levels, the quantiles, the risks), which
  the calibrate stage repeats for every candidate, σ weight, lattice offset and cross-fitted fold.

Every level is asked in one call where the distribution takes a level per row, and the
rearrangement in mu asks every LP's grid in one call (``uamt.uncertainty.served.intervals_at``,
``uamt.uncertainty.rearrangement.in_mu_order``).  Run it with ``PYTHONPATH`` pointing at two
checkouts to compare them: their answers are the same, only the time moves.

Usage::

    python benchmarks/served_distribution_cost.py [--root .] [--model hts] [--split dev] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd


def best_seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--model", default="hts")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from uamt.core.config import load_section
    from uamt.data.datasets import scale_bounds
    from uamt.model_evaluation import ask
    from uamt.pipeline_config import load_pipeline
    from uamt.serving.model_calibration import Calibration, with_model_sigma
    from uamt.uncertainty import EvaluationSettings

    params = args.root / "params.yaml"
    pipeline = load_pipeline(params)
    settings = load_section(EvaluationSettings, "evaluate", params)
    calibration = Calibration.load(args.root / "calibration" / f"{args.model}.json")
    table = with_model_sigma(pd.read_parquet(args.root / pipeline.predictions_dir / args.split / f"{args.model}.parquet"), args.model)
    print(f"{args.model}: {len(table)} {args.split} rows, {table['lp'].nunique()} LPs")
    for n in (1, 32, 500):
        rows = table.sample(n=n, replace=n > len(table), random_state=0)
        mu, sigma = rows["mu"].to_numpy(dtype=float), rows["sigma"].to_numpy(dtype=float)
        lp = rows["lp"].astype(str).to_numpy(dtype=object)

        def served(mu=mu, sigma=sigma, lp=lp):
            calibration.apply(mu, sigma, lp)
            calibration.interval(mu, sigma, 0.9, lp, "conformal")
            calibration.served_risk(mu, sigma, -5.0, lp)

        print(f"  a batch of {n:>3} rows (apply + interval + risk): {1000 * best_seconds(served, args.repeats):8.1f} ms")
    bounds = scale_bounds(pipeline.datasets)
    seconds = best_seconds(lambda: ask(calibration, table, settings, bounds), args.repeats)
    print(f"  one measurement of all {len(table)} rows (served_rows): {seconds:8.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
