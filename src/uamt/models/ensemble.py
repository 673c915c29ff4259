"""Deep ensembles (Lakshminarayanan et al. 2017; Glushkova et al. 2021 §3): K members, different seeds.

Members are trained in ``n_jobs`` parallel processes (joblib/loky); each process gets
``cpu_count // n_jobs`` torch threads so the processes do not oversubscribe the cores.
Combination: mu = mean_k mu_k; epistemic = (1/K) sum_k (mu_k - mu)^2 (population variance, as Eq. 4);
when members predict a variance (hts / kl members) aleatoric = mean_k sigma_k^2 and
var = epistemic + aleatoric, else var = epistemic.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
from joblib import Parallel, delayed


def _with_threads(fn: Callable, n_threads: int, *args):
    torch.set_num_threads(n_threads)
    return fn(*args)


def run_members(fn: Callable, jobs: Sequence[tuple], n_jobs: int) -> list:
    """``[fn(*job) for job in jobs]``, in ``n_jobs`` processes when n_jobs > 1 (order kept)."""
    n_jobs = max(1, min(int(n_jobs), len(jobs)))
    if n_jobs == 1:
        return [fn(*job) for job in jobs]
    threads = max(1, (os.cpu_count() or 1) // n_jobs)
    return Parallel(n_jobs=n_jobs, backend="loky")(delayed(_with_threads)(fn, threads, *job) for job in jobs)


def combine_members(outputs: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Combine members' standardised ``mu`` / ``var`` arrays [n] into the ensemble's (see module doc)."""
    mus = np.stack([out["mu"] for out in outputs])
    mu = mus.mean(axis=0)
    epistemic = mus.var(axis=0)
    result = {"mu": mu, "epistemic": epistemic, "var": epistemic}
    member_vars = np.stack([out["var"] for out in outputs])
    if np.isfinite(member_vars).all():
        aleatoric = member_vars.mean(axis=0)
        result.update(aleatoric=aleatoric, var=epistemic + aleatoric)
    return result
