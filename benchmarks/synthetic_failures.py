"""HTS trained with and without MetricX-style synthetic failure rows (and with and without row
features in the head): PPS / AUROC on test, challenge set.

For each ``--fractions`` value f, trains the HTS model (train_base's settings of params.yaml) on the
pipeline's d_q rows (``--train-rows``: a seeded random subset, stated in the output) plus
``uamt.challenge.with_synthetic_failures(d_q, f)``, early-stopped on dev; with ``--row-features``
each fraction is trained twice, without and with those surface features read by the head
(``train_base.row_features``, :mod:`uamt.models.row_features`); ``--nll-beta`` trains every variant
with that beta-NLL weight (``train_base.nll_beta``, :func:`uamt.models.losses.nll_weights`) and
``--synthetic-nll-beta`` gives the synthetic rows their own (``train_base.synthetic_nll_beta``).  Each variant predicts its
calibration splits (evaluate.calibration_splits: dev and d_e, as the pipeline calibrates a d_q
model) and test; fits the served calibration there (evaluate's settings, ``--calibration`` pins the
candidate so every variant is served the same way); and reports the quality table (uamt.quality)
and the challenge set (300 perturbations per mode of good test rows, uamt.challenge) of each variant.
Embeddings: the ``encode:`` section's encoder and cache (``--cache`` overrides the folder).  The
perturbed and synthetic texts are encoded into that cache, which changes the ``encode`` stage's
output (``dvc status``): give ``--cache`` a copy of ``cache/embeddings`` to leave it as DVC recorded.

    cp -r cache/embeddings /tmp/embeddings
    python benchmarks/synthetic_failures.py --cache /tmp/embeddings --out reports/quality/synthetic [--fractions 0 0.01] \
        [--train-rows 8000] [--row-features chrf len_ratio_ref len_ratio_src copy_rate target_language_prob]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.challenge import MODES, challenge_set, with_synthetic_failures
from uamt.core.config import load_section
from uamt.data.datasets import scale_bounds
from uamt.encoders import EncodeConfig
from uamt.models import load, load_train_config, train
from uamt.pipeline_config import load_pipeline, open_features, read_split
from uamt.quality import join_texts, quality_table
from uamt.serving.model_calibration import fit_calibration
from uamt.uncertainty import EvaluationSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from challenge_set import served_mu_and_risk, summarise  # noqa: E402


def challenge_scores(
    model, calibration, test: pd.DataFrame, features, per_mode: int, chi: float, bounds, reference_free: bool = False
) -> pd.DataFrame:
    """Per mode: share of perturbations with served mu below the original's, mean risk of both."""
    perturbed = challenge_set(test, MODES, per_mode=per_mode, seed=0, min_score=-1.0)
    original = perturbed.assign(mt=perturbed["mt_original"])
    rows = []
    for frame in (original, perturbed):
        columns = ["src", "mt", "lp"] if reference_free else ["src", "mt", "ref", "lp"]
        raw = model.predict(frame[columns].reset_index(drop=True), features)
        rows.append(served_mu_and_risk(calibration, raw.assign(lp=frame["lp"].to_numpy()), bounds, chi))
    (mu0, risk0), (mu1, risk1) = rows
    scored = perturbed.assign(mu=mu1, risk=risk1, mu_original=mu0, risk_original=risk0)
    return summarise(scored)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--prepared", type=Path, default=Path("data/prepared"))
    parser.add_argument("--cache", type=Path, default=None, help="embedding cache (default: encode.cache_dir)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.01])
    parser.add_argument("--train-rows", type=int, default=None, help="seeded subset of d_q (default: all)")
    parser.add_argument("--max-epochs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None, help="training seed (default: train_base.seed)")
    parser.add_argument("--calibration", default="auto", help="evaluate.calibration for every variant")
    parser.add_argument("--per-mode", type=int, default=300)
    parser.add_argument("--nll-beta", type=float, default=None, help="train_base.nll_beta of every variant (default: params.yaml)")
    parser.add_argument(
        "--synthetic-nll-beta", type=float, default=None,
        help="train_base.synthetic_nll_beta of every variant: the synthetic rows' own beta (default: params.yaml)",
    )
    parser.add_argument("--qe", action="store_true", help="train the reference-free (QE) variant")
    parser.add_argument("--row-features", nargs="+", default=[], help="also train each fraction with these row features")
    parser.add_argument(
        "--row-features-only", action="store_true", help="train only the variants with --row-features (training is seeded: "
        "the plain variants' numbers are those of an earlier run with the same seed)"
    )
    args = parser.parse_args(argv)

    pipe = load_pipeline(args.params)
    settings = load_section(EvaluationSettings, "evaluate", args.params)
    import dataclasses

    settings = dataclasses.replace(settings, calibration=args.calibration)
    base_cfg = load_train_config("hts", args.params)
    if args.qe:
        base_cfg = base_cfg.as_reference_free()
    if args.max_epochs:
        base_cfg = base_cfg.replace(max_epochs=args.max_epochs)
    if args.seed is not None:
        base_cfg = base_cfg.replace(seed=args.seed)
    if args.nll_beta is not None:
        base_cfg = base_cfg.replace(nll_beta=args.nll_beta)
    if args.synthetic_nll_beta is not None:
        base_cfg = base_cfg.replace(synthetic_nll_beta=args.synthetic_nll_beta)
    encode = load_section(EncodeConfig, "encode", args.params)
    if args.cache is not None:
        encode = dataclasses.replace(encode, cache_dir=str(args.cache))
    features = open_features(encode)
    d_q = read_split(args.prepared, "d_q", pipe.datasets)
    if args.train_rows and args.train_rows < len(d_q):
        d_q = d_q.iloc[np.sort(np.random.default_rng(13).choice(len(d_q), args.train_rows, replace=False))].reset_index(drop=True)
    dev = read_split(args.prepared, base_cfg.dev_split, pipe.datasets)
    calibration_rows = pd.concat([read_split(args.prepared, s, pipe.datasets) for s in settings.calibration_splits], ignore_index=True)
    test = read_split(args.prepared, "test", pipe.datasets)
    bounds = scale_bounds(pipe.datasets)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    if args.row_features_only and not args.row_features:
        parser.error("--row-features-only needs --row-features")
    variants = [] if args.row_features_only else [(f, ()) for f in args.fractions]
    if args.row_features:
        variants += [(f, tuple(args.row_features)) for f in args.fractions]
    for fraction, row_features in variants:
        beta = f"_beta{base_cfg.nll_beta:g}" if base_cfg.nll_beta else ""
        if base_cfg.synthetic_nll_beta is not None:
            beta += f"_synthbeta{base_cfg.synthetic_nll_beta:g}"
        name = f"hts{'_qe' if args.qe else ''}{beta}_synthetic{fraction:g}{'+rows' if row_features else ''}"
        cfg = base_cfg.replace(row_features=list(row_features))
        train_df = with_synthetic_failures(d_q, fraction, seed=base_cfg.seed)
        start = time.perf_counter()
        model_dir = train("hts", cfg, train_df, dev, features, args.out / name)
        train_s = time.perf_counter() - start
        model = load(model_dir)
        start = time.perf_counter()
        calibration_table = model.predictions_table(calibration_rows, features)
        test_table = model.predictions_table(test, features)
        predict_s = time.perf_counter() - start
        calibration, _ = fit_calibration(calibration_table, "hts", settings=settings)
        quality = quality_table(join_texts(test_table, test, name), calibration, bounds)
        challenge = challenge_scores(model, calibration, test, features, args.per_mode, -5.0, bounds, args.qe)
        summary[name] = {
            "fraction": fraction,
            "seed": base_cfg.seed,
            "nll_beta": base_cfg.nll_beta,
            "synthetic_nll_beta": base_cfg.synthetic_nll_beta,
            "train_rows": len(d_q),
            "synthetic_rows": len(train_df) - len(d_q),
            "row_features": list(row_features),
            "train_seconds": train_s,
            "predict_seconds": predict_s,
            "predicted_rows": len(calibration_rows) + len(test),
            "served": calibration.selected,
            "quality": quality.to_dict("records"),
            "challenge": challenge.to_dict("records"),
        }
        print(
            f"\n## {name}: {len(d_q):,} d_q rows + {len(train_df) - len(d_q):,} synthetic, trained in {train_s:.0f} s; "
            f"{len(calibration_rows) + len(test):,} rows predicted in {predict_s:.0f} s; served {calibration.selected}"
        )
        print(quality[["dataset", "lp", "n", "pps", "chrf_r", "auroc_risk", "auroc_mu", "recall_worst", "width", "coverage"]].round(3).to_string(index=False))
        print(challenge.round(3).to_string(index=False))
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
