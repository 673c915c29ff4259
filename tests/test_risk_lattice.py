"""The served risk read on the score's lattice: the reading, the artifact field, what serves it, and
the calibrate stage's choice of the offset by the cross-fitted Brier score."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from tests.test_top_atom import BOUNDS, SIGNED, zero_inflated
from uamt.core.errors import UamtError
from uamt.model_evaluation import ask, choose_risk_lattice, cross_fitted_rows
from uamt.serving.model_calibration import Calibration, fit_calibration, refit_served, with_top_atom
from uamt.uncertainty.served import lattice_threshold

LATTICE = {"step": 1.0, "offset": 0.5}
ON_LATTICE = dataclasses.replace(SIGNED, risk_lattice_step=1.0, risk_lattice_offsets=(0.0, 0.5))


def test_the_threshold_is_read_half_a_point_above_its_lattice_point():
    assert lattice_threshold(-1.0, LATTICE) == -0.5
    assert lattice_threshold(-5.0, LATTICE) == -4.5
    assert lattice_threshold(-4.3, LATTICE) == -4.5  # P(Q <= -4.3) = P(Q <= -5) on whole points
    assert lattice_threshold(0.0, LATTICE) == 0.5  # at or above the top: the whole distribution
    assert lattice_threshold(-3.0, {"step": 0.5, "offset": 0.25}) == -2.75
    assert lattice_threshold(-1.0, {}) == -1.0 and lattice_threshold(-1.0, None) == -1.0
    np.testing.assert_array_equal(lattice_threshold(np.array([-1.0, -2.4]), LATTICE), [-0.5, -2.5])
    # a whole chi one rounding error below its integer still reads its own lattice point
    assert lattice_threshold(-3.0 * 0.1 / 0.1, LATTICE) == -2.5


def whole_points(seed: int, n: int = 3000):
    table = zero_inflated(seed, n)
    return table.assign(human=np.round(table["human"]))


@pytest.fixture(scope="module")
def fitted():
    dev = whole_points(0)
    calibration, _ = fit_calibration(dev, "hts", settings=ON_LATTICE)
    return dev, with_top_atom(calibration, dev, "hts", ON_LATTICE, BOUNDS[1])


def test_the_artifact_serves_its_lattice_to_the_risk_alone(fitted, tmp_path):
    dev, served = fitted
    on = dataclasses.replace(served, risk_lattice=dict(LATTICE))
    path = tmp_path / "hts.json"
    on.save(path)
    back = Calibration.load(path)
    assert back.risk_lattice == LATTICE
    assert "risk_lattice" not in served.to_dict()  # a file without it keeps its bytes
    mu, sigma, lp = dev["mu"].to_numpy(), dev["sigma"].to_numpy(), dev["lp"].to_numpy(dtype=object)
    np.testing.assert_array_equal(back.served_risk(mu, sigma, -5.0, lp), served.risk(mu, sigma, -4.5, lp))
    np.testing.assert_array_equal(served.served_risk(mu, sigma, -5.0, lp), served.risk(mu, sigma, -5.0, lp))
    # what the metrics read: the risk on the lattice, everything else as without it
    with_lattice, without = ask(back, dev, SIGNED, BOUNDS), ask(served, dev, SIGNED, BOUNDS)
    np.testing.assert_array_equal(with_lattice.risk[-5.0], served.risk(mu, sigma, -4.5, lp))
    assert not np.array_equal(with_lattice.risk[-5.0], without.risk[-5.0])
    np.testing.assert_array_equal(with_lattice.quantiles, without.quantiles)
    np.testing.assert_array_equal(with_lattice.cdf_at_bounds, without.cdf_at_bounds)
    # the served columns the experiments and benchmarks read (flagging, rerank, quality) are what
    # `uamt score` serves: before, they read the risk at chi while the dev rows read the lattice
    from uamt.uncertainty.served import served_columns

    columns = served_columns(back, mu, sigma, lp, confidence=0.9, chi=-5.0, bounds=BOUNDS)
    np.testing.assert_array_equal(columns["risk"].to_numpy(), with_lattice.risk[-5.0])
    # a refit (the cross-fitted folds, the held-out LPs) serves the same lattice
    assert refit_served(dev, "hts", back, SIGNED).risk_lattice == LATTICE
    for bad in ({"step": 1.0}, {"step": 0.0, "offset": 0.0}, {"step": 1.0, "offset": 1.0}):
        with pytest.raises(UamtError, match="risk_lattice"):
            Calibration.from_dict({**on.to_dict(), "risk_lattice": bad})


def test_one_reading_serves_the_risk_everywhere_up_to_the_scale_edges(fitted):
    """served_rows, served_columns and Calibration.served_risk + clip_to_scale (what ``uamt score``
    answers) read the risk through one function: the same values at every chi, the scale's edges
    included, where chi and its lattice reading fall on the same side of each bound."""
    from uamt.serving.calibrated_predictor import clip_to_scale
    from uamt.uncertainty.served import served_columns, served_risk

    dev, served = fitted
    on = dataclasses.replace(served, risk_lattice=dict(LATTICE))
    mu, sigma, lp = dev["mu"].to_numpy(), dev["sigma"].to_numpy(), dev["lp"].to_numpy(dtype=object)
    low, high = BOUNDS
    settings = dataclasses.replace(SIGNED, risk_thresholds=(low - 0.5, low, -5.0, -0.3, high))
    rows = ask(on, dev, settings, BOUNDS)
    for chi in settings.risk_thresholds:
        read = served_risk(on, mu, sigma, chi, lp, bounds=BOUNDS)
        np.testing.assert_array_equal(rows.risk[chi], read)
        columns = served_columns(on, mu, sigma, lp, confidence=0.9, chi=chi, bounds=BOUNDS)
        np.testing.assert_array_equal(columns["risk"].to_numpy(), read)
        answered = clip_to_scale(pd.DataFrame({"mu": mu, "lower": mu, "upper": mu, "risk": on.served_risk(mu, sigma, chi, lp)}), BOUNDS, chi)
        np.testing.assert_array_equal(answered["risk"].to_numpy(), read)
    np.testing.assert_array_equal(rows.risk[high], 1.0)  # at the top: the whole distribution
    np.testing.assert_array_equal(rows.risk[low - 0.5], 0.0)  # below the bottom: nothing
    # inside the scale it is the CDF on the lattice, and a threshold per row reads each row's own
    np.testing.assert_array_equal(rows.risk[-0.3], on.risk(mu, sigma, -0.5, lp))
    per_row = np.where(np.arange(mu.size) % 2 == 0, -5.0, -1.0)
    np.testing.assert_array_equal(
        served_risk(on, mu, sigma, per_row, lp), np.where(per_row == -5.0, on.risk(mu, sigma, -4.5, lp), on.risk(mu, sigma, -0.5, lp))
    )


def test_the_calibrate_stage_reads_whole_point_scores_on_their_lattice_and_continuous_ones_at_chi(fitted):
    dev, served = fitted
    chosen, record = choose_risk_lattice(dev, "hts", served, ON_LATTICE, BOUNDS)
    assert record["chosen"] == 0.5 and chosen.risk_lattice == LATTICE
    assert record["brier"]["0.5"] < record["brier"]["0.0"]
    # the record is what the served risk scores, cross-fitted
    rows, _ = cross_fitted_rows(dev, "hts", chosen, ON_LATTICE, BOUNDS)
    human, lp = dev["human"].to_numpy(), dev["lp"].to_numpy(dtype=object)
    brier = np.mean([np.mean((rows.risk[chi][lp == name] - (human[lp == name] <= chi)) ** 2)
                     for name in ("en-ru", "zh-en") for chi in ON_LATTICE.risk_thresholds])
    assert brier == pytest.approx(record["brier"]["0.5"])
    # continuous scores: reading half a point above chi only adds mass, and the stage keeps chi
    continuous = zero_inflated(0, 3000)
    calibration, _ = fit_calibration(continuous, "hts", settings=ON_LATTICE)
    calibration = with_top_atom(calibration, continuous, "hts", ON_LATTICE, BOUNDS[1])
    kept, record = choose_risk_lattice(continuous, "hts", calibration, ON_LATTICE, BOUNDS)
    assert record["chosen"] == 0.0 and kept.risk_lattice == {}
    # no step, or the single offset 0: nothing to choose
    assert choose_risk_lattice(dev, "hts", served, SIGNED, BOUNDS) == (served, {})
    with pytest.raises(ValueError, match="risk_lattice_offsets"):
        dataclasses.replace(ON_LATTICE, risk_lattice_offsets=(0.0, 1.0))
    with pytest.raises(ValueError, match="risk_lattice_step"):
        dataclasses.replace(ON_LATTICE, risk_lattice_step=0.0)
    json.dumps(record)
