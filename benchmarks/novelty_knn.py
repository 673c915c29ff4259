"""Does distance from the training data tell where the model has not seen anything like the input?

The calibration design asks for an epistemic term that reacts to distance from the training data.  This measures
the candidate the issue names, the k-nearest-neighbour distance in the cached encoder space, on the
pipeline's own data and models, before anything is built on it:

* each row is the unit-norm concatenation of the pooled top-layer embeddings of its source and its
  translation (``cache/embeddings``, the vectors the models read); its novelty ``d`` is the mean
  cosine distance to its ``k`` nearest ``d_q`` rows (the base models' training set);
* **detection**: mean ``d`` per group (news test, TED, biomedical MQM in an LP the model was trained
  on, biomedical MQM in an LP it never saw) and the AUROC of ``d`` for "not news test" against news
  test: 0.5 = the distance cannot tell them apart;
* **does it predict error**: Spearman's rho of ``d`` and ``|human - mu| / sigma`` (served calibration),
  within news test and within each out-of-domain group;
* **a fitted term**: dev rows enter twice, as served (own LP's calibration, ``d`` against all of
  ``d_q``) and with their LP held out (the global fallback, ``d`` against the *other* LPs' rows, so
  they look like an unseen LP); the sigma factor each distance decile needs for 0.9 coverage is
  fitted as ``f(d) = max(1, 1 + b (d - d_0))`` (``d_0`` = the nearest decile's mean distance, ``b`` by
  weighted least squares on the decile factors, >= 0); the served interval around mu (for unseen
  LPs the global one, without the unseen-LP factor that ``f`` replaces) is widened by ``f(d)``, and
  coverage@0.9 and the mean sigma ratio are reported with and without it.

    python benchmarks/novelty_knn.py [--root .] [--methods hts dup hts_qe] [--k 10] [--json out.json]

Needs a finished ``dvc repro`` (prepared splits, the embedding cache, ``predictions/`` and
``calibration/``).  The LP labels of the held-out groups come from ``pipeline.datasets`` (what the
models were trained on).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def row_vectors(cache, frame: pd.DataFrame) -> np.ndarray:
    """[n, 2 * dim] float32: unit-norm top-layer src and mt embeddings, concatenated, unit norm."""
    src = cache.get(frame["src"].astype(str).tolist())[:, -1, :]
    mt = cache.get(frame["mt"].astype(str).tolist())[:, -1, :]
    return (np.hstack([unit(src), unit(mt)]) / np.sqrt(2.0)).astype(np.float32)


def knn_distance(queries: np.ndarray, reference: np.ndarray, k: int, block: int = 2048) -> np.ndarray:
    """Mean cosine distance of each query row to its ``k`` nearest reference rows (all unit norm)."""
    out = np.empty(len(queries), dtype=np.float64)
    for start in range(0, len(queries), block):
        sims = queries[start : start + block] @ reference.T
        top = np.partition(sims, -k, axis=1)[:, -k:]
        out[start : start + block] = 1.0 - top.mean(axis=1)
    return out


def auroc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(d of a positive > d of a negative), ties counted half (Mann-Whitney)."""
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([positive, negative]))
    n_pos, n_neg = len(positive), len(negative)
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def fit_distance_factor(
    d: np.ndarray, z: np.ndarray, level: float = 0.9, bins: int = 10
) -> tuple[float, float]:
    """``(d_0, b)`` of ``f(d) = max(1, 1 + b (d - d_0))``: per distance decile, the factor its |z| needs
    for ``level`` coverage, regressed on the decile's mean distance (weights = rows), slope >= 0."""
    from scipy.stats import norm

    z_level = float(norm.ppf(0.5 + level / 2))
    edges = np.quantile(d, np.linspace(0, 1, bins + 1))
    which = np.clip(np.searchsorted(edges, d, side="right") - 1, 0, bins - 1)
    centres, needed, weights = [], [], []
    for b in range(bins):
        mask = which == b
        if mask.sum() < 20:
            continue
        centres.append(d[mask].mean())
        needed.append(np.quantile(np.abs(z[mask]), level) / z_level)
        weights.append(mask.sum())
    d0 = float(centres[0])  # the nearest decile needs no widening
    x, y, w = np.array(centres) - d0, np.array(needed) - 1.0, np.array(weights, dtype=float)
    slope = float(max(0.0, (w * x * y).sum() / max((w * x * x).sum(), 1e-12)))
    return d0, slope


