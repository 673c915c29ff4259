"""What every experiment stage shares: where results go, JSON and figure writing, markdown tables,
and calibrated indicators of a predictions table (dev-fitted calibration, as in the pipeline)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from uamt.core.errors import DataError
from uamt.core.fileio import atomic_write_text, read_stage_json
from uamt.plots import pyplot, save_figure  # noqa: F401 - re-exported for the analyses

#: Where each analysis writes ``<name>.json`` (DVC metrics) and its figures (DVC plots).
METRICS_DIR = "metrics/experiments"
FIGURES_DIR = "reports/figures"
#: Suffix of the experiment stages' own embedding cache (:func:`experiment_cache_dir`).
EXPERIMENTS_OVERLAY = "experiments"
REPORT_PATH = "reports/experiments.md"

#: The indicators of the papers' tables, in their order (lower is better except PPS/UPS).
INDICATORS = ("pps", "ups", "nll", "ece", "sharpness")
HIGHER_IS_BETTER = {"pps", "ups"}


def experiment_cache_dir(encode) -> Path:
    """Where the experiment stages store the embeddings of the texts only they score: beside the
    encode stage's cache (``cache/embeddings`` -> ``cache/embeddings_experiments``)."""
    from uamt.pipeline_config import overlay_cache_dir

    return overlay_cache_dir(encode, EXPERIMENTS_OVERLAY)


def open_experiment_features(encode):
    """The experiment stages' :func:`uamt.pipeline_config.open_features`: the encode stage's cache
    read, the texts only they score (perturbed and pseudo-references, rerank candidates...) kept in
    :func:`experiment_cache_dir`."""
    from uamt.pipeline_config import open_features

    return open_features(encode, overlay=EXPERIMENTS_OVERLAY)


def result_path(name: str, metrics_dir: str | Path = METRICS_DIR) -> Path:
    return Path(metrics_dir) / f"{name}.json"


def write_result(name: str, result: dict[str, Any], metrics_dir: str | Path = METRICS_DIR) -> Path:
    """Write one analysis' JSON result atomically (NaN/inf become null: strict JSON)."""
    path = result_path(name, metrics_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(_json_safe(result), indent=2, sort_keys=False) + "\n")
    return path


def read_json(path: str | Path, stage: str) -> Any:
    """:func:`uamt.core.fileio.read_stage_json` (the analyses' name for it)."""
    return read_stage_json(path, stage)


