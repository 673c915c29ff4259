"""Number of references (*Uncertainty-Aware MT Evaluation*, §3.4, §5.4, Tables 5-6).

WMT21 news MQM en-de has three human references, A, C and D (``txt/references/newstest2021.en-de.ref.
{A,C,D}.de``), each of them MQM-rated as a pseudo-system ``ref-X``.  Every system row of the prepared
table carries the three texts in ``refs`` in the alphabetical order of their letters
(:func:`uamt.data.loaders.load_wmt21_mqm`); :func:`reference_table` names them and checks the order
against the rated ``ref-X`` rows (whose ``mt`` *is* reference X).

Each model scores every ``<src, mt>`` once per reference (:func:`score_references`), keeping what
the §3.4 combination needs:

* models with aligned samples (``TrainedModel.aligned_samples``: ``mcd_head``, ``hts_mcd`` with
  ``mcd_scope='head'``, ``ensemble``; drawn by ``TrainedModel.sample_outputs``): the K
  aligned stochastic outputs per reference -- the same K dropout masks for every reference (the
  passes are seeded from the model's seed and the batches have the same shape for every reference)
  or the same K ensemble members -- each row's shifted by what the model's paragraph blend moves
  its μ (:func:`blend_shift`), so that their mean is the μ the model serves;
* the others (``point``, ``hts``, ``kl``, ``dup``, full-network MC dropout, whose encoder masks cannot
  be aligned across references of different lengths): the per-reference mean and standard deviation.

A reference set ``R_j`` (one per row, :func:`select_references`) is then combined by
:func:`combine_references`: the pointwise average of aligned samples
:math:`\\hat q_{jk} = |R_j|^{-1} \\sum_{r \\in R_j} \\hat q^{(r)}_{jk}` followed by the Gaussian fit of
:func:`uamt.uncertainty.samples_to_mu_sigma` (heteroscedastic samples: Eq. 4 of Zerva et al. on the
reference-averaged means and variances), or -- without samples -- the average of the per-reference
means and of the per-reference standard deviations, which is what the deployed model does with several
references (:meth:`uamt.serving.calibrated_predictor.CalibratedPredictor.raw_predict`).

Configurations of Tables 5-6: for every subset ``R`` of the references, ``single`` (|R| = 1),
``S-N`` (N < |R| references sampled per row without replacement, seeded, and combined) and ``Mul``
(all of ``R`` combined).  Each configuration is calibrated on dev rows built the same way
(:func:`uamt.experiments.common.calibrated_indicators`) and evaluated on test.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from uamt.core.config import ConfigError, check_names
from uamt.core.errors import DataError, UamtError
from uamt.experiments import paper_numbers, rendering
from uamt.experiments.common import (
    FIGURES_DIR,
    INDICATORS,
    METRICS_DIR,
    calibrated_indicators,
    fmt,
    save_figure,
    share_verdict,
    write_result,
)
from uamt.pipeline_config import PipelineConfig, check_methods

if TYPE_CHECKING:
    from uamt.encoders import EncodeConfig
    from uamt.uncertainty import EvaluationSettings

log = logging.getLogger(__name__)

NAME = "references"
FIGURE = "references_sharpness.png"

#: System names of rated human references in the WMT MQM tables (``ref-A``, ``ref-C``, ...).
REFERENCE_SYSTEM = re.compile(r"^ref-([A-Za-z0-9]+)$")

#: Combination rules of :func:`combine_references`, reported per method.
SAMPLES, HETEROSCEDASTIC_SAMPLES, MOMENTS = "samples", "heteroscedastic samples", "moments"

#: Table 5 of the paper (WMT20 en-de, references A, B, P; MCD): the comparison printed beside ours.
PAPER_TABLE5 = paper_numbers.values("references", "table5")


@dataclass(frozen=True)
class ReferencesSettings:
    """params.yaml ``exp_references:`` section.

    Attributes
    ----------
    metrics_dir, figures_dir : str
        Where ``references.json`` and ``references_sharpness.png`` go.
    dataset, lp : str
        The rows analysed (a dataset whose references are rated pseudo-systems ``ref-X``).
    references : tuple of str
        Reference names in the order of the system rows' ``refs`` (WMT21 en-de: A, C, D).
    methods : tuple of str
        Reference-based pipeline models to analyse (``models/<method>``).
    test_split, dev_split : str
        Evaluated split and the split every configuration is calibrated on.
    seed : int
        Seed of the S-N reference sampling (the same draws for every method).
    draws : int
        S-N draws averaged (each calibrated on its own dev draw).
    mc_samples : int or null
        MC-dropout passes (null: each model's own ``mc_samples``).
    """

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    dataset: str = "wmt21_mqm"
    lp: str = "en-de"
    references: tuple[str, ...] = ("A", "C", "D")
    methods: tuple[str, ...] = ("point", "mcd_head", "ensemble", "hts", "hts_mcd", "dup")
    test_split: str = "test"
    dev_split: str = "dev"
    seed: int = 13
    draws: int = 5
    mc_samples: int | None = None

    def __post_init__(self) -> None:
        where = f"exp_{NAME}"
        check_methods(self.methods, where)
        if self.draws < 1:
            raise ConfigError(f"{where}.draws={self.draws} must be >= 1")


# --------------------------------------------------------------------------- references of a frame
def read_rows(prepared_dir: str, split: str, dataset: str, lp: str) -> pd.DataFrame:
    """Rows of one dataset x LP of a prepared split (system rows and rated-reference rows)."""
    from uamt.pipeline_config import read_split

    frame = read_split(prepared_dir, split, (dataset,))
    frame = frame[frame["lp"] == lp].reset_index(drop=True)
    if frame.empty:
        raise DataError(f"{prepared_dir}/{split}.parquet: no {dataset} rows of lp {lp!r}")
    return frame


def reference_rows(frame: pd.DataFrame) -> np.ndarray:
    """Boolean mask [n_rows]: rows whose ``system`` is a rated human reference (``ref-X``)."""
    return frame["system"].astype(str).str.fullmatch(REFERENCE_SYSTEM.pattern).to_numpy()


def rated_references(frame: pd.DataFrame) -> list[str]:
    """Names X of the rated references (``system = ref-X``) present in ``frame``, sorted."""
    systems = frame.loc[reference_rows(frame), "system"].astype(str)
    return sorted({REFERENCE_SYSTEM.fullmatch(s).group(1) for s in systems})


def check_reference_names(
    names: Sequence[str], known: Sequence[str], what: str = "reference"
) -> tuple[str, ...]:
    """``names`` as a tuple; an empty, repeated or unknown name raises ValueError listing the choices."""
    return check_names(names, known, what, allow_empty=False)


def reference_table(frame: pd.DataFrame, names: Sequence[str], where: str = "table") -> pd.DataFrame:
    """The texts of the named references for every *system* row of ``frame``.

    Parameters
    ----------
    frame : DataFrame
        Canonical-table rows (``lp, seg_id, system, mt, refs``), system rows and the rated reference
        rows ``ref-X`` of the same segments.
    names : sequence of str
        The reference names in the order of the ``refs`` lists of system rows (WMT21: alphabetical,
        ``("A", "C", "D")`` for en-de).  Each must be a rated reference of ``frame``.
    where : str
        Named in error messages (file or split).

    Returns
    -------
    DataFrame, index = the system rows' index in ``frame``, one column per name (str).

    Raises
    ------
    ValueError
        A name is not a rated reference of ``frame``.
    DataError
        A system row's ``refs`` has the wrong length, or the text at a name's position differs from
        the ``mt`` of that reference's own rated row for the same segment (wrong order or names).
    """
    names = check_reference_names(names, rated_references(frame))
    is_ref = reference_rows(frame)
    systems = frame.loc[~is_ref]
    table = {name: [] for name in names}
    for index, refs in zip(systems.index, systems["refs"], strict=True):
        refs = [] if refs is None else list(refs)
        if len(refs) != len(names):
            row = systems.loc[index]
            raise DataError(
                f"{where}: row {index} (lp {row['lp']}, seg_id {row['seg_id']}, system {row['system']}): "
                f"'refs' has {len(refs)} references, expected {len(names)} ({', '.join(names)})"
            )
        for name, text in zip(names, refs, strict=True):
            table[name].append(text)
    out = pd.DataFrame(table, index=systems.index)
    # The rated reference rows carry each reference's own text: the order of `refs` must agree.
    keyed = out.assign(lp=systems["lp"].to_numpy(), seg_id=systems["seg_id"].to_numpy())
    keyed = keyed.drop_duplicates(["lp", "seg_id"]).set_index(["lp", "seg_id"])
    for index, row in frame.loc[is_ref].iterrows():
        name = REFERENCE_SYSTEM.fullmatch(str(row["system"])).group(1)
        key = (row["lp"], row["seg_id"])
        if name not in names or key not in keyed.index:
            continue
        if keyed.at[key, name] != row["mt"]:
            raise DataError(
                f"{where}: row {index} (lp {key[0]}, seg_id {key[1]}): the text of reference {name} "
                f"differs from position {names.index(name)} of the system rows' 'refs'; the reference "
                f"names {list(names)} are not in the order of 'refs'"
            )
    return out


# --------------------------------------------------------------------------- scoring per reference
@dataclass(frozen=True)
class ReferenceScores:
    """One model's predictions of the same rows with each reference, on the ``score`` scale.

    Attributes
    ----------
    method : str
    names : tuple of str
        Reference names, the second axis of every array.
    mu, sigma : ndarray [n_rows, n_refs]
        The model's own mean and standard deviation per reference (sigma NaN for ``point``).
    mu_samples : ndarray [n_rows, n_refs, K] or None
        Aligned stochastic outputs (MC-dropout pass k / ensemble member k is the same for every
        reference); None for methods combined by their moments.
    var_samples : ndarray [n_rows, n_refs, K] or None
        Per-sample predicted *variances* of heteroscedastic samples (``hts_mcd``, HTS ensembles).
    """

    method: str
    names: tuple[str, ...]
    mu: np.ndarray
    sigma: np.ndarray
    mu_samples: np.ndarray | None = None
    var_samples: np.ndarray | None = None

    @property
    def combination(self) -> str:
        if self.mu_samples is None:
            return MOMENTS
        return SAMPLES if self.var_samples is None else HETEROSCEDASTIC_SAMPLES


def score_references(
    model, frame: pd.DataFrame, references: pd.DataFrame, features, n_samples: int | None = None
) -> ReferenceScores:
    """Score every row of ``frame`` (``src``, ``mt``) with each column of ``references``.

    Parameters
    ----------
    model : uamt.models.api.TrainedModel
        A reference-based model (``load(dir)``).
    frame : DataFrame
        Rows to score, same index as ``references``.
    references : DataFrame
        One column of reference texts per name (:func:`reference_table`).
    features : callable
        The model's embedding source (``uamt.pipeline_config.open_experiment_features``).
    n_samples : int, optional
        MC-dropout passes (default: the model's ``mc_samples``).

    Returns
    -------
    ReferenceScores
    """
    if model.cfg.reference_free:
        raise UamtError(f"{model.model_dir}: a reference-free (QE) model cannot be scored per reference")
    if not frame.index.equals(references.index):
        raise DataError("frame and references must have the same index (rows of reference_table)")
    names = tuple(str(c) for c in references.columns)
    mu = np.empty((len(frame), len(names)))
    sigma = np.empty_like(mu)
    mu_samples, var_samples = [], []
    for j, name in enumerate(names):
        scored = pd.DataFrame({"src": frame["src"].to_numpy(), "mt": frame["mt"].to_numpy()})
        scored["ref"] = references[name].to_numpy()
        if "lp" in frame.columns:  # read by a head with the target-language row feature
            scored["lp"] = frame["lp"].to_numpy()
        where = f"{model.method} with reference {name}"
        if not model.aligned_samples:  # moments only: the model's own prediction
            pred = model.predict(scored, features, n_samples)
            mu[:, j] = pred["mu"].to_numpy(dtype=float)
            sigma[:, j] = pred["sigma"].to_numpy(dtype=float)
            continue
        samples = model.sample_outputs(model.encode(scored, features, where), n_samples)
        std, mean = model.scaler.std, model.scaler.mean
        q = samples[0] * std + mean + blend_shift(model, scored, features, n_samples)[:, None]
        mu_samples.append(q)
        combined = _fit_samples(
            q[:, None, :], None if samples[1] is None else samples[1][:, None, :] * std**2
        )
        mu[:, j], sigma[:, j] = combined
        if samples[1] is not None:
            var_samples.append(samples[1] * std**2)
    return ReferenceScores(
        model.method,
        names,
        mu,
        sigma,
        np.stack(mu_samples, axis=1) if mu_samples else None,
        np.stack(var_samples, axis=1) if var_samples else None,
    )


def blend_shift(model, frame: pd.DataFrame, features, n_samples: int | None = None) -> np.ndarray:
    """Per row of ``frame``, shape [n] (score scale): how far the model's paragraph blend moves its μ
    (:meth:`~uamt.models.api.TrainedModel.predict` minus ``predict_whole``; 0 on the rows it does not
    blend and for a model without a blend).  The network's aligned samples read every row whole; the
    blend moves μ only and leaves the spread the network's (:mod:`uamt.paragraphs`), so shifting a
    row's samples by it gives the samples of what the model serves."""
    blend = getattr(model, "paragraphs", None)
    if blend is None or not blend.blended_rows(frame).any():
        return np.zeros(len(frame))
    whole = model.predict_whole(frame, features, n_samples)

    def predict_whole(rows: pd.DataFrame) -> pd.DataFrame:
        # the blend reads the whole rows of ``frame`` first: those are already predicted
        return whole if rows is frame else model.predict_whole(rows, features, n_samples)

    served = blend.apply(predict_whole, frame)["mu"].to_numpy(dtype=float)
    return served - whole["mu"].to_numpy(dtype=float)


# --------------------------------------------------------------------------- combining references
def _fit_samples(mu_samples: np.ndarray, var_samples: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Reference-average aligned samples [n, |R|, K] and fit the Gaussian: (mu [n], sigma [n])."""
    from uamt.uncertainty.samples import (
        average_over_references,
        combine_heteroscedastic_samples,
        samples_to_mu_sigma,
    )

    q = average_over_references(mu_samples)
    if var_samples is None:
        return samples_to_mu_sigma(q)
    mu, sigma, _, _ = combine_heteroscedastic_samples(q, np.asarray(var_samples, dtype=float).mean(axis=1))
    return mu, sigma


def select_references(
    n_rows: int,
    n_refs: int,
    subset: Sequence[int],
    n_pick: int | None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Reference columns used for each row: int array [n_rows, N].

    ``n_pick=None`` (Mul, or single when ``subset`` has one member) uses all of ``subset`` for every
    row; otherwise each row gets ``n_pick`` members of ``subset`` drawn without replacement with
    ``rng`` (S-N).
    """
    subset = [int(s) for s in subset]
    if not subset or len(set(subset)) != len(subset) or not all(0 <= s < n_refs for s in subset):
        raise ValueError(f"subset {subset} must be distinct reference columns in [0, {n_refs})")
    if n_pick is None:
        return np.tile(np.asarray(subset, dtype=int), (n_rows, 1))
    if not 1 <= n_pick <= len(subset):
        raise ValueError(f"S-{n_pick}: cannot sample {n_pick} of {len(subset)} references")
    if rng is None:
        raise ValueError("S-N sampling needs a seeded rng")
    keys = rng.random((n_rows, len(subset)))
    order = np.argsort(keys, axis=1)[:, :n_pick]  # a uniform random n_pick-subset per row
    return np.asarray(subset, dtype=int)[order]


def combine_references(scores: ReferenceScores, selection: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Combined ``(mu, sigma)`` [n_rows] of the references ``selection`` [n_rows, N] picks per row.

    Sample-based methods: pointwise average over the N references of the K aligned samples, then
    sample mean and 1/K standard deviation (§3.4; heteroscedastic samples add the mean
    reference-averaged variance, Eq. 4 of Zerva et al.).  Otherwise: mean of the N means and mean of
    the N standard deviations.
    """
    selection = np.asarray(selection, dtype=int)
    n_rows = scores.mu.shape[0]
    if selection.ndim != 2 or selection.shape[0] != n_rows or selection.shape[1] < 1:
        raise ValueError(f"selection must be [n_rows={n_rows}, N >= 1], got shape {selection.shape}")
    rows = np.arange(n_rows)[:, None]
    if scores.mu_samples is not None:
        var = None if scores.var_samples is None else scores.var_samples[rows, selection]
        return _fit_samples(scores.mu_samples[rows, selection], var)
    return scores.mu[rows, selection].mean(axis=1), scores.sigma[rows, selection].mean(axis=1)


# --------------------------------------------------------------------------- the analysis
def set_label(names: Sequence[str]) -> str:
    """``{A, C}``: how the paper writes a reference set."""
    return "{" + ", ".join(names) + "}"


def configurations(names: Sequence[str]) -> list[tuple[tuple[str, ...], str, int | None, int]]:
    """Every (subset R, config, n_pick, n_refs used) of Tables 5-6: ``single`` for |R| = 1, else
    ``S-N`` for N = 1 .. |R| - 1 and ``Mul``; subsets in size then name order."""
    out = []
    for size in range(1, len(names) + 1):
        for subset in itertools.combinations(names, size):
            if size == 1:
                out.append((subset, "single", None, 1))
                continue
            out.extend((subset, f"S-{n}", n, n) for n in range(1, size))
            out.append((subset, "Mul", None, size))
    return out


def _rng(seed: int, split: str, subset: Sequence[str], config: str, draw: int) -> np.random.Generator:
    """The same draw for every method (so methods are compared on the same sampled references)."""
    key = zlib.crc32(f"{split}/{set_label(subset)}/{config}".encode())
    return np.random.default_rng([int(seed), key, int(draw)])


def _table(frame: pd.DataFrame, mu: np.ndarray, sigma: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "lp": frame["lp"].to_numpy(),
            "human": pd.to_numeric(frame["score"], errors="coerce").to_numpy(dtype=float),
            "mu": mu,
            "sigma": sigma,
        }
    )


def evaluate_configurations(
    test_scores: ReferenceScores,
    dev_scores: ReferenceScores,
    test_frame: pd.DataFrame,
    dev_frame: pd.DataFrame,
    *,
    seed: int = 0,
    draws: int = 1,
    settings=None,
) -> list[dict[str, Any]]:
    """Calibrated indicators of every configuration (:func:`configurations`) for one method.

    S-N configurations are drawn ``draws`` times (test and dev re-drawn together); the reported
    indicators are the mean over draws and ``std`` their standard deviation (0 for deterministic
    configurations).  ``raw_var`` is the mean uncalibrated predicted variance (score units^2).
    """
    if test_scores.names != dev_scores.names:
        raise DataError(f"test references {test_scores.names} differ from dev references {dev_scores.names}")
    if draws < 1:
        raise ValueError(f"draws={draws} must be >= 1")
    names = test_scores.names
    results = []
    for subset, config, n_pick, n_used in configurations(names):
        columns = [names.index(n) for n in subset]
        runs = []
        for draw in range(draws if n_pick is not None else 1):
            tables = {}
            for split, scores, frame in (("test", test_scores, test_frame), ("dev", dev_scores, dev_frame)):
                rng = _rng(seed, split, subset, config, draw) if n_pick is not None else None
                selection = select_references(len(frame), len(names), columns, n_pick, rng)
                mu, sigma = combine_references(scores, selection)
                tables[split] = _table(frame, mu, sigma)
            metrics = calibrated_indicators(tables["test"], tables["dev"], settings)
            raw_var = (
                float(np.nanmean(tables["test"]["sigma"] ** 2))
                if tables["test"]["sigma"].notna().any()
                else None
            )
            runs.append({**{k: metrics["avg"].get(k) for k in INDICATORS}, "raw_var": raw_var})
        summary = {}
        spread = {}
        for key in (*INDICATORS, "raw_var"):
            values = [r[key] for r in runs if r[key] is not None and math.isfinite(r[key])]
            summary[key] = float(np.mean(values)) if values else None
            spread[key] = float(np.std(values)) if len(values) > 1 else 0.0 if values else None
        results.append(
            {
                "set": list(subset),
                "config": config,
                "n_refs": n_used,
                "draws": len(runs),
                "indicators": summary,
                "std": spread,
            }
        )
    return results


def findings(methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Mul vs S-1 per method x reference set (|R| >= 2): sharper (lower calibrated sharpness and lower
    raw variance), higher PPS, lower NLL; counts over the method x set cells."""
    cells = []
    for method, block in methods.items():
        by_key = {(tuple(c["set"]), c["config"]): c["indicators"] for c in block["configs"]}
        spread = {(tuple(c["set"]), c["config"]): c["std"] for c in block["configs"]}
        for (subset, config), mul in by_key.items():
            if config != "Mul":
                continue
            s1 = by_key[(subset, "S-1")]
            cell = {"method": method, "set": list(subset), "pps_s1_draw_std": spread[(subset, "S-1")]["pps"]}
            for key in ("sharpness", "raw_var", "pps", "nll"):
                a, b = mul.get(key), s1.get(key)
                cell[f"{key}_mul"], cell[f"{key}_s1"] = a, b
                cell[f"{key}_delta"] = None if a is None or b is None else a - b
            cells.append(cell)

    def count(key: str, better) -> dict[str, int]:
        valid = [c for c in cells if c[f"{key}_delta"] is not None]
        return {"count": sum(better(c[f"{key}_delta"]) for c in valid), "of": len(valid)}

    def mean(values) -> float | None:
        values = [v for v in values if v is not None]
        return float(np.mean(values)) if values else None

    paper_gain = [v["Mul"]["pps"] - v["S-1"]["pps"] for v in PAPER_TABLE5.values()]
    paper_sharp = [v["Mul"]["sharpness"] - v["S-1"]["sharpness"] for v in PAPER_TABLE5.values()]
    return {
        "cells": cells,
        "mean_pps_gain": mean(c["pps_delta"] for c in cells),
        "mean_sharpness_change": mean(c["sharpness_delta"] for c in cells),
        "median_s1_pps_draw_std": (
            float(np.median([c["pps_s1_draw_std"] for c in cells if c["pps_s1_draw_std"] is not None]))
            if any(c["pps_s1_draw_std"] is not None for c in cells)
            else None
        ),
        "paper_mean_pps_gain": float(np.mean(paper_gain)),
        "paper_mean_sharpness_change": float(np.mean(paper_sharp)),
        "mul_sharper": count("sharpness", lambda d: d < 0),
        "mul_narrower_raw": count("raw_var", lambda d: d < 0),
        "mul_higher_pps": count("pps", lambda d: d > 0),
        "mul_lower_nll": count("nll", lambda d: d < 0),
    }


def run_references(
    models: dict[str, Any],
    test_frame: pd.DataFrame,
    dev_frame: pd.DataFrame,
    features,
    *,
    names: Sequence[str] = ("A", "C", "D"),
    seed: int = 0,
    draws: int = 5,
    n_samples: int | None = None,
    settings=None,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The whole analysis: per method, per-reference scoring of test and dev, every configuration.

    Parameters
    ----------
    models : dict
        method -> loaded model (:func:`uamt.models.api.load`).
    test_frame, dev_frame : DataFrame
        Canonical rows of one dataset x LP (system rows *and* the rated ``ref-X`` rows; the latter
        only check the reference order and are not scored).
    names : sequence of str
        Reference names in the order of ``refs``.
    """
    import time

    frames, refs = {}, {}
    for split, frame in (("test", test_frame), ("dev", dev_frame)):
        frame = frame.reset_index(drop=True)
        refs[split] = reference_table(frame, names, where=f"{split} split")
        frames[split] = frame.loc[refs[split].index]
        if frames[split].empty:
            raise DataError(f"{split} split: no system rows to score")
    names = tuple(names)
    methods = {}
    for method, model in models.items():
        started = time.perf_counter()
        scores = {
            split: score_references(model, frames[split], refs[split], features, n_samples)
            for split in ("test", "dev")
        }
        configs = evaluate_configurations(
            scores["test"],
            scores["dev"],
            frames["test"],
            frames["dev"],
            seed=seed,
            draws=draws,
            settings=settings,
        )
        methods[method] = {
            "combination": scores["test"].combination,
            "samples": None if scores["test"].mu_samples is None else int(scores["test"].mu_samples.shape[2]),
            "fixed_variance": bool(np.isnan(scores["test"].sigma).all()),
            "configs": configs,
        }
        if timings is not None:
            timings[method] = time.perf_counter() - started
        log.info("references: %s done in %.1f s", method, time.perf_counter() - started)
    return {
        "data": {
            "dataset": ", ".join(sorted(frames["test"]["dataset"].astype(str).unique())),
            "lp": ", ".join(sorted(frames["test"]["lp"].astype(str).unique())),
            "references": list(names),
            "n_test": len(frames["test"]),
            "n_dev": len(frames["dev"]),
            "n_test_segments": int(frames["test"][["lp", "seg_id"]].drop_duplicates().shape[0]),
            "systems": sorted(frames["test"]["system"].astype(str).unique().tolist()),
        },
        "settings": {"seed": int(seed), "draws": int(draws), "mc_samples": n_samples},
        "methods": methods,
        "findings": findings(methods),
    }


def write_findings(
    settings: ReferencesSettings,
    pipeline: PipelineConfig,
    encode: EncodeConfig,
    evaluation_settings: EvaluationSettings,
) -> dict[str, Path]:
    """The stage ``exp_references``: score the test and dev rows of ``settings.dataset`` x ``lp`` per
    reference with the pipeline's models, write ``references.json`` and its figure; returns their paths."""
    from uamt.experiments.common import open_experiment_features
    from uamt.pipeline_config import load_models

    models = load_models(pipeline, settings.methods)
    timings: dict[str, float] = {}
    result = run_references(
        models,
        read_rows(pipeline.prepared_dir, settings.test_split, settings.dataset, settings.lp),
        read_rows(pipeline.prepared_dir, settings.dev_split, settings.dataset, settings.lp),
        open_experiment_features(encode),
        names=settings.references,
        seed=settings.seed,
        draws=settings.draws,
        n_samples=settings.mc_samples,
        settings=evaluation_settings,
        timings=timings,
    )
    result["data"].update(test_split=settings.test_split, dev_split=settings.dev_split)
    result["runtime_s"] = {method: round(seconds, 1) for method, seconds in timings.items()}
    return {
        "result": write_result(NAME, result, settings.metrics_dir),
        "figure": save_figure(figure(result), Path(settings.figures_dir) / FIGURE),
    }


# --------------------------------------------------------------------------- report
def full_set_rows(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(method, config)`` of every method's configurations of all references (S-N and Mul, or the
    single reference when there is only one): the summary table's rows."""
    full = list(result["data"]["references"])
    rows = []
    for method, block in result["methods"].items():
        by_config = {c["config"]: c for c in block["configs"] if c["set"] == full}
        for config in [c for c in by_config if c != "single"] or ["single"]:
            rows.append((method, by_config[config]))
    return rows


def render(result: dict[str, Any]) -> str:
    """Markdown section ``## 4. Number of references`` from the JSON result (``templates/references.md.j2``)."""
    cells = result["findings"]["cells"]
    return rendering.render(
        NAME,
        result,
        indicators=INDICATORS,
        set_label=set_label,
        paper_table5=PAPER_TABLE5,
        full_set_rows=full_set_rows(result),
        largest_sets=[c for c in cells if len(c["set"]) == max(len(x["set"]) for x in cells)],
    )


def figure(result: dict[str, Any]):
    """Calibrated sharpness, raw predicted variance (relative to S-1) and PPS vs the number of references
    combined, per method, for the full reference set (S-1, S-2, ..., Mul); singletons as open markers."""
    from uamt.experiments.common import pyplot

    plt = pyplot()
    full = list(result["data"]["references"])
    panels = (
        ("sharpness", "sharpness (calibrated, z units)"),
        ("raw_var", "raw predicted variance / S-1's"),
        ("pps", "PPS"),
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for i, (method, block) in enumerate(result["methods"].items()):
        colour = colours[i % len(colours)]
        chain = sorted(
            (c for c in block["configs"] if c["set"] == full or (len(full) == 1 and c["config"] == "single")),
            key=lambda c: c["n_refs"],
        )
        singles = [c for c in block["configs"] if c["config"] == "single"]
        for ax, (key, label) in zip(axes, panels, strict=True):
            points = [(c["n_refs"], c["indicators"].get(key)) for c in chain]
            points = [(x, y) for x, y in points if y is not None]
            single = [c["indicators"].get(key) for c in singles if c["indicators"].get(key) is not None]
            if not points:
                continue
            scale = points[0][1] if key == "raw_var" and points[0][1] else 1.0
            ax.plot(
                [x for x, _ in points], [y / scale for _, y in points], marker="o", color=colour, label=method
            )
            ax.scatter(
                [1] * len(single), [y / scale for y in single], facecolors="none", edgecolors=colour, s=25
            )
            ax.set(xlabel="number of references combined", ylabel=label)
    for ax in axes:
        ax.set_xticks(range(1, len(full) + 1))
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{result['data']['dataset']} {result['data']['lp']} test, R = {set_label(full)}: "
        "S-1 ... Mul (filled), single references (open)",
        fontsize=9,
    )
    return fig


# --------------------------------------------------------------------------- summary findings


def mul_vs_sampled(
    configs: dict[str, dict[str, dict[str, float | None]]], key: str
) -> list[tuple[str, str, float]]:
    """``(set, "S-N", Mul - S-N)`` of indicator ``key`` for every reference set with a Mul row.

    ``configs`` is ``{set label: {config: {indicator: value}}}`` (ours per method, or
    :data:`PAPER_TABLE5`); cells where either value is missing are left out.
    """
    cells = []
    for subset, by_config in configs.items():
        mul = by_config.get("Mul", {}).get(key)
        for config, indicators in by_config.items():
            if not config.startswith("S-") or mul is None or indicators.get(key) is None:
                continue
            cells.append((subset, config, mul - indicators[key]))
    return cells


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(finding, what the paper reports, what we measured -- starting with held / partly / not held / n/a).

    Cells are method x reference set (|R| >= 2) x sampled configuration S-N of that set (S-1, and
    S-2 for three references), each comparing Mul with S-N on the calibrated test indicators.  A
    finding's verdict is :func:`share_verdict` of the cells that go the paper's way (strictly):
    ``held`` in >= 3/4 of them, ``partly`` in more than half, else ``not held``.  The paper's own
    cells (Table 5, MCD) are counted by the same rule for the second column.

    * Sharpness: Mul lower than S-N, over the methods with a sigma of their own (the fixed-variance
      point baseline's width is not a prediction); the raw predicted variance is quoted beside.
    * PPS and NLL: Mul's PPS higher and NLL lower, over every method (the point baseline included:
      Mul averages its mu too); the finding is ``held`` when both indicators are, ``not held`` when
      both are, else ``partly``.
    """
    methods = result["methods"]

    def ours(key: str, own_sigma_only: bool) -> list[tuple[str, str, str, float]]:
        cells = []
        for method, block in methods.items():
            if own_sigma_only and block["fixed_variance"]:
                continue
            configs: dict[str, dict[str, dict]] = {}
            for c in block["configs"]:
                configs.setdefault(set_label(c["set"]), {})[c["config"]] = c["indicators"]
            cells += [(method, *cell) for cell in mul_vs_sampled(configs, key)]
        return cells

    def tally(cells, lower_is_better: bool) -> str:
        by_config: dict[str, list[bool]] = {}
        for *_, config, delta in cells:
            by_config.setdefault(config, []).append(delta < 0 if lower_is_better else delta > 0)
        return ", ".join(f"{sum(v)}/{len(v)} vs {config}" for config, v in sorted(by_config.items()))

    def wins(cells, lower_is_better: bool) -> int:
        return sum((d < 0) if lower_is_better else (d > 0) for *_, d in cells)

    def mean(cells) -> str:
        return f"{np.mean([d for *_, d in cells]):+.3f}" if cells else "–"

    paper_cells = {k: mul_vs_sampled(PAPER_TABLE5, k) for k in ("sharpness", "pps", "nll")}
    n_sets = len(PAPER_TABLE5)
    rows = []

    sharp = ours("sharpness", own_sigma_only=True)
    raw = ours("raw_var", own_sigma_only=True)
    own = [m for m, b in methods.items() if not b["fixed_variance"]]
    verdict = share_verdict(wins(sharp, True), len(sharp))
    rows.append(
        (
            "Combining all references (Mul) gives narrower predicted intervals (lower sharpness) than "
            "sampling one (S-1) or two (S-2) of them",
            f"Table 5 (WMT20 en-de, MCD): Mul sharper in {wins(paper_cells['sharpness'], True)}/"
            f"{len(paper_cells['sharpness'])} cells ({n_sets} reference sets; S-1, S-2); mean Mul - S-N "
            f"{mean(paper_cells['sharpness'])}",
            f"{verdict}: Mul sharper in {wins(sharp, True)}/{len(sharp)} cells ({tally(sharp, True)}; "
            f"{len(own)} method(s) with their own sigma x reference sets); mean Mul - S-N "
            f"{mean(sharp)} (calibrated, z units); raw predicted variance lower in {wins(raw, True)}/{len(raw)}"
            if sharp
            else "n/a: no method with its own sigma",
        )
    )

    pps, nll = ours("pps", own_sigma_only=False), ours("nll", own_sigma_only=False)
    verdicts = (share_verdict(wins(pps, False), len(pps)), share_verdict(wins(nll, True), len(nll)))
    known = [v for v in verdicts if v != "n/a"]
    combined = (
        "n/a"
        if not known
        else "held"
        if all(v == "held" for v in known)
        else "not held"
        if all(v == "not held" for v in known)
        else "partly"
    )
    rows.append(
        (
            "Combining all references (Mul) raises PPS and lowers NLL compared with sampled references (S-N)",
            f"Table 5: PPS higher in {wins(paper_cells['pps'], False)}/{len(paper_cells['pps'])} cells "
            f"(mean {mean(paper_cells['pps'])}), NLL lower in {wins(paper_cells['nll'], True)}/"
            f"{len(paper_cells['nll'])} (mean {mean(paper_cells['nll'])})",
            f"{combined}: PPS higher in {wins(pps, False)}/{len(pps)} cells ({tally(pps, False)}; mean "
            f"{mean(pps)}; {verdicts[0]}), NLL lower in {wins(nll, True)}/{len(nll)} ({tally(nll, True)}; "
            f"mean {mean(nll)}; {verdicts[1]}); {len(methods)} method(s) x reference sets; S-1's PPS varies by "
            f"{fmt(result['findings'].get('median_s1_pps_draw_std'))} (median std) between sampling draws",
        )
    )
    return rows
