"""How long the affine-variance ECE grid search takes, with scipy's erf (served) or torch's.

:func:`uamt.uncertainty.calibrators.fit_affine_variance` scores ~4,000 (alpha, beta) candidates by
ECE; :func:`~uamt.uncertainty.calibrators._ece_columns` computes each candidate's central-interval
levels with an erf.  Until 2026-12-06 that erf was torch's, which runs on torch's intra-op thread
pool: fast on idle cores, but on a machine busy with other work (CI beside a pipeline, the retrain
flow's in-process stages) its threads wait for each other on every call.  This benchmark fits each
LP of a dev predictions table (or synthetic rows) with both erfs and prints the seconds per fit and
whether the two fits agree (alpha, beta and the dev ECE).

    python benchmarks/ece_grid_search.py [--predictions predictions/dev/hts.parquet] [--busy 2]
        [--repeats 3] [--torch-threads 2]

``--busy K`` starts K processes spinning on a core for the run (a loaded machine); ``--predictions``
reads ``lp``, ``human``, ``mu`` and ``sigma`` (without it: 4 synthetic LPs of 700-3,000 rows).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
from pathlib import Path

import numpy as np
import pandas as pd

import uamt.uncertainty.calibrators as calibrators
from uamt.uncertainty.metrics import confidence_levels


def torch_ece_columns(abs_err: np.ndarray, var: np.ndarray, n_levels: int) -> np.ndarray:
    """The ECE fast path with torch's erf on torch's thread pool (the implementation until 2026-12-06)."""
    import torch

    n, n_candidates = var.shape
    z = abs_err[:, None] / np.sqrt(var)
    levels = torch.special.erf(torch.from_numpy(z / math.sqrt(2.0))).numpy()
    level_index = np.clip(np.ceil(levels * (n_levels - 1)).astype(np.int64), 0, n_levels - 1)
    flat = (level_index + np.arange(n_candidates)[None, :] * n_levels).ravel()
    counts = np.bincount(flat, minlength=n_candidates * n_levels).reshape(n_candidates, n_levels)
    observed = np.cumsum(counts, axis=1) / n
    return np.mean(np.abs(observed - confidence_levels(n_levels)[None, :]), axis=1)


def synthetic_rows(seed: int = 0) -> pd.DataFrame:
    """Heteroscedastic rows in 4 LPs of 700-3,000 rows (the dev split's sizes per LP)."""
    rng = np.random.default_rng(seed)
    frames = []
    for lp, n in (("en-de", 1400), ("en-ru", 700), ("he-en", 1100), ("zh-en", 3000)):
        sigma = np.exp(rng.normal(0.0, 0.4, n))
        mu = rng.normal(-2.0, 2.0, n)
        frames.append(pd.DataFrame({"lp": lp, "mu": mu, "sigma": sigma, "human": mu + rng.normal(0.0, 1.0, n) * sigma}))
    return pd.concat(frames, ignore_index=True)


def _spin() -> None:
    while True:
        pass


def time_fits(rows: pd.DataFrame, ece_columns, repeats: int) -> dict[str, tuple[float, dict]]:
    """Per LP: the fastest of ``repeats`` fits (seconds) and the fit, with ``ece_columns`` in place."""
    served = calibrators._ece_columns
    calibrators._ece_columns = ece_columns
    try:
        out = {}
        for lp, group in rows.groupby("lp", sort=True):
            best, fit = math.inf, None
            for _ in range(repeats):
                started = time.perf_counter()
                fit = calibrators.fit_affine_variance(group["human"], group["mu"], group["sigma"])
                best = min(best, time.perf_counter() - started)
            out[str(lp)] = (best, fit)
        return out
    finally:
        calibrators._ece_columns = served


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predictions", type=Path, help="a dev predictions table (lp, human, mu, sigma)")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core during the run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=2, help="torch's intra-op threads for its erf")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.torch_threads)
    rows = pd.read_parquet(args.predictions) if args.predictions else synthetic_rows()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    try:
        scipy_fits = time_fits(rows, calibrators._ece_columns, args.repeats)
        torch_fits = time_fits(rows, torch_ece_columns, args.repeats)
    finally:
        for p in spinners:
            p.terminate()
    source = args.predictions or "synthetic rows"
    print(f"{source}; {args.busy} busy processes; torch threads {args.torch_threads}; best of {args.repeats}")
    print("| LP | rows | scipy erf (s) | torch erf (s) | same fit |")
    print("|---|---|---|---|---|")
    for lp, (seconds, fit) in scipy_fits.items():
        t_seconds, t_fit = torch_fits[lp]
        same = all(fit[k] == t_fit[k] for k in ("alpha", "beta", "ece_after"))
        print(f"| {lp} | {int((rows['lp'] == lp).sum()):,} | {seconds:.3f} | {t_seconds:.3f} | {'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
