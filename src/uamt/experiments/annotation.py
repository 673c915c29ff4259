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
every batch -- reads frozen MiniLM sentence embeddings from the pipeline's cache (the mean over its
layers), COMET-style features ``[mt, ref, mt*ref, |mt-ref|, mt*src, |mt-src|]`` reduced to their
``components`` leading principal components (fitted on the unlabelled pool).  ``bayes_linear``
(default): heteroscedastic Bayesian linear regression (:func:`fit_bayes_linear`), whose epistemic
variance is the exact posterior variance of its mean; ``mlp_ensemble``: a deep ensemble of
``members`` heteroscedastic MLP heads (:func:`fit_ensemble`; ~40x slower on CPU), epistemic = the
variance of the members' means.  Metrics are on the human scale, of the learner's own Gaussian
N(mu, aleatoric + epistemic), uncalibrated.

Annotation efficiency: for each seed, the annotated rows a strategy needs to reach the PPS random
selection has at its largest budget (linear interpolation of its curve; not reached = reported as
such), divided by that budget.  The goal of the issue is a ratio <= 0.6.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.decisions.annotation import STRATEGIES, select_rows
from uamt.experiments import rendering
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, save_figure, write_result
from uamt.experiments.rendering import section_number

NAME = "annotation"
FIGURE = "annotation_curves.png"
log = logging.getLogger(__name__)


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
        "pps": float(np.corrcoef(mu, human)[0, 1]),
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


def write_findings(settings: AnnotationSettings, pipeline, encode) -> dict[str, Path]:
    """The stage ``exp_annotation``: simulate, write ``annotation.json`` and the learning curves."""
    from uamt.pipeline_config import open_features, read_split

    started = time.perf_counter()
    features = open_features(encode)
    pool = read_split(pipeline.prepared_dir, "d_e", tuple(settings.datasets))
    test = read_split(pipeline.prepared_dir, "test", tuple(settings.datasets))
    pool = pool[pool["ref"].notna() & np.isfinite(pool["score"].astype(float))].reset_index(drop=True)
    test = test[test["ref"].notna() & np.isfinite(test["score"].astype(float))].reset_index(drop=True)
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
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.__dict__.items() if not k.endswith("_dir")},
        "sizes": {"pool": int(len(pool)), "test": int(len(test)), "pool_docs": int(pool["doc"].nunique())},
        "curves": curves,
        "summary": summarise(curves),
        "efficiency": efficiency(curves),
        "seconds": time.perf_counter() - started,
    }
    out = {"result": write_result(NAME, result, settings.metrics_dir)}
    out["figure"] = save_figure(figure(result), Path(settings.figures_dir) / FIGURE)
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


def render(result: dict[str, Any]) -> str:
    """The markdown section (``templates/annotation.md.j2``)."""
    return rendering.render(NAME, result, figure=FIGURE, section=section_number(NAME))


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
    return rows
