"""The served distribution calibrated per annotation campaign: for users who name whose judgements
they want predicted.

One language pair pools rows rated in different MQM campaigns (zh-en: WMT21, WMT23 and the WMT23
side-by-side re-ratings; en-de: WMT21 sentences, WMT23 paragraphs, side-by-side), whose raters use
the same scale differently at the same predicted quality: on the calibration rows the served (per LP)
90 % interval covers WMT21 zh-en 0.84 and the side-by-side en-de rows 0.99.  A calibration keyed by
``lp|campaign`` (the rows' ``dataset``) is the served family fitted the same way
(:func:`fit_campaign_calibration`: the served candidate, the point masses) on the same rows, only
with a finer key.  A user's own raters are a campaign too: rows ingested with a ``campaign``
name (:mod:`uamt.ingest`) are keyed by it, and ``prepare`` holds a share of their new documents
out of training (``prepare.pool_calibration_share``) so that they are calibration rows.  It is
served beside the per-LP one: a row whose request names a campaign
(``campaign``) that the calibration knows for its LP is answered by it
(:func:`campaign_route`), every other row as before.

:func:`measure_campaigns` puts the two side by side on the calibration rows and on test: per LP x
campaign (coverage, misses, ECE, CRPS, width, risk reliability) and on the served goals per LP
(:mod:`uamt.uncertainty.goals`), the ``metrics/campaigns.json`` the ``evaluate_campaigns`` stage
writes after ``register`` (the ``calibrate_campaigns`` stage fits the calibrations before it, since the
registered model carries them).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.serving.language_pair import UNDETERMINED_LP

log = logging.getLogger(__name__)

#: A campaign name, as ingestion accepts it (a ``campaign`` column), REST passes it on and the CLI
#: reads it: letters, digits, ``_``, ``-``, ``.``; published campaigns are dataset names.
CAMPAIGN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: What a bad name is told.
CAMPAIGN_NAME_RULE = "letters, digits, '_', '-' or '.', at most 64, starting with a letter or digit"

#: Joins a language pair and a campaign into one calibration key.
CAMPAIGN_SEPARATOR = "|"
#: The risk threshold whose reliability is reported per campaign.
CAMPAIGN_RISK_CHI = "-5"


def campaign_key(lp: str, campaign: str) -> str:
    """The calibration key of rows of ``lp`` rated in ``campaign``: ``lp|campaign``."""
    return f"{lp}{CAMPAIGN_SEPARATOR}{campaign}"


def row_campaigns(table: pd.DataFrame) -> pd.Series:
    """Each row's campaign: the ``campaign`` it names (a user's raters, from the annotation pool:
    :mod:`uamt.ingest`), else its ``dataset`` (a published campaign)."""
    from uamt.core.columns import filled

    dataset = table["dataset"].astype(str)
    if "campaign" not in table.columns:
        return dataset
    return pd.Series(np.where(filled(table["campaign"]), table["campaign"].astype(str).str.strip(), dataset),
                     index=table.index)  # fmt: skip


def campaign_keys(table: pd.DataFrame) -> pd.Series:
    """Each row's calibration key, ``lp|campaign`` (:func:`row_campaigns`)."""
    return table["lp"].astype(str) + CAMPAIGN_SEPARATOR + row_campaigns(table)


def known_campaigns(calibration) -> dict[str, list[str]]:
    """``{lp: [campaign, ...]}`` with a calibration of their own in a campaign-keyed ``calibration``."""
    out: dict[str, list[str]] = {}
    for key in calibration.known_lps:
        lp, _, campaign = key.partition(CAMPAIGN_SEPARATOR)
        if campaign:
            out.setdefault(lp, []).append(campaign)
    return {lp: sorted(c) for lp, c in sorted(out.items())}


#: Fewest calibration rows a campaign needs for a calibration of its own (``calibrate_campaigns.min_rows``).
#: ``benchmarks/campaign_rows.py`` (HTS, WMT21 zh-en, whole documents drawn from its 3,986 rows, two
#: draws each; test coverage@0.9 / ECE / width, per-LP 0.816 / 0.099 / 13.9): 161 rows 0.931 / 0.053 /
#: 90.9 MQM (a per-key variance fit gone wild), 352 rows 0.875 / 0.022 / 14.3, 915 rows 0.886 / 0.019 / 16.5.
DEFAULT_MIN_CAMPAIGN_ROWS = 300


