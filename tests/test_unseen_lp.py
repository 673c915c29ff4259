"""Language pairs the model never saw: offline detection, the leave-one-LP-out sigma factor, widening."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from uamt.core.errors import UamtError
from uamt.core.langid import detect_language, detect_pair
from uamt.serving.model_calibration import (
    Calibration,
    fit_unseen_lp_sigma_factor,
    served_lp_coverage,
    with_unseen_factor,
)
from uamt.uncertainty import (
    AffineVarianceCalibrator,
    FixedVarianceCalibrator,
    Standardizer,
    evaluate_predictions,
)

GERMAN = ["Das Haus ist sehr groß und alt.", "Ich habe heute keine Zeit für dich.", "Wir fahren morgen nach Berlin."]
ENGLISH = ["The house is very big and old.", "I have no time for you today.", "We are driving to Berlin tomorrow."]


def test_detect_pair_on_real_sentences():
    pair = detect_pair(GERMAN * 5, ENGLISH * 5)
    assert pair.lp == "de-en"
    assert pair.source.share == pytest.approx(1.0) and pair.source.n_lines == 15
    assert "de (100% of 15 lines)" in pair.describe()


def test_mixed_file_gives_no_pair_and_empty_file_refuses():
    mixed = detect_language(GERMAN + ENGLISH + ["这是一个关于天气的测试句子。", "Это тест о погоде сегодня."])
    assert not mixed.clear
    assert detect_pair(GERMAN + ENGLISH + ["这是一个测试。", "Это тест."], ENGLISH).lp is None
    with pytest.raises(ValueError, match="no non-empty line"):
        detect_language(["", "   "])


def _calibration(factor: float = 1.0) -> Calibration:
    standardizer, affine, fixed = Standardizer(), AffineVarianceCalibrator(), FixedVarianceCalibrator()
    standardizer.global_params = {"human_mean": 0.0, "human_std": 1.0, "pred_mean": 0.0, "pred_std": 1.0}
    standardizer.lp_params = {"en-de": dict(standardizer.global_params)}
    affine.global_params = {"alpha": 1.0, "beta": 0.0, "var_floor": 1e-6}
    fixed.global_params = {"var": 1.0}
    return Calibration(standardizer, affine, fixed, None, unseen_lp_sigma_factor=factor)


def test_unseen_lp_rows_are_widened_and_seen_rows_are_not():
    calibration = _calibration(1.5)
    lp = np.array(["en-de", "xx-yy", "en-de"], dtype=object)
    _, sigma = calibration.apply(np.zeros(3), np.ones(3), lp)
    np.testing.assert_allclose(sigma, [1.0, 1.5, 1.0])
    assert calibration.unseen_lps(lp) == ["xx-yy"]
    assert calibration.unseen_lps(None) == [] and calibration.unseen_lps("en-de") == []
    _, no_lp = calibration.apply(np.zeros(2), np.ones(2), None)  # no LP given: the global fit, unwidened
    np.testing.assert_allclose(no_lp, [1.0, 1.0])
    low, high = calibration.interval(np.zeros(3), np.ones(3), 0.9, lp)
    np.testing.assert_allclose((high - low)[1] / (high - low)[0], 1.5)
    risk = calibration.risk(np.zeros(3), np.ones(3), -1.0, lp)
    assert risk[1] > risk[0]  # risk comes from the same widened distribution


def test_factor_round_trips_and_corrupt_factor_is_refused(tmp_path):
    path = tmp_path / "calibration.json"
    _calibration(1.25).save(path)
    assert Calibration.load(path).unseen_lp_sigma_factor == 1.25
    _calibration(0.5).save(path)
    with pytest.raises(UamtError, match="unseen_lp_sigma_factor = 0.5 must be a finite number >= 1"):
        Calibration.load(path)


def _dev_table(rng, scales: dict[str, float], n: int = 400) -> pd.DataFrame:
    """Dev predictions whose error scale differs per LP (sigma carries no per-row signal)."""
    frames = []
    for lp, scale in scales.items():
        mu = rng.normal(size=n)
        frames.append(
            pd.DataFrame({"lp": lp, "mu": mu, "sigma": 1.0, "human": mu + rng.normal(scale=scale, size=n)})
        )
    return pd.concat(frames, ignore_index=True)


def _fit(table: pd.DataFrame) -> Calibration:
    result = evaluate_predictions(table, table, pred_source="dev", dev_source="dev")
    return Calibration.from_result(result["calibration"])


def test_leave_one_lp_out_factor_covers_held_out_lps_on_average():
    """The factor is what held-out LPs need *on average* (each LP weighing the same), not the worst
    of a few noisy LPs: an unseen pair is then covered at the nominal level in expectation."""
    rng = np.random.default_rng(0)
    table = _dev_table(rng, {"aa-bb": 1.0, "cc-dd": 1.0, "ee-ff": 3.0})
    factor, needed = fit_unseen_lp_sigma_factor(table, _fit)
    assert set(needed) == {"aa-bb", "cc-dd", "ee-ff"}
    assert needed["ee-ff"] > 1.3 > needed["aa-bb"]  # the noisy LP needed wider intervals than global
    assert min(needed.values()) < factor < max(needed.values())
    coverages = [
        served_lp_coverage(with_unseen_factor(_fit(table[table.lp != lp]), factor), table[table.lp == lp], 0.9)
        for lp in needed
    ]
    assert np.mean(coverages) == pytest.approx(0.9, abs=0.002)
    # Held out, the noisy LP is covered at about the nominal level once widened by its own factor.
    held, rest = table[table.lp == "ee-ff"], table[table.lp != "ee-ff"]
    calibration = _fit(rest)
    calibration.unseen_lp_sigma_factor = needed["ee-ff"]
    lower, upper = calibration.interval(held.mu.to_numpy(), held.sigma.to_numpy(), 0.9, held.lp.to_numpy(dtype=object))
    coverage = np.mean((held.human.to_numpy() >= lower) & (held.human.to_numpy() <= upper))
    assert coverage == pytest.approx(0.9, abs=0.01)


def _discrete_table(rng, scales: dict[str, float], n: int = 600) -> pd.DataFrame:
    """MQM-like dev rows: integer scores at or below 0, many exactly 0 (point masses inside the scale)."""
    frames = []
    for lp, scale in scales.items():
        mu = -np.abs(rng.normal(scale=2.0, size=n))
        human = np.minimum(0.0, np.round(mu + rng.normal(scale=scale, size=n)))
        frames.append(pd.DataFrame({"lp": lp, "mu": mu, "sigma": 1.0, "human": human, "doc": np.arange(n) // 10}))
    return pd.concat(frames, ignore_index=True)


def test_factor_widens_a_distribution_with_point_masses_until_it_covers_as_measured():
    """With point masses (the isotonic distribution: every score a mass) a closed interval touches a
    mass at no widening at all, so a closed reading would ask for none; the factor is fitted on the
    randomised coverage the metrics report, and reaches the level there."""
    from uamt.serving.model_calibration import with_isotonic
    from uamt.uncertainty import EvaluationSettings

    settings, bounds = EvaluationSettings(), (-25.0, 0.0)
    rng = np.random.default_rng(3)
    table = _discrete_table(rng, {"aa-bb": 1.0, "cc-dd": 1.0, "ee-ff": 4.0})

    def fit(rows: pd.DataFrame) -> Calibration:
        return with_isotonic(_fit(rows), rows, None, settings)

    factor, needed = fit_unseen_lp_sigma_factor(table, fit, bounds=bounds)
    assert needed["ee-ff"] > 1.2 and factor > 1.05
    held = {lp: (fit(table[table.lp != lp]), table[table.lp == lp]) for lp in needed}
    unwidened = np.mean([served_lp_coverage(c, rows, 0.9, bounds) for c, rows in held.values()])
    widened = np.mean([served_lp_coverage(with_unseen_factor(c, factor), rows, 0.9, bounds) for c, rows in held.values()])
    assert unwidened < 0.88 and widened == pytest.approx(0.9, abs=0.005)


@pytest.mark.parametrize(
    ("coverage", "low", "high", "expected"),
    [
        (lambda w: min(1.0, 0.5 * w), 0.1, 16.0, 1.8),  # reaches 0.9 at w = 1.8
        (lambda w: 0.95, 1.0, 16.0, 1.0),  # the lower end already covers
        (lambda w: 0.5, 0.1, 16.0, 16.0),  # never covers: the largest widening searched
        (lambda w: 0.8 if w < 1.25 else 0.92, 1.0, 4.0, 1.25),  # a step: its edge
    ],
)
def test_smallest_widening_hand_computed(coverage, low, high, expected):
    from uamt.serving.model_calibration import smallest_widening

    assert smallest_widening(coverage, 0.9, low, high) == pytest.approx(expected, abs=1e-4)


def test_served_coverage_is_the_metrics_coverage():
    """One level of what the metrics count: the mean of served_coverage is coverage@0.9 of served_metrics,
    point masses (at the top and inside the scale) included."""
    from uamt.serving.model_calibration import with_isotonic
    from uamt.uncertainty import EvaluationSettings
    from uamt.uncertainty.served import served_coverage, served_metrics, served_rows

    bounds = (-25.0, 0.0)
    rng = np.random.default_rng(4)
    table = _discrete_table(rng, {"aa-bb": 1.0, "cc-dd": 2.0})
    calibration = with_isotonic(_fit(table), table, None, EvaluationSettings())
    test = _discrete_table(rng, {"aa-bb": 1.5, "cc-dd": 2.0, "xx-yy": 3.0})
    args = (test.mu.to_numpy(), test.sigma.to_numpy(), test.lp.to_numpy(dtype=object))
    human = test.human.to_numpy()
    metrics = served_metrics(served_rows(calibration, *args, bounds=bounds, human=human), human, test.lp.to_numpy())
    for lp in ("aa-bb", "cc-dd", "xx-yy"):
        rows = (test.lp == lp).to_numpy()
        share = served_coverage(calibration, *(a[rows] for a in args), human[rows], 0.9, bounds=bounds)
        assert float(np.mean(share)) == pytest.approx(metrics[lp]["coverage@0.9"], abs=1e-12)
        assert metrics[lp]["coverage@0.9"] != pytest.approx(metrics[lp]["closed_coverage@0.9"], abs=1e-3)


def test_factor_is_one_with_a_single_lp_and_never_below_one():
    rng = np.random.default_rng(1)
    assert fit_unseen_lp_sigma_factor(_dev_table(rng, {"aa-bb": 1.0}), _fit) == (1.0, {})
    factor, needed = fit_unseen_lp_sigma_factor(_dev_table(rng, {"aa-bb": 1.0, "cc-dd": 1.0}), _fit)
    assert factor >= 1.0 and len(needed) == 2


def test_choose_language_pair_given_detected_unseen_and_undetermined():
    from uamt.serving.language_pair import choose_language_pair

    known = ("en-de", "zh-en")
    given = choose_language_pair(ENGLISH, GERMAN, "en-de", known, sigma_factor=1.3)
    assert given.lp == "en-de" and given.how == "given" and not given.unseen and given.messages() == []
    detected = choose_language_pair(GERMAN * 3, ENGLISH * 3, None, known, sigma_factor=1.3)
    assert detected.lp == "de-en" and detected.how == "detected" and detected.unseen
    unseen, how = detected.messages()
    assert "de-en was never seen in training" in unseen and "en-de, zh-en" in unseen and "x1.30" in unseen
    assert how.startswith("detected language pair de-en: source de")
    assert detected.to_summary() == {"lp": "de-en", "lp_source": "detected", "lp_seen_in_training": False}
    # Rows of several pairs: each keeps its own (de-en, en-en, ...), no single LP.
    mixed = choose_language_pair(GERMAN + ENGLISH + ["这是一个测试。", "Это тест."], (ENGLISH * 3)[:8], None, known)
    assert mixed.lp is None and mixed.how == "detected" and mixed.row_counts["de-en"] == 3
    assert "detected language pairs per row: de-en (3), en-en (3)" in mixed.messages()[-1]
    nothing = choose_language_pair(["...", "12"], ["?", "!"], None, known)  # no language in the text
    assert nothing.lp is None and nothing.how == "undetermined" and set(nothing.row_lps) == {"und"}
    assert "could not be determined confidently (lines 1, 2)" in nothing.messages()[0]
    assert choose_language_pair(GERMAN, ENGLISH, None, ()).lp is None  # no per-LP calibration: no detection


def test_served_conformal_risk_is_widened_like_its_interval():
    """The conformal branch of ``risk`` used to skip the unseen-LP factor its interval applies."""
    from uamt.serving.model_calibration import fit_calibration
    from uamt.uncertainty import EvaluationSettings

    rng = np.random.default_rng(3)
    table = _dev_table(rng, {"aa-bb": 1.0, "cc-dd": 1.5})
    settings = EvaluationSettings(calibration="mondrian_conformal")
    calibration, _ = fit_calibration(table, settings=settings)
    assert calibration.selected == "mondrian_conformal"
    lp = np.array(["aa-bb", "xx-yy"], dtype=object)
    mu, sigma = np.zeros(2), np.ones(2)
    plain = calibration.risk(mu, sigma, -2.0, lp)
    calibration.unseen_lp_sigma_factor = 1.5
    widened = calibration.risk(mu, sigma, -2.0, lp)
    assert widened[0] == pytest.approx(plain[0]) and widened[1] > plain[1]


def test_calibrate_stage_fits_and_writes_the_unseen_lp_factor(tmp_path, monkeypatch):
    """``calibrate_models`` stores each model's leave-one-LP-out factor (>= 1) in its calibration
    file and in ``metrics/dev.json`` beside the per-LP metrics (the models' dev predictions faked)."""
    import json

    from uamt import model_evaluation
    from uamt.pipeline_config import PipelineConfig
    from uamt.uncertainty import EvaluationSettings

    rng = np.random.default_rng(4)
    table = _dev_table(rng, {"aa-bb": 1.0, "cc-dd": 1.0, "ee-ff": 2.5}, n=150)
    monkeypatch.setattr(model_evaluation, "read_split", lambda *a, **k: table)
    monkeypatch.setattr(model_evaluation, "open_features", lambda encode: None)
    monkeypatch.setattr(model_evaluation, "predict_split", lambda *a, **k: table)
    monkeypatch.setattr(model_evaluation, "fit_reference_factors", lambda *a, **k: {})
    monkeypatch.setattr(model_evaluation, "training_splits", lambda model_dir: frozenset({"d_q"}))
    monkeypatch.setattr(model_evaluation, "pipeline_bounds", lambda pipe: None)  # the fake scores are unbounded
    pipe = PipelineConfig(methods=("point", "hts"), dup_base="point", qe_methods=(), register_qe_method=None,
                          metrics_dir=str(tmp_path / "metrics"))  # fmt: skip
    monkeypatch.setattr(PipelineConfig, "all_methods", property(lambda self: ("point", "hts")))
    paths = model_evaluation.calibrate_models(pipe, EvaluationSettings(), None, tmp_path / "calibration")
    dev = json.loads((tmp_path / "metrics" / "dev.json").read_text())
    for method in ("point", "hts"):
        factor = Calibration.load(paths[method]).unseen_lp_sigma_factor
        unseen = dev[method]["unseen_lp"]
        assert factor == unseen["sigma_factor"] and factor >= 1.0
        assert set(unseen["held_out"]) == {"aa-bb", "cc-dd", "ee-ff"}
        assert unseen["held_out"]["ee-ff"] > 1.2 > unseen["held_out"]["aa-bb"]  # the noisy LP drives it
        assert {"avg", "aa-bb", "cc-dd", "ee-ff"} <= set(dev[method])  # the metrics stay


# ---------------------------------------------------------------------------- detection that cannot be bypassed
# Yiddish (YIVO spelling, and Hasidic spelling without points): py3langid knows no Yiddish and calls
# it Hebrew with 74-99% confidence per line.
YIDDISH = [
    "איך האָב ליב צו לייענען ביכער אין דער היים.",
    "דער טאַטע איז געגאַנגען אין שול אויף שבת.",
    "מיר וועלן מאָרגן פֿאָרן קיין ניו־יאָרק.",
    "די קינדער שפּילן זיך אין הויף.",
    "וואָס מאַכסטו? עס גייט מיר גוט, אַ דאַנק.",
    "דאָס איז אַ שיינע שטאָט מיט אַ סך אַלטע הייזער.",
    "זי האָט געשריבן אַ בריוו צו איר באָבע.",
    "דער עולם האָט זיך צונויפֿגעקליבן אין זאַל.",
    "מיר האָבן נישט קיין צייט היינט.",
    "דער ייִדישער טעאַטער איז געווען זייער באַליבט.",
    "ער לערנט זיך ייִדיש אין אוניווערסיטעט.",
    "דער ווינטער איז דאָ געווען זייער קאַלט.",
]
YIDDISH_HASIDIC = ["דער רבי האט גערעדט צום עולם", "מיר גייען היינט אין שטוב", "דער זיידע איז געווען א גרויסער למדן"]
HEBREW = [
    "הממשלה החליטה היום להעלות את שכר המינימום.",
    "ראש העיר נפגש עם התושבים בשכונה הצפונית.",
    "מחירי הדירות בתל אביב ממשיכים לעלות.",
    "השחקן הבקיע שני שערים במשחק אתמול בערב.",
    "המשטרה פתחה בחקירה בעקבות התאונה בכביש.",
    "התלמידים חזרו ללימודים אחרי חופשת הקיץ.",
]
ENGLISH_12 = ENGLISH * 4
# Kanji-only Japanese (headlines, notices): every character is Japanese (JIS X 0208) and several are
# Japanese forms outside simplified Chinese (発, 済, 険, 気): py3langid calls them Chinese.
KANJI_JAPANESE = [
    "東京都知事選挙結果発表",
    "本日天気晴朗",
    "株式会社設立登記申請書",
    "国際連合安全保障理事会開催",
    "大阪府警察本部交通部長就任",
    "日本経済新聞社説",
    "新型感染症対策本部会議",
    "東京証券取引所株価急落",
]
CHINESE = [
    "这是一个关于天气的测试句子。",
    "我们明天要去北京开会。",
    "政府发布了新的经济政策。",
    "他说这个问题很快就会解决。",
    "学生们在图书馆里认真学习。",
    "这家公司去年的收入增长了很多。",
]
KNOWN = ("en-de", "he-en", "zh-en")


@pytest.mark.parametrize(
    ("case", "src", "mt", "lp", "calibration_lps"),
    [
        # before: detected he-en (64%), he-en's calibration (narrower than unseen)
        ("yiddish-file", YIDDISH, ENGLISH_12, None, {"und"}),
        ("yiddish-hasidic-spelling", YIDDISH_HASIDIC * 4, ENGLISH_12, None, {"und"}),
        # before: undetermined -> lp None -> the global calibration, not widened
        ("yiddish-and-russian", YIDDISH[:6] + ["Правительство объявило сегодня о новых мерах поддержки экономики."] * 6, ENGLISH_12, None, {"und", "ru-en"}),
        # before: detected zh-en
        ("kanji-only-japanese", KANJI_JAPANESE, ENGLISH[:2] * 4, None, {"und"}),
        # before: --lp accepted silently, en-de's / zh-en's calibration on German -> English text
        ("german-as-en-de", GERMAN * 4, ENGLISH_12, "en-de", {"und"}),
        ("german-as-zh-en", GERMAN * 4, ENGLISH_12, "zh-en", {"und"}),
        # must not change: the text agrees with the pair (given or detected)
        ("hebrew-detected", HEBREW * 2, ENGLISH_12, None, {"he-en"}),
        ("chinese-detected", CHINESE * 2, ENGLISH_12, None, {"zh-en"}),
        ("hebrew-given", HEBREW * 2, ENGLISH_12, "he-en", {"he-en"}),
        ("german-given-right", GERMAN * 4, ENGLISH_12, "de-en", {"de-en"}),
        # a file mixing two pairs: each row its own (no pair taken from the first rows for all)
        ("en-de-then-zh-en", ENGLISH * 2 + CHINESE * 3, GERMAN * 2 + ENGLISH * 6, None, {"en-de", "zh-en"}),
    ],
)
def test_no_row_gets_a_calibration_its_text_does_not_support(case, src, mt, lp, calibration_lps):
    from uamt.serving.language_pair import UNDETERMINED_LP, choose_language_pair

    choice = choose_language_pair(src, mt, lp, KNOWN, sigma_factor=1.4)
    frame = choice.assign(pd.DataFrame({"src": src, "mt": mt}))
    assert set(frame["lp"]) == calibration_lps, choice.row_counts
    calibration = _calibration(1.4)
    calibration.standardizer.lp_params = {k: dict(calibration.standardizer.global_params) for k in KNOWN}
    _, sigma = calibration.apply(np.zeros(len(frame)), np.ones(len(frame)), frame["lp"].to_numpy(dtype=object))
    expected = np.where(np.isin(frame["lp"], KNOWN), 1.0, 1.4)
    np.testing.assert_allclose(sigma, expected)  # every undetermined / contradicting row is widened
    if UNDETERMINED_LP in calibration_lps:
        text = " ".join(choice.messages())
        assert "scored as an unseen language pair and intervals are widened x1.40" in text, text
        assert ("contradicts --lp" in text) == (lp is not None)


def test_lp_contradiction_warning_names_both_pairs_and_the_lines():
    from uamt.serving.language_pair import choose_language_pair

    choice = choose_language_pair(GERMAN * 4, ENGLISH * 4, "en-de", KNOWN, sigma_factor=1.4)
    first = choice.messages()[0]
    assert first.startswith("the text of 12 of 12 rows contradicts --lp en-de: detected de-en (12)")
    assert "(lines 1, 2, 3, 4, 5, ...)" in first and first.endswith("check --lp")
    assert choice.to_summary()["lp_rows_contradicting"] == 12
    assert "12 rows contradict --lp en-de: intervals widened x1.40" in choice.note()


def test_detection_never_widens_real_news_text():
    """On news text of the trained pairs a handful of lines at most are undetermined (punctuation-only
    lines take their file's language) and nothing contradicts the right --lp."""
    from uamt.serving.language_pair import choose_language_pair

    for src, mt, lp in ((GERMAN * 5, ENGLISH * 5, "de-en"), (CHINESE * 3, ENGLISH[:2] * 9, "zh-en")):
        src = [*src, ".", "“", "GB 18030-2022"]
        mt = [*mt, ".", "”", "GB 18030-2022"]
        detected = choose_language_pair(src, mt, None, KNOWN)
        assert detected.lp == lp and detected.undetermined_rows == [], detected.row_counts
        assert choose_language_pair(src, mt, lp, KNOWN).row_lps is None  # agrees: nothing changed


@pytest.mark.parametrize(
    ("text", "ok"),
    [("de-en", True), ("yue-en", True), ("en-hbo", True), ("", False), ("de-en\nINFO fake log line", False),
     ("../../etc/passwd", False), ("DE-EN", False), ("de_en", False), ("deu-engl", False), ("de-en ", False)],
)
def test_lp_must_be_two_iso_codes(text, ok):
    from uamt.serving.language_pair import parse_language_pair

    if ok:
        assert parse_language_pair(text) == text
    else:
        with pytest.raises(ValueError, match=r"expected a language pair xx-yy of ISO 639 codes"):
            parse_language_pair(text)


@pytest.mark.parametrize("bad", ["", "de-en\nINFO uamt: fake log line", "../../etc/passwd", "German"])
@pytest.mark.parametrize("command", ["score", "compare"])
def test_cli_refuses_a_malformed_lp_before_loading_anything(bad, command, tmp_path, capsys):
    """``--lp ""`` used to fail with a traceback after the model had loaded; a newline printed a fake
    log line; a path was taken as a pair."""
    from uamt.cli import main

    text = tmp_path / "lines.txt"
    text.write_text("Hallo Welt.\n", encoding="utf-8")
    assert main([command, "-s", str(text), "-t", str(text), "--model", str(tmp_path / "no-model"), "--lp", bad]) == 2
    err = capsys.readouterr().err
    assert f"--lp: expected a language pair xx-yy of ISO 639 codes (2-3 lowercase letters each, e.g. de-en), got {bad!r}" in err
    assert "INFO uamt: fake log line" not in err.replace(repr(bad), "")  # shown escaped, never as a line
