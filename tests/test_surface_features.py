"""Surface features beside the COMET features (uamt.surface_features)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from uamt.challenge import PERTURBATIONS
from uamt.core.errors import DataError
from uamt.surface_features import (
    FEATURES,
    NEEDS_REFERENCE,
    copy_rate,
    length_ratio,
    negation_mismatch,
    negations,
    number_mismatch,
    numbers,
    sentence_ratio,
    sentences,
    surface_features,
)


@pytest.mark.parametrize(
    ("src", "mt", "expected"),
    [
        ("The cat sat.", "The cat sat.", 1.0),  # untranslated copy
        ("The cat sat.", "Die Katze saß.", 0.0),
        ("Biden met Xi in 2021.", "Biden traf Xi 2021.", 0.75),  # names and numbers carry over
        ("anything", "...", 0.0),  # no words
    ],
)
def test_copy_rate(src, mt, expected):
    assert copy_rate(src, mt) == pytest.approx(expected)


def test_length_ratio_is_a_signed_log():
    assert length_ratio("abc", "abc") == 0.0
    assert length_ratio("a" * 9, "") == pytest.approx(math.log(10))
    assert length_ratio("", "a" * 9) == pytest.approx(-math.log(10))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a title, a day, an initial, a list number and a full stop alone end no sentence
        ("Mr. Oldman hat viele Figuren gespielt. Es ist schwer zu sagen.", ["Mr. Oldman hat viele Figuren gespielt.", "Es ist schwer zu sagen."]),
        ("Knowsley wurde am 15. Mai gegründet. Es ist sehr schön dort.", ["Knowsley wurde am 15. Mai gegründet.", "Es ist sehr schön dort."]),
        ("Er sprach mit J. Smith darüber. Dann ging er heim.", ["Er sprach mit J. Smith darüber.", "Dann ging er heim."]),
        ("1. Einleitung des Berichts. 2. Methoden der Studie.", ["1. Einleitung des Berichts.", "2. Methoden der Studie."]),
        ("Wir werden sehen, dass sie aufstocken werden. .", ["Wir werden sehen, dass sie aufstocken werden. ."]),
        # lower case after the mark: the sentence goes on
        ("Wenn er sterben würde... wären die Folgen erheblich. Das ist klar so.", ["Wenn er sterben würde... wären die Folgen erheblich.", "Das ist klar so."]),
        # a closing quote after the mark, Cyrillic capitals, a year
        ("„Wir gehen jetzt nach Hause.“ Sie sagte: „Nein, noch nicht.“", ["„Wir gehen jetzt nach Hause.“", "Sie sagte: „Nein, noch nicht.“"]),
        ("Он пришёл домой поздно. Мы ждали его весь вечер.", ["Он пришёл домой поздно.", "Мы ждали его весь вечер."]),
        ("The price rose in 1989. The next year it fell.", ["The price rose in 1989.", "The next year it fell."]),
        # pieces of < 3 words join the next one, or the one before at the end
        ("Warum? Weil es regnet und kalt ist.", ["Warum? Weil es regnet und kalt ist."]),
        ("Er kam nach Hause. Sie ging.", ["Er kam nach Hause. Sie ging."]),
        ("Ja.", ["Ja."]),
        ("", []),
    ],
)
def test_sentences(text, expected):
    assert sentences(text) == expected


def test_sentence_ratio_is_a_signed_log_of_sentence_counts():
    two, three = "Er kam nach Hause. Sie ging dann weg.", "Er kam nach Hause. Sie ging dann weg. Es war spät am Abend."
    assert sentence_ratio(two, two) == 0.0
    assert sentence_ratio(two, three) == pytest.approx(math.log(2 / 3))
    assert sentence_ratio(three, two) == pytest.approx(math.log(3 / 2))
    assert sentence_ratio("", three) == pytest.approx(math.log(1 / 3))  # an empty text counts as one
    # a title or a date is no sentence: the same count
    assert sentence_ratio("Prof. Dr. Müller kam am 12. Juli an. Er blieb lange dort.", "Müller kam an. Er blieb lange.") == 0.0


def test_a_dropped_sentence_lowers_the_sentence_ratio():
    row = pd.DataFrame({"src": ["x"], "mt": ["Er kam nach Hause. Sie ging dann weg. Es war spät am Abend."], "ref": ["Er kam heim. Sie ging weg. Es war spät."], "lp": ["en-de"]})
    original = surface_features(row, names=["sentence_ratio_ref"])["sentence_ratio_ref"].item()
    dropped = surface_features(row.assign(mt=["Er kam nach Hause. Es war spät am Abend."]), names=["sentence_ratio_ref"])
    assert original == 0.0 and dropped["sentence_ratio_ref"].item() == pytest.approx(math.log(2 / 3))


def test_numbers_read_separators_and_any_scripts_digits_alike():
    assert numbers("In 2019, 1,250 people (１２ of them 3.5 %)") == {"2019": 1, "1250": 1, "12": 1, "35": 1}
    assert numbers("1.250 und 1,250") == {"1250": 2}
    assert numbers("no numbers here") == {}
    counted = numbers("1.250 und 1,250")
    counted["1250"] -= 2  # each call returns its own multiset, though the text's is remembered
    assert numbers("1.250 und 1,250") == {"1250": 2}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("Sales rose 12 % to 7 million.", "Der Umsatz stieg um 12 % auf 7 Millionen.", 0.0),
        ("Sales rose 12 % to 8 million.", "Der Umsatz stieg um 12 % auf 7 Millionen.", 0.5),  # {8}, {7} of 4
        ("Sales rose 12 %.", "Der Umsatz stieg um 12 % auf 7 Millionen.", 1 / 3),  # 7 omitted: 1 of 3
        ("It rained.", "Es regnete.", 0.0),  # no numbers: nothing to disagree on
        ("2 2 2", "2", 0.5),  # multisets: two extra 2s of 4
        ("In 2020.", "Im Jahr 2021.", 1.0),
    ],
)
def test_number_mismatch_hand_computed(a, b, expected):
    assert number_mismatch(a, b) == pytest.approx(expected)
    assert number_mismatch(b, a) == pytest.approx(expected)  # symmetric


def test_a_changed_number_raises_the_mismatch_with_the_reference():
    rows = pd.DataFrame(
        {
            "src": ["Er kaufte 3 Äpfel für 12 Euro.", "Am 4. Mai kamen 250 Gäste."],
            "mt": ["He bought 3 apples for 12 euros.", "On 4 May, 250 guests came."],
            "ref": ["He bought 3 apples for 12 euros.", "250 guests arrived on 4 May."],
            "lp": ["de-en", "de-en"],
        }
    )
    rng = np.random.default_rng(0)
    changed = rows.assign(mt=[PERTURBATIONS["number"](row, None, rng) for _, row in rows.iterrows()])
    names = ["number_mismatch_ref", "number_mismatch_src"]
    before, after = surface_features(rows, names=names), surface_features(changed, names=names)
    assert (after.to_numpy() > before.to_numpy()).all()
    assert before["number_mismatch_src"].tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("He is not here and never was.", 2),
        ("He doesn't know; she can’t say.", 2),  # "n't" with either apostrophe
        ("Nobody knows nothing.", 2),
        ("Er ist nicht da, kein Problem.", 2),
        ("Im Mai kam niemand.", 1),  # "Mai" (May) is no cue, although Italian "mai" is "never"
        ("Он не знает, и нет ответа.", 2),
        ("No sabe nada.", 2),
        ("Il n'a rien dit.", 2),  # French "ne ... rien": elided n' and rien
        ("הוא לא יודע ושלא אכפת לו", 2),  # Hebrew, with the prefix "and that"
        ("他不知道，非常好。", 1),  # 不 negates; 非常 ("very") does not
        ("我们的未来没有问题，特别是在莫斯科。", 1),  # 没; not 未来 (future), 特别, 莫斯科 (Moscow)
        ("The cat sat on the mat.", 0),
        ("", 0),
    ],
)
def test_negations_hand_counted(text, expected):
    assert negations(text) == expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("He is here.", "He is not here.", 1.0),  # a negation dropped
        ("He is not here.", "He isn't here.", 0.0),  # the same negation, written otherwise
        ("He is not here, not now.", "He is not here.", 1 / 3),
        ("It rained.", "Es regnete.", 0.0),  # no negation: nothing to disagree on
        ("Er kommt nicht.", "He is not coming.", 0.0),  # across languages
        ("他没有来。", "He came.", 1.0),
    ],
)
def test_negation_mismatch_hand_computed(a, b, expected):
    assert negation_mismatch(a, b) == pytest.approx(expected)
    assert negation_mismatch(b, a) == pytest.approx(expected)  # symmetric


def test_a_negation_flip_raises_the_mismatch_with_the_reference():
    rows = pd.DataFrame(
        {
            "src": ["He will come tomorrow.", "The plan is not new.", "Он не может прийти."],
            "mt": ["Er wird morgen kommen.", "The plan is not new.", "He cannot come."],
            "ref": ["Er kommt morgen.", "The plan is not a new one.", "He can't come."],
            "lp": ["en-de", "de-en", "ru-en"],
        }
    )
    flipped = rows.assign(mt=[PERTURBATIONS["negation"](row, None, None) for _, row in rows.iterrows()])
    assert flipped["mt"].tolist() == ["Er wird nicht morgen kommen.", "The plan is new.", "He can come."]
    before = surface_features(rows, names=["negation_mismatch_ref"])["negation_mismatch_ref"]
    after = surface_features(flipped, names=["negation_mismatch_ref"])["negation_mismatch_ref"]
    assert before.tolist() == [0.0, 0.0, 0.0] and after.tolist() == [1.0, 1.0, 1.0]


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "src": ["The cat is on the mat.", "他没有来。", "The house is big and old."],
            "mt": ["Die Katze ist auf der Matte.", "他没有来。", "Дом большой и старый."],
            "ref": ["Die Katze sitzt auf der Matte.", "He did not come.", "Das Haus ist groß und alt."],
            "lp": ["en-de", "zh-en", "en-de"],
        }
    )


def test_surface_features_flag_copies_and_wrong_languages():
    out = surface_features(_frame())
    assert list(out.columns) == list(FEATURES)
    good, copied, russian = out.to_dict("records")
    assert good["chrf"] > 50 and good["ter"] < 50 and good["target_language_prob"] > 0.9
    assert copied["copy_rate"] == 1.0 and copied["chrf"] == 0.0 and copied["target_language_prob"] < 0.1
    assert russian["target_language_prob"] < 0.1  # en-de translated into Russian
    assert good["copy_rate"] == 0.0


def test_without_reference_or_ter_the_reference_columns_are_nan():
    out = surface_features(_frame().drop(columns=["ref"]))
    assert out[sorted(NEEDS_REFERENCE)].isna().all().all()
    read_without_reference = [name for name in FEATURES if name not in NEEDS_REFERENCE]
    assert np.isfinite(out[read_without_reference].to_numpy()).all()
    no_ter = surface_features(_frame(), with_ter=False)
    assert no_ter["ter"].isna().all() and no_ter["chrf"].notna().all()


def test_missing_column_is_named():
    with pytest.raises(DataError, match=r"column\(s\) \['lp'\] missing"):
        surface_features(_frame().drop(columns=["lp"]))


def test_only_the_language_feature_needs_the_language_pair():
    out = surface_features(_frame().drop(columns=["lp"]), names=["copy_rate", "len_ratio_src"])
    assert list(out.columns) == ["copy_rate", "len_ratio_src"]
    with pytest.raises(ValueError, match=r"feature='bleu' not supported; choose from"):
        surface_features(_frame(), names=["bleu"])
