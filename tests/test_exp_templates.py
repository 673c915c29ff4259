"""Every analysis' markdown section, rendered from its template, is byte-identical to the golden file.

``tests/golden/experiments/<name>.json`` is a findings dict (the pipeline's real
``metrics/experiments/<name>.json``, or ``<name>--<variant>.json`` from a test fixture) and
``<name>[--<variant>].md`` the section that ``uamt.experiments.<name>.render`` wrote for it before
the sections moved to Jinja2 templates (commit c3b5653): the report must not change by a byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from uamt.experiments import SECTIONS, rendering
from uamt.experiments.common import fmt

GOLDEN = Path(__file__).parent / "golden" / "experiments"
CASES = sorted(GOLDEN.glob("*.json"))


def test_golden_files_name_sections_and_come_in_pairs():
    assert {path.stem.split("--")[0] for path in CASES} <= set(SECTIONS)
    assert {path.stem.split("--")[0] for path in CASES} >= {"ood", "noisy_refs", "multihyp", "cost"}
    assert all(path.with_suffix(".md").is_file() for path in CASES)


@pytest.mark.parametrize("case", CASES, ids=[path.stem for path in CASES])
def test_section_renders_byte_identical_to_golden(case):
    import importlib

    module = importlib.import_module(f"uamt.experiments.{case.stem.split('--')[0]}")
    findings = json.loads(case.read_text(encoding="utf-8"))
    expected = case.with_suffix(".md").read_bytes()
    assert module.render(findings).encode("utf-8") == expected


def test_filters_format_like_the_tables():
    env = rendering.environment()
    assert env.filters["fmt"] is fmt
    assert rendering.maybe(0.123, "+.0%") == "+12%" and rendering.maybe(None, "+.0%") == "–"
    assert rendering.percent(0.1234) == "12.3 %" and rendering.percent(None) == "–"
    assert [rendering.yes_no(v) for v in (True, False, None)] == ["yes", "no", "–"]
    assert rendering.unwrap("  a b\n\n  c,\n d  ") == "a b c, d"


def test_template_whitespace_and_missing_keys(tmp_path, monkeypatch):
    (tmp_path / "demo.md.j2").write_text(
        "## {{ section }}. Demo\n\n{% for x in r.xs %}\n| {{ x|fmt(2) }} |\n{% endfor %}\n\n"
        "{% filter unwrap %}\nOne\nparagraph.\n{% endfilter %}\n\n",  # the tag eats its own newline
        encoding="utf-8",
    )
    env = rendering.environment()
    monkeypatch.setattr(env, "loader", jinja2.FileSystemLoader(tmp_path))
    assert rendering.render("demo", {"xs": [1.0, None, 3]}, section=2) == (
        "## 2. Demo\n\n| 1.00 |\n| – |\n| 3 |\n\nOne paragraph.\n"
    )
    with pytest.raises(jinja2.UndefinedError, match="xs"):
        rendering.render("demo", {}, section=2)


def test_paper_numbers_name_a_source_and_refuse_unknown_groups():
    from uamt.errors import DataError
    from uamt.experiments import noisy_refs, paper_numbers, references

    groups = paper_numbers._all()
    assert {"methods", "noisy_refs", "ood", "references", "multihyp", "critical"} <= set(groups)
    for analysis, by_name in groups.items():
        for name in by_name:
            assert paper_numbers.entry(analysis, name)["source"], f"{analysis}.{name}"
    assert noisy_refs.PAPER == {"hts": 0.82, "mcd_head": 0.38} and noisy_refs.PAPER_THRESHOLD == 10.0
    assert references.PAPER_TABLE5["ABP"]["S-2"] == {"pps": 0.441, "nll": 1.424, "sharpness": 0.756}
    assert paper_numbers.values("critical", "test_segments") == 5049
    with pytest.raises(DataError, match=r"no noisy_refs\.nope; choose from \['share_better_reference', 'threshold'\]"):
        paper_numbers.entry("noisy_refs", "nope")


def test_templates_and_paper_numbers_are_package_data():
    import fnmatch
    import tomllib

    root = Path(__file__).parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-data"
    ]["uamt"]
    package = root / "src" / "uamt"
    shipped = [*package.glob("experiments/templates/*"), package / "experiments" / "paper_numbers.yaml"]
    assert len(shipped) > 1
    for path in shipped:
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in globs), relative
