"""Does a user get, row by row, what the pipeline measured? And the same answer twice?

The pipeline measures the served distribution on the test rows from the encode stage's cached
embeddings (``predictions/test/<model>.parquet`` + ``calibration/<model>.json``); a user's scores come
from the registered model encoding the texts afresh.  This benchmark scores a seeded sample of test
rows through the public API (``uamt.load_model(...).score``, the path of ``uamt score``) and prints:

1. **served vs pipeline**, per row: |difference| of mu, the 90 % interval's ends and the risk
   P(MQM <= -5) (median, 90th and 99th percentile, max), and the pooled coverage and PPS both ways;
2. **the same rows twice**, the second time in another order (other texts share their encoder
   batches): the same differences between the two served answers;
3. **encoder throughput** of the served encoder on the sample's translations: as it encodes a list
   (``pooled_array``: the int8 export one text per call, texts side by side) and called once per
   text from one thread (texts/s, best of two).

    python benchmarks/served_vs_pipeline.py [--model models:/uamt-comet@champion] [--n 3000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

FIELDS = ("mu", "lower", "upper", "risk")


def differences(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per field of :data:`FIELDS`: quantiles of |a - b| over rows."""
    out = {}
    for field in FIELDS:
        d = np.abs(a[field].to_numpy(float) - b[field].to_numpy(float))
        out[field] = {k: float(v) for k, v in zip(("median", "p90", "p99", "max"), np.quantile(d, [0.5, 0.9, 0.99, 1.0]), strict=True)}
    return out


def main(argv: list[str] | None = None) -> int:
    import uamt
    from uamt.data.datasets import scale_bounds
    from uamt.pipeline_config import load_pipeline, read_split
    from uamt.serving.model_calibration import Calibration
    from uamt.uncertainty.served import ServedSettings, served_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--model", default="models:/uamt-comet@champion")
    parser.add_argument("--method", default="hts", help="the pipeline model the registered one was built from")
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chi", type=float, default=-5.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    pipe = load_pipeline(args.params)
    bounds = scale_bounds(pipe.datasets)
    test = read_split(pipe.prepared_dir, "test", pipe.datasets)
    predictions = pd.read_parquet(Path(pipe.predictions_dir) / "test" / f"{args.method}.parquet")
    same = (test["seg_id"].astype(str).to_numpy() == predictions["seg_id"].astype(str).to_numpy()).all()
    if not same or not (test["system"].to_numpy() == predictions["system"].to_numpy()).all():
        raise SystemExit("predictions/test and data/prepared/test are not row-aligned: re-run the evaluate stage")
    rows = np.sort(np.random.default_rng(args.seed).choice(len(test), min(args.n, len(test)), replace=False))
    texts, predicted = test.iloc[rows].reset_index(drop=True), predictions.iloc[rows].reset_index(drop=True)

    model = uamt.load_model(args.model)
    reference_free = not model.predictor.uses_references

    def score(frame: pd.DataFrame) -> pd.DataFrame:
        ref = None if reference_free else frame["ref"].tolist()
        return model.score(frame["src"].tolist(), frame["mt"].tolist(), ref, lp=frame["lp"].tolist(), risk_threshold=args.chi)

    served = score(texts)
    calibration = Calibration.load(Path("calibration") / f"{args.method}.json")
    answers = served_rows(calibration, predicted["mu"], predicted["sigma"], predicted["lp"], bounds=bounds,
                          settings=ServedSettings(risk_thresholds=(args.chi,)))
    lower, upper = answers.intervals[0.9]
    pipeline = pd.DataFrame({"mu": answers.center, "lower": lower, "upper": upper, "risk": answers.risk[args.chi]})
    order = np.random.default_rng(args.seed + 1).permutation(len(texts))
    again = score(texts.iloc[order].reset_index(drop=True))
    again = again.iloc[np.argsort(order)].reset_index(drop=True)
    human = texts["score"].to_numpy(float)

    def pooled(frame: pd.DataFrame) -> dict[str, float]:
        inside = (human >= frame["lower"].to_numpy() - 1e-9) & (human <= frame["upper"].to_numpy() + 1e-9)
        return {"closed_coverage@0.9": float(inside.mean()), "pps": float(np.corrcoef(human, frame["mu"])[0, 1])}

    encoder = model.predictor.encoder
    sample = texts["mt"].tolist()[:480]
    encoder.pooled_array(sample[:16])  # warm-up
    speed = {}
    for label, run in (("as served", lambda: encoder.pooled_array(sample)), ("one call per text", lambda: [encoder.pooled_array([t]) for t in sample])):
        best = min(_timed(run) for _ in range(2))
        speed[label] = len(sample) / best
    report = {
        "model": args.model, "rows": len(texts), "encoder": str(encoder.encoder_id),
        "served_vs_pipeline": differences(served, pipeline),
        "served_twice": differences(served, again),
        "pooled": {"served": pooled(served), "pipeline": pooled(pipeline)},
        "encoder_texts_per_s": speed,
    }
    print(f"{args.model} ({report['encoder']}), {len(texts):,} test rows, seed {args.seed}")
    for block in ("served_vs_pipeline", "served_twice"):
        print(f"\n{block}: |difference| per row\n" + pd.DataFrame(report[block]).T.round(4).to_string())
    print("\npooled: " + json.dumps(report["pooled"]))
    print("encoder texts/s: " + ", ".join(f"{k} {v:.1f}" for k, v in speed.items()))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


if __name__ == "__main__":
    raise SystemExit(main())
