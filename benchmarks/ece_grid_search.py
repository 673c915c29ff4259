"""How long the affine-variance ECE grid search takes, with scipy's erf (served) or torch's.

:func:`uamt.uncertainty.calibrators.fit_affine_variance` scores ~4,000 (alpha, beta) candidates by
ECE; :func:`~uamt.uncertainty.calibrators._ece_columns` computes each candidate's central-interval
levels with an erf.  Until 2026-12-06 that erf was torch's, which runs on torch's intra-op thread
pool: fast on idle cores, but on a machine busy with other work (CI beside a pipeline, the retrain
flow's in-process stages) its threads wait for each other on every call.  This benchmark fits each
LP of a dev predictions table (or synthetic rows) with both erfs and prints the seconds per fit and
whether the two fits agree (alpha, beta and the dev ECE).

Which erf is faster depends on the load, and the switch to scipy's is not a clear win.  Measured on
2026-12-06 on a 2-core AMD EPYC VM, HTS's dev predictions, seconds per LP fit (720-3,082 rows):

- beside another job's tests (load ~3.5), best of 5: scipy 0.13-0.55, torch 0.19-0.67;
- the same, ``--busy 2``: scipy 0.36-1.49, torch 0.63-2.15;
- idle (load 0.2), best of 3: scipy 0.13-0.50, **torch 0.05-0.18**;
- idle, ``--busy 1``: scipy 0.13-0.49, torch 0.13-0.74; ``--busy 2``: scipy 0.18-0.80, torch 0.17-0.52.

The fits were the same in every run.

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


def torch_erf(x: np.ndarray) -> np.ndarray:
    """torch's erf on torch's intra-op thread pool (what ``_ece_columns`` called until 2026-12-06)."""
    import torch

    return torch.special.erf(torch.from_numpy(x)).numpy()


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
    """Keep one core busy until terminated (``--busy``: the load of another job)."""
    while True:
        pass


def time_fits(rows: pd.DataFrame, erf, repeats: int) -> dict[str, tuple[float, dict]]:
    """Per LP: the fastest of ``repeats`` fits (seconds) and the fit, with ``erf`` in the grid search."""
    served = calibrators.erf
    calibrators.erf = erf  # the name _ece_columns calls
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
        calibrators.erf = served


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
        scipy_fits = time_fits(rows, calibrators.erf, args.repeats)
        torch_fits = time_fits(rows, torch_erf, args.repeats)
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
