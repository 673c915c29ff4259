"""Optional columns of the canonical and predictions tables, and which rows fill them.

Kept out of :mod:`uamt.data` so that the models and the serving path can carry a row's optional
labels without importing the loaders.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Columns a table has only where some row has a value, written after the canonical columns: a
#: row's ``campaign`` names the rater group of a user's judgements (from the annotation pool, see
#: :mod:`uamt.campaigns`); published rows have none, so their files keep their bytes.
OPTIONAL_COLUMNS = ("campaign",)


def filled(column: pd.Series) -> np.ndarray:
    """Which values of an optional text column are given (not null, not blank); shape [n] bool."""
    return (column.notna() & (column.astype(str).str.strip() != "")).to_numpy()


def optional_columns(df: pd.DataFrame) -> list[str]:
    """The :data:`OPTIONAL_COLUMNS` of ``df`` that some row fills."""
    return [c for c in OPTIONAL_COLUMNS if c in df.columns and bool(filled(df[c]).any())]
