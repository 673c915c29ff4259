"""uamt.experiments.report / stage report: sections in SECTIONS order from JSON results, findings summary,
data version, and a missing result as an error naming the stage to run."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
import yaml

import uamt.experiments
from tests.conftest import REPO_ROOT
from tests.test_exp_ood import _inputs as ood_inputs
from uamt.core.errors import DataError
from uamt.experiments import cost, ood, report
from uamt.experiments.common import write_result

SECTIONS = ("ood", "stubsec", "cost")

COST_RESULT = {
    "machine": {
        "cpu_count": 2,
        "torch_threads": 2,
        "cpu_model": "Test CPU",
        "torch": "2.x",
        "loadavg_start": [1.5, 1.0, 0.5],
        "loadavg_end": [1.0, 1.0, 0.5],
    },
    "data": {
        "datasets": ["wmt21_mqm"],
        "train_rows": 100,
        "dup_train_rows": 100,
        "dev_rows": 20,
        "test_rows": 50,
    },
    "settings": {
        "seed": 13,
        "epochs": 2,
        "max_epochs": 2,
        "patience": 2,
        "hidden_sizes": [16],
        "batch_size": 8,
        "mc_samples": 100,
        "ensemble_size": 5,
        "kl_missing_std": "floor",
        "full_mc_rows": 4,
        "full_mc_passes": 2,
    },
    "methods": {
        m: {
            "label": m,
            "passes": p,
            "train_s": t,
            "train_cpu_s": 2 * t,
            "train_note": "n",
            "seg_per_s": 1000 / i,
            "infer_s_per_1k": i,
            "infer_cpu_s_per_1k": 2 * i,
            "cold_seg_per_s": 1000 / (i + 30),
            "cold_cpu_s_per_1k": 2 * i + 60,
            "measured": "best of 3",
        }
        for m, p, t, i in (
            ("point", 1, 10.0, 1.0),
            ("mcd_head", 100, 10.1, 40.0),
            ("ensemble", 5, 50.0, 5.0),
            ("hts", 1, 10.5, 1.0),
            ("hts_mcd", 100, 10.6, 41.0),
            ("kl", 1, 10.4, 1.0),
            ("dup_hts", 2, 18.0, 2.0),
        )
    },
    "encoding": {
        "texts": 300,
        "seconds": 6.0,
        "texts_per_s": 50.0,
        "ms_per_text": 20.0,
        "cpu_seconds": 12.0,
        "cpu_ms_per_text": 40.0,
        "mean_chars": 80.0,
        "texts_per_segment": 1.5,
        "ms_per_segment": 30.0,
        "ms_per_new_segment": 60.0,
    },
    "wall_s": 100.0,
}


def stub_module() -> types.ModuleType:
    """A section module without ``report_findings`` (the report must tolerate it)."""
    module = types.ModuleType("uamt.experiments.stubsec")
    module.render = lambda result: f"## 2. Stub analysis\n\nIt measured {result['value']:.2f}.\n"
    module.findings = lambda result: {"a helper of its own": 1}  # not the report's hook: ignored
    return module


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(uamt.experiments, "SECTIONS", SECTIONS)
    monkeypatch.setitem(sys.modules, "uamt.experiments.stubsec", stub_module())
    metrics, figures = Path("metrics/experiments"), Path("reports/figures")
    write_result("ood", ood.ood_analysis(*ood_inputs(), n_boot=20), metrics)
    write_result("stubsec", {"value": 0.5}, metrics)
    write_result("cost", COST_RESULT, metrics)
    figures.mkdir(parents=True)
    for name in (ood.FIGURE, cost.FIGURE):
        (figures / name).write_bytes(b"\x89PNG fake")
    Path("data/prepared").mkdir(parents=True)
    pd.DataFrame({"score": [1.0, 2.0]}).to_parquet("data/prepared/test.parquet")
    return metrics, figures


def test_report_assembles_sections_in_order_with_summary(workspace):
    from uamt.data.prepare import data_version

    metrics, figures = workspace
    text = report.build_report(metrics, figures)
    assert text.startswith("# Experiments: the papers' analyses re-run on real data\n")
    assert "`dvc repro report`" in text
    assert f"Data version: `{data_version('data/prepared')}`" in text
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Summary: which published findings held",
        "## 1. Out-of-domain sharpness (news vs TED)",
        "## 2. Stub analysis",
        "## 3. Computational cost",
        "## Interval goals: the served distribution, per LP and cell",
    ]
    assert "`metrics/conditional.json` missing: run `dvc repro evaluate`." in text
    assert "It measured 0.50." in text
    # 3 ood findings (all held on the synthetic numbers) + 4 cost findings; the stub has none.
    assert "7 findings tested:" in text
    assert "| 1. Out-of-domain sharpness (news vs TED) | DUP's uncertainty rises out of domain |" in text
    assert "| 3. Computational cost | A deep ensemble costs ~5x one model" in text
    assert report.build_report(metrics, figures) == text  # date-free: same inputs, same bytes


def test_missing_result_names_the_stage_to_run(workspace):
    metrics, figures = workspace
    (metrics / "cost.json").unlink()
    with pytest.raises(DataError, match=r"cost.json: missing; run `dvc repro exp_cost` first"):
        report.build_report(metrics, figures)


def test_stale_result_names_the_stage_to_rerun(workspace):
    metrics, figures = workspace
    write_result("stubsec", {"renamed": 0.5}, metrics)  # render reads result["value"]
    with pytest.raises(DataError, match=r"stubsec.json: .*KeyError: 'value'.*re-run `dvc repro exp_stubsec`"):
        report.build_report(metrics, figures)


def test_missing_figure_or_data_is_an_error(workspace):
    metrics, figures = workspace
    (figures / ood.FIGURE).unlink()
    with pytest.raises(
        DataError, match=r"ood_sharpness.png: linked from section 'ood' but missing; run `dvc repro exp_ood`"
    ):
        report.build_report(metrics, figures)
    with pytest.raises(DataError, match=r"no prepared splits; run `dvc repro prepare`"):
        report.build_report(metrics, figures, prepared_dir="elsewhere")


def test_findings_contract_is_checked(workspace, monkeypatch):
    metrics, figures = workspace
    module = stub_module()
    module.report_findings = lambda result: [("only two", "fields")]
    monkeypatch.setitem(sys.modules, "uamt.experiments.stubsec", module)
    with pytest.raises(DataError, match=r"stubsec.report_findings: expected \(finding, paper, ours\)"):
        report.build_report(metrics, figures)
    module.report_findings = lambda result: [("a | b", "paper\nline", "partly: x")]
    text = report.build_report(metrics, figures)
    assert "| 2. Stub analysis | a \\| b | paper line | partly: x |" in text
    assert "1 partly" in text


def test_verdict_of():
    assert [report.verdict_of(s) for s in ("held: x", "Not held: y", "partly", "n/a: -", "maybe")] == [
        "held",
        "not held",
        "partly",
        "n/a",
        "?",
    ]


def test_stage_writes_the_report_and_keeps_the_old_one_on_error(workspace):
    from uamt.stages import report as stage

    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    Path("params.yaml").write_text(yaml.safe_dump(params))
    assert stage.main(["--params", "params.yaml"]) == 0
    out = Path(params["report"]["out"])
    written = out.read_text()
    assert "## 3. Computational cost" in written
    Path("metrics/experiments/ood.json").unlink()
    assert stage.main(["--params", "params.yaml"]) == 2
    assert out.read_text() == written  # nothing half-written, the previous report untouched
    assert sorted(p.name for p in out.parent.iterdir()) == ["experiments.md", "figures"]  # no temp file left


def test_report_lists_the_interval_goals_per_model(workspace):
    from tests.test_uncertainty_goals import _summary
    from uamt.uncertainty.goals import goal_rows

    metrics, figures = workspace
    summary = _summary(
        served="mondrian_conformal", rule="min_goal_ratio", coverage=0.905, width=8.0, crps=1.48,
        ece={"served": 0.012, "floor": 0.009}, ups=0.3, ups_raw=0.2, ence=0.1, ence_raw=0.5,
        candidates={"affine_ece": {"coverage": 0.88, "lp_coverage_error": 0.03, "sigma_quintile_coverage_error": 0.2,
                                   "mu_quintile_coverage_error": 0.1, "low_score_coverage": 0.0, "ence": 0.4,
                                   "sigma_p90_p10_min": 1.0, "ece": 0.01, "nll": 1.3}},
    )
    summary["baseline"].update(coverage=0.9, width=9.0)
    for m in summary["per_lp"].values():
        m.update(pps=0.3, crps=1.5, ups=0.3, ups_raw=0.2, ence=0.1, ence_raw=0.5, sigma_p90_p10=1.8, n_eff=100.0)
    # 20 risk deciles, the worst 0.06 beyond the bound: beyond its band (0.039), within the family's (0.060)
    bins = [{"predicted": 0.2, "observed": 0.2, "se": 0.02} for _ in range(19)] + [{"predicted": 0.2, "observed": 0.31, "se": 0.02}]
    summary["per_lp"]["zh-en"]["risk"]["-5"].update(max_gap=0.11, bins=bins)
    summary["per_lp"]["en-de"]["risk"]["-5"]["bins"] = []
    summary["goals"] = goal_rows(summary)
    Path("metrics/conditional.json").write_text(json.dumps({"hts": summary}))
    text = report.build_report(metrics, figures)
    assert "### hts (served: mondrian_conformal, rule min_goal_ratio)" in text
    assert "CRPS 1.480 (baseline point+mondrian_conformal: 1.500, coverage 0.900, width 9.00)" in text
    # met, but 0.02 lies within 1.96 x sqrt(0.9 x 0.1 / 100) = 0.059 of the bound 0.03
    assert "| coverage@0.9 within ±3 points in every LP | max |cov - 0.9| <= 0.03 | 0.020 | 0.059 | 2 | yes (within band) | en-de 0.920 |" in text
    assert "| 0.070 | 0.020 | – | no | zh-en q1: 0.830 ± 0.020 (1/10 cells outside) |" in text  # missed, beyond its band
    assert "| 0.110 | 0.039 | 20 | no (within chance of the worst of 20) | zh-en at chi=-5; 1/20 deciles" in text
    assert "| < 0 | -0.020 | – | 1 | yes | point+mondrian_conformal 1.500 |" in text  # no band claimed
    assert "| en-de | 500 | 0.920 | 8.00 | 0.070 / 0.010 | 0.800 |" in text
    assert "| affine_ece | no | 0.880 |" in text
    assert "Unseen language pairs with the model held out" not in text  # no train_lolo models measured

    held = {"n": 300, "coverage@0.9": 0.905, "coverage@0.9_unwidened": 0.88, "width@0.9": 12.5,
            "seen_width@0.9": 10.0, "crps": 2.0, "pps": 0.3, "sigma_factor": 1.13}
    summary["unseen_lp_held_out_models"] = {"en-de": held, "avg": {**held, "n": 300}}
    Path("metrics/conditional.json").write_text(json.dumps({"hts": summary}))
    text = report.build_report(metrics, figures)
    assert "by the unseen-LP factor (1.130)" in text
    assert "| en-de | 300 | 0.905 | 0.880 | 12.50 | 10.00 | 2.000 | 0.300 |" in text


def test_report_names_each_models_sigma_weight_and_an_exact_baseline(workspace):
    """Before: a method whose own sigma the dev rule gave weight 0 read as if it served that sigma
    (DUP's rows equal its baseline's to the last digit, with no word why)."""
    from tests.test_uncertainty_goals import _summary

    metrics, figures = workspace
    common = dict(
        served="signed_mondrian_conformal", rule="min_goal_ratio", coverage=0.9, width=9.0,
        ece={"served": 0.012, "floor": 0.009}, ups=0.3, ups_raw=0.2, ence=0.1, ence_raw=0.5,
    )  # fmt: skip
    exact, own_mu, weighted = _summary(**common, crps=1.5), _summary(**common, crps=1.49), _summary(**common, crps=1.5)
    for summary in (exact, own_mu, weighted):
        summary["baseline"].update(coverage=0.9, width=9.0, crps=1.5)
        summary.update(goals=[], candidates={})
        for m in summary["per_lp"].values():
            m.update(pps=0.3, crps=1.5, ups=0.3, ups_raw=0.2, ence=0.1, ence_raw=0.5, sigma_p90_p10=1.8, n_eff=100.0)
    Path("metrics/conditional.json").write_text(json.dumps({"dup": exact, "mcd_head": own_mu, "hts": weighted, "point": own_mu}))
    Path("metrics/dev.json").write_text(json.dumps({
        "dup": {"sigma_weight": {"chosen": 0.0}},
        "mcd_head": {"sigma_weight": {"chosen": 0.0}},
        "hts": {"sigma_weight": {"chosen": 0.5}, "unseen_lp": {"sigma_weight": {"chosen": 1.0}}},
        "point": {},
    }))  # fmt: skip
    text = report.build_report(metrics, figures)
    sections = {block.split(" ", 1)[0]: block for block in text.split("### ")[1:]}
    assert sections["dup"].startswith("dup (served: signed_mondrian_conformal, rule min_goal_ratio, sigma weight 0)")
    assert "gave this model's own sigma no weight" in sections["dup"]
    assert "it serves exactly its baseline (CRPS, coverage and width identical)" in sections["dup"]
    assert "gave this model's own sigma no weight" in sections["mcd_head"]
    assert "exactly its baseline" not in sections["mcd_head"]  # its own mu: CRPS 1.490, not 1.500
    assert sections["hts"].startswith("hts (served: signed_mondrian_conformal, rule min_goal_ratio, sigma weight 0.5 / unseen LPs 1)")
    assert "no weight" not in sections["hts"]
    assert sections["point"].startswith("point (served: signed_mondrian_conformal, rule min_goal_ratio)")
