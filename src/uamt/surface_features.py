"""Surface features of a translation beside the COMET features: what pooled sentence vectors miss.

Per row (columns of :func:`surface_features`):

``chrf``, ``ter``
    sentence chrF and TER of the translation against its reference (sacrebleu defaults; TER is an
    error rate, higher = worse).  Reference-free rows (no ``ref``) get NaN.
``len_ratio_ref``, ``len_ratio_src``
    log of (characters of mt + 1) / (characters of ref / src + 1): omissions are short,
    duplications and hallucinated additions long.
``copy_rate``
    share of the translation's word tokens that occur verbatim in the source (an untranslated
    copy scores ~1; names and numbers keep it above 0 for good translations).
``target_language_prob``
    the language identifier's probability (:mod:`uamt.core.langid`) that the translation is in the
    language pair's target language (wrong-language output scores ~0).
``number_mismatch_ref``, ``number_mismatch_src``
    share of the numbers of mt and ref / src that the other text does not have (:func:`number_mismatch`):
    0 when they write the same numbers, 1 when they share none.  A wrong number is a critical error
    (MQM, the WMT critical-error categories) that a pooled sentence vector barely registers.
``negation_mismatch_ref``, ``negation_mismatch_src``
    share of the negations of mt and ref / src that the other text does not have
    (:func:`negation_mismatch`, counted by :func:`negations`): a negation dropped or added flips the
    meaning (a WMT critical-error category), which a pooled sentence vector barely registers.
``sentence_ratio_ref``
    log of the number of sentences of mt over that of ref (:func:`sentences`): a paragraph whose
    translation lost or merged sentences (WMT23 en-de test: 15 % of the paragraphs, mean MQM −16.8
    against −5.1, which the champion's mu misses by 11 points on average).  No source-side
    variant: Chinese sources do not separate sentences by white space.

``benchmarks/surface_features.py`` measures what they add to the served mu (a per-LP linear stack
fitted on dev, scored on test).
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pandas as pd

from uamt.core.errors import DataError

FEATURES = (
    "chrf",
    "ter",
    "len_ratio_ref",
    "len_ratio_src",
    "copy_rate",
    "target_language_prob",
    "number_mismatch_ref",
    "number_mismatch_src",
    "negation_mismatch_ref",
    "negation_mismatch_src",
    "sentence_ratio_ref",
)

_WORD = re.compile(r"\w+", re.UNICODE)
# White space after a sentence-final mark, or after one followed by a closing quote or bracket.
_SENTENCE_END = re.compile(r"(?<=[.!?。！？…])\s+|(?<=[.!?。！？…][\"'”“»’)\]])\s+")
#: A piece of fewer words (tokens with a letter or digit) is not a sentence of its own (:func:`sentences`).
MIN_SENTENCE_WORDS = 3
# A full stop after these ends no sentence: a day or ordinal ("am 15. Mai"), an initial, or a title
# or abbreviation that is followed by a capitalised word (English, German and Russian news text).
_NO_SENTENCE_END = re.compile(
    r"(?:\d{1,2}|[^\W\d_]|Dr|Mr|Mrs|Ms|Prof|St|Mt|Jr|Sr|Nr|No|Co|Inc|Ltd|Rep|Sen|Gen|Gov|Jan|Feb|Aug|Sept|Oct|Nov"
    r"|Dec|Chr|bzw|ca|vs|etc|z\.B|u\.a|d\.h|г|гг|т\.е|им)\.$"
)
# A number: digits (any script's decimal digits, e.g. full-width ones in Chinese text) with the
# group or decimal separators between them ("1,250.5", "1.250,5").
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def copy_rate(src: str, mt: str) -> float:
    """Share of ``mt``'s word tokens (``\\w+``, case-folded) that also occur in ``src``; 0 for an
    ``mt`` without words."""
    words = [w.casefold() for w in _WORD.findall(mt)]
    if not words:
        return 0.0
    source = {w.casefold() for w in _WORD.findall(src)}
    return sum(w in source for w in words) / len(words)


#: Texts whose numbers and negation cues a process remembers: a source or reference is shared by
#: every system's translation of it, and the calibrate and evaluate stages featurise the same rows
#: for the model and each of its leave-one-LP-out models (in one HTS calibration's profile the row
#: features took 20 of its 40 s of prediction).  The bound keeps a long-running server's memory in
#: check (an estimate: ~40 MB at the 195 bytes of this data's mean text object, ~150 MB at 1 kB).
REMEMBERED_TEXTS = 1 << 17


def numbers(text: str) -> Counter[str]:
    """The numbers written with digits in ``text``, as a multiset of their digit strings: separators
    dropped and every decimal digit read as ASCII, so "1,250", "1.250" and "１２５０" are one number."""
    return Counter(dict(_numbers(text)))


@functools.lru_cache(maxsize=REMEMBERED_TEXTS)
def _numbers(text: str) -> tuple[tuple[str, int], ...]:
    """:func:`numbers` as an immutable tuple of (digits, count), remembered per text."""
    return tuple(
        Counter(
            "".join(str(unicodedata.digit(c)) for c in match if c.isdigit()) for match in _NUMBER.findall(text)
        ).items()
    )


def number_mismatch(a: str, b: str) -> float:
    """Share of the numbers of ``a`` and ``b`` that the other text does not have.

    With ``A``, ``B`` the multisets of :func:`numbers`: ``|A - B| + |B - A|`` over ``|A| + |B|``, in
    [0, 1]; 0 when neither writes a number.  One changed number among ``k`` shared ones gives ``1/k``.
    """
    a_numbers, b_numbers = numbers(a), numbers(b)
    total = sum(a_numbers.values()) + sum(b_numbers.values())
    if total == 0:
        return 0.0
    return (sum((a_numbers - b_numbers).values()) + sum((b_numbers - a_numbers).values())) / total


# Negation cues per language, as whole words (case-folded).  Words that are a cue in one language
# and a common word in another of this data are left out ("mai": Italian "never", German "May";
# Italian "ne": "of it"); "n't" is counted apart.  Text in another language counts no cue.
NEGATION_WORDS: dict[str, frozenset[str]] = {
    lang: frozenset(words.split())
    for lang, words in {
        "en": "not no never nobody nothing none neither nor nowhere cannot",
        "de": "nicht kein keine keinen keinem keiner keines nie niemals niemand nichts nirgends nirgendwo weder",
        "ru": "не нет ни никогда никто ничего ничто нигде никак нельзя",
        "es": "no nunca nada nadie ni tampoco ningún ninguna ninguno jamás",
        "pt": "não nunca nada ninguém nenhum nenhuma nem jamais",
        "it": "non nessuno nessuna niente nulla né",
        "fr": "ne n jamais rien aucun aucune ni",
        "cs": "ne nikdy nic nikdo žádný žádná žádné není nejsou nebyl nebyla nebylo",
    }.items()
}
_NEGATION_WORD = frozenset().union(*NEGATION_WORDS.values())
_CONTRACTED_NOT = re.compile(r"n[’']t\b")
# Hebrew: a negation word after the prefixes "and", "that", "when".
_HEBREW_NEGATION = re.compile(r"(?:ו|ש|וש|כש|וכש)?(?:לא|אין|אינו|אינה|אינם|אינן|בלי|ללא)")
# Chinese writes no spaces: negating characters, after removing words in which they do not negate
# ("非常" very, "不同" different, "未来" future, "莫斯科" Moscow, "特别" special, ...).
_CHINESE_NEGATION = re.compile(r"[不没沒未无無别別非勿莫]")
_CHINESE_NOT_NEGATING = re.compile(
    "非常|非洲|不过|不過|不同|不断|不斷|不仅|不僅|不管|不少|不久|不得不|无论|無論|未来|未來|莫斯科|别人|別人|特别|特別"
    "|区别|區別|分别|分別|差别|差別|级别|級別|类别|類別|识别|識別|个别|個別|告别|告別"
)


@functools.lru_cache(maxsize=REMEMBERED_TEXTS)
def negations(text: str) -> int:
    """Number of negation cues in ``text``: the words of :data:`NEGATION_WORDS` (any of its
    languages), English "n't", Hebrew negation words and Chinese negating characters."""
    folded = str(text).casefold()
    count = len(_CONTRACTED_NOT.findall(folded))
    for word in _WORD.findall(folded):
        count += word in _NEGATION_WORD or _HEBREW_NEGATION.fullmatch(word) is not None
    return count + len(_CHINESE_NEGATION.findall(_CHINESE_NOT_NEGATING.sub("", folded)))


def negation_mismatch(a: str, b: str) -> float:
    """``|n(a) - n(b)| / (n(a) + n(b))`` with ``n`` = :func:`negations`, in [0, 1]; 0 when neither
    has a negation, 1 when only one has (a negation added or dropped)."""
    a_count, b_count = negations(a), negations(b)
    total = a_count + b_count
    return abs(a_count - b_count) / total if total else 0.0


def _words(text: str) -> int:
    return sum(any(c.isalnum() for c in token) for token in text.split())


def sentences(text: str) -> list[str]:
    """The sentences of ``text``: split after ``. ! ? 。 ！ ？ …`` (and a closing quote or bracket)
    and white space, except where what follows starts with a lower-case letter or the full stop
    ends a day, an initial or a title (:data:`_NO_SENTENCE_END`); a piece of fewer than
    :data:`MIN_SENTENCE_WORDS` words is joined to the next one (to the one before at the end).

    Split on the mark alone, 13 % of the pieces of d_q's multi-sentence translations had < 3 words
    (801 a lone ".", then "Prof.", "Am 12.", "1.", "U.S."), so dropping "one sentence" often
    dropped a title or a full stop.
    """
    merged: list[str] = []
    pending = ""  # a piece that does not stand alone, waiting for the next
    for piece in _SENTENCE_END.split(str(text).strip()):
        if not piece:
            continue
        piece = f"{pending} {piece}" if pending else piece
        pending = ""
        letter = next((c for c in piece if c.isalpha()), "")
        if merged and letter.islower():
            merged[-1] = f"{merged[-1]} {piece}"
        elif _words(piece) < MIN_SENTENCE_WORDS or _NO_SENTENCE_END.fullmatch(piece.split()[-1].lstrip("\"'(„“«‘")):
            pending = piece
        else:
            merged.append(piece)
    if pending:
        if merged:
            merged[-1] = f"{merged[-1]} {pending}"
        else:
            merged.append(pending)
    return merged


def sentence_ratio(a: str, b: str) -> float:
    """``log(n(a) / n(b))`` with ``n`` the number of :func:`sentences` (at least 1): 0 for as many
    sentences, ``log(2/3)`` for a translation of 2 sentences against a reference of 3."""
    return math.log(max(1, len(sentences(a))) / max(1, len(sentences(b))))


def length_ratio(a: str, b: str) -> float:
    """``log((len(a) + 1) / (len(b) + 1))`` in characters: 0 for equal lengths, symmetric in sign."""
    return math.log((len(a) + 1) / (len(b) + 1))


def target_language_probability(mt: Sequence[str], lp: Sequence[str]) -> np.ndarray:
    """Per row, the language identifier's probability that ``mt[i]`` is in the target of ``lp[i]``."""
    from uamt.core.langid import canonical_code, detect_row_languages

    rows = detect_row_languages(list(mt))
    out = np.empty(len(rows))
    for i, (row, pair) in enumerate(zip(rows, lp, strict=True)):
        parts = pair.split("-") if isinstance(pair, str) else []
        if len(parts) != 2 or not all(parts):
            raise DataError(f"row {i}: lp={pair!r} is not a language pair 'xx-yy'; the target language probability needs it")
        out[i] = row.probability(canonical_code(parts[1]))
    return out


