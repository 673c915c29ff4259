"""Multi-reference scoring: per-reference predictions averaged (§3.4), calibration chosen by the
number of references each row averaged."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from uamt.core.errors import DataError, UamtError
from uamt.serving.model_calibration import Calibration
from uamt.serving.multi_reference import combine, distinct_references, expand, predict_with_references
from uamt.uncertainty import GLOBAL, EvaluationSettings, evaluate_predictions


def test_distinct_references_drops_empty_and_repeated():
    assert distinct_references(["a", "", "b", "a", "  ", "c"]) == ["a", "b", "c"]
    assert distinct_references(["a", "b", "c"], limit=2) == ["a", "b"]


def test_expand_and_combine_average_each_segment():
    expanded = expand(["s1", "s2"], ["m1", "m2"], [["r1", "r2"], ["r3"]])
    assert expanded.to_dict("list") == {
        "src": ["s1", "s1", "s2"],
        "mt": ["m1", "m1", "m2"],
        "ref": ["r1", "r2", "r3"],
        "row": [0, 0, 1],
    }
    pred = pd.DataFrame({"mu": [1.0, 3.0, 5.0], "sigma": [0.5, 1.5, 2.0]})
    out = combine(pred, expanded["row"], 2)
    assert out["mu"].tolist() == [2.0, 5.0]
    assert out["sigma"].tolist() == [1.0, 2.0]
    assert out["n_refs"].tolist() == [2, 1]


def test_a_segment_without_reference_is_refused():
    with pytest.raises(DataError, match="row 1: no reference"):
        expand(["s1", "s2"], ["m1", "m2"], [["r1"], []])


class _LengthModel:
    """Stand-in model: mu = len(ref), sigma = 1 -- enough to check the wiring."""

    def predict(self, df, features):
        return pd.DataFrame({"mu": df["ref"].str.len().astype(float), "sigma": np.ones(len(df))})


def test_predict_with_references_scores_each_reference_once():
    frame = pd.DataFrame({"src": ["s", "t"], "mt": ["m", "n"]})
    out = predict_with_references(_LengthModel(), frame, [["a", "abc"], ["abcd"]], features=None)
    assert out["mu"].tolist() == [2.0, 4.0] and out["n_refs"].tolist() == [2, 1]


def _calibration(error_scale: float, lps=("en-de", "zh-en"), n: int = 400, seed: int = 0) -> Calibration:
    rng = np.random.default_rng(seed)
    lp = np.repeat(lps, n)
    mu = rng.normal(size=lp.size)
    human = mu + error_scale * rng.normal(size=lp.size)
    table = pd.DataFrame({"lp": lp, "human": human, "mu": mu, "sigma": np.ones(lp.size)})
    result = evaluate_predictions(table, table, settings=EvaluationSettings(min_lp_rows=50))
    return Calibration.from_result(result["calibration"])


def test_rows_get_the_variance_factor_of_their_number_of_references():
    base = _calibration(1.0)
    base.reference_factors = {2: {"en-de": 0.81, GLOBAL: 0.64}, 3: {"en-de": 0.49}}
    mu, sigma = np.zeros(5), np.ones(5)
    lp = np.array(["en-de", "en-de", "en-de", "en-de", "zh-en"])
    n_refs = np.array([1, 2, 3, 5, 3])
    _, cal_sigma = base.apply(mu, sigma, lp, n_refs=n_refs)
    _, one_ref = base.apply(mu, sigma, lp)
    # en-de: 1 ref unchanged, 2 refs x0.9, 3 or more x0.7; zh-en has no factor: unchanged
    np.testing.assert_allclose(cal_sigma / one_ref, [1.0, 0.9, 0.7, 0.7, 1.0])
    # without an LP the global factor of the largest k fitted for it applies
    _, no_lp = base.apply(mu[:2], sigma[:2], None, n_refs=[2, 3])
    _, no_lp_one = base.apply(mu[:2], sigma[:2], None)
    np.testing.assert_allclose(no_lp / no_lp_one, [0.8, 0.8])
    low, high = base.interval(mu, sigma, 0.9, lp, n_refs=n_refs)
    low1, high1 = base.interval(mu, sigma, 0.9, lp)
    np.testing.assert_allclose((high - low) / (high1 - low1), [1.0, 0.9, 0.7, 0.7, 1.0])
    low, high = base.interval(mu, sigma, 0.9, lp, mode="conformal", n_refs=n_refs)
    low1, high1 = base.interval(mu, sigma, 0.9, lp, mode="conformal")
    np.testing.assert_allclose((high - low) / (high1 - low1), [1.0, 0.9, 0.7, 0.7, 1.0])


def test_reference_factors_round_trip_through_json():
    base = _calibration(1.0)
    base.reference_factors = {2: {"en-de": 0.9, GLOBAL: 0.95}}
    again = Calibration.from_dict(base.to_dict())
    assert again.reference_factors == {2: {"en-de": 0.9, GLOBAL: 0.95}}
    broken = base.to_dict() | {"reference_factors": {"two": {"en-de": 0.9}}}
    with pytest.raises(UamtError, match="malformed reference_factors"):
        Calibration.from_dict(broken)


def test_dev_rows_with_k_distinct_references_for_the_multi_reference_fit():
    from uamt.serving.multi_reference import multi_reference_rows

    frame = pd.DataFrame(
        {
            "ref": ["a", "a", "x", "p"],
            "refs": [["a", "b", "c"], ["a", "a"], ["y"], None],
            "lp": ["en-de"] * 4,
        }
    )
    rows, refs = multi_reference_rows(frame, 2)
    assert rows["ref"].tolist() == ["a", "x"] and refs == [["a", "b"], ["x", "y"]]
    rows, refs = multi_reference_rows(frame, 3)
    assert refs == [["a", "b", "c"]] and len(rows) == 1
