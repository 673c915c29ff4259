"""Surface features beside the COMET features (uamt.surface_features)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from uamt.core.errors import DataError
from uamt.surface_features import FEATURES, copy_rate, length_ratio, surface_features


@pytest.mark.parametrize(
    ("src", "mt", "expected"),
    [
        ("The cat sat.", "The cat sat.", 1.0),  # untranslated copy
        ("The cat sat.", "Die Katze saß.", 0.0),
        ("Biden met Xi in 2021.", "Biden traf Xi 2021.", 0.75),  # names and numbers carry over
        ("anything", "...", 0.0),  # no words
    ],
)
def test_copy_rate(src, mt, expected):
    assert copy_rate(src, mt) == pytest.approx(expected)


def test_length_ratio_is_a_signed_log():
    assert length_ratio("abc", "abc") == 0.0
    assert length_ratio("a" * 9, "") == pytest.approx(math.log(10))
    assert length_ratio("", "a" * 9) == pytest.approx(-math.log(10))


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "src": ["The cat is on the mat.", "他没有来。", "The house is big and old."],
            "mt": ["Die Katze ist auf der Matte.", "他没有来。", "Дом большой и старый."],
            "ref": ["Die Katze sitzt auf der Matte.", "He did not come.", "Das Haus ist groß und alt."],
            "lp": ["en-de", "zh-en", "en-de"],
        }
    )


def test_surface_features_flag_copies_and_wrong_languages():
    out = surface_features(_frame())
    assert list(out.columns) == list(FEATURES)
    good, copied, russian = out.to_dict("records")
    assert good["chrf"] > 50 and good["ter"] < 50 and good["target_language_prob"] > 0.9
    assert copied["copy_rate"] == 1.0 and copied["chrf"] == 0.0 and copied["target_language_prob"] < 0.1
    assert russian["target_language_prob"] < 0.1  # en-de translated into Russian
    assert good["copy_rate"] == 0.0


def test_without_reference_or_ter_the_reference_columns_are_nan():
    out = surface_features(_frame().drop(columns=["ref"]))
    assert out[["chrf", "ter", "len_ratio_ref"]].isna().all().all()
    assert np.isfinite(out[["len_ratio_src", "copy_rate", "target_language_prob"]].to_numpy()).all()
    no_ter = surface_features(_frame(), with_ter=False)
    assert no_ter["ter"].isna().all() and no_ter["chrf"].notna().all()


def test_missing_column_is_named():
    with pytest.raises(DataError, match=r"column\(s\) \['lp'\] missing"):
        surface_features(_frame().drop(columns=["lp"]))


def test_only_the_language_feature_needs_the_language_pair():
    out = surface_features(_frame().drop(columns=["lp"]), names=["copy_rate", "len_ratio_src"])
    assert list(out.columns) == ["copy_rate", "len_ratio_src"]
    with pytest.raises(ValueError, match=r"feature='bleu' not supported; choose from"):
        surface_features(_frame(), names=["bleu"])