def fit_keys(rows: pd.DataFrame, min_rows: int) -> pd.Series:
    """The group each calibration row is fitted in: its ``lp|campaign`` key (:func:`campaign_keys`)
    where that key has at least ``min_rows`` rows, else its plain LP (a group that is no campaign,
    never served).  So every key that is served, and each of its parts (the rows below the point
    mass at the top, say), is fitted exactly as without a minimum."""
    keys = campaign_keys(rows)
    return keys.where(keys.map(keys.value_counts()) >= int(min_rows), rows["lp"].astype(str))


def fit_campaign_calibration(
    rows: pd.DataFrame,
    method: str | None,
    settings,
    bounds,
    min_rows: int = DEFAULT_MIN_CAMPAIGN_ROWS,
    sigma_weight: float | None = None,
):
    """The calibrate stage's fit (:func:`~uamt.serving.model_calibration.fit_calibration` and the served
    point masses, :func:`~uamt.serving.model_calibration.attach_distribution`) of the calibration
    ``rows`` (predictions: ``lp, dataset, human, mu, sigma``; ``campaign`` where rows name one) keyed
    by ``lp|campaign`` (:func:`campaign_keys`).  A key with fewer than ``min_rows`` rows (or
    ``settings.min_lp_rows``, if more) gets no calibration of its own: it is not served
    (:func:`campaigns_below_minimum` names them).  ``sigma_weight``: the λ the served calibration
    chose (:class:`~uamt.uncertainty.tempering.SigmaTempering`, medians per key), so a campaign is
    served the model's σ with the weight its LP is; None: σ as the model gave it."""
    from uamt.serving.model_calibration import (
        attach_distribution,
        fit_calibration,
        is_fixed_variance,
        with_model_sigma,
        with_sigma_tempering,
    )
    from uamt.uncertainty.tempering import SigmaTempering

    minimum = max(int(min_rows), int(settings.min_lp_rows))
    keyed = rows.assign(lp=fit_keys(rows, minimum))
    tempering = None
    if sigma_weight is not None and not (method is not None and is_fixed_variance(method)):
        keyed = with_model_sigma(keyed, method) if method is not None else keyed
        tempering = SigmaTempering.fit(keyed["sigma"], keyed["lp"].to_numpy(dtype=object), sigma_weight)
        keyed = tempering.applied(keyed)
    calibration, _ = fit_calibration(keyed, method, settings=settings, source="campaigns")
    # fitted on the tempered rows, so the tempering is set only afterwards (else σ would be tempered
    # twice); at λ = 0 those rows hold one σ per key, which is what gets them their grid in μ
    # (:func:`~uamt.serving.model_calibration.with_rearrangement`)
    calibration = with_sigma_tempering(attach_distribution(calibration, keyed, method, settings, bounds), tempering)
    below = campaigns_below_minimum(rows, calibration)
    if below:  # a request naming one is told why it has no calibration (campaign_route)
        calibration.too_few_rows = {"min_rows": minimum, "keys": below}
    return calibration


class LPAnchor:
    r"""Fits a campaign's calibration anchored on its LP's served one: an ``anchor`` for
    :func:`~uamt.serving.model_calibration.refit_served` (``benchmarks/campaign_rows.py --fit``).

    Each ``lp|campaign`` key keeps its LP's mu -> human slope (:math:`\beta_{LP} = s_h / s_p` of the
    LP in ``served``) and fits only its level and spread: its rows map mu to
    :math:`\bar h_k + \beta_{LP} (\hat\mu - \bar\mu_k)`, in units of its own human std.  With
    ``shape``, the candidate's per-group parameters (bins, quantiles, variance model) are its LP's
    too: a campaign is then its LP's distribution moved to its level and scaled to its spread (two
    numbers, plus its own point mass at the top).  Both parts of a distribution with a point mass
    at the top follow the matching part of ``served``.
    """

    def __init__(self, served, *, shape: bool = False) -> None:
        self.served = served
        self.shape = shape

    def _parent(self, part: str):
        below = self.served.below_top
        return below if part == "below_top" and below is not None else self.served

    def standardizer(self, standardizer, arrays, part: str) -> None:
        lps = self._parent(part).standardizer.lp_params
        for key, params in standardizer.lp_params.items():
            parent = lps.get(key.partition(CAMPAIGN_SEPARATOR)[0])
            if parent is None:
                continue
            slope = parent["human_std"] / parent["pred_std"]
            mu = arrays.mu[arrays.lp == key]
            params.update(
                pred_mean=float(np.mean(mu)),
                pred_std=params["human_std"] / slope,
                mu_intercept=0.0,
                mu_slope=float(np.std(mu)) * slope / params["human_std"],  # on the z scale, as fitted ones
            )

    def candidate(self, candidate, part: str) -> None:
        if not self.shape:
            return
        import copy

        parent = self._parent(part).served
        for mine, theirs in ((candidate, parent), (getattr(candidate, "variance", None), getattr(parent, "variance", None))):
            if mine is None or theirs is None:
                continue
            for key in list(mine.lp_params):
                lp = key.partition(CAMPAIGN_SEPARATOR)[0]
                if lp in theirs.lp_params:
                    mine.lp_params[key] = copy.deepcopy(theirs.lp_params[lp])


