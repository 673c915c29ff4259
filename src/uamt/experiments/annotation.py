"""Active annotation: does choosing rows by epistemic sigma teach the model more per annotation?

Simulation on real data: the ``d_e`` rows of ``datasets`` are the unlabelled pool (labels hidden,
revealed when "annotated"), the model starts from a random seed set of ``seed_rows`` rows and
``steps`` batches of ``batch_rows`` rows are added by each strategy of
:func:`uamt.decisions.annotation.select_rows` (``random``, ``uncertainty``, ``diversity`` =
uncertainty with diversity over documents and LPs).  After every batch the learner is retrained
from scratch and measured on the fixed **test** split of the same datasets: PPS (Pearson of mu and
human), Gaussian NLL and the AUROC of P(Q <= chi) for bad segments (human <= chi).  ``seeds``
repetitions (seed set, random batches and learner initialisation) give the bands.

The learner -- the cheapest honest one, not the pipeline's models, retrained from scratch after
every batch -- reads the pipeline's frozen sentence embeddings (``encode.encoder``) from its
cache (the mean over its layers), COMET-style features ``[mt, ref, mt*ref, |mt-ref|, mt*src, |mt-src|]`` reduced to their
``components`` leading principal components (fitted on the unlabelled pool).  ``bayes_linear``
(default): heteroscedastic Bayesian linear regression (:func:`fit_bayes_linear`), whose epistemic
variance is the exact posterior variance of its mean; ``mlp_ensemble``: a deep ensemble of
``members`` heteroscedastic MLP heads (:func:`fit_ensemble`; ~40x slower on CPU), epistemic = the
variance of the members' means.  Metrics are on the human scale, of the learner's own Gaussian
N(mu, aleatoric + epistemic), uncalibrated.

Annotation efficiency: for each seed, the annotated rows a strategy needs to reach the PPS random
selection has at its largest budget (linear interpolation of its curve; not reached = reported as
such), divided by that budget.  The goal of the issue is a ratio <= 0.6.

New domain (``domain:``, :func:`simulate_domain`): the learner starts from **all** news ``d_q``
rows of ``datasets`` (the rows the product's base model is trained on -- the state a deployment
is in when a new domain arrives; the main simulation's 500-row seed set would instead measure
learning from scratch).  Each dataset of ``domain.datasets`` (split ``ood``: TED, biomedical) is
split **by document**, per LP, into an unlabelled pool and held-out evaluation rows (about
``domain.eval_share`` of each LP's rows; a seed draws the split, so the bands cover which
documents are held out).  Domain rows are annotated up to each cumulative budget of
``domain.budgets`` by each strategy (the retrain fits news + annotated domain rows together, as
the retrain loop appends incoming annotations to the training pool), and after every batch the
learner is measured on the evaluation rows: coverage of the central ``domain.level`` interval of
its Gaussian N(mu, aleatoric + epistemic) -- uncalibrated, as in the main simulation: the product
calibrates on dev rows, which a new domain lacks -- and PPS.  The plateau is the PPS with the
whole pool annotated; :func:`domain_thresholds` gives the annotations at which coverage first
reaches and stays in ``level +- domain.coverage_tolerance`` and PPS first reaches plateau -
``domain.pps_margin``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.core.stats import pearson_or_none, pearson_r
from uamt.decisions.annotation import STRATEGIES, select_rows
from uamt.experiments import rendering
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, save_figure, write_result
from uamt.experiments.rendering import section_number

NAME = "annotation"
FIGURE = "annotation_curves.png"
DOMAIN_FIGURE = "annotation_domain.png"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewDomainSettings:
    """params.yaml ``exp_annotation.domain:``: the new-domain simulation (empty ``datasets`` = off)."""

    datasets: tuple[str, ...] = ("ted_mqm", "bio_mqm")
    #: Cumulative annotated domain rows after each batch (strictly increasing; budgets beyond a
    #: seed's pool are dropped, the whole pool is always the last point).
    budgets: tuple[int, ...] = (50, 100, 200, 400, 800, 1600, 3200, 6400)
    eval_share: float = 0.33
    level: float = 0.9
    coverage_tolerance: float = 0.03
    pps_margin: float = 0.05
    #: Per-LP thresholds only where an LP has at least this many evaluation rows in every seed.
    min_lp_eval_rows: int = 200

    def __post_init__(self):
        if any(b < 1 for b in self.budgets) or any(b >= c for b, c in zip(self.budgets[:-1], self.budgets[1:], strict=True)):
            raise ValueError(f"domain.budgets={list(self.budgets)} must be positive and strictly increasing")
        for name in ("eval_share", "level"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"domain.{name}={getattr(self, name)} must lie in (0, 1)")


@dataclass(frozen=True)
class AnnotationSettings:
    """params.yaml ``exp_annotation:`` section."""

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR
    datasets: tuple[str, ...] = ("wmt21_mqm", "wmt23_mqm")
    strategies: tuple[str, ...] = STRATEGIES
    seed_rows: int = 500
    batch_rows: int = 250
    steps: int = 8
    seeds: int = 5
    learner: str = "bayes_linear"
    components: int = 256
    ridge: float = 100.0
    members: int = 5
    hidden: int = 64
    epochs: int = 30
    learning_rate: float = 1e-3
    chi: float = -5.0
    max_test_rows: int | None = None
    domain: NewDomainSettings = field(default_factory=NewDomainSettings)


# ----------------------------------------------------------------------------------------------
# Features and the learner


def sentence_embeddings(features, texts: list[str], chunk: int = 4096) -> np.ndarray:
    """Mean over the encoder's layers of each text's cached embedding, float32 [n, dim]."""
    parts = [np.asarray(features(texts[i : i + chunk]), dtype=np.float32).mean(axis=1) for i in range(0, len(texts), chunk)]
    return np.concatenate(parts) if parts else np.zeros((0, 1), np.float32)


def comet_features(src: np.ndarray, mt: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``[mt, ref, mt*ref, |mt-ref|, mt*src, |mt-src|]`` per row, float32 [n, 6 dim]."""
    return np.concatenate([mt, ref, mt * ref, np.abs(mt - ref), mt * src, np.abs(mt - src)], axis=1).astype(np.float32)


