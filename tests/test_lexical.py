"""Lexical multi-reference / multi-hypothesis scoring (uamt.lexical, `uamt multihyp`)."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF, TER

from uamt import lexical
from uamt.cli import main
from uamt.core.errors import DataError

MT = ["the cat sat on the mat", "a quick brown fox jumps", "hello world again today"]
REF = ["the cat is sitting on the mat", "the quick brown fox jumped", "hello world again today"]
OTHER = ["a cat sat on a mat", "a fast brown fox leaps", "hi world once more today"]


def single(metric, hyp, ref):
    obj = {"bleu": BLEU(effective_order=True), "chrf": CHRF(), "ter": TER()}[metric]
    return obj.sentence_score(hyp, [ref]).score


# --------------------------------------------------------------------------- segment scores


@pytest.mark.parametrize("metric", ["bleu", "chrf", "ter"])
def test_segment_scores_match_sacrebleu_sentence_scores(metric):
    got = lexical.segment_scores(MT, [REF], metric)
    expected = [single(metric, h, r) for h, r in zip(MT, REF, strict=True)]
    np.testing.assert_allclose(got, expected)
    # a single stream given as a plain list of strings means the same thing
    np.testing.assert_allclose(lexical.segment_scores(MT, REF, metric), expected)


def test_identical_translation_scores_are_the_extremes():
    np.testing.assert_allclose(lexical.segment_scores(REF, [REF], "bleu"), 100.0)
    np.testing.assert_allclose(lexical.segment_scores(REF, [REF], "chrf"), 100.0)
    np.testing.assert_allclose(lexical.segment_scores(REF, [REF], "ter"), 0.0)


def test_multi_reference_chrf_keeps_best_reference_and_ter_the_fewest_edits():
    chrf1, chrf2 = (lexical.segment_scores(MT, [r], "chrf") for r in (REF, OTHER))
    np.testing.assert_allclose(lexical.segment_scores(MT, [REF, OTHER], "chrf"), np.maximum(chrf1, chrf2))
    ter1 = lexical.segment_scores(MT, [REF], "ter")
    ter2 = lexical.segment_scores(MT, [OTHER], "ter")
    # sacrebleu's multi-reference TER: fewest edits over the average reference length, so it is
    # never above the best single-reference TER by more than the length normalisation allows
    multi = lexical.segment_scores(MT, [REF, OTHER], "ter")
    assert np.all(multi <= np.maximum(ter1, ter2) + 1e-9)


def test_multi_reference_bleu_pools_ngram_matches():
    # "the cat sat" matches ref A in its first bigram only, ref B in the second only: pooled
    # matching (Papineni et al.) beats either single reference.
    mt = ["the cat sat down"]
    a, b = ["the cat lay down"], ["a cat sat down"]
    multi = lexical.segment_scores(mt, [a, b], "bleu")[0]
    assert multi > max(lexical.segment_scores(mt, [a], "bleu")[0], lexical.segment_scores(mt, [b], "bleu")[0])
    assert multi == pytest.approx(BLEU(effective_order=True).sentence_score(mt[0], [a[0], b[0]]).score)


def test_reference_variant_names():
    assert list(lexical.reference_variants(MT, [REF], "bleu")) == ["mt-ref"]
    assert list(lexical.reference_variants(MT, [REF, OTHER], "bleu")) == [
        "mt-ref-1",
        "mt-ref-2",
        "mt-ref-multi",
    ]


# --------------------------------------------------------------------------- variants


def test_variants_hand_computed_with_reference_as_hypothesis():
    # H = {r, r}: sim(h, r) = 100 for both hypotheses; s = sim(o, r).
    s = lexical.segment_scores(MT, [REF], "bleu")
    v = lexical.multihyp_variants(MT, [REF], [REF, REF], "bleu")
    np.testing.assert_allclose(v["hyp-ref-avg-micro"], (200 + s) / 3)  # mean over N+1 candidates
    np.testing.assert_allclose(v["hyp-ref-avg-macro"], (100 + s) / 2)
    np.testing.assert_allclose(v["hyp-ref-min-micro"], s)
    np.testing.assert_allclose(v["hyp-ref-max-micro"], 100.0)
    hyp_mt = np.array([single("bleu", r, o) for r, o in zip(REF, MT, strict=True)])  # sim(h, o)
    np.testing.assert_allclose(v["hyp-mt-avg"], hyp_mt)
    np.testing.assert_allclose(v["hyp-mt-avg-ref"], (hyp_mt + s) / 2)
    # hyp-self over ordered pairs of H' = {r, r, o}: (r,r) twice = 100, (r,o) twice, (o,r) twice
    np.testing.assert_allclose(v["hyp-self-avg"], (200 + 2 * hyp_mt + 2 * s) / 6)
    np.testing.assert_allclose(v["hyp-self-max"], 100.0)


def test_min_max_combinations_pick_the_extremes():
    s = lexical.segment_scores(MT, [REF], "chrf")
    other = lexical.segment_scores(OTHER, [REF], "chrf")
    v = lexical.multihyp_variants(MT, [REF], [REF, OTHER], "chrf")
    np.testing.assert_allclose(v["hyp-ref-max-macro"], (100 + s) / 2)
    np.testing.assert_allclose(v["hyp-ref-min-macro"], (np.minimum(100, other) + s) / 2)
    np.testing.assert_allclose(v["hyp-ref-avg-macro"], ((100 + other) / 2 + s) / 2)


def test_hyp_self_of_identical_hypotheses_is_maximal():
    same = lexical.multihyp_variants(MT, [REF], [MT, MT, MT], "bleu")
    np.testing.assert_allclose(same["hyp-self-avg"], 100.0)
    np.testing.assert_allclose(same["hyp-mt-min"], 100.0)
    diverse = lexical.multihyp_variants(MT, [REF], [MT, OTHER, REF], "bleu")
    assert np.all(diverse["hyp-self-avg"][:2] < same["hyp-self-avg"][:2])
    ter = lexical.multihyp_variants(MT, [], [MT, MT], "ter")
    np.testing.assert_allclose(ter["hyp-self-max"], 0.0)  # TER: identical = no edits


def test_reference_free_variants_only_without_references():
    v = lexical.multihyp_variants(MT, [], [OTHER], "bleu")
    assert sorted(v) == sorted(f"hyp-{k}-{c}" for k in ("mt", "self") for c in ("avg", "min", "max"))


def test_prefix_and_first_reference_only():
    v = lexical.multihyp_variants(MT, [REF, OTHER], [OTHER], "bleu", prefix="pseudo", hyp_refs="first")
    s1 = lexical.segment_scores(MT, [REF], "bleu")
    assert "pseudo-mt-avg-ref" in v and "mt-ref-multi" in v
    np.testing.assert_allclose(
        v["pseudo-ref-avg-macro"], (lexical.segment_scores(OTHER, [REF], "bleu") + s1) / 2
    )
    both = lexical.multihyp_variants(MT, [REF, OTHER], [OTHER], "bleu", hyp_refs="all")
    np.testing.assert_allclose(both["hyp-ref-max-micro"], 100.0)  # OTHER is itself a reference


def test_variants_are_invariant_to_segment_order():
    perm = [2, 0, 1]
    v = lexical.multihyp_variants(MT, [REF], [OTHER, REF], "ter")
    w = lexical.multihyp_variants(
        [MT[i] for i in perm],
        [[REF[i] for i in perm]],
        [[OTHER[i] for i in perm], [REF[i] for i in perm]],
        "ter",
    )
    for name in v:
        np.testing.assert_allclose(w[name], v[name][perm])


# --------------------------------------------------------------------------- correlations


def test_correlations_sign_and_constant_variant():
    human = np.array([1.0, 2.0, 3.0, 4.0])
    r = lexical.correlations(
        {"up": np.array([10.0, 20, 30, 40]), "error": np.array([4.0, 3, 2, 1]), "flat": np.ones(4)}, human
    )
    assert r["up"] == pytest.approx(1.0)
    assert r["error"] == pytest.approx(-1.0)  # an error rate that tracks quality is reported negative
    assert np.isnan(r["flat"])
    with pytest.raises(DataError, match="shape"):
        lexical.correlations({"x": np.ones(3)}, human)


# --------------------------------------------------------------------------- bad input


def test_unknown_metric_is_refused():
    with pytest.raises(
        ValueError, match=r"metric='meteor' not supported; choose from \['bleu', 'chrf', 'ter'\]"
    ):
        lexical.segment_scores(MT, [REF], "meteor")


def test_misaligned_streams_are_refused():
    with pytest.raises(DataError, match="hypothesis 1 has 2 segments but mt has 3"):
        lexical.multihyp_variants(MT, [REF], [OTHER[:2]], "bleu")


def write(path, text, mode="w"):
    if mode == "wb":
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_read_lines_handles_crlf_and_keeps_unicode_separators(tmp_path):
    f = write(tmp_path / "a.txt", "one\r\ntwo\u2028still two\r\nthree\n", mode="w")
    assert lexical.read_lines(f) == ["one", "two\u2028still two", "three"]


def test_read_lines_errors_name_file_and_line(tmp_path):
    with pytest.raises(DataError, match="empty"):
        lexical.read_lines(write(tmp_path / "e.txt", ""))
    bad = write(tmp_path / "bad.txt", b"fine\nalso fine\nbad \xff byte\n", mode="wb")
    with pytest.raises(DataError, match=r"bad\.txt:3: not valid UTF-8"):
        lexical.read_lines(bad)
    with pytest.raises(DataError, match=r"h\.txt:2: human score 'n/a' is not a number"):
        lexical.read_scores(write(tmp_path / "h.txt", "0.5\nn/a\n"))


@pytest.fixture()
def small_files(tmp_path):
    return {
        "mt": write(tmp_path / "mt.txt", "\n".join(MT) + "\n"),
        "ref": write(tmp_path / "ref.txt", "\n".join(REF) + "\n"),
        "hyp": write(tmp_path / "hyp.txt", "\n".join(OTHER) + "\n"),
        "human": write(tmp_path / "human.txt", "0.1\n-0.5\n1.2\n"),
    }


def multihyp_argv(mt, refs, human, metric: str, *, hyps=(), out=None) -> list[str]:
    """``uamt multihyp`` arguments: a ``--ref`` per reference file; ``--hyp``, ``--out`` when given."""
    argv = ["multihyp", "--mt", str(mt)]
    for ref in refs:
        argv += ["--ref", str(ref)]
    if hyps:
        argv += ["--hyp", *map(str, hyps)]
    argv += ["--human", str(human), "--metric", metric]
    return argv if out is None else [*argv, "--out", str(out)]


def test_cli_bad_inputs_exit_2_with_clear_message(small_files, tmp_path, capsys):
    f = small_files
    short = write(tmp_path / "short.txt", "only one line\n")
    base = ["multihyp", "--mt", str(f["mt"]), "--human", str(f["human"])]
    assert main([*base, "--ref", str(short), "--metric", "bleu"]) == 2
    err = capsys.readouterr().err
    assert "mt.txt has 3 lines" in err and "short.txt has 1" in err
    assert main([*base, "--ref", str(f["ref"]), "--metric", "meteor"]) == 2
    assert "metric='meteor' not supported; choose from ['bleu', 'chrf', 'ter']" in capsys.readouterr().err
    empty = write(tmp_path / "empty.txt", "")
    assert main([*base, "--ref", str(empty), "--metric", "bleu"]) == 2
    assert "empty.txt: file is empty" in capsys.readouterr().err
    human_bad = write(tmp_path / "hb.txt", "1\n2\nthree\n")
    assert main(multihyp_argv(f["mt"], [f["ref"]], human_bad, "chrf")) == 2
    assert "hb.txt:3: human score 'three' is not a number" in capsys.readouterr().err


def test_cli_prints_table_and_writes_json(small_files, tmp_path, capsys):
    f = small_files
    out = tmp_path / "res" / "r.json"
    code = main(multihyp_argv(f["mt"], [f["ref"]], f["human"], "ter", hyps=[f["hyp"]], out=out))
    assert code == 0
    printed = capsys.readouterr().out
    assert "lower is better" in printed and "hyp-mt-avg-ref" in printed
    payload = json.loads(out.read_text())
    assert payload["metric"] == "ter" and payload["higher_is_better"] is False
    v = lexical.multihyp_variants(MT, [REF], [OTHER], "ter")
    expected = lexical.correlations(v, np.array([0.1, -0.5, 1.2]))
    assert payload["pearson"].keys() == expected.keys()
    for k, r in expected.items():
        assert payload["pearson"][k] == pytest.approx(r)


# --------------------------------------------------------------------------- Estonian-English 1K


@pytest.fixture(scope="module")
def eten(mirror_root, tmp_path_factory):
    tarball = mirror_root / "facebookresearch/mlqe/data-multi-hyp/data.tar.gz"
    if not tarball.is_file():
        pytest.fail(f"mirror file missing: {tarball}")
    root = tmp_path_factory.mktemp("eten")
    with tarfile.open(tarball) as tar:
        # filter= exists from Python 3.11.4 (and 3.8.17, 3.9.17, 3.10.12); older 3.11s extract as before.
        tar.extractall(root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return root


PAPER = {  # Pearson r with DA z-scores, paper Table 2 / brief (ref-2 BLEU measured with sacrebleu)
    ("bleu", "mt-ref-1"): 0.417,
    ("bleu", "mt-ref-2"): 0.426,
    ("bleu", "mt-ref-multi"): 0.494,
    ("chrf", "mt-ref-1"): 0.508,
    ("chrf", "mt-ref-2"): 0.521,
    ("chrf", "mt-ref-multi"): 0.554,
}


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_estonian_english_reference_correlations(eten, metric):
    mt = lexical.read_lines(eten / "mt.en")
    refs = [lexical.read_lines(eten / f"ref-{k}.en") for k in (1, 2)]
    human = lexical.read_scores(eten / "DA-z.scores")
    assert len(mt) == len(human) == 1000
    r = lexical.correlations(lexical.reference_variants(mt, refs, metric), human)
    for (m, name), value in PAPER.items():
        if m == metric:
            assert r[name] == pytest.approx(value, abs=0.005), name


def test_estonian_english_through_cli(eten, tmp_path, capsys):
    out = tmp_path / "bleu.json"
    refs = [eten / "ref-1.en", eten / "ref-2.en"]
    code = main(multihyp_argv(eten / "mt.en", refs, eten / "DA-z.scores", "bleu", out=out))
    assert code == 0
    assert "mt-ref-multi" in capsys.readouterr().out
    pearson = json.loads(out.read_text())["pearson"]
    for name in ("mt-ref-1", "mt-ref-2", "mt-ref-multi"):
        assert pearson[name] == pytest.approx(PAPER[("bleu", name)], abs=0.005)


@pytest.mark.parametrize("metric", ["bleu", "chrf", "ter"])
def test_segment_scores_in_worker_processes_equal_the_serial_scores_in_order(monkeypatch, metric):
    """Big batches are scored by forked workers in chunks: same values, same order as one process."""
    rng = np.random.default_rng(7)
    words = "the cat sat on a mat while dogs ran far away from home today".split()
    mt = [" ".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(60)]
    refs = [" ".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(60)]
    serial = lexical.segment_scores(mt, [refs], metric)
    monkeypatch.setattr(lexical, "PARALLEL_MIN_PAIRS", 5)
    monkeypatch.setattr(lexical, "_cpu_count", lambda: 3)
    assert np.array_equal(lexical.segment_scores(mt, [refs], metric), serial)
