"""The papers' published numbers, read from ``paper_numbers.yaml`` (one home, a source per group).

The analyses quote these beside their own results; each group in the YAML carries ``source`` (paper,
table / figure, setting) and either ``values`` (a mapping) or ``value`` (one number).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from uamt.core.errors import DataError

FILE = "paper_numbers.yaml"


@functools.cache
def _all() -> dict[str, Any]:
    text = resources.files("uamt.experiments").joinpath(FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def entry(analysis: str, name: str) -> dict[str, Any]:
    """The group ``name`` of ``analysis`` (``source`` plus ``values`` / ``value`` / ``text``).

    Raises
    ------
    DataError
        ``paper_numbers.yaml`` has no such group, or the group names no source.
    """
    groups = _all().get(analysis) or {}
    if name not in groups:
        raise DataError(f"{FILE}: no {analysis}.{name}; choose from {sorted(groups)}")
    group = groups[name]
    if not group.get("source"):
        raise DataError(f"{FILE}: {analysis}.{name} names no source")
    return group


def values(analysis: str, name: str) -> Any:
    """``entry(analysis, name)["values"]`` (or ``["value"]`` for a single number)."""
    group = entry(analysis, name)
    return group["values"] if "values" in group else group["value"]
