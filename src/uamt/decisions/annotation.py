"""Which unlabelled rows to send to annotators (``uamt select-for-annotation``).

Selection strategies (:data:`STRATEGIES`; an unknown name is refused):

``uncertainty``
    the ``budget`` rows of highest epistemic sigma (the model's own uncertainty about its mean:
    ensemble or MC-dropout disagreement), whatever their document or LP.
``diversity``
    uncertainty with diversity: rows in decreasing epistemic sigma, but at most ``ceil(budget /
    documents)`` per document and at most the LP's share of the pool (rounded up) per LP; when
    the caps leave the budget unfilled they are doubled and the pass repeated, so the budget is
    always spent.  A batch then covers many documents and every LP instead of one hard document.
``random``
    a uniform sample (seeded): the baseline.

The output is the incoming-annotations format of :mod:`uamt.ingest` with an empty ``score``
column for the annotators to fill; the scored file dropped into ``data/incoming/`` is ingested by
the next retrain tick.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.core.errors import DataError

STRATEGIES = ("uncertainty", "diversity", "random")
#: Columns written for the annotators, in the incoming format (``score`` left empty).
ANNOTATION_COLUMNS = ("dataset", "lp", "src", "mt", "ref", "system", "doc", "seg_id", "score")
TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet")


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} not supported; choose from {sorted(STRATEGIES)}")
    return strategy


def select_rows(
    uncertainty,
    budget: int,
    *,
    strategy: str = "diversity",
    docs=None,
    lps=None,
    seed: int = 0,
    exclude=None,
) -> np.ndarray:
    """Positions (0-based, shape [min(budget, available)]) of the rows to annotate, in order of choice.

    Parameters
    ----------
    uncertainty : array_like, shape [n]
        Epistemic sigma of every pool row (ignored by ``random``).
    budget : int
        Rows to choose (>= 1); fewer when the pool has fewer available rows.
    strategy : {"uncertainty", "diversity", "random"}
    docs, lps : array_like, shape [n], optional
        Document and language pair of every row (``diversity``: each defaults to all-distinct /
        one LP).
    seed : int
        ``random``'s sample; ties in ``uncertainty`` keep row order.
    exclude : array_like of bool, shape [n], optional
        Rows that may not be chosen (already annotated).
    """
    check_strategy(strategy)
    sigma = np.asarray(uncertainty, dtype=float)
    n = sigma.size
    if budget < 1:
        raise DataError(f"budget={budget} must be >= 1")
    if strategy != "random" and np.isnan(sigma).any():
        raise DataError(f"pool row {int(np.flatnonzero(np.isnan(sigma))[0])}: epistemic sigma is NaN")
    available = np.ones(n, bool) if exclude is None else ~np.asarray(exclude, dtype=bool)
    candidates = np.flatnonzero(available)
    budget = min(int(budget), candidates.size)
    if strategy == "random":
        return np.random.default_rng(seed).choice(candidates, size=budget, replace=False)
    order = candidates[np.argsort(-sigma[candidates], kind="stable")]
    if strategy == "uncertainty":
        return order[:budget]
    docs = np.arange(n).astype(str) if docs is None else pd.Series(list(docs)).astype(str).to_numpy()
    lps = np.zeros(n).astype(str) if lps is None else pd.Series(list(lps)).astype(str).to_numpy()
    doc_cap = max(1, math.ceil(budget / len(set(docs[candidates].tolist()))))
    lp_names, lp_counts = np.unique(lps[candidates], return_counts=True)
    lp_cap = {name: max(1, math.ceil(budget * count / candidates.size)) for name, count in zip(lp_names, lp_counts, strict=True)}
    chosen: list[int] = []
    taken = np.zeros(n, bool)
    per_doc: dict[str, int] = {}
    per_lp: dict[str, int] = {}
    scale = 1
    while len(chosen) < budget:
        for i in order:
            if len(chosen) >= budget:
                break
            if taken[i] or per_doc.get(docs[i], 0) >= doc_cap * scale or per_lp.get(lps[i], 0) >= lp_cap[lps[i]] * scale:
                continue
            chosen.append(int(i))
            taken[i] = True
            per_doc[docs[i]] = per_doc.get(docs[i], 0) + 1
            per_lp[lps[i]] = per_lp.get(lps[i], 0) + 1
        scale *= 2
    return np.asarray(chosen, dtype=np.int64)


def read_table(path: str | Path) -> pd.DataFrame:
    """A ``.csv``, ``.tsv``, ``.jsonl`` or ``.parquet`` table (DataError naming the file otherwise)."""
    path = Path(path)
    if path.suffix not in TABLE_SUFFIXES:
        raise DataError(f"{path}: suffix {path.suffix!r} not supported; choose from {sorted(TABLE_SUFFIXES)}")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        if path.suffix == ".jsonl":
            return pd.read_json(path, lines=True, dtype=False)
        return pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",", dtype=str, keep_default_na=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None


def annotation_frame(pool: pd.DataFrame, rows: np.ndarray, *, dataset: str, source: str = "pool") -> pd.DataFrame:
    """The chosen ``rows`` of ``pool`` in the incoming-annotations format, ``score`` empty.

    ``system`` defaults to ``unknown``, ``doc`` to ``<source>:<row>`` and ``seg_id`` to the pool row
    (0-based) when the pool lacks them; ``ref`` is written only when the pool has it.
    """
    picked = pool.iloc[np.asarray(rows, dtype=np.int64)]
    out = pd.DataFrame(index=range(len(picked)))
    out["dataset"] = picked["dataset"].astype(str).to_numpy() if "dataset" in picked.columns else dataset
    for column in ("lp", "src", "mt"):
        if column not in picked.columns:
            raise DataError(f"pool: column {column!r} missing (have {sorted(map(str, pool.columns))})")
        out[column] = picked[column].astype(str).to_numpy()
    if "ref" in picked.columns:
        out["ref"] = picked["ref"].astype(str).to_numpy()
    out["system"] = picked["system"].astype(str).to_numpy() if "system" in picked.columns else "unknown"
    out["doc"] = picked["doc"].astype(str).to_numpy() if "doc" in picked.columns else [f"{source}:{r}" for r in rows]
    out["seg_id"] = (
        pd.to_numeric(picked["seg_id"]).astype(int).to_numpy() if "seg_id" in picked.columns else np.asarray(rows, int)
    )
    out["score"] = ""
    return out[[c for c in ANNOTATION_COLUMNS if c in out.columns]]