def row_features(frame: pd.DataFrame, features) -> np.ndarray:
    """:func:`comet_features` of a table's ``src, mt, ref`` (each distinct text embedded once)."""
    texts = pd.unique(pd.concat([frame["src"], frame["mt"], frame["ref"]]).astype(str)).tolist()
    table = sentence_embeddings(features, texts)
    index = {t: i for i, t in enumerate(texts)}
    get = lambda column: table[[index[t] for t in frame[column].astype(str)]]  # noqa: E731
    return comet_features(get("src"), get("mt"), get("ref"))


LEARNERS = ("bayes_linear", "mlp_ensemble")


def principal_components(x: np.ndarray, k: int, seed: int = 0, sample: int = 5000):
    """A map ``x -> k`` leading principal components of the standardised ``x`` (fitted on at most
    ``sample`` rows of it: the unlabelled pool, never the test rows)."""
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-6
    rows = np.random.default_rng(seed).choice(len(x), size=min(sample, len(x)), replace=False)
    _, _, vt = np.linalg.svd((x[rows] - mean) / std, full_matrices=False)
    basis = vt[: min(k, vt.shape[0])].T.astype(np.float32)
    return lambda values: (((values - mean) / std) @ basis).astype(np.float32)


def fit_bayes_linear(x: np.ndarray, y: np.ndarray, *, ridge: float, seed: int = 0, **_):
    """Heteroscedastic Bayesian linear regression; returns ``x -> (mu, aleatoric var, epistemic var)``.

    Two ridge fits give the noise model: the mean, then log squared residuals (+1.27, the mean of
    log chi^2_1, so that exp of it estimates the variance).  The weights' posterior under a
    N(0, I / ridge) prior (features standardised on the labelled rows) with those noise variances is
    exact: mu = x w, epistemic var = x' Sigma x -- the model's uncertainty about its own mean, which
    shrinks where labelled rows lie.  ``seed`` is unused (the fit is deterministic).
    """
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-6
    y_mean, y_scale = float(y.mean()), float(y.std() or 1.0)

    def design(values):
        z = (values - mean) / std
        return np.concatenate([z, np.ones((len(z), 1), np.float32)], axis=1).astype(np.float64)

    z = design(x)
    t = (y - y_mean) / y_scale
    eye = ridge * np.eye(z.shape[1])
    w0 = np.linalg.solve(z.T @ z + eye, z.T @ t)
    log_r2 = np.log((t - z @ w0) ** 2 + 1e-6) + 1.27
    g = np.linalg.solve(z.T @ z + eye, z.T @ log_r2)
    noise = np.exp(np.clip(z @ g, -10, 5))
    precision = (z / noise[:, None]).T @ z + eye
    sigma_w = np.linalg.inv(precision)
    w = sigma_w @ (z.T @ (t / noise))

    def predict(values: np.ndarray):
        zn = design(values)
        mu = zn @ w * y_scale + y_mean
        aleatoric = np.exp(np.clip(zn @ g, -10, 5)) * y_scale**2
        # x' Sigma x row by row through a matrix product (numpy's einsum of the same is ~15x slower).
        epistemic = ((zn @ sigma_w) * zn).sum(axis=1) * y_scale**2
        return mu, aleatoric, epistemic

    return predict


