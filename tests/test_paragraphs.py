"""uamt.paragraphs: multi-sentence rows cut into aligned sentence units, the dev-fitted blend recorded in
the model, and every predict path (torch, ONNX head, predictions table) returning it as mu."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sacrebleu.metrics import CHRF

from tests.fakes import FEATURES
from uamt.core.errors import UamtError
from uamt.models import TrainConfig, load, train
from uamt.models.api import MANIFEST
from uamt.paragraphs import (
    COLUMNS,
    MIN_FIT_ROWS,
    ParagraphBlend,
    _char_ngrams,
    align_by_length,
    align_sentences,
    blend_inputs,
    chrf_from_ngrams,
    fit_blend,
    length_scales,
    paragraph_units,
    row_units,
    source_units,
    unit_texts,
    units_f_test,
    whole_row_level,
)

REF = ["Der Ausschuss tagte am Montag.", "Er beschloss einen neuen Haushalt.", "Die Sitzung endete um acht Uhr."]
SRC = "The committee met on Monday. It adopted a new budget. The meeting ended at eight."


@pytest.mark.parametrize(
    ("hyp", "ref"),
    [
        ("Der Ausschuss tagte am Montag.", "Der Ausschuss tagte Montag."),
        ("völlig anders", "Die Sitzung endete um acht Uhr."),
        ("他们周一开会。", "委员会周一开会。"),
        ("a", "abcdefgh"),  # orders the hypothesis lacks count for neither side
        ("  ", "nothing"),
        ("same words here", "same words here"),
    ],
)
def test_chrf_from_counted_ngrams_is_sacrebleus_sentence_chrf(hyp, ref):
    want = CHRF().sentence_score(hyp, [ref]).score / 100
    assert chrf_from_ngrams(_char_ngrams(hyp), _char_ngrams(ref)) == pytest.approx(want, abs=1e-12)


def test_chrf_counts_the_clipped_matches_of_the_counters_intersection():
    """The matches are the summed counts of the n-grams' intersection (each n-gram at its smaller
    count), on texts with repeated n-grams: the same floats as summing ``hyp & ref``."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        hyp, ref = ("".join(rng.choice(list("aab c"), size=rng.integers(0, 30))) for _ in range(2))
        hyp_n, ref_n = _char_ngrams(hyp), _char_ngrams(ref)
        precision = recall = 0.0
        orders = 0
        for h, r in zip(hyp_n, ref_n, strict=True):
            if sum(h.values()) and sum(r.values()):
                match = sum((h & r).values())
                precision, recall, orders = precision + match / sum(h.values()), recall + match / sum(r.values()), orders + 1
        precision, recall = (precision / orders, recall / orders) if orders else (0.0, 0.0)
        want = 0.0 if precision + recall == 0 else (1 + 4) * precision * recall / (4 * precision + recall)
        assert chrf_from_ngrams(hyp_n, ref_n) == want, (hyp, ref)


def test_a_dropped_sentence_is_left_unaligned_and_the_others_keep_their_partners():
    links, unaligned_ref, unaligned_mt = align_sentences([REF[0], REF[2]], REF)
    assert links == [((0,), (0,)), ((2,), (1,))] and unaligned_ref == [1] and unaligned_mt == []


def test_two_sentences_joined_into_one_are_one_link_and_an_unrelated_sentence_is_an_addition():
    joined = "Der Ausschuss tagte am Montag und beschloss einen neuen Haushalt."
    links, unaligned_ref, unaligned_mt = align_sentences([joined, REF[2]], REF)
    assert links == [((0, 1), (0,)), ((2,), (1,))] and unaligned_ref == [] and unaligned_mt == []
    links, unaligned_ref, unaligned_mt = align_sentences([*REF, "Kaufen Sie jetzt billige Uhren online."], REF)
    assert links == [((i,), (i,)) for i in range(3)] and unaligned_mt == [3]


