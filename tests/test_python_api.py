"""The Python API (``uamt.load_model(...).score(...)``) and the one scoring use case every path
goes through (:func:`uamt.serving.scorer.score_texts`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_scoring_support import FakePredictor, write_lines

import uamt
from uamt.cli import main
from uamt.core.errors import DataError, UamtError
from uamt.serving import scorer
from uamt.serving.calibrated_predictor import clip_to_scale
from uamt.serving.predictor import ScoreScale
from uamt.uncertainty.metrics import gaussian_interval, translation_risk

ROOT = Path(__file__).resolve().parents[1]
MODEL = "models:/uamt-comet@champion"
SRC = [
    "Der Hund schläft heute im großen Garten hinter dem Haus.",
    "Ich habe heute leider überhaupt keine Zeit für dich.",
    "Das Wetter ist heute in der ganzen Stadt sehr schön.",
    "Yo no tengo tiempo hoy para hablar contigo.",
    "Wir fahren morgen früh mit dem Zug nach Berlin.",
]
MT = [
    "The dog is sleeping in the big garden behind the house today.",
    "Unfortunately I have no time at all for you today.",
    "The weather is very nice in the whole city today.",
    "I do not have time today to talk with you.",
    "Tomorrow morning we are taking the train to Berlin.",
]
REF_A = [
    "Today the dog sleeps in the large garden behind the house.",
    "Sadly, I have no time for you today.",
    "Today the weather is lovely all over town.",
    "I have no time to talk to you today.",
    "We are going to Berlin by train tomorrow morning.",
]
REF_B = [
    "The dog sleeps in the garden.",
    "I have no time today.",
    "The weather is nice.",
    "I don't have time today.",
    "We go to Berlin tomorrow.",
]


class LanguagePairFakePredictor(FakePredictor):
    """The fake of ``test_scoring_support`` with what a real uamt model adds: a calibration of its
    own for de-en only (other pairs widened x1.5), a bounded scale (clipped column), and an
    encoder that reads 10 tokens (``truncated``)."""

    known_lps = ["de-en"]
    unseen_lp_sigma_factor = 1.5
    max_tokens = 10

    def __init__(self, uses_references: bool = True):
        super().__init__(uses_references)
        self.scale = ScoreScale("fake-chrF", "chrF/100 (test double)", 0.3, bounds=(0.0, 0.6))

    def predict_frame(self, frame, *, confidence=0.9, risk_threshold=None, batch_size=64, progress=False):
        out = super().predict_frame(frame.drop(columns=["lp"], errors="ignore"), confidence=confidence)
        chi = self.scale.default_risk_threshold if risk_threshold is None else risk_threshold
        if "lp" in frame.columns:
            widen = np.where(frame["lp"].isin(self.known_lps), 1.0, self.unseen_lp_sigma_factor)
            out["sigma"] = out["sigma"] * widen
            out["lower"], out["upper"] = gaussian_interval(out["mu"], out["sigma"], confidence)
            out["risk"] = translation_risk(out["mu"], out["sigma"], chi)
        return clip_to_scale(out, self.scale.bounds, chi)

    def truncated(self, texts):
        return [i for i, text in enumerate(texts) if len(text.split()) > self.max_tokens]


@pytest.fixture
def fake_models(monkeypatch):
    """Every model URI loads the fake: ``...-qe...`` the reference-free one; returns the URIs loaded."""
    loaded = []

    def load_predictor(uri):
        loaded.append(uri)
        return LanguagePairFakePredictor(uses_references="-qe" not in str(uri))

    monkeypatch.setattr("uamt.serving.predictor.load_predictor", load_predictor)
    return loaded


@pytest.fixture
def files(tmp_path):
    return {
        "src": write_lines(tmp_path / "src.txt", SRC),
        "mt": write_lines(tmp_path / "mt.txt", MT),
        "ref_a": write_lines(tmp_path / "ref_a.txt", REF_A),
        "ref_b": write_lines(tmp_path / "ref_b.txt", REF_B),
    }


def _cli_records(capsys, args) -> tuple[list[dict], dict]:
    assert main(["score", *args, "--no-progress"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return rows[:-1], rows[-1]["summary"]


# (what, model, CLI options, score(...) keyword arguments)
SAME_AS_CLI = [
    ("reference, lp detected", "models:/uamt-comet@champion", ["-r", "ref_a"], {"ref": REF_A}),
    ("reference, lp given", "models:/uamt-comet@champion", ["-r", "ref_a", "--lp", "de-en"], {"ref": REF_A, "lp": "de-en"}),
    (
        "two references averaged, 80% interval, own threshold",
        "models:/uamt-comet@champion",
        ["-r", "ref_a", "-r", "ref_b", "--confidence", "0.8", "--risk-threshold", "0.5"],
        {"ref": [list(pair) for pair in zip(REF_A, REF_B, strict=True)], "confidence": 0.8, "risk_threshold": 0.5},
    ),
    ("reference-free", "models:/uamt-comet-qe@champion", [], {}),
]


@pytest.mark.parametrize(("what", "model", "options", "kwargs"), SAME_AS_CLI, ids=[c[0] for c in SAME_AS_CLI])
def test_score_gives_the_numbers_uamt_score_prints(fake_models, files, capsys, what, model, options, kwargs):
    options = [str(files[o]) if o in files else o for o in options]
    records, summary = _cli_records(capsys, ["-s", str(files["src"]), "-t", str(files["mt"]), "--model", model, *options])
    scores = uamt.load_model(model).score(src=SRC, mt=MT, **kwargs)
    assert list(scores.columns) == [
        "mu", "sigma", "lower", "upper", "risk", "epistemic_var", "aleatoric_var", "clipped", "lp", "warnings",
    ]
    for column in ("mu", "sigma", "lower", "upper", "risk", "epistemic_var", "aleatoric_var", "clipped"):
        assert scores[column].tolist() == [r[column] for r in records], column  # equal, not close
    assert scores.attrs["risk_threshold"] == summary["risk_threshold"]
    assert scores.attrs["confidence"] == summary["confidence"]
    if "lp_rows" in summary:  # rows per calibration pair, as the CLI's summary counts them
        assert scores["lp"].value_counts().to_dict() == summary["lp_rows"]
    elif summary["lp"] is not None:
        assert set(scores["lp"]) == {summary["lp"]}
    assert sorted(set(scores["lp"])) != [None] and scores["clipped"].any()


def test_rows_say_what_to_read_their_numbers_with(fake_models):
    model = uamt.load_model("models:/uamt-comet@champion")
    scores = model.score(src=SRC, mt=MT, ref=REF_A)
    assert scores["lp"].tolist() == ["de-en", "de-en", "de-en", "es-en", "de-en"]
    assert scores["warnings"][3] == [
        "language pair es-en was never seen in training (the model knows de-en): the score is less reliable "
        "and its interval is widened x1.50"
    ]
    assert scores["warnings"][0] == [
        "mt is longer than the encoder reads (10 tokens): scored on its beginning only",
        "ref is longer than the encoder reads (10 tokens): scored on its beginning only",
    ]
    assert scores["warnings"][1] == []
    # A given pair the text contradicts: that row is scored as an unseen pair and says so.
    contradicted = model.score(src=SRC, mt=MT, ref=REF_A, lp="de-en")
    assert contradicted["lp"].tolist() == ["de-en", "de-en", "de-en", "und", "de-en"]
    assert contradicted["warnings"][3][0].startswith("the text contradicts lp de-en: scored as an unseen")
    # One pair per row, None to detect that one.
    per_row = model.score(src=SRC, mt=MT, ref=REF_A, lp=["en-de", None, None, None, None])
    assert per_row["lp"].tolist() == ["en-de", "de-en", "de-en", "es-en", "de-en"]
    assert per_row["sigma"][0] == pytest.approx(1.5 * scores["sigma"][0])


def test_a_local_model_folder_scores_as_uamt_score_does(scoring_tracking, files, tmp_path, capsys):
    from mlflow.artifacts import download_artifacts

    folder = Path(download_artifacts(artifact_uri="models:/uamt-test@champion", dst_path=str(tmp_path / "m")))
    records, _ = _cli_records(
        capsys, ["-s", str(files["src"]), "-t", str(files["mt"]), "-r", str(files["ref_a"]), "--model", str(folder)]
    )
    model = uamt.load_model(folder)  # a path object, as well as a str
    scores = model.score(src=SRC, mt=MT, ref=REF_A)
    assert scores["mu"].tolist() == [r["mu"] for r in records]
    assert scores["sigma"].tolist() == [r["sigma"] for r in records]
    assert not scores["clipped"].any() and scores["lp"].isna().all()  # no bounds, no per-LP calibration
    with pytest.raises(UamtError, match="no model folder at"):
        uamt.load_model(tmp_path / "missing")


def test_the_documented_example_runs(fake_models):
    """The first Python block of docs/python-api.md, run as written (the model is the fake)."""
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/python-api.md", "exec"), namespace)
    scores = namespace["scores"]
    assert isinstance(scores, pd.DataFrame) and len(scores) >= 1
    assert fake_models == ["models:/uamt-comet@champion"]


BAD_INPUT = [
    ("src a string", dict(src="Ein Satz.", mt=["A sentence."], ref=["A sentence."]), DataError, "src must be a list of strings"),
    ("misaligned", dict(src=SRC, mt=MT[:2], ref=REF_A), DataError, r"mt has 2 texts but src has 5"),
    ("blank text", dict(src=SRC, mt=[*MT[:4], "   "], ref=REF_A), DataError, r"mt\[4\] is empty"),
    ("not a string", dict(src=SRC, mt=[*MT[:4], 3], ref=REF_A), DataError, r"mt\[4\] must be a string, got int"),
    ("no segments", dict(src=[], mt=[], ref=[]), DataError, "src is empty"),
    ("bad lp", dict(src=SRC, mt=MT, ref=REF_A, lp="German"), DataError, "lp: expected a language pair"),
    ("bad lp row", dict(src=SRC, mt=MT, ref=REF_A, lp=["de-en", "x", None, None, None]), DataError, r"lp\[1\]"),
    ("confidence", dict(src=SRC, mt=MT, ref=REF_A, confidence=1.5), DataError, r"confidence must be in \(0, 1\), got 1.5"),
    ("threshold", dict(src=SRC, mt=MT, ref=REF_A, risk_threshold=float("nan")), DataError, "finite number"),
    ("no reference", dict(src=SRC, mt=MT), UamtError, "reference-based model .* needs ref="),
    ("ref misaligned", dict(src=SRC, mt=MT, ref=REF_A[:3]), DataError, "ref has 3 entries but src has 5"),
]


@pytest.mark.parametrize(("what", "kwargs", "error", "match"), BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_refused_naming_the_argument(fake_models, what, kwargs, error, match):
    with pytest.raises(error, match=match):
        uamt.load_model("models:/uamt-comet@champion").score(**kwargs)


def test_references_given_to_a_qe_model_are_refused(fake_models):
    with pytest.raises(UamtError, match="reference-free .* call score without ref"):
        uamt.load_model(reference_free=True).score(src=SRC, mt=MT, ref=REF_A)
    assert fake_models == ["models:/uamt-comet-qe@champion"]


def test_import_uamt_stays_light():
    code = "import sys, uamt; print(sorted(m for m in ('pandas', 'numpy', 'torch', 'mlflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ----------------------------------------------------------------------------- one use case
def test_cli_rest_batch_python_api_and_compare_all_score_through_score_texts(fake_models, files, tmp_path, monkeypatch, capsys):
    from uamt.serving import batch
    from uamt.serving.rest import ScoringService

    calls = []
    real = scorer.score_texts

    def recording(predictor, frame, *args, **kwargs):
        calls.append(len(frame))
        return real(predictor, frame, *args, **kwargs)

    monkeypatch.setattr(scorer, "score_texts", recording)
    paths = {}
    _cli_records(capsys, ["-s", str(files["src"]), "-t", str(files["mt"]), "-r", str(files["ref_a"]), "--model", MODEL])
    paths["uamt score"] = calls[:]
    service = ScoringService(LanguagePairFakePredictor(), "m")
    body = {"dataframe_records": [{"src": s, "mt": m, "ref": r} for s, m, r in zip(SRC, MT, REF_A, strict=True)]}
    assert len(service.invocations(json.dumps(body).encode())["predictions"]) == 5
    paths["REST"] = calls[len(paths["uamt score"]) :]
    monkeypatch.setattr(batch, "cached_predictor", lambda model, tracking_uri=None: LanguagePairFakePredictor())
    frame = pd.DataFrame({"row": range(5), "src": SRC, "mt": MT, "ref": REF_A})
    record = batch.score_partition(frame, str(tmp_path / "part.parquet"), batch.BatchSettings(model="m"))
    assert record["rows"] == 5
    paths["batch"] = calls[sum(map(len, paths.values())) :]
    uamt.load_model(MODEL).score(src=SRC, mt=MT, ref=REF_A)
    paths["Python API"] = calls[sum(map(len, paths.values())) :]
    mt_b = write_lines(tmp_path / "mt_b.txt", REF_B)
    compare = ["compare", "-s", str(files["src"]), "-t", str(files["mt"]), "-t", str(mt_b), "-r", str(files["ref_a"])]
    assert main([*compare, "--model", MODEL, "--no-progress"]) == 0
    paths["uamt compare"] = calls[sum(map(len, paths.values())) :]
    assert paths == {"uamt score": [5], "REST": [5], "batch": [5], "Python API": [5], "uamt compare": [10]}


@pytest.mark.parametrize(
    ("confidence", "ok"),
    [(0.9, True), (0.5, True), (0, False), (1, False), (1.5, False), (float("nan"), False), ("0.9", False), (True, False)],
)
def test_the_confidence_level_is_checked_in_one_place(confidence, ok):
    if ok:
        assert scorer.check_confidence(confidence) == confidence
        assert scorer.ScoringSettings(confidence).confidence == confidence
    else:
        with pytest.raises(DataError, match=r"--confidence must be in \(0, 1\)"):
            scorer.check_confidence(confidence, "--confidence")
        with pytest.raises(DataError, match=r"confidence must be in \(0, 1\)"):
            scorer.ScoringSettings(confidence)


def test_no_other_module_checks_the_confidence_level_or_the_output_columns():
    """The range check of the level and the check of a model's output live in uamt.serving.scorer only."""
    checks = re.compile(r"<\s*confidence\s*<|confidence\s*(<=|>=)\s*[01]\b|c not in out\.columns for c in OUTPUT_COLUMNS")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "src" / "uamt").rglob("*.py")
        if path.name != "scorer.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if checks.search(line)
    ]
    assert found == []


def test_a_model_without_the_output_columns_is_refused(fake_models):
    class Broken(LanguagePairFakePredictor):
        def predict_frame(self, frame, **kwargs):
            return super().predict_frame(frame, **kwargs).drop(columns=["risk"])

    with pytest.raises(scorer.ModelOutputError, match=r"the model returned no \['risk'\] columns"):
        scorer.score_texts(Broken(), pd.DataFrame({"src": SRC, "mt": MT, "ref": REF_A}))


# ----------------------------------------------------------------------------- installs without extras
def test_dask_batch_scoring_without_dask_installed_says_what_to_install(monkeypatch, tmp_path):
    from uamt.serving import batch

    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    with pytest.raises(UamtError, match=r"--dask='local:1' needs Dask .*pip install 'uamt\[pipeline\]'"):
        batch._dask_client("local:1")


def test_serve_without_fastapi_installed_says_what_to_install(fake_models, monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "uamt.serving.server", raising=False)
    monkeypatch.setitem(sys.modules, "fastapi", None)
    assert main(["serve", "--model", MODEL, "--port", "0"]) == 2
    assert "uamt serve needs the REST server's libraries (fastapi is not installed): pip install 'uamt[serve]'" in (
        capsys.readouterr().err
    )
