"""``uamt evaluate-predictions``: uncertainty metrics of a predictions CSV, calibrated on a dev CSV."""

from __future__ import annotations

import argparse


def _gamma(text: str) -> float:
    from uamt.core.errors import DataError
    from uamt.serving.scorer import check_confidence

    try:
        return check_confidence(float(text))
    except (ValueError, DataError) as exc:  # DataError is a ValueError; float() raises one too
        raise argparse.ArgumentTypeError(f"{text!r} is not a confidence level in (0, 1) ({exc})") from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 2")
    return value


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate-predictions",
        help="PPS, UPS, NLL, ECE, sharpness, coverage, CRPS of a predictions CSV (model vs fixed variance)",
        description=(
            "Evaluate uncertainty-aware quality predictions. CSV columns: lp, human, mu, sigma "
            "(sigma a standard deviation) or lp, human, samples ('|'-separated scores, e.g. MC dropout "
            "runs). With --dev, scores are standardised and the variance calibrated on the dev file "
            "(Glushkova et al., 2021) and applied to the predictions file. Writes JSON atomically."
        ),
    )
    parser.add_argument("--predictions", required=True, metavar="P.csv", help="predictions to evaluate")
    parser.add_argument("--dev", metavar="D.csv", help="dev predictions for standardisation and calibration")
    parser.add_argument("--out", required=True, metavar="M.json", help="metrics JSON to write")
    parser.add_argument(
        "--global-calibration",
        action="store_true",
        help="fit one calibration for all language pairs instead of one per LP (global fallback)",
    )
    parser.add_argument(
        "--min-lp-rows", type=_positive_int, default=50, help="fewest dev rows for a per-LP fit (default 50)"
    )
    parser.add_argument(
        "--n-levels", type=_positive_int, default=100, help="confidence levels of the ECE (default 100)"
    )
    parser.add_argument("--coverage-gamma", type=_gamma, default=0.9, help="level of coverage@ (default 0.9)")
    parser.add_argument(
        "--sigma-from",
        choices=("auto", "samples", "model"),
        default="auto",
        help=(
            "where sigma comes from: 'samples' (MC dropout / ensemble spread: it enters the standardiser), "
            "'model' (predicted by HTS/KL/DUP, or a placeholder: mu is standardised by its own spread), "
            "'auto' (samples layout or an 'epistemic' column -> samples, else model; default)"
        ),
    )
    parser.add_argument(
        "--calibration",
        default="auto",
        metavar="NAME",
        help="served calibration: 'auto' (chosen by the rule, cross-fitted over dev documents) or a candidate "
        "(affine_ece, affine_nll, affine_crps, scale_nll, conformal); every candidate is reported",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from uamt.core.errors import UamtError
    from uamt.uncertainty.evaluate import (
        EvaluationSettings,
        candidates_table,
        evaluate_prediction_files,
        metrics_table,
    )

    try:
        settings = EvaluationSettings(
            per_lp=not args.global_calibration,
            min_lp_rows=args.min_lp_rows,
            n_levels=args.n_levels,
            coverage_gamma=args.coverage_gamma,
            calibration=args.calibration,
        )
    except ValueError as exc:
        raise UamtError(f"--calibration: {exc}") from None
    result = evaluate_prediction_files(
        args.predictions, args.out, dev=args.dev, settings=settings, sigma_source=args.sigma_from
    )
    table = metrics_table(result)
    summary = table[table["lp"] == "macro_avg"].drop(columns=["lp"])
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if result.get("candidates"):
        print(candidates_table(result).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        selection = result["calibration"]["selection"]
        print(f"calibration: {result['calibration']['selected']} (rule {selection['rule']}, on {selection['on']})")
    print(f"wrote {args.out}")
    return 0
