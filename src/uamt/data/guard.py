"""The join guard: every reference-based dataset x LP must show a simple lexical signal.

A human score joined to the wrong sentence still looks like data.  What gives it away is that
sentence chrF against the reference no longer tracks the human score: WMT21 DA read with segment
ids as line numbers gave Pearson |r| < 0.06, the right join 0.21-0.29.  So ``uamt data prepare``
computes, for every dataset x language pair whose model input has references, the Pearson
correlation between the human score (oriented so that higher is better) and sentence chrF
(sacrebleu defaults) of ``mt`` against ``ref``, writes it to ``summary.json``, prints it, and
fails naming the dataset and LP when it falls below a floor on enough rows.  Quality-estimation
sets (no reference) are listed as skipped.

Two correlations are computed: ``pearson`` over all rows, and ``within``: the same after removing
each MT system's mean and then each source sentence's mean from both the human score and chrF.
The guard tests ``within`` (``pearson`` where too few sources have two or more rated
translations, e.g. one-system sets), because only a right sentence-level join produces it: a
wrong join keeps some pooled correlation through system quality (a good system has higher chrF and
higher human scores on *every* line) and sentence effects, and the line-number WMT21 DA join
reached pooled r = 0.052 on is-en but ``within`` <= 0.029 on all seven LPs.  Right joins measured
``within`` 0.056 (WMT21 TED en-de, the weakest) to 0.17 (0.06 pooled for WMT23 zh-en, where a weak
reference and sentence length pull the pooled r down).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.core.stats import pearson_or_none


@dataclass(frozen=True)
class GuardConfig:
    """``prepare.chrf_guard`` in params.yaml.

    floor: smallest acceptable ``within`` r (score oriented higher = better vs sentence chrF).
        0.045: the wrong WMT21 DA join gave at most 0.029, right joins at least 0.056.
    min_rows: below this many rows an LP is reported but never fails (r is too noisy).
    max_rows: chrF is computed on at most this many rows per dataset x LP, a stable sample
        (every row of smaller LPs); null = all rows.
    seed: seed of that sample.
    exempt: dataset -> {lp: reason}: reported with the reason, never failing.  For data whose
        references make chrF uninformative (biomedical en-eu, pt-en: the reference is a light
        post-edit of one rated system), not for a join that looks wrong.
    """

    floor: float = 0.045
    min_rows: int = 500
    max_rows: int | None = 10000
    seed: int = 13
    exempt: dict[str, dict[str, str]] = field(default_factory=dict)


def _sample(part: pd.DataFrame, max_rows: int | None, seed: int) -> pd.DataFrame:
    if max_rows is None or len(part) <= max_rows:
        return part
    return part.sample(n=max_rows, random_state=seed)


def chrf_signal(
    table: pd.DataFrame,
    higher_is_better: Mapping[str, bool],
    reference_based: Mapping[str, bool],
    cfg: GuardConfig = GuardConfig(),
) -> dict[str, dict[str, dict[str, Any]]]:
    """Pearson r between oriented human score and sentence chrF, per dataset x LP.

    Parameters
    ----------
    table : DataFrame
        Canonical rows (``dataset``, ``lp``, ``mt``, ``ref``, ``score``).
    higher_is_better, reference_based : mapping dataset -> bool
        From the dataset declarations; scores of lower-is-better datasets (HTER) are negated.

    Returns
    -------
    dict
        ``signal[dataset][lp] = {"pearson": r, "within": r within system and source, "n": rows
        used, "tested": "within" | "pearson", "status": "ok" | "low" | "few rows" | "exempt: …" |
        "skipped (no reference)"}``; an ``r`` is None where it cannot be computed.
    """
    from uamt.lexical import segment_scores

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (dataset, lp), part in table.groupby(["dataset", "lp"], sort=True):
        if not reference_based.get(dataset, True):
            out.setdefault(dataset, {})[lp] = {
                "pearson": None,
                "within": None,
                "tested": None,
                "n": 0,
                "status": "skipped (no reference)",
            }
            continue
        part = part[part["ref"].notna()]
        part = _sample(part, cfg.max_rows, cfg.seed)
        sign = 1.0 if higher_is_better.get(dataset, True) else -1.0
        scores = sign * part["score"].to_numpy(dtype=float)
        chrfs = segment_scores(list(part["mt"]), [list(part["ref"])], "chrf")
        n = len(part)
        r = pearson_or_none(scores, chrfs, min_rows=3)
        src = part["src"].to_numpy() if "src" in part.columns else np.arange(n)
        system = part["system"].to_numpy() if "system" in part.columns else np.zeros(n)
        shared = pd.Series(src).duplicated(keep=False).to_numpy()  # sources with >= 2 rows
        within = None
        if shared.sum() >= min(cfg.min_rows, n) and shared.sum() >= 3:
            keys, systems = src[shared], system[shared]
            within = pearson_or_none(
                _demean(_demean(scores[shared], systems), keys),
                _demean(_demean(chrfs[shared], systems), keys),
                min_rows=3,
            )
        tested, value = ("within", within) if within is not None else ("pearson", r)
        exempt = cfg.exempt.get(dataset, {}).get(lp)
        if exempt is not None:
            status = f"exempt: {exempt}"
        elif n < cfg.min_rows:
            status = "few rows"
        elif value is None or value < cfg.floor:
            status = "low"
        else:
            status = "ok"
        out.setdefault(dataset, {})[lp] = {
            "pearson": r,
            "within": within,
            "tested": tested,
            "n": int(n),
            "status": status,
        }
    return out


def _demean(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``values`` minus the mean of the rows with the same key."""
    return values - pd.Series(values).groupby(keys).transform("mean").to_numpy()


def check_signal(signal: Mapping[str, Mapping[str, Mapping[str, Any]]], cfg: GuardConfig) -> None:
    """Raise :class:`DataError` naming every dataset x LP whose chrF signal is below the floor."""
    low = [
        f"{dataset} {lp} (r = {_fmt(v['pearson'])}, within system and source {_fmt(v['within'])}, n = {v['n']})"
        for dataset, lps in sorted(signal.items())
        for lp, v in sorted(lps.items())
        if v["status"] == "low"
    ]
    if low:
        raise DataError(
            f"join guard: sentence chrF vs human score (within system and source) is below "
            f"prepare.chrf_guard.floor={cfg.floor} for "
            f"{', '.join(low)}: the scores are probably joined to the wrong sentences (check the "
            "loader's segment ids), or lower prepare.chrf_guard.floor if this data really has no signal"
        )


def _fmt(r: float | None) -> str:
    return "n/a" if r is None else f"{r:+.3f}"


def format_signal(signal: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """One line per dataset x LP: pooled r, within-source r, rows and status."""
    lines = ["join guard (Pearson r, human score vs sentence chrF: pooled / within system and source):"]
    for dataset, lps in sorted(signal.items()):
        for lp, v in sorted(lps.items()):
            lines.append(
                f"  {dataset:<14} {lp:<6} r={_fmt(v['pearson']):>6} / {_fmt(v['within']):>6}  "
                f"n={v['n']:>5}  {v['status']}"
            )
    return "\n".join(lines)
