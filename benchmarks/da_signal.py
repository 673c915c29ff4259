"""How much segment-level signal the WMT21 to-English DA scores carry, checked on the prepared data.

The DA method tables come out near zero (PPS ~0.03) while the same models reach PPS ~0.4 on WMT21
MQM. This script separates "our join is wrong" from "the scores carry little per-segment signal":

1. chrF(mt, ref) versus the DA z-score per LP, with the text taken from line ``seg_id + offset`` of
   the same system (offset 0 is our join; a join that is off by a line would peak elsewhere);
   the same for MQM as a control, where the signal is known to be there.
2. zh-en, where DA and MQM rate the same systems on the same newstest2021 lines: Pearson r between
   the two human scores on shared (system, seg_id) pairs, and between their per-segment means over
   systems (less noisy).

Prints a table; no goal, it documents the data.

    python benchmarks/da_signal.py [--prepared data/prepared] [--max-rows 4000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import sacrebleu

SPLITS = ("d_q", "d_e", "dev", "test")
OFFSETS = (-2, -1, 0, 1, 2)


def load(prepared: Path) -> pd.DataFrame:
    frames = [pd.read_parquet(prepared / f"{split}.parquet") for split in SPLITS]
    df = pd.concat(frames, ignore_index=True)
    return df[df["dataset"].isin(["wmt21_da", "wmt21_mqm"])]


def chrf_by_offset(rows: pd.DataFrame, max_rows: int, seed: int) -> dict[int, float]:
    """Pearson r of sentence chrF with the human score when the text comes from line seg_id+offset."""
    text = {
        (s, i): (mt, ref)
        for s, i, mt, ref in zip(rows["system"], rows["seg_id"], rows["mt"], rows["ref"], strict=True)
    }
    sample = rows.sample(min(max_rows, len(rows)), random_state=seed)
    out = {}
    for offset in OFFSETS:
        chrf, human = [], []
        for system, seg_id, score in zip(sample["system"], sample["seg_id"], sample["score"], strict=True):
            pair = text.get((system, seg_id + offset))
            if pair is not None:
                chrf.append(sacrebleu.sentence_chrf(pair[0], [pair[1]]).score)
                human.append(score)
        out[offset] = float(np.corrcoef(chrf, human)[0, 1]) if len(chrf) > 2 else float("nan")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepared", type=Path, default=Path("data/prepared"))
    parser.add_argument("--max-rows", type=int, default=4000, help="rows sampled per dataset x LP")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    df = load(args.prepared)

    print("1. Pearson r(sentence chrF of line seg_id+offset, human score), per dataset x LP")
    print(f"{'dataset':<10} {'lp':<6} {'rows':>6} " + " ".join(f"{'off ' + str(o):>8}" for o in OFFSETS))
    for (dataset, lp), rows in df.groupby(["dataset", "lp"]):
        # one row per (system, seg_id): a reference rated as a system repeats seg_ids otherwise
        rows = rows.drop_duplicates(["system", "seg_id"])
        r = chrf_by_offset(rows, args.max_rows, args.seed)
        print(f"{dataset:<10} {lp:<6} {len(rows):>6} " + " ".join(f"{r[o]:>8.3f}" for o in OFFSETS))

    da = df[(df["dataset"] == "wmt21_da") & (df["lp"] == "zh-en")]
    mqm = df[(df["dataset"] == "wmt21_mqm") & (df["lp"] == "zh-en")]
    keys = ["system", "seg_id"]
    pairs = (
        da.groupby(keys)["score"]
        .mean()
        .to_frame("da")
        .join(mqm.groupby(keys)["score"].mean().rename("mqm"), how="inner")
    )
    per_seg = pd.concat(
        [
            da.groupby("seg_id")["score"].mean().rename("da"),
            mqm.groupby("seg_id")["score"].mean().rename("mqm"),
        ],
        axis=1,
    ).dropna()
    print("\n2. zh-en, DA z vs MQM on the same newstest2021 lines")
    print(f"   (system, seg_id) pairs: n={len(pairs)}, r={pairs['da'].corr(pairs['mqm']):.3f}")
    print(f"   per-seg_id means over systems: n={len(per_seg)}, r={per_seg['da'].corr(per_seg['mqm']):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
