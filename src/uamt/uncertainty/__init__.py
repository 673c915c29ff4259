"""Uncertainty metrics, calibration and conformal intervals of uncertainty-aware MT evaluation.

``sigma`` is always a standard deviation and ``var`` a variance; arrays are ``[n_segments]``
(samples ``[n_segments, n_samples]``).  Metric names follow scikit-learn: ``*_score`` higher is
better, ``*_loss`` / ``*_error`` lower is better.
"""

from uamt.uncertainty.calibration import (
    GLOBAL,
    AffineVarianceCalibrator,
    FixedVarianceCalibrator,
    Standardizer,
    fit_affine_variance,
    fixed_variance,
)
from uamt.uncertainty.conformal import REPORT_GAMMAS, ConformalCalibrator, conformal_quantile, interval_report
from uamt.uncertainty.evaluate import (
    EvaluationSettings,
    PredictionArrays,
    evaluate_prediction_files,
    evaluate_predictions,
    metrics_table,
    prediction_arrays,
    read_predictions,
    write_json_atomic,
)
from uamt.uncertainty.metrics import (
    N_CONFIDENCE_LEVELS,
    confidence_levels,
    expected_calibration_error,
    gaussian_crps,
    gaussian_crps_loss,
    gaussian_interval,
    gaussian_nll,
    gaussian_nll_loss,
    interval_coverage,
    mean_interval_width,
    predictive_pearson_score,
    probit,
    reliability_curve,
    sharpness_loss,
    standardized_abs_error,
    translation_risk,
    uncertainty_metrics,
    uncertainty_pearson_score,
)
from uamt.uncertainty.samples import (
    PAPER_DDOF,
    average_over_references,
    combine_heteroscedastic_samples,
    parse_samples_field,
    samples_to_mu_sigma,
)

__all__ = [
    "GLOBAL",
    "N_CONFIDENCE_LEVELS",
    "PAPER_DDOF",
    "REPORT_GAMMAS",
    "AffineVarianceCalibrator",
    "ConformalCalibrator",
    "EvaluationSettings",
    "FixedVarianceCalibrator",
    "PredictionArrays",
    "Standardizer",
    "average_over_references",
    "combine_heteroscedastic_samples",
    "confidence_levels",
    "conformal_quantile",
    "evaluate_prediction_files",
    "evaluate_predictions",
    "expected_calibration_error",
    "fit_affine_variance",
    "fixed_variance",
    "gaussian_crps",
    "gaussian_crps_loss",
    "gaussian_interval",
    "gaussian_nll",
    "gaussian_nll_loss",
    "interval_coverage",
    "interval_report",
    "mean_interval_width",
    "metrics_table",
    "parse_samples_field",
    "prediction_arrays",
    "predictive_pearson_score",
    "probit",
    "read_predictions",
    "reliability_curve",
    "samples_to_mu_sigma",
    "sharpness_loss",
    "standardized_abs_error",
    "translation_risk",
    "uncertainty_metrics",
    "uncertainty_pearson_score",
    "write_json_atomic",
]