def test_units_pair_each_reference_sentence_with_its_source_sentence_or_the_row_is_scored_whole():
    found = paragraph_units(SRC, f"{REF[0]} {REF[2]}", " ".join(REF))
    assert found.units == (("The committee met on Monday.", REF[0], REF[0]), ("The meeting ended at eight.", REF[2], REF[2]))
    assert (found.omitted, found.added) == (1, 0)
    # a source of another sentence count: which source sentence a reference sentence translates is unknown
    assert paragraph_units("The committee met on Monday and adopted a budget.", REF[0], " ".join(REF)) is None
    # one sentence on every side: nothing to cut; no reference or an empty translation: nothing to align
    assert paragraph_units("The committee met on Monday.", REF[0], REF[0]) is None
    assert paragraph_units(SRC, " ".join(REF), None) is None
    assert paragraph_units(SRC, "  ", " ".join(REF)) is None


def test_without_a_reference_a_dropped_sentence_is_found_by_length_and_the_others_keep_their_partners():
    src = ["The committee met on Monday.", "It adopted a new budget for the coming year.", "The meeting ended."]
    mt = ["Der Ausschuss tagte am Montag.", "Er beschloss einen neuen Haushalt für das kommende Jahr.", "Die Sitzung endete."]
    assert align_by_length(src, mt) == ([((i,), (i,)) for i in range(3)], [], [])  # the row's own length ratio
    # with the pair's ratio (German runs ~1.2x English in characters) a dropped long sentence is found;
    # the row's own ratio, shrunk by the drop, pairs the long source sentence with the short last one
    assert align_by_length(src, [mt[0], mt[2]], scale=1.2) == ([((0,), (0,)), ((2,), (1,))], [1], [])
    assert align_by_length(src, [mt[0], mt[2]])[1] == [2]
    merged = "Der Ausschuss tagte am Montag und beschloss einen neuen Haushalt für das kommende Jahr."
    assert align_by_length(src, [merged, mt[2]], scale=1.2) == ([((0, 1), (0,)), ((2,), (1,))], [], [])
    found = source_units(" ".join(src), f"{mt[0]} {mt[2]}", scale=1.2)
    assert found.units == ((src[0], mt[0], ""), (src[2], mt[2], "")) and (found.omitted, found.added) == (1, 0)
    frame = pd.DataFrame({"lp": ["en-de", "en-de", "en-de", "zh-en"], "src": ["abcd", "ab cd", "abcdefgh", "甲乙"],
                          "mt": ["abcde", "abcdef", "abcdefghij", "one two three"]})  # fmt: skip
    assert length_scales(frame) == {"en-de": 1.25, "zh-en": 5.5}
    assert source_units(src[0], mt[0]) is None and source_units(" ".join(src), " ") is None
    assert source_units(src[0], f"{mt[0]} {mt[0]}") is None  # one source sentence: judged whole
    with pytest.raises(ValueError, match=r"alignment='target' not supported; choose from \['reference', 'source'\]"):
        row_units(pd.DataFrame({"src": [], "mt": []}), "target")


def test_unit_texts_are_the_distinct_texts_of_every_unit_under_both_alignments():
    frame = pd.DataFrame({"src": [SRC, SRC, "One short line here."], "mt": [" ".join(REF), f"{REF[0]} {REF[2]}", REF[0]],
                          "ref": [" ".join(REF)] * 2 + [REF[0]]})  # fmt: skip
    texts = unit_texts(frame)
    by_reference = set(REF) | {"The committee met on Monday.", "It adopted a new budget.", "The meeting ended at eight."}
    by_source = {text for found in row_units(frame, "source") if found for unit in found.units for text in unit if text}
    assert set(texts) == by_reference | by_source and by_source <= set(unit_texts(frame.drop(columns="ref")))
    assert len(texts) == len(set(texts))


