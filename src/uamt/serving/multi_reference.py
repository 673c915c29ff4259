"""Scoring one translation against several references (Glushkova et al. 2021, §3.4).

A reference-based model scores ⟨src, mt, r⟩ once per reference r ∈ R; the per-reference
predictions are then averaged (the pointwise average of §3.4: mu and sigma are averaged over R).
Whether, and by how much, the averaged prediction is more accurate than a single-reference one is
an empirical question, answered on dev: the calibration carries, per number of references, the ratio
of the squared errors of averaged and single-reference predictions on the same dev rows
(:attr:`uamt.serving.model_calibration.Calibration.reference_factors`), so intervals narrow with more references
exactly as much as dev shows the averaged prediction to be more accurate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.core.errors import DataError

log = logging.getLogger(__name__)

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
    uamt.core.errors.DataError
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
    """Uncalibrated predictions of a reference-based ``model`` for ``frame`` (``src``, ``mt``, optional
    ``lp``), each segment scored against every reference in ``refs[i]`` and the predictions averaged."""
    src, mt = frame["src"].tolist(), frame["mt"].tolist()
    expanded = expand(src, mt, refs)
    if "lp" in frame.columns:
        expanded.insert(2, "lp", frame["lp"].to_numpy()[expanded["row"].to_numpy()])
    pred = model.predict(expanded.drop(columns="row"), features)
    return combine(pred, expanded["row"], len(frame))


def multi_reference_rows(frame: pd.DataFrame, k: int) -> tuple[pd.DataFrame, list[list[str]]]:
    """Rows of ``frame`` with at least ``k`` distinct references, and the first ``k`` of each."""
    options = [
        distinct_references([ref, *(refs if refs is not None else [])])
        for ref, refs in zip(frame["ref"], frame["refs"], strict=True)
    ]
    keep = [i for i, refs in enumerate(options) if len(refs) >= k]
    return frame.iloc[keep].reset_index(drop=True), [options[i][:k] for i in keep]


def fit_reference_factors(
    model_dir: Path, dev_df: pd.DataFrame, features, calibration, min_rows: int
) -> dict[int, dict[str, float]]:
    """``{k: {lp or GLOBAL: variance factor}}`` for predictions averaged over k = 2, 3, ... references.

    On the dev rows that have k distinct references, the factor is the ratio of the mean squared
    errors (in the dev-standardised units of ``calibration``) of the k-reference average and of the
    single-reference prediction on the *same rows*:
    :math:`f_k = \\overline{(q^*_z - \\hat\\mu_{z,k})^2} / \\overline{(q^*_z - \\hat\\mu_{z,1})^2}`.
    Calibrated variances of k-reference predictions are multiplied by it, so intervals narrow with
    more references exactly as much as dev shows the averaged prediction to be more accurate.  Fitted
    for every k with at least ``min_rows`` such rows (per LP likewise; the pipeline passes
    ``evaluate.min_lp_rows``); empty for a QE model.
    """
    from uamt.models.api import load
    from uamt.uncertainty import GLOBAL

    model = load(model_dir)
    if model.cfg.reference_free or "refs" not in dev_df.columns:
        return {}
    factors: dict[int, dict[str, float]] = {}
    k = 2
    while True:
        rows, refs = multi_reference_rows(dev_df, k)
        if len(rows) < min_rows:
            return factors
        lp = rows["lp"].to_numpy(dtype=object)
        human_z = calibration.standardizer.transform_human(rows["score"].to_numpy(dtype=float), lp)
        squared = {}
        for n_refs in (1, k):
            pred = predict_with_references(model, rows, [r[:n_refs] for r in refs], features)
            mu_z, _ = calibration.standardizer.transform_predictions(pred["mu"].to_numpy(dtype=float), None, lp)
            squared[n_refs] = (human_z - mu_z) ** 2
        groups = {GLOBAL: np.ones(len(rows), dtype=bool)}
        groups.update({name: lp == name for name in sorted(set(lp.tolist())) if (lp == name).sum() >= min_rows})
        factors[k] = {
            name: float(squared[k][mask].mean() / squared[1][mask].mean()) for name, mask in groups.items()
        }
        log.info("reference factors for %d references on %d dev rows: %s", k, len(rows), factors[k])
        k += 1