def fit_ensemble(x: np.ndarray, y: np.ndarray, *, members: int, hidden: int, epochs: int, learning_rate: float, seed: int, **_):
    """Train ``members`` heteroscedastic MLP heads at once (batched weights); returns a predict
    function ``x -> (mu, aleatoric var, epistemic var)`` on the scale of ``y``."""
    import torch

    torch.manual_seed(seed)
    mean, scale = float(y.mean()), float(y.std() or 1.0)
    feat_mean, feat_std = x.mean(axis=0), x.std(axis=0) + 1e-6
    xt = torch.from_numpy((x - feat_mean) / feat_std)
    yt = torch.from_numpy(((y - mean) / scale).astype(np.float32))
    d = x.shape[1]
    w1 = torch.nn.Parameter(torch.randn(members, d, hidden) / np.sqrt(d))
    b1 = torch.nn.Parameter(torch.zeros(members, 1, hidden))
    w2 = torch.nn.Parameter(torch.randn(members, hidden, 2) / np.sqrt(hidden))
    b2 = torch.nn.Parameter(torch.zeros(members, 1, 2))
    params = [w1, b1, w2, b2]
    optimiser = torch.optim.Adam(params, lr=learning_rate, weight_decay=1e-4)

    generator = torch.Generator().manual_seed(seed)
    n = xt.shape[0]
    for _ in range(epochs):
        # Each member sees its own shuffle (bootstrap-free deep ensemble: different init and order).
        order = torch.stack([torch.randperm(n, generator=generator) for _ in range(members)])
        for start in range(0, n, 64):
            rows = order[:, start : start + 64]
            xb = xt[rows]  # [m, b, d]
            h = torch.relu(torch.einsum("mbd,mdh->mbh", xb, w1) + b1)
            out = torch.einsum("mbh,mho->mbo", torch.nn.functional.dropout(h, 0.1, True), w2) + b2
            mu, var = out[..., 0], torch.nn.functional.softplus(out[..., 1]) + 1e-3
            loss = (0.5 * torch.log(var) + 0.5 * (yt[rows] - mu) ** 2 / var).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()

    def predict(x_new: np.ndarray):
        with torch.no_grad():
            batch = torch.from_numpy((x_new - feat_mean) / feat_std)
            h = torch.relu(torch.einsum("nd,mdh->mnh", batch, w1) + b1)
            out = torch.einsum("mnh,mho->mno", h, w2) + b2
            mu_m = out[..., 0].numpy() * scale + mean
            var_m = (torch.nn.functional.softplus(out[..., 1]) + 1e-3).numpy() * scale**2
        return mu_m.mean(axis=0), var_m.mean(axis=0), mu_m.var(axis=0)

    return predict


# ----------------------------------------------------------------------------------------------
# Metrics and the simulation


