"""Calibrate the pipeline's models on held-out rows and evaluate them on test (stages ``calibrate``
and ``evaluate``; the out-of-domain split is scored after ``register``, :mod:`uamt.ood_evaluation`).

One artifact per model: :func:`calibrate_models` fits the model's calibration on the rows of
``evaluate.calibration_splits`` the model never trained on (dev and ``d_e`` for the single-stage
models, dev for DUP, whose error model trains on ``d_e``; never test) and writes it to ``calibration/<model>.json`` -- standardisation, the served candidate the
dev rule picked, the reference factors (k references: :func:`uamt.serving.multi_reference.fit_reference_factors`)
and the unseen-LP widening (with the model held out where the train_lolo stage trained it without each LP:
:func:`uamt.serving.model_calibration.fit_held_out_model_unseen_lp_sigma_factor`; else
:func:`uamt.serving.model_calibration.fit_model_unseen_lp_sigma_factor`).  That file is
what :func:`evaluate_models` loads and measures, what the register stage gates and ships in the
pyfunc, and what ``uamt score`` serves.  Every metric comes from the served distribution itself
(:mod:`uamt.uncertainty.served`: its mu, its intervals at every level, its CDF), clipped to the
scale's bounds as served.

``calibrate`` also writes, per model, the metrics of the same calibration *cross-fitted over the
calibration rows' documents* (each fold answered by a calibration fitted on the other folds, the served candidate
pinned) to ``metrics/dev.json``: the register stage's gate reads those, never test; and the
baseline every uncertainty method must beat, **the point estimate + the same calibration** (the
served candidate fitted with sigma = 1, ``calibration/baselines/point+<candidate>.json``).

``evaluate`` writes ``metrics/test.json`` (model x LP: PPS, UPS served and
raw, CRPS, NLL where Gaussian, ECE over 100 levels, ENCE served and raw, coverage/width/lower and
upper misses, sharpness in z units, the document-clustered ECE floor), ``metrics/conditional.json``
(per model: LP x quintile cells, risk reliability at each threshold, the point + served-calibration
baseline, the goals -- all but the held-out LPs', which ``evaluate_ood`` judges; and, as an analysis, what the other calibration candidates
would have given: :func:`uamt.uncertainty.evaluate_predictions` refitted on the same dev rows),
``metrics/intervals.json`` (that analysis' Gaussian vs conformal interval report) and the plots.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError, UamtError
from uamt.core.naming import is_reference_free, qe_model_name
from uamt.core.parallel import map_in_processes
from uamt.encoders import EncodeConfig
from uamt.leave_one_lp_out import held_out_models
from uamt.pipeline_config import (
    PipelineConfig,
    open_features,
    predict_split,
    read_split,
    training_splits,
)
from uamt.plots import pyplot, save_figure
from uamt.serving.model_calibration import (
    Calibration,
    HeldOutModelFit,
    attach_distribution,
    fit_calibration,
    fit_held_out_model_unseen_lp_sigma_factor,
    fit_model_unseen_lp_sigma_factor,
    is_fixed_variance,
    refit_global_fallback,
    refit_served,
    with_model_sigma,
    with_rearrangement,
    with_sigma_tempering,
    with_unseen_factor,
    with_unseen_sigma_weight,
)
from uamt.serving.multi_reference import fit_reference_factors
from uamt.uncertainty import EvaluationSettings, evaluate_predictions, write_json_atomic
from uamt.uncertainty.candidates import document_folds
from uamt.uncertainty.evaluate import CandidateFitsError, candidate_fits
from uamt.uncertainty.goals import served_summary
from uamt.uncertainty.metrics import ece_sampling_floor, effective_sample_size, macro_mean_se
from uamt.uncertainty.served import (
    ServedRows,
    ServedSettings,
    lattice_threshold,
    row_crps,
    served_metrics,
    served_rows,
)
from uamt.uncertainty.tempering import SigmaTempering

log = logging.getLogger(__name__)
#: What ``evaluate`` scores (before ``register``); ``evaluate_ood`` scores :data:`OOD_SPLIT` after it.
EVAL_SPLITS = ("test",)
OOD_SPLIT = "ood"
BASELINES_DIR = "baselines"
#: ``<calibration_dir>/lolo/<model>/<lp>.json``: the calibration a model trained without ``lp`` served ``lp``.
LOLO_DIR = "lolo"
#: ``<calibration_dir>/candidates/<model>.json``: every calibration candidate as the calibrate stage
#: fitted it on the model's calibration rows, and how the served one was chosen
#: (:func:`~uamt.uncertainty.evaluate.candidate_fits`): what the evaluate stage's analysis of the
#: alternatives measures on test, instead of fitting and cross-fitting them again.
CANDIDATE_FITS_DIR = "candidates"
#: Per-LP keys of ``metrics/{dev,test,ood}.json`` (the rest of the served metrics -- cells, risk
#: reliability, the reliability curve -- goes to ``metrics/conditional.json``).
REPORTED = (
    "n", "pps", "ups", "ups_raw", "nll", "crps", "ece", "ece_floor", "n_eff", "sharpness", "sd", "ence",
    "ence_raw", "sigma_p90_p10", "low_score_coverage", "ece_interval", "top_probability", "top_frequency",
)


def baseline_of(method: str, models) -> str | None:
    """The point model a model is judged against (the fixed-variance baseline method,
    ``uamt.models.specs.baseline_method``): ``point`` for a reference-based model, ``point_qe`` for a
    reference-free one (None where the pipeline has none, or for itself)."""
    from uamt.models.specs import baseline_method

    point = baseline_method()
    point = qe_model_name(point) if is_reference_free(method) else point
    return point if point in models and point != method else None


def baseline_name(point: str, candidate: str) -> str:
    """Name of the point estimate ``point`` + the ``candidate`` calibration."""
    return f"{point}+{candidate}"


def served_settings(settings: EvaluationSettings) -> ServedSettings:
    """How :mod:`uamt.uncertainty.served` measures, from the ``evaluate:`` section."""
    return ServedSettings(
        coverage_gamma=settings.coverage_gamma,
        report_gammas=tuple(settings.conformal_gammas),
        n_levels=settings.n_levels,
        low_score_threshold=settings.low_score_threshold,
        risk_thresholds=tuple(settings.risk_thresholds),
        cell_tolerance=settings.quintile_coverage_tolerance,
    )


def row_documents(table: pd.DataFrame) -> np.ndarray:
    """Document of each row (``doc``), else its source segment ``dataset/lp/seg_id``."""
    if "doc" in table.columns and table["doc"].notna().all():
        return table["doc"].astype(str).to_numpy()
    parts = [table[c].astype(str) for c in ("dataset", "lp", "seg_id") if c in table.columns]
    return (parts[0].str.cat(parts[1:], sep="/") if parts else pd.Series(np.arange(len(table)).astype(str))).to_numpy()


def ask(calibration: Calibration, table: pd.DataFrame, settings: EvaluationSettings, bounds) -> ServedRows:
    """The served distribution's answers for the rows of a predictions ``table`` (raw ``mu``,
    ``sigma``: the point estimate's placeholder sigma is 1; ``human``, where the table has it, for
    the CDF at each score of a distribution with point masses inside the scale)."""
    return served_rows(
        calibration,
        table["mu"].to_numpy(dtype=float),
        table["sigma"].to_numpy(dtype=float),
        table["lp"].astype(str).to_numpy(dtype=object),
        bounds=bounds,
        settings=served_settings(settings),
        human=table["human"].to_numpy(dtype=float) if "human" in table.columns else None,
    )


def measure(
    calibration: Calibration,
    rows: ServedRows,
    table: pd.DataFrame,
    settings: EvaluationSettings,
    *,
    dev_n_eff: dict[str, float] | None = None,
) -> dict[str, Any]:
    """:func:`~uamt.uncertainty.served.served_metrics` of ``rows`` on ``table``'s labels, with the
    sharpness in dev-standardised (z) units and, per LP, the ECE floor of a perfectly calibrated
    model at the LP's document-clustered effective size (``n_eff``), fitted on ``dev_n_eff[lp]``
    effective dev rows where given (:func:`~uamt.uncertainty.metrics.ece_sampling_floor`)."""
    lp = table["lp"].astype(str).to_numpy()
    docs = row_documents(table)
    human = table["human"].to_numpy(dtype=float)
    full = served_metrics(rows, human, lp, docs=docs, settings=served_settings(settings))
    unit = calibration.human_std(lp.astype(object), len(lp))
    finite = np.all(np.isfinite(rows.quantiles), axis=1)
    sd = rows.quantiles.std(axis=1)
    residual = np.where(finite & (sd > 0), (human - rows.center) / np.where(sd > 0, sd, 1.0), 0.0)
    for name in [k for k in full if k not in ("avg", "worst_cells")]:
        mask = lp == name
        z_var = (sd[mask & finite] / unit[mask & finite]) ** 2
        full[name]["sharpness"] = float(np.mean(z_var)) if z_var.size else None
        n_eff = effective_sample_size(residual[mask], docs[mask])
        fit = None if dev_n_eff is None or name not in dev_n_eff else max(1, round(dev_n_eff[name]))
        full[name]["n_eff"] = n_eff
        full[name]["ece_floor"] = ece_sampling_floor(max(1, round(n_eff)), settings.n_levels, n_fit=fit)
    per_lp = [m for k, m in full.items() if k not in ("avg", "worst_cells")]
    for key in ("sharpness", "n_eff", "ece_floor"):
        values = [m[key] for m in per_lp if m.get(key) is not None]
        full["avg"][key] = float(np.mean(values)) if values else None
    return full


def compact(full: dict[str, Any]) -> dict[str, Any]:
    """The ``{"avg": {...}, lp: {...}}`` numbers of a :func:`measure` result (no cells/curves)."""

    def keep(m: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in m.items() if k in REPORTED or k.startswith(("coverage@", "closed_coverage@", "width@", "miss_"))}

    return {"avg": keep(full["avg"]), **{k: keep(m) for k, m in full.items() if k not in ("avg", "worst_cells")}}


def pinned(settings: EvaluationSettings, candidate: str) -> EvaluationSettings:
    """``settings`` with the served candidate fixed (no rule, no other candidate fitted)."""
    return dataclasses.replace(settings, calibration=candidate, calibration_candidates=(candidate,))


def cross_fitted_rows(
    table: pd.DataFrame, method: str | None, calibration: Calibration, settings: EvaluationSettings, bounds
) -> tuple[ServedRows, str]:
    """The served distribution's answers for every dev row, each from the calibration fitted on the
    *other* folds (``settings.cross_fit_folds``; :func:`refit_served`): what the calibration promises
    on dev rows it never saw (the gate's input).  Folds are whole documents; with fewer than two
    documents, whole source segments; with fewer than two of those, the in-sample answers.

    Returns the rows and what the folds were made of (``documents``, ``source segments``, ``in-sample``).
    """
    groups, unit = row_documents(table), "documents"
    if len(set(groups.tolist())) < 2:
        groups, unit = row_documents(table.drop(columns="doc", errors="ignore")), "source segments"
    n_groups = len(set(groups.tolist()))
    if n_groups < 2:
        return ask(calibration, with_model_sigma(table, method) if method else table, settings, bounds), "in-sample"
    folds = document_folds(groups, min(settings.cross_fit_folds, n_groups))
    parts = []
    for fold in sorted(set(folds.tolist())):
        held = folds == fold
        try:
            fitted = refit_served(table[~held], method, calibration, settings)
        except (ValueError, DataError) as exc:  # too few rows outside the fold to fit on
            log.warning("cross-fitting fold %d of %d: %s; its rows are answered in-sample", fold, n_groups, exc)
            fitted, unit = calibration, f"{unit} (some folds in-sample)"
        part = table[held]
        if method is not None:
            part = with_model_sigma(part, method)
        parts.append((np.flatnonzero(held), ask(fitted, part, settings, bounds)))
    return ServedRows.stack(parts, len(table)), unit


def choose_sigma_weight(
    table: pd.DataFrame, method: str | None, calibration: Calibration, settings: EvaluationSettings, bounds,
    source: str = "dev",
) -> tuple[Calibration, dict[str, Any]]:
    """σ's weight λ (:class:`~uamt.uncertainty.tempering.SigmaTempering`) of ``settings.sigma_weights``
    with the lowest CRPS of the served distribution cross-fitted over ``table``'s documents
    (:func:`cross_fitted_rows`, the LP average, as the gate reads it; a tie goes to the larger λ),
    and ``calibration`` refitted on σ tempered by it (its candidate pinned).

    ``calibration``: :func:`fit_calibration`'s on ``table`` (no served distribution attached yet:
    each λ is cross-fitted with the one ``settings`` attaches).  Returns the calibration -- unchanged,
    with the identity tempering recorded, where λ = 1 wins; as is for a model without σ or the single
    weight 1 -- and ``{"weights": {λ: CRPS}, "chosen": λ}`` (empty where nothing was chosen).  A single
    weight other than 1 (``settings.sigma_weights_for(method)``: the model's weight pinned by
    ``evaluate.pinned_sigma_weights``; the ``exp_sigma_weights`` stage re-checks it after
    ``register``, :mod:`uamt.experiments.sigma_weights`) is served without a choice: the calibration
    is refitted on σ tempered by it, nothing is cross-fitted, and the record is
    ``{"weights": {}, "chosen": λ, "pinned": True}``.
    ``source`` names ``table`` in the refit's error messages, as :func:`fit_calibration`'s.
    """
    weights = settings.sigma_weights_for(method)
    if calibration.fixed or weights == (1.0,):
        return calibration, {}
    table = with_model_sigma(table, method) if method is not None else table
    sigma = table["sigma"].to_numpy(dtype=float)
    lp = table["lp"].astype(str).to_numpy(dtype=object)
    crps = {}
    if len(weights) > 1:
        template = attach_distribution(calibration, table, None, settings, bounds)
        for weight in weights:
            # rearranged in mu where this weight leaves σ none, as the calibration would then be served
            tempered = with_rearrangement(
                with_sigma_tempering(template, SigmaTempering.fit(sigma, lp, weight)), table, None, settings
            )
            rows, _ = cross_fitted_rows(table, None, tempered, settings, bounds)
            crps[float(weight)] = measure(tempered, rows, table, settings)["avg"]["crps"]
    chosen = min(crps, key=lambda weight: (crps[weight], -weight)) if crps else weights[0]
    tempering = SigmaTempering.fit(sigma, lp, chosen)
    if not tempering.is_identity:
        refitted, _ = fit_calibration(
            tempering.applied(table), None, settings=pinned(settings, calibration.selected), source=source
        )
        calibration = dataclasses.replace(refitted, fixed=calibration.fixed, calibrated_on=calibration.calibrated_on)
    calibration = with_sigma_tempering(calibration, tempering)
    refit_global_fallback(calibration, table, settings)  # on σ as an unseen row's is tempered, not its LP's
    return calibration, {"weights": {str(w): c for w, c in crps.items()}, "chosen": chosen, **({} if crps else {"pinned": True})}


def held_out_crps(fit: HeldOutModelFit, tables_by_lp: dict[str, pd.DataFrame], settings: EvaluationSettings, bounds) -> dict[str, float]:
    """``{L: CRPS}`` of each held-out LP's rows of ``tables_by_lp[L]`` served ``fit.calibrations[L]``
    (the global fallback of the calibration refitted without ``L``, widened), and ``"avg"``, the
    LP average."""
    out = {}
    for lp, calibration in sorted(fit.calibrations.items()):
        rows = tables_by_lp[lp][tables_by_lp[lp]["lp"].astype(str) == lp]
        out[lp] = float(measure(calibration, ask(calibration, rows, settings, bounds), rows, settings)["avg"]["crps"])
    out["avg"] = float(np.mean(list(out.values())))
    return out


def choose_unseen_sigma_weight(
    tables_by_lp: dict[str, pd.DataFrame],
    method: str | None,
    calibration: Calibration,
    table: pd.DataFrame,
    settings: EvaluationSettings,
    bounds,
) -> tuple[Calibration, HeldOutModelFit, dict[str, Any]]:
    """σ's weight for rows of pairs the calibration never saw, and the unseen-LP widening fitted for it.

    For each λ of ``settings.sigma_weights_for(method)``, ``calibration`` (the served distribution, fitted on
    ``table``, with its in-domain σ weight) serves unseen rows σ tempered with λ
    (:func:`~uamt.serving.model_calibration.with_unseen_sigma_weight`), and the widening is fitted
    with the model held out (:func:`fit_held_out_model_unseen_lp_sigma_factor` on ``tables_by_lp``,
    the leave-one-LP-out models' predictions of the calibration rows).  The λ whose widened
    held-out LPs get the lowest CRPS (:func:`held_out_crps`, LP average; a tie goes to the larger)
    is served where it beats the in-domain weight's by at least ``settings.unseen_sigma_margin``
    (relative): four held-out LPs are a small sample, and a choice that barely wins on them need
    not carry over to new pairs (measured before the fallback was fitted in its own units: the QE
    model's -0.4 % did not hold on the biomedical pairs, HTS's -3.3 % did; docs/quality.md).  A margin of None, a calibration without a σ weight
    (or the isotonic one, which reads μ alone) or a single weight: the in-domain weight, no choice.

    Returns the calibration served (not yet widened), the held-out fit of its widening, and
    ``{"weights": {λ: held-out CRPS}, "per_lp": {λ: {L: CRPS}}, "chosen": λ, "in_domain": λ,
    "margin": m}`` (empty where nothing was chosen; with a single, pinned, weight
    ``{"weights": {}, "chosen": λ, "in_domain": λ, "pinned": True}``: nothing is tried).
    """
    tempering = None if calibration.fixed else calibration.sigma_tempering
    served_fit = fit_held_out_model_unseen_lp_sigma_factor(tables_by_lp, method, calibration, settings=settings, bounds=bounds)
    margin = settings.unseen_sigma_margin
    if margin is None or tempering is None or calibration.isotonic is not None or not served_fit.needed:
        return calibration, served_fit, {}
    weights = settings.sigma_weights_for(method)
    if len(weights) < 2:  # pinned: unseen rows take the in-domain weight
        return calibration, served_fit, {"weights": {}, "chosen": tempering.unseen, "in_domain": tempering.weight, "pinned": True}
    if method is not None:
        tables_by_lp = {lp: with_model_sigma(rows, method) for lp, rows in tables_by_lp.items()}
    candidates, crps = {}, {}
    for weight in sorted(float(w) for w in weights):
        if weight == tempering.unseen:
            candidate, fit = calibration, served_fit
        else:
            candidate = with_unseen_sigma_weight(calibration, weight, table, method, settings)
            fit = fit_held_out_model_unseen_lp_sigma_factor(tables_by_lp, None, candidate, settings=settings, bounds=bounds)
        candidates[weight], crps[weight] = (candidate, fit), held_out_crps(fit, tables_by_lp, settings, bounds)
    in_domain = tempering.unseen
    if in_domain not in crps:  # a weight outside the grid: judged by the grid alone
        in_domain = min(crps, key=lambda w: abs(w - in_domain))
    best = min(crps, key=lambda w: (crps[w]["avg"], -w))
    chosen = best if crps[best]["avg"] < (1.0 - margin) * crps[in_domain]["avg"] else in_domain
    record = {
        "weights": {str(w): c["avg"] for w, c in crps.items()},
        "per_lp": {str(w): {lp: v for lp, v in c.items() if lp != "avg"} for w, c in crps.items()},
        "chosen": chosen,
        "in_domain": tempering.weight,
        "margin": margin,
    }
    return (*candidates[chosen], record)


def fit_served_distribution(
    table: pd.DataFrame,
    method: str | None,
    settings: EvaluationSettings,
    bounds,
    *,
    splits: tuple[str, ...],
    reference_factors=None,
) -> tuple[Calibration, dict[str, Any]]:
    """The distribution a model is served, fitted on its calibration rows ``table`` (the predictions
    of ``splits``): :func:`fit_calibration` (the dev rule's candidate), σ's weight
    (:func:`choose_sigma_weight`), the reference factors and the served distribution on top
    (:func:`~uamt.serving.model_calibration.attach_distribution`: the point mass at the top of the
    scale ``bounds``, the rearrangement in μ, or the isotonic fit) -- everything but the unseen-LP
    widening, which the caller fits with the model held out where it can.  The calibrate stage and
    ``uamt predict --calibrate-on`` both call it, so the two serve the same distribution.

    ``reference_factors``: the fitted calibration -> its reference factors
    (:func:`~uamt.serving.multi_reference.fit_reference_factors`); None: none.  Returns the
    calibration and the records of its choices: ``{"sigma_weight": ...}`` (:func:`choose_sigma_weight`'s
    weights tried) and ``{"risk_lattice": ...}`` (:func:`choose_risk_lattice`'s offsets tried), each
    empty where nothing was chosen, and ``{"candidate_fits": ...}``: every candidate the served one
    was chosen from, as fitted on ``table``, and the choice (:func:`~uamt.uncertainty.evaluate.candidate_fits`;
    the evaluate stage measures them on test without fitting them again).
    """
    source = f"{'+'.join(splits)}/{method}"
    calibration, in_sample = fit_calibration(table, method, settings=settings, source=source)
    calibration.calibrated_on = tuple(splits)
    started = time.perf_counter()
    calibration, sigma_weight = choose_sigma_weight(table, method, calibration, settings, bounds, source=source)
    if sigma_weight:
        log.info(
            "%s: sigma weight %g (cross-fitted CRPS %s; %.1f s)", method, sigma_weight["chosen"],
            ", ".join(f"{w}: {c:.4f}" for w, c in sigma_weight["weights"].items()) or "none tried: pinned",
            time.perf_counter() - started,
        )
    if reference_factors is not None:
        calibration.reference_factors = reference_factors(calibration)
    calibration = attach_distribution(calibration, table, method, settings, bounds)
    calibration, risk_lattice = choose_risk_lattice(table, method, calibration, settings, bounds)
    if risk_lattice:
        log.info(
            "%s: risk read at floor(chi) + %g (cross-fitted Brier %s)", method, risk_lattice["chosen"],
            ", ".join(f"{o}: {b:.4f}" for o, b in risk_lattice["brier"].items()),
        )
    return calibration, {"sigma_weight": sigma_weight, "risk_lattice": risk_lattice, "candidate_fits": candidate_fits(in_sample)}


def choose_risk_lattice(
    table: pd.DataFrame, method: str | None, calibration: Calibration, settings: EvaluationSettings, bounds
) -> tuple[Calibration, dict[str, Any]]:
    """Where the served risk reads the CDF on the score's lattice: the offset δ of
    ``settings.risk_lattice_offsets`` (step ``settings.risk_lattice_step``;
    :func:`~uamt.uncertainty.served.lattice_threshold`) whose risk has the lowest Brier score
    cross-fitted over ``table``'s documents (:func:`cross_fitted_rows`), averaged over LPs and
    ``settings.risk_thresholds`` with the event ``human <= chi``; a tie goes to the smaller δ (0: the
    CDF at chi itself, no lattice).  The Brier score is proper, and the intervals, the CRPS and the
    randomised PIT do not read the lattice, so this choice moves the risk alone.

    Returns ``calibration`` with :attr:`~uamt.serving.model_calibration.Calibration.risk_lattice` set
    (empty for δ = 0) and ``{"step": s, "brier": {δ: Brier}, "chosen": δ}``; as is, with ``{}``,
    without a step, with the single offset 0, or for an isotonic distribution (its own point masses
    are the scores it was fitted at)."""
    step = settings.risk_lattice_step
    offsets = tuple(float(o) for o in settings.risk_lattice_offsets)
    if step is None or offsets == (0.0,) or calibration.isotonic is not None:
        return calibration, {}
    lattices = {o: ({} if o == 0.0 else {"step": float(step), "offset": o}) for o in offsets}
    reads = {(chi, o): float(lattice_threshold(float(chi), lattices[o])) for chi in settings.risk_thresholds for o in offsets}
    probe = dataclasses.replace(settings, risk_thresholds=tuple(sorted(set(reads.values()))))
    plain = dataclasses.replace(calibration, risk_lattice={})
    rows, _ = cross_fitted_rows(table, method, plain, probe, bounds)
    human = table["human"].to_numpy(dtype=float)
    lp = table["lp"].astype(str).to_numpy()
    brier = {}
    for offset in offsets:
        scores = [
            float(np.mean((rows.risk[reads[(chi, offset)]][lp == name] - (human[lp == name] <= chi)) ** 2))
            for name in sorted(set(lp.tolist()))
            for chi in settings.risk_thresholds
        ]
        brier[offset] = float(np.mean(scores))
    chosen = min(brier, key=lambda o: (brier[o], o))
    return (
        dataclasses.replace(calibration, risk_lattice=dict(lattices[chosen])),
        {"step": float(step), "brier": {str(o): b for o, b in brier.items()}, "chosen": chosen},
    )


def pipeline_bounds(pipe: PipelineConfig):
    """The scale's (low, high) that served mu, intervals and risk are clipped to (as ``uamt score``)."""
    from uamt.data.datasets import scale_bounds

    return scale_bounds(pipe.datasets)


def model_calibration_splits(pipe: PipelineConfig, method: str, settings: EvaluationSettings) -> tuple[str, ...]:
    """``settings.calibration_splits`` less every split ``method``'s model (or a model it builds on)
    was trained on (:func:`training_splits`); DataError when none is left."""
    trained = training_splits(pipe.model_dir(method))
    splits = tuple(s for s in settings.calibration_splits if s not in trained)
    if not splits:
        raise DataError(
            f"params.yaml:evaluate.calibration_splits {list(settings.calibration_splits)} leaves no rows to "
            f"calibrate {method} on: it was trained on {sorted(trained)}; add a split it never saw"
        )
    return splits


def calibration_rows(pipe: PipelineConfig, method: str, splits) -> pd.DataFrame:
    """The predictions ``predictions/<split>/<method>.parquet`` of the ``splits`` a calibration was
    fitted on (:attr:`Calibration.calibrated_on`), one table in the order of ``splits``."""
    tables = [pd.read_parquet(Path(pipe.predictions_dir) / split / f"{method}.parquet") for split in splits]
    return pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]


def baseline_key(point: str, candidate: str, splits, default_splits) -> str:
    """Name of the point + ``candidate`` baseline fitted on ``splits``: :func:`baseline_name`, with
    ``@<split>+...`` where the splits are not every one of ``evaluate.calibration_splits``."""
    name = baseline_name(point, candidate)
    return name if tuple(splits) == tuple(default_splits) else f"{name}@{'+'.join(splits)}"


def calibration_inputs(pipe: PipelineConfig, settings: EvaluationSettings, encode: EncodeConfig):
    """``(frames, dev_df, features, bounds)``: what :func:`calibrate_model` reads for every model."""
    frames = {split: read_split(pipe.prepared_dir, split, pipe.datasets) for split in settings.calibration_splits}
    dev_df = frames["dev"] if "dev" in frames else read_split(pipe.prepared_dir, "dev", pipe.datasets)
    return frames, dev_df, open_features(encode), pipeline_bounds(pipe)


def fit_with_choices(
    pipe: PipelineConfig,
    settings: EvaluationSettings,
    method: str,
    inputs: tuple,
    table: pd.DataFrame,
    splits: tuple[str, ...],
    lolo_dir: str | Path | None,
) -> tuple[Calibration, dict[str, Any], dict[str, Path], HeldOutModelFit | None, dict[str, Any]]:
    """The distribution ``method`` is served, fitted on its calibration rows ``table`` (its
    predictions of ``splits``), before the unseen-LP widening: :func:`fit_served_distribution`
    (with the reference factors), then σ's weight for unseen pairs (:func:`choose_unseen_sigma_weight`)
    where ``lolo_dir`` holds the model trained without each of at least two LPs.

    ``inputs``: :func:`calibration_inputs`.  Returns ``(calibration, choices, held-out models
    {LP: folder}, their held-out fit or None, the unseen weight's record)``; the calibrate stage
    (:func:`calibrate_model`) widens and serves it, the ``exp_sigma_weights`` stage re-checks the
    pinned weights with it (:func:`check_model_sigma_weights`)."""
    frames, dev_df, features, bounds = inputs
    # The reference factors need rows with several references: dev's (the multi-reference
    # rows of the other splits are not encoded).
    calibration, choices = fit_served_distribution(
        table, method, settings, bounds, splits=splits,
        reference_factors=lambda fitted: fit_reference_factors(
            pipe.model_dir(method), dev_df, features, fitted, settings.min_lp_rows
        ),
    )
    # The widening is fitted for the distribution that is served (its point masses included), with
    # the σ weight of unseen rows chosen where the model can be held out.
    models = held_out_models(lolo_dir, method) if lolo_dir is not None else {}
    fit, unseen_weight = None, {}
    if len(models) >= 2:
        calibration, fit, unseen_weight = choose_unseen_sigma_weight(
            {lp: lolo_predictions(folder, frames, splits, features) for lp, folder in models.items()},
            method, calibration, table, settings, bounds,
        )
        if unseen_weight:
            log.info(
                "%s: sigma weight %g for unseen pairs (in domain %g; held-out-model CRPS %s)", method,
                unseen_weight["chosen"], unseen_weight["in_domain"],
                ", ".join(f"{w}: {c:.4f}" for w, c in unseen_weight["weights"].items()) or "none tried: pinned",
            )
    return calibration, choices, models, fit, unseen_weight


def calibrate_model(
    pipe: PipelineConfig,
    settings: EvaluationSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    method: str,
    inputs: tuple | None = None,
    lolo_dir: str | Path | None = None,
) -> tuple[dict[str, Any], Path, dict[str, pd.DataFrame]]:
    """One model of :func:`calibrate_models`: its predictions on its calibration splits (written),
    its calibration (saved), and its cross-fitted dev metrics.  Returns ``(metrics, calibration
    path, {split: predictions table})``; reads nothing another model writes, so models may run in
    parallel.  ``inputs``: :func:`calibration_inputs` (read here when None).  ``lolo_dir``: the
    train_lolo stage's folder; a model trained there without each LP gets its unseen-LP widening
    fitted with the model held out (:func:`fit_held_out_model_unseen_lp_sigma_factor`; each
    held-out LP's calibration saved as ``<calibration_dir>/lolo/<model>/<lp>.json``), the others
    with the calibration held out only."""
    frames, dev_df, features, bounds = inputs if inputs is not None else calibration_inputs(pipe, settings, encode)
    splits = model_calibration_splits(pipe, method, settings)
    tables = {
        split: predict_split(
            pipe.model_dir(method), frames[split], features, Path(pipe.predictions_dir) / split / f"{method}.parquet"
        )
        for split in splits
    }
    table = pd.concat([tables[s] for s in splits], ignore_index=True)
    calibration, choices, models, fit, unseen_weight = fit_with_choices(
        pipe, settings, method, (frames, dev_df, features, bounds), table, splits, lolo_dir
    )
    started = time.perf_counter()
    factor, held_out = fit_model_unseen_lp_sigma_factor(table, method, calibration, settings=settings, bounds=bounds)
    unseen = {"sigma_factor": factor, "fitted_with": "calibration held out", "held_out": held_out}
    if models:  # what an earlier fit left goes first
        save_held_out_calibrations(fit.calibrations if fit is not None else {}, Path(calibration_dir) / LOLO_DIR / method)
    if fit is not None and fit.needed:  # else fewer than two held-out LPs with rows: calibration-only
        factor = fit.factor
        unseen = {
            "sigma_factor": factor,
            "fitted_with": "model and calibration held out",
            "held_out_models": fit.needed,
            "held_out_models_coverage": fit.coverage,
            "calibration_only": {"sigma_factor": unseen["sigma_factor"], "held_out": held_out},
            **({"sigma_weight": unseen_weight} if unseen_weight else {}),
        }
    calibration = with_unseen_factor(calibration, factor)
    log.info(
        "%s: unseen-LP widening %.3f, %s (leave-one-LP-out: %s; %.1f s)",
        method,
        factor,
        unseen["fitted_with"],
        ", ".join(f"{lp} {c:.3f}" for lp, c in unseen.get("held_out_models", held_out).items()) or "fewer than two LPs",
        time.perf_counter() - started,
    )
    path = Path(calibration_dir) / f"{method}.json"
    calibration.save(path)
    fits = candidate_fits_path(Path(calibration_dir), method)
    fits.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(choices.pop("candidate_fits"), fits)
    sigma_table = with_model_sigma(table, method)
    rows, unit = cross_fitted_rows(table, method, calibration, settings, bounds)
    metrics = {
        **compact(measure(calibration, rows, sigma_table, settings)),
        "cross_fitted_over": unit,
        "calibrated_on": list(splits),
        "n_calibration_rows": len(table),
        "served": "fixed_variance" if calibration.fixed else calibration.selected,
        "unseen_lp": unseen,
        **{name: record for name, record in choices.items() if record},
    }
    if calibration.isotonic is not None:  # "served" stays the candidate: the baselines are named by it
        metrics["distribution"] = "isotonic"
    log.info(
        "calibrated %s on %d %s rows (served: %s%s)", method, len(table), "+".join(splits),
        metrics["served"], ", isotonic on its mu" if calibration.isotonic is not None else "",
    )
    return metrics, path, tables


def check_model_sigma_weights(
    pipe: PipelineConfig,
    settings: EvaluationSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    weights: tuple[float, ...],
    method: str,
    inputs: tuple | None = None,
    lolo_dir: str | Path | None = None,
) -> dict[str, Any] | None:
    """The σ weights the calibrate stage would choose for ``method`` from ``weights``, against the
    ones it serves (pinned by ``settings.pinned_sigma_weights``): :func:`fit_with_choices` with
    ``weights`` and no pin on the calibration rows that stage predicted
    (``predictions/<split>/<method>.parquet``).

    Returns None for a model without σ (its served calibration has a fixed variance), else
    ``{"served": {"seen": λ, "unseen": λ}, "seen": {"weights": {λ: cross-fitted CRPS}, "chosen": λ},
    "unseen": {"weights": {λ: held-out CRPS}, "per_lp": ..., "chosen": λ, "in_domain": λ,
    "margin": m} or None (no leave-one-LP-out models), "agrees": bool}``."""
    served = Calibration.load(Path(calibration_dir) / f"{method}.json")
    if served.fixed:
        return None
    frames, dev_df, features, bounds = inputs if inputs is not None else calibration_inputs(pipe, settings, encode)
    splits = tuple(served.calibrated_on)
    table = calibration_rows(pipe, method, splits)
    grid = dataclasses.replace(settings, sigma_weights=tuple(float(w) for w in weights), pinned_sigma_weights={})
    _, choices, _, _, unseen = fit_with_choices(pipe, grid, method, (frames, dev_df, features, bounds), table, splits, lolo_dir)
    tempering = served.sigma_tempering
    served_weights = {"seen": 1.0, "unseen": 1.0} if tempering is None else {"seen": tempering.weight, "unseen": tempering.unseen}
    seen = choices["sigma_weight"]  # the grid's records: nothing pinned, so every weight was tried
    unseen = unseen or None
    agrees = seen["chosen"] == served_weights["seen"] and (unseen is None or unseen["chosen"] == served_weights["unseen"])
    log.info(
        "%s: served sigma weight %g (unseen pairs %g); cross-fitted CRPS %s -> chosen %g%s", method,
        served_weights["seen"], served_weights["unseen"], ", ".join(f"{w}: {c:.4f}" for w, c in seen["weights"].items()),
        seen["chosen"], f"; unseen pairs {unseen['chosen']:g}" if unseen else "",
    )
    return {"served": served_weights, "seen": seen, "unseen": unseen, "agrees": agrees}


def lolo_predictions(model_dir: Path, frames: dict[str, pd.DataFrame], splits, features) -> pd.DataFrame:
    """The predictions of the model in ``model_dir`` on the ``splits`` of ``frames``, one table (not written)."""
    from uamt.models.api import load

    model = load(model_dir)
    return pd.concat([model.predictions_table(frames[split], features) for split in splits], ignore_index=True)


def save_held_out_calibrations(calibrations: dict[str, Calibration], folder: Path) -> None:
    """``<folder>/<lp>.json`` for each held-out LP's calibration (what :func:`evaluate_model` measures
    the held-out model's test rows with); what an earlier fit left there goes first."""
    if folder.exists():
        shutil.rmtree(folder)
    for lp, calibration in calibrations.items():
        calibration.save(folder / f"{lp}.json")


def costliest_first(pipe: PipelineConfig, settings: EvaluationSettings, lolo_dir=None) -> list[str]:
    """The pipeline's models in the order :func:`calibrate_models` and :func:`evaluate_models` hand
    them to their workers: the costliest first (longest-processing-time order), so that no worker
    is left with a long one alone at the end.

    The cost, ranked as the calibrate stage's log ranks the models (those with held-out models the
    longest, then MC dropout and the ensemble, DUP on dev alone the shortest): models with held-out
    models (``lolo_dir``: their unseen-pair fits and test rows) first, then by forward passes per row
    (:class:`uamt.models.specs.CostClass`, with the model's own ``mc_samples`` / ``ensemble_size``)
    times calibration splits; ties keep the pipeline's order.  Only the order changes: every model is
    calibrated and measured on its own."""
    from uamt.models.api import read_manifest
    from uamt.models.specs import model_spec

    def cost(model: str) -> tuple[bool, int]:
        try:
            config = read_manifest(pipe.model_dir(model)).get("config", {})
            splits = model_calibration_splits(pipe, model, settings)
        except UamtError:  # no such model (yet): the stage's own call names what is wrong
            return (True, 0)
        sizes = {key: int(config.get(key) or 1) for key in ("mc_samples", "ensemble_size")}
        passes = model_spec(model).cost.count("passes", **sizes)
        held_out = lolo_dir is not None and bool(held_out_models(lolo_dir, model))
        return (not held_out, -passes * len(splits))

    return sorted(pipe.all_methods, key=cost)


def check_pinned_models(settings: EvaluationSettings) -> None:
    """ValueError where ``settings.pinned_sigma_weights`` names a model no method trains (a typo
    would otherwise leave the model choosing its weight, slowly and unnoticed)."""
    from uamt.models.specs import METHODS

    known = {*METHODS, *(qe_model_name(name) for name in METHODS)}
    for model in settings.pinned_sigma_weights:
        if model not in known:
            raise ValueError(f"pinned_sigma_weights.{model} not supported; pin models from {sorted(known)}")


def calibrate_models(
    pipe: PipelineConfig,
    settings: EvaluationSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    lolo_dir: str | Path | None = None,
) -> dict[str, Path]:
    """Fit every model's calibration (the artifact) on its calibration rows (:func:`model_calibration_splits`),
    its point + same-calibration baseline and their cross-fitted metrics; writes the predictions of
    every calibration split (``predictions/<split>/<model>.parquet``), ``<calibration_dir>/<model>.json``,
    ``<calibration_dir>/baselines/point+<candidate>.json`` and ``<metrics_dir>/dev.json``; returns
    ``{model: calibration path}``.  The models are calibrated in ``pipe.workers`` processes
    (:func:`calibrate_model`; the same numbers for any number, up to float rounding); ``lolo_dir``:
    the train_lolo stage's models (:func:`calibrate_model`)."""
    check_pinned_models(settings)
    for split in settings.calibration_splits:  # declared stage outputs, even where no model is calibrated on them
        (Path(pipe.predictions_dir) / split).mkdir(parents=True, exist_ok=True)
    bounds = pipeline_bounds(pipe)
    order = costliest_first(pipe, settings, lolo_dir)  # results keep the pipeline's order
    done = dict(zip(order, map_in_processes(
        functools.partial(calibrate_model, pipe, settings, encode, calibration_dir, lolo_dir=lolo_dir),
        order,
        pipe.workers,
        load=functools.partial(calibration_inputs, pipe, settings, encode),
    ), strict=True))
    metrics = {method: done[method][0] for method in pipe.all_methods}
    out = {method: done[method][1] for method in pipe.all_methods}
    tables = {method: done[method][2] for method in pipe.all_methods}
    needed = {
        (point, metrics[method]["served"], tuple(metrics[method]["calibrated_on"]))
        for method in pipe.all_methods
        if (point := baseline_of(method, pipe.all_methods)) and metrics[method]["served"] != "fixed_variance"
    }
    tasks = []
    for point, candidate, splits in sorted(needed):
        name = baseline_key(point, candidate, splits, settings.calibration_splits)
        missing = [s for s in splits if s not in tables[point]]
        if missing:  # the point model was trained on a split the method is calibrated on
            log.warning("no baseline %s: %s was trained on %s", name, point, missing)
            continue
        point_table = with_model_sigma(pd.concat([tables[point][s] for s in splits], ignore_index=True), point)
        tasks.append((name, candidate, splits, point_table))
    # Each baseline needs the candidate some model was served, so they are fitted once every model
    # is calibrated, side by side as the models were.
    fitted = map_in_processes(functools.partial(fit_baseline, settings, bounds, Path(calibration_dir)), tasks, pipe.workers)
    metrics.update(zip((task[0] for task in tasks), fitted, strict=True))
    Path(pipe.metrics_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(metrics, Path(pipe.metrics_dir) / "dev.json")
    return out


def fit_baseline(settings: EvaluationSettings, bounds, calibration_dir: Path, task: tuple, _inputs=None) -> dict[str, Any]:
    """One point + same-calibration baseline of :func:`calibrate_models`: ``task = (name, candidate,
    splits, point table)``; saves ``<calibration_dir>/baselines/<name>.json`` and returns its
    cross-fitted metrics on those rows."""
    name, candidate, splits, point_table = task
    baseline, _ = fit_calibration(point_table, None, settings=pinned(settings, candidate), source=f"{'+'.join(splits)}/{name}")
    baseline.calibrated_on = splits
    baseline = attach_distribution(baseline, point_table, None, settings, bounds)
    baseline.save(calibration_dir / BASELINES_DIR / f"{name}.json")
    rows, unit = cross_fitted_rows(point_table, None, baseline, settings, bounds)
    log.info("fitted the baseline %s", name)
    return {
        **compact(measure(baseline, rows, point_table, settings)),
        "cross_fitted_over": unit,
        "calibrated_on": list(splits),
        "served": candidate,
    }


def dev_effective_sizes(calibration: Calibration, dev: pd.DataFrame, settings: EvaluationSettings, bounds) -> dict[str, float]:
    """Per LP: the document-clustered effective size of the dev rows the calibration was fitted on."""
    rows = ask(calibration, dev, settings, bounds)
    sd = rows.quantiles.std(axis=1)
    human = dev["human"].to_numpy(dtype=float)
    residual = np.where(sd > 0, (human - rows.center) / np.where(sd > 0, sd, 1.0), 0.0)
    residual = np.where(np.isfinite(residual), residual, 0.0)
    lp, docs = dev["lp"].astype(str).to_numpy(), row_documents(dev)
    return {name: effective_sample_size(residual[lp == name], docs[lp == name]) for name in sorted(set(lp.tolist()))}


def evaluation_inputs(pipe: PipelineConfig, encode: EncodeConfig):
    """``(frames, features, bounds)``: what :func:`evaluate_model` reads for every model."""
    frames = {split: read_split(pipe.prepared_dir, split, pipe.datasets) for split in EVAL_SPLITS}
    return frames, open_features(encode), pipeline_bounds(pipe)


def served_calibration(pipe: PipelineConfig, settings: EvaluationSettings, calibration_dir, method: str, bounds):
    """``(calibration, dev, dev_n_eff)``: the served ``calibration/<method>.json``, the calibration
    rows it was fitted on (with the model's sigma) and their per-LP effective sizes
    (:func:`dev_effective_sizes`): what :func:`measure_split` needs besides the rows it measures."""
    calibration = Calibration.load(Path(calibration_dir) / f"{method}.json")
    dev = with_model_sigma(calibration_rows(pipe, method, calibration.calibrated_on), method)
    return calibration, dev, dev_effective_sizes(calibration, dev, settings, bounds)


def measure_split(
    pipe: PipelineConfig, method: str, split: str, frame: pd.DataFrame, features, calibration: Calibration,
    settings: EvaluationSettings, bounds, dev_n_eff,
) -> tuple[dict[str, Any], pd.DataFrame, ServedRows]:
    """One model on one split: its predictions (written to ``predictions/<split>/<method>.parquet``),
    the served distribution's answers for them and their served metrics (:func:`measure`).
    Returns ``(metrics, predictions, answers)``."""
    table = predict_split(pipe.model_dir(method), frame, features, Path(pipe.predictions_dir) / split / f"{method}.parquet")
    sigma_table = with_model_sigma(table, method)
    rows = ask(calibration, sigma_table, settings, bounds)
    return measure(calibration, rows, sigma_table, settings, dev_n_eff=dev_n_eff), table, rows


def evaluate_model(
    pipe: PipelineConfig,
    settings: EvaluationSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    method: str,
    inputs: tuple | None = None,
    lolo_dir: str | Path | None = None,
) -> dict[str, Any]:
    """One model of :func:`evaluate_models`: its predictions on test (written), the served
    metrics of its calibration there, and the analysis of the other candidates.  Returns
    ``{"full": {split: metrics}, "tables": {split: predictions}, "analysis": ..., "held_out_models":
    ..., "test_crps": CRPS per test row}``; reads nothing another model writes, so models may run in parallel.  ``inputs``:
    :func:`evaluation_inputs` (read here when None); ``lolo_dir``: the train_lolo stage's models
    (:func:`held_out_model_test_metrics`)."""
    frames, features, bounds = inputs if inputs is not None else evaluation_inputs(pipe, encode)
    calibration, dev, dev_n_eff = served_calibration(pipe, settings, calibration_dir, method, bounds)
    full, tables, test_crps = {}, {}, None
    for split, frame in frames.items():
        full[split], tables[split], rows = measure_split(
            pipe, method, split, frame, features, calibration, settings, bounds, dev_n_eff
        )
        if split == "test":
            test_crps = row_crps(rows, tables[split]["human"].to_numpy(dtype=float))
    # The analysis of alternatives: every calibration candidate as calibrate fitted it on the same
    # calibration rows, measured on test (the served one among them is the artifact's own fit).
    try:
        analysis = evaluate_predictions(
            with_model_sigma(tables["test"], method),
            dev,
            settings=settings,
            pred_source=f"test/{method}",
            dev_source=f"{'+'.join(calibration.calibrated_on)}/{method}",
            scope="full",
            fitted=read_candidate_fits(Path(calibration_dir), method),
        )
    except CandidateFitsError as exc:
        raise DataError(f"{candidate_fits_path(Path(calibration_dir), method)}: {exc}") from None
    held = held_out_model_test_metrics(
        method, lolo_dir, Path(calibration_dir), frames["test"], features, settings, bounds, full["test"]
    )
    log.info("evaluated %s", method)
    return {"full": full, "tables": tables, "analysis": analysis, "held_out_models": held, "test_crps": test_crps}


def candidate_fits_path(calibration_dir: Path, method: str) -> Path:
    """``<calibration_dir>/candidates/<method>.json`` (:data:`CANDIDATE_FITS_DIR`)."""
    return calibration_dir / CANDIDATE_FITS_DIR / f"{method}.json"


def read_candidate_fits(calibration_dir: Path, method: str) -> dict[str, Any] | None:
    """The calibrate stage's candidate fits of ``method`` (:func:`candidate_fits_path`); None, with
    a warning, where a calibration folder written before them has none (they are then refitted)."""
    path = candidate_fits_path(calibration_dir, method)
    if not path.is_file():
        log.warning("%s missing: the calibration candidates of %s are fitted again (run `dvc repro calibrate`)", path, method)
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc}); re-run `dvc repro calibrate`") from None


def held_out_model_test_metrics(
    method: str, lolo_dir, calibration_dir: Path, test: pd.DataFrame, features, settings: EvaluationSettings,
    bounds, seen: dict[str, Any],
) -> dict[str, Any] | None:
    """How an unseen language pair is served, measured with the pair held out of model and calibration.

    For each LP ``L`` the train_lolo stage trained ``method`` without (``lolo_dir``) and calibrate
    fitted a calibration for (``<calibration_dir>/lolo/<method>/<L>.json``: the served distribution
    refitted on the other LPs, widened by the model's unseen-LP factor), ``L``'s test rows are
    predicted by that model and served that calibration -- as ``uamt score`` serves a new pair.  Per
    LP: the served metrics (coverage and width at every level, CRPS, bad-segment coverage, PPS), the
    coverage at ``coverage_gamma`` without the widening, and the width the registered model (which
    saw ``L``) gets on the same rows (``seen``: its test metrics).  ``None`` when there are none.
    """
    folder = calibration_dir / LOLO_DIR / method
    models = held_out_models(lolo_dir, method) if lolo_dir is not None else {}
    if not models or not folder.is_dir():
        return None
    from uamt.models.api import load
    from uamt.serving.model_calibration import served_lp_coverage

    level = settings.coverage_gamma
    out: dict[str, Any] = {}
    for lp, model_dir in models.items():
        path = folder / f"{lp}.json"
        rows = test[test["lp"].astype(str) == lp].reset_index(drop=True)
        if not path.is_file() or rows.empty:
            continue
        calibration = Calibration.load(path)
        table = with_model_sigma(load(model_dir).predictions_table(rows, features), method)
        metrics = compact(measure(calibration, ask(calibration, table, settings, bounds), table, settings))[lp]
        out[lp] = {
            **metrics,
            f"coverage@{level}_unwidened": served_lp_coverage(with_unseen_factor(calibration, 1.0), table, level, bounds),
            f"seen_width@{level}": (seen.get(lp) or {}).get(f"width@{level}"),
            "sigma_factor": calibration.unseen_lp_sigma_factor,
        }
    if not out:
        return None
    per_lp = list(out.values())
    out["avg"] = {
        key: float(np.mean([m[key] for m in per_lp]))
        for key in (f"coverage@{level}", f"coverage@{level}_unwidened", f"width@{level}", f"seen_width@{level}", "crps", "pps")
        if all(m.get(key) is not None for m in per_lp)
    }
    out["avg"]["n"] = int(sum(m["n"] for m in per_lp))
    out["avg"]["sigma_factor"] = per_lp[0]["sigma_factor"]
    return out


def evaluate_models(
    pipe: PipelineConfig,
    settings: EvaluationSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    lolo_dir: str | Path | None = None,
) -> dict[str, Path]:
    """Measure every model's served calibration (``<calibration_dir>/<model>.json``, as fitted by the
    calibrate stage) on ``test``; writes the predictions, the metrics and the plots; returns
    ``{"test": ..., plot name: ...}`` paths (the out-of-domain split:
    :func:`uamt.ood_evaluation.evaluate_ood_models`, after ``register``).  The models are measured in
    ``pipe.workers`` processes (:func:`evaluate_model`; the same numbers for any number, up to float
    rounding); ``lolo_dir``: the train_lolo stage's models, measured on their held-out LPs' test rows
    (``metrics/conditional.json``: ``<model>.unseen_lp_held_out_models``)."""
    bounds = pipeline_bounds(pipe)
    order = costliest_first(pipe, settings, lolo_dir)
    done = dict(
        zip(
            order,
            map_in_processes(
                functools.partial(evaluate_model, pipe, settings, encode, calibration_dir, lolo_dir=lolo_dir),
                order,
                pipe.workers,
                load=functools.partial(evaluation_inputs, pipe, encode),
            ),
            strict=True,
        )
    )
    done = {method: done[method] for method in pipe.all_methods}  # the files keep the pipeline's order
    metrics: dict[str, dict] = {split: {} for split in EVAL_SPLITS}
    intervals, reliability, scatter, conditional, full = {}, {}, {}, {}, {}
    tables: dict[str, dict[str, pd.DataFrame]] = {}
    for method, result in done.items():
        full[method], tables[method] = result["full"], result["tables"]
        for split in EVAL_SPLITS:
            metrics[split][method] = compact(full[method][split])
        scatter[method] = tables[method]["test"]
        reliability[method] = _mean_reliability(full[method]["test"])
        intervals[method] = result["analysis"].get("intervals")
        conditional[method] = {"analysis": result["analysis"]}
    baselines, baseline_crps = _evaluate_baselines(pipe, settings, calibration_dir, tables, bounds)
    for method in pipe.all_methods:
        calibration = Calibration.load(Path(calibration_dir) / f"{method}.json")
        served = "fixed_variance" if calibration.fixed else calibration.selected
        point = baseline_of(method, pipe.all_methods)
        baseline = (
            None
            if calibration.fixed or point is None
            else baseline_key(point, served, calibration.calibrated_on, settings.calibration_splits)
        )
        isotonic = calibration.isotonic is not None  # what the reports name as served
        conditional[method] = served_summary(
            full[method]["test"],
            None,  # the held-out LPs are out of domain: evaluate_ood's metrics/held_out.json
            served=f"isotonic on the {served} mu" if isotonic else served,
            rule=settings.calibration_rule,
            known_lps=calibration.known_lps,
            baseline=baselines.get(baseline),
            baseline_name=f"{baseline} + isotonic" if isotonic and baseline else baseline,
            analysis=conditional[method]["analysis"],
            settings=served_settings(settings),
            crps_delta_se=paired_crps_se(done[method]["test_crps"], baseline_crps.get(baseline), tables[method]["test"]),
            held_out_pending=True,
        )
        if done[method]["held_out_models"] is not None:
            conditional[method]["unseen_lp_held_out_models"] = done[method]["held_out_models"]
    metrics_dir = Path(pipe.metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(metrics["test"], metrics_dir / "test.json")
    write_json_atomic(intervals, metrics_dir / "intervals.json")
    write_json_atomic(conditional, metrics_dir / "conditional.json")
    plots = write_plots(Path(pipe.plots_dir), reliability, scatter)
    return {"test": metrics_dir / "test.json", **plots}


def _evaluate_baselines(
    pipe, settings, calibration_dir, tables, bounds
) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray]]:
    """Served metrics on test of every ``calibration/baselines/<point>+<candidate>.json``, and the
    CRPS of each of its test rows (for the paired difference, :func:`paired_crps_se`)."""
    folder = Path(calibration_dir) / BASELINES_DIR
    out, crps = {}, {}
    for path in sorted(folder.glob("*+*.json")) if folder.is_dir() else []:
        point = path.stem.split("+", 1)[0]
        if point not in tables:
            continue
        table = with_model_sigma(tables[point]["test"], point)
        baseline = Calibration.load(path)
        rows = ask(baseline, table, settings, bounds)
        out[path.stem] = measure(baseline, rows, table, settings)
        crps[path.stem] = row_crps(rows, table["human"].to_numpy(dtype=float))
    return out, crps


