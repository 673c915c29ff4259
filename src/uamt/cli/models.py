"""``uamt train`` and ``uamt predict``: train an estimator on the prepared splits, score a split.

Data come from ``<encode.prepared_dir>/<split>.parquet`` and the embeddings from the cache of
``encode.encoder`` under ``encode.cache_dir`` (texts missing from the cache are encoded and stored).
``uamt predict`` writes the raw predictions (training score scale); with ``--calibrate-on dev`` it also
fits on dev the distribution the calibrate stage serves (:func:`uamt.model_evaluation.fit_served_distribution`:
σ's weight, the point mass at the top, the rearrangement in μ, the reference factors, and the unseen-LP
widening with the calibration held out) and adds its answers on the human scale, clipped to the scale
as ``uamt score`` clips them.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _features(params: Path):
    """(EncodeConfig, features callable over the embedding cache)."""
    from uamt.core.config import load_section
    from uamt.encoders import EmbeddingCache, EncodeConfig, get_encoder
    from uamt.models.data import features_from_cache

    cfg = load_section(EncodeConfig, "encode", params)
    encoder = get_encoder(cfg.encoder)
    cache = EmbeddingCache(cfg.cache_dir, encoder, dtype=cfg.dtype, shard_size=cfg.shard_size)
    return cfg, features_from_cache(cache)


def _read_split(prepared_dir: str, split: str):
    import pandas as pd

    from uamt.core.errors import DataError

    path = Path(prepared_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(f"{path}: split {split!r} not found (run `uamt data prepare`)")
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a corrupt file
        raise DataError(f"{path}: not a readable parquet file (truncated or corrupt?): {exc}") from None


def _train(args: argparse.Namespace) -> int:
    from uamt.core.errors import UamtError
    from uamt.models import get_method, load_train_config, train

    try:
        get_method(args.method)
    except ValueError as exc:
        raise UamtError(str(exc)) from exc
    cfg = load_train_config(args.method, args.params)
    if args.reference_free:
        cfg = cfg.as_reference_free()
    encode_cfg, features = _features(args.params)
    train_df = _read_split(encode_cfg.prepared_dir, args.train_split or cfg.train_split)
    dev_df = _read_split(encode_cfg.prepared_dir, args.dev_split or cfg.dev_split)
    out = Path(args.out or cfg.out_dir.replace("{method}", args.method))
    path = train(args.method, cfg, train_df, dev_df, features, out, base_model_dir=args.base_model)
    print(f"trained {args.method} on {len(train_df)} rows -> {path}")
    return 0


#: The split the calibration is never fitted on: it only measures the calibrated model.
HELD_OUT_SPLIT = "test"


def _evaluation_settings(params: Path):
    """The ``evaluate:`` section of ``params`` (the calibrate stage's settings), defaults if absent."""
    from uamt.core.config import load_section, read_params
    from uamt.uncertainty import EvaluationSettings

    if "evaluate" not in read_params(params):
        return EvaluationSettings()
    return load_section(EvaluationSettings, "evaluate", params)


def _served_scale(params: Path):
    """The score scale of the ``pipeline:`` section's datasets in ``params`` (its bounds, which the
    calibrate stage clips to and puts a point mass at the top of, and its default risk threshold, as
    ``uamt score`` has them); None without that section."""
    from uamt.core.config import read_params
    from uamt.pipeline_config import SECTION, load_pipeline
    from uamt.serving.calibrated_predictor import scale_for

    if SECTION not in read_params(params):
        return None
    return scale_for(load_pipeline(params).datasets)


def with_calibration(table, calibration, confidence: float, risk_threshold: float, bounds=None):
    """``table`` plus the served answers on the human scale of the calibration split, as ``uamt score``
    gives them: ``mu_calibrated``, ``sigma_calibrated`` (the served distribution's standard
    deviation), the central interval ``lower``, ``upper`` at ``confidence`` and ``risk``
    :math:`P(Q \\le` ``risk_threshold``:math:`)`, clipped to the scale's ``bounds`` (``clipped``
    says where; none without bounds)."""
    import numpy as np
    import pandas as pd

    from uamt.serving.calibrated_predictor import clip_to_scale

    lp = table["lp"].astype(str).to_numpy(dtype=object)
    raw = (table["mu"].to_numpy(dtype=float), table["sigma"].to_numpy(dtype=float))
    mu_cal, sigma_cal = calibration.apply(*raw, lp=lp)
    lower, upper = calibration.interval(*raw, confidence, lp=lp)
    served = pd.DataFrame({
        "mu": mu_cal, "sigma": sigma_cal, "lower": lower, "upper": upper,
        "risk": calibration.served_risk(*raw, risk_threshold, lp=lp),
    })
    served = clip_to_scale(served, bounds, risk_threshold)
    return table.assign(
        mu_calibrated=served["mu"].to_numpy(), sigma_calibrated=served["sigma"].to_numpy(),
        lower=served["lower"].to_numpy(), upper=served["upper"].to_numpy(), risk=served["risk"].to_numpy(),
        clipped=served["clipped"].to_numpy() if "clipped" in served else np.zeros(len(table), dtype=bool),
    )


def _write_table(table, out: Path) -> None:
    from uamt.core.fileio import atomic_path

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        if out.suffix == ".csv":
            table.to_csv(tmp, index=False)
        else:
            table.to_parquet(tmp, index=False)


def _predict(args: argparse.Namespace) -> int:
    import math

    from uamt.core.errors import UamtError
    from uamt.models import load

    if args.calibrate_on == HELD_OUT_SPLIT:
        raise UamtError(
            f"--calibrate-on {HELD_OUT_SPLIT}: calibration is fitted on dev, never on {HELD_OUT_SPLIT} "
            f"(the {HELD_OUT_SPLIT} split measures the calibrated model); use --calibrate-on dev"
        )
    from uamt.serving.scorer import check_confidence

    check_confidence(args.confidence, "--confidence")
    if args.calibrate_on:  # what the calibration needs is checked before anything is predicted
        settings = _evaluation_settings(args.params)
        scale = _served_scale(args.params)
        risk_threshold = args.risk_threshold
        if risk_threshold is None:
            risk_threshold = settings.low_score_threshold if scale is None else scale.default_risk_threshold
        if risk_threshold is None:
            raise UamtError(
                f"{args.params}: no pipeline datasets and evaluate.low_score_threshold is null; give --risk-threshold"
            )
        if not math.isfinite(risk_threshold):
            raise UamtError(f"--risk-threshold must be a finite number, got {risk_threshold}")
    encode_cfg, features = _features(args.params)
    df = _read_split(encode_cfg.prepared_dir, args.split)
    model = load(args.model)
    table = model.predictions_table(df, features, n_samples=args.n_samples)
    out = Path(args.out or Path(args.model) / f"predictions_{args.split}.parquet")
    note = ""
    if args.calibrate_on:
        from uamt.model_evaluation import fit_served_distribution
        from uamt.serving.model_calibration import fit_model_unseen_lp_sigma_factor, with_unseen_factor
        from uamt.serving.multi_reference import fit_reference_factors

        bounds = None if scale is None else scale.bounds
        dev_df = _read_split(encode_cfg.prepared_dir, args.calibrate_on)
        dev_table = model.predictions_table(dev_df, features, n_samples=args.n_samples)
        calibration, _ = fit_served_distribution(
            dev_table, model.method, settings, bounds, splits=(args.calibrate_on,),
            reference_factors=lambda fitted: fit_reference_factors(
                Path(args.model), dev_df, features, fitted, settings.min_lp_rows
            ),
        )
        # No leave-one-LP-out models here: the widening is fitted with the calibration held out.
        factor, _ = fit_model_unseen_lp_sigma_factor(dev_table, model.method, calibration, settings=settings, bounds=bounds)
        calibration = with_unseen_factor(calibration, factor)
        table = with_calibration(table, calibration, args.confidence, risk_threshold, bounds)
        calibration_path = out.with_name(f"{out.name}.calibration.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        calibration.save(calibration_path)
        note = f"; calibrated on {args.calibrate_on} ({len(dev_table)} rows) -> {calibration_path}"
    _write_table(table, out)
    print(f"{model.method}: scored {len(table)} rows of {args.split} -> {out}{note}")
    return 0


def register(subparsers) -> None:
    from uamt.core.config import DEFAULT_PARAMS

    p = subparsers.add_parser("train", help="train an uncertainty-aware estimator on the prepared splits")
    # Not enumerated here: the names live in uamt.models.specs.METHODS, which imports torch.
    p.add_argument("--method", required=True, help="a method of uamt.models.specs (e.g. point, hts, dup)")
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
    q.add_argument(
        "--calibrate-on",
        metavar="SPLIT",
        help="also predict SPLIT (e.g. dev), fit there the distribution the calibrate stage serves, add "
        "mu_calibrated, sigma_calibrated, lower, upper, risk, clipped and write OUT.calibration.json (never test)",
    )
    q.add_argument(
        "--confidence", type=float, default=0.9, help="level of the lower/upper interval (default 0.9)"
    )
    q.add_argument(
        "--risk-threshold", type=float,
        help="chi of the risk column P(score <= chi) (default: the scale's, as uamt score; else "
        "evaluate.low_score_threshold)",
    )
    q.set_defaults(handler=_predict)
