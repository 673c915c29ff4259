"""End to end: a trained + registered tiny project, new MQM annotations dropped in, one retrain tick.

Real data (WMT21 MQM from the offline mirror), the real stage functions (the default encoder, 2-epoch
heads), the real MLflow registry (SQLite in tmp).  The whole chain to ``register`` runs twice: the
first pipeline, then one tick that ingests a plain batch and a named campaign's batch together (on
2026-12-06, beside a ``make run`` on the same 2 cores: 535 s and 558 s, the module 1,134 s; with one
tick per batch the test ran a third chain, and its first two took 669 s and 826 s).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pandas as pd
import pytest
import test_flows_harness as harness
import yaml
from test_flows_harness import REPO_ROOT

from uamt.core.config import load_section
from uamt.data.prepare import PrepareConfig, load_dataset
from uamt.data.schema import normalise_source

prefect_api = harness.prefect_api  # module fixture: a temporary Prefect API

pytestmark = pytest.mark.slow


def tiny_params(root: Path, mirror: Path) -> Path:
    """The repo's params.yaml with small settings: WMT21 MQM only, ~1,500 rows per LP, 2 methods.

    WMT21 MQM has real documents of ~180-280 rated rows (all systems of 10-16 segments); whole
    documents are kept, so ~1,500 rows per LP is what gives every split at least one document."""
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["prepare"].update(
        raw_dir=str(mirror),  # the mirror is laid out like data/raw: no fetch needed
        datasets=["wmt21_mqm"],
        max_rows_per_lp=1500,
        pseudo_doc_size=1,
        # No TED here (a whole talk is ~1500 rows): a slice of WMT21 MQM plays the ood split.
        fractions={"d_q": 0.4, "d_e": 0.2, "dev": 0.15, "test": 0.15, "ood": 0.1},
        forced_splits={},
    )
    params["train_base"].update(hidden_sizes=[64], max_epochs=2, mc_samples=5, patience=1, batch_size=16)
    params["pipeline"].update(
        datasets=["wmt21_mqm"], methods=["point", "hts"], register_method="hts", ood_datasets=["wmt21_mqm"]
    )
    params["encode"]["datasets"] = ["wmt21_mqm"]
    params["register"]["tracking_uri"] = f"sqlite:///{root / 'mlflow.db'}"
    params["incoming"]["settle_s"] = 0  # files are written just before each tick
    params["calibrate_campaigns"]["min_rows"] = 50  # the tiny project's campaigns are small
    params["register"]["allow_new_registry"] = True  # a fresh registry, created on purpose
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


def new_annotations(prepared: Path, n_sources: int = 2, skip: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Real MQM rows of ``n_sources`` sentences the tiny project has never seen (after the first
    ``skip`` of them, in sorted order), and one row of a test sentence."""
    full = load_dataset("wmt21_mqm", load_section(PrepareConfig, "prepare", "params.yaml"))
    used = pd.concat([pd.read_parquet(p) for p in prepared.glob("*.parquet")])
    seen = set(used["src"].map(normalise_source))
    fresh = full[(full["lp"] == "en-de") & ~full["src"].map(normalise_source).isin(seen)]
    sources = sorted(fresh["src"].unique())[skip : skip + n_sources]
    rows = fresh[fresh["src"].isin(sources)]
    test = pd.read_parquet(prepared / "test.parquet").iloc[:1]
    columns = ["dataset", "lp", "src", "mt", "ref", "score", "system", "doc", "seg_id"]
    # A new system's translation of a test sentence (the published row itself under a renamed system
    # is refused at ingestion: tests/test_reliability_incoming.py).
    test_row = test[columns].assign(system="new-system", mt=test["mt"] + " (new system)")
    return rows[columns].reset_index(drop=True), test_row


def registry_versions(uri: str) -> list[dict]:
    from uamt.registry.store import describe

    return describe(uri, "uamt-comet")


