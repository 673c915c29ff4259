"""`uamt score` / `uamt compare` end to end through a real MLflow pyfunc of a fake predictor."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_scoring_support import (
    NO_ALIAS_MODEL,
    QE_MODEL,
    REF_MODEL,
    fake_mu_qe,
    fake_mu_ref,
    fake_sigma,
    write_lines,
)

from uamt.cli import main
from uamt.serving import text_io as scoring_io
from uamt.serving.compare import paired_bootstrap_probability, probability_better
from uamt.serving.scores import (
    build_frame,
    default_model_uri,
    model_name_from_params,
    sample_reference_indices,
    system_score,
)
from uamt.uncertainty.metrics import translation_risk

SRC = [
    "Der Hund schläft im Garten.",
    "Ich habe heute keine Zeit.",
    "Das Wetter ist schön.",
    "Wir fahren morgen nach Berlin.",
    "Er liest ein Buch über Geschichte.",
    "Die Katze sitzt auf dem Dach.",
]
MT = [
    "The dog sleeps in the garden.",
    "I have no time today.",
    "The weather is nice.",
    "We drive to Berlin tomorrow.",
    "He reads a book on history.",
    "The cat sits on the roof.",
]
REF_A = [
    "The dog is sleeping in the garden.",
    "I don't have time today.",
    "The weather is beautiful.",
    "Tomorrow we are going to Berlin.",
    "He is reading a book about history.",
    "The cat is sitting on the roof.",
]
REF_B = [
    "The dog sleeps in the yard.",
    "Today I have no time.",
    "It is lovely weather.",
    "We travel to Berlin tomorrow.",
    "He reads a history book.",
    "The cat sits on the roof.",
]
BAD_MT = ["Garden.", "Time no.", "Weather.", "Berlin go.", "Book.", "Roof cat."]


# Every test runs against the fake scoring models' store (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("scoring_tracking")


@pytest.fixture
def files(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"register:\n  model_name: {REF_MODEL}\n", encoding="utf-8")
    return {
        "src": write_lines(tmp_path / "src.txt", SRC),
        "mt": write_lines(tmp_path / "mt.txt", MT),
        "bad": write_lines(tmp_path / "bad.txt", BAD_MT),
        "ref_a": write_lines(tmp_path / "ref_a.txt", REF_A),
        "ref_b": write_lines(tmp_path / "ref_b.txt", REF_B),
        "params": params,
        "dir": tmp_path,
    }


def _score(files, *extra):
    return [
        "score",
        "-s",
        str(files["src"]),
        "-t",
        str(files["mt"]),
        "--params",
        str(files["params"]),
        *extra,
    ]


def _jsonl(text: str):
    rows = [json.loads(line) for line in text.splitlines()]
    assert "summary" in rows[-1]
    return rows[:-1], rows[-1]["summary"]


# ----------------------------------------------------------------------------- score
def test_score_jsonl_on_stdout_with_summary(files, capsys):
    assert main([*_score(files, "-r", str(files["ref_a"]), "--no-progress")]) == 0
    records, summary = _jsonl(capsys.readouterr().out)
    assert [r["line"] for r in records] == list(range(1, len(MT) + 1))
    mu = np.array([r["mu"] for r in records])
    sigma = np.array([r["sigma"] for r in records])
    expected_mu = [fake_mu_ref(m, [r]) for m, r in zip(MT, REF_A, strict=True)]
    np.testing.assert_allclose(mu, expected_mu)
    np.testing.assert_allclose(sigma, [fake_sigma(m) for m in MT])
    for r in records:
        assert {"mu", "sigma", "lower", "upper", "risk", "epistemic_var", "aleatoric_var"} <= set(r)
        z = 1.6448536269514722  # probit(0.95): the 90% central interval
        assert r["lower"] == pytest.approx(r["mu"] - z * r["sigma"])
        assert r["upper"] == pytest.approx(r["mu"] + z * r["sigma"])
        assert r["risk"] == pytest.approx(float(translation_risk([r["mu"]], [r["sigma"]], 0.3)[0]))
    assert summary["scale"] == "fake-chrF"
    assert summary["model"] == f"models:/{REF_MODEL}@champion"  # name from params register.model_name
    assert summary["method"] == "fake-chrf"
    assert summary["risk_threshold"] == 0.3  # the scale's default
    assert summary["system_score"] == pytest.approx(mu.mean())
    assert summary["system_sigma"] == pytest.approx(math.sqrt(np.sum(sigma**2)) / len(mu))
    assert summary["system_lower"] < summary["system_score"] < summary["system_upper"]
    assert "independent" in summary["system_interval_assumption"]


def test_multi_reference_average_passes_refs(files, capsys):
    assert main([*_score(files, "-r", str(files["ref_a"]), "-r", str(files["ref_b"]))]) == 0
    records, summary = _jsonl(capsys.readouterr().out)
    expected = [fake_mu_ref(m, [a, b]) for m, a, b in zip(MT, REF_A, REF_B, strict=True)]
    np.testing.assert_allclose([r["mu"] for r in records], expected)
    assert summary["n_references"] == 2 and summary["ref_combination"] == "average"
    frame = build_frame(SRC, MT, [REF_A, REF_B], lp="de-en")
    assert "ref" not in frame.columns and frame["lp"].tolist() == ["de-en"] * len(MT)
    assert frame["refs"].tolist() == [[a, b] for a, b in zip(REF_A, REF_B, strict=True)]


def test_sample_mode_is_seeded(files, capsys):
    argv = _score(files, "-r", str(files["ref_a"]), "-r", str(files["ref_b"]), "--ref-combination", "sample")
    assert main([*argv, "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert main([*argv, "--seed", "3"]) == 0
    assert capsys.readouterr().out == first
    records, summary = _jsonl(first)
    picks = sample_reference_indices(len(MT), 2, 3)
    chosen = [(REF_A, REF_B)[k][i] for i, k in enumerate(picks)]
    np.testing.assert_allclose(
        [r["mu"] for r in records], [fake_mu_ref(m, [c]) for m, c in zip(MT, chosen, strict=True)]
    )
    assert summary["seed"] == 3
    frame = build_frame(SRC, MT, [REF_A, REF_B], ref_combination="sample", seed=3)
    assert frame["ref"].tolist() == chosen and "refs" not in frame.columns
    assert len({tuple(sample_reference_indices(50, 2, s)) for s in range(5)}) == 5  # the seed matters


def test_no_reference_uses_qe_model(files, capsys):
    assert main([*_score(files)]) == 0
    records, summary = _jsonl(capsys.readouterr().out)
    assert summary["model"] == f"models:/{QE_MODEL}@champion"
    assert summary["method"] == "fake-length-qe"
    np.testing.assert_allclose(
        [r["mu"] for r in records], [fake_mu_qe(s, m) for s, m in zip(SRC, MT, strict=True)]
    )


def test_flag_below_max_risk(files, capsys):
    argv = _score(files, "-r", str(files["ref_a"]), "--flag-below", "0.6", "--max-risk", "0.4")
    assert main(argv) == 0
    records, summary = _jsonl(capsys.readouterr().out)
    risk = translation_risk([r["mu"] for r in records], [r["sigma"] for r in records], 0.6)
    assert [r["flagged"] for r in records] == list(risk > 0.4)
    assert summary["risk_threshold"] == 0.6  # --flag-below sets chi when --risk-threshold is not given
    assert summary["n_flagged"] == int(np.sum(risk > 0.4))
    assert 0 < summary["n_flagged"] < len(MT)  # the fixture has both kinds
    # A different --risk-threshold keeps `risk` at chi and adds the flag's own probability.
    assert main([*argv, "--risk-threshold", "0.2"]) == 0
    records2, _ = _jsonl(capsys.readouterr().out)
    assert [r["flag_risk"] for r in records2] == pytest.approx(list(risk))
    assert [r["flagged"] for r in records2] == list(risk > 0.4)


@pytest.mark.parametrize(("suffix", "sep"), [(".csv", ","), (".tsv", "\t")])
def test_delimited_outputs(files, capsys, suffix, sep):
    out = files["dir"] / f"out{suffix}"
    assert main([*_score(files, "-r", str(files["ref_a"]), "--out", str(out))]) == 0
    err = capsys.readouterr().err
    assert "system score" in err and "fake-chrF" in err
    table = pd.read_csv(out, sep=sep)
    assert list(table.columns[:6]) == ["line", "mu", "sigma", "lower", "upper", "risk"]
    assert (table["scale"] == "fake-chrF").all()
    np.testing.assert_allclose(
        table["mu"], [fake_mu_ref(m, [r]) for m, r in zip(MT, REF_A, strict=True)], rtol=1e-5
    )


def test_jsonl_file_and_bootstrap(files, capsys):
    out = files["dir"] / "out.jsonl"
    argv = _score(
        files,
        "-r",
        str(files["ref_a"]),
        "--out",
        str(out),
        "--bootstrap",
        "400",
        "--seed",
        "1",
        "--lp",
        "de-en",
    )
    assert main(argv) == 0
    first = out.read_bytes()
    records, summary = _jsonl(first.decode())
    assert len(records) == len(MT)
    assert summary["n_bootstrap"] == 400
    assert summary["system_bootstrap_lower"] < summary["system_score"] < summary["system_bootstrap_upper"]
    assert main(argv) == 0
    assert out.read_bytes() == first  # seeded
    assert not [p for p in files["dir"].iterdir() if p.name.startswith(".out.jsonl")]  # no temp files left


# ----------------------------------------------------------------------------- bad input
def _bad_cases():
    def counts(f):
        write_lines(f["dir"] / "short.txt", MT[:4])
        return _score(f, "-r", str(f["dir"] / "short.txt")), [
            "different line counts",
            "short.txt (ref): 4",
            "src.txt (src): 6",
        ]

    def empty(f):
        write_lines(f["mt"], [*MT[:2], "   ", *MT[3:]])
        return _score(f, "-r", str(f["ref_a"])), ["mt.txt:3: empty line"]

    def latin1(f):
        f["src"].write_bytes("\n".join(SRC[:5]).encode() + "\nDie Bär sitzt\n".encode("latin-1"))
        return _score(f, "-r", str(f["ref_a"])), [
            "src.txt:6: not valid UTF-8 (byte 0xe4 at byte 6 of the line)"
        ]

    def missing_file(f):
        return _score(f, "-r", str(f["dir"] / "nope.txt")), ["nope.txt: file not found"]

    def missing_alias(f):
        return _score(f, "-r", str(f["ref_a"]), "--model", f"models:/{NO_ALIAS_MODEL}@champion"), [
            "could not load model",
            NO_ALIAS_MODEL,
        ]

    def no_qe_registered(f):
        f["params"].write_text("register:\n  model_name: uamt-absent\n", encoding="utf-8")
        return _score(f), ["no reference-free (QE) model registered", "models:/uamt-absent-qe@champion"]

    def qe_given_refs(f):
        return _score(f, "-r", str(f["ref_a"]), "--model", f"models:/{QE_MODEL}@champion"), [
            "reference-free (QE) model",
            "drop -r",
        ]

    def ref_model_no_refs(f):
        return _score(f, "--model", f"models:/{REF_MODEL}@champion"), ["needs references"]

    def bad_suffix(f):
        return _score(f, "-r", str(f["ref_a"]), "--out", str(f["dir"] / "out.xlsx")), [
            "unsupported output suffix"
        ]

    def bad_confidence(f):
        return _score(f, "-r", str(f["ref_a"]), "--confidence", "1.5"), ["--confidence must be in (0, 1)"]

    def max_risk_alone(f):
        return _score(f, "-r", str(f["ref_a"]), "--max-risk", "0.2"), ["--max-risk needs --flag-below"]

    return {
        "line counts": counts,
        "empty line": empty,
        "non-utf8": latin1,
        "missing file": missing_file,
        "missing alias": missing_alias,
        "no qe model": no_qe_registered,
        "qe given refs": qe_given_refs,
        "ref model without refs": ref_model_no_refs,
        "bad suffix": bad_suffix,
        "bad confidence": bad_confidence,
        "max-risk alone": max_risk_alone,
    }


BAD_CASES = _bad_cases()


@pytest.mark.parametrize("previous", [False, True], ids=["no-previous", "previous-kept"])
@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_exits_2_without_output(files, capsys, case, previous):
    argv, needles = BAD_CASES[case](files)
    out = files["dir"] / "out.jsonl"
    if "--out" not in argv:
        argv = [*argv, "--out", str(out)]
    else:
        out = Path(argv[argv.index("--out") + 1])
    old = b'{"previous": "output"}\n'
    if previous:
        out.write_bytes(old)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("uamt score: error: ")
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    for needle in needles:
        assert needle in captured.err
    if previous:
        assert out.read_bytes() == old
    else:
        assert not out.exists()
    assert not [p.name for p in files["dir"].iterdir() if p.name.startswith(".")]


def test_output_folder_missing_is_checked_before_scoring(files, capsys, monkeypatch):
    import uamt.serving.predictor

    def fail(_):  # the model must not even be loaded
        raise AssertionError("model loaded before the output path was checked")

    monkeypatch.setattr(uamt.serving.predictor, "load_predictor", fail)
    out = files["dir"] / "missing" / "out.jsonl"
    assert main([*_score(files, "-r", str(files["ref_a"]), "--out", str(out))]) == 2
    assert "output folder" in capsys.readouterr().err and not out.parent.exists()


# ----------------------------------------------------------------------------- compare
def test_comparison_table_numbers_systems_whose_names_its_columns_would_cut():
    from uamt.serving.compare import comparison_table

    def result(names):
        systems = [
            {"name": n, "system_score": -1.0, "system_sigma": 0.5, "system_lower": -2.0, "system_upper": 0.0}
            for n in names
        ]
        return {"confidence": 0.9, "systems": systems, "pairs": [{"a": names[0], "b": names[1], "p_a_better": 0.013}]}

    # Two paths sharing their first 7 characters: each column headed by a number, each row naming it.
    matrix = comparison_table(result(["/data/run/sysA.txt", "/data/run/sysB.txt"])).split("P(row better")[1]
    lines = matrix.splitlines()[1:]
    assert lines[0].split() == ["#1", "#2"]
    assert lines[1].split() == ["#1", "/data/run/sysA.txt", "-", "0.013"]
    assert lines[2].split() == ["#2", "/data/run/sysB.txt", "0.987", "-"]
    # Names that fit head their own columns, as before.
    short = comparison_table(result(["sysA", "sysB"])).split("P(row better")[1].splitlines()[1:]
    assert short[0].split() == ["sysA", "sysB"] and short[1].split() == ["sysA", "-", "0.013"]


def _compare(files, *mts, extra=()):
    argv = ["compare", "-s", str(files["src"]), "-r", str(files["ref_a"]), "--params", str(files["params"])]
    for mt in mts:
        argv += ["-t", str(mt)]
    return [*argv, *extra]


def test_compare_identical_systems_is_a_coin_flip(files, capsys):
    twin = write_lines(files["dir"] / "twin.txt", MT)
    out = files["dir"] / "cmp.json"
    assert main(_compare(files, files["mt"], twin, extra=("--bootstrap", "2000", "--out", str(out)))) == 0
    table = capsys.readouterr().out
    assert "mt.txt" in table and "twin.txt" in table and "P(row better than column)" in table
    result = json.loads(out.read_text())
    (pair,) = result["pairs"]
    assert pair["p_a_better"] == 0.5 and pair["difference"] == 0.0
    assert pair["p_a_better_bootstrap"] == pytest.approx(0.5, abs=0.05)
    assert result["systems"][0]["system_score"] == result["systems"][1]["system_score"]
    assert result["scale"] == "fake-chrF"


def test_compare_clearly_better_system(files, capsys):
    perfect = write_lines(files["dir"] / "perfect.txt", REF_A)
    out = files["dir"] / "cmp.json"
    argv = _compare(
        files, perfect, files["mt"], files["bad"], extra=("--bootstrap", "500", "--out", str(out))
    )
    assert main(argv) == 0
    result = json.loads(out.read_text())
    scores = {s["name"]: s["system_score"] for s in result["systems"]}
    assert scores[str(perfect)] == pytest.approx(1.0)
    pairs = {(p["a"], p["b"]): p for p in result["pairs"]}
    assert len(pairs) == 3
    best_vs_bad = pairs[(str(perfect), str(files["bad"]))]
    assert best_vs_bad["p_a_better"] > 0.999 and best_vs_bad["p_a_better_bootstrap"] > 0.99
    mt_vs_bad = pairs[(str(files["mt"]), str(files["bad"]))]
    assert mt_vs_bad["p_a_better"] > 0.99
    assert main(argv) == 0
    assert json.loads(out.read_text()) == result  # seeded


def test_compare_bad_input(files, capsys):
    short = write_lines(files["dir"] / "short.txt", MT[:5])
    out = files["dir"] / "cmp.json"
    assert main(_compare(files, files["mt"], short, extra=("--out", str(out)))) == 2
    err = capsys.readouterr().err
    assert "short.txt (mt): 5" in err and not out.exists()
    assert main(_compare(files, files["mt"], extra=("--out", str(files["dir"] / "cmp.txt")))) == 2
    assert "unsupported output suffix" in capsys.readouterr().err


# ----------------------------------------------------------------------------- units
def test_system_score_hand_computed():
    score = system_score([1.0, 2.0, 3.0], [3.0, 4.0, 0.0], 0.9)
    assert score.mean == 2.0
    assert score.sigma == pytest.approx(5.0 / 3.0)
    assert score.lower == pytest.approx(2.0 - 1.6448536269514722 * 5.0 / 3.0)


def test_system_bootstrap_covers_nominally():
    # On synthetic data drawn from the predictive Gaussians, the bootstrap interval has about the
    # same width as the independence interval when the mus are all equal.
    rng = np.random.default_rng(0)
    sigma = rng.uniform(0.5, 1.5, size=400)
    score = system_score(np.zeros(400), sigma, 0.9, n_bootstrap=4000, seed=0)
    assert score.bootstrap_sigma == pytest.approx(score.sigma, rel=0.1)


def test_probability_better_hand_computed():
    p, diff, sd = probability_better([1.0, 1.0], [0.3, 0.4], [0.5, 0.5], [0.0, 0.0])
    assert diff == 0.5 and sd == pytest.approx(0.25)
    assert p == pytest.approx(0.9772498680518208)  # Phi(2)
    assert probability_better([1.0], [0.0], [0.0], [0.0])[0] == 1.0
    assert probability_better([0.0], [0.0], [0.0], [0.0])[0] == 0.5
    with pytest.raises(ValueError, match="common, non-zero length"):
        probability_better([1.0, 2.0], [0.1], [1.0], [0.1])


def test_paired_bootstrap_agrees_with_normal_approximation():
    rng = np.random.default_rng(1)
    mu_a, mu_b = rng.normal(0.1, 1.0, 300), rng.normal(0.0, 1.0, 300)
    sigma_a, sigma_b = np.full(300, 1.0), np.full(300, 1.0)
    p_norm = probability_better(mu_a, sigma_a, mu_b, sigma_b)[0]
    p_boot = paired_bootstrap_probability(mu_a, sigma_a, mu_b, sigma_b, 3000, seed=0)
    assert p_boot == paired_bootstrap_probability(mu_a, sigma_a, mu_b, sigma_b, 3000, seed=0)
    # The bootstrap also carries segment sampling variance, so it is less extreme, on the same side.
    assert (p_norm - 0.5) * (p_boot - 0.5) > 0


def test_default_model_names(tmp_path):
    assert model_name_from_params(tmp_path / "absent.yaml") == "uamt-comet"
    params = write_lines(tmp_path / "params.yaml", ["register:", "  model_name: mine"])
    assert default_model_uri(reference_free=False, params_path=params) == "models:/mine@champion"
    assert default_model_uri(reference_free=True, params_path=params) == "models:/mine-qe@champion"


def test_read_lines_keeps_alignment(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(
        b"\xef\xbb\xbfa\r\nb\xe2\x80\xa8c\r\nd"
    )  # BOM, CRLF, U+2028 inside a line, no final newline
    assert scoring_io.read_lines(path) == ["a", "b\u2028c", "d"]


def test_cli_entry_point_in_subprocess(files, scoring_store):
    env = {**os.environ, "MLFLOW_TRACKING_URI": scoring_store, "PYTHONPATH": str(Path(__file__).parent)}
    script = Path(sys.executable).parent / "uamt"  # the installed console script
    launcher = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import sys; from uamt.cli import main; sys.exit(main())"]
    )
    argv = [*launcher, *_score(files, "-r", str(files["ref_a"]))]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == len(MT) + 1
    bad = subprocess.run(
        [*argv[:-2], "-r", str(files["bad"]) + ".missing"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2 and "file not found" in bad.stderr
