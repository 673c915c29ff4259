"""The join guard: sentence chrF vs human score per dataset x LP, and prepare failing on a bad join."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from uamt.core.errors import DataError
from uamt.data import loaders
from uamt.data.guard import GuardConfig, check_signal, chrf_signal, format_signal
from uamt.data.prepare import PrepareConfig, prepare


def _table(dataset: str, n: int, *, shuffle: bool, seed: int = 0) -> pd.DataFrame:
    """Rows whose score is the share of reference words the translation keeps (a real lexical signal)."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(400)]
    rows = []
    for _ in range(n):
        ref = " ".join(rng.choice(words, 8))
        keep = int(rng.integers(0, 9))
        mt = " ".join(ref.split()[:keep] + list(rng.choice(words, 8 - keep)))
        rows.append(
            {"dataset": dataset, "lp": "xx-en", "src": ref, "mt": mt, "ref": ref, "score": keep / 8.0}
        )
    df = pd.DataFrame(rows)
    if shuffle:  # the scores joined to other sentences
        df["score"] = rng.permutation(df["score"].to_numpy())
    return df


def test_signal_on_good_and_shifted_joins():
    cfg = GuardConfig(floor=0.10, min_rows=100)
    good = chrf_signal(_table("a", 300, shuffle=False), {}, {}, cfg)
    bad = chrf_signal(_table("a", 300, shuffle=True), {}, {}, cfg)
    assert good["a"]["xx-en"]["pearson"] > 0.5 and good["a"]["xx-en"]["status"] == "ok"
    assert abs(bad["a"]["xx-en"]["pearson"]) < 0.2 and bad["a"]["xx-en"]["status"] == "low"
    check_signal(good, cfg)
    with pytest.raises(DataError, match=r"join guard: .* for a xx-en \(r = .*, within system and source .*, n = 300\)"):
        check_signal(bad, cfg)


def test_lower_is_better_scores_are_oriented_and_qe_sets_skipped():
    table = _table("hter", 200, shuffle=False)
    table["score"] = 1.0 - table["score"]  # an error rate: lower is better
    qe = _table("qe", 50, shuffle=True).assign(ref=None)
    signal = chrf_signal(pd.concat([table, qe]), {"hter": False}, {"qe": False}, GuardConfig(min_rows=100))
    assert signal["hter"]["xx-en"]["pearson"] > 0.5
    assert signal["qe"]["xx-en"]["status"] == "skipped (no reference)"
    assert "skipped (no reference)" in format_signal(signal)


