"""A user's own raters as a campaign: ingested with a ``campaign`` name, partly held out of training
by ``prepare`` (``pool_calibration_share``), calibrated under ``lp|campaign`` and served by name.

The end-to-end path (ingest -> retrain -> the registered model answers ``campaign=``) is in
``tests/test_flows_retrain.py``; here each link, with the exact rows it must produce.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from uamt.campaigns import (
    campaign_keys,
    campaign_route,
    campaigns_below_minimum,
    fit_campaign_calibration,
    known_campaigns,
    row_campaigns,
)
from uamt.core.config import ConfigError
from uamt.core.errors import DataError
from uamt.data.prepare import PrepareConfig, _hash_share, place_pool_rows, read_pool_as_canonical
from uamt.data.schema import ARROW_SCHEMA, to_arrow
from uamt.ingest import ingest_incoming, read_pool, validate_file
from uamt.uncertainty import EvaluationSettings


def _rows(n: int, campaign=None, start: int = 0) -> list[dict]:
    rows = [
        {
            "dataset": "wmt21_mqm", "lp": "en-de", "src": f"The committee met on day {i}.",
            "mt": f"Der Ausschuss tagte am Tag {i}.", "ref": f"Das Komitee traf sich am Tag {i}.",
            "score": -1.5 * (i % 3), "system": "sysA", "doc": f"acme-doc-{i // 4}",
        }
        for i in range(start, start + n)
    ]  # fmt: skip
    if campaign is not None:
        for row in rows:
            row["campaign"] = campaign
    return rows


def test_a_campaign_name_is_kept_and_a_bad_one_is_refused_naming_row_and_field(tmp_path):
    path = tmp_path / "acme.csv"
    pd.DataFrame(_rows(3, "acme-raters_2026.v1")).to_csv(path, index=False)
    check = validate_file(path)
    assert check.ok, check.report()
    assert check.good["campaign"].tolist() == ["acme-raters_2026.v1"] * 3

    rows = _rows(4, "acme")
    rows[0]["campaign"] = "wmt21_mqm"  # the published raters' campaign
    rows[1]["campaign"] = "en-de|acme"  # the key separator
    rows[2]["campaign"] = "  "  # blank: no campaign
    pd.DataFrame(rows).to_csv(path, index=False)
    report = validate_file(path).report()
    assert "row 1 (line 2): field 'campaign': 'wmt21_mqm' names a published dataset" in report
    assert "row 2 (line 3): field 'campaign': must be a campaign name (letters, digits" in report
    assert "row 3" not in report and "row 4" not in report


def test_the_pool_keeps_campaigns_and_a_pool_without_any_keeps_its_columns(tmp_path, incoming_config):
    cfg = incoming_config()
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    pd.DataFrame(_rows(4)).to_csv(incoming / "plain.csv", index=False)
    ingest_incoming(cfg)
    # no row names a campaign: the pool's columns are those it always had
    assert pq.read_schema(cfg.pool_path).names == [*ARROW_SCHEMA.names, "source_sha256"]
    pd.DataFrame(_rows(4, "acme", start=10)).to_csv(incoming / "acme.csv", index=False)
    result = ingest_incoming(cfg)
    assert result.rows_added == 4
    pool = read_pool(cfg.pool_path)
    assert pool["campaign"].tolist() == [None] * 4 + ["acme"] * 4
    canonical = read_pool_as_canonical(cfg.pool_path)
    assert canonical.columns[-1] == "campaign" and canonical["campaign"].notna().sum() == 4


def test_to_arrow_writes_the_campaign_column_only_when_a_row_fills_it():
    frame = pd.DataFrame({name: [] for name in ARROW_SCHEMA.names})
    assert to_arrow(frame.assign(campaign=[])).schema.equals(ARROW_SCHEMA)


def test_two_campaigns_may_score_the_same_translation_differently_but_one_campaign_may_not(tmp_path, incoming_config):
    """One translation has one score per campaign: raters of two campaigns disagree (the published
    campaigns do too), a second score within one campaign, or among rows naming none, is refused."""
    path = tmp_path / "two.csv"
    first, second, third = _rows(1, "acme") + _rows(1, "zeta") + _rows(1, "acme")
    second["score"], third["score"] = -10.0, -5.0
    pd.DataFrame([first, second, third]).to_csv(path, index=False)
    report = validate_file(path).report()
    assert "row 1 (line 2): field 'score': duplicate of row 3 (same system, src, mt and campaign 'acme')" in report
    assert "row 3 (line 4): field 'score': duplicate of row 1 (same system, src, mt and campaign 'acme')" in report
    assert "row 2" not in report

    # against the pool: the same translation rated by rows naming no campaign, then by acme
    cfg = incoming_config()
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    pd.DataFrame(_rows(2)).to_csv(incoming / "plain.csv", index=False)
    assert ingest_incoming(cfg).rows_added == 2
    rerated = _rows(2, "acme")
    rerated[0]["score"] = -20.0
    pd.DataFrame(rerated).to_csv(incoming / "acme.csv", index=False)
    assert ingest_incoming(cfg).rows_added == 2  # another campaign's judgements, whatever the score
    again = _rows(1, "acme")
    again[0]["score"] = -3.0
    pd.DataFrame(again).to_csv(incoming / "acme-again.csv", index=False)
    result = ingest_incoming(cfg)
    assert result.rows_added == 0 and result.rejected == ["acme-again.csv"]
    assert "same system, src, mt and campaign 'acme' already in the pool with score -20.0, here -3.0" in (
        Path(result.reports["acme-again.csv"]).read_text()
    )
    pool = read_pool(cfg.pool_path)
    assert pool["score"].tolist() == [0.0, -1.5, -20.0, -1.5] and pool["campaign"].tolist() == [None, None, "acme", "acme"]


@pytest.mark.parametrize("policy", ["reject", "flag"])
def test_a_campaign_rerating_a_published_item_is_its_raters_judgement_but_a_renamed_system_is_not(
    policy, tmp_path, incoming_config
):
    """A published label is its dataset's campaign's judgement: another campaign's score of the same
    item is taken at any distance from it (without a campaign, -20 against 0 contradicts it), and one
    equal to it is kept as the campaign's own, not skipped as already published.  The system name is
    an identity, not a judgement: the same src and mt under an unpublished system name is still a
    conflict."""
    published = tmp_path / "prepared"
    published.mkdir()
    pd.DataFrame(_rows(3)).assign(split="d_q").to_parquet(published / "d_q.parquet")  # scores 0, -1.5, -3
    cfg = incoming_config(published_dir=str(published), on_published_conflict=policy, on_bad_rows="keep_good")
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    rows = _rows(3, "acme")
    rows[0]["score"] = -20.0  # far from the published 0
    rows[2]["system"] = "sysA-v2"  # the published item under another system name
    pd.DataFrame(rows).to_csv(incoming / "acme.csv", index=False)
    result = ingest_incoming(cfg)
    report = Path(result.reports["acme.csv"]).read_text() if "acme.csv" in result.reports else ""
    assert "contradicts" not in report and "already published" not in report
    assert "row 3 (line 4): field 'system': repeats a published item" in report
    assert result.rows_added == (2 if policy == "reject" else 3)
    pool = read_pool(cfg.pool_path)
    assert pool["score"].tolist()[:2] == [-20.0, -1.5] and set(pool["campaign"]) == {"acme"}

    # the same rows without a campaign: the -20 contradicts the published 0, the -1.5 repeats it exactly
    plain = _rows(2)
    plain[0]["score"] = -20.0
    pd.DataFrame(plain).to_csv(incoming / "plain.csv", index=False)
    report = Path(ingest_incoming(cfg).reports["plain.csv"]).read_text()
    assert "row 1 (line 2): field 'score': contradicts the published label" in report
    assert "row 2 (line 3): field '*': already published" in report


def test_a_campaigns_rerating_of_a_published_training_item_trains_beside_it():
    """prepare keeps both judgements: the campaign's row joins the published row's split."""
    pool = _pool(1, "acme").iloc[:1].assign(src="Published sentence.", doc="acme-doc")
    table, stats = place_pool_rows(_published(), pool, calibration_share=0.99)
    assert table["split"].tolist() == ["d_q", "test", "d_q"] and stats["placed"] == {"d_q": 1}


def _published() -> pd.DataFrame:
    frame = pd.DataFrame(
        [("wmt21_mqm", "en-de", "Published sentence.", "docQ", "d_q"),
         ("wmt21_mqm", "en-de", "Published test sentence.", "docT", "test")],
        columns=["dataset", "lp", "src", "doc", "split"],
    )  # fmt: skip
    return frame.assign(group="g-" + frame["doc"])


def _pool(n_docs: int, campaign) -> pd.DataFrame:
    rows = [("wmt21_mqm", "en-de", f"New sentence {d}.{i}.", f"user-doc-{d}", "") for d in range(n_docs) for i in range(3)]
    frame = pd.DataFrame(rows, columns=["dataset", "lp", "src", "doc", "split"]).assign(group="")
    return frame.assign(campaign=campaign)


def test_a_share_of_a_campaigns_new_documents_is_held_out_whole_for_its_calibration():
    pool = _pool(200, "acme")
    pool.loc[0, "src"] = "Published test sentence."  # still dropped: the test split stays fixed
    table, stats = place_pool_rows(_published(), pool, calibration_share=0.3)
    added = table.iloc[2:]
    assert (added.groupby("doc")["split"].nunique() == 1).all()  # whole documents
    held = added.loc[added["split"] == "d_e", "doc"].nunique() / added["doc"].nunique()
    assert held == pytest.approx(0.3, abs=0.08)
    expected = {g: "d_e" if _hash_share(g) < 0.3 else "d_q" for g in added["group"]}
    assert added["split"].tolist() == added["group"].map(expected).tolist()
    assert stats["campaigns"] == {"acme": stats["placed"]} and stats["calibration_share"] == 0.3
    assert stats["dropped"] == {"test": 3}

    # rows without a campaign, or a share of 0, train as before: all in d_q
    for campaign, share in ((None, 0.3), ("acme", 0.0)):
        table, stats = place_pool_rows(_published(), _pool(50, campaign), calibration_share=share)
        assert set(table.iloc[2:]["split"]) == {"d_q"}
        assert ("campaigns" in stats) == (campaign is not None)


def test_the_share_is_checked_naming_the_key():
    with pytest.raises(ConfigError, match=r"prepare.pool_calibration_share must be in \[0, 1\), got 1.0"):
        PrepareConfig(pool_calibration_share=1.0)


def _two_campaigns(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    mu = rng.uniform(-15.0, -6.0, 2 * n)
    human = np.clip(np.round(mu + np.r_[np.full(n, 1.0), np.full(n, 4.0)] * rng.standard_normal(2 * n)), -25, 0)
    rows = pd.DataFrame({
        "dataset": "wmt21_mqm", "lp": "en-de", "seg_id": np.arange(2 * n), "system": "s",
        "doc": [f"d{i // 10}" for i in range(2 * n)], "human": human, "mu": mu, "sigma": 1.5,
        "campaign": [None] * n + ["acme"] * n,
    })  # fmt: skip
    return rows


def test_a_users_campaign_gets_its_own_calibration_key_and_is_served_by_name():
    n = 600
    rows = _two_campaigns(n)
    assert row_campaigns(rows).tolist() == ["wmt21_mqm"] * n + ["acme"] * n
    assert set(campaign_keys(rows)) == {"en-de|wmt21_mqm", "en-de|acme"}
    assert row_campaigns(rows.drop(columns="campaign")).eq("wmt21_mqm").all()
    keyed = fit_campaign_calibration(rows, "hts", EvaluationSettings(), (-25.0, 0.0), min_rows=300)
    assert known_campaigns(keyed) == {"en-de": ["acme", "wmt21_mqm"]}
    assert campaigns_below_minimum(rows, keyed) == {}
    mask, keys = campaign_route(["en-de", "en-de"], ["acme", None], keyed)
    assert mask.tolist() == [True, False] and keys[0] == "en-de|acme"


def test_a_campaign_with_too_few_calibration_rows_is_not_served_and_is_named():
    rows = _two_campaigns(600)
    few = pd.concat([rows.iloc[:600], rows.iloc[600:800]], ignore_index=True)  # acme: 200 rows
    keyed = fit_campaign_calibration(few, "hts", EvaluationSettings(), (-25.0, 0.0), min_rows=300)
    assert known_campaigns(keyed) == {"en-de": ["wmt21_mqm"]}
    assert campaigns_below_minimum(few, keyed) == {"en-de|acme": 200}
    # the served campaign is fitted exactly as without a minimum, the part below the top included
    unlimited = fit_campaign_calibration(few, "hts", EvaluationSettings(top_atom=True), (-25.0, 0.0), min_rows=50)
    limited = fit_campaign_calibration(few, "hts", EvaluationSettings(top_atom=True), (-25.0, 0.0), min_rows=300)
    assert "en-de|acme" in unlimited.known_lps and "en-de|acme" not in limited.known_lps
    for part in (lambda c: c, lambda c: c.below_top):
        for component in ("standardizer", "served"):
            mine, theirs = getattr(part(limited), component), getattr(part(unlimited), component)
            assert mine.lp_params["en-de|wmt21_mqm"] == theirs.lp_params["en-de|wmt21_mqm"]
    assert limited.too_few_rows == {"min_rows": 300, "keys": {"en-de|acme": 200}} and unlimited.too_few_rows == {}
    with pytest.raises(DataError, match=(
        r"row 0: campaign 'acme' is not served for lp 'en-de': it had 200 calibration rows, fewer than the 300 this "
        r"model serves a campaign from \(calibrate_campaigns.min_rows\); ingest more of its judgements and retrain, "
        r"or score these rows without a campaign for the en-de calibration")):  # fmt: skip
        campaign_route(["en-de"], ["acme"], keyed)
    # the served artifact carries it (and a calibration without any writes no such field)
    back = type(keyed).from_dict(json.loads(json.dumps(keyed.to_dict())))
    assert back.too_few_rows == keyed.too_few_rows and "too_few_rows" not in unlimited.to_dict()
    with pytest.raises(DataError, match=r"campaign 'wmt99' has no calibration for lp 'en-de'; known: \['wmt21_mqm'\]"):
        campaign_route(["en-de"], ["wmt99"], back)


@pytest.mark.parametrize("value", [1, 2.5, True, "300"])
def test_the_minimum_is_checked_naming_the_key(tmp_path, value):
    import yaml

    from uamt.core.config import load_section
    from uamt.stages.calibrate_campaigns import CampaignSettings

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"calibrate_campaigns": {"min_rows": value}}))
    with pytest.raises(ConfigError, match=r"calibrate_campaigns.min_rows"):
        load_section(CampaignSettings, "calibrate_campaigns", path)


def test_an_lp_anchor_keeps_each_campaign_on_its_lps_mu_line_and_fits_its_level():
    """The study options of benchmarks/campaign_rows.py (--fit lp-slope, lp-shape): raters of
    campaign "steep" spread twice as far per MQM point of mu; refitted per key, each key gets its own
    slope; anchored on the LP, the LP's, above and below the point mass at the top alike, and with
    ``shape`` the LP's candidate parameters too."""
    from uamt.campaigns import LPAnchor
    from uamt.serving.model_calibration import attach_distribution, fit_calibration, refit_served

    rng = np.random.default_rng(1)
    n = 1500
    mu = rng.uniform(-12.0, -1.0, 2 * n)
    slope = np.r_[np.full(n, 1.0), np.full(n, 2.0)]
    human = np.clip(np.round(-6.0 + slope * (mu + 6.0) + rng.standard_normal(2 * n)), -25, 0)
    rows = pd.DataFrame({
        "dataset": "wmt21_mqm", "lp": "en-de", "seg_id": np.arange(2 * n), "system": "s",
        "doc": [f"d{i // 10}" for i in range(2 * n)], "human": human, "mu": mu, "sigma": 1.5,
        "campaign": ["flat"] * n + ["steep"] * n,
    })  # fmt: skip
    settings = EvaluationSettings(top_atom=True)  # as params.yaml serves it
    served, _ = fit_calibration(rows, "hts", settings=settings)
    served = attach_distribution(served, rows, "hts", settings, (-25.0, 0.0))
    assert served.below_top is not None  # the point mass at MQM 0 has its own part below it
    keyed = rows.assign(lp=campaign_keys(rows))
    own = refit_served(keyed, "hts", served, settings)
    kept = refit_served(keyed, "hts", served, settings, anchor=LPAnchor(served))
    shaped = refit_served(keyed, "hts", served, settings, anchor=LPAnchor(served, shape=True))

    def line(params):  # mu -> human slope of a standardiser's group
        return params["human_std"] / params["pred_std"]

    for part in (lambda c: c, lambda c: c.below_top):
        lp_line = line(part(served).standardizer.lp_params["en-de"])
        own_lines = {k: line(p) for k, p in part(own).standardizer.lp_params.items()}
        assert own_lines["en-de|steep"] > 1.5 * own_lines["en-de|flat"]
        for key, params in part(kept).standardizer.lp_params.items():
            assert line(params) == pytest.approx(lp_line, rel=1e-12)
            assert params["human_mean"] == part(own).standardizer.lp_params[key]["human_mean"]
            assert part(kept).served.lp_params[key] != part(served).served.lp_params["en-de"]
            assert part(shaped).served.lp_params[key] == part(served).served.lp_params["en-de"]
            assert part(shaped).served.variance.lp_params[key] == part(served).served.variance.lp_params["en-de"]
