"""Biomedical MQM loader: real directions of the offline mirror, and bad input on small synthetic files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from uamt.core.errors import DataError
from uamt.data.schema import COLUMNS
from uamt.data.sources import bio_mqm
from uamt.data.sources.bio_mqm import bio_doc_key, bio_doc_splits, load_bio_mqm

REFS = bio_mqm.BIO_REFERENCE_ENGINES


@pytest.fixture(scope="module")
def bio(mirror_root):
    """de-en (has misaligned annotations) and fr-en (clean), loaded once."""
    return load_bio_mqm(mirror_root, lps=("de-en", "fr-en"))


def _one(df, lp, system, seg_id):
    rows = df[(df["lp"] == lp) & (df["system"] == system) & (df["seg_id"] == seg_id)]
    assert len(rows) == 1
    return rows.iloc[0]


# ----------------------------------------------------------------------------- real data


def test_rows_per_direction(bio):
    assert list(bio.columns) == list(COLUMNS)
    assert bio.groupby("lp").size().to_dict() == {"de-en": 5370, "fr-en": 4745}
    assert not bio.duplicated(["lp", "system", "seg_id"]).any()
    assert (bio["dataset"] == "bio_mqm").all() and (bio["domain"] == "biomedical").all()
    assert (bio["year"] == 2021).all()
    assert bio.groupby("lp")["system"].nunique().to_dict() == {"de-en": 13, "fr-en": 13}  # every file
    assert (bio["score"] <= 0).all() and (bio["score"] >= bio_mqm.BIO_MQM_RANGE[0]).all()
    assert (bio["score"] == bio["score_raw"]).all()
    # fr-en is clean; de-en loses the annotations whose text belongs to another segment
    assert bio.attrs["dropped"]["fr-en"] == {}
    dropped = bio.attrs["dropped"]["de-en"]
    assert dropped[bio_mqm.COPIED_TEXT] == 802 and dropped[bio_mqm.OTHER_SOURCE] == 29


def test_hand_checked_row(bio):
    """fr2en/nrpu-fjwu_run1.json, doc92 SEG_ID 8, annotator AB-F.

    target: Minor Terminology 1 + Minor Linguistic_conventions/Punctuation 0.1 + Critical (as
    Major) 5 + Neutral 0; source: Neutral Omission 0 + Minor Omission 1 + Neutral Omission 0.
    """
    row = _one(bio, "fr-en", "nrpu-fjwu_run1", 92 * 10_000 + 8)
    assert row["score"] == pytest.approx(-7.1)
    assert row["annotator_scores"] == pytest.approx([-7.1])
    assert row["n_annotators"] == 1 and math.isnan(row["score_std"])
    assert row["src"].startswith("Nous avons résumé la concordance entre des groupes")
    assert row["mt"].startswith("We summarized agreement between pairs of comparisons")
    assert row["doc"] == "bio/fr/fr-en.doc92" == bio_doc_key("fr-en", "doc92")
    assert len(row["refs"]) == 2 and row["ref"] == row["refs"][0]
    assert row["refs"][0] == _one(bio, "fr-en", "reference", row["seg_id"])["mt"]
    assert row["refs"][1] == _one(bio, "fr-en", "reference_r1", row["seg_id"])["mt"]


def test_doubly_annotated_items(bio):
    # fr2en/Huawei_AGI_run1.json doc24 SEG_ID 2: BG Major 5 + Minor 1; JPT Minor 1 + Neutral 0
    row = _one(bio, "fr-en", "Huawei_AGI_run1", 240_002)
    assert row["annotator_scores"] == pytest.approx([-6.0, -1.0])
    assert row["n_annotators"] == 2 and row["score"] == pytest.approx(-3.5)
    assert row["score_std"] == pytest.approx(np.std([-6.0, -1.0], ddof=1))
    # doc50 SEG_ID 1: AB-F Minor punctuation 0.1 + Minor 1; BG Minor punctuation 0.1
    row = _one(bio, "fr-en", "Huawei_AGI_run1", 500_001)
    assert row["annotator_scores"] == pytest.approx([-1.1, -0.1]) and row["score"] == pytest.approx(-0.6)
    lens = bio["annotator_scores"].map(len)
    assert (lens == bio["n_annotators"]).all() and set(lens) == {1, 2}
    assert np.allclose(bio["annotator_scores"].map(np.mean), bio["score"])
    assert (bio["n_annotators"] == 2).groupby(bio["lp"]).sum().to_dict() == {"de-en": 822, "fr-en": 520}


def test_reference_rows(bio):
    texts = {
        (lp, system, seg): mt
        for lp, system, seg, mt in zip(bio["lp"], bio["system"], bio["seg_id"], bio["mt"], strict=True)
        if system in REFS
    }
    refs = bio[bio["system"].isin(REFS)]
    assert len(refs) > 1000
    for lp, system, seg, row_refs in zip(
        refs["lp"], refs["system"], refs["seg_id"], refs["refs"], strict=True
    ):
        other = REFS[1] if system == REFS[0] else REFS[0]
        assert row_refs == [texts[(lp, other, seg)]]  # the other reference, only
    # system rows: both references where present, `reference` first (a reference whose rated row
    # was dropped for want of the other one still serves as the reference of the systems)
    systems = bio[~bio["system"].isin(REFS)]
    assert set(systems["refs"].map(len)) == {1, 2}
    for lp, seg, row_refs in zip(systems["lp"], systems["seg_id"], systems["refs"], strict=True):
        if (lp, REFS[0], seg) in texts and (lp, REFS[1], seg) in texts:
            assert row_refs == [texts[(lp, REFS[0], seg)], texts[(lp, REFS[1], seg)]]
        elif (lp, REFS[0], seg) in texts:
            assert row_refs[0] == texts[(lp, REFS[0], seg)]


def test_one_source_per_segment_and_misaligned_rows_gone(bio):
    # after dropping misaligned annotations every engine shows the same source for a segment
    assert (bio.groupby(["lp", "seg_id"])["src"].nunique() == 1).all()
    # de2en/HuaweiTSC_run1.json doc3 SEG_ID 3 and 4 repeat the text of SEG_ID 1 (their error
    # spans do not fit it): dropped; SEG_ID 1 stays
    de = bio[(bio["lp"] == "de-en") & (bio["system"] == "HuaweiTSC_run1")]
    assert 30_001 in set(de["seg_id"]) and not {30_003, 30_004} & set(de["seg_id"])
    assert _one(bio, "de-en", "reference", 30_003)["src"].startswith("Material und Methoden")


def test_chrf_tracks_score_on_system_rows(bio):
    """The join check of `uamt data prepare`: sentence chrF vs MQM on de-en system rows.

    r = 0.36 here; reading the annotations without the misalignment filter gives 0.23, a wrong
    join about 0.
    """
    import sacrebleu

    rows = bio[(bio["lp"] == "de-en") & ~bio["system"].isin(REFS)]
    chrf = [sacrebleu.sentence_chrf(mt, [ref]).score for mt, ref in zip(rows["mt"], rows["ref"], strict=True)]
    r = np.corrcoef(chrf, rows["score"])[0, 1]
    assert r > 0.3


def test_bio_doc_splits(mirror_root, bio):
    splits = bio_doc_splits(mirror_root)
    assert len(splits) == 550 and set(splits.values()) == {"dev", "test"}
    assert set(bio["doc"]) <= set(splits)  # 50 documents each in de-en and fr-en
    assert splits["bio/de/de-en.doc7"] == "dev" and splits["bio/de/de-en.doc2"] == "test"
    assert splits["bio/en/en-de.doc4"] == "dev"
    assert sum(doc.startswith("bio/pt/pt-en.") for doc in splits) == 50  # the file's "br-en"
    assert not any(doc.startswith(("bio/en/en-eu.", "bio/it/it-en.")) for doc in splits)
    de = bio[bio["lp"] == "de-en"]
    docs = de.drop_duplicates("doc")["doc"].map(splits)
    assert docs.value_counts().to_dict() == {"test": 34, "dev": 16}  # as in the file


# ----------------------------------------------------------------------------- synthetic files


def _item(
    doc="doc1",
    seg="1",
    src="Quelle.",
    tgt="Target.",
    engine="sysA",
    annotator="A1",
    errors=(),
    source_errors=(),
):
    return {
        "source": src,
        "target": tgt,
        "SEG_ID": seg,
        "filename": f"de_en_{doc}.txt",
        "MT_Engine": engine,
        "source_errors": [_error(*e) for e in source_errors],
        "target_errors": [_error(*e) for e in errors],
        "Annotator_ID": annotator,
        "DOC_ID": doc,
    }


def _error(severity, category, subcategory=""):
    return {
        "term": "x",
        "startIndex": 0,
        "endIndex": 0,
        "error_category": category,
        "error_subcategory": subcategory,
        "severity": severity,
    }


def _write(root, engine, items, lp="de2en", raw=None):
    folder = root / bio_mqm.BIO_MQM_REPO / bio_mqm.BIO_MQM_DIR / lp
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{engine}.json"
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text(json.dumps(items, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


def _good(root):
    refs = [
        _item(seg="1", src="S1.", tgt="R1.", engine="reference"),
        _item(seg="2", src="S2.", tgt="R2.", engine="reference"),
    ]
    _write(root, "reference", refs)
    _write(root, "reference_r1", [_item(seg="1", src="S1.", tgt="Q1.", engine="reference_r1")])
    system = [
        _item(
            seg="1",
            src="S1.",
            tgt="T1.",
            errors=[
                ("Critical", "Accuracy", "Mistranslation"),
                ("Minor", "Linguistic_conventions", "Punctuation"),
                ("Neutral", "Style", "Non_fluent"),
            ],
            source_errors=[("Major", "Accuracy", "Omission"), ("Major", "Source")],
        ),
        _item(seg="1", src="S1.", tgt="T1.", annotator="A2", errors=[("Minor", "Style", "Non_fluent")]),
        _item(seg="2", src="S2.", tgt="T2."),
        # a misaligned annotation: SEG_ID 3 showing the text of SEG_ID 1
        _item(seg="3", src="S1.", tgt="T1.", errors=[("Major", "Terminology", "Wrong_term")]),
    ]
    _write(root, "sysA", system)


def test_synthetic_scores_refs_and_drops(tmp_path):
    _good(tmp_path)
    df = load_bio_mqm(tmp_path, lps=("de-en",))
    rows = {(s, i): r for s, i, r in zip(df["system"], df["seg_id"], df.to_dict("records"), strict=True)}
    first = rows[("sysA", 10_001)]
    # Critical 5 + punctuation 0.1 + Neutral 0 + source Omission 5 + Source-category 0; other rater 1
    assert first["annotator_scores"] == pytest.approx([-10.1, -1.0]) and first["score"] == pytest.approx(
        -5.55
    )
    assert first["refs"] == ["R1.", "Q1."] and first["doc"] == "bio/de/de-en.doc1"
    assert rows[("sysA", 10_002)]["refs"] == ["R2."] and rows[("sysA", 10_002)]["score"] == 0.0
    assert rows[("reference", 10_001)]["refs"] == ["Q1."] and rows[("reference_r1", 10_001)]["refs"] == [
        "R1."
    ]
    # reference SEG_ID 2 has no other reference; sysA SEG_ID 3 is a copy of SEG_ID 1
    assert ("reference", 10_002) not in rows and ("sysA", 10_003) not in rows
    assert df.attrs["dropped"]["de-en"] == {bio_mqm.COPIED_TEXT: 1, bio_mqm.NO_OTHER_REFERENCE: 1}
    kept = load_bio_mqm(tmp_path, lps=("de-en",), drop_systems={"sys*": "test"})
    assert set(kept["system"]) == set(REFS)  # a dropped system's rows go, references stay


def test_synthetic_source_vote(tmp_path):
    """An annotation whose source differs from the other engines' for its segment is dropped."""
    _write(tmp_path, "reference", [_item(seg="1", src="S1.", tgt="R1.", engine="reference")])
    _write(tmp_path, "reference_r1", [_item(seg="1", src="S1.", tgt="Q1.", engine="reference_r1")])
    _write(tmp_path, "sysA", [_item(seg="1", src="S9.", tgt="T9.")])
    _write(tmp_path, "sysB", [_item(seg="1", src="S1.", tgt="T1.", engine="sysB")])
    df = load_bio_mqm(tmp_path, lps=("de-en",))
    assert set(df["system"]) == {"reference", "reference_r1", "sysB"}
    assert df.attrs["dropped"]["de-en"] == {bio_mqm.OTHER_SOURCE: 1}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (
            [{k: v for k, v in _item().items() if k != "target_errors"}],
            r"sysA\.json: line 2 \(item 0\): missing key\(s\) \['target_errors'\]",
        ),
        (
            [_item(), _item(seg="2", tgt="  ")],
            r"sysA\.json: line \d+ \(item 1\): target is empty or whitespace-only",
        ),
        ([_item(src="")], r"sysA\.json: line 2 \(item 0\): source is empty"),
        (
            [_item(errors=[("Severe", "Accuracy")])],
            r"sysA\.json: line 2 \(item 0\): MQM severity 'Severe' not supported",
        ),
        (
            [_item(errors=[(None, "Accuracy")])],
            r"sysA\.json: line 2 \(item 0\): target_errors\[0\] needs string",
        ),
        (
            [_item(engine="sysB")],
            r"sysA\.json: line 2 \(item 0\): MT_Engine 'sysB' is not the engine of the file",
        ),
        ([_item(seg="x")], r"sysA\.json: line 2 \(item 0\): SEG_ID must be a positive integer, got 'x'"),
        ([_item(seg="0")], r"SEG_ID 0 is outside \[1, 9999\]"),
        ([_item(doc="d1")], r"sysA\.json: line 2 \(item 0\): DOC_ID must look like 'doc<number>', got 'd1'"),
        ([_item(), _item()], r"sysA\.json: line \d+: annotator 'A1' rates doc1 SEG_ID 1 twice"),
        (
            [_item(errors=[("Major", "Accuracy")] * 31)],
            r"sysA\.json: line 2: column 'target_errors' = -155 is outside \[-150, 0\]",
        ),
        ([], r"sysA\.json: no annotations"),
        ([["not", "an", "object"]], r"sysA\.json: line 2 \(item 0\): an annotation must be a JSON object"),
    ],
)
def test_bad_annotations(tmp_path, items, message):
    _write(tmp_path, "sysA", items)
    with pytest.raises(DataError, match=message):
        load_bio_mqm(tmp_path, lps=("de-en",))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'[\n {"source": "a",\n  "target": }\n]', r"sysA\.json: line 3: not valid JSON"),
        (b'{"source": "a"}', r"sysA\.json: expected a JSON list of annotations"),
        (b"[1, 2] 3", r"sysA\.json: line 1: not valid JSON: extra data after the list"),
        (b'[\n"\xff"\n]', r"sysA\.json: line 2: not valid UTF-8"),
    ],
)
def test_bad_json(tmp_path, raw, message):
    _write(tmp_path, "sysA", None, raw=raw)
    with pytest.raises(DataError, match=message):
        load_bio_mqm(tmp_path, lps=("de-en",))


