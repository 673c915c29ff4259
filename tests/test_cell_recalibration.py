"""benchmarks/cell_recalibration.py: the per-cell PIT recalibration is exact on the rows it was fitted on."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.cell_recalibration import N_BINS, coverage_table, fit_cells, recalibrate, risk_summary


def skewed_pits(seed: int, n: int) -> pd.DataFrame:
    """PITs of a distribution that is too narrow in low-centre cells and too wide in high ones."""
    rng = np.random.default_rng(seed)
    lp = np.array(["en-de", "zh-en"], dtype=object)[rng.integers(0, 2, n)]
    center = rng.normal(-5.0, 3.0, n)
    shape = np.where(center < -5.0, 0.4, 3.0)  # U-shaped PITs (too narrow) / peaked ones (too wide)
    return pd.DataFrame({"lp": lp, "center": center, "u": rng.beta(shape, shape)})


def test_recalibrated_pits_cover_every_cell_in_sample():
    rows = skewed_pits(0, 4000)
    lp, center, u = rows["lp"].to_numpy(dtype=object), rows["center"].to_numpy(), rows["u"].to_numpy()
    served = coverage_table(u, lp, center)
    assert max(abs(c - 0.9) for values in served.values() for c in values[3:]) > 0.1  # miscalibrated per cell
    fixed = coverage_table(recalibrate(fit_cells(rows), lp, center, u), lp, center)
    for values in fixed.values():
        assert len(values) == 3 + N_BINS
        assert all(abs(c - 0.9) <= 0.02 for c in values[3:])
        assert abs(values[1] - 0.05) <= 0.01 and abs(values[2] - 0.05) <= 0.01


def test_recalibration_leaves_an_unknown_lp_alone_and_maps_into_unit_interval():
    rows = skewed_pits(1, 1000)
    cells = fit_cells(rows)
    p = np.linspace(0.0, 1.0, 11)
    out = recalibrate(cells, np.array(["xx-yy"] * 11, dtype=object), np.zeros(11), p)
    np.testing.assert_array_equal(out, p)
    inside = recalibrate(cells, np.array(["en-de"] * 11, dtype=object), np.full(11, -5.0), p)
    assert (np.diff(inside) >= 0).all() and inside.min() >= 0.0 and inside.max() < 1.0


def test_risk_summary_hand_computed():
    event = (np.tile(np.arange(10), 10) < np.repeat(np.arange(10), 10)).astype(float)  # decile d: d/10 observed
    lp = np.array(["en-de"] * 100, dtype=object)
    for offset, beyond in ((0.03, 0), (0.07, 10)):
        risk = np.repeat(np.arange(10) / 10 + offset, 10)
        brier, gap, out = risk_summary(risk, event, lp)
        assert brier == np.mean((risk - event) ** 2)
        assert np.isclose(gap, offset) and out == beyond