def auroc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve of ``score`` for ``positive`` (ties count half); None without both classes."""
    from scipy.stats import rankdata

    positive = np.asarray(positive, bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return None
    ranks = rankdata(score)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def test_metrics(mu: np.ndarray, var: np.ndarray, human: np.ndarray, chi: float) -> dict[str, float | None]:
    """PPS, Gaussian NLL and the bad-segment AUROC of P(Q <= chi) under N(mu, var)."""
    from scipy.stats import norm

    risk = norm.cdf((chi - mu) / np.sqrt(var))
    return {
        "pps": pearson_r(mu, human),
        "nll": float(np.mean(0.5 * np.log(2 * np.pi * var) + (human - mu) ** 2 / (2 * var))),
        "bad_auroc": auroc(risk, human <= chi),
    }


def simulate(
    pool_x: np.ndarray,
    pool_y: np.ndarray,
    pool_docs: np.ndarray,
    pool_lps: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    settings: AnnotationSettings,
) -> dict[str, Any]:
    """Learning curves ``{strategy: {"rows": [...], "pps": [[seed x step]], "nll": ..., "bad_auroc": ...}}``."""
    if settings.learner not in LEARNERS:
        raise ValueError(f"learner={settings.learner!r} not supported; choose from {sorted(LEARNERS)}")
    learner = fit_bayes_linear if settings.learner == "bayes_linear" else fit_ensemble
    curves: dict[str, Any] = {}
    fit = dict(
        members=settings.members, hidden=settings.hidden, epochs=settings.epochs,
        learning_rate=settings.learning_rate, ridge=settings.ridge,
    )
    for strategy in settings.strategies:
        runs = {"pps": [], "nll": [], "bad_auroc": []}
        for seed in range(settings.seeds):
            rng = np.random.default_rng(1000 + seed)
            labelled = np.zeros(pool_y.size, bool)
            labelled[rng.choice(pool_y.size, size=settings.seed_rows, replace=False)] = True
            per_seed = {k: [] for k in runs}
            rows = []
            for step in range(settings.steps + 1):
                predict = learner(pool_x[labelled], pool_y[labelled], seed=seed, **fit)
                mu, aleatoric, epistemic = predict(test_x)
                for key, value in test_metrics(mu, aleatoric + epistemic, test_y, settings.chi).items():
                    per_seed[key].append(value)
                rows.append(int(labelled.sum()))
                if step == settings.steps:
                    break
                sigma = np.sqrt(predict(pool_x)[2]) if strategy != "random" else np.zeros(pool_y.size)
                chosen = select_rows(
                    sigma, settings.batch_rows, strategy=strategy, docs=pool_docs, lps=pool_lps,
                    seed=10_000 * seed + step, exclude=labelled,
                )
                labelled[chosen] = True
            for key in runs:
                runs[key].append(per_seed[key])
            log.info("%s seed %d: PPS %s", strategy, seed, np.round(per_seed["pps"], 3).tolist())
        curves[strategy] = {"rows": rows, **runs}
    return curves


def rows_to_reach(rows: list[int], values: list[float], target: float) -> float | None:
    """Annotated rows at which a learning curve first reaches ``target`` (linear interpolation), or None."""
    for k, value in enumerate(values):
        if value >= target:
            if k == 0:
                return float(rows[0])
            previous = values[k - 1]
            return float(rows[k - 1] + (rows[k] - rows[k - 1]) * (target - previous) / (value - previous))
    return None


def efficiency(curves: dict[str, Any]) -> dict[str, Any]:
    """Per strategy and seed: rows to reach random's final PPS of the same seed / random's final rows."""
    if "random" not in curves:
        return {}
    random = curves["random"]
    final_rows = random["rows"][-1]
    out = {}
    for strategy, curve in curves.items():
        ratios = []
        for seed, values in enumerate(curve["pps"]):
            reached = rows_to_reach(curve["rows"], values, random["pps"][seed][-1])
            ratios.append(None if reached is None else reached / final_rows)
        finite = [r for r in ratios if r is not None]
        out[strategy] = {
            "ratios": ratios,
            "mean": float(np.mean(finite)) if len(finite) == len(ratios) else None,
            "band": [float(min(finite)), float(max(finite))] if finite else None,
            "reached": len(finite),
            "seeds": len(ratios),
        }
    return out


def summarise(curves: dict[str, Any]) -> dict[str, Any]:
    """Mean and min-max band over seeds of every metric at every step."""
    out = {}
    for strategy, curve in curves.items():
        block = {"rows": curve["rows"]}
        for key in ("pps", "nll", "bad_auroc"):
            values = np.array([[np.nan if v is None else v for v in seed] for seed in curve[key]], dtype=float)
            block[key] = {
                "mean": np.nanmean(values, axis=0).tolist(),
                "low": np.nanmin(values, axis=0).tolist(),
                "high": np.nanmax(values, axis=0).tolist(),
            }
        out[strategy] = block
    return out


# ----------------------------------------------------------------------------------------------
# The new-domain case


def document_split(docs, lps, share: float, seed: int) -> np.ndarray:
    """Boolean mask of the held-out evaluation rows: per LP, whole documents in a seeded random order,
    each taken when it brings the held-out rows closer to ``share`` of the LP's rows (the smallest
    one when none does), always leaving one document in the pool.  A TED talk is 400-2,400 rows, so "until at
    least ``share``" would hold out up to half of an LP; closest-to-the-share keeps it near ``share``.

    An LP with a single document cannot be split by document and stays wholly in the pool.  No
    document is ever on both sides (a document id shared by two LPs is split as one document).
    """
    docs = pd.Series(list(docs)).astype(str).to_numpy()
    lps = pd.Series(list(lps)).astype(str).to_numpy()
    rng = np.random.default_rng(seed)
    held = np.zeros(docs.size, bool)
    for lp in sorted(set(lps.tolist())):
        in_lp = lps == lp
        names, counts = np.unique(docs[in_lp], return_counts=True)
        if names.size < 2:
            continue
        target = share * in_lp.sum()
        taken, chosen = 0, 0
        for k in rng.permutation(names.size):
            if chosen == names.size - 1:
                break
            if abs(taken + counts[k] - target) >= abs(taken - target):
                continue
            held |= in_lp & (docs == names[k])
            taken, chosen = taken + counts[k], chosen + 1
        if not chosen:  # every document is over twice the share: hold out the smallest
            held |= in_lp & (docs == names[np.argmin(counts)])
    # A document id that occurs in two LPs goes wholly to evaluation if any of its rows does.
    return np.isin(docs, np.unique(docs[held]))


def coverage_score(mu: np.ndarray, var: np.ndarray, human: np.ndarray, level: float) -> float:
    """Share of ``human`` inside the central ``level`` interval of N(mu, var)."""
    from scipy.stats import norm

    half = norm.ppf(0.5 + level / 2) * np.sqrt(var)
    return float(np.mean(np.abs(human - mu) <= half))


def domain_metrics(mu, var, human, lps, level: float) -> dict[str, Any]:
    """Coverage at ``level`` and PPS, pooled and per LP (PPS None for an LP with constant scores)."""

    def one(rows):
        return {
            "coverage": coverage_score(mu[rows], var[rows], human[rows], level),
            "pps": pearson_or_none(mu[rows], human[rows]),
            "rows": int(rows.sum()),
        }

    lps = np.asarray(lps).astype(str)
    out = one(np.ones(human.size, bool))
    out["lps"] = {lp: one(lps == lp) for lp in sorted(set(lps.tolist()))}
    return out


def simulate_domain(
    news_x: np.ndarray,
    news_y: np.ndarray,
    pool_x: np.ndarray,
    pool_y: np.ndarray,
    pool_docs: np.ndarray,
    pool_lps: np.ndarray,
    eval_x: np.ndarray,
    eval_y: np.ndarray,
    eval_lps: np.ndarray,
    settings: AnnotationSettings,
    seed: int,
) -> dict[str, Any]:
    """One seed of the new-domain case: the learner fitted on the news rows plus the annotated pool rows.

    Returns ``{"rows": [0, budgets within the pool..., pool size], "strategies": {strategy: [metrics per
    point]}}``; the first point (news only) and the last (whole pool: the plateau) are the same fit for
    every strategy.
    """
    if settings.learner not in LEARNERS:
        raise ValueError(f"learner={settings.learner!r} not supported; choose from {sorted(LEARNERS)}")
    learner = fit_bayes_linear if settings.learner == "bayes_linear" else fit_ensemble
    fit = dict(
        members=settings.members, hidden=settings.hidden, epochs=settings.epochs,
        learning_rate=settings.learning_rate, ridge=settings.ridge, seed=seed,
    )
    level = settings.domain.level

    def train(labelled: np.ndarray):
        return learner(
            np.concatenate([news_x, pool_x[labelled]]), np.concatenate([news_y, pool_y[labelled]]), **fit
        )

    def measure(predict):
        mu, aleatoric, epistemic = predict(eval_x)
        return domain_metrics(mu, aleatoric + epistemic, eval_y, eval_lps, level)

    budgets = [b for b in settings.domain.budgets if b < pool_y.size]
    rows = [0, *budgets, int(pool_y.size)]
    start = train(np.zeros(pool_y.size, bool))
    zero = measure(start)
    plateau = measure(train(np.ones(pool_y.size, bool)))
    out: dict[str, Any] = {"rows": rows, "strategies": {}}
    for strategy in settings.strategies:
        labelled = np.zeros(pool_y.size, bool)
        predict = start
        points = [zero]
        for step, budget in enumerate(budgets):
            sigma = np.sqrt(predict(pool_x)[2]) if strategy != "random" else np.zeros(pool_y.size)
            chosen = select_rows(
                sigma, budget - int(labelled.sum()), strategy=strategy, docs=pool_docs, lps=pool_lps,
                seed=10_000 * seed + step, exclude=labelled,
            )
            labelled[chosen] = True
            predict = train(labelled)
            points.append(measure(predict))
        points.append(plateau)
        out["strategies"][strategy] = points
        log.info(
            "domain seed %d %s: coverage %s PPS %s", seed, strategy,
            [round(p["coverage"], 3) for p in points], [None if p["pps"] is None else round(p["pps"], 3) for p in points],
        )
    return out


def reach_and_stay(rows: list[int], values: list[float | None], low: float, high: float) -> int | None:
    """The first of ``rows`` from which every value lies in ``[low, high]`` (None: never, or the last is out)."""
    first = None
    for k in range(len(values) - 1, -1, -1):
        if values[k] is None or not low <= values[k] <= high:
            break
        first = rows[k]
    return first


def _spread(values: list[float | None]) -> dict[str, Any]:
    finite = [v for v in values if v is not None]
    return {
        "per_seed": values,
        "mean": float(np.mean(finite)) if finite and len(finite) == len(values) else None,
        "band": [float(min(finite)), float(max(finite))] if finite else None,
        "reached": len(finite),
        "seeds": len(values),
    }


def domain_thresholds(runs: list[dict[str, Any]], domain: NewDomainSettings, lp: str | None = None) -> dict[str, Any]:
    """Per strategy, over seeds: annotations at which coverage first reaches and stays in ``level +-
    coverage_tolerance`` (a budget point) and PPS first reaches the seed's plateau - ``pps_margin``
    (linear interpolation, as :func:`rows_to_reach`); ``lp`` = that LP's evaluation rows."""
    low, high = domain.level - domain.coverage_tolerance, domain.level + domain.coverage_tolerance
    pick = (lambda point: point) if lp is None else (lambda point: point["lps"][lp])
    out = {}
    for strategy in runs[0]["strategies"]:
        coverage, pps = [], []
        for run in runs:
            points = [pick(p) for p in run["strategies"][strategy]]
            coverage.append(reach_and_stay(run["rows"], [p["coverage"] for p in points], low, high))
            curve = [-math.inf if p["pps"] is None else p["pps"] for p in points]
            target = points[-1]["pps"]
            pps.append(None if target is None else rows_to_reach(run["rows"], curve, target - domain.pps_margin))
        out[strategy] = {"coverage": _spread(coverage), "pps": _spread(pps)}
    return out


