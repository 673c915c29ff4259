"""Frozen head vs full fine-tuning of the encoder (``train_base.finetune``), same encoder, same rows,
same device: PPS and AUROC for "MQM <= -5" per dataset x LP on the test split.

Both variants train the method (default HTS) with the product's code (``uamt.models.train``): the
frozen one with train_base's head settings on pooled layers, the fine-tuned one with the encoder inside
the network (COMET's layer-wise learning-rate decay, encoder frozen for ``--frozen-epochs``).  PPS is
the Pearson of the raw mu with MQM (a per-LP affine calibration does not change it).  The fine-tuning
path needs a GPU to be practical (``--device cuda``); on a CPU use ``--max-train-rows`` to try it.

    python benchmarks/finetune_encoder.py --rows data/prepared --encoder-path <hf folder> \
        --device cuda --epochs 2 --batch-size 16 --out /tmp/ft

``--rows`` is the prepared folder (d_q / dev / test parquet files, MQM datasets of params.yaml) or a
single parquet file with a ``split`` column.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from uamt.encoders import EncoderConfig, get_encoder
from uamt.models import load, load_train_config, train
from uamt.models.data import FeatureSource
from uamt.pipeline_config import load_pipeline, read_split
from uamt.quality import auroc_score


def read_rows(rows: Path, params: Path, limits: dict[str, int | None]) -> dict[str, pd.DataFrame]:
    if rows.is_dir():
        datasets = load_pipeline(params).datasets
        frames = {split: read_split(rows, split, datasets) for split in limits}
    else:
        table = pd.read_parquet(rows)
        frames = {split: table[table["split"] == split].reset_index(drop=True) for split in limits}
    out = {}
    for split, frame in frames.items():
        n = limits[split]
        if n is not None and n < len(frame):
            keep = np.sort(np.random.default_rng(13).choice(len(frame), n, replace=False))
            frame = frame.iloc[keep].reset_index(drop=True)
        out[split] = frame
    return out


def memoised(encoder, batch_size: int) -> FeatureSource:
    """Pooled layers embedded once per distinct text (both variants read the same table)."""
    seen: dict[str, np.ndarray] = {}

    def embed(texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in seen]
        for start in range(0, len(missing), 4096):
            chunk = missing[start : start + 4096]
            with torch.no_grad():
                pooled = encoder.pooled_layers(chunk, batch_size=batch_size).float().cpu().numpy()
            seen.update(zip(chunk, pooled, strict=True))
        return np.stack([seen[t] for t in texts])

    return FeatureSource(embed, encoder.encoder_id, encoder)


def per_lp(table: pd.DataFrame) -> list[dict]:
    """PPS of the raw mu and AUROC of -mu for "MQM <= -5", per (dataset, lp) of a predictions table."""
    rows = []
    for (dataset, lp), part in table.groupby(["dataset", "lp"]):
        human, mu = part["human"].to_numpy(float), part["mu"].to_numpy(float)
        rows.append(
            {"dataset": dataset, "lp": lp, "n": len(part), "pps": float(np.corrcoef(mu, human)[0, 1]),
             "auroc_bad": auroc_score(-mu, human <= -5.0)}
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--rows", type=Path, default=Path("data/prepared"))
    parser.add_argument("--encoder-name", default="hf")
    parser.add_argument("--encoder-path", default=None)
    parser.add_argument("--method", default="hts")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--encoder-learning-rate", type=float, default=1e-5)
    parser.add_argument("--frozen-epochs", type=float, default=0.3)
    parser.add_argument("--max-train-rows", type=int, default=None)
    parser.add_argument("--max-dev-rows", type=int, default=None)
    parser.add_argument("--max-test-rows", type=int, default=None)
    parser.add_argument("--variants", nargs="+", default=["frozen", "finetuned"], choices=["frozen", "finetuned"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    if args.device == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matrix products on Ampere and later
    splits = read_rows(
        args.rows, args.params, {"d_q": args.max_train_rows, "dev": args.max_dev_rows, "test": args.max_test_rows}
    )
    print({k: len(v) for k, v in splits.items()}, flush=True)
    encoder = get_encoder(
        EncoderConfig(name=args.encoder_name, path=args.encoder_path, runtime="torch", device=args.device, batch_size=64)
    )
    features = memoised(encoder, 64)
    start = time.perf_counter()
    features(list(pd.unique(pd.concat([f[c] for f in splits.values() for c in ("src", "mt", "ref")]).astype(str))))
    results = {"rows": {k: len(v) for k, v in splits.items()}, "encoder": encoder.encoder_id,
               "embed_seconds": time.perf_counter() - start, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "variants": {}}
    print(f"embedded in {results['embed_seconds']:.0f} s", flush=True)
    base = load_train_config(args.method, args.params).replace(
        accelerator="gpu" if args.device == "cuda" else "cpu", deterministic=False, synthetic_failures=0.0
    )
    settings = {
        "frozen": base,
        "finetuned": base.replace(
            finetune=True, max_epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
            encoder_learning_rate=args.encoder_learning_rate, nr_frozen_epochs=args.frozen_epochs,
        ),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for variant in args.variants:
        cfg = settings[variant]
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        model_dir = train(args.method, cfg, splits["d_q"], splits["dev"], features, args.out / variant, encoder=encoder)
        train_s = time.perf_counter() - start
        start = time.perf_counter()
        table = load(model_dir, encoder=encoder).predictions_table(splits["test"], features, encoder=encoder)
        predict_s = time.perf_counter() - start
        table.to_parquet(args.out / f"test_{variant}.parquet")
        results["variants"][variant] = {
            "train_seconds": train_s, "predict_seconds": predict_s,
            "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None,
            "settings": {k: getattr(cfg, k) for k in ("finetune", "max_epochs", "batch_size", "learning_rate",
                                                      "encoder_learning_rate", "nr_frozen_epochs", "layerwise_decay")},
            "per_lp": per_lp(table),
        }
        print(f"\n## {variant}: trained in {train_s:.0f} s, test predicted in {predict_s:.0f} s", flush=True)
        print(pd.DataFrame(results["variants"][variant]["per_lp"]).round(3).to_string(index=False), flush=True)
        (args.out / "summary.json").write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
