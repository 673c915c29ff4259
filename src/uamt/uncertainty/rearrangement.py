"""The served distribution rearranged in mu: every quantile non-decreasing, every risk non-increasing.

A Mondrian distribution recalibrated per bin of predicted mu (:mod:`uamt.uncertainty.candidates`)
is calibrated within each bin but need not be *ordered* in mu: on WMT21 en-ru the QE model's
calibration rows put a wider tail below 0 under its best predictions than under middling ones, so
its risk P(MQM <= -5) rose with mu over part of the range and ranked bad translations worse than
-mu alone (test AUROC .536 against .608).  Pooling the bins' knots until they are ordered
(``evaluate.order_in_mu``, commit e2d798c) costs the per-bin recalibration, and with it the
conditional coverage (worst LP x mu quintile .048 -> .074 on test, HTS).

The monotone rearrangement (Chernozhukov, Fernández-Val & Galichon 2009, "Quantile and probability
curves without crossing", Econometrica 78) orders a curve by sorting its values: on a grid of mu,
a quantile curve sorted increasingly is the closest non-decreasing curve in every Lp norm, and it
is closer to the true curve than the original wherever the true curve is monotone.  Sorting each
level's values keeps the levels ordered (the k-th smallest is monotone in each value), so each row
keeps a proper distribution; sorting the quantile curves and sorting the CDF curves give the same
distribution.  Where σ has no weight (:mod:`uamt.uncertainty.tempering`, λ = 0) the served
distribution within an LP is a function of mu alone, so one grid serves every row: a row's answer
is the distribution's answers at :data:`GRID_PERCENTILES` of the LP's calibration mu, sorted and
interpolated at its own mu (:func:`rearranged`).  Measured on the v11 artifacts before serving it
(``benchmarks/rearrangement.py``, cross-fitted / test): QE CRPS 1.9688 -> 1.9669 / 1.7823 -> 1.7805,
worst cells unchanged, WMT21 en-ru AUROC .536 -> .608 (= -mu); HTS 1.9681 -> 1.9677 / 1.7374 ->
1.7372; served since ``uamt-comet`` v12 (docs/quality.md, "Served: the distribution rearranged in mu").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: Percentiles of an LP's calibration mu at which its served distribution is read to rearrange it
#: (its lowest and highest calibration mu included: beyond them the served family rises with mu).
GRID_PERCENTILES = np.linspace(0.0, 1.0, 51)


def rearranged(values, mu, grid_mu, grid_values) -> np.ndarray:
    """Each row's value made non-decreasing in mu by rearrangement on a grid, shape [n].

    Parameters
    ----------
    values, mu : array_like, shape [n]
        The rows' own answers (a quantile at one level, say) and their mu.
    grid_mu, grid_values : array_like, shape [G]
        The grid's mu (increasing) and the same answer there.

    Returns
    -------
    ndarray, shape [n]
        Inside the grid, the grid's values sorted increasingly and interpolated linearly in mu
        between its points (a bound at an infinite grid value takes the nearer side's); below the
        grid the row's own value capped at the smallest grid value, above it floored at the
        largest (:mod:`uamt.uncertainty.candidates`' knots are constant beyond the bins' outermost
        centres, so a served quantile already rises with mu there).  Non-decreasing in mu wherever
        the own values beyond the grid are.  For a non-increasing answer (a risk) pass its
        negation and negate the result.
    """
    values, mu = np.asarray(values, dtype=float), np.asarray(mu, dtype=float)
    grid_mu = np.asarray(grid_mu, dtype=float)
    ordered = np.sort(np.asarray(grid_values, dtype=float))
    last = ordered.size - 1
    right = np.clip(np.searchsorted(grid_mu, mu, side="right"), 1, last)
    span = grid_mu[right] - grid_mu[right - 1]
    weight = np.clip((mu - grid_mu[right - 1]) / np.where(span > 0, span, 1.0), 0.0, 1.0)
    low, high = ordered[right - 1], ordered[right]
    with np.errstate(invalid="ignore"):
        inside = np.where(np.isfinite(low) & np.isfinite(high), low + weight * (high - low), np.where(weight < 1.0, low, high))
    return np.where(mu < grid_mu[0], np.minimum(values, ordered[0]), np.where(mu > grid_mu[-1], np.maximum(values, ordered[-1]), inside))


def grid_of(mu) -> list[float]:
    """The grid of one LP's calibration ``mu`` (shape [n]): its :data:`GRID_PERCENTILES`."""
    return [float(v) for v in np.quantile(np.asarray(mu, dtype=float), GRID_PERCENTILES)]


def in_mu_order(
    answer: Callable[..., np.ndarray], values, mu, sigma, lps, n_refs, level, grids: dict[str, list[float]], increasing: bool
) -> np.ndarray:
    """``values`` (shape [n], the served answer of each row) rearranged in mu within each LP of ``grids``.

    ``answer(mu, sigma, lp, n_refs, level)`` gives the same answer for grid rows, every argument an
    array of one shape (``n_refs`` None where the rows have none): it is asked once, for the grids
    of every LP and distinct (level, n_refs) of its rows stacked, each grid at the σ of the first
    such row (the rearrangement is exact where σ has no weight).  One call rather than one per
    LP and level: the answers are elementwise, and the calibrate stage asks about a hundred levels
    of four LPs per measurement, where each call's fixed cost outweighed its arithmetic.
    ``lps`` shape [n]; ``n_refs`` shape [n] or None; ``level`` (the rows' interval level or
    threshold) shape [n].  Rows of an LP without a grid (unseen) keep their answers."""
    out = np.array(values, dtype=float, copy=True)
    sign = 1.0 if increasing else -1.0
    level = np.asarray(level, dtype=float)
    refs = np.zeros(out.size, dtype=int) if n_refs is None else np.asarray(n_refs, dtype=int)
    queries = []  # (rows, grid_mu, sigma, lp, n_refs, level) of each grid asked
    for name, grid in grids.items():
        in_lp = lps == name
        if not in_lp.any():
            continue
        grid_mu = np.asarray(grid, dtype=float)
        levels, with_refs_ = level[in_lp], refs[in_lp]
        if np.all(levels == levels[0]) and np.all(with_refs_ == with_refs_[0]):
            queries.append((in_lp, grid_mu, sigma[int(np.flatnonzero(in_lp)[0])], name, with_refs_[0], levels[0]))
            continue
        # the rows of each distinct (level, n_refs), in one pass: their first row and their mask
        combos, first, inverse = np.unique(np.column_stack([levels, with_refs_]), axis=0, return_index=True, return_inverse=True)
        positions = np.flatnonzero(in_lp)
        inverse = inverse.ravel()
        for k, (at_level, with_refs) in enumerate(combos):
            rows = np.zeros(out.size, dtype=bool)
            rows[positions[inverse == k]] = True
            queries.append((rows, grid_mu, sigma[positions[first[k]]], name, with_refs, at_level))
    if not queries:
        return out
    sizes = [q[1].size for q in queries]
    stacked = answer(
        np.concatenate([q[1] for q in queries]),
        np.repeat([float(q[2]) for q in queries], sizes),
        np.repeat(np.array([q[3] for q in queries], dtype=object), sizes),
        None if n_refs is None else np.repeat([int(q[4]) for q in queries], sizes),
        np.repeat([float(q[5]) for q in queries], sizes),
    )
    along_all = np.split(np.asarray(stacked, dtype=float), np.cumsum(sizes)[:-1])
    for (rows, grid_mu, *_), along in zip(queries, along_all, strict=True):
        out[rows] = sign * rearranged(sign * out[rows], mu[rows], grid_mu, sign * along)
    return out
