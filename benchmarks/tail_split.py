"""What if the 90 % interval spent less of its 10 % below?  Bad-segment coverage vs width, from the served CDF.

Almost every test row that falls below the served interval is a bad segment (MQM <= -5), so the coverage
of bad segments is capped at about 1 - (lower-miss rate) / P(bad): 0.84 at a lower-miss rate of 0.05 and
P(bad) = 0.32 (docs/results.md).  This reads the served calibration of a model
(``calibration/<model>.json``) and, for each share ``a`` of the miss budget put below, the interval
:math:`[F^{-1}(a(1-\\gamma)),\\ F^{-1}(1-(1-a)(1-\\gamma))]` of the same served distribution F (read from its
central intervals: the lower end of level :math:`1-2a(1-\\gamma)`, the upper end of level
:math:`1-2(1-a)(1-\\gamma)`), clipped to the scale as served, and prints per split (the calibration rows,
where the calibration was fitted, and test): the lower / upper miss rates, the worst LP's
:math:`|miss - (1-\\gamma)/2|` (the goal's 0.05 ± 0.015), the coverage of MQM <= -5 (pooled and per LP)
and the mean width pooled over rows.  ``a = 0.5`` is what is served today.

    python benchmarks/tail_split.py [--model hts] [--shares 0.5 0.45 0.4 0.35]
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    import pandas as pd

    from uamt.core.config import DEFAULT_PARAMS, load_section
    from uamt.data.datasets import scale_bounds
    from uamt.model_evaluation import calibration_rows
    from uamt.pipeline_config import CALIBRATION_DIR, load_pipeline
    from uamt.serving.model_calibration import Calibration, with_model_sigma
    from uamt.uncertainty import EvaluationSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--model", default="hts")
    parser.add_argument("--shares", nargs="+", type=float, default=[0.5, 0.45, 0.4, 0.35])
    args = parser.parse_args(argv)
    pipe = load_pipeline(args.params)
    settings = load_section(EvaluationSettings, "evaluate", args.params)
    gamma, chi = settings.coverage_gamma, settings.low_score_threshold
    low, high = scale_bounds(pipe.datasets)
    calibration = Calibration.load(Path(CALIBRATION_DIR) / f"{args.model}.json")
    mode = "gaussian" if calibration.is_gaussian else "conformal"
    splits = {
        "+".join(calibration.calibrated_on): calibration_rows(pipe, args.model, calibration.calibrated_on),
        "test": pd.read_parquet(Path(pipe.predictions_dir) / "test" / f"{args.model}.parquet"),
    }
    half = (1.0 - gamma) / 2.0
    print(f"{args.model}: served {calibration.selected}, gamma {gamma:g}, bad = human <= {chi:g}")
    print("| split | share below | miss below / above | worst LP |miss - 0.05| | bad covered (per LP) | mean width |")
    print("|---|---|---|---|---|---|")
    for name, table in splits.items():
        table = with_model_sigma(table, args.model)
        mu, sigma = table["mu"].to_numpy(float), table["sigma"].to_numpy(float)
        lp = table["lp"].astype(str).to_numpy(dtype=object)
        human = table["human"].to_numpy(float)
        bad = human <= chi
        for share in args.shares:
            lower = calibration.interval(mu, sigma, 1.0 - 2.0 * share * (1.0 - gamma), lp, mode)[0]
            upper = calibration.interval(mu, sigma, 1.0 - 2.0 * (1.0 - share) * (1.0 - gamma), lp, mode)[1]
            lower, upper = np.clip(lower, low, high), np.clip(upper, low, high)
            below, above = human < lower, human > upper
            lps = sorted(set(lp.tolist()))
            worst = max(max(abs(below[lp == n].mean() - half), abs(above[lp == n].mean() - half)) for n in lps)
            per_lp = ", ".join(f"{n} {1 - (below | above)[(lp == n) & bad].mean():.3f}" for n in lps if ((lp == n) & bad).any())
            print(
                f"| {name} | {share:.2f} | {below.mean():.3f} / {above.mean():.3f} | {worst:.3f} | "
                f"{1 - (below | above)[bad].mean():.3f} ({per_lp}) | {np.mean(upper - lower):.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
