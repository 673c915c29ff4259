"""Offline language identification of sources and translations (``uamt score`` without ``--lp``,
and the check of a given ``--lp`` against the text).

The model ships inside the ``py3langid`` wheel (no download), so detection works offline.  Every
non-empty line is classified on its own (:func:`detect_row_languages`): its most probable language
and that probability.  A line's language is *confident* only when the probability is at least
:data:`MIN_CONFIDENCE` and no script check says the detector cannot tell it from another language:

* Han characters without kana: the detector calls kanji-only Japanese Chinese.  Such a line is
  Chinese only when it holds a character that Japanese does not use (outside JIS X 0208) and every
  character is a simplified one (GB 2312); otherwise it may be Japanese (or traditional Chinese).
* Hebrew script: the detector knows no Yiddish and calls it Hebrew (or ancient Hebrew).  A line
  with Yiddish spelling marks (pasekh/komets alef, rafe, the Yiddish ligatures) or a Yiddish
  function word may be Yiddish.

When a fifth or more of the lines detected as one language carry such a doubt, every line of that
language is doubted (a Yiddish file whose unmarked lines look like Hebrew is still Yiddish).

:func:`resolve_languages` turns the lines of one file (or one batch partition: a segment group)
into one language per line: confident lines keep theirs; the others take the group's dominant
language when at least :data:`GROUP_SHARE` of the group plausibly is in it (:data:`MIN_PLAUSIBLE`) and the detector gives
it at least :data:`MIN_GROUP_PROBABILITY` on them (or the script check doubts exactly between the two); every other line is undetermined (None).  Callers score undetermined lines as
an unseen language pair (:mod:`uamt.serving.language_pair`).

Chinese varieties the detector separates on ordinary Mandarin news (``wuu``, ``yue``: 6.6% of the
newstest2021 Chinese lines) are folded into ``zh``.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: Lines classified per file by :func:`detect_language` (the file-level summary).
DEFAULT_SAMPLE = 200
#: A line's language is trusted from this probability up (py3langid's length-normalised softmax).
#: On 1,000 newstest2021 lines each of de, en, zh, ja, ru, cs, is, ha and WMT23 he, no wrong label
#: reached 0.8.
MIN_CONFIDENCE = 0.8
#: A line that is not confident takes its group's dominant language only if it gives that language
#: at least this probability.
MIN_GROUP_PROBABILITY = 0.05
#: Below this top probability the detector has nothing to go on (".", "GB 18030-2022", a short
#: title: near-uniform over 140 languages): such a line takes its group's dominant language.
NO_SIGNAL = 0.1
#: Candidates kept per line.
TOP_K = 5
#: Share of a group's non-empty lines whose best guess must be one language, at a probability of
#: at least :data:`MIN_PLAUSIBLE` and without a script doubt, before it is the group's dominant
#: language (which its less certain lines may take; a file-level summary calls it clear).
GROUP_SHARE = 0.8
#: See :data:`GROUP_SHARE` ("Sentence number 3 is short." is English at 0.67).
MIN_PLAUSIBLE = 0.5
#: Share of the lines detected as one language that carry a script doubt before all are doubted.
DOUBT_SHARE = 0.2
#: Labels folded into the language the training data calls them.
FOLDED = {"wuu": "zh", "yue": "zh"}
#: Codes users write for a language the detector labels otherwise (``--lp`` is compared after this).
ALIASES = {"nb": "no", "cmn": "zh", "zho": "zh", "chi": "zh", "iw": "he", "heb": "he", "jpn": "ja"}

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HEBREW_LETTERS = re.compile(r"[\u05d0-\u05ea\u05f0-\u05f2]+")
# Yiddish spelling: pasekh/komets alef, rafe, the ligatures tsvey vovn / vov yud / tsvey yudn.
_YIDDISH_MARKS = re.compile(r"\u05d0[\u05b7\u05b8]|\u05bf|[\u05f0-\u05f2\ufb1f\ufb2e\ufb2f]")
#: Yiddish function words (written without points) that never occur as words in 1,910 lines of
#: WMT23 Modern Hebrew news; words Hebrew shares (אין, איך, אז, די, צו) are left out.
_YIDDISH_WORDS = frozenset(
    "דער דאס און מיט פון נישט ניט זיך האט געווען וואס אויף אויך ווען מען זיי אונדז נאך שוין "
    "וועט וועלן האבן קיין גאר דעם דיר מיך אבער ער זיין ביי מיר זי ווי היינט זייער".split()
)


def _encodable(char: str, encoding: str) -> bool:
    try:
        char.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True


def _han_doubt(text: str) -> str | None:
    """``"ja/zh"`` when ``text`` is Han without kana that could be Japanese or Chinese, else None."""
    han = _HAN.findall(text)
    if not han or _KANA.search(text):
        return None
    simplified_only = any(not _encodable(c, "shift_jis") for c in han)
    all_simplified = all(_encodable(c, "gb2312") for c in han)
    return None if simplified_only and all_simplified else "ja/zh"


def _looks_yiddish(text: str) -> bool:
    if _YIDDISH_MARKS.search(text):
        return True
    bare = "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))
    return any(word in _YIDDISH_WORDS for word in _HEBREW_LETTERS.findall(bare))


def _doubt(text: str, code: str) -> str | None:
    """The language ``text`` (detected as ``code``) cannot be told from, by its script; else None."""
    if code in ("zh", "ja") and _han_doubt(text):
        return "ja" if code == "zh" else "zh"
    if code in ("he", "hbo") and _looks_yiddish(text):
        return "yi"
    return None


@dataclass(frozen=True)
class RowLanguage:
    """The language of one line: best ``code`` (None: blank line), its probability, and the language
    a script check says it cannot be told from (``doubt``, e.g. ``"ja"`` for kanji-only text)."""

    code: str | None
    confidence: float
    doubt: str | None = None
    candidates: tuple[tuple[str, float], ...] = ()

    @property
    def confident(self) -> bool:
        return self.code is not None and self.doubt is None and self.confidence >= MIN_CONFIDENCE

    def probability(self, code: str) -> float:
        """The detector's probability of ``code`` (0 when not among the :data:`TOP_K` candidates)."""
        return next((p for c, p in self.candidates if c == code), 0.0)

    def compatible(self, code: str) -> bool:
        """Whether this line may be in ``code``: the language it is doubted with, one the detector
        gives at least :data:`MIN_GROUP_PROBABILITY`, or any when it has no signal (:data:`NO_SIGNAL`)."""
        if self.doubt is not None:
            return code in (self.code, self.doubt)
        return self.confidence < NO_SIGNAL or self.probability(code) >= MIN_GROUP_PROBABILITY