def test_within_source_signal_rescues_a_confounded_pooled_correlation():
    """Each source has 4 translations whose score tracks chrF, but a per-source offset (e.g. sentence
    length) pushes score and chrF apart across sources: the pooled r is low, the join is right."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(150):
        offset = float(rng.normal(0, 5))
        ref = " ".join(f"w{j}" for j in rng.integers(0, 300, 8))
        for keep in (2, 4, 6, 8):
            mt = " ".join(ref.split()[:keep] + ["zz"] * (8 - keep))
            rows.append(
                {
                    "dataset": "a",
                    "lp": "xx-en",
                    "src": f"s{i}",
                    "mt": mt,
                    "ref": ref,
                    "score": keep - offset * 3,
                }
            )
    table = pd.DataFrame(rows)
    # the offsets anti-correlate score with chrF across sources (references of different lengths)
    cfg = GuardConfig(min_rows=100)
    signal = chrf_signal(table, {}, {}, cfg)["a"]["xx-en"]
    assert signal["within"] > 0.5 and signal["status"] == "ok"
    shuffled = table.assign(score=np.random.default_rng(2).permutation(table["score"].to_numpy()))
    assert chrf_signal(shuffled, {}, {}, cfg)["a"]["xx-en"]["status"] == "low"


def test_few_rows_are_reported_but_never_fail():
    cfg = GuardConfig(min_rows=500)
    signal = chrf_signal(_table("a", 40, shuffle=True), {}, {}, cfg)
    assert signal["a"]["xx-en"]["status"] == "few rows"
    check_signal(signal, cfg)


def test_row_order_does_not_change_the_signal():
    table = _table("a", 200, shuffle=False)
    cfg = GuardConfig(max_rows=None)
    a = chrf_signal(table, {}, {}, cfg)["a"]["xx-en"]["pearson"]
    b = chrf_signal(table.iloc[::-1], {}, {}, cfg)["a"]["xx-en"]["pearson"]
    assert a == pytest.approx(b)


@pytest.mark.slow
def test_prepare_fails_on_the_old_line_number_join_of_wmt21_da(tmp_path, mirror_root, monkeypatch):
    """Real data: the right DA join passes the guard; reading SIDs as line numbers fails it."""
    cfg = PrepareConfig(
        raw_dir=str(mirror_root),
        out_dir=str(tmp_path / "prepared"),
        datasets=("wmt21_da",),
        forced_splits={},
        annotations_pool=None,
    )
    paths = prepare(cfg)
    summary = json.loads(paths["summary"].read_text())
    signal = summary["chrf_guard"]["wmt21_da"]
    assert set(signal) == {"is-en", "ja-en", "ru-en"}
    assert all(v["status"] == "ok" and v["pearson"] > 0.15 for v in signal.values()), signal
    assert set(summary["left_out"]["wmt21_da"]) == {"cs-en", "de-en", "ha-en", "zh-en"}

    before = {p.name: p.read_bytes() for p in (tmp_path / "prepared").iterdir()}
    identity = lambda self: list(range(1, len(self.source) + 1))  # noqa: E731 - the old, wrong join
    monkeypatch.setattr(loaders.Newstest2021, "line_of_da_sid", identity)
    with pytest.raises(DataError, match=r"join guard: ") as caught:
        prepare(cfg)
    for lp in ("is-en", "ja-en", "ru-en", "cs-en", "zh-en"):
        assert f"wmt21_da {lp} (r = " in str(caught.value)
    # nothing half-written: the previous outputs are untouched
    assert {p.name: p.read_bytes() for p in (tmp_path / "prepared").iterdir()} == before


_GUARD_R = """
import numpy as np
from uamt.data.guard import chrf_signal
from tests.test_data_guard import _table
signal = chrf_signal(_table("a", 2000, shuffle=False), {}, {})
print(repr(signal["a"]["xx-en"]["pearson"]), repr(signal["a"]["xx-en"]["within"]))
x = np.random.default_rng(0).normal(size=(2, 500))
print(repr(float(np.corrcoef(x[0], x[0] + x[1])[0, 1])))
"""


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


@pytest.mark.skipif(not _cpu_has("avx2"), reason="needs an x86 CPU with AVX2 (OpenBLAS's Haswell kernel)")
def test_guard_correlations_are_the_same_bits_under_every_blas_kernel():
    """summary.json is part of DVC's data/prepared: its correlations must not follow the CPU's BLAS kernel
    (np.corrcoef's did: 3 bytes more on an AMD EPYC than on an Intel Xeon, and every stage re-ran)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    outputs = {}
    for kernel in ("Prescott", "Haswell"):  # SSE3 and AVX2: what OpenBLAS picks on old and AMD CPUs
        env = {**os.environ, "OPENBLAS_CORETYPE": kernel, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"}
        done = subprocess.run([sys.executable, "-c", _GUARD_R], env=env, capture_output=True, text=True, check=True)
        outputs[kernel] = done.stdout.splitlines()
    guard = {kernel: lines[0] for kernel, lines in outputs.items()}
    assert guard["Prescott"] == guard["Haswell"], guard
    # The test can fail: the kernels really do round np.corrcoef's sums differently on this machine.
    blas = {kernel: lines[1] for kernel, lines in outputs.items()}
    if blas["Prescott"] == blas["Haswell"]:
        pytest.skip(f"OPENBLAS_CORETYPE changes nothing here (np.corrcoef {blas}): cannot tell")