def campaigns_below_minimum(rows: pd.DataFrame, keyed) -> dict[str, int]:
    """``{lp|campaign: calibration rows}`` of the keys of ``rows`` that the campaign-keyed
    calibration ``keyed`` does not serve (too few rows: :func:`fit_campaign_calibration`)."""
    counts = campaign_keys(rows).value_counts()
    known = set(keyed.known_lps)
    return {str(key): int(n) for key, n in sorted(counts.items()) if key not in known}


def ask_as_served(served, keyed, table: pd.DataFrame, settings, bounds):
    """The answers a request naming each row's campaign gets (:func:`campaign_route`): the
    campaign-keyed calibration's where it serves the row's ``lp|campaign``, the per-LP ``served``
    one for every other row (a campaign under the minimum is refused, and a request without a
    campaign gets the LP's calibration)."""
    from uamt.model_evaluation import ask
    from uamt.uncertainty.served import ServedRows

    keys = campaign_keys(table).to_numpy()
    mine = np.isin(keys, list(keyed.known_lps))
    parts = []
    if mine.any():
        parts.append((np.flatnonzero(mine), ask(keyed, table[mine].assign(lp=keys[mine]), settings, bounds)))
    if (~mine).any():
        parts.append((np.flatnonzero(~mine), ask(served, table[~mine], settings, bounds)))
    return parts[0][1] if len(parts) == 1 else ServedRows.stack(parts, len(table))


def keyed_reference_factors(factors: dict[int, dict[str, float]], keys) -> dict[int, dict[str, float]]:
    """The per-LP reference factors (``{k: {lp: factor}}``, fitted on dev's multi-reference rows,
    which name no campaign) carried over to each ``lp|campaign`` key of ``keys``: a row scored against
    several references gets its LP's factor whichever campaign it names."""
    out = {}
    for k, by_lp in factors.items():
        out[k] = {key: by_lp[key.partition(CAMPAIGN_SEPARATOR)[0]] for key in keys if key.partition(CAMPAIGN_SEPARATOR)[0] in by_lp}
    return out


def campaign_route(lps, campaigns, calibration, row_label: str = "row") -> tuple[np.ndarray, np.ndarray]:
    """Which rows the campaign-keyed ``calibration`` answers, and their keys.

    ``lps``, ``campaigns`` (shape [n]; None / NaN / empty: not given).  A row naming a campaign must
    also name its LP, and ``lp|campaign`` must be a key with a calibration of its own: otherwise a
    :class:`~uamt.core.errors.DataError` names the row and what is known (a campaign the
    calibration never saw would silently get the per-LP answer).  ``calibration`` None: refused for
    any row that names a campaign.  Returns ``(mask [n] bool, keys [n] object)``."""
    n = len(campaigns)
    mask = np.zeros(n, dtype=bool)
    keys = np.empty(n, dtype=object)
    known = set(calibration.known_lps) if calibration is not None else set()
    for i, (lp, campaign) in enumerate(zip(lps if lps is not None else [None] * n, campaigns, strict=True)):
        if campaign is None or (isinstance(campaign, float) and np.isnan(campaign)) or str(campaign).strip() == "":
            continue
        if calibration is None:
            raise DataError(f"{row_label} {i}: campaign {campaign!r} given, but this model has no per-campaign calibration")
        if lp is None or (isinstance(lp, float) and np.isnan(lp)):
            raise DataError(f"{row_label} {i}: campaign {campaign!r} needs the row's lp (campaigns are calibrated per language pair)")
        if str(lp) == UNDETERMINED_LP:
            raise DataError(
                f"{row_label} {i}: campaign {campaign!r} needs the row's language pair, but its text contradicts "
                f"the lp given (or no pair could be told from it), so it is scored as an unseen pair "
                f"({UNDETERMINED_LP!r}); check --lp or the row's lp column, or score it without a campaign"
            )
        key = campaign_key(str(lp), str(campaign))
        few = calibration.too_few_rows.get("keys", {})
        if key not in known and key in few:
            raise DataError(
                f"{row_label} {i}: campaign {campaign!r} is not served for lp {lp!r}: it had "
                f"{few[key]} calibration rows, fewer than the {calibration.too_few_rows['min_rows']} this "
                f"model serves a campaign from (calibrate_campaigns.min_rows); ingest more of its judgements "
                f"and retrain, or score these rows without a campaign for the {lp} calibration"
            )
        if key not in known:
            raise DataError(
                f"{row_label} {i}: campaign {campaign!r} has no calibration for lp {lp!r}; "
                f"known: {known_campaigns(calibration).get(str(lp), [])} (all: {known_campaigns(calibration)})"
            )
        mask[i], keys[i] = True, key
    return mask, keys


