"""uamt.experiments.ood / stage exp_ood: sharpness in vs out of domain, on hand-made metrics and tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import REPO_ROOT
from uamt.core.errors import DataError
from uamt.experiments import ood

LPS = ("en-de", "zh-en")
#: Calibrated sharpness (in, out) per method and LP, chosen so each paper expectation is testable.
SHARPNESS = {
    "point": {"en-de": (0.8, 0.8), "zh-en": (0.9, 0.9)},
    "dup": {"en-de": (0.2, 0.3), "zh-en": (0.5, 0.52)},  # +50 % rise, +4 % flat
    "hts": {"en-de": (0.3, 0.31), "zh-en": (0.5, 0.45)},  # +3.3 % flat, -10 % flat (edge)
    "mcd_head": {"en-de": (1.0, 0.7), "zh-en": (1.0, 0.8)},  # -30 %, -20 %: drops
}
#: Raw sigma per (method, LP, split): constant within an LP, so means are exact.
SIGMA = {"dup": {"en-de": (1.0, 2.0), "zh-en": (1.0, 1.0)}, "hts": {"en-de": (2.0, 2.0), "zh-en": (1.0, 0.5)}}


def _metrics(side: int) -> dict:
    out = {}
    for method, by_lp in SHARPNESS.items():
        block = {
            lp: {
                "sharpness": v[side],
                "pps": 0.3 - 0.1 * side,
                "ece": 0.02 + 0.03 * side,
                "crps": 1.0,
                "coverage@0.9": 0.9,
            }
            for lp, v in by_lp.items()
        }
        block["avg"] = {
            key: float(np.mean([block[lp][key] for lp in LPS]))
            for key in ("sharpness", "pps", "ece", "crps", "coverage@0.9")
        }
        out[method] = block
    return out


def _table(method: str, side: int, rows_per_lp: int = 4) -> pd.DataFrame:
    frames = []
    for lp in LPS:
        sigma = SIGMA.get(method, {}).get(lp, (np.nan, np.nan))[side]
        if method == "mcd_head":
            sigma = 1.0
        human = np.arange(rows_per_lp, dtype=float) * (1 + side)
        frames.append(
            pd.DataFrame(
                {"lp": lp, "human": human, "mu": np.zeros(rows_per_lp), "sigma": np.full(rows_per_lp, sigma)}
            )
        )
    table = pd.concat(frames, ignore_index=True)
    if method == "hts":  # a component column, as hts_mcd writes
        table["aleatoric"] = table["sigma"] ** 2
    return table


def _inputs():
    test, oodm = _metrics(0), _metrics(1)
    tables_in = {m: _table(m, 0) for m in SHARPNESS}
    tables_out = {m: _table(m, 1) for m in SHARPNESS}
    return test, oodm, tables_in, tables_out


def _affine(lps: dict, global_fit=(0.5, 0.5)) -> dict:
    alpha, beta = global_fit
    return {"affine_variance": {"global": {"alpha": alpha, "beta": beta}, "lps": lps}}


#: calibration/<method>.json: HTS's beta is ~all of its sharpness; DUP's LPs fall back to global.
CALIBRATIONS = {
    "point": {**_affine({}), "fixed": True},
    "hts": _affine({"en-de": {"alpha": 0.002, "beta": 0.29}, "zh-en": {"alpha": 0.003, "beta": 0.48}}),
    "dup": _affine({}, global_fit=(0.4, 0.05)),
    "mcd_head": _affine({"en-de": {"alpha": 0.9, "beta": 0.1}, "zh-en": {"alpha": 0.9, "beta": 0.1}}),
}


@pytest.fixture(scope="module")
def result():
    return ood.ood_analysis(*_inputs(), flat_tolerance=0.10, n_boot=200, seed=1, calibrations=CALIBRATIONS)


def test_relative_change_and_direction():
    assert ood.relative_change(0.2, 0.3) == pytest.approx(0.5)
    assert ood.relative_change(-2.0, -1.0) == pytest.approx(0.5)  # relative to |before|
    assert ood.relative_change(0.0, 1.0) is None and ood.relative_change(None, 1.0) is None
    assert [ood.shift_direction(c, 0.1) for c in (0.5, 0.1, -0.1, -0.11, None)] == [
        "rise",
        "flat",
        "flat",
        "drop",
        None,
    ]
    assert ood.expectation_held("not rise", "drop") and ood.expectation_held("not rise", "flat")
    assert not ood.expectation_held("not rise", "rise") and ood.expectation_held("rise", None) is None


def test_calibrated_sharpness_changes_and_paper_comparison(result):
    assert result["methods"] == list(SHARPNESS) and result["lps"] == list(LPS)
    assert result["n"] == {"in": {"en-de": 4, "zh-en": 4}, "out": {"en-de": 4, "zh-en": 4}}
    dup = result["sharpness"]["dup"]
    assert dup["en-de"] == {"in": 0.2, "out": 0.3, "change": pytest.approx(0.5), "direction": "rise"}
    assert dup["zh-en"]["direction"] == "flat"
    assert result["sharpness"]["hts"]["zh-en"]["change"] == pytest.approx(-0.1)
    assert result["sharpness"]["mcd_head"]["avg"]["change"] == pytest.approx((0.75 - 1.0) / 1.0)
    held = {(c["method"], c["lp"]): c["held"] for c in result["comparison"]}
    assert held == {(m, lp): True for m in ("dup", "hts", "mcd_head") for lp in LPS}


def test_raw_variance_error_components_and_transfer(result):
    raw = result["raw_var"]
    assert raw["dup"]["en-de"]["in"] == pytest.approx(1.0) and raw["dup"]["en-de"]["out"] == pytest.approx(
        4.0
    )
    assert raw["dup"]["en-de"]["change"] == pytest.approx(3.0)
    assert raw["dup"]["en-de"]["ci"] == pytest.approx([3.0, 3.0])  # constant sigma: no spread
    assert raw["hts"]["zh-en"]["change"] == pytest.approx(-0.75)
    assert raw["dup"]["avg"]["in"] == pytest.approx(1.0) and raw["dup"]["avg"]["out"] == pytest.approx(2.5)
    # The point estimate has no sigma: no raw variance, no CI.
    assert raw["point"]["en-de"]["in"] is None and raw["point"]["en-de"]["ci"] is None
    # (human - mu)^2 with human = 0..3 in domain and 0, 2, 4, 6 out: mean 3.5 -> 14.
    assert result["sq_error"]["point"]["en-de"]["in"] == pytest.approx(3.5)
    assert result["sq_error"]["point"]["en-de"]["change"] == pytest.approx(3.0)
    assert result["components"]["hts"]["aleatoric"]["en-de"]["in"] == pytest.approx(4.0)
    assert "aleatoric" not in result["components"]["dup"]
    assert result["transfer"]["hts"]["avg"]["ece"] == {"in": pytest.approx(0.02), "out": pytest.approx(0.05)}


def test_calibration_constant_share(result):
    cal = result["calibration"]
    assert "point" not in cal  # the fixed variance is constant by construction
    assert cal["hts"]["en-de"] == {"alpha": 0.002, "beta": 0.29, "beta_share": pytest.approx(0.29 / 0.3)}
    assert cal["dup"]["zh-en"] == {"alpha": 0.4, "beta": 0.05, "beta_share": pytest.approx(0.05 / 0.5)}
    text = ood.render(result)
    assert "The dev-fitted calibration of `hts` is nearly constant: beta is 96%-97% of" in text
    assert "| hts | en-de | 0.0020 | 0.2900 | 97% |" in text
    with pytest.raises(DataError, match="no affine_variance alpha/beta for 'en-de'"):
        ood.affine_parameters({"affine_variance": {"lps": {}}}, "en-de", 0.3)


def test_findings_verdicts_follow_the_numbers():
    rows = ood.report_findings(ood.ood_analysis(*_inputs(), n_boot=0))
    assert [r[2].split(":")[0] for r in rows] == ["held", "held", "held"]
    assert "en-de +50% (rise)" in rows[0][2]
    test, oodm, tin, tout = _inputs()
    oodm["mcd_head"]["en-de"]["sharpness"] = 1.5  # MCD rises on en-de: the paper's claim fails there
    oodm["dup"]["en-de"]["sharpness"] = 0.19
    oodm["dup"]["zh-en"]["sharpness"] = 0.9
    verdicts = [
        r[2].split(":")[0] for r in ood.report_findings(ood.ood_analysis(test, oodm, tin, tout, n_boot=0))
    ]
    assert verdicts == ["not held", "held", "partly"]


def test_render_has_tables_figure_and_computed_paragraph(result):
    text = ood.render(result)
    assert text.startswith("## 3. Out-of-domain sharpness (news vs TED)")
    assert f"![Sharpness in vs out of domain](figures/{ood.FIGURE})" in text
    assert "| dup | en-de | 0.200 | 0.300 | +50% | rise |" in text
    assert "en-de +50% calibrated / +300% raw (rise; paper: rise, held)" in text
    # Raw variance: dup en-de rise (held), zh-en flat (held); hts en-de flat (held), zh-en drop (not);
    # mcd_head flat twice (not held): 3 of 6; calibrated: 6 of 6.
    assert "the paper's direction holds in 3 of 6 method x LP cells (calibrated: 6 of 6)" in text
    assert "| DUP | dup | en-de | rise | rise | +50% | yes | rise | +300% | yes |" in text
    json.dumps(result)


def test_bad_input_is_refused():
    test, oodm, tin, tout = _inputs()
    del tout["hts"]
    with pytest.raises(DataError, match=r"predictions/ood/hts.parquet: missing"):
        ood.ood_analysis(test, oodm, tin, tout)
    test, oodm, tin, tout = _inputs()
    tin["dup"] = tin["dup"].drop(columns="sigma")
    with pytest.raises(
        DataError, match=r"predictions/test/dup.parquet: predictions table lacks column\(s\) \['sigma'\]"
    ):
        ood.ood_analysis(test, oodm, tin, tout)
    with pytest.raises(ValueError, match="flat_tolerance=1.5"):
        ood.ood_analysis(*_inputs(), flat_tolerance=1.5)


def test_stage_reads_pipeline_outputs_and_writes_json_and_figure(tmp_path, monkeypatch):
    from uamt.stages import exp_ood

    monkeypatch.chdir(tmp_path)
    test, oodm, tin, tout = _inputs()
    Path("metrics").mkdir()
    Path("metrics/test.json").write_text(json.dumps(test))
    for split, tables in (("test", tin), ("ood", tout)):
        Path(f"predictions/{split}").mkdir(parents=True)
        for method, table in tables.items():
            table.to_parquet(f"predictions/{split}/{method}.parquet")
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["exp_ood"]["n_boot"] = 50
    Path("params.yaml").write_text(yaml.safe_dump(params))
    # evaluate has not written ood.json yet: the error names the stage to run.
    assert exp_ood.main(["--params", "params.yaml"]) == 2
    with pytest.raises(DataError, match=r"metrics/ood.json: missing; run `dvc repro evaluate`"):
        exp_ood.run(exp_ood.load_config("params.yaml"))
    Path("metrics/ood.json").write_text(json.dumps(oodm))
    with pytest.raises(DataError, match=r"calibration/point.json: missing; run `dvc repro calibrate`"):
        exp_ood.run(exp_ood.load_config("params.yaml"))
    Path("calibration").mkdir()
    for method, calibration in CALIBRATIONS.items():
        Path(f"calibration/{method}.json").write_text(json.dumps(calibration))
    assert exp_ood.main(["--params", "params.yaml"]) == 0
    saved = json.loads(Path("metrics/experiments/ood.json").read_text())
    assert saved["sharpness"]["dup"]["en-de"]["change"] == pytest.approx(0.5)
    assert saved["raw_var"]["point"]["en-de"]["in"] is None  # NaN -> null: strict JSON
    assert saved["calibration"]["hts"]["zh-en"]["beta"] == 0.48
    assert Path("reports/figures/ood_sharpness.png").stat().st_size > 5000
