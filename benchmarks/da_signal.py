"""The join check by line offset: sentence chrF vs human score when the text is shifted by a line.

``uamt data prepare`` already fails when chrF and the human score do not correlate at all (the
join guard, :mod:`uamt.data.guard`).  This script shows *where* the signal peaks: for each
dataset x LP, Pearson r between the human score and chrF(mt, ref) with the text taken from line
``seg_id + offset`` of the same system.  A right join peaks at offset 0; a join that is off by a
line peaks elsewhere; a join to unrelated lines is flat.

History: until the DA segment-id fix, WMT21 DA read SIDs as line numbers and this table was flat
(|r| < 0.09 at every offset), which was wrongly reported as "DA carries no segment signal".  With
SIDs mapped through the sorted document order it peaks at offset 0 (0.21-0.29 on is-en, ja-en,
ru-en).

    python benchmarks/da_signal.py [--prepared data/prepared] [--max-rows 4000] [--datasets wmt21_da wmt21_mqm]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import sacrebleu

SPLITS = ("d_q", "d_e", "dev", "test")
OFFSETS = (-2, -1, 0, 1, 2)


def load(prepared: Path, datasets: list[str]) -> pd.DataFrame:
    frames = [pd.read_parquet(prepared / f"{split}.parquet") for split in SPLITS]
    df = pd.concat(frames, ignore_index=True)
    return df[df["dataset"].isin(datasets)]


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
    parser.add_argument("--datasets", nargs="+", default=["wmt21_da", "wmt21_mqm"])
    args = parser.parse_args(argv)
    df = load(args.prepared, args.datasets)

    print("1. Pearson r(sentence chrF of line seg_id+offset, human score), per dataset x LP")
    print(f"{'dataset':<10} {'lp':<6} {'rows':>6} " + " ".join(f"{'off ' + str(o):>8}" for o in OFFSETS))
    for (dataset, lp), rows in df.groupby(["dataset", "lp"]):
        # one row per (system, seg_id): a reference rated as a system repeats seg_ids otherwise
        rows = rows.drop_duplicates(["system", "seg_id"])
        r = chrf_by_offset(rows, args.max_rows, args.seed)
        print(f"{dataset:<10} {lp:<6} {len(rows):>6} " + " ".join(f"{r[o]:>8.3f}" for o in OFFSETS))

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
