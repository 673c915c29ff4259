"""Segment and system scores with calibrated intervals from a :class:`uamt.serving.predictor.Predictor`.

System score
    The mean of the segment means, :math:`\\bar\\mu = \\frac1n \\sum_i \\hat\\mu_i`.  Assuming
    independent segment errors, its standard deviation is
    :math:`\\sigma_{sys} = \\sqrt{\\sum_i \\hat\\sigma_i^2} / n` and the interval is the central
    Gaussian one at the requested confidence.  The bootstrap alternative resamples segments with
    replacement (test-set sampling variability) and draws each resampled segment's quality from
    :math:`\\mathcal N(\\hat\\mu_i, \\hat\\sigma_i^2)` (prediction uncertainty); its interval is the
    percentile interval of the resampled means.

Scale bounds
    Where the predictor's scale has bounds (MQM: [-25, 0], ...), segment ``mu``/``lower``/``upper``
    come clipped from the predictor (``clipped`` column) and the system intervals are clipped to
    the same range; the summary gives ``scale_range`` and ``n_clipped``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError, UamtError
from uamt.core.naming import qe_registered_name
from uamt.serving.predictor import Predictor
from uamt.uncertainty.metrics import gaussian_interval

DEFAULT_MODEL_NAME = "uamt-comet"
DEFAULT_ALIAS = "champion"
REF_COMBINATIONS = ("average", "sample")

INDEPENDENCE_ASSUMPTION = (
    "independent segment errors: sigma_sys = sqrt(sum sigma_i^2) / n, Gaussian interval around mean(mu)"
)
CLIPPING_NOTE = (
    "mu, lower, upper and the system intervals are clipped to scale_range (column clipped); risk is "
    "P(Q <= chi) under the served distribution censored at the range: unchanged for chi inside it"
)
BOOTSTRAP_METHOD = (
    "segments resampled with replacement, each resampled quality drawn from N(mu_i, sigma_i^2); "
    "percentile interval of the resampled means"
)


def model_name_from_params(params_path: str | Path | None) -> str:
    """``register.model_name`` of the params file when present, else ``uamt-comet``."""
    from uamt.core.config import ConfigError, read_params

    if params_path is None or not Path(params_path).is_file():
        return DEFAULT_MODEL_NAME
    params = read_params(params_path)
    section = params.get("register") or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{params_path}:register: expected a mapping, got {type(section).__name__}")
    name = section.get("model_name", DEFAULT_MODEL_NAME)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{params_path}:register.model_name: expected a non-empty str, got {name!r}")
    return name


def default_model_uri(*, reference_free: bool, params_path: str | Path | None = None) -> str:
    """``models:/<name>@champion`` (reference-based) or ``models:/<name>-qe@champion`` (reference-free)."""
    name = model_name_from_params(params_path)
    if reference_free:
        name = qe_registered_name(name)
    return f"models:/{name}@{DEFAULT_ALIAS}"


def load_scoring_predictor(
    model: str | None, *, has_references: bool, params_path=None
) -> tuple[Predictor, str]:
    """Load the predictor named by ``model`` (or the default for the inputs) and check it fits them.

    Raises
    ------
    uamt.core.errors.UamtError
        The model cannot be loaded (for the default reference-free model: "no reference-free model
        registered ..."), or it is reference-free but references were given, or it needs
        references and none were given.
    """
    from uamt.serving.predictor import load_predictor

    uri = model or default_model_uri(reference_free=not has_references, params_path=params_path)
    try:
        predictor = load_predictor(uri)
    except UamtError as exc:
        if model is None and not has_references:
            raise UamtError(
                f"no reference-free (QE) model registered: {uri} could not be loaded. Scoring without "
                "-r/--ref needs a model trained with --reference-free and registered as "
                f"'{uri.split('/', 1)[1].split('@')[0]}' with alias @{DEFAULT_ALIAS}; or pass references "
                f"with -r, or --model. ({exc})"
            ) from exc
        raise
    check_signature(predictor, has_references=has_references, model=uri)
    return predictor, uri


def check_signature(predictor: Predictor, *, has_references: bool, model: str) -> None:
    """Refuse a reference-free model given references, and a reference model given none."""
    if has_references and not predictor.uses_references:
        raise UamtError(
            f"{model} is a reference-free (QE) model ({predictor.method}) but references were given; "
            "drop -r/--ref or choose a reference-based model with --model"
        )
    if not has_references and predictor.uses_references:
        raise UamtError(
            f"{model} is a reference-based model ({predictor.method}) and needs references: pass "
            "-r/--ref REF.txt, or choose a reference-free (QE) model with --model"
        )


def build_frame(
    src: Sequence[str],
    mt: Sequence[str],
    refs: Sequence[Sequence[str]] = (),
    *,
    ref_combination: str = "average",
    seed: int = 0,
    lp: str | None = None,
) -> pd.DataFrame:
    """The predictor's input frame for aligned ``src`` / ``mt`` lines and zero or more reference files.

    Parameters
    ----------
    refs : sequence of reference files' lines, shape [n_references][n_segments]
        One file -> column ``ref``.  Several -> ``average``: column ``refs`` (list of every
        reference; the predictor averages its per-reference predictions, §3.4), or ``sample``:
        column ``ref`` with one reference per segment drawn uniformly at random with ``seed``
        (the S-N variant; the same draw for every system scored with the same seed).
    lp : str, optional
        Language pair ``xx-yy`` of every segment (column ``lp``): selects per-LP calibration where
        the model has it.
    """
    if ref_combination not in REF_COMBINATIONS:
        raise UamtError(
            f"ref_combination={ref_combination!r} not supported; choose from {list(REF_COMBINATIONS)}"
        )
    frame = pd.DataFrame({"src": list(src), "mt": list(mt)})
    if lp is not None:
        frame["lp"] = lp
    if len(refs) == 1:
        frame["ref"] = list(refs[0])
    elif len(refs) > 1:
        per_segment = list(zip(*refs, strict=True))
        if ref_combination == "average":
            frame["refs"] = [list(options) for options in per_segment]
        else:
            picks = sample_reference_indices(len(frame), len(refs), seed)
            frame["ref"] = [options[k] for options, k in zip(per_segment, picks, strict=True)]
    return frame


def sample_reference_indices(n_segments: int, n_references: int, seed: int) -> np.ndarray:
    """Which reference each segment uses in ``sample`` mode: uniform, seeded, shape [n_segments]."""
    return np.random.default_rng(seed).integers(0, n_references, size=n_segments)


def predict(
    predictor: Predictor,
    frame: pd.DataFrame,
    *,
    confidence: float,
    risk_threshold: float,
    batch_size: int,
    progress: bool,
) -> pd.DataFrame:
    """``predictor.predict_frame`` with its output checked (columns present, one row per input)."""
    from uamt.serving.scorer import check_output

    out = predictor.predict_frame(
        frame, confidence=confidence, risk_threshold=risk_threshold, batch_size=batch_size, progress=progress
    )
    return check_output(out, len(frame))


def validate_settings(
    *, confidence: float, batch_size: int = 1, max_risk: float | None = None, bootstrap: int = 0
) -> None:
    """Refuse out-of-range options with a message naming the option."""
    from uamt.serving.scorer import check_confidence

    check_confidence(confidence, "--confidence")
    if batch_size < 1:
        raise UamtError(f"--batch-size must be >= 1, got {batch_size}")
    if max_risk is not None and not (0.0 <= max_risk <= 1.0):
        raise UamtError(f"--max-risk must be a probability in [0, 1], got {max_risk}")
    if bootstrap < 0:
        raise UamtError(f"--bootstrap must be >= 0, got {bootstrap}")


@dataclass(frozen=True)
class SystemScore:
    """System-level score: mean of mu with its independence-based and (optional) bootstrap intervals."""

    mean: float
    sigma: float
    lower: float
    upper: float
    n_segments: int
    bootstrap_lower: float | None = None
    bootstrap_upper: float | None = None
    bootstrap_sigma: float | None = None
    n_bootstrap: int = 0

    def as_dict(self, prefix: str = "system_") -> dict[str, Any]:
        out: dict[str, Any] = {
            f"{prefix}score": self.mean,
            f"{prefix}sigma": self.sigma,
            f"{prefix}lower": self.lower,
            f"{prefix}upper": self.upper,
        }
        if self.n_bootstrap:
            out.update(
                {
                    f"{prefix}bootstrap_sigma": self.bootstrap_sigma,
                    f"{prefix}bootstrap_lower": self.bootstrap_lower,
                    f"{prefix}bootstrap_upper": self.bootstrap_upper,
                    "n_bootstrap": self.n_bootstrap,
                }
            )
        return out


def bootstrap_means(mu, sigma, n_bootstrap: int, rng: np.random.Generator, idx=None) -> np.ndarray:
    """Resampled system means, shape [n_bootstrap] (see module docstring).

    ``idx`` (shape [n_bootstrap, n_segments]) lets paired comparisons share the resampled segments.
    """
    mu = np.asarray(mu, dtype=float)
    sigma = np.asarray(sigma, dtype=float)
    n = mu.size
    if idx is None:
        idx = rng.integers(0, n, size=(n_bootstrap, n))
    draws = mu[idx] + sigma[idx] * rng.standard_normal(idx.shape)
    return draws.mean(axis=1)


def system_score(
    mu, sigma, confidence: float, *, n_bootstrap: int = 0, seed: int = 0, bounds=None
) -> SystemScore:
    """System score of one system's segments (formulas in the module docstring).

    Parameters
    ----------
    mu, sigma : array_like, shape [n_segments]
        Segment means and standard deviations.
    confidence : float
        Level of the central interval, in (0, 1).
    n_bootstrap : int
        Bootstrap resamples (0 = none).
    bounds : (low, high), optional
        The scale's range: the intervals are clipped to it.
    """
    mu = np.asarray(mu, dtype=float)
    sigma = np.asarray(sigma, dtype=float)
    n = mu.size
    if n == 0:
        raise DataError("no segments to score")
    mean = float(mu.mean())
    sys_sigma = float(math.sqrt(float(np.sum(sigma**2))) / n)
    lower, upper = gaussian_interval([mean], [sys_sigma], confidence)
    result = {
        "mean": mean,
        "sigma": sys_sigma,
        "lower": float(lower[0]),
        "upper": float(upper[0]),
        "n_segments": n,
    }
    if n_bootstrap:
        means = _chunked_bootstrap(mu, sigma, n_bootstrap, np.random.default_rng(seed))
        alpha = (1.0 - confidence) / 2.0
        lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
        result.update(
            bootstrap_lower=float(lo),
            bootstrap_upper=float(hi),
            bootstrap_sigma=float(means.std(ddof=1)) if n_bootstrap > 1 else 0.0,
            n_bootstrap=n_bootstrap,
        )
    if bounds is not None:
        low, high = bounds
        for key in ("lower", "upper", "bootstrap_lower", "bootstrap_upper"):
            if key in result:
                result[key] = float(min(max(result[key], low), high))
    return SystemScore(**result)


def _chunked_bootstrap(mu, sigma, n_bootstrap: int, rng: np.random.Generator, chunk_cells: int = 2_000_000):
    """:func:`bootstrap_means` in chunks so memory stays ~chunk_cells floats whatever the input size."""
    per_chunk = max(1, chunk_cells // max(1, len(mu)))
    parts = []
    done = 0
    while done < n_bootstrap:
        k = min(per_chunk, n_bootstrap - done)
        parts.append(bootstrap_means(mu, sigma, k, rng))
        done += k
    return np.concatenate(parts)


def segment_records(
    out: pd.DataFrame,
    *,
    flag_below: float | None = None,
    max_risk: float | None = None,
    risk_threshold: float | None = None,
    flag_risk=None,
) -> list[dict[str, Any]]:
    """One record per segment: ``line`` (1-based), mu, sigma, lower, upper, risk, variances, flags.

    ``flagged`` = P(Q <= flag_below) > max_risk.  When
    ``flag_below`` differs from the ``risk_threshold`` the ``risk`` column was computed at, the
    served P(Q <= flag_below) must be given as ``flag_risk`` (shape [n]; the predictor's own risk
    at that threshold, never a Gaussian stand-in) and is added as a column of that name.
    """
    from uamt.serving.scorer import output_columns

    table = out[output_columns(out)].astype(float)
    if "clipped" in out.columns:
        table["clipped"] = out["clipped"].astype(bool)
    if flag_below is not None:
        if max_risk is None:
            raise UamtError("--flag-below needs --max-risk")
        from uamt.serving.scorer import FlagSettings, flag_columns

        flags = flag_columns(table["risk"].to_numpy(), risk_threshold, FlagSettings(flag_below, max_risk), flag_risk)
        for column, values in flags.items():
            table[column] = values
    records = table.to_dict(orient="records")
    return [{"line": i, **record} for i, record in enumerate(records, start=1)]


def score_summary(
    predictor: Predictor,
    out: pd.DataFrame,
    *,
    model: str,
    confidence: float,
    risk_threshold: float,
    n_bootstrap: int = 0,
    seed: int = 0,
    n_references: int = 0,
    ref_combination: str | None = None,
    flag_below: float | None = None,
    max_risk: float | None = None,
    records: Sequence[dict[str, Any]] = (),
    truncated: dict[str, list[int]] | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The summary record: scale (and its range), model, settings, system score and intervals,
    flag and clipping counts, lines the encoder truncated."""
    bounds = getattr(predictor.scale, "bounds", None)
    system = system_score(
        out["mu"], out["sigma"], confidence, n_bootstrap=n_bootstrap, seed=seed, bounds=bounds
    )
    summary: dict[str, Any] = {
        "scale": predictor.scale.name,
        "scale_description": predictor.scale.description,
        **({"scale_range": list(bounds)} if bounds is not None else {}),
        "method": predictor.method,
        "model": model,
        "n_segments": len(out),
        "n_references": n_references,
        "confidence": confidence,
        "risk_threshold": risk_threshold,
        **system.as_dict(),
        "system_interval_assumption": INDEPENDENCE_ASSUMPTION,
    }
    if n_references > 1:
        summary["ref_combination"] = ref_combination
    if n_bootstrap:
        summary["bootstrap_method"] = BOOTSTRAP_METHOD
    if n_bootstrap or (n_references > 1 and ref_combination == "sample"):
        summary["seed"] = seed
    if flag_below is not None:
        summary.update(
            flag_below=flag_below,
            max_risk=max_risk,
            n_flagged=int(sum(bool(r.get("flagged")) for r in records)),
        )
    if "clipped" in out.columns:
        summary["n_clipped"] = int(out["clipped"].astype(bool).sum())
        summary["clipping"] = CLIPPING_NOTE
    if truncated:
        summary["truncated_lines"] = {name: lines for name, lines in truncated.items() if lines}
        summary["max_tokens"] = max_tokens
    return summary


def truncated_lines(predictor: Predictor, texts: dict[str, Sequence[str]]) -> dict[str, list[int]]:
    """file name -> 1-based lines longer than the encoder reads (scored on their beginning only);
    empty when the predictor cannot tell (no ``truncated`` method)."""
    check = getattr(predictor, "truncated", None)
    if not callable(check):
        return {}
    return {name: [i + 1 for i in check(list(lines))] for name, lines in texts.items()}


def truncation_warning(command: str, truncated: dict[str, list[int]], max_tokens: int | None) -> str | None:
    """One warning line naming the truncated lines per file (at most 10 each), or None."""
    parts = []
    for name, lines in truncated.items():
        if lines:
            shown = ", ".join(map(str, lines[:10])) + (f" (+{len(lines) - 10} more)" if len(lines) > 10 else "")
            parts.append(f"{name}: line{'s' if len(lines) > 1 else ''} {shown}")
    if not parts:
        return None
    limit = f"{max_tokens} tokens" if max_tokens else "its maximum length"
    return (
        f"uamt {command}: warning: longer than the encoder reads ({limit}), scored on their beginning "
        f"only: {'; '.join(parts)}"
    )
