"""Render an analysis' markdown section from its JSON findings with a Jinja2 template.

An analysis computes a JSON-able findings dict (``metrics/experiments/<name>.json``); its markdown
section of ``reports/experiments.md`` is ``templates/<name>.md.j2`` rendered from that dict.  The
templates see the findings as ``r`` plus whatever the analysis passes as extra context (values
derived for the text, never new numbers), and share the filters below, so a number is formatted
the same way in every section.

Whitespace: ``trim_blocks`` and ``lstrip_blocks`` drop the line of a ``{% ... %}`` tag, and
``keep_trailing_newline`` keeps the template's last newline, so the template's lines are the
section's lines.  A long paragraph may be wrapped in the template inside
``{% filter unwrap %}...{% endfilter %}``: its lines are joined with single spaces.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jinja2

from uamt.experiments.common import fmt, markdown_table

TEMPLATE_SUFFIX = ".md.j2"


def maybe(value: Any, spec: str, dash: str = "–") -> str:
    """``format(value, spec)``, ``dash`` for None: ``maybe(0.12, "+.0%") == "+12%"``."""
    return dash if value is None else format(value, spec)


def yes_no(value: bool | None) -> str:
    """``yes`` / ``no``; an en dash for None (not judged)."""
    return "–" if value is None else ("yes" if value else "no")


def percent(value: Any, decimals: int = 1) -> str:
    """A share as ``"12.3 %"`` (``100 * value``); an en dash for None."""
    return "–" if value is None else f"{100 * value:.{decimals}f} %"


def percent_interval(pair: Sequence[float | None] | None) -> str:
    """An interval of shares as ``"[12, 80] %"``; an en dash when it or an end is missing or not finite."""
    if pair is None or any(v is None or not math.isfinite(v) for v in pair):
        return "–"
    return f"[{100 * pair[0]:.0f}, {100 * pair[1]:.0f}] %"


def unwrap(text: str) -> str:
    """One line from a paragraph wrapped over several template lines (each line stripped)."""
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def section_number(name: str) -> int:
    """1-based place of analysis ``name`` in :data:`uamt.experiments.SECTIONS` (0 if absent)."""
    from uamt.experiments import SECTIONS

    return SECTIONS.index(name) + 1 if name in SECTIONS else 0


@functools.cache
def environment() -> jinja2.Environment:
    """The Jinja2 environment of the section templates (package ``uamt.experiments``, ``templates/``)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("uamt.experiments", "templates"),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,  # a key the findings lack is an error, never a blank
        autoescape=False,  # markdown, not HTML
    )
    env.filters.update(fmt=fmt, maybe=maybe, percent=percent, percent_interval=percent_interval, unwrap=unwrap, yes_no=yes_no)
    env.globals.update(table=_table)
    return env


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 3) -> str:
    # markdown_table ends with a newline; the template's own line break follows the call.
    return markdown_table(header, rows, digits).rstrip("\n")


def render(name: str, findings: dict[str, Any], /, **context: Any) -> str:
    """The markdown of ``templates/<name>.md.j2`` for ``findings`` (as ``r``) and extra ``context``."""
    template = environment().get_template(name + TEMPLATE_SUFFIX)
    return template.render(r=findings, **context)
