"""benchmarks/lattice_risk.py: a continuous CDF calibrated on whole-point scores reads mid-step at χ."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from benchmarks.lattice_risk import THRESHOLDS, reliability
from uamt.uncertainty import EvaluationSettings


def test_the_risk_at_a_whole_point_reads_half_the_step_and_half_a_point_above_reads_all_of_it():
    # Q = -K, K ~ Poisson(rate) per row: whole points.  Y = Q + U(-1/2, 1/2) is the continuous
    # distribution a randomised PIT calibrates to; its CDF at a whole chi is P(Q < chi) + P(Q = chi) / 2
    rng = np.random.default_rng(0)
    n = 6000
    rate = rng.uniform(0.5, 8.0, n)
    human = -rng.poisson(rate).astype(float)

    def cdf_y(x):  # P(-K + U <= x) = E_U P(K >= U - x), exactly by integrating over U's unit interval
        grid = np.linspace(-0.5, 0.5, 201)[None, :]
        return np.mean(stats.poisson.sf(np.ceil(grid - x[:, None]) - 1, rate[:, None]), axis=1)

    offsets = (0.0, 0.5)
    rows = SimpleNamespace(risk={chi + o: cdf_y(np.full(n, chi + o)) for chi in THRESHOLDS for o in offsets})
    table = pd.DataFrame({"lp": "en-de", "human": human, "doc": [f"d{i // 4}" for i in range(n)]})
    result, steps = reliability(rows, table, offsets, EvaluationSettings())
    for chi, (served, below, at) in steps.items():
        assert served == pytest.approx((below + at) / 2, abs=0.015), chi  # mid-step
    for chi in (-1.0, -5.0):
        assert steps[chi][2] - steps[chi][1] > 0.05, chi  # a step worth the goal's tolerance
    mid, lattice = result[0.0], result[0.5]
    assert lattice["brier"] < mid["brier"]
    assert max(gap for _, gap in lattice["by_lp"]["en-de"].values()) < 0.05  # calibrated on the lattice
    assert max(gap for _, gap in mid["by_lp"]["en-de"].values()) > 0.05
    assert len(mid["deciles"]) == 10 * len(THRESHOLDS)
