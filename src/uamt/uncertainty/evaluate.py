"""Evaluate a predictions table: standardise and calibrate on dev, then report the papers' indicators.

Library entry points:

* :func:`evaluate_predictions` -- DataFrames in, JSON-safe dict out (called by the pipeline's
  evaluate stage and by ``uamt evaluate-predictions``);
* :func:`evaluate_prediction_files` -- CSV paths in, metrics JSON written atomically;
* :func:`metrics_table` -- the result flattened into method x LP rows;
* :func:`read_predictions` / :func:`prediction_arrays` -- validated loading of the
  ``lp, human, mu, sigma`` or ``lp, human, samples`` layouts.

Procedure with a dev set (Glushkova et al., 2021, §5.2): human scores and predictions are
standardised with dev statistics (:class:`~uamt.uncertainty.calibrators.Standardizer`); the model's
variance is affine-calibrated on dev to minimise the ECE; the fixed-variance baseline gets the dev
NLL-optimal constant variance; split-conformal thresholds are fitted on dev too.  Everything is then
applied to the predictions file and evaluated per LP, macro-averaged over LPs (the papers' "AVG")
and pooled.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.core.fileio import atomic_write_json
from uamt.uncertainty.calibrators import MU_SCALINGS, AffineVarianceCalibrator, FixedVarianceCalibrator
from uamt.uncertainty.candidates import (
    DEFAULT_CANDIDATES,
    RULES,
    candidate_from_dict,
    candidate_interval,
    candidate_sigma,
    candidate_summary,
    check_candidates,
    conditional_report,
    cross_fitted_ece,
    cross_fitted_sigmas,
    document_folds,
    fit_candidate,
    inside_interval,
    select_candidate,
    standardize,
)
from uamt.uncertainty.conformal import REPORT_GAMMAS, ConformalCalibrator, interval_report
from uamt.uncertainty.metrics import (
    N_CONFIDENCE_LEVELS,
    expected_normalized_calibration_error,
    reliability_curve,
    sigma_spread_ratio,
    uncertainty_metrics,
)
from uamt.uncertainty.samples import PAPER_DDOF, parse_samples_field

MU_SIGMA_COLUMNS = ("lp", "human", "mu", "sigma")
SAMPLES_COLUMNS = ("lp", "human", "samples")
METRIC_KEYS = ("pps", "ups", "nll", "ece", "sharpness", "crps")
#: What :func:`evaluate_predictions` computes (``scope``): ``full`` -- the served calibration, every
#: candidate's test block and the papers' cross-fitted ECE (the evaluate stage on test, ``uamt
#: evaluate-predictions``); ``served`` -- the served calibration only (fitting it on dev, analyses
#: that read the calibrated model's metrics); ``fixed_variance`` -- no candidate at all (analyses
#: that read only the fixed-variance baseline).  Cross-fitting 6 candidates x 5 folds is most of the
#: cost, and the papers' k-fold ECE most of the rest.
SCOPES = ("full", "served", "fixed_variance")


#: Splits a served calibration may be fitted on: rows held out from the models' training
#: (``d_q``), never the measured ones (``test``, ``ood``).
CALIBRATION_SPLITS: tuple[str, ...] = ("dev", "d_e")

#: The served distribution's family (``evaluate.distribution``): the candidate the rule picks (with
#: the point mass at the top of ``top_atom``), or the isotonic distributional regression on its mu.
DISTRIBUTIONS: tuple[str, ...] = ("candidate", "isotonic")


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    """Knobs of :func:`evaluate_predictions` (can be read from a params.yaml section).

    Attributes
    ----------
    per_lp : bool
        Fit standardisation and calibration per language pair (global fallback) or only globally.
    min_lp_rows : int
        Fewest dev rows for an LP-specific fit.
    n_levels : int
        Confidence levels M of the ECE (100 in the papers).
    coverage_gamma : float
        Level of the reported ``coverage@`` / ``width@``.
    conformal_gammas : tuple of float
        Levels of the Gaussian-vs-conformal interval report.
    calibration : str
        The served calibration: ``"auto"`` (the one ``calibration_rule`` picks from the cross-fitted
        dev metrics of ``calibration_candidates``) or a candidate name
        (:data:`uamt.uncertainty.candidates.CANDIDATES`).
    calibration_candidates : tuple of str
        Candidates fitted, cross-fitted on dev and reported (names of
        :data:`~uamt.uncertainty.candidates.CANDIDATES`; default
        :data:`~uamt.uncertainty.candidates.DEFAULT_CANDIDATES`).
    calibration_rule : str
        :data:`uamt.uncertainty.candidates.RULES`.
    lp_coverage_tolerance, quintile_coverage_tolerance : float
        Goals the ``min_goal_ratio`` rule measures the worst per-LP and per LP x quintile cell
        ``|coverage - coverage_gamma|`` against.
    miss_balance_tolerance : float or None
        Goal for the worst per-LP ``|miss rate - (1 - coverage_gamma)/2|`` below and above the
        interval in the ``min_goal_ratio`` rule; None leaves the miss balance out of the rule.
    mu_scaling : str
        How the standardiser puts mu on the human z scale
        (:data:`~uamt.uncertainty.calibrators.MU_SCALINGS`): ``spread`` (slope 1, the papers') or
        ``regression`` (mu's least-squares line on dev per LP, refitted in every cross-fitting fold).
    ece_bound : float
        Slack on the dev ECE of the proper-score fits.
    cross_fit_folds : int
        Document folds of the cross-fitting (dev: candidate choice; test: the papers' k-fold ECE).
    low_score_threshold : float or None
        Human scores at or below it (raw scale; MQM -5 = a major error) get their own coverage.
    risk_thresholds : tuple of float
        Thresholds chi (raw scale) at which the served risk P(Q <= chi) is checked against the
        observed frequency (:mod:`uamt.uncertainty.served`).
    calibration_splits : tuple of str
        Splits (:data:`CALIBRATION_SPLITS`) whose rows the calibrate stage fits each model's served
        calibration on, less any split the model (or a model it builds on) was trained on
        (:func:`uamt.pipeline_config.training_splits`): DUP's error model is trained on ``d_e``, so it is
        calibrated on ``dev`` alone.  Test and out-of-domain rows never enter a fit.
    top_atom : bool
        Serve a point mass at the top of the scale (MQM 0) with its probability per LP x mu bin,
        and the candidate refitted on the rows below it (:mod:`uamt.uncertainty.atom`,
        :func:`uamt.serving.model_calibration.with_top_atom`); the calibrate stage fits it on the
        calibration rows.  False: the candidate alone, clipped to the scale.
    distribution : str
        :data:`DISTRIBUTIONS`: ``candidate`` (serve the candidate, with the point mass of
        ``top_atom``) or ``isotonic`` (the isotonic distributional regression of the human score on
        the candidate's served mu, :mod:`uamt.uncertainty.isotonic`: calibrated at every threshold
        on its rows; ``top_atom`` is then not used).
    sigma_weights : tuple of float
        Weights λ in [0, 1] of the model's σ (:mod:`uamt.uncertainty.tempering`: σ tempered towards
        its LP's median, λ = 1 the model's own, 0 one σ per LP) the calibrate stage chooses from by
        the served distribution's cross-fitted CRPS
        (:func:`uamt.model_evaluation.choose_sigma_weight`); ``(1.0,)``: the model's σ, no choice.
    pinned_sigma_weights : dict of str to float
        ``{model: λ}``: the models served that weight, in domain and for unseen pairs, without a
        choice (:meth:`sigma_weights_for`); the ``exp_sigma_weights`` stage makes their choice again
        after ``register`` (:mod:`uamt.experiments.sigma_weights`).  The others choose from
        ``sigma_weights``.
    unseen_sigma_margin : float or None
        Let rows of a pair the calibration never saw take a σ weight of their own
        (:attr:`uamt.uncertainty.tempering.SigmaTempering.unseen_weight`) from ``sigma_weights``,
        chosen by the served CRPS of LPs held out of model and calibration
        (:func:`uamt.model_evaluation.choose_unseen_sigma_weight`; only for models with
        leave-one-LP-out models), where it beats the in-domain weight's by at least this share
        (0.01: 1 %); None: unseen rows take the in-domain weight.
    risk_lattice_step : float or None
        The score scale's lattice (MQM: 1, whole points): the served risk P(Q <= chi) may read the
        CDF at ``floor(chi / step) * step + offset`` (:func:`uamt.uncertainty.served.lattice_threshold`),
        the offset chosen from ``risk_lattice_offsets`` by the cross-fitted Brier score
        (:func:`uamt.model_evaluation.choose_risk_lattice`); None: a continuous scale, the CDF at chi.
    risk_lattice_offsets : tuple of float
        The offsets tried, each in [0, step) (0: the CDF at chi itself).
    rearrange_in_mu : bool
        Serve the distribution rearranged in mu within each known LP (:mod:`uamt.uncertainty.rearrangement`:
        every interval bound non-decreasing and every risk P(Q <= chi) non-increasing in mu), where
        σ has no weight (:func:`uamt.serving.model_calibration.with_rearrangement`); False: as the
        calibrators give it.
    """

    per_lp: bool = True
    min_lp_rows: int = 50
    n_levels: int = N_CONFIDENCE_LEVELS
    coverage_gamma: float = 0.9
    conformal_gammas: tuple[float, ...] = REPORT_GAMMAS
    calibration: str = "auto"
    calibration_candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    calibration_rule: str = "min_goal_ratio"
    lp_coverage_tolerance: float = 0.03
    quintile_coverage_tolerance: float = 0.05
    miss_balance_tolerance: float | None = 0.015
    mu_scaling: str = "spread"
    ece_bound: float = 0.01
    cross_fit_folds: int = 5
    low_score_threshold: float | None = -5.0
    risk_thresholds: tuple[float, ...] = (-1.0, -5.0, -10.0)
    calibration_splits: tuple[str, ...] = ("dev",)
    top_atom: bool = False
    distribution: str = "candidate"
    sigma_weights: tuple[float, ...] = (1.0,)
    pinned_sigma_weights: dict[str, float] = dataclasses.field(default_factory=dict)
    unseen_sigma_margin: float | None = None
    rearrange_in_mu: bool = False
    risk_lattice_step: float | None = None
    risk_lattice_offsets: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        unknown = [s for s in self.calibration_splits if s not in CALIBRATION_SPLITS]
        if unknown or not self.calibration_splits or len(set(self.calibration_splits)) != len(self.calibration_splits):
            raise ValueError(
                f"calibration_splits={list(self.calibration_splits)!r} not supported; choose one or more distinct "
                f"splits from {sorted(CALIBRATION_SPLITS)} (test and ood are only measured, d_q trains every model)"
            )
        check_candidates(self.calibration_candidates)
        if self.calibration != "auto" and self.calibration not in self.calibration_candidates:
            raise ValueError(
                f"calibration={self.calibration!r} not supported; choose from "
                f"{sorted(['auto', *self.calibration_candidates])}"
            )
        if self.calibration_rule not in RULES:
            raise ValueError(f"calibration_rule={self.calibration_rule!r} not supported; choose from {sorted(RULES)}")
        if self.mu_scaling not in MU_SCALINGS:
            raise ValueError(f"mu_scaling={self.mu_scaling!r} not supported; choose from {sorted(MU_SCALINGS)}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution={self.distribution!r} not supported; choose from {sorted(DISTRIBUTIONS)}")
        if self.miss_balance_tolerance is not None and not self.miss_balance_tolerance > 0:
            raise ValueError(f"miss_balance_tolerance={self.miss_balance_tolerance!r} must be > 0 (or null)")
        weights = list(self.sigma_weights)
        if not weights or len(set(weights)) != len(weights) or not all(0.0 <= w <= 1.0 for w in weights):
            raise ValueError(f"sigma_weights={weights!r} not supported; choose distinct weights in [0, 1] (1: the model's sigma)")
        for model, weight in self.pinned_sigma_weights.items():
            if not (isinstance(weight, int | float) and 0.0 <= weight <= 1.0):
                raise ValueError(f"pinned_sigma_weights.{model}={weight!r} not supported; pin a weight in [0, 1] (1: the model's sigma)")
        offsets, step = list(self.risk_lattice_offsets), self.risk_lattice_step
        if step is not None and not (math.isfinite(step) and step > 0):
            raise ValueError(f"risk_lattice_step={step!r} must be > 0 (or null: a continuous scale)")
        if not offsets or len(set(offsets)) != len(offsets) or not all(0.0 <= o < (step or 1.0) for o in offsets):
            raise ValueError(f"risk_lattice_offsets={offsets!r} not supported; choose distinct offsets in [0, risk_lattice_step)")
        margin = self.unseen_sigma_margin
        if margin is not None and not (math.isfinite(margin) and 0.0 <= margin < 1.0):
            raise ValueError(f"unseen_sigma_margin={margin!r} must be in [0, 1) (or null: no weight of their own for unseen pairs)")

    def sigma_weights_for(self, model: str | None) -> tuple[float, ...]:
        """The σ weights ``model`` chooses from: its pinned one alone, else :attr:`sigma_weights`."""
        if model is not None and model in self.pinned_sigma_weights:
            return (float(self.pinned_sigma_weights[model]),)
        return tuple(self.sigma_weights)


@dataclasses.dataclass(frozen=True)
class PredictionArrays:
    """A validated predictions table: ``lp`` (str), ``human``, ``mu``, ``sigma`` (std), each shape [n]."""

    lp: np.ndarray
    human: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray
    layout: str  # "mu_sigma" or "samples"
    source: str
    #: Spread (std) of the model's real samples around mu -- MC dropout runs, ensemble members, the
    #: ``epistemic`` variance column -- or None where sigma is predicted (HTS, KL, DUP) or a
    #: placeholder (the point estimate).  Only this enters the standardiser's pooled spread.
    sample_sigma: np.ndarray | None = None
    #: Document id per row (``doc`` column, else the source segment ``dataset/lp/seg_id``) for
    #: cross-fitting over documents, or None.
    doc: np.ndarray | None = None
    #: Domain per row (``domain`` column), or None.
    domain: np.ndarray | None = None
    #: What ``doc`` holds: "documents", "source segments" (the fallback), or None.
    doc_unit: str | None = None

    def __len__(self) -> int:
        return int(self.human.size)


# =========================================================================== reading & validation
def _where(source: str, row: int, column: str, from_file: bool) -> str:
    line = f" (line {row + 1})" if from_file else ""
    return f"{source}: row {row}{line}, column {column!r}"


def _number(value: Any, source: str, row: int, column: str, from_file: bool) -> float:
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise DataError(f"{_where(source, row, column, from_file)}: empty value")
        try:
            number = float(text)
        except ValueError:
            raise DataError(f"{_where(source, row, column, from_file)}: {value!r} is not a number") from None
    elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        number = float(value)
    else:
        raise DataError(f"{_where(source, row, column, from_file)}: {value!r} is not a number")
    if not math.isfinite(number):
        raise DataError(f"{_where(source, row, column, from_file)}: {value!r} is not finite (NaN/inf)")
    return number


#: Where sigma comes from (``sigma_source``): ``samples`` -- the spread of real model samples (MC
#: dropout, ensembles); ``model`` -- predicted by the model (HTS, KL, DUP) or a placeholder; ``auto``
#: -- ``samples`` for the samples layout, the ``epistemic`` column's std where there is one (MCD/DE:
#: all of sigma, HTS+MCD: its sample part), else ``model``.
SIGMA_SOURCES = ("auto", "samples", "model")


def prediction_arrays(
    frame: pd.DataFrame, source: str = "predictions", *, from_file: bool = False, sigma_source: str = "auto"
) -> PredictionArrays:
    """Validate a predictions DataFrame and turn it into arrays.

    Layouts: ``lp, human, mu, sigma`` (sigma a standard deviation >= 0) or ``lp, human, samples``
    (``|``-separated floats, or a list per row, at least 2 per row; mu and sigma are the sample
    mean and the ddof=0 sample std as in the papers).  When both ``mu``/``sigma`` and ``samples``
    are present, ``mu``/``sigma`` are used.  Extra columns are ignored.

    Rows are numbered from 1; with ``from_file`` the CSV line (header = line 1) is named too.
    ``sigma_source`` (:data:`SIGMA_SOURCES`) sets :attr:`PredictionArrays.sample_sigma`; optional
    ``doc`` and ``domain`` columns are kept for cross-fitting and conditional coverage.

    Raises
    ------
    uamt.core.errors.DataError
        Naming ``source``, the row and the column: missing column, unknown layout, empty table,
        empty / non-numeric / NaN / inf value, negative sigma, empty lp, fewer than 2 samples.
    """
    if sigma_source not in SIGMA_SOURCES:
        raise ValueError(f"sigma_source={sigma_source!r} not supported; choose from {sorted(SIGMA_SOURCES)}")
    if not isinstance(frame, pd.DataFrame):
        raise DataError(f"{source}: expected a table (pandas DataFrame), got {type(frame).__name__}")
    columns = [str(c).strip() for c in frame.columns]
    frame = frame.set_axis(columns, axis=1)
    found = sorted(columns)
    expected = f"expected columns {', '.join(MU_SIGMA_COLUMNS)} or {', '.join(SAMPLES_COLUMNS)}"
    if {"mu", "sigma"} <= set(columns):
        layout = "mu_sigma"
    elif "samples" in columns:
        layout = "samples"
    elif "mu" in columns or "sigma" in columns:
        missing = sorted({"mu", "sigma"} - set(columns))
        raise DataError(f"{source}: missing column(s) {missing}; {expected}; found {found}")
    else:
        raise DataError(f"{source}: unknown column layout; {expected}; found {found}")
    missing = [c for c in ("lp", "human") if c not in columns]
    if missing:
        raise DataError(f"{source}: missing column(s) {missing}; {expected}; found {found}")
    if len(frame) == 0:
        raise DataError(f"{source}: no data rows")

    n = len(frame)
    lp = np.empty(n, dtype=object)
    human = np.empty(n)
    mu = np.empty(n)
    sigma = np.empty(n)
    lp_values = frame["lp"].tolist()
    human_values = frame["human"].tolist()
    if layout == "mu_sigma":
        mu_values, sigma_values = frame["mu"].tolist(), frame["sigma"].tolist()
    else:
        sample_values = frame["samples"].tolist()
    for i in range(n):
        row = i + 1
        name = lp_values[i]
        if not isinstance(name, str) or not name.strip():
            raise DataError(
                f"{_where(source, row, 'lp', from_file)}: empty or missing language pair ({name!r})"
            )
        lp[i] = name.strip()
        human[i] = _number(human_values[i], source, row, "human", from_file)
        if layout == "mu_sigma":
            mu[i] = _number(mu_values[i], source, row, "mu", from_file)
            sigma[i] = _number(sigma_values[i], source, row, "sigma", from_file)
            if sigma[i] < 0:
                raise DataError(
                    f"{_where(source, row, 'sigma', from_file)}: {sigma_values[i]!r} is negative; "
                    "sigma is a standard deviation"
                )
        else:
            raw = sample_values[i]
            try:
                if isinstance(raw, str):
                    values = parse_samples_field(raw)
                else:
                    values = np.asarray(
                        [_number(v, source, row, "samples", from_file) for v in raw], dtype=float
                    )
            except (ValueError, TypeError) as exc:
                if isinstance(exc, DataError):
                    raise
                raise DataError(f"{_where(source, row, 'samples', from_file)}: {exc}") from None
            if values.size < 2:
                raise DataError(
                    f"{_where(source, row, 'samples', from_file)}: need at least 2 samples, got {values.size}"
                )
            mu[i] = values.mean()
            sigma[i] = values.std(ddof=PAPER_DDOF)
    return PredictionArrays(
        lp=lp,
        human=human,
        mu=mu,
        sigma=sigma,
        layout=layout,
        source=source,
        sample_sigma=_sample_sigma(frame, sigma, layout, sigma_source, source, from_file),
        doc=_document_labels(frame),
        doc_unit="documents" if "doc" in frame.columns else "source segments" if "seg_id" in frame.columns else None,
        domain=_labels(frame, "domain"),
    )


def _sample_sigma(frame, sigma, layout: str, sigma_source: str, source: str, from_file: bool):
    if sigma_source == "model":
        return None
    if layout == "samples" or sigma_source == "samples" and "epistemic" not in frame.columns:
        return sigma
    if "epistemic" not in frame.columns:
        return None
    values = frame["epistemic"].tolist()
    var = np.array([_number(v, source, i + 1, "epistemic", from_file) for i, v in enumerate(values)])
    if np.any(var < 0):
        row = int(np.flatnonzero(var < 0)[0]) + 1
        raise DataError(f"{_where(source, row, 'epistemic', from_file)}: negative; epistemic is a variance")
    return np.sqrt(var)


def _document_labels(frame: pd.DataFrame) -> np.ndarray | None:
    """The ``doc`` column; else the source segment (``dataset``, ``lp``, ``seg_id``: every system's
    translation of one source stays in one fold), which the pipeline's predictions tables carry."""
    docs = _labels(frame, "doc")
    if docs is not None or not {"lp", "seg_id"} <= set(frame.columns):
        return docs
    parts = [frame[c].astype(str) for c in ("dataset", "lp", "seg_id") if c in frame.columns]
    return np.array(["/".join(p) for p in zip(*parts, strict=True)], dtype=object)


def _labels(frame: pd.DataFrame, column: str) -> np.ndarray | None:
    if column not in frame.columns:
        return None
    return np.array([str(v) for v in frame[column].tolist()], dtype=object)


def read_predictions(path: str | Path, sigma_source: str = "auto") -> PredictionArrays:
    """Read and validate a predictions CSV, or parquet by suffix (see :func:`prediction_arrays`).

    Raises
    ------
    uamt.core.errors.DataError
        File missing, empty, not CSV, or any validation error (file, row, line and column named).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    if path.suffix.lower() == ".parquet":  # `uamt predict` writes parquet by default
        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
            raise DataError(f"{path}: not a readable parquet file (truncated or corrupt?): {exc}") from None
        return prediction_arrays(frame, str(path), sigma_source=sigma_source)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: file is empty (no header, no rows)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a readable CSV file: {exc}") from None
    return prediction_arrays(frame, str(path), from_file=True, sigma_source=sigma_source)


# =========================================================================== evaluation
def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    return value


def _lp_metrics(human, mu, sigma, **kwargs) -> dict[str, Any]:
    """:func:`uncertainty_metrics` plus the ENCE (5 sigma bins) and the sigma P90/P10 of one set."""
    metrics = uncertainty_metrics(human, mu, sigma, **kwargs)
    positive = bool(np.all(sigma > 0)) and sigma.size >= 5
    metrics["ence"] = expected_normalized_calibration_error(human, mu, sigma, 5) if positive else None
    metrics["sigma_p90_p10"] = sigma_spread_ratio(sigma) if sigma.size else None
    return metrics


def _method_block(
    human, mu, sigma, lp, settings: EvaluationSettings, *, domain=None, low_human=None, bounds=None
) -> dict[str, Any]:
    """Metrics of one method per LP, macro-averaged and pooled.  ``bounds``: ``(lower, upper)`` at
    ``coverage_gamma`` (shape [n] each) of a method whose interval is not the Gaussian one of
    ``sigma`` (:func:`~uamt.uncertainty.candidates.candidate_interval`): ``coverage@g`` and the
    conditional coverage count it; the other metrics read sigma."""
    kwargs = {"n_levels": settings.n_levels, "coverage_gamma": settings.coverage_gamma}
    tag = f"coverage@{settings.coverage_gamma:g}"
    inside = None if bounds is None else inside_interval(human, mu, sigma, settings.coverage_gamma, bounds)
    per_lp = {}
    for name in sorted(set(lp.tolist())):
        rows = lp == name
        per_lp[name] = _lp_metrics(human[rows], mu[rows], sigma[rows], **kwargs)
        if inside is not None:
            per_lp[name][tag] = float(np.mean(inside[rows]))
    pooled = _lp_metrics(human, mu, sigma, **kwargs)
    if inside is not None:
        pooled[tag] = float(np.mean(inside))
    macro: dict[str, Any] = {"n": int(human.size), "n_lps": len(per_lp)}
    for key in pooled:
        if key == "n":
            continue
        values = [m[key] for m in per_lp.values() if m[key] is not None]
        macro[key] = float(np.mean(values)) if values else None
    expected, observed = reliability_curve(human, mu, sigma, settings.n_levels)
    return {
        "per_lp": per_lp,
        "macro_avg": macro,
        "pooled": pooled,
        "reliability": {"expected": expected.tolist(), "observed": observed.tolist()},
        "conditional": conditional_report(
            human, mu, sigma, lp, settings.coverage_gamma, domain=domain, low_human=low_human, bounds=bounds
        ),
    }


def _applied_params(calibrator, lps) -> dict[str, Any]:
    applied = {}
    for name in lps:
        params, fallback = calibrator.params_for(name)
        applied[name] = {**params, "fallback_to_global": fallback}
    return applied


def _as_arrays(data, source: str, sigma_source: str = "auto") -> PredictionArrays:
    if isinstance(data, PredictionArrays):
        return data
    return prediction_arrays(data, source, sigma_source=sigma_source)


def evaluate_predictions(
    pred_df: pd.DataFrame | PredictionArrays,
    dev_df: pd.DataFrame | PredictionArrays | None = None,
    *,
    settings: EvaluationSettings = EvaluationSettings(),
    pred_source: str = "predictions",
    dev_source: str = "dev",
    sigma_source: str = "auto",
    scope: str = "full",
    fitted: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Indicators of the model and of the fixed-variance baseline on a predictions table.

    Parameters
    ----------
    pred_df : DataFrame or PredictionArrays
        The evaluated split (``lp, human, mu, sigma`` or ``lp, human, samples``; optional ``doc``,
        ``domain``, ``epistemic``).
    dev_df : DataFrame or PredictionArrays, optional
        The calibration split, same layout.  With it: standardisation, the calibration candidates,
        fixed variance and conformal thresholds are fitted on dev and applied to ``pred_df``.
        Without it: raw scores, the model's sigma as is, and the fixed variance fitted in-sample on
        ``pred_df`` (optimistic; flagged in ``settings.baseline_fitted_on``).
    settings : EvaluationSettings
    sigma_source : {"auto", "samples", "model"}
        Whether sigma is a spread of real samples (only then does it enter the standardiser); see
        :data:`SIGMA_SOURCES`.  Ignored for tables passed as :class:`PredictionArrays`.
    scope : {"full", "served", "fixed_variance"}
        How much is computed (:data:`SCOPES`); the served calibration and every block that is
        computed are the same in each scope.  ``"full"``: everything below.  ``"served"``: no
        ``candidates`` test blocks and no ``cross_fitted_ece`` (None) -- the candidates are still
        fitted and cross-fitted on dev, since that picks the served one.  ``"fixed_variance"``: only
        the ``fixed_variance`` block; no candidate is fitted, so the result has no ``model`` block and
        its ``calibration`` (``selected`` None) cannot be served.
    fitted : dict, optional
        The ``calibration`` block of an earlier result with the same ``dev_df`` and ``settings``
        (the calibrate stage keeps its own, :func:`candidate_fits`): its candidates and their
        selection are read instead of fitted and cross-fitted again, which is most of the cost;
        everything else is computed as without it, so the result is the same.
        :class:`CandidateFitsError` (a DataError) where it was fitted on other rows (its
        standardisation differs from ``dev_df``'s), serves another candidate or was chosen by
        another rule than ``settings`` say, names candidates ``settings`` does not list, or cannot
        be read.

    Returns
    -------
    dict (JSON-safe; undefined values are None)
        ``settings``; ``n_segments``; ``lps``; ``methods`` with ``model`` (the selected calibration),
        ``fixed_variance`` and, with dev, ``model_uncalibrated`` -- each ``{per_lp: {lp: metrics},
        macro_avg, pooled, reliability, conditional}`` where metrics are ``n, pps, ups, nll, ece,
        ece_floor, sharpness, coverage@g, width@g, crps, ence, sigma_p90_p10`` and ``conditional`` the
        coverage by LP / domain / mu and sigma quintile / low human score (``conditional_report``);
        ``calibration`` (serialised calibrators, the parameters applied to each LP, ``selected`` and
        ``candidates``); ``candidates`` (per candidate: cross-fitted dev summary and test metrics);
        ``cross_fitted_ece`` (the papers' k-fold protocol on the evaluated split, where it has a
        ``doc`` column); ``intervals`` (Gaussian vs conformal coverage/width rows, with dev only).

    Raises
    ------
    uamt.core.errors.DataError
        Invalid tables, or dev data on which nothing can be fitted (e.g. constant scores).
    """
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} not supported; choose from {sorted(SCOPES)}")
    test = _as_arrays(pred_df, pred_source, sigma_source)
    dev = None if dev_df is None else _as_arrays(dev_df, dev_source, sigma_source)
    lps = sorted(set(test.lp.tolist()))
    result: dict[str, Any] = {
        "settings": {
            **dataclasses.asdict(settings),
            "sigma_ddof": PAPER_DDOF,
            "standardised": dev is not None,
            "sigma_from_samples": None if dev is None else dev.sample_sigma is not None,
            "baseline_fitted_on": "dev" if dev is not None else "predictions (in-sample, optimistic)",
        },
        "predictions": {"source": test.source, "layout": test.layout, "n": len(test)},
        "dev": None if dev is None else {"source": dev.source, "layout": dev.layout, "n": len(dev)},
        "n_segments": len(test),
        "lps": lps,
    }
    common = {"per_lp": settings.per_lp, "min_lp_rows": settings.min_lp_rows}
    low_human = None if settings.low_score_threshold is None else test.human <= settings.low_score_threshold
    try:
        if dev is None:
            human, mu, sigma = test.human, test.mu, test.sigma
            fixed = FixedVarianceCalibrator(**common).fit(human, mu, lp=test.lp)
            methods = {"model": sigma}
            bounds: dict[str, Any] = {}
            calibration: dict[str, Any] = {"fixed_variance": fixed.to_dict()}
        else:
            everything = np.ones(len(dev), dtype=bool)
            standardizer, (dev_h, dev_mu, dev_sigma), _ = standardize(
                dev, everything, everything, common, mu_scaling=settings.mu_scaling
            )
            human = standardizer.transform_human(test.human, test.lp)
            mu, raw_sigma = standardizer.transform_predictions(test.mu, test.sigma, test.lp)
            affine = AffineVarianceCalibrator(**common, n_levels=settings.n_levels).fit(
                dev_h, dev_mu, dev_sigma, lp=dev.lp
            )
            fixed = FixedVarianceCalibrator(**common).fit(dev_h, dev_mu, lp=dev.lp)
            if scope == "fixed_variance":
                methods, bounds = {}, {}
                calibration = {
                    "standardizer": standardizer.to_dict(),
                    "affine_variance": affine.to_dict(),
                    "fixed_variance": fixed.to_dict(),
                    "selected": None,
                    "selection": {"skipped": f"scope={scope!r}"},
                }
            else:
                if fitted is None:
                    candidates = _fit_candidates(dev, dev_h, dev_mu, dev_sigma, affine, settings, common)
                    chosen = _select(dev, candidates, settings, common)
                else:
                    candidates, chosen = _read_candidates(fitted, standardizer, affine, settings, dev.source)
                methods, bounds, calibration = _served(
                    test, dev, (human, mu, raw_sigma), (dev_h, dev_mu, dev_sigma), standardizer, affine, fixed,
                    settings, common, result, low_human, lps, candidates, chosen, report_candidates=scope == "full",
                )
        methods["fixed_variance"] = fixed.transform(mu, lp=test.lp)
        result["methods"] = {
            name: _method_block(
                human, mu, sig, test.lp, settings, domain=test.domain, low_human=low_human, bounds=bounds.get(name)
            )
            for name, sig in methods.items()
        }
        result["cross_fitted_ece"] = _papers_cross_fitted_ece(test, settings, common) if scope == "full" else None
    except DataError:
        raise
    except ValueError as exc:
        where = dev.source if dev is not None else test.source
        raise DataError(f"{where}: cannot evaluate/calibrate: {exc}") from None
    result["calibration"] = calibration
    return _json_safe(result)


def _served(
    test, dev, test_z, dev_z, standardizer, affine, fixed, settings, common, result, low_human, lps, candidates, chosen,
    *, report_candidates,
):
    """Apply the candidates fitted on dev and the served one (``chosen``: :func:`_select`'s
    ``(selected, selection)``), and (``report_candidates``) put every candidate's test block in
    ``result["candidates"]``; returns ``(methods sigmas, methods bounds, calibration)`` -- the bounds
    only of a served candidate with an interval of its own."""
    (human, mu, raw_sigma), (dev_h, dev_mu, dev_sigma) = test_z, dev_z
    selected, selection = chosen
    test_sigmas = {
        name: candidate_sigma(calibrator, mu, raw_sigma, test.lp, settings.coverage_gamma)
        for name, calibrator in candidates.items()
    }
    test_bounds = {
        name: candidate_interval(calibrator, mu, raw_sigma, test.lp, settings.coverage_gamma)
        for name, calibrator in candidates.items()
    }
    methods = {"model": test_sigmas[selected], "model_uncalibrated": raw_sigma}
    bounds = {} if test_bounds[selected] is None else {"model": test_bounds[selected]}
    calibration = {
        "standardizer": standardizer.to_dict(),
        "affine_variance": affine.to_dict(),
        "fixed_variance": fixed.to_dict(),
        "selected": selected,
        "selection": selection,
        "candidates": {name: c.to_dict() for name, c in candidates.items()},
        "applied": {
            "standardizer": _applied_params(standardizer, lps),
            "affine_variance": _applied_params(affine, lps),
            "fixed_variance": _applied_params(fixed, lps),
        },
    }
    if report_candidates:
        # A candidate whose Gaussian-equivalent sigma is unbounded somewhere (a conformal level beyond
        # reach of a small dev cell) has no Gaussian-shaped test block to report.
        result["candidates"] = {
            name: {
                "cross_fitted_dev": selection["summaries"].get(name),
                "test": _method_block(
                    human, mu, sig, test.lp, settings, domain=test.domain, low_human=low_human, bounds=test_bounds[name]
                ),
            }
            for name, sig in test_sigmas.items()
            if np.all(np.isfinite(sig))
        }
    if np.all(dev_sigma > 0):
        conformal = ConformalCalibrator(gammas=settings.conformal_gammas, **common).fit(
            dev_h, dev_mu, dev_sigma, lp=dev.lp
        )
        calibration["conformal"] = conformal.to_dict()
        result["intervals"] = interval_report(
            human,
            mu,
            gaussian_sigma=methods["model"],
            conformal=conformal,
            conformal_sigma=raw_sigma,
            lp=test.lp,
            gammas=settings.conformal_gammas,
        )
    else:
        result["intervals"] = None
        calibration["conformal"] = None
        calibration["conformal_skipped"] = "some dev sigma is 0: cannot normalise conformal scores"
    return methods, bounds, calibration


def _fit_candidates(dev, dev_h, dev_mu, dev_sigma, affine, settings: EvaluationSettings, common) -> dict[str, Any]:
    """Every candidate fitted on the whole (standardised) dev set; the papers' affine fit is reused."""
    fitted = {}
    for name in settings.calibration_candidates:
        if name == "affine_ece":
            fitted[name] = affine
            continue
        try:
            fitted[name] = fit_candidate(
                name, dev_h, dev_mu, dev_sigma, dev.lp, common=common, n_levels=settings.n_levels, ece_bound=settings.ece_bound
            )
        except ValueError:  # e.g. conformal or a proper-score fit with a zero sigma on dev
            continue
    return fitted


def candidate_fits(result: dict[str, Any]) -> dict[str, Any]:
    """What ``evaluate_predictions(..., fitted=...)`` reads back from a ``result`` fitted on dev: the
    standardisation (to recognise the rows), every candidate's fit and the selection."""
    calibration = result["calibration"]
    return {key: calibration[key] for key in ("standardizer", "selected", "selection", "candidates")}


class CandidateFitsError(DataError):
    """Stored candidate fits (``evaluate_predictions(..., fitted=...)``) that do not fit the rows or
    the settings: the caller, who read them, names their file."""


def _read_candidates(fitted: dict[str, Any], standardizer, affine, settings: EvaluationSettings, source: str):
    """``(candidates, (selected, selection))`` of :func:`candidate_fits`' block, checked against the
    dev rows' own standardisation and ``settings``; the papers' affine fit is the one refitted here."""
    try:
        stored, selected, rule = fitted["candidates"], fitted["selected"], fitted["selection"]["rule"]
        selection, same_rows = fitted["selection"], _json_safe(fitted["standardizer"]) == _json_safe(standardizer.to_dict())
    except KeyError as exc:
        raise CandidateFitsError(f"{source}: the stored candidate fits lack {exc}; fit them again") from None
    except TypeError as exc:
        raise CandidateFitsError(f"{source}: the stored candidate fits are malformed ({exc}); fit them again") from None
    if not same_rows:
        raise CandidateFitsError(f"{source}: the stored candidate fits were fitted on other rows (their standardisation differs)")
    if rule != settings.calibration_rule or settings.calibration not in ("auto", selected):
        raise CandidateFitsError(
            f"{source}: the stored candidate fits serve {selected!r} (rule={rule!r}); the settings say "
            f"calibration={settings.calibration!r}, rule={settings.calibration_rule!r}"
        )
    unknown = sorted(set(stored) - set(settings.calibration_candidates))
    if unknown or selected not in stored:
        raise CandidateFitsError(
            f"{source}: the stored candidate fits name {sorted(stored)} (selected {selected!r}); "
            f"the settings list {list(settings.calibration_candidates)}"
        )
    try:
        candidates = {
            name: affine if name == "affine_ece" else candidate_from_dict(stored, name)
            for name in settings.calibration_candidates
            if name in stored
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CandidateFitsError(f"{source}: a stored candidate fit cannot be read ({exc}); fit them again") from None
    return candidates, (selected, selection)


def _select(dev: PredictionArrays, candidates: dict[str, Any], settings: EvaluationSettings, common) -> tuple[str, dict]:
    """The served candidate and how it was chosen: the rule on out-of-fold dev predictions, where
    dev has enough documents for ``cross_fit_folds`` folds (else on in-sample dev predictions)."""
    names = list(candidates)
    gamma = settings.coverage_gamma
    n_docs = 0 if dev.doc is None else np.unique(dev.doc).size
    if n_docs >= settings.cross_fit_folds:
        folds = document_folds(dev.doc, settings.cross_fit_folds)
        human_z, mu_z, sigmas, bounds = cross_fitted_sigmas(
            dev, folds, names, common=common, n_levels=settings.n_levels, ece_bound=settings.ece_bound, gamma=gamma,
            with_bounds=True, mu_scaling=settings.mu_scaling,
        )
        on = f"dev, {settings.cross_fit_folds}-fold cross-fitted over {n_docs} {dev.doc_unit}"
    else:
        everything = np.ones(len(dev), dtype=bool)
        _, (human_z, mu_z, sigma_z), _ = standardize(dev, everything, everything, common, mu_scaling=settings.mu_scaling)
        sigmas = {n: candidate_sigma(c, mu_z, sigma_z, dev.lp, gamma) for n, c in candidates.items()}
        bounds = {n: candidate_interval(c, mu_z, sigma_z, dev.lp, gamma) for n, c in candidates.items()}
        on = "dev, in-sample (no doc column to cross-fit over)"
    summaries = {
        name: (
            candidate_summary(human_z, mu_z, sig, dev.lp, gamma, settings.n_levels, bounds=bounds.get(name), doc=dev.doc)
            if np.all(np.isfinite(sig)) and np.all(sig > 0)
            else None
        )
        for name, sig in sigmas.items()
    }
    chosen = select_candidate(
        summaries,
        settings.calibration_rule,
        settings.lp_coverage_tolerance,
        settings.quintile_coverage_tolerance,
        settings.miss_balance_tolerance,
    )
    selected = chosen if settings.calibration == "auto" else settings.calibration
    if selected not in candidates:
        raise ValueError(f"calibration={selected!r} could not be fitted on dev")
    return selected, {"rule": settings.calibration_rule, "rule_choice": chosen, "on": on, "summaries": summaries}


def _papers_cross_fitted_ece(test: PredictionArrays, settings: EvaluationSettings, common) -> dict[str, Any] | None:
    """The papers' k-fold protocol on the evaluated split itself, where it has document ids."""
    if test.doc is None or np.unique(test.doc).size < settings.cross_fit_folds:
        return None
    folds = document_folds(test.doc, settings.cross_fit_folds)
    return {**cross_fitted_ece(test, folds, common=common, n_levels=settings.n_levels), "folds_over": test.doc_unit}


def metrics_table(result: dict[str, Any], methods: list[str] | None = None) -> pd.DataFrame:
    """Flatten :func:`evaluate_predictions` output into one row per (method, lp).

    ``lp`` takes each language pair, then ``"macro_avg"`` and ``"pooled"``.  Columns: ``method, lp,
    n`` and the metric keys (``pps, ups, nll, ece, sharpness, coverage@g, width@g, crps``).
    """
    rows = []
    for method, block in result["methods"].items():
        if methods is not None and method not in methods:
            continue
        for lp, metrics in block["per_lp"].items():
            rows.append({"method": method, "lp": lp, **metrics})
        rows.append(
            {
                "method": method,
                "lp": "macro_avg",
                **{k: v for k, v in block["macro_avg"].items() if k != "n_lps"},
            }
        )
        rows.append({"method": method, "lp": "pooled", **block["pooled"]})
    return pd.DataFrame(rows)


#: Columns of :func:`candidates_table` (test metrics of each calibration candidate).
CANDIDATE_COLUMNS = (
    "coverage@g",
    "lp_coverage_error",
    "sigma_quintile_coverage_error",
    "mu_quintile_coverage_error",
    "low_score_coverage",
    "ence",
    "sigma_p90_p10",
    "ece",
    "nll",
)


def candidates_table(result: dict[str, Any]) -> pd.DataFrame:
    """One row per calibration candidate: its test metrics (macro over LPs where per LP) and
    whether the rule selected it; ``coverage@g`` is the pooled coverage at ``coverage_gamma``."""
    tag = f"coverage@{result['settings']['coverage_gamma']:g}"
    rows = []
    for name, block in (result.get("candidates") or {}).items():
        test = block["test"]
        conditional = test["conditional"]
        low = conditional.get("low_score") or {}
        rows.append(
            {
                "candidate": name,
                "selected": name == result["calibration"]["selected"],
                "coverage@g": test["pooled"][tag],
                "lp_coverage_error": conditional["lp_coverage_error"],
                "sigma_quintile_coverage_error": conditional["sigma_quintile_coverage_error"],
                "mu_quintile_coverage_error": conditional["mu_quintile_coverage_error"],
                "low_score_coverage": low.get("coverage"),
                "ence": test["macro_avg"]["ence"],
                "sigma_p90_p10": test["macro_avg"]["sigma_p90_p10"],
                "ece": test["macro_avg"]["ece"],
                "nll": test["macro_avg"]["nll"],
            }
        )
    return pd.DataFrame(rows, columns=["candidate", "selected", *CANDIDATE_COLUMNS])


# =========================================================================== files
def clustered_ece_floor(table: pd.DataFrame, n_levels: int = N_CONFIDENCE_LEVELS) -> dict[str, dict[str, float]]:
    """Per LP: the effective sample size and the ECE of a perfectly calibrated model at that size.

    Translations of one source segment (``seg_id`` within an LP) share its difficulty, so their
    errors are correlated; :func:`~uamt.uncertainty.metrics.effective_sample_size` of the
    standardised residuals :math:`(q^* - \\hat\\mu)/\\hat\\sigma` (or :math:`q^* - \\hat\\mu` without
    sigma) within source segments gives :math:`n_{eff}`, and
    :func:`~uamt.uncertainty.metrics.ece_sampling_floor` at :math:`n_{eff}` the ECE expected from
    sampling noise alone.  ``table``: columns ``lp, seg_id, human, mu[, sigma]``.
    """
    from uamt.uncertainty.metrics import ece_sampling_floor, effective_sample_size

    out = {}
    for lp, group in table.groupby("lp", sort=True):
        residual = (group["human"] - group["mu"]).to_numpy(dtype=float)
        if "sigma" in group.columns and group["sigma"].notna().all() and (group["sigma"] > 0).all():
            residual = residual / group["sigma"].to_numpy(dtype=float)
        n_eff = effective_sample_size(residual, group["seg_id"].astype(str).to_numpy())
        out[str(lp)] = {"n_eff": n_eff, "ece_floor": ece_sampling_floor(max(1, round(n_eff)), n_levels)}
    return out


def write_json_atomic(data: Any, path: str | Path) -> None:
    """Write ``data`` as strict JSON to ``path`` via a temp file in the same folder + ``os.replace``.

    Raises
    ------
    uamt.core.errors.DataError
        If the folder of ``path`` does not exist or is not writable; nothing is left behind.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise DataError(f"{path}: output folder {folder} does not exist")
    atomic_write_json(path, data, indent=2, sort_keys=False, allow_nan=False)


def evaluate_prediction_files(
    predictions: str | Path,
    out: str | Path,
    dev: str | Path | None = None,
    settings: EvaluationSettings = EvaluationSettings(),
    sigma_source: str = "auto",
) -> dict[str, Any]:
    """CSV files in, metrics JSON out (atomically); returns the result dict.

    The output folder is checked before any work so a typo fails fast; on any error no output
    file is created or modified.
    """
    out = Path(out)
    if not out.parent.is_dir():
        raise DataError(f"{out}: output folder {out.parent} does not exist")
    test = read_predictions(predictions, sigma_source)
    dev_arrays = read_predictions(dev, sigma_source) if dev is not None else None
    result = evaluate_predictions(test, dev_arrays, settings=settings)
    write_json_atomic(result, out)
    return result