def fake_predict(frame: pd.DataFrame) -> pd.DataFrame:
    """mu = -sqrt(words of mt), sigma = 1: a stand-in network (not additive over sentences)."""
    words = frame["mt"].str.split().str.len().to_numpy(dtype=float)
    return pd.DataFrame({"mu": -np.sqrt(words), "sigma": np.ones(len(frame))})


def test_the_blend_replaces_mu_on_multi_sentence_rows_of_its_language_pairs_only_and_keeps_sigma():
    blend = ParagraphBlend({"en-de": (1.0, 0.5, 2.0, -3.0, -0.25)})
    frame = pd.DataFrame({"src": [SRC, "The committee met on Monday.", SRC], "mt": [f"{REF[0]} {REF[2]}", REF[0], f"{REF[0]} {REF[2]}"],
                          "ref": [" ".join(REF), REF[0], " ".join(REF)], "lp": ["en-de", "en-de", "en-ru"]})  # fmt: skip
    out = blend.apply(fake_predict, frame)
    whole = fake_predict(frame)
    units_sum = -(np.sqrt(len(REF[0].split())) + np.sqrt(len(REF[2].split())))
    assert out.loc[0, "mu"] == pytest.approx(1.0 + 0.5 * whole.loc[0, "mu"] + 2.0 * units_sum - 3.0 * 1)
    assert out.loc[1, "mu"] == whole.loc[1, "mu"]  # one sentence: read whole
    assert out.loc[2, "mu"] == whole.loc[2, "mu"]  # a language pair the blend was not fitted for
    assert out["sigma"].tolist() == [1.0, 1.0, 1.0]
    # without lp the blend of no pair applies
    assert blend.apply(fake_predict, frame.drop(columns="lp"))["mu"].tolist() == whole["mu"].tolist()
    # blended_rows names exactly the rows whose mu apply() changed
    assert blend.blended_rows(frame).tolist() == [True, False, False]
    assert not blend.blended_rows(frame.drop(columns="lp")).any()
    _, inputs = blend_inputs(fake_predict, frame)
    assert inputs.loc[0].tolist() == pytest.approx([whole.loc[0, "mu"], units_sum, 1.0, 0.0])
    assert inputs.loc[1].isna().all()


