"""Batch scoring throughput: `uamt score --input` on a LocalCluster of 1 and 2 workers, and the projection.

Builds ``--rows`` synthetic-but-realistic rows by resampling real (src, mt, ref) triples of the
offline mirror (biomedical MQM, the LPs of ``--lps``) into a Parquet file, then scores it with
:func:`uamt.serving.batch.score_file` on a ``LocalCluster`` of N one-thread worker processes for
each N of ``--workers``.  Every worker loads the model before the clock starts (the load is timed
on its own), so rows/s is the steady state.  Prints rows/s, the speed-up over one worker, the
peak RSS of each worker process, whether the outputs are identical, and the projection to more
workers (rows/s per worker x N x the measured 2-worker efficiency).

Usage::

    MLFLOW_TRACKING_URI=sqlite:///mlflow/mlflow.db python benchmarks/batch_scoring.py --rows 20000
    python benchmarks/batch_scoring.py --rows 1000000 --partition-rows 10000   # the issue's size
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path


def build_input(path: Path, rows: int, mirror: Path, lps: tuple[str, ...], seed: int) -> int:
    """Write ``rows`` resampled (src, mt, ref, lp) rows to ``path`` in 100,000-row row groups (the
    whole table is never in memory); return the number of distinct real triples drawn from."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from uamt.data.sources.bio_mqm import load_bio_mqm

    pool = load_bio_mqm(mirror, lps=lps)
    pool = pool[pool["ref"].notna()][["src", "mt", "ref", "lp"]].drop_duplicates().reset_index(drop=True)
    rng = np.random.default_rng(seed)
    schema = pa.schema([(c, pa.string()) for c in ("src", "mt", "ref", "lp")])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, 100_000):
            picks = rng.integers(0, len(pool), size=min(100_000, rows - start))
            writer.write_table(pa.Table.from_pandas(pool.iloc[picks], schema=schema, preserve_index=False))
    return len(pool)


def worker_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_cpu_s() -> float:
    """CPU seconds of this process (user + system): on a shared machine wall time measures the
    neighbours, CPU time what scoring costs."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(n_workers: int, table: Path, out_dir: Path, settings) -> dict:
    from distributed import Client, LocalCluster

    from uamt.serving import batch

    cluster = LocalCluster(
        n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    )
    try:
        with Client(cluster) as client:
            start = time.perf_counter()
            # The version score_file will load (it pins @champion to its version once, at the start).
            pinned = batch.pin_model(settings.model, settings.tracking_uri).loaded_as
            client.run(batch.preload_model, pinned, settings.tracking_uri)
            load_s = time.perf_counter() - start
            cpu_before = client.run(worker_cpu_s)
            result = batch.score_file(table, out_dir, settings, client=client)
            cpu_after = client.run(worker_cpu_s)
            rss = sorted(client.run(worker_peak_rss_mb).values())
            loads = sorted(client.run(batch.model_loads).values())
    finally:
        cluster.close()
    cpu_s = sum(cpu_after[w] - cpu_before[w] for w in cpu_after)
    return {"n": n_workers, "result": result, "load_s": load_s, "rss_mb": rss, "loads": loads, "cpu_s": cpu_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--partition-rows", type=int, default=2_000)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--model", default=None, help="model URI (default: models:/<register.model_name>@champion)")
    parser.add_argument("--mirror", type=Path, default=None, help="data mirror (default ../shared/data/github)")
    parser.add_argument("--lps", default="de-en,en-de", help="biomedical MQM language pairs to resample")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--project-to", default="4,8,16,32", help="worker counts to project to")
    args = parser.parse_args(argv)

    import pandas as pd

    from uamt.registry.store import tracking_uri
    from uamt.serving.batch import BatchSettings
    from uamt.serving.scores import default_model_uri

    repo = Path(__file__).resolve().parents[1]
    mirror = args.mirror or repo.parent / "shared" / "data" / "github"
    settings = BatchSettings(
        model=args.model or default_model_uri(reference_free=False, params_path=repo / "params.yaml"),
        batch_size=args.batch_size,
        partition_rows=args.partition_rows,
        tracking_uri=tracking_uri(),
    )
    workdir = Path(tempfile.mkdtemp(prefix="uamt-batch-bench-"))
    table = workdir / "segments.parquet"
    start = time.perf_counter()
    n_pool = build_input(table, args.rows, mirror, tuple(args.lps.split(",")), args.seed)
    print(
        f"input: {args.rows} rows resampled from {n_pool} real (src, mt, ref) triples ({args.lps}), "
        f"{table.stat().st_size / 1e6:.1f} MB Parquet, built in {time.perf_counter() - start:.1f} s; "
        f"model {settings.model}; partitions of {args.partition_rows} rows"
    )
    runs = []
    for n in (int(w) for w in args.workers.split(",")):
        outcome = run(n, table, workdir / f"out-{n}", settings)
        runs.append(outcome)
        result = outcome["result"]
        print(
            f"workers={n}: {result.rows_per_second:.1f} rows/s ({result.n_rows} rows in {result.seconds:.1f} s; "
            f"model load {outcome['load_s']:.1f} s, loads per worker {outcome['loads']}); "
            f"peak RSS per worker {', '.join(f'{r:.0f}' for r in outcome['rss_mb'])} MB; "
            f"{result.n_rows / outcome['cpu_s']:.1f} rows per worker CPU-second ({outcome['cpu_s']:.1f} CPU s)"
        )
        sys.stdout.flush()
    frames = [pd.read_parquet(r["result"].out_dir).sort_values("row").reset_index(drop=True) for r in runs]
    same = all(f.equals(frames[0]) for f in frames[1:])
    print(f"outputs identical across worker counts: {same} ({len(frames[0])} rows, rows 0..{len(frames[0]) - 1})")
    by_n = {r["n"]: r["result"].rows_per_second for r in runs}
    if 1 in by_n:
        per_worker = by_n[1]
        efficiency = by_n[2] / (2 * per_worker) if 2 in by_n else 1.0
        for n, rate in sorted(by_n.items()):
            print(f"speed-up with {n} workers: {rate / per_worker:.2f}x (efficiency {rate / (n * per_worker):.0%})")
        for n in (int(w) for w in args.project_to.split(",")):
            rate = per_worker * n * efficiency
            print(
                f"projection {n} workers (one core each, {efficiency:.0%} efficiency): {rate:.0f} rows/s, "
                f"1,000,000 rows in {1e6 / rate / 3600:.2f} h"
            )
        per_cpu = runs[0]["result"].n_rows / runs[0]["cpu_s"]
        for n in (int(w) for w in args.project_to.split(",")):
            print(
                f"projection {n} dedicated cores (CPU-time based, {per_cpu:.1f} rows per CPU-second): "
                f"{per_cpu * n:.0f} rows/s, 1,000,000 rows in {1e6 / (per_cpu * n) / 3600:.2f} h"
            )
    print(f"work folder: {workdir}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
