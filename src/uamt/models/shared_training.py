"""Methods that share another method's training, and the training of a set of methods that uses it.

Some methods differ from another only at inference (MC dropout passes over the same weights): their
training is *identical* (same network, loss, data and seed), so their model folder is the source
method's, copied (:func:`derive`) instead of trained again.  Used by the ``train_base`` stage and
by the analyses that train their own models (``uamt.experiments.methods``, ``uamt.experiments.cost``).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from uamt.models.specs import SAME_TRAINING, training_order

log = logging.getLogger(__name__)

__all__ = ["SAME_TRAINING", "derive", "train_methods", "training_order"]

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

    Returns
    -------
    dict
        ``{model name: model folder}`` in training order; a method of :data:`SAME_TRAINING` whose
        source is among ``methods`` gets a copy of the source's folder (:func:`derive`).
    """
    from uamt.models.api import train

    out: dict[str, Path] = {}
    for method in training_order(methods):
        name, started = f"{method}{suffix}", time.perf_counter()
        source = f"{SAME_TRAINING.get(method)}{suffix}"
        if source in out:
            out[name] = derive(out[source], method, model_dir(name))
            log.info("%s: same training as %s, weights reused", name, source)
            continue
        out[name] = train(method, cfg, train_df, dev_df, features, model_dir(name))
        log.info("trained %s on %d rows in %.1f s", name, len(train_df), time.perf_counter() - started)
    return out
