"""Which language pair's calibration scores each row, and what to tell the user about it.

``uamt score`` and the REST server pass the LP the user gave; without one, the pair is detected
offline from the texts, row by row (:mod:`uamt.core.langid`).  An LP the model has no calibration for
(one absent from its training data) is scored with the global calibration widened by the model's
``unseen_lp_sigma_factor``, and the user is told so: on stderr, in the summary and in REST responses.

Rows are never given a calibration the text does not support:

* a row whose language could not be determined confidently (a language the detector does not know,
  such as Yiddish; kanji-only Japanese; a line too short to tell) is calibrated as
  :data:`UNDETERMINED_LP`, which no model knows: the unseen-LP widening applies;
* with ``--lp`` given, a row whose detected source (or translation) language is confidently another
  one contradicts it: it is calibrated as :data:`UNDETERMINED_LP` too (neither the given pair's nor
  the detected pair's calibration can be trusted), and a warning names both;
* rows of different detected pairs keep their own pair (a file or partition may mix pairs).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from uamt.core.langid import (
    DetectedPair,
    canonical_code,
    detect_row_languages,
    resolve_languages,
    summarise_languages,
)

#: How the language pair was decided.
GIVEN, DETECTED, UNDETERMINED = "given", "detected", "undetermined"
#: The calibration LP of a row whose pair is undetermined or contradicts ``--lp`` (ISO 639-2 "und",
#: undetermined): never a known LP, so the row gets the global calibration widened as unseen.
UNDETERMINED_LP = "und"
#: ``xx-yy``: two ISO 639-1/639-2/639-3 codes (2-3 lowercase ASCII letters).
LP_PATTERN = re.compile(r"[a-z]{2,3}-[a-z]{2,3}")
#: Line numbers shown in a warning.
SHOW_LINES = 5


def parse_language_pair(text: str) -> str:
    """``text`` if it is a language pair ``xx-yy`` (:data:`LP_PATTERN`), else ``ValueError``."""
    if not isinstance(text, str) or not LP_PATTERN.fullmatch(text):
        raise ValueError(
            "expected a language pair xx-yy of ISO 639 codes (2-3 lowercase letters each, e.g. de-en), "
            f"got {text!r}"
        )
    return text


def _lines(rows: Sequence[int]) -> str:
    shown = ", ".join(str(i + 1) for i in rows[:SHOW_LINES])
    return shown + (", ..." if len(rows) > SHOW_LINES else "")


@dataclass(frozen=True)
class LanguagePairChoice:
    """The LP whose calibration is used and why.

    Attributes
    ----------
    lp : str or None
        The given LP, or the one pair detected on every row; None when rows differ or none was
        determined.
    how : {"given", "detected", "undetermined"}
    row_lps : tuple of str or None
        The calibration LP of each row (shape [n]); None: ``lp`` for every row (or, when ``lp`` is
        None, the global calibration: no detection ran).
    contradicted : tuple of int
        0-based rows whose text contradicts the given ``lp`` (calibrated as :data:`UNDETERMINED_LP`).
    contradicting_pairs : dict
        What was detected on those rows (``xx-yy`` with ``und`` for an undetermined side) -> rows.
    """

    lp: str | None
    how: str
    known_lps: tuple[str, ...]
    sigma_factor: float = 1.0
    detected: DetectedPair | None = None
    row_lps: tuple[str, ...] | None = None
    contradicted: tuple[int, ...] = ()
    contradicting_pairs: dict[str, int] = field(default_factory=dict)

    def _unseen_lp(self, lp: str | None) -> bool:
        return lp is not None and bool(self.known_lps) and lp not in self.known_lps

    @property
    def row_counts(self) -> dict[str, int]:
        """Rows per calibration LP (empty when no per-row LPs were chosen)."""
        return dict(Counter(self.row_lps)) if self.row_lps is not None else {}

    @property
    def undetermined_rows(self) -> list[int]:
        """0-based rows whose language pair could not be determined (not counting contradictions)."""
        if self.row_lps is None:
            return []
        contradicted = set(self.contradicted)
        return [i for i, lp in enumerate(self.row_lps) if lp == UNDETERMINED_LP and i not in contradicted]

    @property
    def unseen(self) -> bool:
        """Some row is scored with an LP the model has no calibration of its own for (a model that
        names no LP at all says nothing about any: never unseen)."""
        if self.row_lps is None:
            return self._unseen_lp(self.lp)
        return any(self._unseen_lp(lp) for lp in self.row_counts)

    def assign(self, frame, repeat: int = 1):
        """``frame`` with its ``lp`` column set to the chosen calibration LPs.

        ``repeat``: ``frame`` holds the rows this choice was made on ``repeat`` times over (one block
        per system, as ``uamt compare`` stacks them).
        """
        if self.row_lps is not None:
            if len(frame) != repeat * len(self.row_lps):
                raise ValueError(f"{len(frame)} rows, but LPs chosen for {repeat} x {len(self.row_lps)}")
            return frame.assign(lp=list(self.row_lps) * repeat)
        if self.lp is not None:
            return frame.assign(lp=self.lp)
        return frame

    def _widening(self) -> str:
        if self.sigma_factor > 1:
            return f"intervals are widened x{self.sigma_factor:.2f}"
        return "the global calibration is used without widening (the unseen-LP widening fitted for this model is 1)"

    def messages(self) -> list[str]:
        """What the user should read (stderr / summary ``warnings``), most important first."""
        out = []
        n = len(self.row_lps) if self.row_lps is not None else 0
        if self.contradicted:
            found = ", ".join(f"{pair} ({k})" for pair, k in sorted(self.contradicting_pairs.items()))
            out.append(
                f"the text of {len(self.contradicted)} of {n} rows contradicts --lp {self.lp}: detected "
                f"{found} (lines {_lines(self.contradicted)}); those rows are scored as an unseen "
                f"language pair and {self._widening()}; check --lp"
            )
        undetermined = self.undetermined_rows
        if undetermined:
            out.append(
                f"the language pair of {len(undetermined)} of {n} rows could not be determined "
                f"confidently (lines {_lines(undetermined)}): they are scored as an unseen language "
                f"pair and {self._widening()}; pass --lp if you know it"
            )
        named = [self.lp] if self.row_lps is None else sorted(set(self.row_counts) - {UNDETERMINED_LP})
        for lp in filter(self._unseen_lp, named):
            rows = self.row_counts.get(lp, n)
            share = f" ({rows} of {n} rows)" if self.row_lps is not None and rows != n else ""
            out.append(
                f"language pair {lp}{share} was never seen in training (the model knows "
                f"{', '.join(self.known_lps)}): scores are less reliable and {self._widening()}"
            )
        if self.how == DETECTED and self.detected is not None:
            if self.lp is not None:
                what = f"detected language pair {self.lp}"
            else:
                pairs = ", ".join(
                    f"{lp} ({k})" for lp, k in sorted(self.row_counts.items()) if lp != UNDETERMINED_LP
                )
                what = f"detected language pairs per row: {pairs}"
            out.append(f"{what}: {self.detected.describe()}; --lp overrides")
        return out

    def to_summary(self) -> dict:
        summary = {
            "lp": self.lp,
            "lp_source": self.how,
            "lp_seen_in_training": None if self.lp is None else not self._unseen_lp(self.lp),
        }
        if self.row_lps is not None and len(self.row_counts) > 1:
            summary["lp_rows"] = dict(sorted(self.row_counts.items()))
        if self.undetermined_rows:
            summary["lp_rows_undetermined"] = len(self.undetermined_rows)
        if self.contradicted:
            summary["lp_rows_contradicting"] = len(self.contradicted)
        return summary

    def note(self) -> str:
        """The clause of the one-line summary on stderr ("" when there is nothing to say)."""
        widened = f": intervals widened x{self.sigma_factor:.2f}" if self.sigma_factor > 1 else ""
        parts = []
        if self.contradicted:
            parts.append(f"{len(self.contradicted)} rows contradict --lp {self.lp}{widened}")
        if self.undetermined_rows:
            parts.append(f"LP of {len(self.undetermined_rows)} rows undetermined{widened}")
        if self.lp is not None and self._unseen_lp(self.lp) and not self.contradicted:
            parts.append(f"LP {self.lp} never seen in training{widened}")
        elif self.how == DETECTED and self.lp is not None:
            parts.append(f"detected LP {self.lp}")
        elif self.how == DETECTED:
            parts.append("detected LPs " + ", ".join(f"{lp} ({k})" for lp, k in sorted(self.row_counts.items())))
        return "".join(f"; {p}" for p in parts)


def choose_language_pair(
    src: Sequence[str],
    mt: Sequence[str],
    lp: str | None,
    known_lps: Sequence[str],
    *,
    sigma_factor: float = 1.0,
    detect: bool = True,
) -> LanguagePairChoice:
    """The calibration LP of every row of aligned ``src`` / ``mt`` (shape [n] each).

    ``lp`` given: every row gets it, except rows whose text contradicts it (checked when ``detect``
    and texts are given).  Else, with ``detect``: each row's detected pair
    (:func:`uamt.core.langid.resolve_languages` on each side), :data:`UNDETERMINED_LP` where a side is
    undetermined.  Else None (the global calibration).
    """
    known = tuple(sorted(known_lps))
    if len(src) != len(mt):
        raise ValueError(f"src and mt must be aligned, got {len(src)} and {len(mt)} lines")
    if not detect or not known or not len(src):
        # A model without per-LP calibration has nothing to choose between; REST passes no texts.
        return LanguagePairChoice(lp, GIVEN if lp is not None else UNDETERMINED, known, sigma_factor)
    src_rows, mt_rows = detect_row_languages(src), detect_row_languages(mt)
    src_codes, mt_codes = resolve_languages(src_rows), resolve_languages(mt_rows)
    try:
        detected = DetectedPair(summarise_languages(src_rows), summarise_languages(mt_rows))
    except ValueError:  # no non-empty line on a side
        detected = None
    pairs = [f"{s or UNDETERMINED_LP}-{t or UNDETERMINED_LP}" for s, t in zip(src_codes, mt_codes, strict=True)]
    if lp is not None:
        if not LP_PATTERN.fullmatch(lp):  # not a pair the text can be compared with
            return LanguagePairChoice(lp, GIVEN, known, sigma_factor, detected)
        want = [canonical_code(code) for code in lp.split("-")]
        contradicted = [
            i
            for i, sides in enumerate(zip(src_codes, mt_codes, strict=True))
            if any(code is not None and code != expected for code, expected in zip(sides, want, strict=True))
        ]
        if not contradicted:
            return LanguagePairChoice(lp, GIVEN, known, sigma_factor, detected)
        bad = set(contradicted)
        row_lps = tuple(UNDETERMINED_LP if i in bad else lp for i in range(len(pairs)))
        found = dict(Counter(pairs[i] for i in contradicted))
        return LanguagePairChoice(lp, GIVEN, known, sigma_factor, detected, row_lps, tuple(contradicted), found)
    row_lps = tuple(
        pair if s is not None and t is not None else UNDETERMINED_LP
        for pair, s, t in zip(pairs, src_codes, mt_codes, strict=True)
    )
    distinct = set(row_lps)
    if distinct == {UNDETERMINED_LP}:
        return LanguagePairChoice(None, UNDETERMINED, known, sigma_factor, detected, row_lps)
    single = next(iter(distinct)) if len(distinct) == 1 else None
    return LanguagePairChoice(single, DETECTED, known, sigma_factor, detected, row_lps)


def predictor_language_pair(predictor, src: Sequence[str], mt: Sequence[str], lp: str | None) -> LanguagePairChoice:
    """:func:`choose_language_pair` with what ``predictor`` knows about language pairs.

    A :class:`~uamt.serving.calibrated_predictor.CalibratedPredictor` names the LPs with a calibration of their own
    (``known_lps``) and its ``unseen_lp_sigma_factor``; only such a model gets the pair detected
    when none is given (there is nothing to choose otherwise).  A model calibrated only globally is
    judged by the LPs it was trained on (``language_pairs``); a given ``lp`` is checked against the
    text for either.  A predictor that names no LP never reports an LP unseen.
    """
    calibrated = tuple(getattr(predictor, "known_lps", None) or ())
    trained = tuple(getattr(predictor, "language_pairs", None) or ())
    factor = float(getattr(predictor, "unseen_lp_sigma_factor", 1.0))
    return choose_language_pair(
        src, mt, lp, calibrated or trained, sigma_factor=factor, detect=bool(calibrated) or lp is not None
    )
