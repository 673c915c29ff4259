"""Loaders on small real slices of the offline mirror."""

from __future__ import annotations

import math

import numpy as np
import pytest

from uamt.data import loaders
from uamt.data.schema import COLUMNS, read_lines

WMT = "wmt-conference/wmt21-news-systems"


def _check_canonical(df):
    assert list(df.columns) == list(COLUMNS)
    assert (df["src"].str.strip() != "").all() and (df["mt"].str.strip() != "").all()
    assert np.isfinite(df["score"]).all() and np.isfinite(df["score_raw"]).all()
    assert (df["split"] == "").all()
    for ref, refs in zip(df["ref"], df["refs"], strict=True):
        assert (ref is None and refs == []) or ref == refs[0]


def test_wmt21_da_is_en_real_documents_and_annotators(mirror_root):
    df = loaders.load_wmt21_da(mirror_root, lps=("is-en",))
    _check_canonical(df)
    assert len(df) == 8903  # every row of ad-seg-scores-is-en.csv (no HUMAN in is-en)
    assert df["doc"].str.startswith("newstest2021/is/").all() and df["doc"].nunique() == 47
    row = df[(df.system == "Manifold") & (df.seg_id == 984)].iloc[0]
    src = read_lines(mirror_root / WMT / "txt/sources/newstest2021.is-en.src.is")
    hyp = read_lines(mirror_root / WMT / "txt/system-outputs/newstest2021.is-en.hyp.Manifold.en")
    assert row.src == src[983] and row.mt == hyp[983]
    assert row.score == pytest.approx(-0.591803831421895) and row.score_raw == pytest.approx(53.6666666666667)
    assert row.n_annotators == 3
    # annotator lists: SYSTEM judgements only, never more than N; mostly their mean is Z.SCR
    lens = df["annotator_scores"].map(len)
    assert (lens <= df["n_annotators"]).all() and (lens >= 1).all()
    full = df[lens == df["n_annotators"]]
    means = full["annotator_scores"].map(np.mean)
    assert np.isclose(means, full["score"]).mean() > 0.95
    multi = df[lens >= 2]
    assert np.allclose(multi["score_std"], multi["annotator_scores"].map(lambda a: np.std(a, ddof=1)))
    assert df.loc[lens < 2, "score_std"].isna().all()


def test_wmt21_da_human_is_reference_b_scored_against_a(mirror_root):
    df = loaders.load_wmt21_da(mirror_root, lps=("cs-en",))
    human = df[df.system == "HUMAN-refB"]
    assert len(human) == 913
    ref_a = read_lines(mirror_root / WMT / "txt/references/newstest2021.cs-en.ref.A.en")
    ref_b = read_lines(mirror_root / WMT / "txt/references/newstest2021.cs-en.ref.B.en")
    row = human.iloc[0]
    assert row.mt == ref_b[row.seg_id - 1] and row.ref == ref_a[row.seg_id - 1] and row.refs == [row.ref]
    other = df[df.system == "Online-A"].iloc[0]
    assert other.refs == [ref_a[other.seg_id - 1], ref_b[other.seg_id - 1]]
    assert df["doc"].str.contains("/pseudo-").all()  # no document ids published for cs-en


def test_wmt21_da_zh_en_human_dropped_no_annotator_file(mirror_root, caplog):
    with caplog.at_level("INFO"):
        df = loaders.load_wmt21_da(mirror_root, lps=("zh-en",), drop_empty_mt=True)
    assert "HUMAN" not in " ".join(df.system.unique())
    assert "dropped 1543 rows: HUMAN = reference B" in caplog.text
    assert (df["annotator_scores"].map(len) == 0).all() and df["score_std"].isna().all()


def test_wmt21_mqm_en_de(mirror_root, caplog):
    with caplog.at_level("INFO"):
        df = loaders.load_wmt21_mqm(mirror_root, lps=("en-de",))
    _check_canonical(df)
    systems = set(df.system)
    assert "NVIDIA-NeMo" in systems and "Nemo" not in systems
    assert not any(s.startswith("metricsystem") for s in systems) and "ref-B" not in systems
    assert {"ref-A", "ref-C", "ref-D"} <= systems
    assert len(df) == 527 * 11  # 8 systems + 3 references with text, 527 rated segments each
    refs = {x: read_lines(mirror_root / WMT / f"txt/references/newstest2021.en-de.ref.{x}.de") for x in "ACD"}
    row = df[df.system == "ref-C"].iloc[0]
    assert row.mt == refs["C"][row.seg_id - 1] and row.refs == [
        refs["A"][row.seg_id - 1],
        refs["D"][row.seg_id - 1],
    ]
    assert (df["score"] <= 0).all()
    assert "rated reference ref-B: its text is not in the data" in caplog.text


def test_ted_mqm_zh_en(mirror_root):
    df = loaders.load_ted_mqm(mirror_root, lps=("zh-en",))
    _check_canonical(df)
    assert (df.domain == "ted").all() and df.doc.str.startswith("ted/zh/talk.").all()
    assert not df["mt"].str.contains("<v>|</v>").any()
    a = df[df.system == "ref-A"].iloc[0]
    b = df[(df.system == "ref-B") & (df.seg_id == a.seg_id)].iloc[0]
    assert a.ref == b.mt and b.ref == a.mt  # each rated reference is scored against the other
    assert len(df) == 529 * 15


def test_mlqe_si_en(mirror_root):
    df = loaders.load_mlqe(mirror_root, lps=("si-en",))
    _check_canonical(df)
    assert len(df) == 9000 and df.seg_id.tolist() == list(range(1, 9001))
    assert df["ref"].isna().all() and (df["refs"].map(len) == 0).all()
    assert np.allclose(df["annotator_scores"].map(np.mean), df["score"])
    assert (df["n_annotators"] == df["annotator_scores"].map(len)).all()
    assert ((df["score_raw"] >= 0) & (df["score_raw"] <= 100)).all()


def test_qt21_hter_no_duplicates(mirror_root):
    df = loaders.load_qt21_hter(mirror_root)
    _check_canonical(df)
    # the six per-system files only (test.csv is their union): 6000 rows, one per (lp, system, seg)
    assert len(df) == 6000 and not df.duplicated(["lp", "system", "seg_id"]).any()
    assert set(df.lp) == {"en-de", "en-lv", "en-cs", "de-en"} and (df.score >= 0).all()


def test_multihyp_eten(mirror_root):
    df = loaders.load_multihyp_eten(mirror_root)
    _check_canonical(df)
    assert len(df) == 1000 and (df["refs"].map(len) == 2).all()
    assert (df["n_annotators"] == 0).all() and all(math.isnan(x) for x in df["score_std"])
