"""WMT21 MQM from the WMT-QE 2023 files: real slices of the mirror, and bad input on tiny files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from uamt.core.errors import DataError
from uamt.data import loaders
from uamt.data.schema import read_lines
from uamt.data.sources import wmt21_qe

WMT = "wmt-conference/wmt21-news-systems"
QE_TRAIN = Path(wmt21_qe.QE_REPO) / wmt21_qe.QE_DIR


@pytest.fixture(scope="module")
def news(mirror_root):
    return loaders.load_wmt21_mqm(mirror_root, drop_empty_mt=True)


@pytest.fixture(scope="module")
def ted_en_ru(mirror_root):
    return loaders.load_ted_mqm(mirror_root, lps=("en-ru",))


def _google(mirror_root, lp: str) -> dict[tuple[str, int], float]:
    code = lp.replace("-", "")
    df, _ = loaders._mqm_scores(
        mirror_root / loaders.MQM_REPO / "newstest2021" / code / f"mqm_newstest2021_{code}.avg_seg_scores.tsv"
    )
    return dict(zip(zip(df["system"], df["seg_id"].tolist(), strict=True), df["score"], strict=True))


# --------------------------------------------------------------------------- real data


def test_en_ru_news_and_ted_counts_and_scores(news, ted_en_ru):
    ru = news[news.lp == "en-ru"]
    # 14 systems + the rated references A and B on the 527 rated lines; ref-A/ref-B keep each
    # other as reference.  224 rows with a split document name are repaired, none dropped.
    assert len(ru) == 16 * 527 and ru.seg_id.nunique() == 527 and ru.system.nunique() == 16
    assert {"ref-A", "ref-B", "NVIDIA-NeMo", "metricsystem5"} <= set(ru.system)
    assert ru.score.between(-25, 0).all() and ru.score.min() == -25 and (ru.score == 0).mean() > 0.5
    assert (ru.n_annotators == 1).all() and np.allclose(ru.annotator_scores.map(np.mean), ru.score)
    systems = ru[~ru.system.str.startswith("ref-")]
    assert (systems.refs.map(len) == 2).all()
    assert ru.doc.str.startswith("newstest2021/en/").all() and not ru.doc.str.contains("pseudo").any()
    # TED en-ru: 14 systems x 512 segments; its only reference ref-A has no other: its rows dropped
    assert len(ted_en_ru) == 14 * 512 and ted_en_ru.seg_id.max() == 512
    assert ted_en_ru.score.between(-25, 0).all() and (ted_en_ru.refs.map(len) == 1).all()
    assert ted_en_ru.doc.str.fullmatch(r"ted/en/tedtalk-[1-6]").all() and (ted_en_ru.domain == "ted").all()


def test_en_ru_hand_checked_row(news, mirror_root):
    # 2021_en-ru_processed.tsv line 363: metricsystem1, express.co.uk.44090 segment 7, errors
    # "minor major" -> -(1 + 5); its source (CSV-quoted in the file) is line 760 of the en-de source.
    row = news[(news.lp == "en-ru") & (news.system == "metricsystem1") & (news.seg_id == 760)].iloc[0]
    src = read_lines(mirror_root / WMT / "txt/sources/newstest2021.en-de.src.en")
    assert (
        row.src
        == src[759]
        == (
            '"I just wonder if people think, why after ten years of being PM, are you still trying to be '
            "involved in politics?"
        )
    )
    assert row.mt == (
        "«Мне просто интересно, если люди думают, почему после десяти лет работы премьер-министром вы "
        "все еще пытаетесь заниматься политикой?"
    )
    assert (
        row.score == -6.0
        and row.annotator_scores == [-6.0]
        and row.doc == "newstest2021/en/express.co.uk.44090"
    )
    # references: the QE file's ref.A (CSV quotes undone) and ref.B of that segment
    assert row.refs[0].startswith('"Просто интересно, не возникает ли') and row.refs[0].endswith("политике?")
    assert row.refs[1].startswith("«Мне просто интересно, думают ли люди")


def test_metricsystems_and_ref_b_have_qe_text(news, mirror_root):
    de = news[news.lp == "en-de"]
    # all 17 rated systems: 527 segments each, less the 9 metricsystem items the QE file lacks
    assert len(de) == 17 * 527 - 9 and de.system.nunique() == 17
    metric = de[de.system.str.startswith("metricsystem")]
    assert len(metric) == 5 * 527 - 9
    qe = wmt21_qe.read_qe_file(mirror_root / QE_TRAIN / "2021_en-de_processed.tsv")
    # line 1 of the source is position 1 of its document, rt.com.131279 (the file's doc_id)
    first = next(
        j for j in qe.judgements if (j.system, j.doc, j.seg_in_doc) == ("metricsystem1", "rt.com.131279", 1)
    )
    row = metric[(metric.system == "metricsystem1") & (metric.seg_id == 1)].iloc[0]
    assert row.mt == first.target and row.doc == "newstest2021/en/rt.com.131279"
    refs = {x: read_lines(mirror_root / WMT / f"txt/references/newstest2021.en-de.ref.{x}.de") for x in "ACD"}
    ref_b = de[de.system == "ref-B"]
    assert len(ref_b) == 527
    b = ref_b.iloc[0]
    assert b.refs == [refs[x][b.seg_id - 1] for x in "ACD"]  # scored against the published references
    # the published reference set of system rows is unchanged (A, C, D; ref-B is a rated row only)
    assert (de[~de.system.str.startswith("ref-")].refs.map(len) == 3).all()
    zh = news[news.lp == "zh-en"]
    assert {"metricsystem1", "ref-B"} <= set(zh.system) and "ref-A" not in set(zh.system)


def test_real_documents_consistent_across_language_pairs(news):
    de, ru, zh = (news[news.lp == lp] for lp in ("en-de", "en-ru", "zh-en"))
    assert not news.doc.str.contains("pseudo").any()
    assert de.doc.nunique() == 32 and zh.doc.str.startswith("newstest2021/zh/").all()
    # a document name with a space, split over two columns in the file, re-joined with "_"
    assert "newstest2021/en/seattle_times.253485" in set(de.doc)
    assert "newstest2021/zh/jingji_guancha_bao-zh-01.10329" in set(zh.doc)
    # one document per line, and the same English document has the same key in en-de and en-ru
    for part in (de, ru, zh):
        assert (part.groupby("seg_id").doc.nunique() == 1).all()
        # documents are contiguous blocks of lines: sorted by first line, none starts inside another
        spans = part.groupby("doc").seg_id.agg(["min", "max"]).sort_values("min")
        assert (spans["min"].to_numpy()[1:] > spans["max"].to_numpy()[:-1]).all()
    doc_de = de.groupby("seg_id").doc.first()
    doc_ru = ru.groupby("seg_id").doc.first()
    assert set(doc_ru.index) == set(doc_de.index) and (doc_de[doc_ru.index] == doc_ru).all()


@pytest.mark.parametrize(("lp", "min_r", "min_exact"), [("en-de", 0.99, 0.95), ("zh-en", 0.98, 0.80)])
def test_qe_scoring_agrees_with_google(mirror_root, lp, min_r, min_exact):
    """Our MQM weights on the QE severities vs Google's avg_seg_scores (validates the en-ru scoring).

    The QE file has no categories: minor punctuation weighs 1 instead of 0.1 (the -0.9 steps).
    """
    text = loaders.Newstest2021(mirror_root, lp, 10)
    qe = wmt21_qe.read_qe_file(wmt21_qe.qe_path(mirror_root, lp))
    join = wmt21_qe.join_source(qe, text.source, text.source_file)
    assert join.matched == len(qe.judgements)  # every QE row placed on a line
    groups = wmt21_qe.group_judgements(qe, join.line_of)
    google = _google(mirror_root, lp)
    keys = [k for k in groups if k in google]
    ours = np.array([np.mean([j.score for j in groups[k]]) for k in keys])
    theirs = np.array([google[k] for k in keys])
    assert len(keys) > 8900
    assert np.corrcoef(ours, theirs)[0, 1] > min_r
    assert np.isclose(ours, theirs).mean() > min_exact
    # where they differ, ours is mostly the lower (minor punctuation: 1 here, 0.1 at Google)
    assert (ours <= theirs + 1e-9).mean() > 0.95


def test_en_ru_chrf_tracks_score(news):
    import sacrebleu

    ru = news[(news.lp == "en-ru") & ~news.system.str.startswith("ref-")]
    chrf = [sacrebleu.sentence_chrf(mt, [ref]).score for mt, ref in zip(ru.mt, ru.ref, strict=True)]
    assert np.corrcoef(chrf, ru.score)[0, 1] > 0.1  # measured 0.18; a wrong join gives about 0


# --------------------------------------------------------------------------- bad input

HEADER = "\t".join(wmt21_qe.QE_FIELDS)


def qe_line(system="hyp.SysA", doc="d1", seg="1", rater="rater1", src="Hello.", tgt="Hallo.", spans=None):
    starts, ends, errors = spans or ("-1", "-1", "no-error")
    return "\t".join([system, doc, seg, rater, src, tgt, starts, ends, errors])


def write_qe(tmp_path: Path, lines: list[str], header: bool = False, name: str = "qe.tsv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(([HEADER] if header else []) + lines) + "\n", encoding="utf-8")
    return path


def test_synthetic_ok_and_repairs(tmp_path):
    lines = [
        qe_line(spans=("0 3", "2 5", "minor major")),
        # a two-word document name split over seg_id: "new\tyork\t1", rater lost
        "\t".join(["hyp.SysA", "new", "york", "1", "Hi.", "Hey.", "-1", "-1", "no-error"]),
        # a CSV-quoting-free file keeps quotes as text
        qe_line(seg="2", src='"Yes," he said.', tgt='"Ja", sagte er.'),
    ]
    qe = wmt21_qe.read_qe_file(write_qe(tmp_path, lines))
    a, b, c = qe.judgements
    assert a.penalty == -6.0 and a.score == -6.0 and a.system == "SysA"
    assert (b.doc, b.seg_in_doc, b.rater) == ("new_york", 1, None) and qe.repaired == 1
    assert c.source == '"Yes," he said.'
    # header present -> CSV quoting undone; ref.X -> ref-X; more than five majors floored at -25
    quoted = qe_line(
        system="ref.A", src='"""Hi,"" he said."', spans=("0 0 0 0 0 0", "1 1 1 1 1 1", "major " * 5 + "major")
    )
    j = wmt21_qe.read_qe_file(write_qe(tmp_path, [quoted], header=True, name="q.tsv")).judgements[0]
    assert j.system == "ref-A" and j.source == '"Hi," he said.' and j.penalty == -30 and j.score == -25


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (
            qe_line(spans=("0 3", "2", "minor major")),
            r"qe\.tsv: line 2: 2 error severities 'minor major' but 2 start and 1 end",
        ),
        (
            qe_line(spans=("0", "2", "severe")),
            r"qe\.tsv: line 2: column 'errors': MQM severity 'severe' not supported",
        ),
        (
            qe_line(spans=("a", "2", "minor")),
            r"qe\.tsv: line 2: column 'start_ids' must hold space-separated integers",
        ),
        (qe_line(seg="x"), r"qe\.tsv: line 2: seg_id 'x' / annotator_id 'rater1'"),
        (qe_line(tgt="  "), r"qe\.tsv: line 2: target is empty or whitespace-only"),
    ],
)
def test_bad_rows(tmp_path, line, match):
    with pytest.raises(DataError, match=match):
        wmt21_qe.read_qe_file(write_qe(tmp_path, [qe_line(seg="9"), line]))


