"""Assemble ``reports/experiments.md`` from every analysis' JSON result (stage ``report``).

Contract of an analysis module ``uamt.experiments.<name>`` (one per entry of
:data:`uamt.experiments.SECTIONS`, in that order):

``render(result: dict) -> str``  (required)
    The markdown section: a ``## N. Title`` heading, what was run, tables, figure links
    ``![...](figures/<file>.png)`` (relative to ``reports/``) and a paragraph comparing with the paper;
    written by the template ``templates/<name>.md.j2`` (:func:`uamt.experiments.rendering.render`).
``report_findings(result: dict) -> list[tuple[str, str, str]]``  (optional)
    The published findings the section tests, as ``(finding, what the paper reports, what we
    measured)``; the third string starts with the verdict ``held``, ``not held``, ``partly`` or
    ``n/a`` followed by ``:`` and the numbers, e.g. ``"held: en-de +35 % (rise)"``.  They make up
    the summary table at the top of the report; a module without ``report_findings`` contributes
    none.  (A distinct name: several modules already have a ``findings`` helper of their own.)

``result`` is ``metrics/experiments/<name>.json`` (:func:`uamt.experiments.common.read_result`); a
missing one is an error naming the stage to run (``dvc repro exp_<name>``), never a silent gap.
The report is date-free, so the same results give the same bytes; its frame is ``templates/report.md.j2``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from uamt.core.errors import DataError
from uamt.experiments import rendering
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, read_json, read_result

#: The optional function of a section module that lists its findings for the summary table.
FINDINGS_HOOK = "report_findings"
#: Verdict words a finding's third field may start with, in the summary's count order.
VERDICTS = ("held", "partly", "not held", "n/a")
FIGURE_LINK = re.compile(r"!\[[^\]]*\]\(figures/([^)\s]+)\)")


def sections() -> tuple[str, ...]:
    """The analyses in report order (read at call time, so tests can substitute them)."""
    import uamt.experiments

    return tuple(uamt.experiments.SECTIONS)


def verdict_of(ours: str) -> str:
    """The verdict a finding's measured text starts with (``"?"`` when it follows no convention)."""
    head = ours.strip().lower()
    for word in sorted(VERDICTS, key=len, reverse=True):  # "not held" before "held"
        if head.startswith(word):
            return word
    return "?"


def section_title(markdown: str, name: str) -> str:
    """The first ``## `` heading of a rendered section (the module name when there is none)."""
    for line in markdown.splitlines():
        if line.startswith("## "):
            return line[3:].strip()
    return name


def _cell(value) -> str:
    # One table cell: no line breaks, and a literal "|" must not split the cell.
    return " ".join(str(value).split()).replace("|", "\\|")


def render_section(name: str, metrics_dir: str | Path, figures_dir: str | Path) -> tuple[str, list]:
    """``(markdown, findings)`` of one analysis; missing JSON or figures name the stage to run."""
    module = importlib.import_module(f"uamt.experiments.{name}")
    if not callable(getattr(module, "render", None)):
        raise DataError(f"uamt.experiments.{name}: no render(result) function")
    result = read_result(name, metrics_dir)
    try:
        markdown = module.render(result).rstrip() + "\n"
    except (KeyError, TypeError) as exc:
        # A result written by an older version of the analysis lacks what render now reads.
        raise DataError(
            f"{Path(metrics_dir) / f'{name}.json'}: uamt.experiments.{name}.render cannot read it "
            f"({type(exc).__name__}: {exc}); re-run `dvc repro exp_{name}`"
        ) from exc
    for figure in FIGURE_LINK.findall(markdown):
        if not (Path(figures_dir) / figure).is_file():
            raise DataError(
                f"{Path(figures_dir) / figure}: linked from section {name!r} but missing; "
                f"run `dvc repro exp_{name}` first"
            )
    found = getattr(module, FINDINGS_HOOK, None)
    rows = [tuple(_cell(cell) for cell in row) for row in found(result)] if callable(found) else []
    for row in rows:
        if len(row) != 3:
            raise DataError(
                f"uamt.experiments.{name}.{FINDINGS_HOOK}: expected (finding, paper, ours), got {row!r}"
            )
    return markdown, rows


