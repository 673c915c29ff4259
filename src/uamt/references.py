"""Scoring one translation against several references (Glushkova et al. 2021, §3.4).

A reference-based model scores ⟨src, mt, r⟩ once per reference r ∈ R; the per-reference
predictions are then averaged (the pointwise average of §3.4: mu and sigma are averaged over R).
Whether, and by how much, the averaged prediction is more accurate than a single-reference one is
an empirical question, answered on dev: the calibration carries, per number of references, the ratio
of the squared errors of averaged and single-reference predictions on the same dev rows
(:attr:`uamt.calibrated.Calibration.reference_factors`), so intervals narrow with more references
exactly as much as dev shows the averaged prediction to be more accurate.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from uamt.errors import DataError

#: Column of the combined predictions: how many references each row was scored against.
N_REFS = "n_refs"


def distinct_references(refs: Sequence[str], limit: int | None = None) -> list[str]:
    """The non-empty references of one segment, first occurrence kept, at most ``limit`` of them."""
    out: list[str] = []
    for ref in refs:
        if isinstance(ref, str) and ref.strip() and ref not in out:
            out.append(ref)
    return out if limit is None else out[:limit]


def expand(src: Sequence[str], mt: Sequence[str], refs: Sequence[Sequence[str]]) -> pd.DataFrame:
    """One row per (segment, reference): columns ``src, mt, ref, row`` (``row`` = segment index).

    Raises
    ------
    uamt.errors.DataError
        A segment has no reference.
    """
    rows = []
    for i, options in enumerate(refs):
        if not options:
            raise DataError(f"row {i}: no reference to score against")
        rows += [(i, ref) for ref in options]
    return pd.DataFrame(
        {
            "src": [src[i] for i, _ in rows],
            "mt": [mt[i] for i, _ in rows],
            "ref": [ref for _, ref in rows],
            "row": [i for i, _ in rows],
        }
    )


def combine(pred: pd.DataFrame, row: Sequence[int], n_rows: int) -> pd.DataFrame:
    """Average the per-reference predictions of each segment (§3.4).

    Parameters
    ----------
    pred : DataFrame, one row per (segment, reference)
        Numeric columns ``mu``, ``sigma`` (std) and optionally ``epistemic``, ``aleatoric`` (variances).
    row : sequence of int, same length as ``pred``
        The segment each prediction belongs to (0 .. n_rows-1, every segment present).

    Returns
    -------
    DataFrame, shape [n_rows, ...]
        The mean of every numeric column per segment, plus ``n_refs``.
    """
    frame = pred.select_dtypes("number").assign(row=np.asarray(row, dtype=int))
    grouped = frame.groupby("row", sort=True)
    out = grouped.mean()
    if len(out) != n_rows:
        raise DataError(f"predictions cover {len(out)} of {n_rows} segments")
    out[N_REFS] = grouped.size().to_numpy()
    return out.reset_index(drop=True)


def predict_with_references(model, frame: pd.DataFrame, refs: Sequence[Sequence[str]], features) -> pd.DataFrame:
    """Uncalibrated predictions of a reference-based ``model`` for ``frame`` (``src``, ``mt``), each
    segment scored against every reference in ``refs[i]`` and the predictions averaged."""
    src, mt = frame["src"].tolist(), frame["mt"].tolist()
    expanded = expand(src, mt, refs)
    pred = model.predict(expanded.drop(columns="row"), features)
    return combine(pred, expanded["row"], len(frame))
