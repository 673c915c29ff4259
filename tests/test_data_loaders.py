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
    # annotator lists: one score per distinct worker (a REPEAT averaged into its worker's score)
    lens = df["annotator_scores"].map(len)
    # every row is in good-stnd (one with N = 2 has one judgement there: n_annotators 1)
    assert (lens == df["n_annotators"]).all() and (lens >= 1).all()
    # Z.SCR is the mean of every judgement; every worker of an item judged it equally often (both
    # or neither repeated), so the mean of the workers' scores is still Z.SCR
    assert np.allclose(df["annotator_scores"].map(np.mean), df["score"])
    assert (lens >= 2).sum() == 1132  # 1,917 items had >= 2 judgements, 785 of them from one worker
    multi = df[lens >= 2]
    assert np.allclose(multi["score_std"], multi["annotator_scores"].map(lambda a: np.std(a, ddof=1)))
    assert df.loc[lens < 2, "score_std"].isna().all()


def test_wmt21_da_repeat_judgements_are_one_rater(mirror_root):
    """A REPEAT is the same worker judging the item again: averaged into one score per worker."""
    per_item = loaders._da_annotator_scores(
        mirror_root / WMT / "humaneval/newstest2021-toen/ad-isen-good-stnd.csv"
    )
    # Allegro.eu.2 SID 51: M0141 REPEAT -0.423092, SYSTEM -0.967898; M0028 REPEAT -0.625297,
    # SYSTEM -0.411210 (4 judgements, N = 4, 2 workers)
    assert per_item[("Allegro.eu.2", 51)] == pytest.approx([-0.695495, -0.5182535], abs=1e-6)
    # Allegro.eu.2 SID 4: M1292 SYSTEM 0.735824, REPEAT 0.985782: one rater, no spread
    assert per_item[("Allegro.eu.2", 4)] == pytest.approx([0.860803], abs=1e-6)
    repeated = sum(len(v) < 2 for v in per_item.values())
    assert len(per_item) == 8903 and repeated == 8903 - 1132


def test_wmt21_da_segment_ids_follow_sorted_document_order(mirror_root):
    """DA SID 241 of ja-en is line 30 (the 241st segment in document-id order), not line 241."""
    df = loaders.load_wmt21_da(mirror_root, lps=("ja-en",))
    src = read_lines(mirror_root / WMT / "txt/sources/newstest2021.ja-en.src.ja")
    hyp = read_lines(mirror_root / WMT / "txt/system-outputs/newstest2021.ja-en.hyp.KwaiNLP.en")
    row = df[(df.system == "KwaiNLP") & (df.seg_id == 30)].iloc[0]
    assert row.mt == hyp[29] == "Sekiwaki Masayo pushed Hekizan down and kept one defeat."
    assert row.src == src[29] and row.score == pytest.approx(-2.29051496483106)
    assert not (df.mt == "Other participating musicians are as follows.").any() or (
        df[df.mt == "Other participating musicians are as follows."].score != row.score
    ).all()


def test_wmt21_da_rid_blocks_are_documents(mirror_root):
    """Independent check of the join: the SIDs that good-stnd groups under one ``rid`` (one HIT's
    document) all land in one document of the sorted order."""
    import pandas as pd

    text = loaders.Newstest2021(mirror_root, "ru-en", 10)
    line_of_sid = text.line_of_da_sid()
    stnd = pd.read_csv(mirror_root / WMT / "humaneval/newstest2021-toen/ad-ruen-good-stnd.csv", sep=r"\s+")
    stnd = stnd[stnd["type"].isin(["SYSTEM", "REPEAT"])]
    docs = stnd.groupby("rid")["sid"].agg(lambda sids: {text.doc(line_of_sid[s - 1]) for s in sids})
    assert (docs.map(len) == 1).all()
    file_order = stnd.groupby("rid")["sid"].agg(lambda sids: {text.doc(s) for s in sids})
    assert (file_order.map(len) > 1).mean() > 0.5  # reading SID as a line number splits them


def test_wmt21_da_human_is_reference_b_scored_against_a(mirror_root):
    df = loaders.load_wmt21_da(mirror_root, lps=("ru-en",))
    human = df[df.system == "HUMAN-refB"]
    assert len(human) == 906
    ref_a = read_lines(mirror_root / WMT / "txt/references/newstest2021.ru-en.ref.A.en")
    ref_b = read_lines(mirror_root / WMT / "txt/references/newstest2021.ru-en.ref.B.en")
    row = human.iloc[0]
    assert row.mt == ref_b[row.seg_id - 1] and row.ref == ref_a[row.seg_id - 1] and row.refs == [row.ref]
    other = df[df.system == "Online-A"].iloc[0]
    assert other.refs == [ref_a[other.seg_id - 1], ref_b[other.seg_id - 1]]


def test_wmt21_da_without_document_ids_left_out(mirror_root, caplog):
    with caplog.at_level("WARNING"):
        df = loaders.load_wmt21_da(mirror_root, lps=("is-en", "zh-en", "cs-en"))
    assert set(df.lp) == {"is-en"}
    assert set(df.attrs["left_out"]) == {"zh-en", "cs-en"}
    assert "no public document ids" in df.attrs["left_out"]["zh-en"]
    assert "wmt21_da zh-en: left out" in caplog.text


def test_wmt21_mqm_en_de(mirror_root, caplog):
    with caplog.at_level("INFO"):
        df = loaders.load_wmt21_mqm(mirror_root, lps=("en-de",))
    _check_canonical(df)
    systems = set(df.system)
    assert "NVIDIA-NeMo" in systems and "Nemo" not in systems
    # metricsystem1-5 and ref-B take their text from the WMT-QE 2023 file (test_data_wmt21_qe.py)
    assert {f"metricsystem{k}" for k in range(1, 6)} | {"ref-A", "ref-B", "ref-C", "ref-D"} <= systems
    assert len(df) == 527 * 17 - 9  # 13 systems + 4 references, less 9 metricsystem items without text
    refs = {x: read_lines(mirror_root / WMT / f"txt/references/newstest2021.en-de.ref.{x}.de") for x in "ACD"}
    row = df[df.system == "ref-C"].iloc[0]
    assert row.mt == refs["C"][row.seg_id - 1] and row.refs == [
        refs["A"][row.seg_id - 1],
        refs["D"][row.seg_id - 1],
    ]
    assert (df["score"] <= 0).all()
    assert "dropped 2 rows: system metricsystem1: no text (segment not in the QE file)" in caplog.text
    # real newstest2021 documents from the QE file, not pseudo-documents
    assert df["doc"].str.startswith("newstest2021/en/").all() and not df["doc"].str.contains("pseudo").any()


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