def test_fit_adopts_a_pairs_blend_where_the_units_add_and_puts_it_on_the_level_of_the_rows_scored_whole():
    rng = np.random.default_rng(0)
    sentences = [f"Sentence number {k} says {' '.join(['many'] * w)} things." for k, w in enumerate(rng.integers(1, 9, 780))]
    lps = ["en-de"] * 140 + ["zh-en"] * 80 + ["en-ru"] * 40
    rows = []
    for i, lp in enumerate(lps):
        ref = sentences[3 * i : 3 * i + 3]
        mt = ref if i % 3 else ref[:2]  # every third row omits its last sentence
        rows.append({"src": " ".join(s.replace("Sentence", "Satz") for s in ref), "mt": " ".join(mt), "ref": " ".join(ref), "lp": lp})
    # en-de single sentences, scored whole: the human score follows their whole-row mu along 1 + 2 mu
    singles = [{"src": s.replace("Sentence", "Satz"), "mt": s, "ref": s, "lp": "en-de"} for s in sentences[:60]]
    frame = pd.DataFrame(rows + singles)
    whole, inputs = blend_inputs(fake_predict, frame)
    single = np.arange(len(frame)) >= len(rows)
    assert inputs["sum"].isna().to_numpy().tolist() == single.tolist()
    truth = np.array([0.3, 0.4, 1.5, -2.0, 0.7])
    human = np.column_stack([np.ones(len(frame)), inputs.fillna(0).to_numpy(dtype=float)]) @ truth + rng.normal(scale=0.01, size=len(frame))
    human[single] = 1.0 + 2.0 * whole["mu"].to_numpy()[single] + rng.normal(scale=0.01, size=single.sum())
    # zh-en: the human score follows the whole-row mu alone; the units add nothing
    zh = frame["lp"].eq("zh-en").to_numpy()
    human[zh] = 0.3 + 0.4 * whole["mu"].to_numpy()[zh] + rng.normal(scale=1.0, size=zh.sum())
    blend, why = fit_blend(fake_predict, frame, human)
    assert why == "adopted for ['en-de']" and list(blend.weights) == ["en-de"]
    level = blend.report["en-de"]["level"]
    assert level["rows"] == "scored whole" and (level["alpha"], level["beta"]) == pytest.approx((1.0, 2.0), abs=0.05)
    # the weights return (human - alpha) / beta; no row adds a sentence, so the last weight is free
    folded = (truth[:4] - np.array([level["alpha"], 0, 0, 0])) / level["beta"]
    assert blend.weights["en-de"][:4] == pytest.approx(folded, abs=0.02)
    assert blend.report["en-de"]["units_p"] < 1e-12 and blend.report["en-de"]["pearson_blend_in_sample"] > 0.99
    assert blend.report["zh-en"]["units_p"] > 1e-3 and "add nothing" in blend.report["zh-en"]["why_whole"]
    assert blend.report["en-ru"] == {"rows": 40, "multi_sentence_rows": 40, "why_whole": f"< {MIN_FIT_ROWS} multi-sentence rows"}
    got = blend.apply(fake_predict, frame)["mu"].to_numpy()
    de = frame["lp"].eq("en-de").to_numpy()
    # one level: blended and whole rows of en-de lie on one line with the human score
    assert 1.0 + 2.0 * got[de] == pytest.approx(human[de], abs=0.1)
    assert (got[~de] == whole["mu"].to_numpy()[~de]).all() and (got[single] == whole["mu"].to_numpy()[single]).all()
    assert fit_blend(fake_predict, frame.drop(columns="lp"), human)[0] is None


def test_the_level_falls_back_to_every_row_and_a_falling_whole_row_mu_keeps_the_pair_whole():
    mu, human = np.arange(80.0), 3.0 + 0.5 * np.arange(80.0)
    few_single = np.arange(80) < MIN_FIT_ROWS - 1
    assert whole_row_level(mu, human, few_single) == pytest.approx((3.0, 0.5, "all"))
    human[:40] = 100.0  # the rows scored whole alone would give another line
    assert whole_row_level(mu, human, np.arange(80) >= 80 - MIN_FIT_ROWS)[2] == "scored whole"
    frame = pd.DataFrame({"src": [SRC] * 60, "mt": [" ".join(REF[: 1 + i % 3]) for i in range(60)], "ref": [" ".join(REF)] * 60, "lp": "en-de"})
    whole, inputs = blend_inputs(fake_predict, frame)
    rng = np.random.default_rng(1)
    falling = -5.0 * whole["mu"].to_numpy() - 4.0 * inputs["omitted"].to_numpy() + rng.normal(scale=0.01, size=60)
    blend, why = fit_blend(fake_predict, frame, falling)
    assert why == "adopted for no language pair" and "does not rise" in blend.report["en-de"]["why_whole"]


def test_the_weights_keep_their_signs_and_a_fit_that_keeps_them_is_the_free_one():
    from uamt.paragraphs import _lstsq

    rng = np.random.default_rng(0)
    units = rng.normal(size=200)
    inputs = pd.DataFrame({"paragraph": units + rng.normal(scale=0.05, size=200), "sum": units,
                           "omitted": rng.integers(0, 2, 200).astype(float), "added": rng.integers(0, 2, 200).astype(float)})  # fmt: skip
    human = 2.0 * units - 1.5 * inputs["paragraph"].to_numpy() - 3.0 * inputs["omitted"].to_numpy() + 0.5 * inputs["added"].to_numpy()
    free = np.linalg.lstsq(np.column_stack([np.ones(200), inputs.to_numpy()]), human, rcond=None)[0]
    assert free[1] < 0 and free[4] > 0  # the free fit weighs the whole row and an addition the wrong way
    held = _lstsq(inputs, human)
    assert held[1] >= 0 and held[2] >= 0 and held[3] <= 0 and held[4] <= 0
    # every weight clearly inside its sign (an exact 0, as an added weight of 0.5 - 0.5 was, could
    # come out of the free fit as +1e-16 and send it to the bounded one)
    signed = human + 1.5 * inputs["paragraph"].to_numpy() + inputs["paragraph"].to_numpy() - 0.75 * inputs["added"].to_numpy()
    np.testing.assert_allclose(_lstsq(inputs, signed), np.linalg.lstsq(np.column_stack([np.ones(200), inputs.to_numpy()]), signed, rcond=None)[0])