def read_result(name: str, metrics_dir: str | Path = METRICS_DIR) -> dict[str, Any]:
    return read_json(result_path(name, metrics_dir), f"exp_{name}")


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):  # numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: floats to ``digits`` decimals, None/NaN as an en dash."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 3) -> str:
    """A GitHub-markdown table; cells go through :func:`fmt`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(cell, digits) for cell in row) + " |")
    return "\n".join(lines) + "\n"


def calibrated_indicators(
    table: pd.DataFrame, dev_table: pd.DataFrame, settings=None, *, fixed_variance: bool = False
) -> dict[str, dict[str, Any]]:
    """``{lp: metrics, "avg": macro average}`` of a predictions table, calibrated on ``dev_table``.

    Both tables have columns ``lp, human, mu, sigma`` (sigma a standard deviation).  Standardisation
    and the affine sigma^2 calibration are fitted on dev (per LP, global fallback) exactly as the
    ``calibrate``/``evaluate`` stages do; ``fixed_variance=True`` reports the fixed-variance
    baseline (Glushkova et al. 2021, Eq. 6) instead of the model's own sigma.
    """
    import numpy as np

    from uamt.uncertainty import EvaluationSettings, evaluate_predictions

    settings = settings or EvaluationSettings()
    # A point estimate (no sigma of its own) is always the fixed-variance Gaussian.
    fixed_variance = fixed_variance or bool(table["sigma"].isna().all())
    if fixed_variance:
        table = table.assign(sigma=np.ones(len(table)))
        dev_table = dev_table.assign(sigma=np.ones(len(dev_table)))
    # Only the one block read here is computed: the served calibration (candidates cross-fitted on
    # dev) for the model, nothing of the candidates for the fixed-variance baseline.
    scope = "fixed_variance" if fixed_variance else "served"
    result = evaluate_predictions(table, dev_table, settings=settings, scope=scope)
    block = result["methods"]["fixed_variance" if fixed_variance else "model"]
    return {"avg": block["macro_avg"], **block["per_lp"]}


# ----------------------------------------------------------------------------------------------
# Pseudo-references: other systems' outputs for the same source (analyses critical, multihyp)

#: Human translations rated as if they were systems: WMT21 DA ``HUMAN``/``HUMAN-refB``, WMT21 MQM
#: ``ref-A`` .. ``ref-D``, TED MQM ``ref``/``refB``.
#: WMT (HUMAN-refB, ref-A, refB) and biomedical MQM (reference, reference_r1) human translations.
HUMAN_SYSTEM_PATTERN = r"^(HUMAN([-_.].*)?|ref(-?[A-Z])?|reference(_r\d+)?)$"


def is_human_system(system: str) -> bool:
    """Whether ``system`` names a human translation (see :data:`HUMAN_SYSTEM_PATTERN`)."""
    import re

    return re.match(HUMAN_SYSTEM_PATTERN, str(system)) is not None


def pseudo_reference_rows(
    frame: pd.DataFrame, *, max_refs: int | None = None, seed: int = 0, exclude_human: bool = True
) -> list:
    """For every row, the positions of the rows whose ``mt`` serve as its pseudo-references.

    The pseudo-references of row ``i`` are the outputs of the *other* systems for the same source:
    rows with the same ``(dataset, lp, seg_id)`` and a different ``system`` (a row never gets its
    own system's output), human translations excluded when ``exclude_human``.

    Parameters
    ----------
    frame : DataFrame
        Columns ``lp, seg_id, system, mt`` (and optionally ``dataset``, ``src``: rows of one group
        must share one ``src``, else :class:`DataError` names the group).
    max_refs : int, optional
        Keep at most this many per row, sampled without replacement (``numpy`` generator seeded
        with ``seed``; groups visited in sorted order, so the choice is reproducible).
    seed : int
    exclude_human : bool

    Returns
    -------
    list of numpy.ndarray (int64), length ``len(frame)``
        Positional indices into ``frame`` (sorted); empty where a source has no other system.
    """
    import numpy as np

    missing = [c for c in ("lp", "seg_id", "system", "mt") if c not in frame.columns]
    if missing:
        raise DataError(f"pseudo-references need columns {missing}")
    if max_refs is not None and max_refs < 1:
        raise DataError(f"max_refs={max_refs} must be >= 1 (or null for all)")
    keys = [c for c in ("dataset", "lp", "seg_id") if c in frame.columns]
    systems = frame["system"].astype(str).to_numpy()
    candidate = np.array([not (exclude_human and is_human_system(s)) for s in systems], dtype=bool)
    sources = frame["src"].to_numpy() if "src" in frame.columns else None
    rng = np.random.default_rng(seed)
    out: list = [np.zeros(0, dtype=np.int64)] * len(frame)
    groups = frame.reset_index(drop=True).groupby(keys, sort=True).indices
    for key in sorted(groups):
        positions = np.sort(np.asarray(groups[key], dtype=np.int64))
        if sources is not None and len(set(sources[positions].tolist())) > 1:
            where = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
            raise DataError(f"rows with {where} have different sources: seg_id does not identify one source")
        for position in positions:
            others = positions[(systems[positions] != systems[position]) & candidate[positions]]
            if max_refs is not None and len(others) > max_refs:
                others = np.sort(rng.choice(others, size=max_refs, replace=False))
            out[position] = others
    return out


#: A finding "held" when at least this share of its cells goes the paper's way, "partly" above PARTLY_SHARE.
HELD_SHARE = 0.75
PARTLY_SHARE = 0.5


def share_verdict(wins: int, cells: int) -> str:
    """``held`` when ``wins / cells >= 3/4``, ``partly`` when ``> 1/2``, else ``not held`` (``n/a``: no cell)."""
    if cells == 0:
        return "n/a"
    share = wins / cells
    return "held" if share >= HELD_SHARE else "partly" if share > PARTLY_SHARE else "not held"
