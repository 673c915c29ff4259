"""Issue 15's interval goals, measured from :func:`~uamt.uncertainty.evaluate_predictions` results.

:func:`interval_summary` condenses one model's test result (``scope="full"``: with the candidates
and the papers' cross-fitted ECE) and its out-of-domain result into the block the evaluate stage
writes to ``metrics/conditional.json``: conditional coverage (per LP, domain, predicted-mu and
sigma quintile, with the worst gap of each), coverage of the low human scores (MQM <= -5), ENCE and
sigma P90/P10 per LP, the fixed dev -> test ECE with its sampling floor next to the papers' k-fold
cross-fitted ECE, the candidates table (which one the rule picked) and the held-out LPs.
:func:`goal_rows` judges that block against :data:`GOALS`; the report, the register stage (MLflow)
and ``benchmarks/calibration_candidates.py`` all read them from here.
"""

from __future__ import annotations

import math
from typing import Any

#: Issue 15's goals: (key, text, target).  ``key`` names the measured value in :func:`goal_rows`.
GOALS: tuple[tuple[str, str, str], ...] = (
    ("lp_coverage_error", "coverage@0.9 within ±3 points in every LP", "max |cov - 0.9| <= 0.03"),
    ("sigma_quintile_coverage_error", "coverage within ±5 points in every sigma quintile", "<= 0.05"),
    ("mu_quintile_coverage_error", "coverage within ±5 points in every predicted-mu quintile", "<= 0.05"),
    ("low_score_coverage", "coverage of segments with human score <= -5", ">= 0.80"),
    ("sigma_p90_p10_min", "calibrated sigma P90/P10 in every LP (smallest)", ">= 1.5"),
    ("ence", "ENCE below the affine (papers') calibration's", "< affine ENCE"),
    ("ece_max_where_floor_allows", "ECE on the fixed split, LPs whose floor is below 0.02 (largest)", "<= 0.02"),
    ("unseen_sigma_ratio", "held-out LPs: RMS calibrated sigma / in-domain", ">= 1.3"),
    ("unseen_coverage_min", "held-out LPs: coverage@0.9 (smallest)", ">= 0.85"),
)
LP_TOLERANCE, QUINTILE_TOLERANCE, LOW_SCORE_COVERAGE = 0.03, 0.05, 0.80
SIGMA_SPREAD, ECE_GOAL, UNSEEN_SIGMA_RATIO, UNSEEN_COVERAGE = 1.5, 0.02, 1.3, 0.85


def _rms_sigma(per_lp: dict[str, dict], lps) -> float | None:
    """Mean over ``lps`` of sqrt(sharpness) (sharpness = mean calibrated sigma^2, z units)."""
    values = [math.sqrt(per_lp[lp]["sharpness"]) for lp in lps if per_lp.get(lp, {}).get("sharpness") is not None]
    return sum(values) / len(values) if values else None


def unseen_lps(ood_result: dict[str, Any]) -> list[str]:
    """LPs of an evaluated split that the dev calibration has no fit of its own for (global fallback)."""
    applied = (ood_result.get("calibration") or {}).get("applied") or {}
    standardizer = applied.get("standardizer") or {}
    return sorted(lp for lp, params in standardizer.items() if params.get("fallback_to_global"))


def interval_summary(
    test_result: dict[str, Any],
    test_metrics: dict[str, dict],
    ood_result: dict[str, Any] | None = None,
    ood_metrics: dict[str, dict] | None = None,
    *,
    block: str = "model",
) -> dict[str, Any]:
    """The ``metrics/conditional.json`` block of one model.

    Parameters
    ----------
    test_result, ood_result : dict
        :func:`~uamt.uncertainty.evaluate_predictions` on test (``scope="full"``) and out-of-domain.
    test_metrics, ood_metrics : dict
        ``{"avg": {...}, lp: {...}}`` of the calibrated model (the evaluate stage's
        ``metrics/test.json`` entry: per LP ``coverage@0.9``, ``ece``, ``ece_floor``, ``sharpness``...).
    block : str
        The calibrated block of ``methods`` (``fixed_variance`` for the point estimate).
    """
    gamma = test_result["settings"]["coverage_gamma"]
    tag = f"coverage@{gamma:g}"
    conditional = test_result["methods"][block]["conditional"]
    cross = test_result.get("cross_fitted_ece") or {}
    lps = [lp for lp in test_metrics if lp != "avg"]
    per_lp = {
        lp: {
            "coverage": test_metrics[lp].get(tag),
            "ence": test_metrics[lp].get("ence"),
            "sigma_p90_p10": test_metrics[lp].get("sigma_p90_p10"),
            "ece": test_metrics[lp].get("ece"),
            "ece_floor": test_metrics[lp].get("ece_floor"),
            "cross_fitted_ece": (cross.get("per_lp") or {}).get(lp),
        }
        for lp in lps
    }
    avg = test_metrics.get("avg", {})
    calibration = test_result.get("calibration") or {}
    candidates = {
        name: _candidate_row(c["test"], tag) for name, c in (test_result.get("candidates") or {}).items()
    }
    summary: dict[str, Any] = {
        "coverage_gamma": gamma,
        "served": calibration.get("selected") if block == "model" else block,
        "rule": (calibration.get("selection") or {}).get("rule"),
        "coverage": test_result["methods"][block]["pooled"].get(tag),
        "conditional": conditional,
        "per_lp": per_lp,
        "ece": {
            "fixed_dev_to_test": avg.get("ece"),
            "floor": avg.get("ece_floor"),
            "cross_fitted": cross.get("macro_avg"),
            "cross_fitted_folds": cross.get("n_folds"),
            "cross_fitted_over": cross.get("folds_over"),
        },
        "ence": avg.get("ence"),
        "candidates": candidates,
        "held_out": None,
    }
    if ood_result is not None and ood_metrics is not None:
        unseen = [lp for lp in unseen_lps(ood_result) if lp in ood_metrics]
        in_domain, held_out = _rms_sigma(test_metrics, lps), _rms_sigma(ood_metrics, unseen)
        coverages = [ood_metrics[lp].get(tag) for lp in unseen if ood_metrics[lp].get(tag) is not None]
        summary["held_out"] = {
            "lps": unseen,
            "rms_sigma": held_out,
            "rms_sigma_in_domain": in_domain,
            "sigma_ratio": None if not (held_out and in_domain) else held_out / in_domain,
            "coverage_min": min(coverages) if coverages else None,
            "coverage_by_lp": {lp: ood_metrics[lp].get(tag) for lp in unseen},
            "coverage_by_domain": ood_result["methods"][block]["conditional"].get("by_domain"),
        }
    summary["goals"] = goal_rows(summary)
    return summary


