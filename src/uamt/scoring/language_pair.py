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
        """An LP was given or detected, and the model has no calibration of its own for it."""
        return self.lp is not None and self.lp not in self.known_lps

    def messages(self) -> list[str]:
        """What the user should read (stderr / summary ``warnings``), most important first."""
        out = []
        if self.unseen:
            out.append(
                f"language pair {self.lp} was never seen in training (the model knows "
                f"{', '.join(self.known_lps) or 'no LP'}): scores are less reliable and intervals are "
                f"widened x{self.sigma_factor:.2f}"
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