def test_wrong_field_count_dropped_or_refused(tmp_path, caplog):
    good = [qe_line(seg=str(i)) for i in range(1, 40)]
    with caplog.at_level("INFO"):
        qe = wmt21_qe.read_qe_file(write_qe(tmp_path, [*good, "hyp.SysA\td1\t40\trater1\tonly five"]))
    assert len(qe.judgements) == 39 and qe.bad_field_lines == [40]
    assert "dropped 1 lines without 9 fields (first: line 40)" in caplog.text
    with pytest.raises(DataError, match=r"qe\.tsv: 3 of 3 lines do not have the 9 tab-separated fields"):
        wmt21_qe.read_qe_file(write_qe(tmp_path, [g.replace("\t", ",") for g in good[:3]]))


def test_bad_header_quoting_and_bytes(tmp_path):
    path = write_qe(tmp_path, [qe_line()], header=True)
    path.write_text(path.read_text(encoding="utf-8").replace("errors", "severity", 1), encoding="utf-8")
    with pytest.raises(DataError, match=r"qe\.tsv: line 1: header .* differs"):
        wmt21_qe.read_qe_file(path)
    with pytest.raises(DataError, match=r"qe\.tsv: line 2: bad CSV quoting"):
        wmt21_qe.read_qe_file(write_qe(tmp_path, [qe_line(src='"Hi" there"')], header=True))
    path.write_bytes(HEADER.encode() + b"\n" + qe_line(tgt="Gr\xfc\xdfe").encode("latin-1") + b"\n")
    with pytest.raises(DataError, match=r"qe\.tsv: line 2: not valid UTF-8"):
        wmt21_qe.read_qe_file(path)
    with pytest.raises(DataError, match=r"missing\.tsv: WMT21 MQM file of the QE-2023 data not found"):
        wmt21_qe.read_qe_file(tmp_path / "missing.tsv")


