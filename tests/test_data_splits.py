"""Document- and source-disjoint splits: zero overlap, determinism, forced datasets, the slow full run."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from uamt.core.errors import DataError
from uamt.data.prepare import PrepareConfig, prepare, read_summary
from uamt.data.schema import normalise_source
from uamt.data.splits import assign_splits, check_disjoint


def synthetic_table(seed: int = 0) -> pd.DataFrame:
    """Two datasets sharing documents (da/mqm) and sentences (mlqe/multihyp), plus a forced one."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in range(60):
        for s in range(5):
            src = f"Sentence {d}-{s} of document {d}."
            for system in ("A", "B"):
                rows.append(("da", "zh-en", src, f"doc{d}", system, d * 5 + s + 1))
            if d % 3 == 0:
                rows.append(
                    ("mqm", "zh-en", src.upper(), f"doc{d}", "C", d * 5 + s + 1)
                )  # same doc, case differs
    for i in range(200):
        rows.append(("mlqe", "et-en", f"Lause {i}.", f"wiki{i // 8}", "nmt", i + 1))
    for i in range(0, 200, 25):
        rows.append(
            ("multihyp", "et-en", f"  lause   {i}. ", f"mh{i}", "mt", i + 1)
        )  # normalises to an mlqe src
    for i in range(40):
        rows.append(("ted", "en-de", f"Talk sentence {i}.", f"talk{i // 10}", "X", i + 1))
    df = pd.DataFrame(rows, columns=["dataset", "lp", "src", "doc", "system", "seg_id"])
    df["score"] = rng.normal(size=len(df))
    df["split"] = ""
    df["group"] = ""
    return df


FORCED = {"ted": "ood", "multihyp": "test"}
FRACTIONS = {"d_q": 0.35, "d_e": 0.35, "dev": 0.10, "test": 0.20}
KEY = ["dataset", "lp", "system", "seg_id"]


def _split_of(df: pd.DataFrame) -> pd.Series:
    return df.set_index(KEY)["split"].sort_index()


def test_zero_overlap_and_forced():
    out = assign_splits(synthetic_table(), FRACTIONS, FORCED, seed=1)
    check_disjoint(out)
    norm = out["src"].map(normalise_source)
    assert (out.groupby(norm)["split"].nunique() == 1).all()
    assert (out.groupby("doc")["split"].nunique() == 1).all()
    assert (out.loc[out.dataset == "ted", "split"] == "ood").all()
    assert (out.loc[out.dataset == "multihyp", "split"] == "test").all()
    # mlqe documents that share a sentence with multihyp follow it into test
    linked = out[(out.dataset == "mlqe") & out.doc.isin({f"wiki{i // 8}" for i in range(0, 200, 25)})]
    assert len(linked) and (linked.split == "test").all()
    # same document across datasets -> same group and split
    da0, mqm0 = (
        out[(out.dataset == "da") & (out.doc == "doc0")],
        out[(out.dataset == "mqm") & (out.doc == "doc0")],
    )
    assert set(da0.group) == set(mqm0.group) and set(da0.split) == set(mqm0.split)
    # the free rows of da get roughly their target fractions
    share = out[out.dataset == "da"].split.value_counts(normalize=True)
    for split, frac in FRACTIONS.items():
        assert abs(share.get(split, 0) - frac) < 0.06


def test_deterministic_under_shuffle_and_seed_matters():
    df = synthetic_table()
    a = _split_of(assign_splits(df, FRACTIONS, FORCED, seed=7))
    shuffled = df.sample(frac=1.0, random_state=3).reset_index(drop=True)
    b_full = assign_splits(shuffled, FRACTIONS, FORCED, seed=7)
    pd.testing.assert_series_equal(a, _split_of(b_full))
    groups_a = assign_splits(df, FRACTIONS, FORCED, seed=7).set_index(KEY)["group"].sort_index()
    pd.testing.assert_series_equal(groups_a, b_full.set_index(KEY)["group"].sort_index())
    c = _split_of(assign_splits(df, FRACTIONS, FORCED, seed=8))
    assert not a.equals(c)


def test_check_disjoint_raises_on_leak():
    out = assign_splits(synthetic_table(), FRACTIONS, FORCED, seed=1)
    row = out.index[(out.dataset == "da") & (out.system == "B")][0]
    out.loc[row, "split"] = "dev" if out.loc[row, "split"] != "dev" else "d_q"
    with pytest.raises(DataError, match="split leak: .* in more than one split"):
        check_disjoint(out)


def test_bad_fractions():
    with pytest.raises(ValueError, match="sum to 1"):
        assign_splits(synthetic_table(), {"d_q": 0.5, "test": 0.2}, FORCED)
    with pytest.raises(ValueError, match="split='train' not supported"):
        assign_splits(synthetic_table(), {"train": 1.0}, FORCED)


@pytest.mark.slow
def test_full_prepare_on_mirror(tmp_path, mirror_root):
    from dataclasses import replace

    from tests.conftest import REPO_ROOT
    from uamt.core.config import load_section

    # the project's own settings (drop lists, guard exemptions), on the mirror, into tmp_path
    cfg = replace(
        load_section(PrepareConfig, "prepare", REPO_ROOT / "params.yaml"),
        raw_dir=str(mirror_root),
        out_dir=str(tmp_path / "prepared"),
        annotations_pool=None,
        max_rows_per_lp=None,
    )
    paths = prepare(cfg)
    frames = {s: pd.read_parquet(p) for s, p in paths.items() if s != "summary"}
    table = pd.concat(frames.values(), ignore_index=True)
    check_disjoint(table)
    for split, frame in frames.items():
        assert (frame["split"] == split).all()
    summary = json.loads(paths["summary"].read_text())
    assert summary == {**read_summary(paths["summary"].parent)}
    assert summary["n_rows"] == len(table)
    for dataset, by_lp in summary["counts"].items():
        for lp, counts in by_lp.items():
            forced = cfg.forced_splits.get(dataset)
            if forced:
                assert set(counts) == {forced}, (dataset, lp)
            elif (dataset, lp) == ("mlqe", "et-en"):
                # every MLQE et-en document shares a sentence with the multihyp set (forced to test)
                assert set(counts) == {"test"}
            else:
                assert all(counts.get(s, 0) > 0 for s in cfg.fractions), (dataset, lp, counts)
    assert set(summary["counts"]) == set(cfg.datasets)
    # WMT21 DA: only the LPs whose document ids make the segment-id join possible
    assert set(summary["counts"]["wmt21_da"]) == {"is-en", "ja-en", "ru-en"}
    assert set(summary["left_out"]["wmt21_da"]) == {"cs-en", "de-en", "ha-en", "zh-en"}
    assert set(summary["counts"]["wmt21_mqm"]) == {"en-de", "en-ru", "zh-en"}
    assert set(summary["counts"]["wmt23_mqm"]) == {"en-de", "he-en", "zh-en"}
    # every reference-based dataset x LP passed the join guard (or is exempt with a reason)
    for dataset, lps in summary["chrf_guard"].items():
        for lp, v in lps.items():
            assert v["status"] == "ok" or v["status"].startswith(("exempt", "skipped")), (dataset, lp, v)
    # the side-by-side re-ratings share their segments' split with WMT23 MQM (same doc keys)
    sxs = table[table.dataset == "wmt23_sxs_mqm"]
    main = table[table.dataset == "wmt23_mqm"].drop_duplicates("doc").set_index("doc")["split"]
    assert (sxs["split"].to_numpy() == main.reindex(sxs["doc"]).to_numpy()).all()
