"""The interval goals, measured on the served distribution (:mod:`uamt.uncertainty.served`).

:func:`served_summary` condenses one model's served metrics on test and on the out-of-domain split
into the block the evaluate stage writes to ``metrics/conditional.json``: per LP the coverage, the
lower / upper misses, ENCE and UPS of the served sd next to the model's raw sigma, the LP x quintile
cells, the risk reliability at each threshold; the worst cells over all LPs; the point estimate +
the same calibration as the baseline the method must beat; the LPs without a dev calibration of
their own (held out); the candidates analysis.  :func:`goal_rows` judges that block against
:data:`GOALS`; the report and the register stage (MLflow) read them from here.
"""

from __future__ import annotations

import math
from typing import Any

#: The goals: (key, text, target).  ``key`` names the measured value in :func:`goal_rows`.
GOALS: tuple[tuple[str, str, str], ...] = (
    ("worst_sd_cell_gap", "coverage@0.9 within ±5 points in every LP x served-sd quintile", "|gap| <= 0.05"),
    ("worst_mu_cell_gap", "coverage@0.9 within ±5 points in every LP x served-mu quintile", "|gap| <= 0.05"),
    ("lp_coverage_error", "coverage@0.9 within ±3 points in every LP", "max |cov - 0.9| <= 0.03"),
    ("low_score_coverage", "coverage of segments with human score <= -5 (all LPs)", ">= 0.85"),
    ("miss_balance_error", "lower and upper misses at 0.9 each within 0.05 ± 0.015 (worst LP)", "<= 0.015"),
    ("risk_max_gap", "risk P(Q <= chi): |observed - predicted| per decile, every LP and chi", "<= 0.05"),
    ("ece_max_where_floor_allows", "ECE, LPs whose document-clustered floor is below 0.02 (largest)", "<= 0.02"),
    ("crps_vs_baseline", "CRPS minus that of the point estimate + the same calibration", "< 0"),
    ("unseen_coverage_error", "held-out LPs: |coverage@0.9 - 0.9| (largest)", "<= 0.05"),
)
#: The note of ``unseen_coverage_error`` where the out-of-domain split is not measured yet: the
#: ``evaluate_ood`` stage (after ``register``) writes ``metrics/held_out.json``, :func:`with_held_out`.
UNSEEN_NOT_YET = "measured after register: evaluate_ood's metrics/held_out.json"
LP_TOLERANCE, CELL_TOLERANCE, LOW_SCORE_COVERAGE, MISS_TOLERANCE = 0.03, 0.05, 0.85, 0.015
RISK_TOLERANCE, ECE_GOAL, UNSEEN_TOLERANCE = 0.05, 0.02, 0.05
#: Each goal's bound: a row is ``within_band`` when its value lies within its sampling band
#: (``band``: 1.96 document-clustered standard errors) of this bound.
BOUNDS: dict[str, float] = {
    "worst_sd_cell_gap": CELL_TOLERANCE,
    "worst_mu_cell_gap": CELL_TOLERANCE,
    "lp_coverage_error": LP_TOLERANCE,
    "low_score_coverage": LOW_SCORE_COVERAGE,
    "miss_balance_error": MISS_TOLERANCE,
    "risk_max_gap": RISK_TOLERANCE,
    "ece_max_where_floor_allows": ECE_GOAL,
    "crps_vs_baseline": 0.0,
    "unseen_coverage_error": UNSEEN_TOLERANCE,
}
if set(BOUNDS) != {key for key, _, _ in GOALS}:  # pragma: no cover - a goal added without its bound
    raise RuntimeError(f"goals without a bound: {sorted({key for key, _, _ in GOALS} ^ set(BOUNDS))}")
#: Family-wise error of :func:`goal_rows`' ``beyond_chance``: a miss of a worst-of-K goal is beyond
#: chance when some member lies beyond its bound by more than the Bonferroni quantile
#: :math:`z_K = \Phi^{-1}(1 - \alpha / (2K))` of its own standard errors (1.96 for K = 1).
FAMILY_ALPHA = 0.05


