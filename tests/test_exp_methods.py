"""uamt.experiments.methods: the method comparison (Better UQ Tables 1–3) on a small synthetic benchmark.

Synthetic canonical tables (like tests/test_models.py): each text's "embedding" [3 layers, 8 dims]
comes from a generator seeded by its crc32, scores depend on the mt/ref embeddings with noise that
grows with one feature.  A DA-like dataset (de-en, zh-en, some rows with an annotator std) and an
MQM-like one (en-de, zh-en, one rating per row) go through the whole analysis with tiny heads.
"""

from __future__ import annotations

import json
import math
import shutil
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.fakes import FEATURES, WEIGHTS, embed
from uamt.core.config import ConfigError
from uamt.experiments import methods as M
from uamt.experiments.common import INDICATORS, read_result, write_result
from uamt.models import TrainConfig, load, train

CFG = TrainConfig(hidden_sizes=(16,), max_epochs=1, batch_size=16, mc_samples=5, ensemble_size=2, patience=1)
DUP_CFG = CFG.replace(method="dup", bottleneck_size=8)


def make_split(dataset: str, split: str, lps, n_src: int, n_sys: int, with_std: bool) -> pd.DataFrame:
    rng = np.random.default_rng(zlib.crc32(f"{dataset}/{split}".encode()))
    rows = []
    for lp in lps:
        for i in range(n_src):
            src, ref = f"{dataset} {split} {lp} src {i}", f"{dataset} {split} {lp} ref {i}"
            for s in range(n_sys):
                mt = f"{dataset} {split} {lp} mt {i} sys{s}"
                fm, fr = embed([mt])[0].mean(0), embed([ref])[0].mean(0)
                multi = with_std and (i + s) % 3 == 0
                rows.append(
                    {
                        "dataset": dataset,
                        "split": split,
                        "lp": lp,
                        "src": src,
                        "mt": mt,
                        "ref": ref,
                        "score": float(fm @ WEIGHTS - 0.5 * fr @ WEIGHTS + rng.normal() * (0.2 + abs(fm[0]))),
                        "score_std": float(abs(rng.normal()) + 0.1) if multi else np.nan,
                        "n_annotators": 3 if multi else 1,
                        "seg_id": i + 1,
                        "system": f"sys{s}",
                    }
                )
    return pd.DataFrame(rows)