def paired_crps_se(model_crps: np.ndarray | None, baseline_crps: np.ndarray | None, table: pd.DataFrame) -> float | None:
    """Document-clustered standard error of a model's LP-averaged CRPS minus its baseline's, paired
    over the same test rows of ``table`` (both predict the same frame, row for row;
    :func:`~uamt.uncertainty.metrics.macro_mean_se` over the rows both answer with finite quantiles).
    None without a baseline, or when the row counts differ."""
    if model_crps is None or baseline_crps is None or len(model_crps) != len(baseline_crps) or len(model_crps) != len(table):
        return None
    both = np.isfinite(model_crps) & np.isfinite(baseline_crps)
    if not both.any():
        return None
    lp = table["lp"].astype(str).to_numpy()[both]
    return macro_mean_se((model_crps - baseline_crps)[both], lp, row_documents(table)[both])


def _mean_reliability(full: dict[str, Any]) -> dict[str, list[float]]:
    """The reliability curve averaged over LPs (expected vs observed coverage of the served intervals)."""
    curves = [m["reliability"] for k, m in full.items() if k not in ("avg", "worst_cells")]
    if not curves:
        return {}
    return {
        "expected": curves[0]["expected"],
        "observed": np.mean([c["observed"] for c in curves], axis=0).tolist(),
    }


