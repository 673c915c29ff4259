"""What counts as an empty segment, shared by every text input (``uamt score``/``compare``, REST, pyfunc).

A segment is *blank* when nothing in it would be visible to a reader: whitespace, control
characters (NUL, ...), format characters (U+FEFF byte-order mark, U+200B zero-width space,
U+2060 word joiner, U+200C/U+200D joiners, U+00AD soft hyphen, bidi marks, ...) and the few
letter-like fillers that render as nothing (U+3164 Hangul filler, U+2800 braille blank,
variation selectors, ...).  The model would score such a "translation" as if it were text, so
it is refused like an empty line.
"""

from __future__ import annotations

import unicodedata

#: Code points that are not whitespace, control or format characters but show nothing.
_INVISIBLE_FILLERS = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0"
    + "".join(chr(c) for c in range(0xFE00, 0xFE10))  # variation selectors
)
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})


def is_invisible(char: str) -> bool:
    """Whether ``char`` (one code point) shows nothing on its own."""
    return (
        char.isspace()
        or char in _INVISIBLE_FILLERS
        or unicodedata.category(char) in _INVISIBLE_CATEGORIES
    )


def is_blank(text: str) -> bool:
    """Whether ``text`` holds no visible character (empty, whitespace, NUL, zero-width, BOM ...)."""
    return all(is_invisible(char) for char in text)


def blank_detail(text: str) -> str:
    """For messages about a blank ``text``: ``""`` when it is empty or whitespace, else
    ``"only invisible characters U+200B, U+FEFF"`` (the code points it holds, at most four)."""
    shown = sorted({f"U+{ord(c):04X}" for c in text if not c.isspace()})
    if not shown:
        return ""
    return "only invisible characters " + ", ".join(shown[:4]) + (", ..." if len(shown) > 4 else "")


def text_problem(value: object) -> str | None:
    """What makes ``value`` unusable as a segment, for a message after its name
    (``"must be a string, got int"``, ``"is empty (only invisible characters U+200B)"``), or None."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if is_blank(value):
        detail = blank_detail(value)
        return "is empty" + (f" ({detail})" if detail else "")
    return None
