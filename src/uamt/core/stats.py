"""Statistics whose value does not depend on the machine: correctly rounded sums (``math.fsum``), no BLAS.

``np.corrcoef`` computes its sums with a BLAS product, whose kernel OpenBLAS picks by CPU (SkylakeX on
an Intel Xeon, Haswell on an AMD EPYC): the same inputs gave correlations a few ulps apart, so the join
guard's ``summary.json`` differed by 3 bytes between hosts and DVC re-ran every stage after ``prepare``.
"""

from __future__ import annotations

import math

import numpy as np


def pearson_r(x, y, min_rows: int = 2) -> float:
    """Pearson's correlation coefficient :math:`r(x, y)`, the same bits on every machine and in every row order.

    .. math:: r = \\frac{\\sum_j (x_j - \\bar x)(y_j - \\bar y)}{\\sqrt{\\sum_j (x_j - \\bar x)^2 \\sum_j (y_j - \\bar y)^2}}

    Parameters
    ----------
    x, y : array_like of float, shape [n]
    min_rows : int
        Fewer rows than this give NaN (2 at least: r of two points is +-1).

    Returns
    -------
    float
        In [-1, 1]; NaN when ``n < min_rows`` or either input is constant
        (r undefined) or not finite.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"pearson_r needs two 1-d arrays of one length, got shapes {x.shape} and {y.shape}")
    # Exact constancy check: x - x.mean() of a constant array can be ~1e-17 instead of 0.
    if x.size < max(2, min_rows) or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return float("nan")
    if x.min() == x.max() or y.min() == y.max():
        return float("nan")
    # Correctly rounded sums (math.fsum): r depends neither on the CPU's BLAS kernel nor on the rows'
    # order (with values a few ulps apart, sigma 0.01, 0.01, 0.01 + 1 ulp, a pairwise sum's rounding
    # changes the centred values, and r with them, when the rows are shuffled). Elementwise products
    # are exact IEEE operations, the same on every machine.
    dx = x - math.fsum(x) / x.size
    dy = y - math.fsum(y) / y.size
    denom = math.sqrt(math.fsum(dx * dx) * math.fsum(dy * dy))
    if denom == 0.0:
        return float("nan")
    return float(np.clip(math.fsum(dx * dy) / denom, -1.0, 1.0))


def pearson_or_none(x, y, min_rows: int = 2) -> float | None:
    """:func:`pearson_r`, with None where it is NaN (a JSON report's "undefined": too few rows, a
    constant or a non-finite input)."""
    r = pearson_r(x, y, min_rows=min_rows)
    return None if math.isnan(r) else r