def _campaign_records(full: dict[str, Any], split: str, label: str, gamma: float) -> list[dict[str, Any]]:
    """One record per LP x campaign of a served-metrics result grouped by campaign key, at the
    interval level ``gamma`` (``evaluate.coverage_gamma``)."""
    tag = f"{gamma:g}"
    out = []
    for key, m in full.items():
        if key in ("avg", "worst_cells"):
            continue
        lp, _, dataset = key.partition(CAMPAIGN_SEPARATOR)
        out.append({
            "split": split, "calibration": label, "lp": lp, "campaign": dataset, "n": m["n"],
            "coverage": m[f"coverage@{tag}"], "miss_below": m[f"miss_below@{tag}"],
            "miss_above": m[f"miss_above@{tag}"], "width": m[f"width@{tag}"], "ece": m["ece"], "crps": m["crps"],
            f"risk_max_gap@{CAMPAIGN_RISK_CHI}": m["risk"][CAMPAIGN_RISK_CHI]["max_gap"],
        })
    return out


def measure_campaigns(served, keyed, rows: pd.DataFrame, test: pd.DataFrame, settings, bounds) -> dict[str, Any]:
    """The per-LP ``served`` calibration and the campaign-keyed ``keyed`` one
    (:func:`fit_campaign_calibration`) on the calibration ``rows`` (in sample) and on ``test``:

    ``campaigns``: records per split x calibration x LP x campaign; ``goals``: per calibration, the
    served goals per LP on test (:func:`~uamt.uncertainty.goals.goal_rows`: cells per LP x
    quintile, the LP's ECE floor from the served calibration's effective calibration rows) and
    ``summary`` (coverage, width, CRPS on test).  ``rows`` and ``test``: predictions tables with
    ``dataset``, the model's sigma (:func:`~uamt.serving.model_calibration.with_model_sigma`)."""
    from uamt.model_evaluation import ask, dev_effective_sizes, measure, row_documents, served_settings
    from uamt.uncertainty.goals import goal_rows, served_summary
    from uamt.uncertainty.served import served_metrics

    n_eff = dev_effective_sizes(served, rows, settings, bounds)
    records: list[dict[str, Any]] = []
    goals: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    choices = (
        ("per_lp", served, lambda t: ask(served, t, settings, bounds)),
        ("per_campaign", keyed, lambda t: ask_as_served(served, keyed, t, settings, bounds)),
    )
    for label, calibration, answer in choices:
        for split, table in (("calibration", rows), ("test", test)):
            answers = answer(table)
            by_campaign = served_metrics(
                answers, table["human"].to_numpy(float), campaign_keys(table).to_numpy(),
                docs=row_documents(table), settings=served_settings(settings),
            )
            records += _campaign_records(by_campaign, split, label, settings.coverage_gamma)
            if split == "test":
                full = measure(served, answers, table, settings, dev_n_eff=n_eff)
                block = served_summary(
                    full, None, served=calibration.selected, rule=settings.calibration_rule,
                    known_lps=served.known_lps, settings=served_settings(settings),
                )
                goals[label] = goal_rows(block)
                summary[label] = {"coverage": block["coverage"], "width": block["width"], "crps": full["avg"]["crps"]}
    return {"known_campaigns": known_campaigns(keyed), "campaigns": records, "goals": goals, "summary": summary}


#: Where the calibrate_campaigns stage writes ``<model>.json`` (the per-campaign calibrations).
CAMPAIGN_CALIBRATION_DIR = "calibration_campaigns"
#: Artifact name of a registered model's per-campaign calibration.
CAMPAIGNS_ARTIFACT = "campaigns"


def served_models(pipe) -> list[str]:
    """The pipeline models that are registered and served: ``pipeline.register_method`` and the QE
    model of ``pipeline.register_qe_method``."""
    from uamt.core.naming import qe_model_name

    models = [pipe.register_method]
    if pipe.register_qe_method is not None:
        models.append(qe_model_name(pipe.register_qe_method))
    return models


