"""Bad input: each case raises DataError naming the file and the row, through the loader functions."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from uamt.core.errors import DataError
from uamt.data import loaders
from uamt.data.prepare import PrepareConfig, prepare

WMT = "wmt-conference/wmt21-news-systems"
SCORES = "SYS SID RAW.SCR Z.SCR N \nSysA.1 1 80 0.5 1 \nSysA.1 2 60 -0.5 2 \n"


def make_wmt(root: Path, scores: str = SCORES, hyp: bytes | None = None, src: str | None = None) -> Path:
    """A tiny newstest2021 cs-en layout with one system SysA and reference A."""
    base = root / WMT
    for sub, name, text in [
        ("txt/sources", "newstest2021.cs-en.src.cs", src if src is not None else "Ahoj.\nNazdar.\n"),
        ("txt/references", "newstest2021.cs-en.ref.A.en", "Hello.\nHi.\n"),
    ]:
        (base / sub).mkdir(parents=True, exist_ok=True)
        (base / sub / name).write_text(text, encoding="utf-8")
    (base / "txt/system-outputs").mkdir(parents=True, exist_ok=True)
    (base / "txt/system-outputs/newstest2021.cs-en.hyp.SysA.en").write_bytes(
        hyp if hyp is not None else b"Hullo.\nHey.\n"
    )
    # Document ids (cs-en has none in the public data: without them the DA join is impossible).
    # Line 1 is in document "b", line 2 in "a2": in document-id order DA SID 1 is line 2.
    segs = (src if src is not None else "Ahoj.\nNazdar.\n").split("\n")[:2]
    (base / "xml").mkdir(parents=True, exist_ok=True)
    (base / "xml/newstest2021.cs-en.all.xml").write_text(
        '<dataset id="newstest2021">'
        f'<doc origlang="cs" id="b"><src lang="cs"><p><seg id="1">{segs[0]}</seg></p></src></doc>'
        f'<doc origlang="cs" id="a2"><src lang="cs"><p><seg id="1">{segs[1]}</seg></p></src></doc>'
        '<doc origlang="cs" id="0suite" testsuite="t"><src lang="cs"><p><seg id="1">x</seg></p></src></doc>'
        "</dataset>",
        encoding="utf-8",
    )
    (base / "humaneval/newstest2021-toen").mkdir(parents=True, exist_ok=True)
    score_file = base / "humaneval/newstest2021-toen/ad-seg-scores-cs-en.csv"
    score_file.write_text(scores, encoding="utf-8")
    return score_file


def load(root: Path, **kw):
    return loaders.load_wmt21_da(root, lps=("cs-en",), **kw)


def test_synthetic_ok(tmp_path):
    make_wmt(tmp_path)
    df = load(tmp_path)
    # DA SIDs count segments in document-id order: SID 1 = document "a2" = line 2.
    assert df.mt.tolist() == ["Hey.", "Hullo."] and df.ref.tolist() == ["Hi.", "Hello."]
    assert df.seg_id.tolist() == [2, 1]
    assert df.doc.tolist() == ["newstest2021/cs/a2", "newstest2021/cs/b"]


def test_no_document_ids_left_out(tmp_path, caplog):
    make_wmt(tmp_path)
    (tmp_path / WMT / "xml/newstest2021.cs-en.all.xml").unlink()
    with pytest.raises(DataError, match=r"wmt21_da: no language pair of \['cs-en'\] can be joined"):
        load(tmp_path)


def test_renamed_column(tmp_path):
    make_wmt(tmp_path, scores=SCORES.replace("Z.SCR", "ZSCORE"))
    with pytest.raises(DataError, match=r"ad-seg-scores-cs-en\.csv: missing column\(s\) \['Z\.SCR'\]"):
        load(tmp_path)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "abc", "NA"])
def test_bad_score(tmp_path, bad):
    make_wmt(tmp_path, scores=SCORES.replace("-0.5", bad))
    with pytest.raises(
        DataError, match=r"ad-seg-scores-cs-en\.csv: line 3: column 'Z\.SCR' must be a finite number"
    ):
        load(tmp_path)


def test_empty_system_output(tmp_path):
    make_wmt(tmp_path, hyp=b"Hullo.\n   \n")
    with pytest.raises(
        DataError, match=r"hyp\.SysA\.en: line 2: system SysA output is empty or whitespace-only"
    ):
        load(tmp_path)
    assert len(load(tmp_path, drop_empty_mt=True)) == 1  # the opt-in drop keeps the good row


def test_whitespace_source(tmp_path):
    make_wmt(tmp_path, src="Ahoj.\n \t\n")
    with pytest.raises(DataError, match=r"src\.cs: line 2: source is empty or whitespace-only"):
        load(tmp_path)


def test_text_shorter_than_segment_ids(tmp_path):
    make_wmt(tmp_path, scores=SCORES + "SysA.1 7 50 0.1 1 \n")
    with pytest.raises(
        DataError, match=r"ad-seg-scores-cs-en\.csv: line 4: segment id 7 is beyond the 2 segments"
    ):
        load(tmp_path)


def test_unknown_system(tmp_path):
    make_wmt(tmp_path, scores=SCORES + "Mystery.3 1 50 0.1 1 \n")
    with pytest.raises(DataError, match=r"line 4: unknown system 'Mystery\.3': no text file"):
        load(tmp_path)
    df = load(tmp_path, drop_systems={"Myst*": "test: no text"})
    assert set(df.system) == {"SysA"}


def test_non_utf8(tmp_path):
    make_wmt(tmp_path, hyp=b"Hullo.\nH\xe9y.\n")
    with pytest.raises(DataError, match=r"hyp\.SysA\.en: line 2: not valid UTF-8"):
        load(tmp_path)


def _tar(path: Path, members: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def make_multihyp(root: Path, n: int = 40, scores: list[str] | None = None) -> Path:
    scores = scores or [f"{(i % 7) / 7 - 0.4:.3f}" for i in range(n)]
    members = {
        "src.et": "".join(f"Lause {i}.\n" for i in range(n)),
        "mt.en": "".join(f"Sentence {i}.\n" for i in range(n)),
        "ref-1.en": "".join(f"Clause {i}.\n" for i in range(n)),
        "ref-2.en": "".join(f"Phrase {i}.\n" for i in range(n)),
        "DA-z.scores": "".join(s + "\n" for s in scores),
    }
    path = root / loaders.MLQE_REPO / "data-multi-hyp" / "data.tar.gz"
    _tar(path, members)
    return path


def test_multihyp_bad_score_names_member_and_line(tmp_path):
    make_multihyp(tmp_path, n=3, scores=["0.1", "oops", "0.2"])
    with pytest.raises(
        DataError, match=r"data\.tar\.gz:DA-z\.scores: line 2: column 'DA-z' must be a finite number"
    ):
        loaders.load_multihyp_eten(tmp_path)


def test_mlqe_bad_annotator_list(tmp_path):
    header = "index\toriginal\ttranslation\tscores\tmean\tz_scores\tz_mean\tmodel_scores\n"
    good = "0\tTere.\tHello.\t[90, 80]\t85.0\t[0.5, 0.3]\t0.4\t-0.1\n"
    bad = "1\tHead aega.\tBye.\t[90, x]\t85.0\t[0.5, 0.3]\t0.4\t-0.1\n"
    data = loaders.MLQE_REPO + "/data"
    _tar(
        tmp_path / data / "et-en.tar.gz",
        {
            "et-en/train.eten.df.short.tsv": header + good + bad,
            "et-en/train.doc_ids": "doc_id\nA\nA\n",
            "et-en/dev.eten.df.short.tsv": header + good,
            "et-en/dev.doc_ids": "doc_id\nB\n",
        },
    )
    _tar(
        tmp_path / data / "et-en_test.tar.gz",
        {
            "et-en/test20.eten.df.short.tsv": header + good,
            "et-en/test20.doc_ids": "doc_id\nC\n",
        },
    )
    with pytest.raises(
        DataError, match=r"et-en\.tar\.gz:et-en/train\.eten\.df\.short\.tsv: line 3: column 'scores'"
    ):
        loaders.load_mlqe(tmp_path, lps=("et-en",))


def test_hter_nan_score(tmp_path):
    folder = tmp_path / loaders.HTER_REPO / "evaluation/data/human_scores/hter"
    folder.mkdir(parents=True)
    (folder / "test.smt.de-en.csv").write_text("src,mt,pe,ref,lp,score\na,b,c,d,de-en,0.1\ne,f,g,h,de-en,\n")
    with pytest.raises(
        DataError, match=r"test\.smt\.de-en\.csv: line 3: column 'score' must be a finite number"
    ):
        loaders.load_qt21_hter(tmp_path, files=[("smt", "de-en")])


def test_failed_prepare_keeps_previous_outputs(tmp_path):
    make_multihyp(tmp_path)
    out = tmp_path / "prepared"
    cfg = PrepareConfig(
        raw_dir=str(tmp_path), out_dir=str(out), datasets=("multihyp_eten",), forced_splits={}
    )
    prepare(cfg)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"d_q.parquet", "d_e.parquet", "dev.parquet", "test.parquet", "summary.json"}
    make_multihyp(tmp_path, n=3, scores=["0.1", "nan", "0.2"])
    with pytest.raises(DataError, match="line 2"):
        prepare(cfg)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["facebookresearch", "prepared"]  # no temp folders


def test_cli_prepare_and_summary(tmp_path, capsys):
    from uamt.cli import main

    make_multihyp(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(
        f"prepare:\n  raw_dir: {tmp_path}\n  out_dir: {tmp_path / 'prep'}\n  datasets: [multihyp_eten]\n"
        "  forced_splits: {}\n  pseudo_doc_size: 2\n"
    )
    assert main(["data", "prepare", "--params", str(params)]) == 0
    capsys.readouterr()
    assert main(["data", "summary", "--prepared", str(tmp_path / "prep")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["dataset", "lp", "d_q", "d_e", "dev", "test", "total"]
    row = lines[2].split()
    assert row[:2] == ["multihyp_eten", "et-en"] and row[-1] == "40"
    assert sum(map(int, row[2:6])) == 40 and all(int(x) > 0 for x in row[2:6])
    params.write_text(params.read_text() + "  typo_key: 1\n")
    assert main(["data", "prepare", "--params", str(params)]) == 2
    assert "typo_key" in capsys.readouterr().err