def test_join_checks(tmp_path):
    source = ["Hello.", "It is 1,000 U.S. dollars.", "Bye."]
    lines = [
        qe_line(seg="1", src="Hello."),
        qe_line(seg="2", src="It is 1000 US dollars."),  # the QE normalisation, matched by key
        qe_line(seg="1", src="Nowhere."),
    ]
    qe = wmt21_qe.read_qe_file(write_qe(tmp_path, lines))
    join = wmt21_qe.join_source(qe, source, "src.en")
    assert join.line_of == [1, 2, None] and join.exact == 1 and join.doc_of_line == {1: "d1", 2: "d1"}
    # position 1 of d1 on line 3 contradicts d1 starting at line 1
    bad = wmt21_qe.read_qe_file(write_qe(tmp_path, [lines[0], qe_line(seg="1", src="Bye.")], name="b.tsv"))
    with pytest.raises(DataError, match=r"b\.tsv: line 2: document 'd1' position 1 matches line 3"):
        wmt21_qe.join_source(bad, source, "src.en")
    # a sentence on two lines is placed by its document's start (set by the unique sentences)
    repeated = [qe_line(seg=str(k), src=t) for k, t in enumerate(["Hello.", "Yes.", "Hello."], start=1)]
    qe = wmt21_qe.read_qe_file(write_qe(tmp_path, repeated, name="r.tsv"))
    assert wmt21_qe.join_source(qe, ["Hello.", "Yes.", "Hello."], "src.en").line_of == [1, 2, 3]
    twice = wmt21_qe.read_qe_file(write_qe(tmp_path, [lines[0], lines[0]], name="t.tsv"))
    with pytest.raises(DataError, match=r"t\.tsv: line 2: rater rater1 judges system SysA segment 1 again"):
        wmt21_qe.group_judgements(twice, [1, 1])