#: Features that compare mt with one other text, row by row: name -> (measure(mt, other), "ref" | "src").
_MT_AGAINST = {
    "len_ratio_ref": (length_ratio, "ref"),
    "len_ratio_src": (length_ratio, "src"),
    "number_mismatch_ref": (number_mismatch, "ref"),
    "number_mismatch_src": (number_mismatch, "src"),
    "negation_mismatch_ref": (negation_mismatch, "ref"),
    "negation_mismatch_src": (negation_mismatch, "src"),
    "sentence_ratio_ref": (sentence_ratio, "ref"),
}

#: Features read off the reference (NaN for a reference-free row).
NEEDS_REFERENCE = frozenset(
    {"chrf", "ter", "len_ratio_ref", "number_mismatch_ref", "negation_mismatch_ref", "sentence_ratio_ref"}
)


def check_feature_names(names: Sequence[str], what: str = "feature") -> tuple[str, ...]:
    """``names`` as a tuple, or ValueError naming the first unknown or repeated one and the choices."""
    from uamt.core.config import check_names

    return check_names(names, FEATURES, what)


def surface_features(frame: pd.DataFrame, with_ter: bool = True, names: Sequence[str] | None = None) -> pd.DataFrame:
    """The :data:`FEATURES` of every row of ``frame`` (columns ``src``, ``mt``, optional ``ref``, and
    ``lp`` for ``target_language_prob``), in its order; raises :class:`DataError` naming a missing
    column.

    ``names``: compute only these (in this order; default every feature), e.g. to skip the language
    identifier or TER where they are not read.  ``with_ter=False`` leaves ``ter`` NaN: sacrebleu's
    TER is pure Python and its shift search grows quickly with length (WMT23's paragraphs: seconds
    per row on a busy CPU), so the other features can be had without it."""
    from uamt.lexical import segment_scores

    names = FEATURES if names is None else check_feature_names(names)
    needed = ("src", "mt", "lp") if "target_language_prob" in names else ("src", "mt")
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise DataError(f"surface features: column(s) {missing} missing; have {sorted(frame.columns)}")
    src = frame["src"].astype(str).tolist()
    mt = frame["mt"].astype(str).tolist()
    has_ref = "ref" in frame.columns and frame["ref"].notna().all()
    ref = frame["ref"].astype(str).tolist() if has_ref else None
    out = pd.DataFrame(index=frame.index)
    for name in names:
        if name in NEEDS_REFERENCE and ref is None:
            out[name] = np.nan
        elif name == "chrf":
            out[name] = segment_scores(mt, ref, "chrf")
        elif name == "ter":
            out[name] = np.minimum(segment_scores(mt, ref, "ter"), 200.0) if with_ter else np.nan  # unbounded above
        elif name in _MT_AGAINST:
            measure, side = _MT_AGAINST[name]
            out[name] = [measure(m, other) for m, other in zip(mt, ref if side == "ref" else src, strict=True)]
        elif name == "copy_rate":
            out[name] = [copy_rate(s, m) for s, m in zip(src, mt, strict=True)]
        else:  # target_language_prob
            out[name] = target_language_probability(mt, frame["lp"].tolist())
    return out


__all__ = [
    "FEATURES",
    "NEEDS_REFERENCE",
    "check_feature_names",
    "copy_rate",
    "length_ratio",
    "MIN_SENTENCE_WORDS",
    "NEGATION_WORDS",
    "negation_mismatch",
    "negations",
    "number_mismatch",
    "numbers",
    "sentence_ratio",
    "sentences",
    "surface_features",
    "target_language_probability",
]