def summarise_domain(runs: list[dict[str, Any]], domain: NewDomainSettings) -> dict[str, Any]:
    """Mean and min-max band over seeds at the budgets every seed reached, plus the start and plateau."""
    common = min(len(run["rows"]) for run in runs) - 1  # the budget points shared by every seed
    rows = runs[0]["rows"][:common]

    def spread(values):
        values = np.array([np.nan if v is None else v for v in values], dtype=float)
        return {"mean": float(np.nanmean(values)), "low": float(np.nanmin(values)), "high": float(np.nanmax(values))}

    strategies = list(runs[0]["strategies"])
    # The first point (news only) and the last (whole pool) are one fit shared by every strategy.
    first = [run["strategies"][strategies[0]] for run in runs]

    def block(pick):
        return {
            "start": {k: spread([pick(points[0])[k] for points in first]) for k in ("coverage", "pps")},
            "plateau": {k: spread([pick(points[-1])[k] for points in first]) for k in ("coverage", "pps")},
            "curves": {
                s: {k: [spread([pick(run["strategies"][s][j])[k] for run in runs]) for j in range(common)] for k in ("coverage", "pps")}
                for s in strategies
            },
        }

    # An LP is reported where every seed holds out at least min_lp_eval_rows of its rows.
    eligible = [
        lp for lp in sorted(first[0][0]["lps"])
        if all(points[0]["lps"].get(lp, {"rows": 0})["rows"] >= domain.min_lp_eval_rows for points in first)
    ]
    return {
        "rows": rows,
        "pool_rows": spread([run["rows"][-1] for run in runs]),
        **block(lambda point: point),
        "thresholds": domain_thresholds(runs, domain),
        "lps": {lp: {**block(lambda point, lp=lp: point["lps"][lp]), "thresholds": domain_thresholds(runs, domain, lp)} for lp in eligible},
    }


