"""Methods that share another method's training, and the training of a set of methods that uses it.

Some methods differ from another only at inference (MC dropout passes over the same weights): their
training is *identical* (same network, loss, data and seed), so their model folder is the source
method's, copied (:func:`derive`) instead of trained again.  Used by the ``train_base`` stage and
by the analyses that train their own models (``uamt.experiments.methods``, ``uamt.experiments.cost``).
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from uamt.models.specs import SAME_TRAINING, training_order

log = logging.getLogger(__name__)

__all__ = ["SAME_TRAINING", "derive", "train_jobs", "train_methods", "training_order"]

def derive(source_dir: Path, method: str, out_dir: Path) -> Path:
    """Copy the trained ``source_dir`` as a model of ``method`` (atomically; manifest says the method)."""
    from uamt.models.api import atomic_dir, read_manifest, write_manifest

    meta = read_manifest(source_dir)
    with atomic_dir(out_dir) as tmp:
        for item in source_dir.iterdir():
            if item.name != "model.json":
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
        meta = {
            **meta,
            "method": method,
            "config": {**meta["config"], "method": method},
            "derived_from": str(source_dir),
        }
        write_manifest(tmp, meta)
    return out_dir


def train_methods(
    methods: Sequence[str],
    cfg,
    train_df,
    dev_df,
    features,
    model_dir: Callable[[str], Path],
    suffix: str = "",
    paragraph_df=None,
) -> dict[str, Path]:
    """Train each of ``methods`` as the model ``<method><suffix>`` into ``model_dir(name)``.

    Parameters
    ----------
    methods : sequence of str
        Single-stage methods (keys of ``uamt.models.METHODS``).
    cfg : uamt.models.config.TrainConfig
        Hyper-parameters shared by every method (``reference_free`` for QE models).
    train_df, dev_df : DataFrame
        Training rows and early-stopping rows.
    features : callable
        The cached-feature source (``uamt.pipeline_config.open_features``).
    model_dir : callable
        Model name -> folder.
    suffix : str
        Appended to each method's name (``"_qe"`` for the reference-free models).
    paragraph_df : DataFrame, optional
        The rows the paragraph blend is fitted on (:func:`uamt.models.api.train`; default ``dev_df``).

    Returns
    -------
    dict
        ``{model name: model folder}`` in training order; a method of :data:`SAME_TRAINING` whose
        source is among ``methods`` gets a copy of the source's folder (:func:`derive`).
    """
    return train_jobs([(method, cfg, suffix) for method in methods], lambda: (train_df, dev_df, features, paragraph_df), model_dir)


def train_jobs(
    jobs: Sequence[tuple[str, object, str]],
    load: Callable[[], tuple],
    model_dir: Callable[[str], Path],
    workers: int = 1,
) -> dict[str, Path]:
    """Train every ``(method, cfg, suffix)`` of ``jobs`` as the model ``<method><suffix>``, the
    independent trainings in ``workers`` processes, then copy the shared ones (:func:`derive`).

    ``load() -> (train_df, dev_df, features, paragraph_df)`` (``paragraph_df``: the rows the
    paragraph blend is fitted on, None = ``dev_df``; :func:`uamt.models.api.train`) is read once per process
    (:func:`uamt.core.parallel.map_in_processes`; with ``workers`` > 1 it and ``model_dir`` must be
    picklable).  A process trains with ``cores // workers`` torch threads: the weights are the same
    bit for bit as with every core (checked on the pipeline's models), so the number of workers
    changes only the time.  Returns ``{model name: model folder}`` in training order.
    """
    from uamt.core.parallel import map_in_processes

    names = {f"{method}{suffix}" for method, _, suffix in jobs}
    shares = [f"{SAME_TRAINING.get(method)}{suffix}" in names for method, _, suffix in jobs]
    trained = [job for job, shared in zip(jobs, shares, strict=True) if not shared]
    folders = map_in_processes(functools.partial(_train_job, model_dir), trained, workers, load=load)
    out = {f"{method}{suffix}": folder for (method, _, suffix), folder in zip(trained, folders, strict=True)}
    for (method, _, suffix), shared in zip(jobs, shares, strict=True):
        if shared:
            name, source = f"{method}{suffix}", f"{SAME_TRAINING.get(method)}{suffix}"
            out[name] = derive(out[source], method, model_dir(name))
            log.info("%s: same training as %s, weights reused", name, source)
    return out


def _train_job(model_dir: Callable[[str], Path], job: tuple[str, object, str], inputs: tuple) -> Path:
    from uamt.models.api import train

    method, cfg, suffix = job
    train_df, dev_df, features, paragraph_df = inputs
    name, started = f"{method}{suffix}", time.perf_counter()
    folder = train(method, cfg, train_df, dev_df, features, model_dir(name), paragraph_df=paragraph_df)
    log.info("trained %s on %d rows in %.1f s", name, len(train_df), time.perf_counter() - started)
    return folder