@lru_cache(maxsize=1)
def _identifier():
    # Lazy: loads the model (~0.5 s) only when detection is asked for.  Normalised probabilities
    # (the module-level ``py3langid.classify`` returns unnormalised log scores).
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def _classify(text: str) -> RowLanguage:
    identifier = _identifier()
    # ``_decide`` (py3langid 0.4.0, pinned) is ``rank`` without sorting all 140 labels per line:
    # ~3x faster on the classification of a batch.
    scores = identifier._decide(text)
    top = np.argpartition(scores, -2 * TOP_K)[-2 * TOP_K :]
    folded: dict[str, float] = {}
    for index in top:
        code = FOLDED.get(identifier.nb_classes[index], identifier.nb_classes[index])
        folded[code] = folded.get(code, 0.0) + float(scores[index])
    candidates = sorted(folded.items(), key=lambda item: -item[1])[:TOP_K]
    code, confidence = candidates[0]
    return RowLanguage(code, confidence, _doubt(text, code), tuple(candidates))


def detect_row_languages(texts: Sequence[str]) -> list[RowLanguage]:
    """The language of every line of ``texts`` (shape [n]); blank or non-text lines get code None.

    Repeated lines are classified once (~0.1-0.6 ms per distinct line).
    """
    seen: dict[str, RowLanguage] = {}
    out = []
    for text in texts:
        if not isinstance(text, str) or not text.strip():
            out.append(RowLanguage(None, 0.0))
            continue
        if text not in seen:
            seen[text] = _classify(text)
        out.append(seen[text])
    doubted = Counter(r.code for r in seen.values() if r.doubt is not None)
    detected = Counter(r.code for r in seen.values() if r.code is not None)
    spread = {
        code: next(r.doubt for r in seen.values() if r.code == code and r.doubt)
        for code, n in doubted.items()
        if n >= DOUBT_SHARE * detected[code]
    }
    if spread:
        out = [
            RowLanguage(r.code, r.confidence, spread[r.code], r.candidates) if r.code in spread else r
            for r in out
        ]
    return out


