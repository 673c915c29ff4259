"""Leave-one-LP-out models: each served model retrained without each language pair of its training rows.

A user's unseen language pair is unseen by the model *and* by its calibration.  The calibrate stage
widens what an unseen pair is served by a factor under which held-out LPs are covered ``level`` of
the time; fitted by leaving an LP out of the *calibration* only, the model still knew the pair and
the factor came out too small (HTS, model held out: held-out news LPs covered 0.83-0.90 with it,
``benchmarks/unseen_lp_heldout.py``).  The ``train_lolo`` stage trains, for every model of
``train_lolo.models`` and every LP ``L`` of its training split, the same model on the rows without
``L`` (early stopping on dev without ``L``; the synthetic failure rows drawn from the rows kept), into
``<out_dir>/<L>/<model>``; the calibrate stage predicts them on the calibration rows and fits the
factor with model and calibration held out (:func:`uamt.serving.model_calibration.fit_held_out_model_unseen_lp_sigma_factor`).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from uamt.core.config import ConfigError
from uamt.core.errors import DataError
from uamt.core.naming import base_method, is_reference_free

log = logging.getLogger(__name__)

SECTION = "train_lolo"
#: What the stage writes beside the model folders: the models, the held-out LPs, the rows.
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class LeaveOneLpOutConfig:
    """params.yaml ``train_lolo:`` section.

    Attributes
    ----------
    models : tuple of str
        Pipeline models (``pipeline.methods`` / ``<qe method>_qe``, single-stage) retrained without
        each LP; their unseen-LP widening is fitted with the model held out.  The other models keep
        the calibration-only fit.  Empty: none (every model keeps the calibration-only fit).
    out_dir : str
        ``<out_dir>/<lp>/<model>``: the model trained without ``lp``; ``<out_dir>/manifest.json``.
    """

    models: tuple[str, ...] = ("hts", "hts_qe")
    out_dir: str = "models/lolo"

    def __post_init__(self) -> None:
        if len(set(self.models)) != len(self.models):
            raise ConfigError(f"{SECTION}.models={list(self.models)!r} names a model twice")

    def check_against(self, pipe) -> None:
        """ConfigError naming the first model that is not a single-stage model of ``pipe``."""
        trainable = (*pipe.methods, *pipe.qe_models)
        for model in self.models:
            if model not in trainable:
                raise ConfigError(
                    f"{SECTION}.models: {model!r} is not a model train_base trains; choose from {sorted(trainable)}"
                )

    def model_dir(self, lp: str, model: str) -> Path:
        return Path(self.out_dir) / lp / model


def held_out_lps(train_df, dev_df) -> tuple[list[str], dict[str, str]]:
    """``(lps, skipped)``: the LPs of the training rows, sorted, that can each be left out once --
    rows of another LP remain to train on and to stop early on -- and ``{lp: reason}`` for the others
    (a small profile's dev split may hold one LP only).  No LP when the training rows hold one:
    nothing to leave out."""
    lps = sorted(set(train_df["lp"].astype(str)))
    if len(lps) < 2:
        return [], {lp: "the training rows hold no other LP" for lp in lps}
    dev_lps = set(dev_df["lp"].astype(str))
    skipped = {lp: f"the early-stopping rows hold no other LP ({sorted(dev_lps)})" for lp in lps if not dev_lps - {lp}}
    return [lp for lp in lps if lp not in skipped], skipped


def _training_inputs(pipe, train_cfg, encode):
    from uamt.pipeline_config import open_features, paragraph_rows, read_split

    train_df = read_split(pipe.prepared_dir, train_cfg.train_split, pipe.datasets)
    dev_df = read_split(pipe.prepared_dir, train_cfg.dev_split, pipe.datasets)
    return train_df, dev_df, open_features(encode), paragraph_rows(pipe, train_cfg, dev_df)


def _train_one(train_cfg, lolo, job: tuple[str, str], inputs) -> dict:
    from uamt.challenge import with_synthetic_failures
    from uamt.core.naming import QE_MODEL_SUFFIX
    from uamt.models.shared_training import train_methods

    lp, model = job
    train_df, dev_df, features, paragraph_df = inputs
    kept = train_df[train_df["lp"].astype(str) != lp]
    kept = with_synthetic_failures(kept, train_cfg.synthetic_failures, train_cfg.seed)
    cfg = train_cfg.as_reference_free() if is_reference_free(model) else train_cfg.replace(reference_free=False)
    started = time.perf_counter()
    train_methods(
        (base_method(model),), cfg, kept, dev_df[dev_df["lp"].astype(str) != lp], features,
        lambda name: lolo.model_dir(lp, name), QE_MODEL_SUFFIX if is_reference_free(model) else "",
        None if paragraph_df is None else paragraph_df[paragraph_df["lp"].astype(str) != lp],
    )
    seconds = time.perf_counter() - started
    log.info("trained %s without %s on %d rows in %.1f s", model, lp, len(kept), seconds)
    # no timing in the manifest: a stage output must be the same on a re-run (the weights are)
    return {"n_train": int(len(kept))}


def train_leave_one_lp_out(pipe, train_cfg, encode, lolo: LeaveOneLpOutConfig) -> dict[str, dict[str, Path]]:
    """Train every model of ``lolo.models`` without each LP of the training split, in
    ``pipe.workers`` processes; writes ``<out_dir>/<lp>/<model>`` and ``<out_dir>/manifest.json``.
    Returns ``{model: {lp: folder}}``."""
    import shutil

    from uamt.core.fileio import atomic_path
    from uamt.core.parallel import map_in_processes
    from uamt.pipeline_config import read_split

    lolo.check_against(pipe)
    lps, skipped = held_out_lps(
        read_split(pipe.prepared_dir, train_cfg.train_split, pipe.datasets),
        read_split(pipe.prepared_dir, train_cfg.dev_split, pipe.datasets),
    )
    for lp, reason in skipped.items():
        log.warning("%s: no model is trained without %s: %s", SECTION, lp, reason)
    if len(lps) < 2:  # calibrate then keeps the calibration-only widening for every model
        lps = []
    out = Path(lolo.out_dir)
    if out.exists():  # a stage output: what another configuration left must not be read as this one's
        shutil.rmtree(out)
    out.mkdir(parents=True)
    jobs = [(lp, model) for model in lolo.models for lp in lps]
    done = [] if not jobs else map_in_processes(
        functools.partial(_train_one, train_cfg, lolo),
        jobs,
        pipe.workers,
        load=functools.partial(_training_inputs, pipe, train_cfg, encode),
    )
    manifest = {
        "models": list(lolo.models),
        "held_out_lps": lps,
        "train_split": train_cfg.train_split,
        "trained": {model: {lp: info for (lp, m), info in zip(jobs, done, strict=True) if m == model} for model in lolo.models},
    }
    if skipped:
        manifest["skipped"] = skipped
    with atomic_path(out / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1))
    return {model: {lp: lolo.model_dir(lp, model) for lp in lps} for model in lolo.models}


def held_out_models(out_dir: str | Path, model: str) -> dict[str, Path]:
    """``{lp: folder}`` of ``model`` trained without each LP (the stage's manifest); ``{}`` when the
    stage trained no such model.  DataError naming the folder when the manifest lists a model whose
    folder is missing."""
    out = Path(out_dir)
    path = out / MANIFEST
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc}); re-run `dvc repro train_lolo`") from exc
    if model not in manifest.get("models", []):
        return {}
    folders = {lp: out / lp / model for lp in manifest.get("held_out_lps", [])}
    missing = [str(f) for f in folders.values() if not (f / "model.json").is_file()]
    if missing:
        raise DataError(f"{path} lists {model} without each LP, but {missing} hold no model; re-run `dvc repro train_lolo`")
    return folders