def _candidate_row(test: dict[str, Any], tag: str) -> dict[str, Any]:
    conditional = test["conditional"]
    return {
        "coverage": test["pooled"][tag],
        "lp_coverage_error": conditional["lp_coverage_error"],
        "sigma_quintile_coverage_error": conditional["sigma_quintile_coverage_error"],
        "mu_quintile_coverage_error": conditional["mu_quintile_coverage_error"],
        "low_score_coverage": (conditional.get("low_score") or {}).get("coverage"),
        "ence": test["macro_avg"]["ence"],
        "sigma_p90_p10_min": _min([m.get("sigma_p90_p10") for m in test["per_lp"].values()]),
        "ece": test["macro_avg"]["ece"],
        "nll": test["macro_avg"]["nll"],
    }


def _min(values) -> float | None:
    values = [v for v in values if v is not None]
    return min(values) if values else None


def _at_most(value, target) -> bool | None:
    return None if value is None else bool(value <= target)


def _at_least(value, target) -> bool | None:
    return None if value is None else bool(value >= target)


def goal_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per :data:`GOALS` entry: ``goal, target, value, met`` (None = not measurable), and
    ``note`` (the ECE floor, the affine ENCE, the held-out LPs)."""
    conditional = summary["conditional"]
    per_lp = summary["per_lp"]
    affine = (summary.get("candidates") or {}).get("affine_ece")
    affine_ence = None if affine is None else affine["ence"]
    floored = {lp: m for lp, m in per_lp.items() if m["ece_floor"] is not None and m["ece_floor"] < ECE_GOAL}
    eces = [m["ece"] for m in floored.values() if m["ece"] is not None]
    ece_max = max(eces) if eces else None
    held_out = summary.get("held_out") or {}
    low = conditional.get("low_score") or {}
    values = {
        "lp_coverage_error": (conditional["lp_coverage_error"], _at_most(conditional["lp_coverage_error"], LP_TOLERANCE), None),
        "sigma_quintile_coverage_error": (
            conditional["sigma_quintile_coverage_error"],
            _at_most(conditional["sigma_quintile_coverage_error"], QUINTILE_TOLERANCE),
            None,
        ),
        "mu_quintile_coverage_error": (
            conditional["mu_quintile_coverage_error"],
            _at_most(conditional["mu_quintile_coverage_error"], QUINTILE_TOLERANCE),
            None,
        ),
        "low_score_coverage": (low.get("coverage"), _at_least(low.get("coverage"), LOW_SCORE_COVERAGE), f"n={low.get('n')}"),
        "sigma_p90_p10_min": (
            _min([m["sigma_p90_p10"] for m in per_lp.values()]),
            _at_least(_min([m["sigma_p90_p10"] for m in per_lp.values()]), SIGMA_SPREAD),
            None,
        ),
        "ence": (
            summary.get("ence"),
            None if affine_ence is None or summary.get("ence") is None else bool(summary["ence"] < affine_ence),
            None if affine_ence is None else f"affine {affine_ence:.3f}",
        ),
        "ece_max_where_floor_allows": (
            ece_max,
            _at_most(ece_max, ECE_GOAL),
            "floor " + ", ".join(f"{lp} {m['ece_floor']:.3f}" for lp, m in per_lp.items() if m["ece_floor"] is not None),
        ),
        "unseen_sigma_ratio": (
            held_out.get("sigma_ratio"),
            _at_least(held_out.get("sigma_ratio"), UNSEEN_SIGMA_RATIO),
            "LPs " + (", ".join(held_out.get("lps") or []) or "none"),
        ),
        "unseen_coverage_min": (
            held_out.get("coverage_min"),
            _at_least(held_out.get("coverage_min"), UNSEEN_COVERAGE),
            None,
        ),
    }
    return [
        {"key": key, "goal": text, "target": target, "value": values[key][0], "met": values[key][1], "note": values[key][2]}
        for key, text, target in GOALS
    ]


def headline_metrics(summaries: dict[str, dict[str, Any]], prefix: str = "conditional") -> dict[str, float]:
    """Flat MLflow metrics ``<prefix>.<method>.<goal key>`` (measured values) and
    ``<prefix>.<method>.goals_met`` (how many goals are met), skipping unmeasurable ones."""
    out = {}
    for method, summary in summaries.items():
        rows = summary["goals"]
        for row in rows:
            if row["value"] is not None:
                out[f"{prefix}.{method}.{row['key']}"] = float(row["value"])
        if summary["ece"].get("cross_fitted") is not None:
            out[f"{prefix}.{method}.cross_fitted_ece"] = float(summary["ece"]["cross_fitted"])
        out[f"{prefix}.{method}.goals_met"] = float(sum(row["met"] is True for row in rows))
    return out
