"""uamt.alignment_features: hand-computed greedy alignment values and the table wrapper."""

import numpy as np
import pandas as pd
import pytest

from uamt.alignment_features import FEATURE_NAMES, alignment_features, pair_features
from uamt.core.errors import DataError


def unit(*rows):
    m = np.array(rows, dtype=float)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def test_identical_texts_align_perfectly():
    a = unit([1, 0], [0, 1])
    np.testing.assert_allclose(pair_features(a, a, tau=0.5), [1, 1, 1, 0, 0])


def test_omitted_reference_token_is_unaligned_reference_mass():
    mt = unit([1, 0])  # the translation kept one of two reference tokens
    ref = unit([1, 0], [0, 1])
    precision, recall, f, unaligned_ref, unaligned_mt = pair_features(mt, ref, tau=0.5)
    assert precision == pytest.approx(1.0)
    assert recall == pytest.approx(0.5)  # (1 + 0) / 2
    assert f == pytest.approx(2 * 0.5 / 1.5)
    assert unaligned_ref == pytest.approx(0.5)
    assert unaligned_mt == pytest.approx(0.0)


def test_added_translation_token_is_unaligned_translation_mass():
    mt = unit([1, 0], [0, 1], [1, 1])
    ref = unit([1, 0])
    out = dict(zip(FEATURE_NAMES, pair_features(mt, ref, tau=0.8), strict=True))
    assert out["precision"] == pytest.approx((1 + 0 + np.sqrt(0.5)) / 3)
    assert out["unaligned_mt"] == pytest.approx(2 / 3)  # cos 0 and cos 0.707 < 0.8
    assert out["unaligned_ref"] == pytest.approx(0.0)


def test_empty_text_gives_nan():
    assert np.isnan(pair_features(np.empty((0, 2)), unit([1, 0]), tau=0.5)).all()


class FakeStates:
    layers = (1,)

    def __init__(self, vectors):
        self.vectors = vectors

    def encode(self, texts):
        """Nothing to encode: the token states are given to the constructor."""

    def __getitem__(self, text):
        return [self.vectors[text]]


def test_table_wrapper_names_columns_and_keeps_index():
    states = FakeStates({"a": unit([1, 0]), "b": unit([0, 1]), "c": unit([1, 0], [0, 1])})
    table = pd.DataFrame({"mt": ["a", "b"], "ref": ["c", "c"]}, index=[7, 9])
    out = alignment_features(table, states, against="ref", tau=0.5)
    assert list(out.index) == [7, 9]
    assert list(out.columns) == [f"ref_L1_{n}" for n in FEATURE_NAMES]
    np.testing.assert_allclose(out.loc[7, "ref_L1_recall"], 0.5)


def test_missing_column_is_refused():
    with pytest.raises(DataError, match=r"no column\(s\) \['src'\]"):
        alignment_features(pd.DataFrame({"mt": ["a"]}), FakeStates({}), against="src")
