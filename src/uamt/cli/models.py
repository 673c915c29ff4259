"""``uamt train`` and ``uamt predict``: train an estimator on the prepared splits, score a split.

Data come from ``<encode.prepared_dir>/<split>.parquet`` and the embeddings from the cache of
``encode.encoder`` under ``encode.cache_dir`` (texts missing from the cache are encoded and stored).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path


def _features(params: Path):
    """(EncodeConfig, features callable over the embedding cache)."""
    from uamt.config import load_section
    from uamt.encoders import EmbeddingCache, get_encoder
    from uamt.models.data import features_from_cache
    from uamt.stages.encode import EncodeConfig

    cfg = load_section(EncodeConfig, "encode", params)
    encoder = get_encoder(cfg.encoder)
    cache = EmbeddingCache(cfg.cache_dir, encoder, dtype=cfg.dtype, shard_size=cfg.shard_size)
    return cfg, features_from_cache(cache)


def _read_split(prepared_dir: str, split: str):
    import pandas as pd

    from uamt.errors import DataError

    path = Path(prepared_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(f"{path}: split {split!r} not found (run `uamt data prepare`)")
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a corrupt file
        raise DataError(f"{path}: not a readable parquet file (truncated or corrupt?): {exc}") from None


def _train(args: argparse.Namespace) -> int:
    from uamt.errors import UamtError
    from uamt.models import get_method, load_train_config, train

    try:
        get_method(args.method)
    except ValueError as exc:
        raise UamtError(str(exc)) from exc
    cfg = load_train_config(args.method, args.params)
    if args.reference_free:
        cfg = cfg.replace(reference_free=True)
    encode_cfg, features = _features(args.params)
    train_df = _read_split(encode_cfg.prepared_dir, args.train_split or cfg.train_split)
    dev_df = _read_split(encode_cfg.prepared_dir, args.dev_split or cfg.dev_split)
    out = Path(args.out or cfg.out_dir.replace("{method}", args.method))
    path = train(args.method, cfg, train_df, dev_df, features, out, base_model_dir=args.base_model)
    print(f"trained {args.method} on {len(train_df)} rows -> {path}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from uamt.models import load

    encode_cfg, features = _features(args.params)
    df = _read_split(encode_cfg.prepared_dir, args.split)
    model = load(args.model)
    table = model.predictions_table(df, features, n_samples=args.n_samples)
    out = Path(args.out or Path(args.model) / f"predictions_{args.split}.parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        if out.suffix == ".csv":
            table.to_csv(tmp, index=False)
        else:
            table.to_parquet(tmp, index=False)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    print(f"{model.method}: scored {len(table)} rows of {args.split} -> {out}")
    return 0


def register(subparsers) -> None:
    from uamt.config import DEFAULT_PARAMS

    methods = ("point", "mcd_head", "mcd_full", "ensemble", "hts", "kl", "hts_mcd", "dup")
    p = subparsers.add_parser("train", help="train an uncertainty-aware estimator on the prepared splits")
    p.add_argument("--method", required=True, help=f"one of {', '.join(methods)}")
    p.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="params file (train_base/train_dup)")
    p.add_argument("--out", help="model folder (default: the section's out_dir)")
    p.add_argument("--reference-free", action="store_true", help="QE variant on <src, mt>")
    p.add_argument("--train-split", help="override train_split (e.g. d_q; d_e for dup)")
    p.add_argument("--dev-split", help="override dev_split")
    p.add_argument(
        "--base-model", help="dup: the trained base model folder (default train_dup.base_model_dir)"
    )
    p.set_defaults(handler=_train)

    q = subparsers.add_parser("predict", help="score a prepared split with a trained model")
    q.add_argument("--model", required=True, help="model folder written by `uamt train`")
    q.add_argument("--split", required=True, help="prepared split name (d_q, d_e, dev, test, ood)")
    q.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="params file (encode section)")
    q.add_argument(
        "--out", help="predictions table (.parquet or .csv; default MODEL/predictions_SPLIT.parquet)"
    )
    q.add_argument("--n-samples", type=int, help="MC dropout passes (default: the model's mc_samples)")
    q.set_defaults(handler=_predict)