def domain_findings(news: pd.DataFrame, news_test: pd.DataFrame, ood: pd.DataFrame, features, settings: AnnotationSettings) -> dict[str, Any]:
    """The ``domain`` block of ``annotation.json``: every dataset of ``settings.domain``, every seed."""
    domain = settings.domain
    news_raw, test_raw = row_features(news, features), row_features(news_test, features)
    news_y, test_y = news["score"].to_numpy(float), news_test["score"].to_numpy(float)
    learner = fit_bayes_linear if settings.learner == "bayes_linear" else fit_ensemble
    fit = dict(
        members=settings.members, hidden=settings.hidden, epochs=settings.epochs,
        learning_rate=settings.learning_rate, ridge=settings.ridge,
    )
    out: dict[str, Any] = {
        "settings": dataclasses.asdict(domain),
        "start": {"datasets": list(settings.datasets), "split": "d_q", "rows": int(len(news))},
        "datasets": {},
    }
    for name in domain.datasets:
        frame = ood[ood["dataset"] == name].reset_index(drop=True)
        if frame.empty:
            raise DataError(f"exp_annotation.domain.datasets: {name!r} has no rows in the ood split (have {sorted(ood['dataset'].unique())})")
        raw = row_features(frame, features)
        y = frame["score"].to_numpy(float)
        docs, lps = frame["doc"].astype(str).to_numpy(), frame["lp"].astype(str).to_numpy()
        runs, sizes, news_test_points = [], [], []
        for seed in range(settings.seeds):
            held = document_split(docs, lps, domain.eval_share, seed=2000 + seed)
            pool = ~held
            if not held.any():
                raise DataError(f"{name}: no LP has two documents; cannot hold documents out for evaluation")
            project = (
                principal_components(np.concatenate([news_raw, raw[pool]]), settings.components, seed=seed)
                if settings.components else (lambda values: values)
            )
            news_x, x = project(news_raw), project(raw)
            run = simulate_domain(
                news_x, news_y, x[pool], y[pool], docs[pool], lps[pool], x[held], y[held], lps[held], settings, seed,
            )
            runs.append(run)
            # The news-only learner on news test: its in-domain coverage, the reference for the shift.
            mu, aleatoric, epistemic = learner(news_x, news_y, seed=seed, **fit)(project(test_raw))
            news_test_points.append(domain_metrics(mu, aleatoric + epistemic, test_y, news_test["lp"].astype(str).to_numpy(), domain.level))
            sizes.append({
                "pool": int(pool.sum()), "eval": int(held.sum()),
                "pool_docs": int(len(set(docs[pool]))), "eval_docs": int(len(set(docs[held]))),
            })
        out["datasets"][name] = {
            "sizes": sizes,
            "lps": sorted(set(lps.tolist())),
            "news_test": {k: float(np.mean([p[k] for p in news_test_points])) for k in ("coverage", "pps")},
            "runs": runs,
            "summary": summarise_domain(runs, domain),
        }
    return out