def write_plots(plots_dir: Path, reliability: dict, scatter: dict) -> dict[str, Path]:
    """Reliability diagram and |error| vs sigma on test, as PNG (sharpness in- vs out-of-domain:
    :func:`uamt.ood_evaluation.write_sharpness_plot`)."""
    plt = pyplot()
    plots_dir.mkdir(parents=True, exist_ok=True)
    out = {}

    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="ideal")
    for method, curve in reliability.items():
        if curve:
            ax.plot(curve["expected"], curve["observed"], label=method)
    ax.set(
        xlabel="expected coverage (confidence level)", ylabel="observed coverage", title="Reliability on test"
    )
    ax.legend(fontsize=8)
    out["reliability"] = save_figure(fig, plots_dir / "reliability.png")

    shown = [m for m in scatter if not is_fixed_variance(m)]
    fig, axes = plt.subplots(1, max(len(shown), 1), figsize=(3 * max(len(shown), 1), 3), squeeze=False)
    for ax, method in zip(axes[0], shown, strict=False):
        table = scatter[method]
        ax.scatter(table["sigma"], (table["human"] - table["mu"]).abs(), s=3, alpha=0.3)
        ax.set(title=method, xlabel="predicted sigma (raw)", ylabel="|human - mu|")
    out["error_vs_sigma"] = save_figure(fig, plots_dir / "error_vs_sigma.png")
    return out
