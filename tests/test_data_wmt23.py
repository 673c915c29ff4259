"""WMT23 MQM and WMT23 side-by-side MQM loaders: real slices of the mirror, and bad input."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
import sacrebleu
from scipy.stats import pearsonr

from uamt.core.errors import DataError
from uamt.data.schema import COLUMNS, read_lines
from uamt.data.sources import wmt23

WMT23 = wmt23.WMT23_DIR


def _check_canonical(df):
    assert list(df.columns) == list(COLUMNS)
    assert (df["src"].str.strip() != "").all() and (df["mt"].str.strip() != "").all()
    assert np.isfinite(df["score"]).all() and (df["score"] == df["score_raw"]).all()
    lo, hi = wmt23.WMT23_MQM_RANGE
    assert df["score"].between(lo, hi).all()
    assert (df["n_annotators"] == df["annotator_scores"].map(len)).all()
    assert (df["year"] == 2023).all()
    for ref, refs in zip(df["ref"], df["refs"], strict=True):
        assert refs and ref == refs[0]  # every WMT23 row is reference-based


def _chrf_r(df) -> float:
    chrf = [
        sacrebleu.sentence_chrf(mt, list(refs)).score for mt, refs in zip(df["mt"], df["refs"], strict=True)
    ]
    return float(pearsonr(chrf, df["score"])[0])


@pytest.fixture(scope="module")
def zh_en(mirror_root):
    return wmt23.load_wmt23_mqm(mirror_root, lps=("zh-en",))


@pytest.fixture(scope="module")
def sxs(mirror_root):
    return wmt23.load_wmt23_sxs_mqm(mirror_root)


# ----------------------------------------------------------------------------- real data: WMT23 MQM


def test_wmt23_mqm_zh_en_rows_raters_and_a_hand_checked_row(zh_en, mirror_root, caplog):
    df = zh_en
    _check_canonical(df)
    # 16 rated "systems" x 1,177 rated segments = 18,832; refA has no other human reference
    # (synthetic_ref is machine output), so its 1,177 rows are dropped.
    assert len(df) == 18832 - 1177 and df["system"].nunique() == 15
    assert not {"refA", "synthetic_ref"} & set(df["system"])
    assert df["doc"].str.startswith("wmt23/zh/").all() and df["doc"].nunique() == 179
    row = df[(df.system == "GPT4-5shot") & (df.seg_id == 7)].iloc[0]
    base = mirror_root / WMT23
    assert row.src == read_lines(base / "sources/zh-en.txt")[6]
    assert row.mt == read_lines(base / "system-outputs/zh-en/GPT4-5shot.txt")[6]
    assert row.refs == [read_lines(base / "references/zh-en.refA.txt")[6]]
    assert row.score == pytest.approx(-8.1)  # line 1983 of zh-en.mqm.seg.score: "GPT4-5shot\t-8.1"
    assert (row.doc, row.domain, row.n_annotators) == ("wmt23/zh/gb-1", "manuals", 1)
    # 288 items (18 segments of 2 documents x 16 systems) have all 8 raters; 270 remain without refA.
    eight = df[df.n_annotators == 8]
    assert len(eight) == 270 and set(df["n_annotators"]) == {1, 8}
    assert sorted(eight.seg_id.unique()) == [*range(965, 975), *range(1328, 1336)]  # two documents
    assert eight.doc.nunique() == 2
    # seg.score is exactly the mean of the per-rater ratings
    assert np.allclose(eight["annotator_scores"].map(np.mean), eight["score"], atol=1e-9)
    anvita = eight[(eight.system == "ANVITA") & (eight.seg_id == 965)].iloc[0]
    assert anvita.score == pytest.approx(-4.4)
    assert anvita.annotator_scores == pytest.approx([-6.1, -1.0, -5.0, -3.0, -1.0, -13.0, -3.1, -3.0])
    assert anvita.score_std == pytest.approx(np.std(anvita.annotator_scores, ddof=1))
    assert df.loc[df.n_annotators == 1, "score_std"].isna().all()
    clean = df.loc[df["score"] == 0, "score"]
    assert len(clean) and not np.signbit(clean).any()  # the files' -0.0 is stored as 0.0


def _within_segment_r(df, refs_of) -> float:
    """Mean over segments of Pearson r(sentence chrF against ``refs_of(seg)``, score) across systems."""
    chrf = [
        sacrebleu.sentence_chrf(mt, refs_of(seg)).score
        for mt, seg in zip(df["mt"], df["seg_id"], strict=True)
    ]
    rs = [
        pearsonr(g["chrf"], g["score"])[0]
        for _, g in df.assign(chrf=chrf).groupby("seg_id")
        if g["score"].std() > 0 and g["chrf"].std() > 0
    ]
    return float(np.mean(rs))


def test_wmt23_mqm_zh_en_join_sanity(zh_en):
    # Pooled chrF-vs-MQM r is only ~0.06 in zh-en (refA is weak, and long segments get both
    # more errors and higher chrF), so check the join within segments: chrF must rank the
    # systems of a segment like MQM does, and the reference of the next line must not.
    df = zh_en[zh_en.seg_id <= 400]
    refs = dict(zip(zh_en["seg_id"], zh_en["refs"], strict=False))
    aligned = _within_segment_r(df, lambda seg: list(refs[seg]))
    shifted = _within_segment_r(df, lambda seg: list(refs.get(seg + 1, refs[seg])))
    assert aligned > 0.1 and shifted < 0.05, (aligned, shifted)  # measured: 0.18, 0.01


def test_wmt23_mqm_he_en_two_references_and_chrf(mirror_root):
    df = wmt23.load_wmt23_mqm(mirror_root, lps=("he-en",))
    _check_canonical(df)
    assert len(df) == 13 * 820  # refA rated and kept, scored against refB
    base = mirror_root / WMT23
    ref_a, ref_b = (read_lines(base / f"references/he-en.ref{x}.txt") for x in "AB")
    ref_row = df[df.system == "refA"].iloc[0]
    assert ref_row.mt == ref_a[ref_row.seg_id - 1] and ref_row.refs == [ref_b[ref_row.seg_id - 1]]
    other = df[df.system == "ONLINE-A"].iloc[0]
    assert other.refs == [ref_a[other.seg_id - 1], ref_b[other.seg_id - 1]]
    assert set(df.domain) == {"news", "user_review"} and df["doc"].str.startswith("wmt23/he/").all()
    assert df["score"].min() == -45.0  # below the -25 sentence cap of WMT21: WMT23 has none
    assert _chrf_r(df.iloc[::3]) > 0.1


def test_wmt23_mqm_en_de_paragraphs(mirror_root, caplog):
    with caplog.at_level("INFO"):
        df = wmt23.load_wmt23_mqm(mirror_root, lps=("en-de",))
    _check_canonical(df)
    assert len(df) == 12 * 460 and "refA" not in set(df.system)
    assert "dropped 460 rows: rated reference refA" in caplog.text
    assert df["score"].min() == -138.0 and (df["score"] < -25).sum() > 300
    assert df["src"].str.len().mean() > 300  # paragraphs
    assert _chrf_r(df) > 0.1


# ----------------------------------------------------------------------------- real data: side-by-side


def test_wmt23_sxs_rows_raters_and_mapping(sxs, zh_en, mirror_root):
    _check_canonical(sxs)
    counts = sxs.groupby("lp").size().to_dict()
    # 1,040 en-de items less the 104 of refA (no other human reference); 3,770 zh-en items
    assert counts == {"en-de": 1040 - 104, "zh-en": 3770}
    assert sxs.attrs["sxs_mapping"] == {
        "en-de": {"doc": 1040, "source_text": 0, "unmatched": 0},
        "zh-en": {"doc": 3770, "source_text": 0, "unmatched": 0},
    }
    assert (sxs["n_annotators"] == 3).all()
    assert np.allclose(sxs["annotator_scores"].map(np.mean), sxs["score"])
    assert not sxs["mt"].str.contains("<v>").any()
    assert {"GPT4-5shot_with_ONLINE-W", "GPT4-5shot_with_refA"} <= set(sxs.system)
    # hand-checked: rows 18-20 of the en-de TSV (rater3 one Major Mistranslation, two No-error)
    row = sxs[(sxs.system == "ONLINE-G") & (sxs.lp == "en-de") & (sxs.seg_id == 1)].iloc[0]
    assert sorted(row.annotator_scores) == [-5.0, 0.0, 0.0] and row.score == pytest.approx(-5 / 3)
    assert row.mt == "Polizei verhaftet 15 nach gewalttätigem Protest vor britischem Flüchtlingshotel"
    assert row.doc == "wmt23/en/aj-english.33941" and row.domain == "news"
    # same segment keys as wmt23_mqm: doc, seg_id and source text identical
    mqm = zh_en.drop_duplicates("seg_id").set_index("seg_id")
    z = sxs[sxs.lp == "zh-en"]
    assert (z["doc"].to_numpy() == mqm.loc[z.seg_id, "doc"].to_numpy()).all()
    assert (z["src"].to_numpy() == mqm.loc[z.seg_id, "src"].to_numpy()).all()
    de_src = read_lines(mirror_root / WMT23 / "sources/en-de.txt")
    d = sxs[sxs.lp == "en-de"]
    assert (d["src"] == [de_src[s - 1] for s in d.seg_id]).all()


def test_wmt23_sxs_hotw_dropped_and_chrf(sxs, caplog, mirror_root):
    with caplog.at_level("INFO"):
        wmt23.load_wmt23_sxs_mqm(mirror_root, lps=("en-de",))
    assert "dropped 245 rows: HOTW-test attention-check rows" in caplog.text
    for lp in ("en-de", "zh-en"):
        assert _chrf_r(sxs[sxs.lp == lp]) > 0.1, lp


# ----------------------------------------------------------------------------- bad input (synthetic)


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")


def _mini_wmt23(root, lp="he-en", scores=None, refs="AB"):
    """A 3-segment WMT23 tree: source, references, documents, system sysA, seg.score."""
    base = root / WMT23
    _write(base / f"sources/{lp}.txt", ["s one", "s two", "s three"])
    for x in refs:
        _write(base / f"references/{lp}.ref{x}.txt", [f"ref{x} one", f"ref{x} two", f"ref{x} three"])
    _write(base / f"references/{lp}.synthetic_ref.txt", ["syn one", "syn two", "syn three"])
    _write(base / f"documents/{lp}.docs", ["news\tdocA", "news\tdocA", "social\tdocB"])
    _write(base / f"system-outputs/{lp}/sysA.txt", ["a one", "a two", "a three"])
    if scores is None:
        scores = ["sysA\t-1.0", "sysA\tNone", "sysA\t-0.0", "refA\t-2.0", "refA\tNone", "refA\tNone"]
    _write(base / f"human-scores/{lp}.mqm.seg.score", scores)
    return base


def test_wmt23_mqm_mini_tree_loads(tmp_path):
    _mini_wmt23(tmp_path)
    df = wmt23.load_wmt23_mqm(tmp_path, lps=("he-en",))
    assert list(zip(df.system, df.seg_id, df.score, strict=True)) == [
        ("sysA", 1, -1.0),
        ("sysA", 3, 0.0),
        ("refA", 1, -2.0),
    ]
    assert df.iloc[0].refs == ["refA one", "refB one"] and df.iloc[2].refs == ["refB one"]
    assert list(df.doc) == ["wmt23/he/docA", "wmt23/he/docB", "wmt23/he/docA"]
    assert list(df.domain) == ["news", "social", "news"]


@pytest.mark.parametrize(
    "scores, match",
    [
        (["sysA\t-1", "sysA\tNone"], r"seg\.score: 2 lines is not a multiple of the 3 lines"),
        (
            ["sysA\t-1", "sysA\t-1", "sysB\t-1", "sysB\t-1", "sysB\t-1", "sysB\t-1"],
            r"line 3: system 'sysB' inside",
        ),
        (["sysA\t-1", "sysA\tbad", "sysA\t-1"], r"seg\.score: line 2: score must be a finite number"),
        (["sysA\t-1", "sysA\tnan", "sysA\t-1"], r"line 2: score must be a finite number"),
        (["sysA\t-1", "sysA\t5", "sysA\t-1"], r"line 2: column 'score' = 5 is outside"),
        (["sysA\t-1", "sysA -1", "sysA\t-1"], r"line 2: expected 'system<TAB>value'"),
        (["sysA\t-1"] * 3 + ["sysA\t-1"] * 3, r"line 4: second block of system 'sysA'"),
        (
            ["sysB\tNone", "sysB\t-1", "sysB\tNone"],
            r"line 2: unknown system 'sysB'.*prepare\.drop_systems\.wmt23_mqm",
        ),
    ],
)
def test_wmt23_mqm_bad_score_file(tmp_path, scores, match):
    _mini_wmt23(tmp_path, scores=scores)
    with pytest.raises(DataError, match=match):
        wmt23.load_wmt23_mqm(tmp_path, lps=("he-en",))


def test_wmt23_mqm_drop_systems_skips_an_unknown_system(tmp_path, caplog):
    _mini_wmt23(tmp_path, scores=["sysA\t-1", "sysA\t-1", "sysA\t-1", "sysB\t-1", "sysB\t-1", "sysB\tNone"])
    with caplog.at_level("INFO"):
        df = wmt23.load_wmt23_mqm(tmp_path, lps=("he-en",), drop_systems={"sys[B]": "no text"})
    assert set(df.system) == {"sysA"} and "dropped 2 rows: system sysB (no text)" in caplog.text


@pytest.mark.parametrize(
    ("edits", "match"),
    [
        (
            {"human-scores/he-en.mqm.seg.score": None},
            r"he-en\.mqm\.seg\.score: WMT23 MQM score file not found",
        ),
        (
            {"system-outputs/he-en/sysA.txt": ["  ", "a two", "a three"]},
            r"sysA\.txt: line 1: system sysA output is empty",
        ),
        (
            {"system-outputs/he-en/sysA.txt": ["a one", "a two"]},
            r"sysA\.txt: 2 lines, but the source file .* has 3",
        ),
        (
            {"documents/he-en.docs": ["news\tdocA", "newsdocA", "social\tdocB"]},
            r"he-en\.docs: line 2: expected 'domain<TAB>doc'",
        ),
        (
            {
                "sources/he-en.txt": ["s one", "", "s three"],
                "human-scores/he-en.mqm.seg.score": ["sysA\t-1"] * 3,
            },
            r"he-en\.txt: line 2: source is empty",
        ),
    ],
    ids=["no-scores", "empty-output", "short-output", "bad-docs", "empty-source"],
)
def test_wmt23_mqm_bad_text(tmp_path, edits, match):
    base = _mini_wmt23(tmp_path)
    for name, lines in edits.items():  # None: the file is removed
        if lines is None:
            (base / name).unlink()
        else:
            _write(base / name, lines)
    with pytest.raises(DataError, match=match):
        wmt23.load_wmt23_mqm(tmp_path, lps=("he-en",))


def _rating(*weights):
    errors = [{"severity": "minor", "category": "x", "score": w} for w in weights]
    return "{" + '"errors": ' + str(errors).replace("'", '"') + "}"


def test_wmt23_mqm_rater_files(tmp_path):
    base = _mini_wmt23(tmp_path, lp="zh-en", refs="A", scores=["sysA\t-1.5", "sysA\tNone", "sysA\t-2"])
    _write(
        base / "human-scores/zh-en.mqm.rater1.seg.rating", [f"sysA\t{_rating(1)}", "sysA\tNone", "sysA\tNone"]
    )
    _write(
        base / "human-scores/zh-en.mqm.rater2.seg.rating",
        [f"sysA\t{_rating(1, 1)}", "sysA\tNone", "sysA\tNone"],
    )
    df = wmt23.load_wmt23_mqm(tmp_path, lps=("zh-en",))
    assert df.iloc[0].annotator_scores == [-1.0, -2.0] and df.iloc[0].n_annotators == 2
    assert df.iloc[1].annotator_scores == [-2.0] and df.iloc[1].n_annotators == 1  # no rater: [score]
    _write(
        base / "human-scores/zh-en.mqm.rater2.seg.rating", [f"sysA\t{_rating(5)}", "sysA\tNone", "sysA\tNone"]
    )
    with pytest.raises(DataError, match=r"seg\.score: line 1: score -1\.5 .* is not the mean -3"):
        wmt23.load_wmt23_mqm(tmp_path, lps=("zh-en",))
    _write(base / "human-scores/zh-en.mqm.rater2.seg.rating", ["sysA\t{bad json", "sysA\tNone", "sysA\tNone"])
    with pytest.raises(DataError, match=r"rater2\.seg\.rating: line 1: expected a JSON rating"):
        wmt23.load_wmt23_mqm(tmp_path, lps=("zh-en",))


def test_wmt23_unknown_lp(tmp_path):
    with pytest.raises(DataError, match=r"lp='de-en' not supported"):
        wmt23.load_wmt23_mqm(tmp_path, lps=("de-en",))


HEADER = "\t".join(wmt23.SXS_COLUMNS) + "\t# Documentation: see MAROT_viewer"


def _sxs_row(
    system="sysA",
    doc="news_docA:en-de",
    seg="2",
    rater="r1",
    source="s <v>two</v>",
    target='a two "quoted',
    category="Accuracy/Mistranslation",
    severity="Minor",
):
    return "\t".join([system, doc, seg, "9", rater, source, target, category, severity, '{"m": "x"}'])


def _mini_sxs(root, rows):
    _mini_wmt23(root, lp="en-de", refs="A")
    folder = root / wmt23.MQM_REPO / "generalMT2023/ende"
    folder.mkdir(parents=True)
    data = "\n".join([HEADER, *rows, ""]).encode("utf-8")
    with tarfile.open(folder / "sxs_mqm_generalMT2023_ende.3ratingsPerSegment.tsv.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("sxs_mqm_generalMT2023_ende.3ratingsPerSegment.tsv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_wmt23_sxs_mini_scores_marks_hotw_and_unmatched(tmp_path):
    _mini_sxs(
        tmp_path,
        [
            _sxs_row(target='a <v>two</v> "quoted'),  # a bare quote must not open a quoted field
            _sxs_row(rater="r1", category="Fluency/Punctuation"),
            _sxs_row(rater="r2", category="No-error", severity="No-error"),
            _sxs_row(rater="r2", category="Found", severity="HOTW-test", target="planted error"),
            _sxs_row(rater="r3", severity="Major"),
            _sxs_row(doc="news_renamed:en-de", seg="1", source="s  three", target="b", severity="Major"),
            _sxs_row(doc="news_docZ:en-de", seg="1", source="not in WMT23", target="c"),
        ],
    )
    df = wmt23.load_wmt23_sxs_mqm(tmp_path, lps=("en-de",))
    assert df.attrs["sxs_mapping"] == {"en-de": {"doc": 1, "source_text": 1, "unmatched": 1}}
    first = df.iloc[0]
    assert first.annotator_scores == pytest.approx([-1.1, 0.0, -5.0]) and first.score == pytest.approx(
        -6.1 / 3
    )
    assert (first.seg_id, first.doc, first.src, first.refs) == (2, "wmt23/en/docA", "s two", ["refA two"])
    assert first.mt == 'a two "quoted'
    second = df.iloc[1]  # doc name unknown, rescued by its source text
    assert (second.seg_id, second.doc, second.domain, second.n_annotators) == (
        3,
        "wmt23/en/docB",
        "social",
        1,
    )


@pytest.mark.parametrize(
    "row, match",
    [
        (_sxs_row(severity="Catastrophic"), r"tsv: line 2: MQM severity 'Catastrophic' not supported"),
        (_sxs_row(seg="two"), r"tsv: line 2: 'docSegId' must be a positive integer"),
        (_sxs_row(target=" <v> </v>"), r"tsv: line 2: target is empty"),
        (_sxs_row(doc="news_docA:zh-en"), r"tsv: line 2: document 'news_docA:zh-en' belongs to zh-en"),
        ("\t".join(["sysA", "news_docA:en-de", "2"]), r"tsv: line 2: fewer than the 10"),
    ],
)
def test_wmt23_sxs_bad_rows(tmp_path, row, match):
    _mini_sxs(tmp_path, [row])
    with pytest.raises(DataError, match=match):
        wmt23.load_wmt23_sxs_mqm(tmp_path, lps=("en-de",))


def test_wmt23_sxs_bad_files(tmp_path):
    _mini_sxs(tmp_path, [_sxs_row(), _sxs_row(rater="r2", target="another text entirely")])
    with pytest.raises(DataError, match=r"tsv: line 3: target of .* differs from the one on line 2"):
        wmt23.load_wmt23_sxs_mqm(tmp_path, lps=("en-de",))
    with pytest.raises(DataError, match=r"side-by-side MQM tarball not found"):
        wmt23.load_wmt23_sxs_mqm(tmp_path, lps=("zh-en",))
    renamed = HEADER.replace("severity", "sev")
    folder = tmp_path / "b" / wmt23.MQM_REPO / "generalMT2023/ende"
    _mini_wmt23(tmp_path / "b", lp="en-de", refs="A")
    folder.mkdir(parents=True)
    data = f"{renamed}\n{_sxs_row()}\n".encode()
    with tarfile.open(folder / "sxs_mqm_generalMT2023_ende.3ratingsPerSegment.tsv.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("x.tsv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match=r"x\.tsv: missing column\(s\) \['severity'\]"):
        wmt23.load_wmt23_sxs_mqm(tmp_path / "b", lps=("en-de",))
