"""Choose one translation per group of candidates from the served distribution (``uamt rerank``).

A *group* is the set of candidate translations of one source (one value of the group column).
Each candidate carries what the served calibration says about it: the served centre ``mu``, the
central interval ``[lower, upper]`` at the level ``confidence`` and the risk ``P(Q <= chi)``.  A
rule gives every candidate a score (higher = better); the group's pick is the best score (ties:
the higher served mu, then the first row).  The pick is marked ``abstain`` when even its risk exceeds ``max_risk``: route the
source to a human.

Rules (:data:`RULES`; an unknown name is refused):

``mu``
    the highest served mu (the point estimate's decision).
``lcb``
    the highest lower end of the served central interval at ``confidence`` (a one-sided lower bound
    at level (1 + confidence) / 2): prefers a slightly lower mu when its distribution is narrower.
``risk``
    the lowest risk P(Q <= chi).
``mbr``
    minimum Bayes risk with the metric as utility, as ``comet-mbr`` does: the candidate scored with
    the *other* candidates of its group as pseudo-references (the model's reference input; the
    per-reference predictions averaged as for several references), highest served mu of that.
``mbr_lcb``
    the same pseudo-reference prediction, highest lower end of its served interval (MBR with the
    uncertainty term).

The MBR rules need the columns ``mbr_mu`` and ``mbr_lower`` (:func:`pseudo_reference_lists` builds
the inputs); the others ``mu``, ``lower`` and ``risk``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from uamt.core.errors import DataError

#: rule -> (column of the candidate table it ranks by, True when higher is better).
RULES: dict[str, tuple[str, bool]] = {
    "mu": ("mu", True),
    "lcb": ("lower", True),
    "risk": ("risk", False),
    "mbr": ("mbr_mu", True),
    "mbr_lcb": ("mbr_lower", True),
}
#: Rules that need pseudo-reference predictions (each candidate against the others of its group).
MBR_RULES = ("mbr", "mbr_lcb")
DEFAULT_GROUP_COLUMN = "group"
#: Columns of the output of :func:`rerank`, in order.
OUTPUT_COLUMNS = ("group", "row", "n_candidates", "rule", "score", "mu", "lower", "upper", "risk", "abstain")


def check_rule(rule: str) -> str:
    """``rule`` if it is one of :data:`RULES`, else ValueError naming the choices."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r} not supported; choose from {sorted(RULES)}")
    return rule


@dataclass(frozen=True)
class RerankSettings:
    """How to choose: the rule, and when to abstain.

    Attributes
    ----------
    rule : str
        One of :data:`RULES`.
    max_risk : float or None
        Abstain (route to a human) when the pick's risk P(Q <= chi) exceeds this; None: never.
    """

    rule: str = "lcb"
    max_risk: float | None = 0.5

    def __post_init__(self) -> None:
        check_rule(self.rule)
        if self.max_risk is not None and not 0.0 <= float(self.max_risk) <= 1.0:
            raise ValueError(f"max_risk={self.max_risk!r} must be a probability in [0, 1] (or None)")


def rule_scores(table: pd.DataFrame, rule: str) -> np.ndarray:
    """Per candidate, shape [n]: the rule's score, higher = better (the risk rule negates the risk)."""
    column, higher = RULES[check_rule(rule)]
    if column not in table.columns:
        need = "pseudo-reference predictions (mbr_mu, mbr_lower)" if rule in MBR_RULES else repr(column)
        raise DataError(f"rule {rule!r} needs the column {column!r}: {need} missing")
    values = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
    bad = np.flatnonzero(np.isnan(values))
    if bad.size:
        raise DataError(f"rule {rule!r}: row {int(bad[0])} has no {column!r} value")
    return values if higher else -values