def test_the_f_test_of_the_units_matches_its_hand_computed_value():
    inputs = pd.DataFrame({"paragraph": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], "sum": [1.0, 0.0, 2.0, 1.0, 3.0, 2.0, 5.0, 4.0],
                           "omitted": [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0], "added": [0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]})  # fmt: skip
    human = np.array([0.5, -1.0, 2.5, 1.0, 1.5, 3.5, 5.0, 2.0])
    full = np.column_stack([np.ones(8), inputs.to_numpy()])
    rss_full = np.sum((human - full @ np.linalg.lstsq(full, human, rcond=None)[0]) ** 2)
    rss_reduced = np.sum((human - full[:, :2] @ np.linalg.lstsq(full[:, :2], human, rcond=None)[0]) ** 2)
    f_value, p_value = units_f_test(inputs, human)
    assert f_value == pytest.approx(((rss_reduced - rss_full) / 3) / (rss_full / 3))
    from scipy.stats import f as f_distribution

    assert p_value == pytest.approx(f_distribution.sf(f_value, 3, 3)) and 0 < p_value < 1


def test_a_recorded_blend_round_trips_and_a_broken_one_is_named():
    blend = ParagraphBlend({"en-de": (1.0, 0.5, 2.0, -3.0, -0.25)}, 0.2, {"en-de": {"rows": 80}})
    assert ParagraphBlend.from_dict(json.loads(json.dumps(blend.to_dict())), "m") == blend
    source = ParagraphBlend({"en-de": (1.0, 0.5, 2.0, -3.0, -0.25)}, alignment="source", min_length_ratio=0.4)
    assert ParagraphBlend.from_dict(json.loads(json.dumps(source.to_dict())), "m") == source
    old = {k: v for k, v in blend.to_dict().items() if k != "alignment"}  # written before the source alignment
    assert ParagraphBlend.from_dict(old, "m").alignment == "reference"
    with pytest.raises(UamtError, match=r"m: unusable paragraph blend .*alignment='target' not supported"):
        ParagraphBlend.from_dict({**blend.to_dict(), "alignment": "target"}, "m")
    assert ParagraphBlend.from_dict(None, "m") is None
    assert ParagraphBlend.from_dict({"fit": "reference-free"}, "m") is None
    assert ParagraphBlend.from_dict(ParagraphBlend({}).to_dict(), "m") is None  # no pair had the rows
    with pytest.raises(UamtError, match=r"models/x/model.json:paragraphs: unusable paragraph blend .*columns"):
        ParagraphBlend.from_dict({**blend.to_dict(), "columns": ["1", "paragraph"]}, "models/x/model.json:paragraphs")
    with pytest.raises(UamtError, match="paragraph blend of en-de: 5 finite weights"):
        ParagraphBlend({"en-de": (1.0, np.nan, 0.0, 0.0, 0.0)})