def test_retrain_tick_ingests_new_annotations_and_registers_a_new_version(
    prefect_api, tmp_path, monkeypatch, mirror_root
):
    from flows.pipeline import uamt_pipeline
    from flows.retrain import retrain_on_new_annotations
    from uamt.challenge import with_synthetic_failures
    from uamt.models.api import read_manifest
    from uamt.models.config import load_train_config
    from uamt.pipeline_config import read_split

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = tiny_params(tmp_path, mirror_root)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    started = time.perf_counter()
    first = uamt_pipeline(str(params), start="prepare")
    first_seconds = time.perf_counter() - started
    assert first["register"]["version"] == "1"
    n_d_q_before = len(pd.read_parquet("data/prepared/d_q.parquet"))
    version_before = first["register"]["data_version"]

    # 1. Nothing new: a quick no-op, no new version.
    started = time.perf_counter()
    assert retrain_on_new_annotations("params.yaml") == {"status": "no new annotations"}
    assert time.perf_counter() - started < 10

    # 2. A bad file: rejected with a report naming row and field; nothing ingested, no retrain.
    fresh, test_row = new_annotations(Path("data/prepared"))
    incoming = Path("data/incoming")
    incoming.mkdir(parents=True)
    bad = fresh.copy()
    bad.loc[1, "score"] = 5.0  # MQM above 0
    bad.to_csv(incoming / "bad.tsv", sep="\t", index=False, quoting=csv.QUOTE_NONE)
    out = retrain_on_new_annotations("params.yaml")
    assert out["status"] == "nothing ingested"
    report = (incoming / "rejected" / "bad.tsv.report.txt").read_text()
    assert "row 2 (line 3): field 'score': 5.0 outside the wmt21_mqm scale" in report
    assert not Path("data/annotations/pool.parquet").exists()
    assert [v["version"] for v in registry_versions(uri)] == ["1"]

    # 3. Good new annotations (+ one row of a test sentence, which must not reach training), and
    # in the same tick a user's own raters, named as a campaign: a share of their new sentences is
    # held out of training, calibrated as "acme" and served to requests that name it.
    good = pd.concat([fresh, test_row], ignore_index=True)
    good.to_csv(incoming / "batch-001.tsv", sep="\t", index=False, quoting=csv.QUOTE_NONE)
    acme, _ = new_annotations(Path("data/prepared"), n_sources=40, skip=fresh["src"].nunique())
    assert not set(acme["src"]) & set(fresh["src"])
    acme = acme.drop(columns="doc").assign(campaign="acme")  # one pseudo-document per row
    acme.to_csv(incoming / "acme-001.tsv", sep="\t", index=False, quoting=csv.QUOTE_NONE)
    started = time.perf_counter()
    out = retrain_on_new_annotations("params.yaml")
    retrain_seconds = time.perf_counter() - started
    assert out["status"] == "retrained", out
    assert out["ingest"]["rows_added"] == len(good) + len(acme)
    assert (incoming / "processed" / "batch-001.tsv").is_file()
    assert (incoming / "processed" / "acme-001.tsv").is_file()
    pool = json.loads(Path("data/prepared/summary.json").read_text())["annotation_pool"]
    placed = pool["campaigns"]
    assert set(placed) == {"acme"} and placed["acme"]["d_e"] >= 50 and placed["acme"]["d_q"] > 0
    # the plain batch goes to training whole; the test sentence's row is dropped
    assert pool["placed"] == {"d_e": placed["acme"]["d_e"], "d_q": len(fresh) + placed["acme"]["d_q"]}
    assert pool["dropped"] == {"test": 1}
    d_q = pd.read_parquet("data/prepared/d_q.parquet")
    assert set(fresh["src"]) <= set(d_q["src"])
    test = pd.read_parquet("data/prepared/test.parquet")
    assert "new-system" not in set(test["system"])  # the test set stays fixed
    # HTS was retrained on the grown d_q: its rows plus their synthetic failure rows (train_base)
    d_q_rows = read_split("data/prepared", "d_q", ("wmt21_mqm",))
    assert len(d_q_rows) == n_d_q_before + len(fresh) + placed["acme"]["d_q"]
    train_cfg = load_train_config("hts", "params.yaml")
    expected = with_synthetic_failures(d_q_rows, train_cfg.synthetic_failures, train_cfg.seed)
    assert read_manifest(Path("models/hts"))["n_train"] == len(expected) > len(d_q_rows)
    d_e = pd.read_parquet("data/prepared/d_e.parquet")
    assert (d_e["campaign"] == "acme").sum() == placed["acme"]["d_e"]
    assert not set(d_e.loc[d_e["campaign"] == "acme", "src"]) & set(d_q["src"])

    versions = registry_versions(uri)
    assert [v["version"] for v in versions] == ["2", "1"]
    assert out["registry"]["version"] == "2"
    assert versions[0]["data_version"] == out["registry"]["data_version"] != version_before
    print(f"first chain {first_seconds:.1f} s, retrain tick {retrain_seconds:.1f} s, +{len(fresh)} + {len(acme)} rows")

    # 4. The same file again: recognised, not ingested, no third version.
    good.to_csv(incoming / "batch-001-copy.tsv", sep="\t", index=False, quoting=csv.QUOTE_NONE)
    assert retrain_on_new_annotations("params.yaml")["status"] == "nothing ingested"
    assert len(registry_versions(uri)) == 2

    # 5. The new version serves the campaign's calibration to requests that name it.
    from uamt.serving.predictor import load_predictor

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    predictor = load_predictor("models:/uamt-comet/2")
    assert "acme" in predictor.metadata()["calibration"]["campaigns"]["en-de"]
    rows = acme.iloc[:20][["lp", "src", "mt", "ref"]].reset_index(drop=True)
    named = predictor.predict_frame(
        rows.assign(campaign=["acme"] * 10 + [None] * 10), confidence=0.9, risk_threshold=-5.0
    )
    plain = predictor.predict_frame(rows, confidence=0.9, risk_threshold=-5.0)
    # rows naming no campaign get the LP's calibration; "acme" rows the one fitted on acme's raters
    pd.testing.assert_frame_equal(named.iloc[10:], plain.iloc[10:])
    assert not named.iloc[:10][["mu", "lower", "upper"]].equals(plain.iloc[:10][["mu", "lower", "upper"]])


def test_second_retrain_exits_while_the_first_holds_the_lock(prefect_api, tmp_path, monkeypatch):
    from flows.retrain import retrain_on_new_annotations
    from uamt.ingest import retrain_lock

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    Path("params.yaml").write_text(yaml.safe_dump(params))
    Path("data/incoming").mkdir(parents=True)
    Path("data/incoming/new.csv").write_text("dataset,lp,src,mt,ref,score,system\n")
    with retrain_lock("data/.retrain.lock"):
        assert retrain_on_new_annotations("params.yaml") == {"status": "busy"}
    assert Path("data/incoming/new.csv").is_file()  # untouched by the second run
    assert not Path("data/annotations").exists()