def _per_lp(full: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {lp: m for lp, m in full.items() if lp not in ("avg", "worst_cells")}


def _lp_row(m: dict[str, Any], tag: str) -> dict[str, Any]:
    return {
        "n": m["n"],
        "coverage": m.get(f"coverage@{tag}"),
        "width": m.get(f"width@{tag}"),
        "miss_below": m.get(f"miss_below@{tag}"),
        "miss_above": m.get(f"miss_above@{tag}"),
        "low_score_coverage": m.get("low_score_coverage"),
        "low_score_n": m.get("low_score_n"),
        "pps": m.get("pps"),
        "crps": m.get("crps"),
        "ups": m.get("ups"),
        "ups_raw": m.get("ups_raw"),
        "ence": m.get("ence"),
        "ence_raw": m.get("ence_raw"),
        "sigma_p90_p10": m.get("sigma_p90_p10"),
        "ece": m.get("ece"),
        "ece_floor": m.get("ece_floor"),
        "n_eff": m.get("n_eff"),
        "cells": {kind: block["cells"] for kind, block in m["cells"].items()},
        "risk": {chi: {k: v for k, v in r.items()} for chi, r in m["risk"].items()},
    }


def served_summary(
    test: dict[str, Any],
    ood: dict[str, Any] | None,
    *,
    served: str,
    rule: str | None,
    known_lps,
    baseline: dict[str, Any] | None = None,
    baseline_name: str | None = None,
    analysis: dict[str, Any] | None = None,
    settings=None,
    crps_delta_se: float | None = None,
    held_out_pending: bool = False,
) -> dict[str, Any]:
    """The ``metrics/conditional.json`` block of one model.

    Parameters
    ----------
    test, ood : dict
        The model's served metrics (:func:`uamt.model_evaluation.measure`) on test and out of domain.
    served : str
        The served calibration (candidate name, or ``fixed_variance``).
    known_lps : iterable of str
        LPs with a dev calibration of their own: the other LPs of ``ood`` are the held-out ones.
    baseline, baseline_name : dict, str
        The served metrics on test of the point estimate + the same calibration, and its name.
    crps_delta_se : float
        Document-clustered standard error of the CRPS difference to the baseline, paired over the
        same test rows (:func:`uamt.uncertainty.metrics.macro_mean_se`); the band of that goal.
    analysis : dict
        :func:`~uamt.uncertainty.evaluate_predictions` on test with every candidate refitted on dev
        (its ``candidates`` table and the papers' cross-fitted ECE are reported beside).
    held_out_pending : bool
        ``ood`` is measured later (the ``evaluate_ood`` stage, after ``register``): the block says so
        (``held_out_pending``, and the ``unseen_coverage_error`` goal's note) until
        :func:`with_held_out` completes it.  False (a campaign's block, for instance): none to measure.
    """
    gamma = 0.9 if settings is None else settings.coverage_gamma
    tag = f"{gamma:g}"
    per_lp = {lp: _lp_row(m, tag) for lp, m in _per_lp(test).items()}
    avg = test["avg"]
    analysis = analysis or {}
    cross = analysis.get("cross_fitted_ece") or {}
    summary: dict[str, Any] = {
        "coverage_gamma": gamma,
        "served": served,
        "rule": rule,
        "coverage": avg.get(f"coverage@{tag}"),
        "width": avg.get(f"width@{tag}"),
        "per_lp": per_lp,
        "worst_cells": test.get("worst_cells"),
        "ece": {
            "served": avg.get("ece"),
            "floor": avg.get("ece_floor"),
            "papers_cross_fitted": cross.get("macro_avg"),
            "papers_cross_fitted_folds": cross.get("n_folds"),
        },
        "ence": avg.get("ence"),
        "ence_raw": avg.get("ence_raw"),
        "ups": avg.get("ups"),
        "ups_raw": avg.get("ups_raw"),
        "crps": avg.get("crps"),
        "low_score_coverage": _pooled_low(per_lp),
        "baseline": None,
        "candidates": {
            name: _candidate_row(c["test"], f"coverage@{tag}") for name, c in (analysis.get("candidates") or {}).items()
        },
        "held_out": None,
    }
    if baseline is not None:
        b_avg = baseline["avg"]
        b_worst = baseline.get("worst_cells") or {}
        summary["baseline"] = {
            "name": baseline_name,
            "crps": b_avg.get("crps"),
            "pps": b_avg.get("pps"),
            "ece": b_avg.get("ece"),
            "coverage": b_avg.get(f"coverage@{tag}"),
            "width": b_avg.get(f"width@{tag}"),
            "low_score_coverage": _pooled_low(_per_lp(baseline)),
            "worst_sd_cell_gap": (b_worst.get("sd") or {}).get("gap"),
            "worst_mu_cell_gap": (b_worst.get("mu") or {}).get("gap"),
            "crps_delta": None if avg.get("crps") is None or b_avg.get("crps") is None else avg["crps"] - b_avg["crps"],
            "crps_delta_se": crps_delta_se,
        }
    if ood is not None:
        summary["held_out"] = held_out_block(ood, known_lps, avg.get(f"width@{tag}"), gamma)
    elif held_out_pending:
        summary["held_out_pending"] = True
    summary["goals"] = goal_rows(summary)
    return summary


def held_out_block(ood: dict[str, Any], known_lps, in_domain_width: float | None, gamma: float = 0.9) -> dict[str, Any]:
    """The ``held_out`` block of a :func:`served_summary`: per LP of ``ood`` (the model's served
    metrics out of domain) that has no dev calibration of its own (not in ``known_lps``), the
    coverage and mean width at ``gamma`` and the effective size; ``in_domain_width`` (the test
    width at ``gamma``) beside them.  What the ``unseen_coverage_error`` goal judges."""
    tag = f"{gamma:g}"
    known = set(map(str, known_lps))
    unseen = {lp: m for lp, m in _per_lp(ood).items() if lp not in known}
    return {
        "lps": sorted(unseen),
        "coverage_by_lp": {lp: m.get(f"coverage@{tag}") for lp, m in unseen.items()},
        "width_by_lp": {lp: m.get(f"width@{tag}") for lp, m in unseen.items()},
        "n_eff_by_lp": {lp: m.get("n_eff") for lp, m in unseen.items()},
        "in_domain_width": in_domain_width,
    }


def with_held_out(conditional: dict[str, Any], held_out: dict[str, Any] | None) -> dict[str, Any]:
    """``metrics/conditional.json`` (model -> :func:`served_summary`, written by ``evaluate`` before
    the out-of-domain split is scored) completed with ``metrics/held_out.json`` (model -> its
    :func:`held_out_block`, written by ``evaluate_ood`` after ``register``): each model's block set
    and its goal rows judged again, so that every goal, ``unseen_coverage_error`` included, is read
    from one summary.  Models without a block, and a missing ``held_out`` (None: not yet run), are
    returned as they are.  Neither argument is modified."""
    if not held_out:
        return conditional
    out = {}
    for method, summary in conditional.items():
        block = held_out.get(method)
        if isinstance(summary, dict) and "per_lp" in summary and block is not None:
            summary = {k: v for k, v in summary.items() if k != "held_out_pending"}
            summary["held_out"] = block
            summary["goals"] = goal_rows(summary)
        out[method] = summary
    return out


def _pooled_low(per_lp: dict[str, dict[str, Any]]) -> float | None:
    """Coverage of the low-score rows of all LPs together (each LP weighted by its low-score rows)."""
    pairs = [(m.get("low_score_coverage"), m.get("low_score_n") or 0) for m in per_lp.values()]
    pairs = [(c, n) for c, n in pairs if c is not None and n]
    total = sum(n for _, n in pairs)
    return sum(c * n for c, n in pairs) / total if total else None


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


def _se(rate: float, n_eff) -> float | None:
    """Binomial standard error at ``rate`` of a rate measured on ``n_eff`` document-clustered rows;
    None without an effective size."""
    if n_eff is None or n_eff <= 0:
        return None
    return math.sqrt(rate * (1.0 - rate) / n_eff)


def _band(rate: float, n_eff) -> float | None:
    """1.96 standard errors (:func:`_se`); None without an effective size."""
    se = _se(rate, n_eff)
    return None if se is None else 1.96 * se


def _pooled_low_band(per_lp: dict[str, dict[str, Any]]) -> float | None:
    """1.96 standard errors of :func:`_pooled_low`: each LP's low-score rows weighted by their
    share, at the LP's design effect (``n_eff / n``: its rows cluster by document as all its rows
    do); None where an LP lacks ``n_eff``."""
    rows = [m for m in per_lp.values() if m.get("low_score_coverage") is not None and m.get("low_score_n")]
    total = sum(m["low_score_n"] for m in rows)
    if not total or any(not m.get("n_eff") or not m.get("n") for m in rows):
        return None
    var = 0.0
    for m in rows:
        p, n_low = m["low_score_coverage"], m["low_score_n"]
        n_eff_low = max(1.0, n_low * m["n_eff"] / m["n"])
        var += (n_low / total) ** 2 * p * (1.0 - p) / n_eff_low
    return 1.96 * math.sqrt(var)


def _within(value, bound: float, band) -> bool | None:
    """Whether ``value`` lies within its sampling ``band`` of the goal's ``bound`` (so one sample does
    not decide the verdict); None where either is unknown."""
    return None if value is None or band is None else bool(abs(value - bound) <= band)


def family_z(members: int, alpha: float = FAMILY_ALPHA) -> float:
    """Bonferroni quantile :math:`z_K = \\Phi^{-1}(1 - \\alpha / (2K))` for the worst of ``members``
    (K) values each judged two-sided: 1.96 for one, 3.02 for 20, 3.53 for 120 at α = 0.05."""
    from scipy.special import ndtri

    if members < 1:
        raise ValueError(f"members={members!r} must be at least 1")
    return float(ndtri(1.0 - alpha / (2.0 * members)))


def _beyond_chance(met, members: list[tuple[float, float | None]] | None) -> bool | None:
    """Whether a missed goal stays missed as the worst of its ``members``: ``(excess, se)`` per
    member, ``excess`` its distance beyond its own bound (positive = outside) and ``se`` its
    document-clustered standard error (None where unknown).  True where some member's excess exceeds
    :func:`family_z` (K = every member) of its standard errors; False for a met goal; None where the
    goal is unmeasured or no member has a standard error."""
    if met is None or not members:
        return None
    known = [(excess, se) for excess, se in members if se is not None and se > 0]
    if not known:
        return None
    if met:
        return False
    z = family_z(len(members))
    return bool(any(excess > z * se for excess, se in known))


def _cell_members(per_lp: dict[str, Any], kind: str) -> list[tuple[float, float | None]]:
    """``(|gap| - tolerance, se)`` of every LP x quintile cell of ``kind`` (``sd`` or ``mu``)."""
    return [
        (abs(c["gap"]) - CELL_TOLERANCE, c.get("se"))
        for m in per_lp.values()
        for c in ((m.get("cells") or {}).get(kind) or {}).values()
        if c.get("gap") is not None
    ]


def _risk_members(per_lp: dict[str, Any]) -> list[tuple[float, float | None]]:
    """``(|observed - predicted| - tolerance, se)`` of every risk decile (every LP and chi)."""
    return [
        (abs(b["observed"] - b["predicted"]) - RISK_TOLERANCE, b.get("se"))
        for m in per_lp.values()
        for r in m["risk"].values()
        for b in r.get("bins") or []
    ]


def _risk_band_note(per_lp: dict[str, Any]) -> str:
    """``"; k/N deciles beyond ±0.05 + 1.96 se"``: the risk bins (every LP and chi) whose gap exceeds
    the tolerance by more than their document-clustered sampling band (empty without bands)."""
    bins = [(excess, se) for excess, se in _risk_members(per_lp) if se is not None]
    if not bins:
        return ""
    beyond = sum(excess > 1.96 * se for excess, se in bins)
    return f"; {beyond}/{len(bins)} deciles beyond ±{RISK_TOLERANCE:g} + 1.96 se"


def goal_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per :data:`GOALS` entry: ``key, goal, target, value, met`` (None = not measurable),
    ``note`` (where the worst value is, the floors, the baseline), ``band``, ``within_band``,
    ``family`` and ``beyond_chance``.

    ``band`` is 1.96 document-clustered standard errors of ``value`` where the summary allows it: a
    cell's ``se``; a coverage or miss rate's binomial se at its target rate over the LP's ``n_eff``
    (the pooled bad-segment coverage at each LP's design effect); the worst risk decile's ``se``; the
    paired standard error of the CRPS difference (``baseline.crps_delta_se``).  ECE has its floor
    instead (None).  ``within_band`` says whether ``|value - bound| <= band`` (:data:`BOUNDS`): met or
    not, one test sample does not decide such a goal.

    Most goals are the worst of ``family`` values (20 LP x quintile cells, 120 risk deciles, the
    LPs): the largest of many noisy values lies beyond its band by chance more often than one value
    does.  ``beyond_chance`` says whether a miss survives that: some member lies beyond its bound by
    more than :func:`family_z` (``family`` members; family-wise α = :data:`FAMILY_ALPHA`) of its
    own standard errors; False for a met goal, None where no standard error is known."""
    gamma = summary["coverage_gamma"]
    per_lp = summary["per_lp"]
    worst = summary.get("worst_cells") or {}
    lp_gaps = {lp: abs(m["coverage"] - gamma) for lp, m in per_lp.items() if m["coverage"] is not None}
    lp_worst = max(lp_gaps, key=lp_gaps.get) if lp_gaps else None
    lp_error = None if lp_worst is None else lp_gaps[lp_worst]
    half = (1.0 - gamma) / 2.0
    miss = {
        lp: max(abs(m["miss_below"] - half), abs(m["miss_above"] - half))
        for lp, m in per_lp.items()
        if m["miss_below"] is not None
    }
    miss_lp = max(miss, key=miss.get) if miss else None
    risk = [
        (r["max_gap"], lp, chi) for lp, m in per_lp.items() for chi, r in m["risk"].items() if r.get("max_gap") is not None
    ]
    risk_worst = max(risk) if risk else None
    floored = {lp: m for lp, m in per_lp.items() if m["ece_floor"] is not None and m["ece_floor"] < ECE_GOAL}
    eces = [m["ece"] for m in floored.values() if m["ece"] is not None]
    ece_max = max(eces) if eces else None
    low = _pooled_low(per_lp)
    low_band = _pooled_low_band(per_lp)
    baseline = summary.get("baseline") or {}
    delta = baseline.get("crps_delta")
    delta_se = baseline.get("crps_delta_se")
    held = summary.get("held_out") or {}
    held_coverage = {lp: c for lp, c in (held.get("coverage_by_lp") or {}).items() if c is not None}
    held_n_eff = held.get("n_eff_by_lp") or {}
    unseen_lp = max(held_coverage, key=lambda lp: abs(held_coverage[lp] - gamma), default=None)
    unseen_error = None if unseen_lp is None else abs(held_coverage[unseen_lp] - gamma)

    def cell(kind: str):
        c = worst.get(kind) or {}
        gap = c.get("gap")
        if gap is None:
            return None, None, None, None, None
        note = f"{c['lp']} {c['cell']}: {c['coverage']:.3f} ± {1.96 * c['se']:.3f} ({c['cells_outside']}/{c['cells']} cells outside)"
        return abs(gap), _at_most(abs(gap), CELL_TOLERANCE), note, 1.96 * c["se"], _cell_members(per_lp, kind)

    risk_band = None
    if risk_worst is not None:
        bins = per_lp[risk_worst[1]]["risk"][risk_worst[2]].get("bins") or []
        widest = max(bins, key=lambda b: abs(b["observed"] - b["predicted"]), default=None)
        risk_band = None if widest is None or "se" not in widest else 1.96 * widest["se"]
    miss_value = None if miss_lp is None else miss[miss_lp]

    values = {
        "worst_sd_cell_gap": cell("sd"),
        "worst_mu_cell_gap": cell("mu"),
        "lp_coverage_error": (
            lp_error,
            _at_most(lp_error, LP_TOLERANCE),
            None if lp_worst is None else f"{lp_worst} {per_lp[lp_worst]['coverage']:.3f}",
            None if lp_worst is None else _band(gamma, per_lp[lp_worst].get("n_eff")),
            [(gap - LP_TOLERANCE, _se(gamma, per_lp[lp].get("n_eff"))) for lp, gap in lp_gaps.items()],
        ),
        "low_score_coverage": (
            low,
            _at_least(low, LOW_SCORE_COVERAGE),
            "per LP " + ", ".join(f"{lp} {m['low_score_coverage']:.3f}" for lp, m in per_lp.items() if m["low_score_coverage"] is not None),
            low_band,
            None if low is None else [(LOW_SCORE_COVERAGE - low, None if low_band is None else low_band / 1.96)],
        ),
        "miss_balance_error": (
            miss_value,
            _at_most(miss_value, MISS_TOLERANCE),
            None if miss_lp is None else f"{miss_lp}: below {per_lp[miss_lp]['miss_below']:.3f}, above {per_lp[miss_lp]['miss_above']:.3f}",
            None if miss_lp is None else _band(half, per_lp[miss_lp].get("n_eff")),
            [
                (abs(per_lp[lp][side] - half) - MISS_TOLERANCE, _se(half, per_lp[lp].get("n_eff")))
                for lp in miss
                for side in ("miss_below", "miss_above")
            ],
        ),
        "risk_max_gap": (
            None if risk_worst is None else risk_worst[0],
            _at_most(None if risk_worst is None else risk_worst[0], RISK_TOLERANCE),
            None if risk_worst is None else f"{risk_worst[1]} at chi={risk_worst[2]}" + _risk_band_note(per_lp),
            risk_band,
            _risk_members(per_lp),
        ),
        "ece_max_where_floor_allows": (
            ece_max,
            _at_most(ece_max, ECE_GOAL),
            "floor " + ", ".join(f"{lp} {m['ece_floor']:.3f}" for lp, m in per_lp.items() if m["ece_floor"] is not None),
            None,  # the floor is its sampling noise, and the goal applies only where it is below the bound
            None,
        ),
        "crps_vs_baseline": (
            delta,
            None if delta is None else bool(delta < 0),
            None if not baseline else f"{baseline['name']} {baseline['crps']:.3f}",
            None if delta_se is None else 1.96 * delta_se,  # paired over the same test rows
            None if delta is None else [(delta, delta_se)],
        ),
        "unseen_coverage_error": (
            unseen_error,
            _at_most(unseen_error, UNSEEN_TOLERANCE),
            UNSEEN_NOT_YET
            if summary.get("held_out_pending")
            else "LPs " + (", ".join(held.get("lps") or []) or "none")
            + ("" if unseen_lp is None else f"; largest {unseen_lp} {held_coverage[unseen_lp]:.3f}"),
            None if unseen_lp is None else _band(gamma, held_n_eff.get(unseen_lp)),
            [(abs(c - gamma) - UNSEEN_TOLERANCE, _se(gamma, held_n_eff.get(lp))) for lp, c in held_coverage.items()],
        ),
    }
    rows = []
    for key, text, target in GOALS:
        value, met, note, band, members = values[key]
        rows.append(
            {
                "key": key, "goal": text, "target": target, "value": value, "met": met, "note": note,
                "band": band, "within_band": _within(value, BOUNDS[key], band),
                "family": len(members) if members else None, "beyond_chance": _beyond_chance(met, members),
            }
        )
    return rows


def headline_metrics(summaries: dict[str, dict[str, Any]], prefix: str = "conditional") -> dict[str, float]:
    """Flat MLflow metrics ``<prefix>.<method>.<goal key>`` (measured values) and
    ``<prefix>.<method>.goals_met`` (how many goals are met) and
    ``<prefix>.<method>.goals_missed_within_band`` (how many of the missed ones lie within their
    sampling band of the bound) and ``<prefix>.<method>.goals_missed_beyond_chance`` (how many stay
    missed as the worst of their family), skipping unmeasurable ones."""
    out = {}
    for method, summary in summaries.items():
        rows = summary.get("goals") or []
        for row in rows:
            if row["value"] is not None:
                out[f"{prefix}.{method}.{row['key']}"] = float(row["value"])
        if (summary.get("ece") or {}).get("papers_cross_fitted") is not None:
            out[f"{prefix}.{method}.papers_cross_fitted_ece"] = float(summary["ece"]["papers_cross_fitted"])
        out[f"{prefix}.{method}.goals_met"] = float(sum(row["met"] is True for row in rows))
        out[f"{prefix}.{method}.goals_missed_within_band"] = float(
            sum(row["met"] is False and row.get("within_band") is True for row in rows)
        )
        out[f"{prefix}.{method}.goals_missed_beyond_chance"] = float(sum(row.get("beyond_chance") is True for row in rows))
    return out
