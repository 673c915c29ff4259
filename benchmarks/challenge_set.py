"""Critical-error challenge set: does the served model score perturbed translations below their originals?

Builds the challenge set (uamt.challenge) from held-out test rows only (news MQM: WMT21 and WMT23;
rows rated MQM >= --min-score, so the original is a good translation), scores every original and every
perturbation with a registered model loaded through MLflow (pyfunc, pinned by version: nothing is
registered or changed in the store), and prints per mode: rows, share of perturbations scored
below their original (served mu), mean served risk P(MQM <= chi) of the perturbations and of their
originals, and the mean drop of mu; the goals (>= 95 % below; mean risk >= 0.5 for omission,
hallucination, untranslated and wrong-language) are marked.

    MLFLOW_TRACKING_URI=sqlite:////path/mlflow.db python benchmarks/challenge_set.py \
        --model models:/uamt-comet/1 --test data/prepared/test.parquet [--per-mode 300] [--out out.parquet]

``--model-dir`` scores a local model folder (a trained ``models/<method>``) with a calibration file
(``--calibration``) instead, for models that are not registered (the training variants compared).
The baseline every method is credited against, the point estimate + the served calibration:

    python benchmarks/challenge_set.py --model-dir models/point \
        --calibration "calibration/baselines/point+signed_mondrian_conformal.json"
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.challenge import MODES, challenge_set

#: Modes whose mean risk must reach 0.5 (the critical errors of the quality goals).
RISK_GOAL_MODES = ("omission_end", "omission_sentence", "unrelated", "gibberish", "untranslated", "wrong_language")


def summarise(scored: pd.DataFrame) -> pd.DataFrame:
    """Per mode (and ``all``): n, share below the original with its binomial standard error
    sqrt(p (1 - p) / n), mean risks, mean mu drop."""
    rows = []
    for mode, part in list(scored.groupby("mode", sort=False)) + [("all", scored)]:
        below = float((part["mu"] < part["mu_original"]).mean())
        rows.append(
            {
                "mode": mode,
                "n": len(part),
                "below_original": below,
                "below_original_se": float(np.sqrt(below * (1 - below) / max(len(part), 1))),
                "risk": float(part["risk"].mean()),
                "risk_original": float(part["risk_original"].mean()),
                "mu_drop": float((part["mu_original"] - part["mu"]).mean()),
            }
        )
    return pd.DataFrame(rows)


def served_mu_and_risk(calibration, rows: pd.DataFrame, bounds, chi: float) -> tuple[np.ndarray, np.ndarray]:
    """The served mu (clipped to ``bounds``) and risk P(MQM <= chi) of raw predictions ``rows``
    (``mu``, ``sigma``, ``lp``) through ``calibration``."""
    lp = rows["lp"].astype(str).to_numpy(dtype=object)
    mu, sigma = rows["mu"].to_numpy(float), rows["sigma"].to_numpy(float)
    return np.clip(calibration.center(mu, sigma, lp), *bounds), np.asarray(calibration.risk(mu, sigma, chi, lp))


def score_with_pyfunc(model_uri: str, frame: pd.DataFrame, chi: float, reference_free: bool = False) -> pd.DataFrame:
    import mlflow.pyfunc

    from uamt.registry.store import tracking_uri

    # the project's store (mlflow/) as the CLI reads it, not MLflow's own default in the working folder
    mlflow.set_tracking_uri(tracking_uri())
    model = mlflow.pyfunc.load_model(model_uri)
    columns = ["src", "mt", "lp"] if reference_free else ["src", "mt", "ref", "lp"]
    return model.predict(frame[columns], params={"risk_threshold": chi})


def score_with_model_dir(
    model_dir: Path, calibration_path: Path, frame: pd.DataFrame, chi: float, params: Path = Path("params.yaml")
) -> pd.DataFrame:
    """Raw mu/sigma of a local model folder on the rows, served through ``calibration_path``.  The
    texts are encoded by ``params``' ``encode:`` encoder (the one the pipeline's models are trained
    on) into a cache beside the model folder, so the pipeline's cache is left as DVC recorded it."""
    import dataclasses

    from uamt.core.config import load_section
    from uamt.encoders import EncodeConfig
    from uamt.models import load as load_model
    from uamt.pipeline_config import open_features
    from uamt.serving.model_calibration import Calibration, with_model_sigma

    model = load_model(model_dir)
    encode = load_section(EncodeConfig, "encode", params)
    features = open_features(dataclasses.replace(encode, cache_dir=str(Path(model_dir).parent / ".challenge-cache")))
    # A point model has no sigma: its placeholder 1, as the pipeline's baseline is served.
    raw = with_model_sigma(model.predict(frame[["src", "mt", "ref", "lp"]].reset_index(drop=True), features), model.method)
    mu, risk = served_mu_and_risk(Calibration.load(calibration_path), raw.assign(lp=frame["lp"].to_numpy()), (-25, 0), chi)
    return pd.DataFrame({"mu": mu, "risk": risk})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models:/uamt-comet/1", help="MLflow model URI (pinned version)")
    parser.add_argument("--model-dir", type=Path, default=None, help="score a local model folder instead")
    parser.add_argument("--calibration", type=Path, default=None, help="calibration JSON of --model-dir")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="encode: section for --model-dir")
    parser.add_argument("--qe", action="store_true", help="the model is reference-free (no ref column sent)")
    parser.add_argument("--test", type=Path, default=Path("data/prepared/test.parquet"))
    parser.add_argument("--datasets", nargs="+", default=["wmt21_mqm", "wmt23_mqm"])
    parser.add_argument("--per-mode", type=int, default=300)
    parser.add_argument("--min-score", type=float, default=-1.0)
    parser.add_argument("--chi", type=float, default=-5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the scored rows (parquet) and a .json summary")
    args = parser.parse_args(argv)

    test = pd.read_parquet(args.test)
    test = test[test["dataset"].isin(args.datasets)].reset_index(drop=True)
    perturbed = challenge_set(test, MODES, per_mode=args.per_mode, seed=args.seed, min_score=args.min_score)
    originals = perturbed.assign(mt=perturbed["mt_original"]).drop_duplicates(["src", "mt", "ref", "lp"])
    frame = pd.concat([originals, perturbed], ignore_index=True)
    start = time.perf_counter()
    if args.model_dir is not None:
        scores = score_with_model_dir(args.model_dir, args.calibration, frame, args.chi, args.params)
        label = str(args.model_dir)
    else:
        scores = score_with_pyfunc(args.model, frame, args.chi, reference_free=args.qe)
        label = args.model
    seconds = time.perf_counter() - start
    frame = frame.assign(mu=scores["mu"].to_numpy(float), risk=scores["risk"].to_numpy(float))
    first = frame.iloc[: len(originals)].set_index(["src", "mt", "ref", "lp"])[["mu", "risk"]]
    scored = frame.iloc[len(originals) :].reset_index(drop=True)
    key = pd.MultiIndex.from_frame(scored[["src", "mt_original", "ref", "lp"]])
    scored["mu_original"] = first["mu"].reindex(key).to_numpy()
    scored["risk_original"] = first["risk"].reindex(key).to_numpy()
    table = summarise(scored)
    print(f"model {label}: {len(frame):,} segments scored in {seconds:.0f} s ({len(frame) / seconds:.1f} seg/s)")
    print(f"challenge set: test rows of {', '.join(args.datasets)} rated >= {args.min_score:g}, seed {args.seed}\n")
    print("| mode | n | below original (± s.e.) | mean risk P(MQM≤−5) (original) | mean μ drop | goals |")
    print("|---|---|---|---|---|---|")
    for row in table.to_dict("records"):
        goals = [f"≥95 % {'✓' if row['below_original'] >= 0.95 else '✗'}"]
        if row["mode"] in RISK_GOAL_MODES:
            goals.append(f"risk≥.5 {'✓' if row['risk'] >= 0.5 else '✗'}")
        print(
            f"| {row['mode']} | {row['n']} | {row['below_original']:.3f} ± {row['below_original_se']:.3f} | "
            f"{row['risk']:.3f} ({row['risk_original']:.3f}) | "
            f"{row['mu_drop']:.2f} | {' '.join(goals)} |"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        scored.to_parquet(args.out)
        args.out.with_suffix(".json").write_text(json.dumps({"model": label, "seconds": seconds, "modes": table.to_dict("records")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