def make_news(root: Path, qe_lines: list[str] | None) -> None:
    """A two-line newstest2021 en-de layout: SysA published, metricsystem1 only in the QE file."""
    base = root / WMT / "txt"
    for rel, text in [
        ("sources/newstest2021.en-de.src.en", "Hello.\nIt is 1,000 U.S. dollars.\n"),
        ("references/newstest2021.en-de.ref.A.de", "Hallo.\nEs sind 1.000 US-Dollar.\n"),
        ("system-outputs/newstest2021.en-de.hyp.SysA.de", "Hallo!\nDas sind 1.000 Dollar.\n"),
    ]:
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text, encoding="utf-8")
    scores = root / loaders.MQM_REPO / "newstest2021/ende/mqm_newstest2021_ende.avg_seg_scores.tsv"
    scores.parent.mkdir(parents=True, exist_ok=True)
    scores.write_text(
        "system\tmqm_avg_score\tseg_id\nSysA\t-1\t1\nSysA\t-0.1\t2\nmetricsystem1\t-5\t1\nmetricsystem1\tNone\t2\n",
        encoding="utf-8",
    )
    if qe_lines is not None:
        path = root / QE_TRAIN / "2021_en-de_processed.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(qe_lines) + "\n", encoding="utf-8")


NEWS_QE = [
    qe_line(doc="doc.1", seg="1", src="Hello.", tgt="Hallo!"),
    qe_line(doc="doc.1", seg="2", src="It is 1000 US dollars.", tgt="Das sind 1000 Dollar."),
    qe_line(
        system="hyp.metricsystem1",
        doc="doc.1",
        seg="1",
        src="Hello.",
        tgt="Servus.",
        spans=("0", "6", "major"),
    ),
]


