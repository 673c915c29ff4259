"""Does σ cost the served risk its ranking?  Each model's σ tempered towards its LP's median,
σ_λ = m_LP^(1−λ) · σ^λ (:class:`uamt.uncertainty.tempering.SigmaTempering`: m_LP the median σ of
the LP's calibration rows; λ = 1 the model's own σ, λ = 0 a constant σ per LP: the point estimate
with the model's μ), and the served calibration refitted end to end on it
(:func:`uamt.serving.model_calibration.refit_served`: the same candidate, its point mass at 0).
Since v10 the calibrate stage chooses λ itself from ``evaluate.sigma_weights`` by the x-fit CRPS
below (:func:`uamt.model_evaluation.choose_sigma_weight`); this prints the finer grid, with the
Brier score, the AUROC and the test and out-of-domain readings the choice does not see.  For each λ, per LP: CRPS, and for P(MQM ≤ χ) the Brier score and the AUROC
of the risk, pooled over the LP's datasets;

* **x-fit**: each of the calibration rows' document folds answered by the calibration refitted on
  the others (:func:`uamt.model_evaluation.cross_fitted_rows`, what the gate reads; λ = 1
  reproduces ``metrics/dev.json`` of a model served at λ = 1) -- what the choice of λ reads;
* **test**: the calibration refitted on every calibration row, test answered;
* **ood**: the same calibration on the out-of-domain sets, per dataset (TED: the news LPs; the
  biomedical set: 15 LPs, most unseen, served by the global fallback), averaged over their LPs.
  The refit has no unseen-LP widening (:func:`refit_served` does not refit it), at every λ alike.

The ranking cost is named in docs/quality.md ("the risk held monotone in μ"): ranked by the served
risk, bad translations are found less well than by −μ, cross-fitted too, and at one σ per LP the
served risk is a decreasing function of μ.  This measures whether a σ slope below the one the
whole-distribution fit chose pays for the risk, and what it costs the CRPS.

    python benchmarks/sigma_tempering.py [--models hts hts_qe] [--lambdas 0 0.5 1] [--chi -5]

Reads what the pipeline wrote; changes nothing.
"""

from __future__ import annotations

import argparse

import numpy as np


def scores(calibration, rows, table, settings, chi: float) -> dict[str, dict[str, float]]:
    """Per LP (and ``avg``): CRPS, Brier and AUROC of P(Q <= chi) of the served ``rows``."""
    from uamt.model_evaluation import measure
    from uamt.quality import auroc_score

    full = measure(calibration, rows, table, settings)
    human = table["human"].to_numpy(dtype=float)
    risk = rows.risk[chi]
    out = {}
    for lp, index in table.groupby("lp").indices.items():
        event = human[index] <= chi
        out[str(lp)] = {
            "crps": full[str(lp)]["crps"],
            "brier": float(np.mean((risk[index] - event) ** 2)),
            "auroc": auroc_score(risk[index], event),
            "auroc_mu": auroc_score(-table["mu"].to_numpy(dtype=float)[index], event),
        }
    out["avg"] = {key: float(np.mean([m[key] for m in out.values()])) for key in ("crps", "brier", "auroc", "auroc_mu")}
    return out


def served_models(argv: list[str] | None, description: str, **defaults):
    """The arguments both σ benchmarks read (``--params``, ``--calibration-dir``, ``--models``,
    ``--chi``, plus ``defaults``' options) and, per model, ``(name, calibration, calibration rows,
    test, ood)`` as the pipeline wrote them: ``(args, settings, bounds, models)``."""
    import pandas as pd

    from uamt.core.config import DEFAULT_PARAMS
    from uamt.model_evaluation import calibration_rows
    from uamt.pipeline_config import CALIBRATION_DIR
    from uamt.quality import served_setting
    from uamt.serving.model_calibration import Calibration

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "hts_qe"])
    parser.add_argument("--chi", type=float, default=-5.0)
    for option, (kind, default) in defaults.items():
        parser.add_argument(option, nargs="+", type=kind, default=default)
    args = parser.parse_args(argv)
    pipe, settings, bounds = served_setting(args.params)
    if args.chi not in settings.risk_thresholds:
        parser.error(f"--chi {args.chi:g} is not one of params.yaml:evaluate.risk_thresholds {list(settings.risk_thresholds)}")

    def models():
        for model in args.models:
            calibration = Calibration.load(f"{args.calibration_dir}/{model}.json")
            yield (
                model,
                calibration,
                calibration_rows(pipe, model, calibration.calibrated_on),
                pd.read_parquet(f"{pipe.predictions_dir}/test/{model}.parquet"),
                pd.read_parquet(f"{pipe.predictions_dir}/ood/{model}.parquet"),
            )

    return args, settings, bounds, models()


def main(argv: list[str] | None = None) -> int:
    from uamt.model_evaluation import ask, cross_fitted_rows
    from uamt.serving.model_calibration import refit_served, with_sigma_tempering
    from uamt.uncertainty.tempering import SigmaTempering

    args, settings, bounds, models = served_models(
        argv, __doc__.splitlines()[0], **{"--lambdas": (float, [0.0, 0.25, 0.5, 0.75, 1.0])}
    )
    for model, calibration, fitted_on, test, ood in models:
        lps = sorted(fitted_on["lp"].astype(str).unique())
        lines = []
        print(f"\n## {model}: σ_λ = m_LP^(1−λ)·σ^λ, calibration refitted; CRPS / Brier / AUROC of P(MQM ≤ {args.chi:g})\n")
        print("| λ | split | " + " | ".join(lps) + " | avg |")
        print("|---|---|" + "---|" * (len(lps) + 1))
        for lam in args.lambdas:
            tempering = SigmaTempering.fit(fitted_on["sigma"], fitted_on["lp"].astype(str).to_numpy(dtype=object), lam)
            template = with_sigma_tempering(calibration, tempering)  # replaces the served weight
            xfit, _ = cross_fitted_rows(fitted_on, model, template, settings, bounds)
            refitted = refit_served(fitted_on, model, template, settings)
            for split, rows, table in (("x-fit", xfit, fitted_on), ("test", ask(refitted, test, settings, bounds), test)):
                result = scores(refitted, rows, table, settings, args.chi)
                cells = [f"{m['crps']:.4f} / {m['brier']:.4f} / {m['auroc']:.3f}" for lp, m in sorted(result.items()) if lp != "avg"]
                avg = result["avg"]
                print(f"| {lam:g} | {split} | " + " | ".join(cells) + f" | {avg['crps']:.4f} / {avg['brier']:.4f} / {avg['auroc']:.3f} |")
                if lam == args.lambdas[0]:
                    mu_line = " | ".join(f"{m['auroc_mu']:.3f}" for lp, m in sorted(result.items()) if lp != "avg")
                    lines.append(f"| −μ | {split} | {mu_line} | {result['avg']['auroc_mu']:.3f} |")
            rows = ask(refitted, ood, settings, bounds)
            for dataset, index in ood.groupby("dataset").indices.items():
                avg = scores(refitted, rows.take(index), ood.iloc[index], settings, args.chi)["avg"]
                lines.append(f"| {lam:g} | ood {dataset} | {avg['crps']:.4f} / {avg['brier']:.4f} / {avg['auroc']:.3f} |")
        print("\nAUROC of −μ (what a constant σ per LP approaches), then the out-of-domain sets (LP average):\n")
        print("\n".join(line for line in lines if line.startswith("| −μ")))
        print("\n| λ | split | CRPS / Brier / AUROC |\n|---|---|---|")
        print("\n".join(line for line in lines if not line.startswith("| −μ")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