def fit_served_campaigns(
    pipe, settings, calibration_dir, out_dir, min_rows: int, model: str, _inputs=None
) -> Path:
    """One model of :func:`calibrate_campaigns`: its campaign-keyed calibration, fitted on the rows its
    served calibration was fitted on, with the served candidate pinned, saved as ``<out_dir>/<model>.json``."""
    from uamt.data.datasets import scale_bounds
    from uamt.model_evaluation import calibration_rows, pinned
    from uamt.serving.model_calibration import Calibration

    served = Calibration.load(Path(calibration_dir) / f"{model}.json")
    rows = calibration_rows(pipe, model, served.calibrated_on)
    weight = None if served.sigma_tempering is None else served.sigma_tempering.weight
    # The served family, not the one the rule would pick on the keyed rows: a campaign is answered
    # by its LP's distribution with a finer key (and the rule's cross-fitting of every candidate was
    # ~70 % of this stage's fit).
    keyed = fit_campaign_calibration(
        rows, model, pinned(settings, served.selected), scale_bounds(pipe.datasets), min_rows, sigma_weight=weight
    )
    below = keyed.too_few_rows.get("keys", {})
    if below:
        log.warning(
            "calibrate_campaigns: %s: not served, fewer than %d calibration rows (calibrate_campaigns.min_rows): %s",
            model, min_rows, below,
        )
    keyed.calibrated_on = served.calibrated_on
    keyed.reference_factors = keyed_reference_factors(served.reference_factors, keyed.known_lps)
    keyed.risk_lattice = dict(served.risk_lattice)  # the same scale, read on the same lattice
    path = Path(out_dir) / f"{model}.json"
    keyed.save(path)
    return path


def calibrate_campaigns(
    pipe, settings, calibration_dir, out_dir, min_rows: int = DEFAULT_MIN_CAMPAIGN_ROWS
) -> dict[str, Path]:
    """Fit each served model's campaign-keyed calibration (:func:`fit_served_campaigns`) in
    ``pipe.workers`` processes; a campaign with fewer than ``min_rows`` calibration rows is left
    unserved (logged as a warning, recorded in the file).  Returns ``{model: path}``.  What the
    calibrations do on the calibration rows and on test is measured after ``register``
    (:func:`evaluate_campaigns`): no gate reads it."""
    import functools

    from uamt.core.parallel import map_in_processes

    models = served_models(pipe)
    fit = functools.partial(fit_served_campaigns, pipe, settings, calibration_dir, out_dir, int(min_rows))
    return dict(zip(models, map_in_processes(fit, models, pipe.workers), strict=True))


def measure_served_campaigns(pipe, settings, calibration_dir, campaigns_dir, model: str, _inputs=None) -> dict[str, Any]:
    """One model of :func:`evaluate_campaigns`: :func:`measure_campaigns` of its served calibration
    and its campaign-keyed one, with ``below_min_rows`` where the keyed one left a campaign unserved."""
    from uamt.data.datasets import scale_bounds
    from uamt.model_evaluation import calibration_rows
    from uamt.serving.model_calibration import Calibration, with_model_sigma

    served = Calibration.load(Path(calibration_dir) / f"{model}.json")
    keyed = Calibration.load(Path(campaigns_dir) / f"{model}.json")
    rows = calibration_rows(pipe, model, served.calibrated_on)
    test = pd.read_parquet(Path(pipe.predictions_dir) / "test" / f"{model}.parquet")
    out = measure_campaigns(
        served, keyed, with_model_sigma(rows, model), with_model_sigma(test, model), settings, scale_bounds(pipe.datasets)
    )
    below = keyed.too_few_rows.get("keys", {})
    if below:  # only when some campaign is left out, so a file without any keeps its bytes
        out["below_min_rows"] = {"min_rows": int(keyed.too_few_rows["min_rows"]), "campaigns": below}
    return out


def evaluate_campaigns(pipe, settings, calibration_dir, campaigns_dir, metrics_path) -> dict[str, Any]:
    """Write :func:`measure_served_campaigns` of every served model (in ``pipe.workers`` processes)
    to ``metrics_path``; returns the metrics."""
    import functools

    from uamt.core.parallel import map_in_processes
    from uamt.uncertainty import write_json_atomic

    models = served_models(pipe)
    measure = functools.partial(measure_served_campaigns, pipe, settings, calibration_dir, campaigns_dir)
    metrics = dict(zip(models, map_in_processes(measure, models, pipe.workers), strict=True))
    Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(metrics, metrics_path)
    return metrics

