"""Row features: surface features of each row fed to the head beside the COMET sentence features.

A pooled sentence vector barely moves when a translation is cut short, copied from the source or
written in the wrong language; :mod:`uamt.surface_features` measures exactly that (length ratios,
copy rate, the language identifier's probability of the target language, sentence chrF / TER).
With ``train_base.row_features`` naming some of them, every batch carries them as columns
``row:<name>`` (:func:`with_row_features`, computed from the texts when rows are encoded, for
training and at inference alike) and the head reads ``[COMET features, row features]``
(:meth:`uamt.models.base.Estimator.sentence_features`).

Each feature is put on a fixed O(1) scale (:data:`SCALES`), not one learned from the training split:
the same row gives the same input in any model, and nothing extra has to travel with a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.surface_features import FEATURES, NEEDS_REFERENCE, check_feature_names, surface_features

#: Per feature, ``(divide by, clip to ±)`` in the feature's own units: chrF and TER are on sacrebleu's
#: 0-100 scale (TER capped at 200), the length and sentence ratios are logs (±3 = 20 times more or fewer),
#: copy rate, language probability and number and negation mismatches are shares.
SCALES: dict[str, tuple[float, float]] = {
    "chrf": (100.0, 1.0),
    "ter": (100.0, 2.0),
    "len_ratio_ref": (1.0, 3.0),
    "len_ratio_src": (1.0, 3.0),
    "copy_rate": (1.0, 1.0),
    "target_language_prob": (1.0, 1.0),
    "number_mismatch_ref": (1.0, 1.0),
    "number_mismatch_src": (1.0, 1.0),
    "negation_mismatch_ref": (1.0, 1.0),
    "negation_mismatch_src": (1.0, 1.0),
    "sentence_ratio_ref": (1.0, 3.0),
}
assert set(SCALES) == set(FEATURES)

COLUMN_PREFIX = "row:"


def check_row_features(names: Sequence[str], reference_free: bool) -> tuple[str, ...]:
    """``names`` validated: known features (ValueError naming the choices), none twice, and none
    read off the reference in a reference-free (QE) model."""
    names = check_feature_names(names, "row_features")
    if reference_free:
        needs_ref = [n for n in names if n in NEEDS_REFERENCE]
        if needs_ref:
            raise ValueError(f"row_features {needs_ref} need a reference; a reference-free model cannot read them")
    return names


def row_feature_matrix(df: pd.DataFrame, names: Sequence[str], where: str = "table") -> np.ndarray:
    """float32 [n_rows, len(names)]: the features of ``df`` on their fixed scales (:data:`SCALES`).

    Raises
    ------
    DataError
        A feature is missing for a row (e.g. chrF without a reference), naming the row and feature.
    """
    if not names:
        return np.zeros((len(df), 0), dtype=np.float32)
    needs_ref = [n for n in names if n in NEEDS_REFERENCE]
    if needs_ref:
        if "ref" not in df.columns:
            raise DataError(f"{where}: row features {needs_ref} need column 'ref'; have {sorted(map(str, df.columns))}")
        empty = (df["ref"].isna() | (df["ref"].astype(str).str.len() == 0)).to_numpy()
        if empty.any():
            raise DataError(f"{where}: row {int(np.flatnonzero(empty)[0])}: column 'ref' is empty or null; row features {needs_ref} need it")
    raw = surface_features(df.reset_index(drop=True), names=names)
    out = np.empty((len(df), len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        values = raw[name].to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataError(f"{where}: row {row}: row feature {name!r} is not finite")
        scale, bound = SCALES[name]
        out[:, j] = np.clip(values / scale, -bound, bound)
    return out


def with_row_features(rows, df: pd.DataFrame, names: Sequence[str], where: str = "table"):
    """``rows`` (:class:`~uamt.models.data.EncodedRows` of ``df``) with the columns ``row:<name>`` of
    ``names`` that it lacks added; ``rows`` itself when it has them all (or ``names`` is empty)."""
    missing = [name for name in names if f"{COLUMN_PREFIX}{name}" not in rows.columns]
    if not missing:
        return rows
    matrix = row_feature_matrix(df, missing, where)
    return rows.with_columns(**{f"{COLUMN_PREFIX}{name}": matrix[:, j] for j, name in enumerate(missing)})


def batch_row_features(batch: dict, names: Sequence[str]):
    """The row features of a batch as one tensor [B, len(names)] (in ``names``' order)."""
    import torch

    try:
        return torch.stack([batch[f"{COLUMN_PREFIX}{name}"] for name in names], dim=1)
    except KeyError as exc:
        raise DataError(
            f"the model reads row features {list(names)} but the batch has no column {exc.args[0]!r}: "
            "encode rows with uamt.models.row_features.with_row_features"
        ) from exc


__all__ = [
    "COLUMN_PREFIX",
    "SCALES",
    "batch_row_features",
    "check_row_features",
    "row_feature_matrix",
    "with_row_features",
]
