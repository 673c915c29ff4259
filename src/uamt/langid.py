"""Offline language identification of a file's sources and translations (``uamt score`` without ``--lp``).

The model ships inside the ``py3langid`` wheel (no download), so detection works offline.  A file's
language is the majority label over up to ``sample`` of its non-empty lines, spread evenly over the
file; its ``share`` says how clear the majority was, so callers can refuse a mixed file rather than
pick a calibration for the wrong language pair.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

#: Lines classified per file: the majority over 200 evenly spaced lines is stable and takes ~50 ms.
DEFAULT_SAMPLE = 200
#: Below this majority share a file is reported as mixed (no language pair is chosen from it).
MIN_SHARE = 0.6


@dataclass(frozen=True)
class DetectedLanguage:
    """Majority language of a file: ISO 639-1 ``code``, the ``share`` of sampled lines with it."""

    code: str
    share: float
    n_lines: int

    @property
    def clear(self) -> bool:
        return self.share >= MIN_SHARE


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


def _evenly_spaced(texts: Sequence[str], sample: int) -> list[str]:
    lines = [t for t in texts if isinstance(t, str) and t.strip()]
    if len(lines) <= sample:
        return lines
    step = len(lines) / sample
    return [lines[int(i * step)] for i in range(sample)]


def detect_language(texts: Sequence[str], sample: int = DEFAULT_SAMPLE) -> DetectedLanguage:
    """Majority language of ``texts`` (shape [n]) over up to ``sample`` evenly spaced non-empty lines.

    Raises ``ValueError`` when there is no non-empty line to classify.
    """
    if sample < 1:
        raise ValueError(f"sample={sample!r} must be >= 1")
    lines = _evenly_spaced(texts, sample)
    if not lines:
        raise ValueError("no non-empty line to detect the language of")
    import py3langid  # lazy: loads its model (~0.5 s) only when detection is asked for

    counts = Counter(py3langid.classify(line)[0] for line in lines)
    code, hits = counts.most_common(1)[0]
    return DetectedLanguage(code=code, share=hits / len(lines), n_lines=len(lines))


def detect_pair(src: Sequence[str], mt: Sequence[str], sample: int = DEFAULT_SAMPLE) -> DetectedPair:
    """Detected source and translation languages of aligned files (see :func:`detect_language`)."""
    return DetectedPair(detect_language(src, sample), detect_language(mt, sample))