def build_report(
    metrics_dir: str | Path = METRICS_DIR,
    figures_dir: str | Path = FIGURES_DIR,
    prepared_dir: str | Path = "data/prepared",
    conditional_path: str | Path | None = None,
) -> str:
    """The whole ``reports/experiments.md``: header, summary of findings, every section, then
    the interval goals per model (:func:`render_goals` of ``conditional_path``, by default
    ``conditional.json`` beside ``metrics_dir``: the evaluate stage's ``metrics/conditional.json``).

    Raises
    ------
    DataError
        A section's JSON result or linked figure is missing (naming ``dvc repro exp_<name>``), or
        ``prepared_dir`` holds no prepared split (the data version would be meaningless).
    """
    from uamt.data.prepare import data_version

    if not any(Path(prepared_dir).glob("*.parquet")):
        raise DataError(f"{prepared_dir}: no prepared splits; run `dvc repro prepare` first")
    names = sections()
    rendered = {name: render_section(name, metrics_dir, figures_dir) for name in names}
    summary = [
        (section_title(markdown, name), *row) for name, (markdown, rows) in rendered.items() for row in rows
    ]
    counts = {v: sum(verdict_of(row[3]) == v for row in summary) for v in (*VERDICTS, "?")}
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    text = rendering.render(
        "report",
        {},
        metrics_dir=Path(metrics_dir).as_posix(),
        figures_dir=Path(figures_dir).as_posix(),
        prepared_dir=Path(prepared_dir).as_posix(),
        data_version=data_version(prepared_dir),
        titles=[section_title(markdown, name) for name, (markdown, _) in rendered.items()],
        summary=summary,
        tally=tally,
        sections=[
            *(markdown for markdown, _ in rendered.values()),
            render_goals(conditional_path or Path(metrics_dir).parent / "conditional.json"),
        ],
    )
    return text.rstrip() + "\n"


def render_goals(path: str | Path, dev_path: str | Path | None = None) -> str:
    """The interval goals table (and the candidates table) of every model in ``path``
    (``metrics/conditional.json``, :func:`uamt.uncertainty.goals.interval_summary` per model); a
    note naming the stage to run when the file is missing (analyses can be reported without it).

    Each model's σ weight λ (the share of its own σ in the served scale, chosen on dev by
    :func:`uamt.model_evaluation.choose_sigma_weight`) is read from ``dev_path`` (by default
    ``dev.json`` beside ``path``, the calibrate stage's): with λ = 0 a method serves its μ with the
    baseline's calibration, and where its μ is the baseline's too, exactly the baseline.
    """
    path = Path(path)
    if not path.is_file():
        return f"## Interval goals: the served distribution, per LP and cell\n\n`{path.as_posix()}` missing: run `dvc repro evaluate`.\n"
    methods = read_json(path, "evaluate")
    # The held-out LPs are judged out of domain, after register (evaluate_ood): completed here where
    # that stage ran, else the goal reads "measured after register".
    held_out_path = path.parent / "held_out.json"
    if held_out_path.is_file():
        from uamt.uncertainty.goals import with_held_out

        methods = with_held_out(methods, read_json(held_out_path, "evaluate_ood"))
    dev_path = Path(dev_path) if dev_path is not None else path.parent / "dev.json"
    dev = read_json(dev_path, "calibrate") if dev_path.is_file() else {}
    weights = {name: sigma_weights(dev.get(name)) for name in methods}
    return (
        rendering.render(
            "goals", {}, path=path.as_posix(), dev_path=dev_path.as_posix(), methods=methods, weights=weights
        ).rstrip()
        + "\n"
    )


def sigma_weights(dev: dict | None) -> dict[str, float | None]:
    """λ at the seen LPs and at unseen ones (``None`` where the model has no choice recorded: a
    point model, or a dev record from before the choice) from one model's ``metrics/dev.json`` entry."""
    dev = dev if isinstance(dev, dict) else {}
    seen = (dev.get("sigma_weight") or {}).get("chosen")
    unseen = ((dev.get("unseen_lp") or {}).get("sigma_weight") or {}).get("chosen")
    return {"seen": seen, "unseen": unseen}
