"""Would a σ weight of its own pay for the language pairs the calibration never saw?

The calibrate stage picks one σ weight λ per model (:class:`uamt.uncertainty.tempering.SigmaTempering`,
σ_λ = m_LP^(1−λ)·σ^λ) by the CRPS cross-fitted over its calibration rows' documents, every one of
them of a known LP; for the served HTS and QE models it is λ = 0, so no row is served its σ, not even
a row of a pair the model never saw (it gets the global fallback, widened by the unseen-LP factor).
docs/quality.md ("the served σ costs HTS's distribution") found the QE model's and the ensemble's σ
paying on the biomedical pairs only, and left this open: would the λ that the held-out LPs choose
(the train_lolo stage's models, each trained without one LP) transfer to the biomedical pairs?

The calibrate stage now chooses that weight itself (``evaluate.unseen_sigma_margin``,
:func:`uamt.model_evaluation.choose_unseen_sigma_weight`).  This benchmark reads, for each λ, what the
stage weighs and what it cannot read: the served calibration with unseen rows tempered at λ
(:func:`with_unseen_sigma_weight`: the in-domain distribution untouched, the global fallback refitted
on σ tempered as an unseen row's) and its unseen-LP widening fitted as the stage fits it, with the
model held out (:func:`fit_held_out_model_unseen_lp_sigma_factor` on the leave-one-LP-out
predictions).  Then:

* **held out** (what the stage's choice reads): each news LP's calibration rows, predicted by the
  model trained without it and served the global fallback of the calibration refitted on the other
  LPs, widened -- CRPS, coverage at 0.9 and width, mean over the LPs;
* **ood unseen**: the out-of-domain rows (``predictions/ood``) of the pairs the calibration never saw
  (served the global fallback, widened), per dataset, LP average -- what it would give users, a
  check the stage never reads.

    python benchmarks/unseen_sigma_weight.py [--models hts_qe hts] [--lambdas 0 0.5 1]

Reads what the pipeline wrote (and the train_lolo stage's models: predicting the calibration rows with
them takes a minute per model); changes nothing.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sigma_tempering import served_models  # noqa: E402


def summary(calibration, table: pd.DataFrame, settings, bounds) -> dict[str, float]:
    """LP averages of the served CRPS, coverage and width at ``settings.coverage_gamma`` of ``table``'s rows."""
    from uamt.model_evaluation import ask, measure

    full = measure(calibration, ask(calibration, table, settings, bounds), table, settings)
    tag = f"{settings.coverage_gamma:g}"
    per_lp = [m for lp, m in full.items() if lp not in ("avg", "worst_cells")]
    return {
        "crps": float(np.mean([m["crps"] for m in per_lp])),
        "coverage": float(np.mean([m[f"coverage@{tag}"] for m in per_lp])),
        "width": float(np.mean([m[f"width@{tag}"] for m in per_lp])),
        "n_lps": len(per_lp),
        "n": len(table),
    }


def main(argv: list[str] | None = None) -> int:
    from uamt.core.config import load_section
    from uamt.encoders import EncodeConfig
    from uamt.leave_one_lp_out import LeaveOneLpOutConfig, held_out_models
    from uamt.model_evaluation import calibration_inputs, lolo_predictions
    from uamt.quality import served_setting
    from uamt.serving.model_calibration import (
        fit_held_out_model_unseen_lp_sigma_factor,
        with_unseen_factor,
        with_unseen_sigma_weight,
    )

    args, settings, bounds, models = served_models(
        argv, __doc__.splitlines()[0], **{"--lambdas": (float, [0.0, 0.5, 1.0])}
    )
    pipe, _, _ = served_setting(args.params)
    encode = load_section(EncodeConfig, "encode", args.params)
    lolo_dir = load_section(LeaveOneLpOutConfig, "train_lolo", args.params).out_dir
    frames, _, features, _ = calibration_inputs(pipe, settings, encode)
    for model, calibration, fitted_on, _test, ood in models:
        folders = held_out_models(lolo_dir, model)
        if len(folders) < 2:
            print(f"\n## {model}: no leave-one-LP-out models in {lolo_dir}; skipped")
            continue
        lolo = {lp: lolo_predictions(folder, frames, calibration.calibrated_on, features) for lp, folder in folders.items()}
        known = set(calibration.known_lps)
        unseen = ood[~ood["lp"].astype(str).isin(known)]
        tempering = calibration.sigma_tempering
        if tempering is None:
            print(f"\n## {model}: no σ weight (sigma_tempering) in its calibration; skipped")
            continue
        print(f"\n## {model} (served λ = {tempering.weight:g} in domain, {tempering.unseen:g} unseen; held out: {', '.join(sorted(lolo))})\n")
        print("| λ | widening | held out: CRPS / cov@.9 / width | worst held-out LP: cov@.9 | " + " | ".join(
            f"{d} unseen ({g['lp'].nunique()} LPs, {len(g)} rows): CRPS / cov@.9 / width" for d, g in unseen.groupby("dataset")
        ) + " |")
        print("|---|---|---|---|" + "---|" * unseen["dataset"].nunique())
        for lam in args.lambdas:
            candidate = with_unseen_sigma_weight(calibration, lam, fitted_on, model, settings)
            fit = fit_held_out_model_unseen_lp_sigma_factor(lolo, model, candidate, settings=settings, bounds=bounds)
            held = {
                lp: summary(fit.calibrations[lp], table[table["lp"].astype(str) == lp], settings, bounds)
                for lp, table in sorted(lolo.items()) if lp in fit.calibrations
            }
            worst = max(held, key=lambda lp: abs(held[lp]["coverage"] - settings.coverage_gamma))
            served = with_unseen_factor(candidate, fit.factor)
            cells = [
                "{crps:.4f} / {coverage:.3f} / {width:.2f}".format(**summary(served, rows, settings, bounds))
                for _, rows in unseen.groupby("dataset")
            ]
            mean = {key: float(np.mean([h[key] for h in held.values()])) for key in ("crps", "coverage", "width")}
            print(
                f"| {lam:g} | {fit.factor:.3f} | {mean['crps']:.4f} / {mean['coverage']:.3f} / {mean['width']:.2f} | "
                f"{worst} {held[worst]['coverage']:.3f} | " + " | ".join(cells) + " |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