def paragraph_table(n: int, seed: int) -> pd.DataFrame:
    """Rows of two or three sentences (a third of them missing one), scored by their length."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        k = 2 + i % 2
        ref = [f"Reference {seed} {i} sentence {j} reads well." for j in range(k)]
        mt = [f"Translation {seed} {i} sentence {j} reads {rng.choice(['well', 'badly'])}." for j in range(k)]
        if i % 3 == 0:
            mt = mt[:-1]
        rows.append({"dataset": "synthetic", "lp": "en-de", "seg_id": i + 1, "system": "s", "src": " ".join(f"Source {seed} {i} sentence {j} is here." for j in range(k)),
                     "mt": " ".join(mt), "ref": " ".join(ref), "score": -2.0 * (i % 3 == 0) - rng.random()})  # fmt: skip
    rows.append({**rows[0], "src": "A single sentence here.", "mt": "Ein einzelner Satz hier.", "ref": "Ein einzelner Satz da."})
    return pd.DataFrame(rows)


CFG = TrainConfig(hidden_sizes=(16, 8), max_epochs=3, batch_size=16, patience=1, paragraph_units=True, row_features=("sentence_ratio_ref",))


@pytest.fixture(scope="module")
def paragraph_models(tmp_path_factory, one_torch_thread):
    root = tmp_path_factory.mktemp("paragraphs")
    train_df, dev_df = paragraph_table(96, 1), paragraph_table(72, 2).assign(split="dev")
    return {
        "hts": train("hts", CFG, train_df, dev_df, FEATURES, root / "hts"),
        "hts_qe": train("hts", CFG.as_reference_free(), train_df.drop(columns="ref"), dev_df.drop(columns="ref"), FEATURES, root / "hts_qe"),
        "whole": train("hts", CFG.replace(paragraph_units=False), train_df, dev_df, FEATURES, root / "whole"),
        "dup": train("dup", CFG, paragraph_table(40, 5), dev_df, FEATURES, root / "dup", base_model_dir=root / "hts"),
    }


def test_a_model_trained_with_paragraph_units_records_its_dev_blend_and_predicts_it(paragraph_models):
    meta = json.loads((paragraph_models["hts"] / MANIFEST).read_text())
    assert meta["paragraphs"]["fit"] == "adopted for ['en-de']" and meta["paragraphs"]["columns"] == list(COLUMNS)
    assert meta["paragraphs"]["dev"]["en-de"]["multi_sentence_rows"] == 72  # every dev row but the single sentence
    assert meta["paragraphs"]["fitted_on"] == ["dev"] and meta["paragraphs"]["dev"]["en-de"]["level"]["rows"] == "all"
    model = load(paragraph_models["hts"])
    test = paragraph_table(30, 3)
    got = model.predict(test, FEATURES)
    want = model.paragraphs.apply(lambda f: model.predict_whole(f, FEATURES), test)
    np.testing.assert_allclose(got["mu"], want["mu"])
    whole = model.predict_whole(test, FEATURES)
    assert (got["mu"].to_numpy()[:-1] != whole["mu"].to_numpy()[:-1]).all()
    assert got["mu"].iloc[-1] == whole["mu"].iloc[-1]  # the single sentence is read whole
    np.testing.assert_allclose(got["sigma"], whole["sigma"])
    table = model.predictions_table(test, FEATURES)
    np.testing.assert_allclose(table["mu"], got["mu"])


def test_dup_serves_its_base_models_blended_mu(paragraph_models):
    base, dup = load(paragraph_models["hts"]), load(paragraph_models["dup"])
    assert dup.paragraphs == base.paragraphs and dup.meta["paragraphs"]["fit"] == "the base model's blend, adopted for ['en-de']"
    test = paragraph_table(30, 3)
    np.testing.assert_allclose(dup.predict(test, FEATURES)["mu"], base.predict(test, FEATURES)["mu"], rtol=1e-6)


def test_a_reference_free_model_aligns_to_the_source_and_never_reads_a_reference(paragraph_models):
    meta = json.loads((paragraph_models["hts_qe"] / MANIFEST).read_text())
    assert meta["paragraphs"]["fit"] == "adopted for ['en-de']" and meta["paragraphs"]["alignment"] == "source"
    model = load(paragraph_models["hts_qe"])
    test = paragraph_table(30, 3).drop(columns="ref")
    got, whole = model.predict(test, FEATURES), model.predict_whole(test, FEATURES)
    assert (got["mu"].to_numpy()[:-1] != whole["mu"].to_numpy()[:-1]).all()
    assert got["mu"].iloc[-1] == whole["mu"].iloc[-1]  # the single sentence is read whole
    assert model.paragraphs.blended_rows(test).tolist() == [True] * 30 + [False]
    with_ref = test.assign(ref="Ein ganz anderer Text. Mit zwei Sätzen.")
    np.testing.assert_allclose(model.predict(with_ref, FEATURES)["mu"], got["mu"])


def test_a_model_with_paragraph_units_switched_off_scores_every_row_whole(paragraph_models):
    assert "paragraphs" not in json.loads((paragraph_models["whole"] / MANIFEST).read_text())
    assert load(paragraph_models["whole"]).paragraphs is None


def test_the_onnx_head_serves_the_same_blend(paragraph_models, tmp_path):
    from uamt.serving.onnx_head import export_head, load_onnx_head

    head = load_onnx_head(export_head(paragraph_models["hts"], tmp_path / "head"), paragraph_models["hts"])
    test = paragraph_table(20, 4)
    want = load(paragraph_models["hts"]).predict(test, FEATURES)
    got = head.predict(test, FEATURES)
    np.testing.assert_allclose(got["mu"], want["mu"], rtol=1e-5, atol=1e-5)
    assert head.paragraphs == load(paragraph_models["hts"]).paragraphs


def test_the_blend_is_fitted_on_the_paragraph_splits_the_model_never_trained_on(tmp_path):
    from uamt.core.errors import DataError
    from uamt.pipeline_config import PipelineConfig, paragraph_rows

    for split, n in (("dev", 4), ("d_e", 6), ("d_q", 8)):
        paragraph_table(n, 0).assign(split=split).to_parquet(tmp_path / f"{split}.parquet")
    pipe = PipelineConfig(datasets=("synthetic",), prepared_dir=str(tmp_path))
    dev_df = pd.read_parquet(tmp_path / "dev.parquet")
    cfg = CFG.replace(paragraph_splits=["dev", "d_e", "d_q"])
    assert paragraph_rows(pipe, cfg, dev_df)["split"].value_counts().to_dict() == {"dev": 5, "d_e": 7}  # d_q trained it
    dup = cfg.replace(train_split="d_e")  # DUP: its error model trained on d_e, its base on d_q
    assert paragraph_rows(pipe, dup, dev_df, trained_on={"d_q"})["split"].unique().tolist() == ["dev"]
    assert paragraph_rows(pipe, cfg.as_reference_free(), dev_df).equals(paragraph_rows(pipe, cfg, dev_df))
    assert paragraph_rows(pipe, cfg.replace(paragraph_units=False), dev_df) is None
    with pytest.raises(DataError, match=r"params.yaml:train_base.paragraph_splits \['d_q'\] leaves no rows"):
        paragraph_rows(pipe, cfg.replace(paragraph_splits=["d_q"]), dev_df)


def test_a_failed_blend_fit_leaves_no_loadable_model(tmp_path, one_torch_thread):
    from uamt.core.errors import DataError, UamtError

    train_df, dev_df = paragraph_table(48, 1), paragraph_table(24, 2).assign(split="dev")
    bad = dev_df.assign(score=dev_df["score"].where(dev_df.index != 3, "n/a"))
    with pytest.raises(DataError, match="paragraph fit rows"):
        train("hts", CFG, train_df, dev_df, FEATURES, tmp_path / "hts", paragraph_df=bad)
    with pytest.raises(UamtError, match="not a trained model"):
        load(tmp_path / "hts")
