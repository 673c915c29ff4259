"""Score and measure every model on the out-of-domain split (stage ``evaluate_ood``, after ``register``).

The out-of-domain sets (TED talks, biomedical abstracts: ``pipeline.ood_datasets``) are about as
many rows as test, and the promotion gates read none of them, so they are scored after the
champions are registered rather than before: ``encode`` leaves their texts out
(``encode.datasets``) and this stage encodes them into the on-demand cache
(:func:`uamt.pipeline_config.open_features`), once, before the models are measured.  Every number
comes from the served ``calibration/<model>.json``, as in ``evaluate``
(:func:`uamt.model_evaluation.measure_split`).

Writes ``predictions/ood/<model>.parquet``, ``metrics/ood.json`` (model x LP, the keys of
``metrics/test.json``), ``metrics/held_out.json`` (per model, the LPs without a dev calibration of
their own: what the ``unseen_coverage_error`` goal judges, :func:`uamt.uncertainty.goals.with_held_out`
completes ``metrics/conditional.json`` with it) and ``plots/sharpness.png`` (in- vs out-of-domain),
then attaches them to the registered versions' MLflow runs
(:func:`uamt.registry.register.attach_to_registered`), so a version is complete once this stage ran.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from uamt import model_evaluation
from uamt.core.errors import DataError
from uamt.core.fileio import read_stage_json
from uamt.core.parallel import map_in_processes
from uamt.encoders import EncodeConfig
from uamt.pipeline_config import PipelineConfig, open_features, overlay_embeddings, read_split
from uamt.plots import pyplot, save_figure
from uamt.uncertainty import EvaluationSettings, write_json_atomic
from uamt.uncertainty.goals import held_out_block

log = logging.getLogger(__name__)
SPLIT = model_evaluation.OOD_SPLIT
#: Texts handed to the encoder at a time (each chunk is stored before the next is encoded).
ENCODE_CHUNK = 4096


def encode_ood_texts(pipe: PipelineConfig, encode: EncodeConfig) -> dict[str, Any]:
    """Encode every text of the out-of-domain split the models will read (``src``, ``mt``, ``ref``,
    ``refs`` and, with ``encode.paragraph_units``, the sentence units of multi-sentence rows) that
    neither the encode stage's cache nor the on-demand one holds; returns counts and seconds.  Done
    once here so that the worker processes, each measuring some of the models, read the same
    vectors instead of encoding the same texts side by side."""
    from uamt.encoders.precompute import collect_texts

    path = Path(pipe.prepared_dir) / f"{SPLIT}.parquet"
    if not path.is_file():
        raise DataError(f"{path}: missing; run `dvc repro prepare` (the out-of-domain split)")
    texts, _, _ = collect_texts([path], list(pipe.ood_datasets), encode.paragraph_units)
    cache = overlay_embeddings(encode)
    started = time.perf_counter()
    missing = [text for text in texts if text not in cache]
    for start in range(0, len(missing), ENCODE_CHUNK):
        cache.get(missing[start : start + ENCODE_CHUNK])
    seconds = time.perf_counter() - started
    log.info("%s: %d distinct texts, %d encoded in %.1f s", path, len(texts), len(missing), seconds)
    return {"texts": len(texts), "encoded": len(missing), "seconds": round(seconds, 3)}


def ood_inputs(pipe: PipelineConfig, encode: EncodeConfig):
    """``(frame, features, bounds)``: what :func:`evaluate_ood_model` reads for every model."""
    frame = read_split(pipe.prepared_dir, SPLIT, pipe.ood_datasets)
    return frame, open_features(encode), model_evaluation.pipeline_bounds(pipe)


def evaluate_ood_model(
    pipe: PipelineConfig,
    settings: EvaluationSettings,
    encode: EncodeConfig,
    calibration_dir: str | Path,
    method: str,
    inputs: tuple | None = None,
) -> dict[str, Any]:
    """One model of :func:`evaluate_ood_models`: its predictions on the out-of-domain split
    (written) and the served metrics of its calibration there.  Returns ``{"full": metrics,
    "known_lps": the LPs with a dev calibration of their own}``."""
    frame, features, bounds = inputs if inputs is not None else ood_inputs(pipe, encode)
    calibration, _, dev_n_eff = model_evaluation.served_calibration(pipe, settings, calibration_dir, method, bounds)
    full, _, _ = model_evaluation.measure_split(
        pipe, method, SPLIT, frame, features, calibration, settings, bounds, dev_n_eff
    )
    log.info("evaluated %s out of domain", method)
    return {"full": full, "known_lps": list(calibration.known_lps)}


def evaluate_ood_models(
    pipe: PipelineConfig, settings: EvaluationSettings, encode: EncodeConfig, calibration_dir: str | Path
) -> dict[str, Any]:
    """Measure every model's served calibration on the out-of-domain split; writes the predictions,
    ``metrics/ood.json``, ``metrics/held_out.json`` and ``plots/sharpness.png``.  Returns their
    paths and the encoding counts.  Reads ``metrics/test.json`` and ``metrics/conditional.json``
    (the evaluate stage's: the in-domain sharpness and width beside the out-of-domain ones)."""
    metrics_dir = Path(pipe.metrics_dir)
    test = read_stage_json(metrics_dir / "test.json", "evaluate")
    conditional = read_stage_json(metrics_dir / "conditional.json", "evaluate")
    missing = [m for m in pipe.all_methods if m not in test or m not in conditional]
    if missing:
        raise DataError(
            f"{metrics_dir / 'test.json'} / conditional.json: no entry for {missing}; run `dvc repro evaluate`"
        )
    encoded = encode_ood_texts(pipe, encode)
    done = dict(
        zip(
            pipe.all_methods,
            map_in_processes(
                functools.partial(evaluate_ood_model, pipe, settings, encode, calibration_dir),
                pipe.all_methods,
                pipe.workers,
                load=functools.partial(ood_inputs, pipe, encode),
            ),
            strict=True,
        )
    )
    gamma = settings.coverage_gamma
    ood = {method: model_evaluation.compact(result["full"]) for method, result in done.items()}
    held_out = {
        method: held_out_block(result["full"], result["known_lps"], conditional[method].get("width"), gamma)
        for method, result in done.items()
    }
    metrics_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(ood, metrics_dir / "ood.json")
    write_json_atomic(held_out, metrics_dir / "held_out.json")
    sharpness = write_sharpness_plot(Path(pipe.plots_dir) / "sharpness.png", test, ood)
    return {
        "ood": metrics_dir / "ood.json",
        "held_out": metrics_dir / "held_out.json",
        "sharpness": sharpness,
        "encoded": encoded,
    }


def write_sharpness_plot(path: Path, test: dict[str, Any], ood: dict[str, Any]) -> Path:
    """Mean served sharpness (z units) per model, in-domain test beside out of domain, as PNG."""
    plt = pyplot()
    methods = list(test)
    lps = sorted({lp for split in (test, ood) for m in split.values() for lp in m if lp != "avg"})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        values = [
            test[method]["avg"].get("sharpness") or np.nan,
            (ood.get(method) or {}).get("avg", {}).get("sharpness") or np.nan,
        ]
        ax.bar(np.arange(2) + i * width, values, width, label=method)
    ax.set_xticks(np.arange(2) + width * (len(methods) - 1) / 2, ["in-domain (news test)", "out-of-domain (TED, biomedical)"])
    ax.set(ylabel="sharpness (mean calibrated sigma^2, z units)", title=f"Sharpness, LPs {', '.join(lps)}")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


def registered_metrics(metrics_dir: str | Path) -> dict[str, float]:
    """What :func:`uamt.registry.register.attach_to_registered` logs to a registered version's run:
    every model's out-of-domain metrics (``ood.<model>.<lp>.<key>``) and its interval goals with
    the held-out LPs judged (``conditional.<model>.<goal>``, ``goals_met``...: the headlines the
    register stage logged, completed)."""
    from uamt.registry.register import flat_metrics
    from uamt.uncertainty.goals import headline_metrics, with_held_out

    metrics_dir = Path(metrics_dir)
    ood = read_stage_json(metrics_dir / "ood.json", "evaluate_ood")
    held_out = read_stage_json(metrics_dir / "held_out.json", "evaluate_ood")
    conditional = read_stage_json(metrics_dir / "conditional.json", "evaluate")
    return {**flat_metrics(ood, "ood"), **headline_metrics(with_held_out(conditional, held_out))}
