"""uamt.experiments.cost / stage exp_cost: every method timed on one slice, ratios and findings.

Unit tests use a fixed synthetic table and a fake encoder (embeddings seeded by the text's crc32, as in
tests/test_models.py); the slow test runs the stage on a real slice (fetch -> prepare from the mirror)
with the real MiniLM encoder and a fresh cache.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from tests.conftest import REPO_ROOT
from uamt.core.errors import DataError
from uamt.experiments import cost
from uamt.models import FeatureSource, TrainConfig

N_LAYERS, DIM = 3, 8


class FakeEncoder:
    """Deterministic per-text embeddings; ``train=True`` adds noise (dropout stand-in for mcd_full)."""

    encoder_id = "fake-encoder-000"
    num_layers, dim = N_LAYERS, DIM
    comet_encoder = None

    def __init__(self):
        self.calls = 0

    def pooled_layers(self, texts, batch_size=None, train=False):
        self.calls += 1
        out = np.stack(
            [np.random.default_rng(zlib.crc32(t.encode())).normal(size=(N_LAYERS, DIM)) for t in texts]
        ).astype(np.float32)
        if train:
            out = out + np.random.default_rng(self.calls).normal(scale=0.1, size=out.shape).astype(np.float32)
        return torch.from_numpy(out)


ENCODER = FakeEncoder()
FEATURES = FeatureSource(
    lambda texts: ENCODER.pooled_layers(texts).numpy(), encoder_id=ENCODER.encoder_id, encoder=ENCODER
)


def make_table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "dataset": "synthetic",
            "lp": "en-de",
            "seg_id": np.arange(n) + 1,
            "system": [f"sys{i % 3}" for i in range(n)],
            "src": [f"src {seed}-{i // 3}" for i in range(n)],  # 3 systems share each source
            "mt": [f"mt {seed}-{i}" for i in range(n)],
            "ref": [f"ref {seed}-{i // 3}" for i in range(n)],
            "score": rng.normal(size=n),
            "score_std": np.nan,
            "n_annotators": 1,
        }
    )


TABLES = {
    "train": make_table(96, 1),
    "dup_train": make_table(96, 2),
    "dev": make_table(32, 3),
    "test": make_table(30, 4),
}
SETTINGS = cost.CostSettings(
    rows=96,
    dev_rows=32,
    test_rows=30,
    epochs=1,
    dup_losses=("abs", "hts"),
    encode_texts=12,
    full_mc_rows=4,
    full_mc_passes=2,
    repeats=2,
)
CFG = TrainConfig(hidden_sizes=(16,), batch_size=32, mc_samples=10, ensemble_size=2, max_epochs=5, patience=1)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return cost.measure_costs(
        SETTINGS,
        CFG,
        CFG.replace(method="dup", bottleneck_size=8),
        TABLES,
        FEATURES,
        ENCODER,
        tmp_path_factory.mktemp("cost"),
    )


def test_every_method_is_timed_with_consistent_units(result):
    assert list(result["methods"]) == [
        "point",
        "mcd_head",
        "mcd_full",
        "ensemble",
        "hts",
        "hts_mcd",
        "kl",
        "dup_abs",
        "dup_hts",
    ]
    for method, info in result["methods"].items():
        assert info["train_s"] > 0 and info["train_own_s"] > 0 and info["train_cpu_s"] > 0, method
        assert info["infer_cpu_s_per_1k"] > 0 and info["cold_cpu_s_per_1k"] >= info["infer_cpu_s_per_1k"]
        assert info["seg_per_s"] == pytest.approx(1000 / info["infer_s_per_1k"]), method
        assert info["cold_seg_per_s"] <= info["seg_per_s"] + 1e-9, method
    m = result["methods"]
    # Derived methods = their source's training + a copy; DUP = M_Q (point) + M_E.
    assert m["mcd_head"]["train_s"] == pytest.approx(m["point"]["train_s"] + m["mcd_head"]["train_own_s"])
    assert m["hts_mcd"]["train_s"] == pytest.approx(m["hts"]["train_s"] + m["hts_mcd"]["train_own_s"])
    assert m["dup_hts"]["train_s"] == pytest.approx(m["point"]["train_s"] + m["dup_hts"]["train_own_s"])
    assert (m["mcd_head"]["passes"], m["ensemble"]["passes"], m["dup_abs"]["passes"]) == (10, 2, 2)
    assert "extrapolated to 10" in m["mcd_full"]["measured"]
    assert result["settings"]["max_epochs"] == 1 and result["settings"]["patience"] == 1  # fixed epochs


def test_machine_data_and_encoding_are_recorded(result):
    machine = result["machine"]
    assert machine["cpu_count"] >= 1 and machine["loadavg_end"]
    # Timed with one torch thread (SETTINGS default), the caller's thread count restored after.
    assert machine["torch_threads"] == 1 and torch.get_num_threads() == machine["torch_default_threads"]
    assert result["data"] == {
        "datasets": ["synthetic"],
        "train_rows": 96,
        "dup_train_rows": 96,
        "dev_rows": 32,
        "test_rows": 30,
    }
    enc = result["encoding"]
    assert enc["texts"] == 12 and enc["texts_per_s"] == pytest.approx(12 / enc["seconds"])
    # 30 test rows: 10 sources + 30 translations + 10 references = 50 distinct texts.
    assert enc["texts_per_segment"] == pytest.approx(50 / 30)
    assert enc["ms_per_segment"] == pytest.approx(enc["ms_per_text"] * 50 / 30)
    json.dumps(result)


def _fake_result(times: dict[str, tuple[float, float]]) -> dict:
    return {
        "settings": {"ensemble_size": 5},
        "methods": {
            m: {
                "label": m,
                "train_cpu_s": t,
                "infer_cpu_s_per_1k": i,
                "cold_cpu_s_per_1k": i if m == "mcd_full" else i + 30,  # mcd_full encodes in every pass
                "measured": "best of 3",
            }
            for m, (t, i) in times.items()
        },
    }


def test_findings_from_hand_made_ratios():
    paper_like = _fake_result(
        {
            "point": (10, 1.0),
            "mcd_head": (10, 50.0),
            "mcd_full": (10, 900.0),
            "ensemble": (50, 5.0),
            "hts": (11, 1.1),
            "hts_mcd": (11, 60.0),
            "kl": (12, 1.1),
            "dup_hts": (22, 2.0),
        }
    )
    rows = cost.report_findings(paper_like)
    assert [r[2].split(":")[0] for r in rows] == ["held", "held", "held", "held"]
    assert "MCD head 45.5x" in rows[0][2] and "vs HTS incl. encoding 28.9x" in rows[0][2]
    assert "training 5.0x, inference 5.0x" in rows[1][2]
    cheap_mcd = _fake_result(
        {
            "point": (10, 1.0),
            "mcd_head": (10, 1.5),
            "mcd_full": (10, 900.0),
            "ensemble": (50, 1.2),
            "hts": (30, 1.1),
            "hts_mcd": (11, 1.4),
            "kl": (12, 1.1),
            "dup_hts": (22, 2.0),
        }
    )
    verdicts = [r[2].split(":")[0] for r in cost.report_findings(cheap_mcd)]
    # MCD head is cheap but through the encoder it is not; DE trains 5x but infers 1.2x; HTS trains 3x.
    assert verdicts == ["partly", "partly", "partly", "partly"]


def test_render_and_figure(result, tmp_path):
    text = cost.render(result)
    assert text.startswith("## 7. Computational cost")
    assert f"![Training and inference cost](figures/{cost.FIGURE})" in text
    assert "| DE-2 | 2 |" in text and "MCD-10 (full, paper's)" in text
    assert cost.plot_costs(result, tmp_path / "cost.png").stat().st_size > 5000


def test_bad_settings_and_tables_are_refused(tmp_path):
    with pytest.raises(ValueError, match="dup_loss='l1' not supported"):
        cost.CostSettings(dup_losses=("l1",))
    with pytest.raises(ValueError, match="rows=0 must be >= 1"):
        cost.CostSettings(rows=0)
    with pytest.raises(ValueError, match="full_mc_passes=1"):
        cost.CostSettings(full_mc_passes=1)
    with pytest.raises(DataError, match="table 'test' is missing or empty"):
        cost.measure_costs(
            SETTINGS, CFG, CFG, {**TABLES, "test": TABLES["test"].head(0)}, FEATURES, ENCODER, tmp_path
        )
    with pytest.raises(DataError, match="no rows to time on"):
        cost.sample_rows(TABLES["test"].head(0), 5, 0, "data/prepared/test")
    sample = cost.sample_rows(TABLES["train"], 10, 3, "x")
    assert len(sample) == 10 and list(sample["seg_id"]) == sorted(sample["seg_id"])
    assert sample.equals(cost.sample_rows(TABLES["train"], 10, 3, "x"))


@pytest.mark.slow
def test_stage_on_a_real_slice_with_minilm(tmp_path, monkeypatch, mirror_root):
    """fetch -> prepare (WMT21 news MQM, 400 rows per LP) -> exp_cost with tiny heads and a fresh cache."""
    from uamt.stages import exp_cost, fetch, prepare

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["fetch"]["mirror"] = str(mirror_root)
    params["fetch"]["sources_file"] = str(REPO_ROOT / "data_sources.yaml")
    # whole real documents of ~180-280 rows: ~1,500 rows per LP give every split a document
    params["prepare"].update(datasets=["wmt21_mqm"], forced_splits={}, max_rows_per_lp=1500)
    params["pipeline"]["datasets"] = ["wmt21_mqm"]
    params["train_base"].update(hidden_sizes=[32], batch_size=16, mc_samples=5, ensemble_size=2)
    params["train_dup"].update(bottleneck_size=8)
    params["exp_cost"].update(
        rows=48,
        dev_rows=16,
        test_rows=20,
        epochs=1,
        dup_losses=["hts"],
        encode_texts=10,
        full_mc_rows=2,
        full_mc_passes=2,
        repeats=1,
    )
    Path("params.yaml").write_text(yaml.safe_dump(params))
    for stage in (fetch, prepare, exp_cost):
        assert stage.main(["--params", "params.yaml"]) == 0, stage.NAME
    saved = json.loads(Path("metrics/experiments/cost.json").read_text())
    assert saved["data"]["datasets"] == ["wmt21_mqm"] and saved["data"]["test_rows"] == 20
    assert set(saved["methods"]) >= {"point", "mcd_head", "mcd_full", "ensemble", "hts", "kl", "dup_hts"}
    assert saved["encoding"]["texts"] == 10 and saved["encoding"]["texts_per_s"] > 0
    assert Path("reports/figures/cost.png").stat().st_size > 5000


class FrozenEncoder(FakeEncoder):
    """An ONNX export's stand-in: embeds like FakeEncoder but refuses ``train=True`` (no dropout)."""

    def pooled_layers(self, texts, batch_size=None, train=False):
        if train:
            raise ValueError("frozen ONNX export: train=True needs runtime='torch'")
        return super().pooled_layers(texts, batch_size)


def test_mcd_full_runs_dropout_through_the_mc_encoder_when_the_cache_encoder_is_frozen(tmp_path):
    """The pipeline encodes with ONNX Runtime (frozen); MC dropout through the encoder then runs on
    the torch encoder of the same weights (``mc_encoder``), while encoding is timed on the ONNX one."""
    frozen, dropout = FrozenEncoder(), FakeEncoder()
    settings = cost.CostSettings(**{**SETTINGS.__dict__, "dup_losses": ("abs",)})
    args = (settings, CFG, CFG.replace(method="dup", bottleneck_size=8), TABLES, FEATURES, frozen)
    with pytest.raises(ValueError, match="frozen ONNX export"):
        cost.measure_costs(*args, tmp_path / "frozen")
    result = cost.measure_costs(*args, tmp_path / "mc", mc_encoder=dropout)
    assert "mcd_full" in result["methods"] and dropout.calls > 0
    assert result["encoding"]["texts"] == settings.encode_texts
