"""MQM error weights (Freitag et al. 2021, the scheme of Google's WMT MQM files).

A rater's segment score is ``-sum(weight(severity, category))`` over the errors they marked;
a segment rated by several raters gets the mean of their scores.  Loaders that only have error
annotations (WMT21 en-ru from the QE-2023 files, WMT23 side-by-side, biomedical MQM) score them
with :func:`mqm_weight`, so every MQM dataset is on one scale (0 best, negative worse).

========================================= ======
severity / category                        weight
========================================= ======
Neutral, No-error (any category)           0
Minor                                      1
Minor ``Fluency/Punctuation``              0.1
Major                                      5
Critical (counts as Major)                 5
``Non-translation`` (any severity but 0)   25
source-side issues (``Source issue`` …)    0
``Creative Reinterpretation`` (any)        0
========================================= ======

Creative reinterpretation marks a deliberate, acceptable departure from the source; Google's
WMT23 MQM scores weigh it 0, and so does this scheme, so that scores computed here from error
lists agree with the published ones.
"""

from __future__ import annotations

from collections.abc import Iterable

from uamt.core.errors import DataError

MINOR, MAJOR, NON_TRANSLATION, PUNCTUATION = 1.0, 5.0, 25.0, 0.1
_ZERO_SEVERITIES = {"neutral", "no-error", "no error", "none", ""}
_SEVERITY = {"minor": MINOR, "major": MAJOR, "critical": MAJOR}


def mqm_weight(severity: str, category: str = "") -> float:
    """The penalty of one marked error (>= 0); raises :class:`DataError` for an unknown severity.

    ``category`` is matched case-insensitively: ``Non-translation`` (also ``Non-translation!``)
    weighs 25, Minor ``Fluency/Punctuation`` 0.1, and any category starting with ``Source``
    (errors in the source, not the translation) 0, and any category naming Creative
    Reinterpretation 0.
    """
    sev = (severity or "").strip().casefold()
    cat = (category or "").strip().casefold()
    if sev in _ZERO_SEVERITIES or cat.startswith("source") or cat in ("no-error", "no error"):
        return 0.0
    if "creative reinterpretation" in cat:
        return 0.0
    if sev not in _SEVERITY:
        raise DataError(
            f"MQM severity {severity!r} not supported; choose from {sorted(_SEVERITY)} or Neutral"
        )
    if cat.startswith("non-translation"):
        return NON_TRANSLATION
    if sev == "minor" and cat == "fluency/punctuation":
        return PUNCTUATION
    return _SEVERITY[sev]


def mqm_score(errors: Iterable[tuple[str, str]]) -> float:
    """One rater's segment score: ``-sum(mqm_weight(severity, category))`` (0 = no error)."""
    return -sum(mqm_weight(sev, cat) for sev, cat in errors)
