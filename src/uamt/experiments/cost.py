"""Computational cost of every uncertainty method (*Better Uncertainty Quantification*, §5.4 / Fig. 3).

Measured in one process on this machine, on one fixed real slice: every method is trained with the
``train_base`` hyper-parameters (DUP's M_E with ``train_dup``'s) on the same ``rows`` training rows
(``d_q``; DUP's M_E on as many ``d_e`` rows) with the same ``dev_rows`` for early stopping, for a fixed
number of ``epochs`` (early stopping off, as the paper's fixed epochs, App. C Tab. 7: the times then
compare cost per epoch of training, not how soon each method converges).  Inference = seg/s of
``load(model).predict`` on the same ``test_rows`` rows with a warm embedding cache (best of
``repeats``).  Methods derived from another's weights (``mcd_head`` = point weights, ``hts_mcd`` =
HTS weights, exactly as the ``train_base`` stage does) cost that training plus a copy.

Encoding is shared by every method and paid once per distinct text: it is measured apart with a fresh
temporary cache on ``encode_texts`` texts.  The paper's MCD runs dropout through the encoder
(``mcd_full``): it is timed with ``full_mc_passes`` passes on ``full_mc_rows`` rows and extrapolated
linearly to ``mc_samples`` passes.  ``cold`` seg/s adds the encoding of the slice's distinct texts per
segment to the warm-cache time.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.experiments import rendering
from uamt.experiments.common import FIGURES_DIR, METRICS_DIR, pyplot, save_figure, write_result
from uamt.experiments.rendering import section_number

if TYPE_CHECKING:
    from uamt.encoders import EncodeConfig
    from uamt.models.config import TrainConfig
    from uamt.pipeline_config import PipelineConfig

NAME = "cost"
FIGURE = "cost.png"
#: A ratio at or above this is "much costlier"; at or below SIMILAR "about the same cost".
COSTLIER = 3.0
SIMILAR = 2.0


@dataclass(frozen=True)
class CostSettings:
    """What is measured (the ``exp_cost`` section of params.yaml, with its output folders).

    Attributes
    ----------
    rows, dev_rows, test_rows : int
        Training rows (``d_q``, and as many ``d_e`` rows for DUP's M_E), early-stopping rows (``dev``)
        and inference rows (``test``), sampled with ``seed`` from ``pipeline.datasets``.
    seed : int
        Seed of the row sample.
    epochs : int or None
        Fixed epochs for every method (early stopping off); None = ``train_base``'s ``max_epochs``
        and ``patience`` (then times also reflect how soon each method stops).
    dup_losses : tuple of str
        DUP's M_E losses to time (Eqs. 5-7).
    kl_missing_std : str
        KL's rule for rows with < 2 annotators (WMT21 news MQM has one rater per row: ``floor``
        gives every row the floor std; the cost per row does not depend on the target's value).
    encode_texts : int
        Texts encoded with a fresh temporary cache for the one-time encoding cost.
    full_mc_rows, full_mc_passes : int
        Rows and passes actually run for ``mcd_full`` (MC dropout through the encoder), extrapolated
        to ``mc_samples`` passes; ``full_mc_rows: 0`` skips it.
    repeats : int
        Inference timings per method; the fastest is kept (the machine is shared).
    torch_threads : int or None
        torch intra-op threads while timing (restored after); None = torch's default.  One thread
        keeps the timings stable on a loaded machine: with several, every parallel op waits for its
        slowest thread, and a descheduled thread stalls it (and spins, inflating CPU time).
    """

    rows: int = 2000
    dev_rows: int = 500
    test_rows: int = 1000
    seed: int = 13
    epochs: int | None = 2
    dup_losses: tuple[str, ...] = ("abs", "sq", "hts")
    kl_missing_std: str = "floor"
    encode_texts: int = 300
    full_mc_rows: int = 16
    full_mc_passes: int = 2
    repeats: int = 3
    torch_threads: int | None = 1

    def __post_init__(self) -> None:
        from uamt.models.losses import LOSSES

        for name in ("rows", "dev_rows", "test_rows", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs={self.epochs} must be >= 1 (or null)")
        for loss in self.dup_losses:
            if loss not in LOSSES:
                raise ValueError(f"dup_loss={loss!r} not supported; choose from {sorted(LOSSES)}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads={self.torch_threads} must be >= 1 (or null)")
        if self.full_mc_rows and self.full_mc_passes < 2:
            raise ValueError(f"full_mc_passes={self.full_mc_passes}; MC dropout needs at least 2 passes")


@dataclass(frozen=True)
class CostStageSettings(CostSettings):
    """params.yaml ``exp_cost:`` section: :class:`CostSettings` + output folders."""

    metrics_dir: str = METRICS_DIR
    figures_dir: str = FIGURES_DIR

    @property
    def measured(self) -> CostSettings:
        """The settings without the output folders (what :func:`measure_costs` records)."""
        return CostSettings(
            **{k: v for k, v in asdict(self).items() if k not in ("metrics_dir", "figures_dir")}
        )


# ----------------------------------------------------------------------------- timing helpers


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``(fn(), wall seconds, CPU seconds of this process)``.

    CPU time (:func:`time.process_time`, all threads) is what the work itself costs; on a shared
    machine it varies much less with other processes' load than wall time does.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """The smallest wall and the smallest CPU seconds of ``repeats`` runs of ``fn()``."""
    runs = [timed(fn)[1:] for _ in range(repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def machine_info() -> dict[str, Any]:
    """What the timings ran on: CPU count, torch threads, CPU model, versions, load average."""
    import torch

    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def sample_rows(frame: pd.DataFrame, n: int, seed: int, where: str) -> pd.DataFrame:
    """``n`` rows drawn with ``seed`` (all when fewer), in their original order, index reset."""
    if frame.empty:
        raise DataError(f"{where}: no rows to time on")
    if len(frame) <= n:
        return frame.reset_index(drop=True)
    return frame.sample(n=n, random_state=seed).sort_index().reset_index(drop=True)


def distinct_texts(frame: pd.DataFrame) -> list[str]:
    """Every distinct source, translation and reference of ``frame`` (sorted: deterministic)."""
    texts = set(frame["src"]) | set(frame["mt"])
    if "ref" in frame.columns:
        texts |= {t for t in frame["ref"] if isinstance(t, str)}
    return sorted(texts)


# ----------------------------------------------------------------------------- measurement


def method_plan(mc_samples: int, ensemble_size: int, dup_losses: tuple[str, ...]) -> dict[str, dict]:
    """Per timed row: ``method``, ``label``, forward ``passes`` per segment at inference, trained
    ``models``, and what it is trained as (``derived``: the method whose weights it copies,
    ``dup_loss``; ``through_encoder``: MC dropout inside the encoder), all from the method specs.
    Every method of ``METHODS`` is timed, in its order (a ``per_loss`` method once per DUP loss, as
    ``<method>_<loss>``)."""
    from uamt.models.specs import METHODS

    sizes = {"mc_samples": mc_samples, "ensemble_size": ensemble_size}
    plan: dict[str, dict] = {}
    for name, spec in METHODS.items():
        variants = [(f"{name}_{loss}", loss) for loss in dup_losses] if spec.per_loss else [(name, None)]
        for row, loss in variants:
            info: dict[str, Any] = {
                "method": name,
                "label": spec.cost_label.format(**sizes, loss=loss),
                "passes": spec.cost.count("passes", **sizes),
                "models": spec.cost.count("networks", **sizes),
            }
            if spec.same_training_as:
                info["derived"] = spec.same_training_as
            if spec.cost.through_encoder:
                info["through_encoder"] = True
            if loss is not None:
                info["dup_loss"] = loss
            plan[row] = info
    return plan


def _copy_as(source_dir: Path, method: str, out_dir: Path) -> Path:
    # The pipeline's own derivation (stage train_base), so the copy costs what the pipeline pays.
    from uamt.models.shared_training import derive

    return derive(source_dir, method, out_dir)


def encoding_cost(encoder, texts: list[str], dtype: str | None = None, warmup: int = 8) -> dict[str, Any]:
    """Seconds to encode ``texts`` into a fresh temporary cache (every text new), after a warm-up.

    The warm-up (``warmup`` throw-away texts) pays the one-off model load, so the figure is the
    steady cost per text that a new segment adds.
    """
    from uamt.encoders import EmbeddingCache

    if not texts:
        raise DataError("encoding cost: no texts to encode")
    with tempfile.TemporaryDirectory(prefix="uamt-cost-encode-") as tmp:
        cache = EmbeddingCache(tmp, encoder, dtype=dtype)
        cache.get([f"warm-up sentence number {i} for the encoder." for i in range(warmup)])
        _, seconds, cpu = timed(lambda: cache.get(list(texts)))
    return {
        "texts": len(texts),
        "seconds": seconds,
        "cpu_seconds": cpu,
        "cpu_ms_per_text": 1000 * cpu / len(texts),
        "texts_per_s": len(texts) / seconds,
        "ms_per_text": 1000 * seconds / len(texts),
        "mean_chars": float(np.mean([len(t) for t in texts])),
    }


def measure_costs(
    settings: CostSettings,
    train_cfg,
    dup_cfg,
    tables: dict[str, pd.DataFrame],
    features,
    encoder,
    workdir: str | Path,
    log: Callable[[str], None] = lambda message: None,
    mc_encoder=None,
) -> dict[str, Any]:
    """Train and time every method, time inference, encoding and MCD through the encoder.

    Parameters
    ----------
    settings : CostSettings
    train_cfg, dup_cfg : TrainConfig
        ``train_base`` and ``train_dup`` settings (``epochs`` overrides their epochs / patience).
    tables : dict of DataFrame
        Canonical-table rows ``train`` (d_q), ``dup_train`` (d_e), ``dev``, ``test``, already sliced.
    features : callable
        ``texts -> float32 [n, num_layers, dim]`` (the embedding cache); warmed on every text first.
    encoder : PooledEncoder
        For the encoding cost and ``mcd_full`` (anything with ``encoder_id``, ``num_layers``, ``dim``,
        ``pooled_layers``).
    workdir : path
        Where the timed models are written (a temporary folder).
    mc_encoder : PooledEncoder, optional
        The torch encoder of the same weights that ``mcd_full`` runs dropout through, when ``encoder``
        is an ONNX export (frozen: no dropout); default ``encoder``.

    Returns
    -------
    dict
        ``machine`` (CPUs, torch threads used and default, load average), ``data`` (rows),
        ``settings``, ``methods`` (``method -> {label, passes, models, train_s, train_cpu_s,
        train_own_s, train_note, infer_s_per_1k, infer_cpu_s_per_1k, seg_per_s, cold_seg_per_s,
        cold_cpu_s_per_1k, measured}``: wall and CPU seconds, ``cold`` = encoding included),
        ``encoding``, ``features_warm_s``, ``wall_s``.
    """
    import torch

    default_threads = torch.get_num_threads()
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)
    try:
        result = _measure(
            settings, train_cfg, dup_cfg, tables, features, encoder, mc_encoder or encoder, Path(workdir), log
        )
    finally:
        torch.set_num_threads(default_threads)
    result["machine"]["torch_default_threads"] = default_threads
    return result


def _measure(
    settings, train_cfg, dup_cfg, tables, features, encoder, mc_encoder, workdir: Path, log
) -> dict[str, Any]:
    from uamt.models import load, train
    from uamt.models.specs import get_spec

    started = time.perf_counter()
    machine = machine_info()
    workdir = Path(workdir)
    for name in ("train", "dup_train", "dev", "test"):
        if name not in tables or tables[name].empty:
            raise DataError(f"cost: table {name!r} is missing or empty")
    if settings.epochs is not None:
        fixed = {"max_epochs": settings.epochs, "patience": settings.epochs}
        train_cfg, dup_cfg = train_cfg.replace(**fixed), dup_cfg.replace(**fixed)
    mc = train_cfg.mc_samples
    plan = method_plan(mc, train_cfg.ensemble_size, settings.dup_losses)
    if not settings.full_mc_rows:  # the methods that run the encoder in every pass are left out
        plan = {row: info for row, info in plan.items() if not info.get("through_encoder")}

    # Every row's embeddings read once before any timing, so no method pays the cache's first read.
    every = pd.concat([tables[n] for n in ("train", "dup_train", "dev", "test")], ignore_index=True)
    _, warm_s, _ = timed(lambda: features(distinct_texts(every)))
    log(f"features warmed in {warm_s:.1f} s")
    # One-off costs of the first fit in a process (Lightning set-up, first allocations) are paid by
    # a throw-away model, not by whichever method happens to be timed first.
    batch = train_cfg.batch_size
    _, warm_fit_s, _ = timed(
        lambda: train(
            "point",
            train_cfg.replace(max_epochs=1, patience=1),
            tables["train"].head(2 * batch),
            tables["dev"].head(batch),
            features,
            workdir / "warm-up",
        )
    )
    log(f"warm-up fit in {warm_fit_s:.1f} s")

    paths: dict[str, Path] = {}
    train_s: dict[str, tuple[float, float]] = {}  # (wall, cpu)
    for method, info in plan.items():
        out = workdir / method
        if "derived" in info:
            paths[method], *train_s[method] = timed(
                lambda m=method, info=info, out=out: _copy_as(paths[info["derived"]], m, out)
            )
        elif "dup_loss" in info:
            cfg = dup_cfg.replace(dup_loss=info["dup_loss"])
            paths[method], *train_s[method] = timed(
                lambda cfg=cfg, out=out, info=info: train(
                    info["method"],
                    cfg,
                    tables["dup_train"],
                    tables["dev"],
                    features,
                    out,
                    base_model_dir=paths["point"],
                )
            )
        else:
            reads_rule = "kl_missing_std" in get_spec(info["method"]).train_keys
            cfg = train_cfg.replace(kl_missing_std=settings.kl_missing_std) if reads_rule else train_cfg
            paths[method], *train_s[method] = timed(
                lambda m=method, cfg=cfg, out=out: train(
                    m, cfg, tables["train"], tables["dev"], features, out
                )
            )
        log(f"trained {method} in {train_s[method][0]:.1f} s (CPU {train_s[method][1]:.1f} s)")

    test = tables["test"]
    texts_per_segment = len(distinct_texts(test)) / len(test)
    encoding = encoding_cost(encoder, distinct_texts(test)[: settings.encode_texts])
    encoding["texts_per_segment"] = texts_per_segment
    encoding["ms_per_segment"] = encoding["ms_per_text"] * texts_per_segment
    encoding["ms_per_new_segment"] = encoding["ms_per_text"] * (3 if "ref" in test.columns else 2)
    log(f"encoding: {encoding['texts_per_s']:.1f} texts/s")
    encode_s_per_segment = encoding["ms_per_segment"] / 1000
    encode_cpu_per_segment = encoding["cpu_ms_per_text"] * texts_per_segment / 1000

    methods: dict[str, dict] = {}
    for method, info in plan.items():
        model = load(paths[method])
        own = train_s[method]
        if "derived" in info:
            before, note = train_s[info["derived"]], f"{info['derived']} training + weight copy"
        elif "dup_loss" in info:
            before, note = train_s["point"], "M_Q (point) + M_E"
        else:
            before, note = (0.0, 0.0), f"{info['models']} model(s)"
        if info.get("through_encoder"):
            rows = test.head(settings.full_mc_rows)
            passes = settings.full_mc_passes
            model.predict(rows.head(2), features, n_samples=2, encoder=mc_encoder)  # warm-up
            wall, cpu = best_of(
                lambda model=model, rows=rows, passes=passes: model.predict(
                    rows, features, n_samples=passes, encoder=mc_encoder
                ),
                1,
            )
            scale = mc / passes / len(rows)  # per segment, at mc passes
            per_segment, cpu_per_segment = wall * scale, cpu * scale
            measured = f"{passes} passes on {len(rows)} rows, extrapolated to {mc}"
            cold, cold_cpu = per_segment, cpu_per_segment  # every pass already runs the encoder
        else:
            model.predict(test.head(8), features)  # warm-up (first-call allocations)
            wall, cpu = best_of(lambda model=model: model.predict(test, features), settings.repeats)
            per_segment, cpu_per_segment = wall / len(test), cpu / len(test)
            measured = f"best of {settings.repeats} on {len(test)} rows"
            cold = per_segment + encode_s_per_segment
            cold_cpu = cpu_per_segment + encode_cpu_per_segment
        methods[method] = {
            **{k: info[k] for k in ("label", "passes", "models")},
            "train_s": before[0] + own[0],
            "train_cpu_s": before[1] + own[1],
            "train_own_s": own[0],
            "train_note": note,
            "infer_s_per_1k": 1000 * per_segment,
            "infer_cpu_s_per_1k": 1000 * cpu_per_segment,
            "seg_per_s": 1 / per_segment,
            "cold_seg_per_s": 1 / cold,
            "cold_cpu_s_per_1k": 1000 * cold_cpu,
            "measured": measured,
        }
        log(f"{method}: {1 / per_segment:.0f} seg/s")
    machine["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "machine": machine,
        "data": {
            "datasets": sorted(set(tables["train"]["dataset"])) if "dataset" in tables["train"] else None,
            **{f"{name}_rows": len(tables[name]) for name in ("train", "dup_train", "dev", "test")},
        },
        "settings": {
            **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings).items()},
            "hidden_sizes": list(train_cfg.hidden_sizes),
            "batch_size": train_cfg.batch_size,
            "max_epochs": train_cfg.max_epochs,
            "patience": train_cfg.patience,
            "mc_samples": mc,
            "ensemble_size": train_cfg.ensemble_size,
            "bottleneck_size": dup_cfg.bottleneck_size,
        },
        "methods": methods,
        "encoding": encoding,
        "features_warm_s": warm_s,
        "warm_up_fit_s": warm_fit_s,
        "wall_s": time.perf_counter() - started,
    }


def write_findings(
    settings: CostStageSettings,
    pipeline: PipelineConfig,
    train_cfg: TrainConfig,
    dup_cfg: TrainConfig,
    encode: EncodeConfig,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Path]:
    """The stage ``exp_cost``: sample the rows of ``pipeline.datasets``, train and time every method in
    a temporary folder, write ``cost.json`` and ``cost.png``; returns their paths."""
    from uamt.encoders import get_encoder
    from uamt.experiments.common import open_experiment_features
    from uamt.pipeline_config import read_split

    splits = {
        "train": (train_cfg.train_split, settings.rows),
        "dup_train": (dup_cfg.train_split, settings.rows),
        "dev": (train_cfg.dev_split, settings.dev_rows),
        "test": ("test", settings.test_rows),
    }
    tables = {
        name: sample_rows(
            read_split(pipeline.prepared_dir, split, pipeline.datasets),
            n,
            settings.seed,
            f"{pipeline.prepared_dir}/{split}",
        )
        for name, (split, n) in splits.items()
    }
    features = open_experiment_features(encode)
    encoder = getattr(features, "encoder", None) or get_encoder(encode.encoder)
    # MC dropout through the encoder needs the torch module: an ONNX export has no dropout.
    mc_encoder = (
        encoder
        if encode.encoder.runtime == "torch"
        else get_encoder(replace(encode.encoder, runtime="torch"))
    )
    with tempfile.TemporaryDirectory(prefix="uamt-cost-") as workdir:
        result = measure_costs(
            settings.measured,
            train_cfg,
            dup_cfg,
            tables,
            features,
            encoder,
            workdir,
            log=log,
            mc_encoder=mc_encoder,
        )
    return {
        "result": write_result(NAME, result, settings.metrics_dir),
        "figure": plot_costs(result, Path(settings.figures_dir) / FIGURE),
    }


# ----------------------------------------------------------------------------- findings


def _ratio(result: dict, method: str, other: str, key: str) -> float | None:
    methods = result["methods"]
    if method not in methods or other not in methods:
        return None
    a, b = methods[method][key], methods[other][key]
    return None if a is None or b in (None, 0) else a / b


def _x(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}x" if value >= 1 else f"{value:.2g}x"


def _verdict(checks: list[bool | None]) -> str:
    known = [c for c in checks if c is not None]
    if not known:
        return "n/a"
    return "held" if all(known) else "not held" if not any(known) else "partly"


def report_findings(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(finding, what the paper reports, what we measured -- starting with held / not held / partly).

    Ratios are of CPU time (robust to the other load of a shared machine): training (fixed epochs)
    and inference per segment with a warm cache; the paper's MCD, which runs the encoder in every
    pass, is compared end to end (encoding included on both sides).
    """
    rows = []
    inf, trn, cold = "infer_cpu_s_per_1k", "train_cpu_s", "cold_cpu_s_per_1k"
    # MCD: many forward passes at inference.
    head = _ratio(result, "mcd_head", "hts", inf)
    full = _ratio(result, "mcd_full", "hts", cold)
    rows.append(
        (
            "MC dropout (100 passes) makes inference much costlier than one pass",
            "MCD and HTS+MCD have by far the largest inference times (Fig. 3)",
            f"{_verdict([r >= COSTLIER if r is not None else None for r in (head, full)])}: "
            f"inference CPU vs HTS: MCD head {_x(head)}, HTS+MCD head {_x(_ratio(result, 'hts_mcd', 'hts', inf))}; "
            f"MCD through the encoder (extrapolated) vs HTS incl. encoding {_x(full)}",
        )
    )
    de_train = _ratio(result, "ensemble", "point", trn)
    de_inf = _ratio(result, "ensemble", "point", inf)
    size = result["settings"]["ensemble_size"]
    rows.append(
        (
            f"A deep ensemble costs ~{size}x one model in training and inference",
            f"DE increases training and inference costs {size}-fold (§5.4)",
            f"{_verdict([r >= COSTLIER if r is not None else None for r in (de_train, de_inf)])}: "
            f"DE vs point CPU: training {_x(de_train)}, inference {_x(de_inf)}",
        )
    )
    light = {m: (_ratio(result, m, "point", trn), _ratio(result, m, "point", inf)) for m in ("hts", "kl")}
    rows.append(
        (
            "HTS and KL cost about one model",
            "HTS and KL have much lighter costs (§5.4)",
            f"{_verdict([r <= SIMILAR if r is not None else None for pair in light.values() for r in pair])}: "
            + "; ".join(
                f"{m.upper()} vs point CPU: training {_x(t)}, inference {_x(i)}"
                for m, (t, i) in light.items()
            ),
        )
    )
    from uamt.models.specs import per_loss_rows

    dups = per_loss_rows(result["methods"])
    if dups:
        dup = "dup_hts" if "dup_hts" in dups else dups[0]
        vs_hts_train = _ratio(result, dup, "hts", trn)
        vs_hts_inf = _ratio(result, dup, "hts", inf)
        if "mcd_full" in result["methods"]:
            vs_mcd, mcd_name = _ratio(result, dup, "mcd_full", cold), "MCD through the encoder"
        else:
            vs_mcd, mcd_name = _ratio(result, dup, "mcd_head", inf), "MCD head"
        vs_de = _ratio(result, dup, "ensemble", trn)
        checks = [None if r is None else r > 1 for r in (vs_hts_train, vs_hts_inf)]
        checks += [None if r is None else r < 1 for r in (vs_mcd, vs_de)]
        rows.append(
            (
                "DUP costs more than HTS (a second model) but far less than MCD / DE",
                "DUP is light, with higher costs than HTS/KL from the second system (§5.4)",
                f"{_verdict(checks)}: {result['methods'][dup]['label']} vs HTS CPU: training "
                f"{_x(vs_hts_train)}, inference {_x(vs_hts_inf)}; inference vs {mcd_name} {_x(vs_mcd)}, "
                f"training vs DE {_x(vs_de)}",
            )
        )
    return rows


# ----------------------------------------------------------------------------- figure and report


def plot_costs(result: dict[str, Any], path: str | Path) -> Path:
    """Two bar panels (CPU seconds): training, and inference per 1000 segments (log scale)."""
    plt = pyplot()
    methods = list(result["methods"])
    labels = [result["methods"][m]["label"] for m in methods]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.42 * len(methods) + 1.8), sharey=True)
    y = np.arange(len(methods))
    train = [result["methods"][m]["train_cpu_s"] for m in methods]
    infer = [result["methods"][m]["infer_cpu_s_per_1k"] for m in methods]
    extrapolated = ["extrapolated" in result["methods"][m]["measured"] for m in methods]
    axes[0].barh(y, train, color="tab:blue")
    axes[0].set(xlabel="training CPU time (s)", title=f"Training ({result['data']['train_rows']} rows)")
    colours = ["tab:gray" if e else "tab:orange" for e in extrapolated]
    axes[1].barh(y, infer, color=colours)
    encode = _encode_cpu_ms_per_segment(result)
    axes[1].axvline(encode, color="k", ls="--", lw=1, label=f"encoding, once per segment ({encode:.3g} s/1k)")
    axes[1].set(
        xscale="log",
        xlabel="inference CPU time (s per 1000 segments)",
        title="Inference (warm cache; grey: encoder in every pass)",
    )
    axes[1].legend(fontsize=8, loc="lower right")
    for ax, values in ((axes[0], train), (axes[1], infer)):
        for i, v in enumerate(values):
            ax.annotate(
                f"{v:.3g}", (v, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7
            )
    axes[0].set_yticks(y, labels, fontsize=8)
    axes[0].invert_yaxis()
    machine = result["machine"]
    fig.suptitle(
        f"{machine['cpu_count']} CPUs, torch threads {machine['torch_threads']} (grey: extrapolated)",
        fontsize=9,
    )
    return save_figure(fig, path)


def _encode_cpu_ms_per_segment(result: dict[str, Any]) -> float:
    enc = result["encoding"]
    return enc["cpu_ms_per_text"] * enc["texts_per_segment"]


def render(result: dict[str, Any]) -> str:
    """The markdown section of reports/experiments.md (``templates/cost.md.j2``)."""
    methods = result["methods"]
    key = "infer_cpu_s_per_1k"
    encode_share = None
    if "hts" in methods:
        encode = _encode_cpu_ms_per_segment(result)
        encode_share = encode / (encode + methods["hts"][key])
    return rendering.render(
        NAME,
        result,
        section=section_number(NAME),
        figure=FIGURE,
        findings=report_findings(result),
        fastest=min(methods, key=lambda m: methods[m][key]),
        slowest=max(methods, key=lambda m: methods[m][key]),
        encode_share=encode_share,
    )