def pick_positions(groups: np.ndarray, scores: np.ndarray, tiebreak=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The position of the best score in every group; ties go to the higher ``tiebreak`` (the served
    mu: a bound clipped at the scale's end or a risk at the served CDF's outermost step ties often),
    then to the first row of the group.

    Returns ``(group keys in order of first appearance, positions, candidates per group)``.
    """
    groups = np.asarray(groups, dtype=object)
    keys, first, inverse, counts = np.unique(
        pd.Series(groups).astype(str).to_numpy(), return_index=True, return_inverse=True, return_counts=True
    )
    tiebreak = np.zeros(len(scores)) if tiebreak is None else np.asarray(tiebreak, dtype=float)
    # Sort by group, then best score, then best tie-break, then row order: the first row of each
    # group in this order is its pick.
    order = np.lexsort((np.arange(len(scores)), -tiebreak, -np.asarray(scores, dtype=float), inverse))
    starts = np.searchsorted(inverse[order], np.arange(keys.size))
    best = order[starts]
    appearance = np.argsort(first, kind="stable")
    return groups[first[appearance]], best[appearance], counts[appearance]


def rerank(table: pd.DataFrame, settings: RerankSettings, *, group_column: str = DEFAULT_GROUP_COLUMN) -> pd.DataFrame:
    """One row per group: the chosen candidate, its served mu, interval and risk, the rule, its score
    and ``abstain`` (the pick's risk > ``settings.max_risk``).

    Parameters
    ----------
    table : DataFrame
        One row per candidate: ``group_column``, ``mu``, ``lower``, ``upper``, ``risk`` (the served
        distribution, e.g. ``uamt score`` output joined to the input), and ``mbr_mu``,
        ``mbr_lower`` for the MBR rules; any other columns (``mt``, ``system``, ...) are carried
        over for the pick.
    settings : RerankSettings
    group_column : str

    Returns
    -------
    DataFrame
        :data:`OUTPUT_COLUMNS` (``row`` is the pick's 0-based row in ``table``) followed by the
        pick's other columns.
    """
    if group_column not in table.columns:
        raise DataError(f"no group column {group_column!r} (columns: {list(table.columns)})")
    for column in ("mu", "lower", "upper", "risk"):
        if column not in table.columns:
            raise DataError(f"candidate table: column {column!r} missing")
    if table.empty:
        raise DataError("no candidates to rerank")
    if table[group_column].isna().any():
        raise DataError(f"row {int(np.flatnonzero(table[group_column].isna().to_numpy())[0])}: empty {group_column!r}")
    table = table.reset_index(drop=True)
    scores = rule_scores(table, settings.rule)
    keys, positions, counts = pick_positions(
        table[group_column].to_numpy(), scores, pd.to_numeric(table["mu"], errors="coerce").to_numpy(dtype=float)
    )
    picked = table.iloc[positions].reset_index(drop=True)
    risk = picked["risk"].to_numpy(dtype=float)
    out = pd.DataFrame(
        {
            "group": keys,
            "row": positions,
            "n_candidates": counts,
            "rule": settings.rule,
            "score": np.where(RULES[settings.rule][1], scores[positions], -scores[positions]),
            "mu": picked["mu"].to_numpy(dtype=float),
            "lower": picked["lower"].to_numpy(dtype=float),
            "upper": picked["upper"].to_numpy(dtype=float),
            "risk": risk,
            "abstain": risk > settings.max_risk if settings.max_risk is not None else np.zeros(len(keys), bool),
        }
    )
    extra = [c for c in picked.columns if c not in OUTPUT_COLUMNS and c != group_column]
    return pd.concat([out, picked[extra]], axis=1)


def pseudo_reference_lists(
    groups: Sequence, candidates: Sequence[str], *, max_refs: int | None = None, seed: int = 0
) -> list[list[str]]:
    """For every candidate, the texts of the *other* candidates of its group (its pseudo-references).

    ``max_refs`` caps them per candidate (a seeded sample without replacement): the pairwise MBR
    costs one model pass per (candidate, pseudo-reference), n (n - 1) per group of n.  Identical
    texts count as different candidates (each is another system's vote).  A group of one candidate
    has none: the MBR rules refuse it (:class:`DataError` naming the group).
    """
    groups = pd.Series(list(groups)).astype(str).to_numpy()
    texts = np.asarray(list(candidates), dtype=object)
    if groups.shape != texts.shape:
        raise DataError(f"{groups.size} group keys for {texts.size} candidates")
    if max_refs is not None and max_refs < 1:
        raise DataError(f"max_refs={max_refs} must be >= 1 (or None for all)")
    rng = np.random.default_rng(seed)
    out: list[list[str]] = [[] for _ in range(texts.size)]
    for key, positions in sorted(pd.Series(np.arange(texts.size)).groupby(groups).indices.items()):
        positions = np.asarray(positions)
        if positions.size < 2:
            raise DataError(f"group {key!r} has one candidate: MBR needs at least two")
        for position in positions:
            others = positions[positions != position]
            if max_refs is not None and others.size > max_refs:
                others = np.sort(rng.choice(others, size=max_refs, replace=False))
            out[position] = [str(t) for t in texts[others]]
    return out
