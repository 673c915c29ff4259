"""benchmarks/sentence_scoring.py: paragraphs cut into aligned sentence units, and its dev-fitted variants."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from benchmarks.sentence_scoring import DESIGNS, apply_variants, fit_variants, sentence_units

REF = ["Der Ausschuss tagte am Montag.", "Er beschloss einen neuen Haushalt.", "Die Sitzung endete um acht Uhr."]


def test_units_pair_each_reference_sentence_with_its_source_sentence_or_give_up():
    src = "The committee met on Monday. It adopted a new budget. The meeting ended at eight."
    units, omitted, added = sentence_units(src, f"{REF[0]} {REF[2]}", " ".join(REF), 0.2)
    assert units == [("The committee met on Monday.", REF[0], REF[0]), ("The meeting ended at eight.", REF[2], REF[2])]
    assert (omitted, added) == (1, 0)
    # a source of another sentence count: which source sentence a reference sentence translates is unknown
    assert sentence_units("The committee met on Monday and adopted a budget.", REF[0], " ".join(REF), 0.2) is None


def test_variants_are_fitted_on_dev_and_rows_without_units_keep_the_paragraph_mu():
    rng = np.random.default_rng(0)
    n = 400
    omitted = rng.integers(0, 3, n).astype(float)
    features = pd.DataFrame({"paragraph": rng.normal(-5, 2, n), "sum": rng.normal(-5, 2, n), "omitted": omitted,
                             "added": rng.integers(0, 2, n).astype(float), "units": 3})  # fmt: skip
    human = 2.0 + 0.5 * features["paragraph"] + 0.8 * features["sum"] - 4.0 * omitted
    weights = fit_variants(features, human.to_numpy())
    assert set(weights) == set(DESIGNS)
    assert weights["blend"] == pytest.approx([2.0, 0.5, 0.8, -4.0, 0.0], abs=1e-9)
    features.loc[0, ["sum", "omitted", "added"]] = np.nan  # no units: source and reference counts differ
    scored = apply_variants(features, weights)
    assert scored.loc[0].tolist() == [features.loc[0, "paragraph"]] * len(scored.columns)
    assert scored.loc[1:, "blend"].to_numpy() == pytest.approx(human.loc[1:].to_numpy())
