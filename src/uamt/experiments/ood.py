"""Out-of-domain sharpness (*Better Uncertainty Quantification*, Fig. 1 and App. E / Fig. 5).

Question: does a method's uncertainty rise when the input leaves the training domain?  The paper
trains on news MQM and compares sharpness (mean predicted variance, Eq. 12) on WMT21 news (in domain)
with WMT21 TED talks (out of domain): DUP's sharpness rises on TED for EN-DE and EN-RU but not for
ZH-EN, HTS stays the same, and MC dropout *drops* in every LP.

Inputs are what the pipeline's ``evaluate`` stage wrote:

* ``metrics/test.json`` / ``metrics/ood.json``: ``method -> {avg, lp} -> {sharpness, pps, ece, ...}``,
  every split calibrated with the standardisation + affine sigma^2 fitted on the news ``dev`` split,
  so the sharpness is in dev-standardised units (z units);
* ``predictions/{test,ood}/<method>.parquet``: the raw ``mu, sigma`` on the training score scale
  (MQM points).  The calibrated variance is ``alpha * sigma_z^2 + beta`` with the dev fit
  (``calibration/<method>.json``), so its relative change can differ from the raw one; both are
  reported, the raw one with a bootstrap CI, and the share of ``beta`` (the part of the calibrated
  variance that no input can move) in the in-domain sharpness.

Relative change = (TED - news) / news.  A change within ``+-flat_tolerance`` counts as *flat*,
above it as a *rise*, below it as a *drop*.  The paper's methods map to ours as DUP -> ``dup``,
HTS -> ``hts``, MCD -> ``mcd_head`` (our MC dropout runs in the head on cached embeddings; the
paper's also runs through the encoder).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.experiments import paper_numbers, rendering
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, pyplot, read_json, save_figure, write_result
from uamt.experiments.rendering import maybe, section_number

if TYPE_CHECKING:
    from uamt.pipeline_config import PipelineConfig

NAME = "ood"
FIGURE = "ood_sharpness.png"
IN, OUT = "in", "out"
#: The metrics of the calibration-transfer table (from metrics/{test,ood}.json).
#: Scored on the served distribution: CRPS is its proper score (NLL exists only for a Gaussian one).
TRANSFER_METRICS = ("pps", "ece", "crps", "coverage@0.9")
#: A calibration whose constant beta is at least this share of the in-domain sharpness is "nearly
#: constant": its calibrated sharpness can hardly move, whatever the model predicts.
CONSTANT_SHARE = 0.9
#: Raw variance components reported apart where a method gives them (both variances).
COMPONENTS = ("epistemic", "aleatoric")

#: The paper's methods in Fig. 1 / Fig. 5 and ours that implement them.
PAPER_METHODS = {"dup": "DUP", "hts": "HTS", "mcd_head": "MCD"}
#: What App. E reports per method and LP: the direction of sharpness from news to TED.
#: "not rise" = the rise seen elsewhere does not hold (App. E: ZH-EN, where aleatoric noise is higher).
PAPER_EXPECTED = paper_numbers.values("ood", "expected_direction")
PAPER_TEXT = paper_numbers.entry("ood", "expected_direction")["text"]
FINDING_TEXT = {
    "dup": "DUP's uncertainty rises out of domain",
    "hts": "HTS's uncertainty stays flat out of domain",
    "mcd_head": "MC dropout's uncertainty drops out of domain",
}


@dataclass(frozen=True)
class OodSettings:
    """params.yaml ``exp_ood:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``ood.json`` and ``ood_sharpness.png`` go.
    flat_tolerance : float
        A relative sharpness change within +-this counts as flat (neither rise nor drop).
    n_boot : int
        Bootstrap resamples for the CI of the raw-variance change (0 = none).
    seed : int
        Seed of the bootstrap.
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    flat_tolerance: float = 0.10
    n_boot: int = 1000
    seed: int = 13


# ----------------------------------------------------------------------------- computation


def relative_change(before: float | None, after: float | None) -> float | None:
    """``(after - before) / |before|``; None when either is missing or ``before`` is 0."""
    if before is None or after is None or not (math.isfinite(before) and math.isfinite(after)):
        return None
    if before == 0:
        return None
    return (after - before) / abs(before)


def shift_direction(change: float | None, tolerance: float) -> str | None:
    """``"rise"`` / ``"flat"`` / ``"drop"`` for a relative change, with ``|change| <= tolerance`` flat."""
    if change is None:
        return None
    if change > tolerance:
        return "rise"
    if change < -tolerance:
        return "drop"
    return "flat"