def _plausible(row: RowLanguage) -> bool:
    return row.code is not None and row.doubt is None and row.confidence >= MIN_PLAUSIBLE


def _dominant(present: Sequence[RowLanguage]) -> str | None:
    """The language of at least :data:`GROUP_SHARE` of ``present`` lines (:func:`_plausible`), or None."""
    plausible = Counter(r.code for r in present if _plausible(r))
    if plausible:
        code, hits = plausible.most_common(1)[0]
        if hits >= GROUP_SHARE * len(present):
            return code
    return None


def resolve_languages(rows: Sequence[RowLanguage]) -> list[str | None]:
    """One language per line of a group (see the module docstring); None: undetermined."""
    present = [r for r in rows if r.code is not None]
    dominant = _dominant(present)
    out: list[str | None] = []
    for r in rows:
        if r.confident:
            out.append(r.code)
        elif dominant is not None and r.code is not None and r.compatible(dominant):
            out.append(dominant)
        else:
            out.append(None)
    return out


def canonical_code(code: str) -> str:
    """A user's language code as the detector writes it (``nb`` -> ``no``, ``zho`` -> ``zh``)."""
    return ALIASES.get(code, FOLDED.get(code, code))


@dataclass(frozen=True)
class DetectedLanguage:
    """Language of a file: ``code`` most lines are plausibly in (no script doubt, probability >=
    :data:`MIN_PLAUSIBLE`), the ``share`` of non-empty lines plausibly in it, over ``n_lines`` lines."""

    code: str
    share: float
    n_lines: int

    @property
    def clear(self) -> bool:
        return self.share >= GROUP_SHARE


@dataclass(frozen=True)
class DetectedPair:
    source: DetectedLanguage
    target: DetectedLanguage

    @property
    def lp(self) -> str | None:
        """``xx-yy`` when both sides have a clear majority, else None."""
        if self.source.clear and self.target.clear:
            return f"{self.source.code}-{self.target.code}"
        return None

    def describe(self) -> str:
        side = [
            f"{d.code} ({d.share:.0%} of {d.n_lines} lines)" for d in (self.source, self.target)
        ]
        return f"source {side[0]}, translation {side[1]}"


def summarise_languages(rows: Sequence[RowLanguage]) -> DetectedLanguage:
    """:class:`DetectedLanguage` of already classified lines.

    Raises ``ValueError`` when there is no non-empty line.
    """
    present = [r for r in rows if r.code is not None]
    if not present:
        raise ValueError("no non-empty line to detect the language of")
    plausible = Counter(r.code for r in present if _plausible(r))
    if plausible:
        code, hits = plausible.most_common(1)[0]
    else:  # nothing plausible: name the best guess, with share 0
        code, hits = Counter(r.code for r in present).most_common(1)[0][0], 0
    return DetectedLanguage(code=code, share=hits / len(present), n_lines=len(present))


def _evenly_spaced(texts: Sequence[str], sample: int) -> list[str]:
    lines = [t for t in texts if isinstance(t, str) and t.strip()]
    if len(lines) <= sample:
        return lines
    step = len(lines) / sample
    return [lines[int(i * step)] for i in range(sample)]


def detect_language(texts: Sequence[str], sample: int = DEFAULT_SAMPLE) -> DetectedLanguage:
    """Language of ``texts`` (shape [n]) over up to ``sample`` evenly spaced non-empty lines: the
    language most lines are confidently in, and their share.

    Raises ``ValueError`` when there is no non-empty line to classify.
    """
    if sample < 1:
        raise ValueError(f"sample={sample!r} must be >= 1")
    return summarise_languages(detect_row_languages(_evenly_spaced(texts, sample)))


def detect_pair(src: Sequence[str], mt: Sequence[str], sample: int = DEFAULT_SAMPLE) -> DetectedPair:
    """Detected source and translation languages of aligned files (see :func:`detect_language`)."""
    return DetectedPair(detect_language(src, sample), detect_language(mt, sample))