def served(cal, table: pd.DataFrame, lp) -> tuple[np.ndarray, ...]:
    """Calibrated ``(mu, sigma, lower, upper)`` of the 0.9 interval, as ``uamt score`` serves them."""
    mu_raw, sigma_raw = table["mu"].to_numpy(float), table["sigma"].to_numpy(float)
    mu, sigma = cal.apply(mu_raw, sigma_raw, lp)
    lo, hi = cal.interval(mu_raw, sigma_raw, 0.9, lp=lp)
    return mu, sigma, np.asarray(lo, float), np.asarray(hi, float)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="checkout with a finished dvc repro")
    parser.add_argument("--methods", nargs="+", default=["hts", "dup", "hts_qe", "mcd_head"])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    os.chdir(args.root)

    from uamt.core.config import load_section
    from uamt.encoders import EmbeddingCache, get_encoder
    from uamt.encoders.precompute import EncodeConfig
    from uamt.pipeline_config import CALIBRATION_DIR, load_pipeline, read_split
    from uamt.serving.model_calibration import load_calibrations, with_model_sigma

    pipe = load_pipeline()
    encode = load_section(EncodeConfig, "encode", "params.yaml")
    cache = EmbeddingCache(encode.cache_dir, get_encoder(encode.encoder), dtype=encode.dtype)
    train = read_split(pipe.prepared_dir, "d_q", pipe.datasets)
    seen_lps = set(train["lp"].astype(str))
    frames = {
        "dev": read_split(pipe.prepared_dir, "dev", pipe.datasets),
        "test": read_split(pipe.prepared_dir, "test", pipe.datasets),
        "ood": read_split(pipe.prepared_dir, "ood", pipe.ood_datasets),
    }
    train_vec = row_vectors(cache, train)
    train_lp = train["lp"].astype(str).to_numpy()
    vec = {split: row_vectors(cache, frame) for split, frame in frames.items()}
    dist = {split: knn_distance(v, train_vec, args.k) for split, v in vec.items()}
    # dev with each LP held out of the reference set: what an unseen LP looks like
    dev_lp = frames["dev"]["lp"].astype(str).to_numpy()
    dev_loo = np.empty(len(dev_lp))
    for lp in sorted(set(dev_lp)):
        mask = dev_lp == lp
        dev_loo[mask] = knn_distance(vec["dev"][mask], train_vec[train_lp != lp], args.k)

    ood = frames["ood"]
    ood_lp = ood["lp"].astype(str).to_numpy()
    is_ted = (ood["dataset"] == "ted_mqm").to_numpy()
    groups = {
        "news test": dist["test"],
        "dev, own LP held out": dev_loo,
        "TED (seen LPs)": dist["ood"][is_ted],
        "bio, seen LPs": dist["ood"][~is_ted & np.isin(ood_lp, list(seen_lps))],
        "bio, unseen LPs": dist["ood"][~is_ted & ~np.isin(ood_lp, list(seen_lps))],
    }
    report: dict = {"k": args.k, "n_train": len(train), "detection": {}, "methods": {}}
    print(f"k = {args.k} nearest of {len(train):,} d_q rows; d = mean cosine distance (src + mt, top layer)")
    print(f"{'group':24s} {'n':>7s} {'mean d':>7s} {'ratio':>6s} {'AUROC vs test':>14s}")
    base = groups["news test"].mean()
    for name, values in groups.items():
        score = auroc(values, groups["news test"]) if name != "news test" else 0.5
        report["detection"][name] = {"n": len(values), "mean_d": float(values.mean()), "auroc": score}
        print(f"{name:24s} {len(values):7,d} {values.mean():7.3f} {values.mean() / base:6.2f} {score:14.3f}")

    from scipy.stats import norm, spearmanr

    calibrations = load_calibrations(CALIBRATION_DIR, args.methods)
    z90 = float(norm.ppf(0.95))
    print(
        "\nper method: Spearman(d, |z|) within each group; coverage@0.9 and mean sigma / news test's, "
        "served -> with the dev-fitted distance factor f(d)"
    )
    for method in args.methods:
        cal = calibrations[method]
        tables = {
            s: with_model_sigma(pd.read_parquet(Path(pipe.predictions_dir) / s / f"{method}.parquet"), method)
            for s in frames
        }
        for split, table in tables.items():
            aligned = table["lp"].astype(str).to_numpy() == frames[split]["lp"].astype(str).to_numpy()
            if len(table) != len(frames[split]) or not aligned.all():
                raise SystemExit(
                    f"predictions/{split}/{method}.parquet is not row-aligned with the prepared split"
                )

        # The fit sees dev twice: as served (its own LP's calibration, distance to all of d_q) and
        # with its LP held out (the global fallback, distance to the other LPs' rows), so f spans
        # the distances of seen and of unseen inputs.
        dev = tables["dev"]
        human_dev = dev["human"].to_numpy(float)
        mu, sigma, _, _ = served(cal, dev, dev_lp)
        z_seen = (human_dev - mu) / sigma
        mu, sigma, _, _ = served(cal, dev, None)
        z_held = (human_dev - mu) / sigma
        d0, slope = fit_distance_factor(
            np.concatenate([dist["dev"], dev_loo]), np.concatenate([z_seen, z_held])
        )
        rows = {}
        test_sigma = None
        split_of = {"news test": "test"}
        for name in groups:
            if name == "dev, own LP held out":
                continue
            split = split_of.get(name, "ood")
            table = tables[split]
            lp = table["lp"].astype(str).to_numpy()
            if split == "ood":
                mask = {
                    "TED (seen LPs)": is_ted,
                    "bio, seen LPs": ~is_ted & np.isin(ood_lp, list(seen_lps)),
                }.get(name, ~is_ted & ~np.isin(ood_lp, list(seen_lps)))
            else:
                mask = np.ones(len(table), dtype=bool)
            mu, sigma, lo, hi = served(cal, table[mask], lp[mask])
            d = dist[split][mask]
            human = table["human"].to_numpy(float)[mask]
            factor = np.maximum(1.0, 1.0 + slope * (d - d0))
            # the distance term replaces the unseen-LP factor: an unseen LP starts from the global fit
            known = np.where(np.isin(lp[mask], cal.known_lps), lp[mask], None)
            _, sigma_g, lo_g, hi_g = served(cal, table[mask], known if np.any(known != None) else None)  # noqa: E711
            lo_f, hi_f = mu - factor * (mu - lo_g), mu + factor * (hi_g - mu)
            if test_sigma is None:
                test_sigma = sigma.mean()
            rho = float(spearmanr(d, np.abs(human - mu) / sigma).correlation)
            rows[name] = {
                "spearman_d_absz": rho,
                "coverage": float(((human >= lo) & (human <= hi)).mean()),
                "coverage_with_d": float(((human >= lo_f) & (human <= hi_f)).mean()),
                "sigma_ratio": float(sigma.mean() / test_sigma),
                "sigma_ratio_with_d": float((sigma_g * factor).mean() / test_sigma),
            }
        report["methods"][method] = {"d0": d0, "slope": slope, "groups": rows}
        print(f"\n{method}: f(d) = max(1, 1 + {slope:.2f} (d - {d0:.3f}))  [z90 = {z90:.3f}]")
        print(f"{'group':24s} {'rho':>6s} {'cov':>6s} {'cov+d':>6s} {'sig x':>6s} {'sig x+d':>8s}")
        for name, r in rows.items():
            print(
                f"{name:24s} {r['spearman_d_absz']:6.3f} {r['coverage']:6.3f} {r['coverage_with_d']:6.3f} "
                f"{r['sigma_ratio']:6.2f} {r['sigma_ratio_with_d']:8.2f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