def usable(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows with a reference and a finite human score (the learner's features need the reference)."""
    return frame[frame["ref"].notna() & np.isfinite(frame["score"].astype(float))].reset_index(drop=True)


def write_findings(settings: AnnotationSettings, pipeline, encode) -> dict[str, Path]:
    """The stage ``exp_annotation``: simulate (``d_e`` pool, then the new domains of ``settings.domain``),
    write ``annotation.json``, the learning curves and the new-domain curves."""
    from uamt.experiments.common import open_experiment_features
    from uamt.pipeline_config import read_split

    started = time.perf_counter()
    features = open_experiment_features(encode)
    pool = read_split(pipeline.prepared_dir, "d_e", tuple(settings.datasets))
    test = read_split(pipeline.prepared_dir, "test", tuple(settings.datasets))
    pool, test = usable(pool), usable(test)
    if settings.max_test_rows is not None and len(test) > settings.max_test_rows:
        test = test.sample(settings.max_test_rows, random_state=0).reset_index(drop=True)
    if len(pool) < settings.seed_rows + settings.steps * settings.batch_rows:
        raise DataError(f"d_e has {len(pool)} rows; the simulation needs {settings.seed_rows + settings.steps * settings.batch_rows}")
    pool_x, test_x = row_features(pool, features), row_features(test, features)
    if settings.components:
        project = principal_components(pool_x, settings.components)
        pool_x, test_x = project(pool_x), project(test_x)
    curves = simulate(
        pool_x, pool["score"].to_numpy(float), pool["doc"].astype(str).to_numpy(), pool["lp"].astype(str).to_numpy(),
        test_x, test["score"].to_numpy(float), settings,
    )
    result = {
        "settings": {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in settings.__dict__.items()
            if not k.endswith("_dir") and k != "domain"
        },
        "sizes": {"pool": int(len(pool)), "test": int(len(test)), "pool_docs": int(pool["doc"].nunique())},
        "curves": curves,
        "summary": summarise(curves),
        "efficiency": efficiency(curves),
    }
    if settings.domain.datasets:
        news = usable(read_split(pipeline.prepared_dir, "d_q", tuple(settings.datasets)))
        ood = usable(read_split(pipeline.prepared_dir, "ood", tuple(settings.domain.datasets)))
        result["domain"] = domain_findings(news, test, ood, features, settings)
    result["seconds"] = time.perf_counter() - started
    out = {"result": write_result(NAME, result, settings.metrics_dir)}
    out["figure"] = save_figure(figure(result), Path(settings.figures_dir) / FIGURE)
    # Always written (dvc.yaml declares it): without new-domain datasets it says so.
    out["domain_figure"] = save_figure(domain_figure(result.get("domain")), Path(settings.figures_dir) / DOMAIN_FIGURE)
    return out


def figure(result: dict[str, Any]):
    """Learning curves (mean and min-max band over seeds) of PPS, NLL and bad AUROC."""
    from uamt.experiments.common import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key, label in zip(axes, ("pps", "nll", "bad_auroc"), ("PPS", "NLL", "bad-segment AUROC"), strict=True):
        for k, (strategy, block) in enumerate(result["summary"].items()):
            ax.plot(block["rows"], block[key]["mean"], color=f"C{k}", label=strategy)
            ax.fill_between(block["rows"], block[key]["low"], block[key]["high"], color=f"C{k}", alpha=0.2)
        ax.set_xlabel("annotated rows")
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def domain_figure(domain: dict[str, Any] | None):
    """Per domain dataset: coverage (with the target band) and PPS (with plateau - margin) against
    annotated domain rows (symlog axis: the first point is the news model alone); ``None`` (no
    ``exp_annotation.domain.datasets``): a figure that says the case was not run."""
    from uamt.experiments.common import pyplot

    plt = pyplot()
    if not domain:
        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "new-domain case not run (exp_annotation.domain.datasets is empty)", ha="center", va="center")
        return fig
    names = list(domain["datasets"])
    st = domain["settings"]
    fig, axes = plt.subplots(len(names), 2, figsize=(9, 3.0 * len(names)), squeeze=False)
    for row, name in zip(axes, names, strict=True):
        summary = domain["datasets"][name]["summary"]
        for ax, key in zip(row, ("coverage", "pps"), strict=True):
            for k, (strategy, curve) in enumerate(summary["curves"].items()):
                ax.plot(summary["rows"], [p["mean"] for p in curve[key]], color=f"C{k}", marker="o", ms=3, label=strategy)
                ax.fill_between(summary["rows"], [p["low"] for p in curve[key]], [p["high"] for p in curve[key]], color=f"C{k}", alpha=0.15)
            if key == "coverage":
                ax.axhspan(
                    st["level"] - st["coverage_tolerance"], st["level"] + st["coverage_tolerance"], color="grey", alpha=0.2,
                    lw=0, label=f"{st['level']:.2f} ± {st['coverage_tolerance']:.2f}",
                )
            else:
                plateau = summary["plateau"]["pps"]["mean"]
                ax.axhline(plateau, color="k", lw=0.8, label=f"plateau (pool {summary['pool_rows']['mean']:.0f} rows)")
                ax.axhline(plateau - st["pps_margin"], color="k", lw=0.8, ls="--", label=f"plateau - {st['pps_margin']}")
            ax.set_xscale("symlog", linthresh=max(1, summary["rows"][1] if len(summary["rows"]) > 1 else 1))
            ax.set_xlim(0, max(summary["rows"][-1], 1) * 1.3)
            ax.set_xlabel(f"annotated {name} rows (on top of the news rows)")
            ax.set_title(f"{name}: {'coverage of the ' + format(st['level'], '.0%') + ' interval' if key == 'coverage' else 'PPS'}", fontsize=9)
        row[0].legend(fontsize=7)
        row[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def render(result: dict[str, Any]) -> str:
    """The markdown section (``templates/annotation.md.j2``)."""
    return rendering.render(NAME, result, figure=FIGURE, domain_figure=DOMAIN_FIGURE, section=section_number(NAME))


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Whether uncertainty selection reaches random's final PPS with <= 60 % of its annotations."""
    rows = []
    for strategy, e in result["efficiency"].items():
        if strategy == "random":
            continue
        # Held: the mean ratio <= 0.6 and at least 4 of 5 seeds (80 %) <= 0.6; partly: the mean only.
        below = sum(r is not None and r <= 0.6 for r in e["ratios"])
        mean_ok = e["mean"] is not None and e["mean"] <= 0.6
        verdict = "held" if mean_ok and below >= 0.8 * e["seeds"] else "partly" if mean_ok else "not held"
        band = "–" if e["band"] is None else f"[{e['band'][0]:.2f}, {e['band'][1]:.2f}]"
        noise = result["efficiency"].get("random", {}).get("mean")
        rows.append(
            (
                f"Active annotation ({strategy}) reaches random selection's final PPS with <= 60 % of its annotations",
                "goal of this tool (no paper number)",
                f"{verdict}: {below}/{e['seeds']} seeds <= 0.6; ratio "
                f"{'not reached in every seed' if e['mean'] is None else format(e['mean'], '.2f')} "
                f"(band over seeds {band}; reached in {e['reached']}/{e['seeds']} seeds; random against its own "
                f"final PPS: {'–' if noise is None else format(noise, '.2f')})",
            )
        )
    domain = result.get("domain")
    if not domain:
        return rows
    st = domain["settings"]

    def reach(t):
        if t["reached"] == 0:
            return "never"
        band = f"[{t['band'][0]:.0f}-{t['band'][1]:.0f}]"
        return f"{t['mean']:.0f} {band}" if t["mean"] is not None else f"in {t['reached']}/{t['seeds']} seeds {band}"

    def need(t):
        # Annotations until both goals hold: the later of the two crossing points (means over seeds).
        c, p = t["coverage"]["mean"], t["pps"]["mean"]
        return None if c is None or p is None else max(c, p)

    for name, block in domain["datasets"].items():
        thresholds = block["summary"]["thresholds"]
        base = thresholds.get("random")
        for strategy, t in thresholds.items():
            if strategy == "random" or base is None:
                continue
            mine, theirs = need(t), need(base)
            # Held: the new-domain goals with <= 60 % of random's annotations (the d_e goal); partly: fewer.
            ratio = None if mine is None or not theirs else mine / theirs
            verdict = "n/a" if ratio is None else "held" if ratio <= 0.6 else "partly" if ratio < 1 else "not held"
            rows.append(
                (
                    f"New domain {name}: {strategy} selection reaches coverage in {st['level']:.2f} +- "
                    f"{st['coverage_tolerance']:.2f} and PPS within {st['pps_margin']:.2f} of its plateau with "
                    "<= 60 % of random selection's annotations",
                    "goal of this tool (no paper number)",
                    f"{verdict}: {'not reached in every seed' if ratio is None else format(ratio, '.2f')} of random's; "
                    f"coverage from {reach(t['coverage'])}, PPS from {reach(t['pps'])} annotated rows (random: "
                    f"{reach(base['coverage'])}, {reach(base['pps'])}; mean [min-max] over seeds; pool "
                    f"{block['summary']['pool_rows']['mean']:.0f} rows)",
                )
            )
    return rows