def test_loader_uses_qe_text_and_documents(tmp_path):
    make_news(tmp_path, NEWS_QE)
    df = loaders.load_wmt21_mqm(tmp_path, lps=("en-de",))
    assert df.system.tolist() == ["SysA", "SysA", "metricsystem1"]
    assert df.mt.tolist() == ["Hallo!", "Das sind 1.000 Dollar.", "Servus."]  # published text first
    assert df.score.tolist() == [-1.0, -0.1, -5.0] and (df.doc == "newstest2021/en/doc.1").all()
    # a rated line without a document in the QE file: the whole LP keeps pseudo-documents, so one
    # real document can never be split between its own key and a pseudo one
    make_news(tmp_path, [NEWS_QE[0], NEWS_QE[2]])
    df = loaders.load_wmt21_mqm(tmp_path, lps=("en-de",))
    assert len(df) == 3 and (df.doc == "newstest2021/en/pseudo-0000").all()


def test_loader_bad_qe_input(tmp_path):
    make_news(tmp_path, None)
    with pytest.raises(
        DataError, match=r"2021_en-de_processed\.tsv: WMT21 MQM file of the QE-2023 data not found"
    ):
        loaders.load_wmt21_mqm(tmp_path, lps=("en-de",))
    # the QE text of a published system contradicts it: the join is on the wrong lines
    make_news(
        tmp_path, [NEWS_QE[0].replace("Hallo!", "Tschüss"), NEWS_QE[1].replace("1000 Dollar", "nichts")]
    )
    with pytest.raises(DataError, match=r"only 0 of 2 targets of systems published in wmt21-news-systems"):
        loaders.load_wmt21_mqm(tmp_path, lps=("en-de",))
    # an empty output ("EMPTY") of a QE-only system: an error naming the QE line, or dropped on request
    make_news(tmp_path, [*NEWS_QE[:2], NEWS_QE[2].replace("Servus.", "EMPTY")])
    with pytest.raises(
        DataError, match=r"2021_en-de_processed\.tsv: line 3: system metricsystem1 output is empty"
    ):
        loaders.load_wmt21_mqm(tmp_path, lps=("en-de",))
    assert len(loaders.load_wmt21_mqm(tmp_path, lps=("en-de",), drop_empty_mt=True)) == 2