def test_missing_folder_and_unknown_direction(tmp_path):
    with pytest.raises(DataError, match=r"de2en: bio_mqm de-en folder not found"):
        load_bio_mqm(tmp_path, lps=("de-en",))
    (tmp_path / bio_mqm.BIO_MQM_REPO / bio_mqm.BIO_MQM_DIR / "de2en").mkdir(parents=True)
    with pytest.raises(DataError, match=r"de2en: no <engine>\.json files"):
        load_bio_mqm(tmp_path, lps=("de-en",))
    with pytest.raises(DataError, match=r"bio_mqm: lp='xx-en' not supported"):
        load_bio_mqm(tmp_path, lps=("xx-en",))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"de-en": {"dev": ["doc1"], "test": ["doc1"]}},
            r"de-en: document 'doc1' is in both 'dev' and 'test'",
        ),
        ({"xx-en": {"dev": [], "test": []}}, r"unknown direction 'xx-en'"),
        ({"de-en": {"dev": []}}, r"de-en: expected exactly the lists 'dev' and 'test', found \['dev'\]"),
        (
            {"de-en": {"dev": ["7"], "test": []}},
            r"de-en\.dev: document id must look like 'doc<number>', got '7'",
        ),
        (["de-en"], r"expected an object"),
    ],
)
def test_bad_doc_splits(tmp_path, content, message):
    path = tmp_path / bio_mqm.BIO_MQM_REPO / bio_mqm.BIO_SPLITS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(content), encoding="utf-8")
    with pytest.raises(DataError, match=message):
        bio_doc_splits(tmp_path)


def test_doc_splits_missing_file_and_alias(tmp_path):
    with pytest.raises(DataError, match=r"doc_id_splits\.json: bio_mqm document split file not found"):
        bio_doc_splits(tmp_path)
    path = tmp_path / bio_mqm.BIO_MQM_REPO / bio_mqm.BIO_SPLITS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"br-en": {"dev": ["doc2"], "test": ["doc1"]}}), encoding="utf-8")
    assert bio_doc_splits(tmp_path) == {"bio/pt/pt-en.doc2": "dev", "bio/pt/pt-en.doc1": "test"}
