"""Which sentence encoder should be the CPU default?  Throughput and frozen-feature PPS.

1. Throughput: sentences/s of ``pooled_layers`` for each candidate encoder on ``--threads``
   CPU threads (default 2, the CI machine), on real WMT21 source sentences.
2. Quality (needs ``data/prepared``): for each encoder, COMET-style features
   ``[mt, ref, mt*ref, |mt-ref|, mt*src, |mt-src|]`` from the last layer or the mean of all
   layers, a ridge regression (alpha picked on ``dev``) or a small sklearn MLP trained on the
   ``d_q`` rows of ``--dataset`` (default wmt21_mqm), and the Pearson correlation (PPS) of its
   predictions with the human scores of the ``test`` rows of that dataset and of the ``ood``
   (TED MQM) rows, per language pair.  Sentence chrF is the lexical baseline.

Embeddings go through :class:`uamt.encoders.EmbeddingCache` (``--cache-root``, by default the
pipeline's ``cache/embeddings``), so a later ``encode`` stage reuses them.

    python benchmarks/encoder_choice.py --encoders minilm,use
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np


def mirror_sentences(n: int) -> list[str]:
    """``n`` distinct real sentences (WMT21 en-de and zh-en sources, interleaved) from the mirror."""
    root = Path(os.environ.get("UAMT_DATA_MIRROR", "/work/shared/data/github"))
    folder = root / "wmt-conference" / "wmt21-news-systems" / "txt" / "sources"
    streams = [
        (folder / name).read_text(encoding="utf-8").splitlines()
        for name in ("newstest2021.en-de.src.en", "newstest2021.zh-en.src.zh", "newstest2021.de-en.src.de")
    ]
    seen: dict[str, None] = {}
    for group in zip(*streams, strict=False):
        for text in group:
            if text.strip():
                seen.setdefault(text, None)
        if len(seen) >= n:
            break
    return list(seen)[:n]


def throughput(encoder, texts: list[str], batch_size: int) -> float:
    encoder.pooled_layers(texts[:8], batch_size=batch_size)  # warm-up (allocations, lazy loads)
    started = time.perf_counter()
    encoder.pooled_layers(texts, batch_size=batch_size)
    return len(texts) / (time.perf_counter() - started)


def comet_features(src: np.ndarray, mt: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """COMET estimator input ``[mt, ref, mt*ref, |mt-ref|, mt*src, |mt-src|]``, shape [n, 6 dim]."""
    return np.concatenate([mt, ref, mt * ref, np.abs(mt - ref), mt * src, np.abs(mt - src)], axis=1)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import pearsonr

    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(pearsonr(x, y)[0])


def fit_predict(kind: str, x_train, y_train, x_dev, y_dev, x_tests: list[np.ndarray], seed: int = 0):
    from sklearn.linear_model import Ridge
    from sklearn.neural_network import MLPRegressor
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x_train)
    x_train, x_dev = scaler.transform(x_train), scaler.transform(x_dev)
    x_tests = [scaler.transform(x) for x in x_tests]
    y_mean, y_std = float(np.mean(y_train)), float(np.std(y_train)) or 1.0
    y_scaled = (y_train - y_mean) / y_std
    if kind == "ridge":
        best = None
        for alpha in (1.0, 10.0, 100.0, 1000.0, 10000.0):
            model = Ridge(alpha=alpha).fit(x_train, y_scaled)
            score = pearson(model.predict(x_dev), y_dev) if len(y_dev) else -alpha
            if best is None or score > best[0]:
                best = (score, model)
        model = best[1]
    elif kind == "mlp":
        model = MLPRegressor(
            hidden_layer_sizes=(256,),
            alpha=1e-2,
            learning_rate_init=1e-3,
            early_stopping=True,
            validation_fraction=0.1,
            max_iter=200,
            random_state=seed,
        ).fit(x_train, y_scaled)
    else:
        raise ValueError(f"regressor={kind!r} not supported; choose from ['mlp', 'ridge']")
    return [model.predict(x) * y_std + y_mean for x in x_tests]


def quality_table(
    prepared: Path, encoders: dict, cache_root: Path, dataset: str, regressors: list[str], storage_dtype: str
):
    import pandas as pd
    import sacrebleu

    from uamt.encoders import EmbeddingCache

    frame = pd.concat([pd.read_parquet(p) for p in sorted(prepared.glob("*.parquet"))], ignore_index=True)
    frame = frame[frame["ref"].notna()]
    train = frame[(frame["dataset"] == dataset) & (frame["split"] == "d_q")]
    dev = frame[(frame["dataset"] == dataset) & (frame["split"] == "dev")]
    evals = {}
    for split_name, rows in (
        (f"{dataset}/test", frame[(frame["dataset"] == dataset) & (frame["split"] == "test")]),
        ("ted_mqm/ood", frame[(frame["dataset"] == "ted_mqm")]),
    ):
        for lp, group in rows.groupby("lp"):
            evals[f"{split_name} {lp}"] = group
    if train.empty or not evals:
        print(f"no d_q or evaluation rows for {dataset} in {prepared}; quality part skipped")
        return []
    print(
        f"train {dataset}/d_q: {len(train)} rows; dev {len(dev)}; "
        + ", ".join(f"{k}: {len(v)}" for k, v in evals.items())
    )
    results = []
    chrf = sacrebleu.metrics.CHRF()
    for name, group in evals.items():
        scores = np.array(
            [chrf.sentence_score(m, [r]).score for m, r in zip(group["mt"], group["ref"], strict=True)]
        )
        results.append(("chrF", "-", "-", name, pearson(scores, group["score"].to_numpy()), 0.0))
    for enc_name, encoder in encoders.items():
        cache = EmbeddingCache(cache_root, encoder)
        started = time.perf_counter()
        needed = pd.concat([train, dev, *evals.values()])
        cache.get(pd.unique(pd.concat([needed["src"], needed["mt"], needed["ref"]])).tolist())
        print(
            f"{enc_name}: cache filled in {time.perf_counter() - started:.0f} s ({cache.stats()['texts']} texts)"
        )
        for layers in ("last", "mean") if encoder.num_layers > 1 else ("last",):

            def feats(rows, layers=layers, cache=cache):
                pick = (lambda e: e[:, -1]) if layers == "last" else (lambda e: e.mean(axis=1))
                # storage_dtype float16 = exactly what EmbeddingCache(dtype="float16") returns
                embs = (
                    cache.get(rows[c].tolist()).astype(storage_dtype).astype(np.float32)
                    for c in ("src", "mt", "ref")
                )
                return comet_features(*(pick(e) for e in embs))

            x_train, x_dev = feats(train), feats(dev)
            x_evals = [feats(group) for group in evals.values()]
            for kind in regressors:
                started = time.perf_counter()
                preds = fit_predict(
                    kind, x_train, train["score"].to_numpy(), x_dev, dev["score"].to_numpy(), x_evals
                )
                seconds = time.perf_counter() - started
                for (name, group), pred in zip(evals.items(), preds, strict=True):
                    results.append(
                        (enc_name, layers, kind, name, pearson(pred, group["score"].to_numpy()), seconds)
                    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--encoders", default="minilm,use", help="comma-separated names of uamt.encoders.ENCODERS"
    )
    parser.add_argument("--hf-path", default=None, help="model folder / hub id for the hf encoder")
    parser.add_argument("--threads", default="2", help="comma-separated torch/BLAS thread counts to time")
    parser.add_argument("--n-throughput", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--prepared", type=Path, default=Path("data/prepared"))
    parser.add_argument("--cache-root", type=Path, default=Path("cache/embeddings"))
    parser.add_argument("--dataset", default="wmt21_mqm")
    parser.add_argument("--regressors", default="ridge,mlp")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument(
        "--storage-dtype",
        default="float32",
        choices=["float32", "float16"],
        help="round features as the cache would",
    )
    args = parser.parse_args(argv)

    import torch

    from uamt.encoders import EncoderConfig, get_encoder

    thread_counts = [int(t) for t in args.threads.split(",")]
    texts = mirror_sentences(args.n_throughput)
    encoders = {}
    print(f"throughput on {len(texts)} WMT21 source sentences, batch {args.batch_size}")
    print(
        f"{'encoder':<10} {'encoder_id':<24} {'layers x dim':>12} {'load s':>7} {'threads':>7} {'sent/s':>8}"
    )
    for name in args.encoders.split(","):
        started = time.perf_counter()
        cfg = EncoderConfig(
            name=name, path=args.hf_path if name == "hf" else None, batch_size=args.batch_size
        )
        encoder = get_encoder(cfg)
        load = time.perf_counter() - started
        encoders[name] = encoder
        shape = f"{encoder.num_layers} x {encoder.dim}"
        for threads in thread_counts:
            torch.set_num_threads(threads)
            if name == "use":
                encoder._model.threads = threads  # numpy BLAS threads (threadpoolctl)
            rate = throughput(encoder, texts, args.batch_size)
            print(f"{name:<10} {encoder.encoder_id:<24} {shape:>12} {load:7.1f} {threads:7d} {rate:8.1f}")
    torch.set_num_threads(thread_counts[-1])

    if args.skip_quality or not args.prepared.is_dir():
        if not args.skip_quality:
            print(f"{args.prepared} not found: quality part skipped")
        return 0
    results = quality_table(
        args.prepared, encoders, args.cache_root, args.dataset, args.regressors.split(","), args.storage_dtype
    )
    if results:
        print(
            f"\nPPS (Pearson with human scores); regressors trained on {args.dataset}/d_q; {args.storage_dtype}"
        )
        print(f"{'features':<10} {'layers':<6} {'model':<6} {'eval set':<28} {'PPS':>7} {'fit s':>6}")
        for enc_name, layers, kind, name, value, seconds in results:
            print(f"{enc_name:<10} {layers:<6} {kind:<6} {name:<28} {value:7.3f} {seconds:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
