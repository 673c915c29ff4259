"""What surface features (chrF, TER, length ratios, copy rate, target-language probability) add to the
served mu: a per dataset x LP least-squares stack fitted on dev, measured on test and on the challenge set.

The stack is ``human ~ a + b mu + c . features`` (features of uamt.surface_features, standardised on
dev) fitted on the model's dev predictions (the rows the calibration is fitted on, never test);
``mu`` is the served centre of ``calibration/<model>.json``.  Reported per dataset x LP on test:
PPS and AUROC for "MQM <= -5" and worst-2 % recall of mu alone vs the stack; with ``--challenge``
(the scored rows benchmarks/challenge_set.py wrote) also the share of perturbations the stack puts
below their original.  A stack is a measurement of the signal, not the head's feature block (which
would learn them jointly with the COMET features).

    python benchmarks/surface_features.py --root /work/main [--model hts] [--challenge scored.parquet]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.quality import ROW_KEYS, auroc_score, worst_recall_score
from uamt.serving.model_calibration import Calibration, with_model_sigma
from uamt.surface_features import FEATURES, surface_features


def served_center(calibration: Calibration, table: pd.DataFrame) -> np.ndarray:
    lp = table["lp"].astype(str).to_numpy(dtype=object)
    return np.clip(calibration.center(table["mu"].to_numpy(float), table["sigma"].to_numpy(float), lp), -25.0, 0.0)


def with_texts(table: pd.DataFrame, prepared: pd.DataFrame) -> pd.DataFrame:
    texts = prepared[list(ROW_KEYS) + ["src", "mt", "ref"]].drop_duplicates(list(ROW_KEYS))
    return table.merge(texts, on=list(ROW_KEYS), how="left", validate="one_to_one")


class Stack:
    """Least squares of the human score on [mu, features] per dataset x LP (standardised on dev)."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns
        self.fits: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def _design(self, frame: pd.DataFrame, mean, std) -> np.ndarray:
        x = (frame[self.columns].to_numpy(float) - mean) / std
        return np.column_stack([np.ones(len(frame)), x])

    def fit(self, dev: pd.DataFrame) -> Stack:
        for key, part in dev.groupby(["dataset", "lp"]):
            values = part[self.columns].to_numpy(float)
            mean, std = values.mean(axis=0), values.std(axis=0)
            std = np.where(std > 0, std, 1.0)
            coef, *_ = np.linalg.lstsq(self._design(part, mean, std), part["human"].to_numpy(float), rcond=None)
            self.fits[key] = (coef, mean, std)
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        out = np.full(len(frame), np.nan)
        for key, index in frame.groupby(["dataset", "lp"]).indices.items():
            coef, mean, std = self.fits[key]
            out[index] = self._design(frame.iloc[index], mean, std) @ coef
        return out


def variant_rows(test: pd.DataFrame, predictions: dict[str, np.ndarray]) -> list[dict]:
    """Per dataset x LP of ``test`` and per variant: n, PPS, AUROC of -prediction for "MQM <= -5" and
    recall of the worst 2 %."""
    rows = []
    for (dataset, lp), index in test.groupby(["dataset", "lp"]).indices.items():
        human = test["human"].to_numpy(float)[index]
        for name, pred in predictions.items():
            p = pred[index]
            rows.append(
                {
                    "dataset": dataset,
                    "lp": lp,
                    "variant": name,
                    "n": len(index),
                    "pps": float(np.corrcoef(p, human)[0, 1]),
                    "auroc_bad": auroc_score(-p, human <= -5.0),
                    "recall_worst": worst_recall_score(p, human, 0.02),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--model", default="hts")
    parser.add_argument("--challenge", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-ter", action="store_true", help="skip TER (slow on long paragraphs)")
    args = parser.parse_args(argv)
    calibration = Calibration.load(args.root / "calibration" / f"{args.model}.json")
    frames = {}
    start = time.perf_counter()
    for split in ("dev", "test"):
        table = with_model_sigma(pd.read_parquet(args.root / "predictions" / split / f"{args.model}.parquet"), args.model)
        table = with_texts(table, pd.read_parquet(args.root / "data" / "prepared" / f"{split}.parquet")).reset_index(drop=True)
        table["center"] = served_center(calibration, table)
        frames[split] = pd.concat([table, surface_features(table, with_ter=not args.no_ter).reset_index(drop=True)], axis=1)
    feature_seconds = time.perf_counter() - start
    n_rows = sum(len(f) for f in frames.values())
    print(f"surface features of {n_rows:,} dev + test rows in {feature_seconds:.0f} s ({n_rows / feature_seconds:.0f} rows/s)\n")
    used = [f for f in FEATURES if not (args.no_ter and f == "ter")]
    variants = {
        "mu": ["center"],
        "mu+chrF": ["center", "chrf"],
        "mu+all": ["center", *used],
        "features only": used,
    }
    stacks = {name: Stack(columns).fit(frames["dev"]) for name, columns in variants.items()}
    test = frames["test"]
    predictions = {name: stack.predict(test) for name, stack in stacks.items()}
    rows = variant_rows(test, predictions)
    table = pd.DataFrame(rows)
    wide = table.pivot_table(index=["dataset", "lp"], columns="variant", values=["pps", "auroc_bad", "recall_worst"])
    print("| dataset × LP | PPS: μ / μ+chrF / μ+all / features | AUROC bad: μ / μ+all | recall worst 2 %: μ / μ+all |")
    print("|---|---|---|---|")
    for (dataset, lp), r in wide.iterrows():
        print(
            f"| {dataset} {lp} | {r[('pps', 'mu')]:.3f} / {r[('pps', 'mu+chrF')]:.3f} / {r[('pps', 'mu+all')]:.3f} / "
            f"{r[('pps', 'features only')]:.3f} | {r[('auroc_bad', 'mu')]:.3f} / {r[('auroc_bad', 'mu+all')]:.3f} | "
            f"{r[('recall_worst', 'mu')]:.2f} / {r[('recall_worst', 'mu+all')]:.2f} |"
        )
    out = {"feature_seconds": feature_seconds, "rows": n_rows, "test": table.to_dict("records")}
    if args.challenge is not None:
        scored = pd.read_parquet(args.challenge).reset_index(drop=True)
        perturbed = pd.concat([scored, surface_features(scored, with_ter=not args.no_ter).reset_index(drop=True)], axis=1).assign(center=scored["mu"])
        original_frame = scored.assign(mt=scored["mt_original"])
        original = pd.concat([original_frame, surface_features(original_frame, with_ter=not args.no_ter).reset_index(drop=True)], axis=1)
        original = original.assign(center=scored["mu_original"])
        stack = stacks["mu+all"]
        below = stack.predict(perturbed) < stack.predict(original)
        challenge = (
            pd.DataFrame({"mode": scored["mode"], "mu": scored["mu"] < scored["mu_original"], "stack": below})
            .groupby("mode", sort=False)
            .mean()
        )
        print("\nchallenge set, share of perturbations below their original: served mu vs mu+all stack\n")
        print(challenge.round(3).to_string())
        out["challenge"] = challenge.reset_index().to_dict("records")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