SRC_PER_SPLIT = {"d_q": 30, "d_e": 24, "dev": 12, "test": 12}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prepared")
    for split, n_src in SRC_PER_SPLIT.items():
        frame = pd.concat(
            [
                make_split("syn_da", split, ("de-en", "zh-en"), n_src, 4, with_std=True),
                make_split("syn_mqm", split, ("en-de", "zh-en"), n_src // 2, 4, with_std=False),
            ],
            ignore_index=True,
        )
        frame.to_parquet(root / f"{split}.parquet", index=False)
    return root


def settings(tmp: Path, **changes) -> M.MethodsSettings:
    values = dict(
        methods=("point", "mcd_head", "hts", "kl", "dup"),
        dup_losses=("abs", "hts"),
        models_dir=str(tmp / "models" / "experiments"),
        da_dataset="syn_da",
        da_rows_per_lp={"d_q": 100, "d_e": 80, "dev": 40, "test": 1000},
        da_seed=3,
        mqm_dataset="syn_mqm",
        mqm_reuse_models_dir=str(tmp / "models"),
        mqm_reuse_predictions_dir=str(tmp / "predictions"),
    )
    values.update(changes)
    return M.MethodsSettings(**values)


@pytest.fixture(scope="module")
def analysis(prepared, tmp_path_factory):
    """The analysis with a 'pipeline' that trained point (on MQM d_q, with stored dev predictions and
    stale test predictions) and hts on fewer rows (so it must not be reused)."""
    from uamt.pipeline_config import read_split

    tmp = tmp_path_factory.mktemp("run")
    d_q = read_split(prepared, "d_q", ("syn_mqm",))
    dev = read_split(prepared, "dev", ("syn_mqm",))
    test = read_split(prepared, "test", ("syn_mqm",))
    point = train("point", CFG, d_q, dev, FEATURES, tmp / "models" / "point")
    train("hts", CFG, d_q.head(len(d_q) - 16), dev, FEATURES, tmp / "models" / "hts")
    for split, frame in (("dev", dev), ("test", test)):
        (tmp / "predictions" / split).mkdir(parents=True)
        table = load(point).predictions_table(frame, FEATURES)
        if split == "test":  # stale: an older model's predictions, same rows
            table["mu"] += 0.5
        table.to_parquet(tmp / "predictions" / split / "point.parquet")
    cfg = settings(tmp)
    result = M.run_analysis(cfg, CFG, DUP_CFG, FEATURES, prepared_dir=prepared)
    return tmp, cfg, result


def test_sample_per_lp_takes_whole_sources_deterministically():
    frame = make_split("syn_da", "d_q", ("de-en", "zh-en"), 10, 4, with_std=False)
    a = M.sample_per_lp(frame, 10, seed=1)
    b = M.sample_per_lp(frame.sample(frac=1, random_state=0), 10, seed=1)
    c = M.sample_per_lp(frame, 10, seed=2)
    assert a.groupby("lp").size().to_dict() == {"de-en": 10, "zh-en": 10}
    # 10 rows = 2 whole sources of 4 translations + 2 rows of a third: 3 sources per LP
    assert a.groupby("lp")["src"].nunique().to_dict() == {"de-en": 3, "zh-en": 3}
    assert sorted(a["mt"]) == sorted(b["mt"])  # independent of row order
    assert sorted(a["mt"]) != sorted(c["mt"])
    assert len(M.sample_per_lp(frame, 1000, seed=1)) == len(frame)  # fewer rows than asked: all


def test_lp_groups_and_rows():
    assert M.lp_groups(["zh-en", "en-de", "de-en", "de-fr"]) == {
        "xx-en": ["de-en", "zh-en"],
        "en-xx": ["en-de"],
    }
    assert M.row_keys(("point", "dup", "hts"), ("abs", "sq")) == ("point", "dup_abs", "dup_sq", "hts")


def test_unknown_method_or_bad_settings_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"method='nope' not supported; choose from \['dup', 'ensemble'"):
        settings(tmp_path, methods=("point", "nope"))
    with pytest.raises(ConfigError, match="must include 'point'"):
        settings(tmp_path, methods=("hts",))
    with pytest.raises(ConfigError, match="loss='l1' not supported"):
        settings(tmp_path, dup_losses=("l1",))
    with pytest.raises(ConfigError, match="da_rows_per_lp: keys"):
        settings(tmp_path, da_rows_per_lp={"d_q": 10})
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["exp_methods"]["methods"] = ["point", "mcd_full"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    from uamt.stages.exp_methods import load_config

    with pytest.raises(ConfigError, match="method='mcd_full' not supported"):
        load_config(path)


def test_tables_have_every_row_lp_and_indicator(analysis, prepared):
    _, cfg, result = analysis
    rows = ("point", "mcd_head", "hts", "kl", "dup_abs", "dup_hts")
    assert tuple(result["rows"]) == rows
    da, mqm = result["da"], result["mqm"]
    assert da["rows"] == list(rows) and set(da["indicators"]) == set(rows)
    # MQM-like data has one rating per row: KL is refused with its reason, not faked
    assert "kl" not in mqm["indicators"] and "annotator" in mqm["unavailable"]["kl"]
    assert da["kl"]["available"] and 0 < da["kl"]["rows_with_std"] < da["kl"]["rows"]
    # the default rule trains single-rater rows with the HTS loss: no sigma* is invented for them
    assert da["kl"]["missing_std_rule"] == "hts" and "fill_std" not in da["kl"]
    for bench, lps in ((da, ["de-en", "zh-en"]), (mqm, ["en-de", "zh-en"])):
        assert bench["lps"] == lps
        for row, block in bench["indicators"].items():
            assert set(block) == {*lps, "avg", "xx-en", "en-xx"}, row
            for key in INDICATORS:
                values = [block[lp][key] for lp in lps]
                if row == "point" and key == "ups":
                    assert all(v is None for v in values)  # fixed variance: UPS undefined
                    continue
                assert all(v is not None and math.isfinite(v) for v in values), (row, key)
                assert block["avg"][key] == pytest.approx(np.mean(values)), (row, key)
            assert 0 <= block["avg"]["ece"] <= 0.5 and block["avg"]["sharpness"] > 0
            assert block["avg"]["n"] == sum(block[lp]["n"] for lp in lps)
    # groups: DA is all into English (group = avg, no en-xx); MQM has one LP per group
    for block in da["indicators"].values():
        assert block["en-xx"] is None
        assert block["xx-en"]["pps"] == pytest.approx(block["avg"]["pps"])
    for block in mqm["indicators"].values():
        assert block["en-xx"]["nll"] == pytest.approx(block["en-de"]["nll"])
        assert block["xx-en"]["nll"] == pytest.approx(block["zh-en"]["nll"])
    # every DUP shares the point model's mu, so PPS is the same for the baseline and each loss
    for bench in (da, mqm):
        pps = {r: bench["indicators"][r]["avg"]["pps"] for r in ("point", "dup_abs", "dup_hts")}
        assert pps["dup_abs"] == pytest.approx(pps["point"]) and pps["dup_hts"] == pytest.approx(pps["point"])
    # chrF's PPS: Pearson of sentence chrF with the human score on the test rows, per LP
    from uamt.lexical import segment_scores

    da_test = M.da_frames(prepared, cfg)["test"]
    zh = da_test[da_test["lp"] == "zh-en"]
    expected = np.corrcoef(segment_scores(list(zh["mt"]), list(zh["ref"]), "chrf"), zh["score"])[0, 1]
    assert da["chrf_pps"]["zh-en"] == pytest.approx(expected)
    assert da["chrf_pps"]["avg"] == pytest.approx(np.mean([da["chrf_pps"][lp] for lp in da["lps"]]))
    assert len(da_test) == da["sizes"]["test"]["total"]
    # sizes: whole sources of 4 rows per LP, capped at the requested rows
    assert da["sizes"]["d_q"] == {"total": 200, "de-en": 100, "zh-en": 100}
    assert da["sizes"]["test"]["total"] == 2 * SRC_PER_SPLIT["test"] * 4  # fewer than asked: all


def test_reuse_and_timings(analysis):
    tmp, _, result = analysis
    timings = result["mqm"]["timings"]
    assert timings["point"]["origin"] == "reused" and timings["point"]["train_s"] is None
    n_dev, n_test = result["mqm"]["sizes"]["dev"]["total"], result["mqm"]["sizes"]["test"]["total"]
    # the stored dev table is read; the stale test table is not: test is predicted again
    assert timings["point"]["read_rows"] == n_dev and timings["point"]["predicted_rows"] == n_test
    assert timings["point"]["predict_s"] > 0
    assert timings["hts"]["origin"] == "trained"  # the pipeline's hts saw other rows
    assert timings["mcd_head"]["origin"] == "reused" or timings["mcd_head"]["same_training_as"] == "point"
    assert Path(timings["dup_abs"]["model_dir"]).parent == Path(tmp / "models" / "experiments" / "mqm")
    for row, t in result["da"]["timings"].items():
        assert t["origin"] in ("trained", "derived") and t["predict_s"] > 0, row
        assert (t["train_s"] or 0) >= 0
    assert result["da"]["timings"]["mcd_head"]["same_training_as"] == "point"
    # reuse only a model of the same method, settings and training rows
    n_dq = result["mqm"]["sizes"]["d_q"]["total"]
    pipeline_point = tmp / "models" / "point"
    assert M._reusable(pipeline_point, "point", n_dq, CFG)
    assert not M._reusable(pipeline_point, "point", n_dq, CFG.replace(dropout=0.3))
    assert not M._reusable(pipeline_point, "point", n_dq + 1, CFG)
    assert not M._reusable(pipeline_point, "hts", n_dq, CFG)
    assert not M._reusable(tmp / "models" / "nothing", "point", n_dq, CFG)
    # a model stored before a setting existed was trained with its default: still reusable
    older = tmp / "models" / "point-older"
    shutil.copytree(pipeline_point, older)
    meta = json.loads((older / "model.json").read_text(encoding="utf-8"))
    assert meta["config"].pop("finetune_top_layers") == 0
    (older / "model.json").write_text(json.dumps(meta), encoding="utf-8")
    assert M._reusable(older, "point", n_dq, CFG)
    shutil.rmtree(older)
    # DUP's M_E sits on the point model: its manifest says so
    dup = load(result["da"]["timings"]["dup_abs"]["model_dir"])
    assert dup.meta["config"]["dup_loss"] == "abs" and dup.base.method == "point"


def test_render_json_and_figures(analysis, tmp_path):
    _, _, result = analysis
    path = write_result("methods", result, tmp_path)
    again = read_result("methods", tmp_path)
    assert again["rows"] == result["rows"]
    text = M.render(again)
    assert text.startswith("## 1. Comparison of uncertainty methods")
    for title in ("Table 1: DUP losses", "Table 2: DA", "Table 3: MQM", "What the data shows"):
        assert title in text
    table2 = text.split("### Table 2")[1].split("###")[0]
    body = [line for line in table2.splitlines() if line.startswith("| ") and "method" not in line]
    # rows: point, mcd_head, hts, kl, dup_hts (dup_abs only in Table 1), chrF x (2 LPs, "XX-EN = AVG")
    assert len(body) == 6 * 3 and table2.count("| XX-EN = AVG |") == 6
    table3 = text.split("### Table 3")[1].split("###")[0]
    body = [line for line in table3.splitlines() if line.startswith("| ") and "method" not in line]
    # (en-de, zh-en, AVG): one-LP groups not repeated; no chrF row where chrF is constant (undefined r)
    assert again["mqm"]["chrf_pps"] == {"en-de": None, "zh-en": None, "avg": None}
    assert len(body) == 4 * 3 and "KL" not in table3 and "chrF" not in table3
    assert "DUP L_ABS" not in table2 and "Baseline (fixed σ²)" in table2
    table1 = text.split("### Table 1")[1].split("###")[0]
    assert table1.count("DUP L_") == 4  # 2 losses x (DA, MQM)
    assert "KL not available" in text and "**MQM** (syn_mqm" in text
    figures = M.write_figures(again, tmp_path / "figures")
    assert [p.name for p in figures] == ["methods_sharpness_ups.png", "methods_ece_by_lp.png"]
    assert all(p.stat().st_size > 5000 for p in figures)
    assert path.is_file()


def test_report_findings_count_cells_by_hand(analysis):
    from uamt.experiments.report import VERDICTS

    _, _, result = analysis
    found = {finding: measured for finding, _, measured in M.report_findings(result)}
    for measured in found.values():
        assert measured.split(":")[0] in VERDICTS
    # sharpness: (dup_hts, hts) vs mcd_head on 2 benchmarks x 2 LPs = 8 cells (no ensemble in this run)
    wins = sum(
        result[b]["indicators"][a][lp]["sharpness"] < result[b]["indicators"]["mcd_head"][lp]["sharpness"]
        for b in ("da", "mqm")
        for lp in result[b]["lps"]
        for a in ("dup_hts", "hts")
    )
    sharp = found["DUP and HTS give sharper (smaller) calibrated variances than MCD and DE"]
    assert f"{wins}/8 LP cells" in sharp
    assert sharp.startswith(("held" if wins >= 6 else "partly" if wins > 4 else "not held") + ":")
    assert found["KL on MQM (syn_mqm)"].startswith("n/a: no d_q row has >= 2 annotators")
    # KL exists only on DA: its cells are the 2 DA LPs
    assert "/2 LP cells" in found["KL (annotator disagreement as target) ranks errors less well than HTS"]
