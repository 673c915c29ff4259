"""Which language pair's calibration scores a file, and what to tell the user about it.

``uamt score`` and the REST server pass the LP the user gave; without one, the pair is detected
offline from the texts (:mod:`uamt.langid`).  An LP the model has no calibration for (one absent
from its training data) is scored with the global calibration widened by the model's
``unseen_lp_sigma_factor``, and the user is told so: on stderr, in the summary and in REST responses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from uamt.langid import DetectedPair, detect_pair

#: How the language pair was decided.
GIVEN, DETECTED, UNDETERMINED = "given", "detected", "undetermined"


@dataclass(frozen=True)
class LanguagePairChoice:
    """The LP whose calibration is used (None: the global one) and why."""

    lp: str | None
    how: str
    known_lps: tuple[str, ...]
    sigma_factor: float = 1.0
    detected: DetectedPair | None = None

    @property
    def unseen(self) -> bool:
        """An LP was given or detected, and the model has no calibration of its own for it (a model
        that names no LP at all says nothing about any: never unseen)."""
        return self.lp is not None and bool(self.known_lps) and self.lp not in self.known_lps

    def messages(self) -> list[str]:
        """What the user should read (stderr / summary ``warnings``), most important first."""
        out = []
        if self.unseen:
            widened = (
                f"intervals are widened x{self.sigma_factor:.2f}"
                if self.sigma_factor > 1
                else "the global calibration is used (the model has no fitted widening for unseen LPs)"
            )
            out.append(
                f"language pair {self.lp} was never seen in training (the model knows "
                f"{', '.join(self.known_lps)}): scores are less reliable and {widened}"
            )
        if self.how == DETECTED:
            out.append(f"detected language pair {self.lp}: {self.detected.describe()}; --lp overrides")
        elif self.how == UNDETERMINED and self.detected is not None:
            out.append(
                f"could not detect one language pair ({self.detected.describe()}): the global "
                "calibration is used; pass --lp"
            )
        return out

    def to_summary(self) -> dict:
        return {
            "lp": self.lp,
            "lp_source": self.how,
            "lp_seen_in_training": None if self.lp is None else not self.unseen,
        }

    def note(self) -> str:
        """The clause of the one-line summary on stderr ("" when there is nothing to say)."""
        if self.unseen:
            widened = f": intervals widened x{self.sigma_factor:.2f}" if self.sigma_factor > 1 else ""
            return f"; LP {self.lp} never seen in training{widened}"
        if self.how == DETECTED:
            return f"; detected LP {self.lp}"
        return ""


def choose_language_pair(
    src: Sequence[str],
    mt: Sequence[str],
    lp: str | None,
    known_lps: Sequence[str],
    *,
    sigma_factor: float = 1.0,
    detect: bool = True,
) -> LanguagePairChoice:
    """The calibration's LP for aligned ``src`` / ``mt`` (shape [n] each): ``lp`` when given, else
    detected (``detect=True``), else None (the global calibration)."""
    known = tuple(sorted(known_lps))
    if lp is not None:
        return LanguagePairChoice(lp, GIVEN, known, sigma_factor)
    if not detect or not known:
        # A model without per-LP calibration has nothing to choose between.
        return LanguagePairChoice(None, UNDETERMINED, known, sigma_factor)
    try:
        pair = detect_pair(src, mt)
    except ValueError:
        return LanguagePairChoice(None, UNDETERMINED, known, sigma_factor)
    if pair.lp is None:
        return LanguagePairChoice(None, UNDETERMINED, known, sigma_factor, pair)
    return LanguagePairChoice(pair.lp, DETECTED, known, sigma_factor, pair)


def predictor_language_pair(predictor, src: Sequence[str], mt: Sequence[str], lp: str | None) -> LanguagePairChoice:
    """:func:`choose_language_pair` with what ``predictor`` knows about language pairs.

    A :class:`~uamt.pyfunc.CalibratedPredictor` names the LPs with a calibration of their own
    (``known_lps``) and its ``unseen_lp_sigma_factor``; only such a model gets the pair detected
    (there is nothing to choose otherwise).  A model calibrated only globally is judged by the LPs
    it was trained on (``language_pairs``), and a predictor that names none never reports an LP unseen.
    """
    calibrated = tuple(getattr(predictor, "known_lps", None) or ())
    trained = tuple(getattr(predictor, "language_pairs", None) or ())
    factor = float(getattr(predictor, "unseen_lp_sigma_factor", 1.0))
    return choose_language_pair(src, mt, lp, calibrated or trained, sigma_factor=factor, detect=bool(calibrated))
