"""Evaluate a predictions table: standardise and calibrate on dev, then report the papers' indicators.

Library entry points:

* :func:`evaluate_predictions` -- DataFrames in, JSON-safe dict out (called by the pipeline's
  evaluate stage and by ``uamt evaluate-predictions``);
* :func:`evaluate_prediction_files` -- CSV paths in, metrics JSON written atomically;
* :func:`metrics_table` -- the result flattened into method x LP rows;
* :func:`read_predictions` / :func:`prediction_arrays` -- validated loading of the
  ``lp, human, mu, sigma`` or ``lp, human, samples`` layouts.

Procedure with a dev set (Glushkova et al., 2021, §5.2): human scores and predictions are
standardised with dev statistics (:class:`~uamt.uncertainty.calibration.Standardizer`); the model's
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

from uamt.errors import DataError
from uamt.fileio import atomic_write_json
from uamt.uncertainty.calibration import AffineVarianceCalibrator, FixedVarianceCalibrator, Standardizer
from uamt.uncertainty.conformal import REPORT_GAMMAS, ConformalCalibrator, interval_report
from uamt.uncertainty.metrics import N_CONFIDENCE_LEVELS, reliability_curve, uncertainty_metrics
from uamt.uncertainty.samples import PAPER_DDOF, parse_samples_field

MU_SIGMA_COLUMNS = ("lp", "human", "mu", "sigma")
SAMPLES_COLUMNS = ("lp", "human", "samples")
METRIC_KEYS = ("pps", "ups", "nll", "ece", "sharpness", "crps")


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
    """

    per_lp: bool = True
    min_lp_rows: int = 50
    n_levels: int = N_CONFIDENCE_LEVELS
    coverage_gamma: float = 0.9
    conformal_gammas: tuple[float, ...] = REPORT_GAMMAS


@dataclasses.dataclass(frozen=True)
class PredictionArrays:
    """A validated predictions table: ``lp`` (str), ``human``, ``mu``, ``sigma`` (std), each shape [n]."""

    lp: np.ndarray
    human: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray
    layout: str  # "mu_sigma" or "samples"
    source: str

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


def prediction_arrays(
    frame: pd.DataFrame, source: str = "predictions", *, from_file: bool = False
) -> PredictionArrays:
    """Validate a predictions DataFrame and turn it into arrays.

    Layouts: ``lp, human, mu, sigma`` (sigma a standard deviation >= 0) or ``lp, human, samples``
    (``|``-separated floats, or a list per row, at least 2 per row; mu and sigma are the sample
    mean and the ddof=0 sample std as in the papers).  When both ``mu``/``sigma`` and ``samples``
    are present, ``mu``/``sigma`` are used.  Extra columns are ignored.

    Rows are numbered from 1; with ``from_file`` the CSV line (header = line 1) is named too.

    Raises
    ------
    uamt.errors.DataError
        Naming ``source``, the row and the column: missing column, unknown layout, empty table,
        empty / non-numeric / NaN / inf value, negative sigma, empty lp, fewer than 2 samples.
    """
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
    return PredictionArrays(lp=lp, human=human, mu=mu, sigma=sigma, layout=layout, source=source)