def expectation_held(expected: str, observed: str | None) -> bool | None:
    """Whether an observed direction matches the paper's (``"not rise"`` = flat or drop)."""
    if observed is None:
        return None
    if expected == "not rise":
        return observed in ("flat", "drop")
    return observed == expected


def _finite(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[np.isfinite(values)]


def bootstrap_change_ci(
    values_in: np.ndarray, values_out: np.ndarray, n_boot: int, seed: int, level: float = 0.95
) -> list[float] | None:
    """Percentile bootstrap CI of ``mean(out) / mean(in) - 1`` (segments resampled in each split).

    Segments are resampled independently, which ignores document clustering: the CI is a lower bound
    on the real uncertainty of the change.  None when a split has no finite value or ``n_boot < 1``.
    """
    values_in, values_out = _finite(values_in), _finite(values_out)
    if n_boot < 1 or values_in.size == 0 or values_out.size == 0:
        return None
    rng = np.random.default_rng(seed)
    # Means of resamples = multinomial counts @ values / n: one matrix product per split.
    means_in = rng.multinomial(values_in.size, np.full(values_in.size, 1 / values_in.size), n_boot)
    means_out = rng.multinomial(values_out.size, np.full(values_out.size, 1 / values_out.size), n_boot)
    ratio = (means_out @ values_out / values_out.size) / (means_in @ values_in / values_in.size) - 1
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(ratio, [tail, 100 - tail])
    return [float(low), float(high)]


def _check_table(table: pd.DataFrame, where: str) -> None:
    missing = {"lp", "human", "mu", "sigma"} - set(table.columns)
    if missing:
        raise DataError(f"{where}: predictions table lacks column(s) {sorted(missing)}")
    if table.empty:
        raise DataError(f"{where}: predictions table has no rows")


def _per_lp_means(table: pd.DataFrame, values: np.ndarray, lps: list[str]) -> dict[str, float | None]:
    """Mean of ``values`` per LP and their macro average (None where no finite value)."""
    out: dict[str, float | None] = {}
    for lp in lps:
        chosen = _finite(values[(table["lp"] == lp).to_numpy()])
        out[lp] = float(chosen.mean()) if chosen.size else None
    present = [v for v in out.values() if v is not None]
    out["avg"] = float(np.mean(present)) if len(present) == len(lps) and present else None
    return out


def _in_out_block(
    before: dict[str, float | None], after: dict[str, float | None], tolerance: float
) -> dict[str, dict[str, Any]]:
    block = {}
    for key in before:
        change = relative_change(before[key], after.get(key))
        block[key] = {
            IN: before[key],
            OUT: after.get(key),
            "change": change,
            "direction": shift_direction(change, tolerance),
        }
    return block


def ood_analysis(
    test_metrics: dict[str, dict],
    ood_metrics: dict[str, dict],
    test_tables: dict[str, pd.DataFrame],
    ood_tables: dict[str, pd.DataFrame],
    *,
    flat_tolerance: float = 0.10,
    n_boot: int = 1000,
    seed: int = 13,
    calibrations: dict[str, dict] | None = None,
    in_domain: str = "news",
    out_domain: str = "TED",
) -> dict[str, Any]:
    """Sharpness in vs out of domain per method x LP, raw variance shifts and calibration transfer.

    Parameters
    ----------
    test_metrics, ood_metrics : dict
        ``metrics/test.json`` and ``metrics/ood.json``: ``method -> {"avg", lp} -> indicators``
        (calibrated on the in-domain dev split).
    test_tables, ood_tables : dict of DataFrame
        ``method -> predictions table`` (``lp, human, mu, sigma`` [, ``epistemic, aleatoric``]) on
        the training score scale; ``sigma`` may be all NaN (the point estimate).
    flat_tolerance : float
        ``|relative change| <= flat_tolerance`` counts as flat.
    n_boot, seed : int
        Bootstrap resamples (0 = no CI) and their seed, for the raw-variance change.
    calibrations : dict, optional
        ``method -> calibration/<method>.json`` (the dev fit): gives ``alpha, beta`` per LP and the
        share of ``beta`` in the in-domain calibrated sharpness.

    Returns
    -------
    dict
        ``methods``, ``lps``, ``n`` (rows per split and LP), ``sharpness`` (calibrated, z units) and
        ``raw_var`` (mean sigma^2, score units^2; with ``ci``) and ``sq_error`` (mean (human - mu)^2,
        the actual error the variance should follow) as ``method -> lp|avg -> {in, out, change,
        direction}``; ``components`` (epistemic / aleatoric where given); ``calibration``
        (``method -> lp -> {alpha, beta, beta_share}``, with ``calibrations``); ``transfer``
        (``method -> lp|avg -> metric -> {in, out}``); ``comparison`` with the paper's expectations.

    Raises
    ------
    DataError
        A method missing from one of the inputs, or a predictions table without ``lp, human, mu, sigma``.
    """
    if not (0 <= flat_tolerance < 1):
        raise ValueError(f"flat_tolerance={flat_tolerance} must be in [0, 1)")
    methods = [m for m in ood_metrics if m in test_metrics]
    if not methods:
        raise DataError("no method is in both the in-domain and the out-of-domain metrics")
    for method in methods:
        for tables, split in ((test_tables, "test"), (ood_tables, "ood")):
            if method not in tables:
                raise DataError(f"predictions/{split}/{method}.parquet: missing; run `dvc repro evaluate`")
            _check_table(tables[method], f"predictions/{split}/{method}.parquet")
    lps = sorted(
        {lp for m in methods for lp in ood_metrics[m] if lp != "avg"}
        & {lp for m in methods for lp in test_metrics[m] if lp != "avg"}
    )
    if not lps:
        raise DataError("no language pair is in both the in-domain and the out-of-domain metrics")
    first = methods[0]
    n = {
        IN: {lp: int((test_tables[first]["lp"] == lp).sum()) for lp in lps},
        OUT: {lp: int((ood_tables[first]["lp"] == lp).sum()) for lp in lps},
    }
    sharpness, raw_var, sq_error, components, transfer = {}, {}, {}, {}, {}
    for method in methods:
        cal_in = {key: (test_metrics[method].get(key) or {}).get("sharpness") for key in (*lps, "avg")}
        cal_out = {key: (ood_metrics[method].get(key) or {}).get("sharpness") for key in (*lps, "avg")}
        sharpness[method] = _in_out_block(cal_in, cal_out, flat_tolerance)

        table_in, table_out = test_tables[method], ood_tables[method]
        var_in = table_in["sigma"].to_numpy(dtype=float) ** 2
        var_out = table_out["sigma"].to_numpy(dtype=float) ** 2
        block = _in_out_block(
            _per_lp_means(table_in, var_in, lps), _per_lp_means(table_out, var_out, lps), flat_tolerance
        )
        for offset, lp in enumerate(lps):
            mask_in, mask_out = (table_in["lp"] == lp).to_numpy(), (table_out["lp"] == lp).to_numpy()
            block[lp]["ci"] = bootstrap_change_ci(var_in[mask_in], var_out[mask_out], n_boot, seed + offset)
        raw_var[method] = block

        err_in = (table_in["human"].to_numpy(dtype=float) - table_in["mu"].to_numpy(dtype=float)) ** 2
        err_out = (table_out["human"].to_numpy(dtype=float) - table_out["mu"].to_numpy(dtype=float)) ** 2
        sq_error[method] = _in_out_block(
            _per_lp_means(table_in, err_in, lps), _per_lp_means(table_out, err_out, lps), flat_tolerance
        )

        given = [c for c in COMPONENTS if c in table_in.columns and c in table_out.columns]
        components[method] = {
            c: _in_out_block(
                _per_lp_means(table_in, table_in[c].to_numpy(dtype=float), lps),
                _per_lp_means(table_out, table_out[c].to_numpy(dtype=float), lps),
                flat_tolerance,
            )
            for c in given
            if np.isfinite(table_in[c].to_numpy(dtype=float)).any()
        }
        transfer[method] = {
            key: {
                metric: {
                    IN: (test_metrics[method].get(key) or {}).get(metric),
                    OUT: (ood_metrics[method].get(key) or {}).get(metric),
                }
                for metric in TRANSFER_METRICS
            }
            for key in (*lps, "avg")
        }

    calibration = {
        method: {lp: affine_parameters(calibrations[method], lp, sharpness[method][lp][IN]) for lp in lps}
        for method in methods
        if calibrations and method in calibrations and not calibrations[method].get("fixed")
    }

    comparison = []
    for method, expected_by_lp in PAPER_EXPECTED.items():
        if method not in sharpness:
            continue
        for lp in lps:
            expected = expected_by_lp.get(lp)
            if expected is None:
                continue
            cell = sharpness[method][lp]
            comparison.append(
                {
                    "method": method,
                    "paper_method": PAPER_METHODS[method],
                    "lp": lp,
                    "expected": expected,
                    "observed": cell["direction"],
                    "change": cell["change"],
                    "raw_change": raw_var[method][lp]["change"],
                    "raw_observed": raw_var[method][lp]["direction"],
                    "held": expectation_held(expected, cell["direction"]),
                    "raw_held": expectation_held(expected, raw_var[method][lp]["direction"]),
                }
            )
    return {
        "in_domain": in_domain,
        "out_domain": out_domain,
        "methods": methods,
        "lps": lps,
        "n": n,
        "flat_tolerance": flat_tolerance,
        "n_boot": n_boot,
        "sharpness": sharpness,
        "raw_var": raw_var,
        "sq_error": sq_error,
        "components": components,
        "calibration": calibration,
        "transfer": transfer,
        "comparison": comparison,
    }


def affine_parameters(calibration: dict[str, Any], lp: str, sharpness: float | None) -> dict[str, Any]:
    """``alpha, beta`` of the dev-fitted affine sigma^2 calibration for ``lp`` (global fallback) and
    ``beta_share`` = beta / calibrated sharpness: the part of the mean calibrated variance that is a
    constant, the same for every input (near 1: the calibrated sharpness cannot shift out of domain)."""
    try:
        affine = calibration["affine_variance"]
        fitted = (affine.get("lps") or {}).get(lp) or affine["global"]
        alpha, beta = float(fitted["alpha"]), float(fitted["beta"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"calibration: no affine_variance alpha/beta for {lp!r} ({exc})") from exc
    share = None if not sharpness else min(beta / sharpness, 1.0)
    return {"alpha": alpha, "beta": beta, "beta_share": share}


def read_inputs(
    metrics_dir: str | Path, predictions_dir: str | Path, calibration_dir: str | Path
) -> tuple[dict, dict, dict[str, pd.DataFrame], dict[str, pd.DataFrame], dict[str, dict]]:
    """``metrics/{test,ood}.json``, ``predictions/{test,ood}/<method>.parquet`` and
    ``calibration/<method>.json`` of every method in ``ood.json``; a missing file is a DataError
    naming the stage that writes it."""
    metrics = {split: read_json(Path(metrics_dir) / f"{split}.json", "evaluate") for split in ("test", "ood")}
    tables: dict[str, dict[str, pd.DataFrame]] = {"test": {}, "ood": {}}
    for split in tables:
        for method in metrics["ood"]:
            path = Path(predictions_dir) / split / f"{method}.parquet"
            if not path.is_file():
                raise DataError(f"{path}: missing; run `dvc repro evaluate` first")
            tables[split][method] = pd.read_parquet(path)
    calibrations = {m: read_json(Path(calibration_dir) / f"{m}.json", "calibrate") for m in metrics["ood"]}
    return metrics["test"], metrics["ood"], tables["test"], tables["ood"], calibrations


def write_findings(settings: OodSettings, pipeline: PipelineConfig) -> dict[str, Path]:
    """The stage ``exp_ood``: compare the pipeline's test and OOD metrics and predictions, write
    ``ood.json`` and ``ood_sharpness.png``; returns their paths."""
    from uamt.pipeline_config import CALIBRATION_DIR

    test_metrics, ood_metrics, test_tables, ood_tables, calibrations = read_inputs(
        pipeline.metrics_dir, pipeline.predictions_dir, CALIBRATION_DIR
    )
    result = ood_analysis(
        test_metrics,
        ood_metrics,
        test_tables,
        ood_tables,
        flat_tolerance=settings.flat_tolerance,
        n_boot=settings.n_boot,
        seed=settings.seed,
        calibrations=calibrations,
    )
    return {
        "result": write_result(NAME, result, settings.metrics_dir),
        "figure": plot_sharpness(result, Path(settings.figures_dir) / FIGURE),
    }


# ----------------------------------------------------------------------------- figure


def plot_sharpness(result: dict[str, Any], path: str | Path) -> Path:
    """Grouped bars per LP: calibrated sharpness (top) and raw mean sigma^2 (bottom), news vs TED."""
    plt = pyplot()
    methods, lps = result["methods"], result["lps"]
    fig, axes = plt.subplots(2, len(lps), figsize=(4.2 * len(lps), 6.4), squeeze=False)
    x = np.arange(len(methods))
    width = 0.38
    rows = (
        ("sharpness", "calibrated sharpness (z units)"),
        ("raw_var", "raw mean $\\sigma^2$ (score units$^2$, log)"),
    )
    for row, (key, label) in enumerate(rows):
        for col, lp in enumerate(lps):
            ax = axes[row][col]
            for shift, side, colour, name in (
                (-width / 2, IN, "tab:blue", result["in_domain"]),
                (width / 2, OUT, "tab:red", result["out_domain"]),
            ):
                values = [result[key][m][lp][side] for m in methods]
                ax.bar(
                    x + shift, [np.nan if v is None else v for v in values], width, color=colour, label=name
                )
            for i, method in enumerate(methods):
                change = result[key][method][lp]["change"]
                top = max(
                    v for v in (result[key][method][lp][IN], result[key][method][lp][OUT], 0) if v is not None
                )
                if change is not None:
                    ax.annotate(f"{change:+.0%}", (i, top), ha="center", va="bottom", fontsize=7)
            ax.set_xticks(x, methods, rotation=30, fontsize=8)
            ax.set_title(f"{lp}: {label.split(' (')[0]}", fontsize=9)
            if col == 0:
                ax.set_ylabel(label, fontsize=8)
            if key == "raw_var":  # heads' MC / ensemble spread is orders of magnitude below HTS/DUP's
                ax.set_yscale("log")
            ax.margins(y=0.15)
    axes[0][0].legend(fontsize=8)
    return save_figure(fig, path)


# ----------------------------------------------------------------------------- report


def _pct(value: float | None) -> str:
    return maybe(value, "+.0%")


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(finding, what the paper reports, what we measured -- starting with held / not held / partly)."""
    rows = []
    for method, text in FINDING_TEXT.items():
        cells = [c for c in result["comparison"] if c["method"] == method]
        if not cells:
            continue
        held = [c["held"] for c in cells if c["held"] is not None]
        verdict = "n/a" if not held else "held" if all(held) else "not held" if not any(held) else "partly"
        measured = ", ".join(f"{c['lp']} {_pct(c['change'])} ({c['observed']})" for c in cells)
        raw = ", ".join(f"{c['lp']} {_pct(c['raw_change'])} ({c['raw_observed']})" for c in cells)
        rows.append((text, PAPER_TEXT[method], f"{verdict}: calibrated sharpness {measured}; raw σ² {raw}"))
    return rows


def render_context(result: dict[str, Any]) -> dict[str, Any]:
    """What ``templates/ood.md.j2`` needs beyond the result: constants and the selections its text names."""
    from uamt.models.specs import baseline_method

    methods = result["methods"]
    constant = [
        m
        for m, by_lp in result.get("calibration", {}).items()
        if by_lp and all((v["beta_share"] or 0) >= CONSTANT_SHARE for v in by_lp.values())
    ]
    ece = [
        (m, result["transfer"][m]["avg"]["ece"][IN], result["transfer"][m]["avg"]["ece"][OUT])
        for m in methods
        if result["transfer"][m]["avg"]["ece"][OUT] is not None
    ]
    return {
        "section": section_number(NAME),
        "figure": FIGURE,
        "transfer_metrics": TRANSFER_METRICS,
        "paper_methods": list(PAPER_EXPECTED),
        "paper_names": PAPER_METHODS,
        "component_rows": [
            (method, name, lp, block[lp])
            for method in methods
            for name, block in result["components"].get(method, {}).items()
            for lp in result["lps"]
        ],
        "constant": constant,
        "constant_shares": [v["beta_share"] for m in constant for v in result["calibration"][m].values()],
        # Does the actual error grow out of domain? (What a faithful epistemic estimate should follow.)
        "error_ref": baseline if (baseline := baseline_method()) in result["sq_error"] else methods[0],
        "ranked": sorted(
            (m for m in methods if result["raw_var"][m]["avg"]["change"] is not None),
            key=lambda m: result["raw_var"][m]["avg"]["change"],
            reverse=True,
        ),
        "ece": ece,
        "ece_worse": [m for m, before, after in ece if before is not None and after > before],
        "ece_best": min(ece, key=lambda item: item[2]) if ece else None,
    }


def render(result: dict[str, Any]) -> str:
    """The markdown section of reports/experiments.md (``templates/ood.md.j2``)."""
    return rendering.render(NAME, result, **render_context(result))
