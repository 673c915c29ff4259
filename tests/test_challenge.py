"""Critical-error perturbations (uamt.challenge): each mode, the challenge set, synthetic training rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from uamt.challenge import (
    MODES,
    NON_TRANSLATION_MQM,
    Pools,
    challenge_set,
    perturb,
    synthetic_failures,
    synthetic_score_range,
    with_synthetic_failures,
)
from uamt.core.errors import DataError


def _rows() -> pd.DataFrame:
    # Two LPs sharing one English source (wrong_language), two documents per LP (unrelated).
    return pd.DataFrame(
        [
            ("wmt21_mqm", "en-de", "The cat is on the mat.", "Die Katze ist auf der Matte.", "Die Katze ist auf der Matte.", "d1", 0.0),
            ("wmt21_mqm", "en-ru", "The cat is on the mat.", "Кошка не на коврике.", "Кошка на коврике.", "d1", -1.0),
            ("wmt21_mqm", "en-de", "He paid 40 dollars. She left.", "Er zahlte 40 Dollar. Sie ging danach heim.", "Er hat 40 Dollar bezahlt. Sie ging.", "d2", -0.5),
            ("wmt21_mqm", "en-ru", "Prices rose by 3 percent today.", "Цены выросли на 3 процента сегодня.", "Цены сегодня выросли на 3 процента.", "d3", -7.0),
            ("wmt21_mqm", "zh-en", "他没有来。", "He was not here today at all.", "He did not come.", "d4", 0.0),
            ("wmt21_mqm", "zh-en", "价格上涨。", "Prices went up sharply in May.", "Prices rose.", "d5", -2.0),
        ],
        columns=["dataset", "lp", "src", "mt", "ref", "doc", "score"],
    ).assign(system="sys", seg_id=range(6), split="d_q", n_annotators=1, annotator_scores=[[0.0]] * 6)


@pytest.mark.parametrize(
    ("mode", "row", "expected"),
    [
        ("omission_end", 4, "He was not here"),  # 7 words -> 3 cut
        ("omission_end", 0, "Die Katze ist"),  # 6 words -> 3 cut
        ("omission_sentence", 0, None),  # one sentence: does not apply
        ("duplication", 4, "He was not here today at all. He was not here today at all."),
        ("untranslated", 4, "他没有来。"),
        ("wrong_language", 0, "Кошка на коврике."),
        ("wrong_language", 4, None),  # no other-language translation of this source
        ("negation", 4, "He was here today at all."),  # en: "was not" -> "was"
        ("negation", 0, "Die Katze ist nicht auf der Matte."),
        ("negation", 1, "Кошка на коврике."),  # ru: "не" removed
        ("number", 0, None),
    ],
)
def test_each_mode_on_a_row(mode, row, expected):
    df = _rows()
    out = perturb(df.iloc[row], mode, Pools.from_rows(df), np.random.default_rng(0))
    assert out == expected


def test_omission_drops_a_whole_sentence_never_a_title_or_a_full_stop():
    df = _rows()
    row = df.iloc[0].copy()
    row["mt"] = "Prof. Dr. Müller kam am 12. Juli nach Berlin. Er blieb dort drei Wochen."
    outs = {perturb(row, "omission_sentence", Pools.from_rows(df), np.random.default_rng(seed)) for seed in range(20)}
    assert outs == {"Prof. Dr. Müller kam am 12. Juli nach Berlin.", "Er blieb dort drei Wochen."}


def test_random_modes_draw_from_the_right_pools():
    df = _rows()
    pools, rng = Pools.from_rows(df), np.random.default_rng(0)
    sentence = perturb(df.iloc[2], "omission_sentence", pools, rng)
    assert sentence in {"Er zahlte 40 Dollar.", "Sie ging danach heim."}
    number = perturb(df.iloc[2], "number", pools, rng)
    assert number != df.iloc[2]["mt"] and "40" not in number
    unrelated = perturb(df.iloc[0], "unrelated", pools, rng)
    assert unrelated == "Er hat 40 Dollar bezahlt. Sie ging."  # the only other-document en-de reference
    gibberish = perturb(df.iloc[4], "gibberish", pools, rng)
    assert gibberish is None  # zh-en references have < 10 distinct words: no vocabulary to draw from


def test_unknown_mode_is_refused():
    df = _rows()
    with pytest.raises(ValueError, match=r"mode='typo' not supported; choose from \['duplication'"):
        perturb(df.iloc[0], "typo", Pools.from_rows(df), np.random.default_rng(0))


def test_challenge_set_keeps_good_rows_and_the_original():
    df = _rows()
    out = challenge_set(df, MODES, per_mode=10, seed=0, min_score=-1.0)
    assert (out["score"] >= -1.0).all()
    assert (out["mt"] != out["mt_original"]).all()
    counts = out.groupby("mode").size().to_dict()
    assert counts["duplication"] == 4  # the 4 rows rated >= -1
    assert counts["wrong_language"] == 2  # the shared source, both directions
    assert "omission_sentence" in counts and counts["omission_sentence"] == 1


def test_each_mode_draws_the_same_rows_alone_or_with_the_others():
    df = pd.concat([_rows()] * 5, ignore_index=True)
    together = challenge_set(df, MODES, per_mode=3, seed=4, min_score=None)
    for mode in ("omission_end", "number", "duplication"):
        alone = challenge_set(df, (mode,), per_mode=3, seed=4, min_score=None)
        pd.testing.assert_frame_equal(together[together["mode"] == mode].reset_index(drop=True), alone)


def test_synthetic_failures_counts_and_scores():
    df = pd.concat([_rows()] * 50, ignore_index=True)  # 300 rows
    out = synthetic_failures(df, fraction=0.02, worst_score=-25.0, best_score=0.0, modes=("duplication", "untranslated"))
    bad = out[out["system"] != "synthetic-reference"]
    good = out[out["system"] == "synthetic-reference"]
    assert len(bad) == 6 and set(bad["system"]) == {"synthetic-duplication", "synthetic-untranslated"}
    assert (bad["score"] == -25.0).all()
    assert len(good) == 6 and (good["mt"] == good["ref"]).all() and (good["score"] == 0.0).all()
    assert (out["split"] == "d_q").all()


def test_synthetic_fraction_bounds():
    with pytest.raises(ValueError, match="fraction=0.5 must be in"):
        synthetic_failures(_rows(), 0.5, -25.0, 0.0)


@pytest.mark.parametrize(
    ("scale", "expected"),
    [((-25.0, 0.0), (-25.0, 0.0)), ((-200.0, 0.0), (NON_TRANSLATION_MQM, 0.0)), ((-10.0, 0.0), (-10.0, 0.0))],
)
def test_synthetic_score_range_of_mqm_scales(scale, expected):
    assert synthetic_score_range(*scale) == expected


def test_synthetic_score_range_refuses_da():
    with pytest.raises(DataError, match=r"defined for MQM scales.*\[-20.0, 20.0\]"):
        synthetic_score_range(-20.0, 20.0)


def test_with_synthetic_failures_zero_is_identity_and_da_is_refused():
    df = pd.concat([_rows()] * 50, ignore_index=True)
    assert with_synthetic_failures(df, 0.0) is df
    added = with_synthetic_failures(df, 0.02)
    extra = added.iloc[len(df):]
    assert len(extra) > 0 and set(extra["score"]) == {-25.0, 0.0}
    assert extra["annotator_scores"].map(len).eq(1).all()
    with pytest.raises(DataError, match="dataset 'wmt21_da'"):
        with_synthetic_failures(df.assign(dataset="wmt21_da"), 0.02)


def test_train_config_reads_synthetic_failures(tmp_path):
    from uamt.models.config import load_train_config

    params = tmp_path / "params.yaml"
    params.write_text("train_base:\n  synthetic_failures: 0.01\n")
    assert load_train_config("hts", params).synthetic_failures == 0.01
    params.write_text("train_base:\n  synthetic_failures: lots\n")
    with pytest.raises(Exception, match="synthetic_failures"):
        load_train_config("hts", params)


def test_train_base_stage_trains_on_the_synthetic_rows(tmp_path, monkeypatch):
    """The stage hands its trainings d_q plus the synthetic rows of train_base.synthetic_failures."""
    from uamt.models.config import TrainConfig
    from uamt.stages import train_base

    prepared = tmp_path / "prepared"
    prepared.mkdir()
    d_q = pd.concat([_rows()] * 50, ignore_index=True)
    d_q.to_parquet(prepared / "d_q.parquet")
    d_q.assign(split="dev").to_parquet(prepared / "dev.parquet")
    seen = []
    monkeypatch.setattr(train_base, "open_features", lambda encode: None)
    monkeypatch.setattr(train_base, "train_jobs", lambda jobs, load, *a, **k: seen.append((jobs, load()[0])) or {})
    pipe = train_base.load_pipeline().__class__(**{**vars(train_base.load_pipeline()), "prepared_dir": str(prepared), "datasets": ("wmt21_mqm",)})
    for fraction, extra in ((0.0, 0), (0.02, 13)):  # 0.02 x 300: 1 row per mode (7) + 6 references
        seen.clear()
        train_base.run(train_base.TrainBaseConfig(pipe, TrainConfig(synthetic_failures=fraction), None))
        [(jobs, train_df)] = seen
        assert len(train_df) == len(d_q) + extra
        assert {suffix for _, _, suffix in jobs} == {"", "_qe"}  # reference-based and QE, the same rows