def read_predictions(path: str | Path) -> PredictionArrays:
    """Read and validate a predictions CSV, or parquet by suffix (see :func:`prediction_arrays`).

    Raises
    ------
    uamt.errors.DataError
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
        return prediction_arrays(frame, str(path))
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: file is empty (no header, no rows)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a readable CSV file: {exc}") from None
    return prediction_arrays(frame, str(path), from_file=True)


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


def _method_block(human, mu, sigma, lp, settings: EvaluationSettings) -> dict[str, Any]:
    kwargs = {"n_levels": settings.n_levels, "coverage_gamma": settings.coverage_gamma}
    per_lp = {}
    for name in sorted(set(lp.tolist())):
        rows = lp == name
        per_lp[name] = uncertainty_metrics(human[rows], mu[rows], sigma[rows], **kwargs)
    pooled = uncertainty_metrics(human, mu, sigma, **kwargs)
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
    }


def _applied_params(calibrator, lps) -> dict[str, Any]:
    applied = {}
    for name in lps:
        params, fallback = calibrator.params_for(name)
        applied[name] = {**params, "fallback_to_global": fallback}
    return applied


def _as_arrays(data, source: str) -> PredictionArrays:
    return data if isinstance(data, PredictionArrays) else prediction_arrays(data, source)


def evaluate_predictions(
    pred_df: pd.DataFrame | PredictionArrays,
    dev_df: pd.DataFrame | PredictionArrays | None = None,
    *,
    settings: EvaluationSettings = EvaluationSettings(),
    pred_source: str = "predictions",
    dev_source: str = "dev",
) -> dict[str, Any]:
    """Indicators of the model and of the fixed-variance baseline on a predictions table.

    Parameters
    ----------
    pred_df : DataFrame or PredictionArrays
        The evaluated split (``lp, human, mu, sigma`` or ``lp, human, samples``).
    dev_df : DataFrame or PredictionArrays, optional
        The calibration split, same layout.  With it: standardisation, affine calibration, fixed
        variance and conformal thresholds are fitted on dev and applied to ``pred_df``.  Without it:
        raw scores, the model's sigma as is, and the fixed variance fitted in-sample on ``pred_df``
        (optimistic; flagged in ``settings.baseline_fitted_on``).
    settings : EvaluationSettings

    Returns
    -------
    dict (JSON-safe; undefined values are None)
        ``settings``; ``n_segments``; ``lps``; ``methods`` with ``model``, ``fixed_variance`` and,
        with dev, ``model_uncalibrated`` -- each ``{per_lp: {lp: metrics}, macro_avg, pooled,
        reliability}`` where metrics are ``n, pps, ups, nll, ece, sharpness, coverage@g, width@g,
        crps``; ``calibration`` (serialised calibrators and the parameters applied to each LP);
        ``intervals`` (Gaussian vs conformal coverage/width rows, with dev only).

    Raises
    ------
    uamt.errors.DataError
        Invalid tables, or dev data on which nothing can be fitted (e.g. constant scores).
    """
    test = _as_arrays(pred_df, pred_source)
    dev = None if dev_df is None else _as_arrays(dev_df, dev_source)
    lps = sorted(set(test.lp.tolist()))
    result: dict[str, Any] = {
        "settings": {
            **dataclasses.asdict(settings),
            "sigma_ddof": PAPER_DDOF,
            "standardised": dev is not None,
            "baseline_fitted_on": "dev" if dev is not None else "predictions (in-sample, optimistic)",
        },
        "predictions": {"source": test.source, "layout": test.layout, "n": len(test)},
        "dev": None if dev is None else {"source": dev.source, "layout": dev.layout, "n": len(dev)},
        "n_segments": len(test),
        "lps": lps,
    }
    common = {"per_lp": settings.per_lp, "min_lp_rows": settings.min_lp_rows}
    try:
        if dev is None:
            human, mu, sigma = test.human, test.mu, test.sigma
            fixed = FixedVarianceCalibrator(**common).fit(human, mu, lp=test.lp)
            methods = {"model": sigma}
            calibration: dict[str, Any] = {"fixed_variance": fixed.to_dict()}
        else:
            standardizer = Standardizer(**common).fit(dev.human, dev.mu, dev.sigma, lp=dev.lp)
            dev_h = standardizer.transform_human(dev.human, dev.lp)
            dev_mu, dev_sigma = standardizer.transform_predictions(dev.mu, dev.sigma, dev.lp)
            human = standardizer.transform_human(test.human, test.lp)
            mu, raw_sigma = standardizer.transform_predictions(test.mu, test.sigma, test.lp)
            affine = AffineVarianceCalibrator(**common, n_levels=settings.n_levels).fit(
                dev_h, dev_mu, dev_sigma, lp=dev.lp
            )
            fixed = FixedVarianceCalibrator(**common).fit(dev_h, dev_mu, lp=dev.lp)
            model_sigma = affine.transform(mu, raw_sigma, test.lp)
            methods = {"model": model_sigma, "model_uncalibrated": raw_sigma}
            calibration = {
                "standardizer": standardizer.to_dict(),
                "affine_variance": affine.to_dict(),
                "fixed_variance": fixed.to_dict(),
                "applied": {
                    "standardizer": _applied_params(standardizer, lps),
                    "affine_variance": _applied_params(affine, lps),
                    "fixed_variance": _applied_params(fixed, lps),
                },
            }
            if np.all(dev_sigma > 0):
                conformal = ConformalCalibrator(gammas=settings.conformal_gammas, **common).fit(
                    dev_h, dev_mu, dev_sigma, lp=dev.lp
                )
                calibration["conformal"] = conformal.to_dict()
                result["intervals"] = interval_report(
                    human,
                    mu,
                    gaussian_sigma=model_sigma,
                    conformal=conformal,
                    conformal_sigma=raw_sigma,
                    lp=test.lp,
                    gammas=settings.conformal_gammas,
                )
            else:
                result["intervals"] = None
                calibration["conformal"] = None
                calibration["conformal_skipped"] = "some dev sigma is 0: cannot normalise conformal scores"
        methods["fixed_variance"] = fixed.transform(mu, lp=test.lp)
        result["methods"] = {
            name: _method_block(human, mu, sig, test.lp, settings) for name, sig in methods.items()
        }
    except DataError:
        raise
    except ValueError as exc:
        where = dev.source if dev is not None else test.source
        raise DataError(f"{where}: cannot evaluate/calibrate: {exc}") from None
    result["calibration"] = calibration
    return _json_safe(result)


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
    uamt.errors.DataError
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
) -> dict[str, Any]:
    """CSV files in, metrics JSON out (atomically); returns the result dict.

    The output folder is checked before any work so a typo fails fast; on any error no output
    file is created or modified.
    """
    out = Path(out)
    if not out.parent.is_dir():
        raise DataError(f"{out}: output folder {out.parent} does not exist")
    test = read_predictions(predictions)
    dev_arrays = read_predictions(dev) if dev is not None else None
    result = evaluate_predictions(test, dev_arrays, settings=settings)
    write_json_atomic(result, out)
    return result
