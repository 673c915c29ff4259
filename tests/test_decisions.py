"""Decisions from the served distribution: rerank rules, flag thresholds (conformal risk control),
annotation selection, and the three analyses on synthetic fixtures."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from uamt.core.errors import DataError
from uamt.decisions.annotation import ANNOTATION_COLUMNS, annotation_frame, select_rows
from uamt.decisions.flagging import crc_bound, crc_threshold, flag_quality, flags
from uamt.decisions.rerank import RULES, RerankSettings, pseudo_reference_lists, rerank
from uamt.uncertainty.served import served_columns

# One group of four candidates where every rule picks another one:
#   a: highest mu, wide (low lower bound, high risk)   b: highest lower bound
#   c: lowest risk (ties b on nothing)                  d: best by MBR (pseudo-references)
CANDIDATES = pd.DataFrame(
    {
        "group": ["g"] * 4 + ["h"] * 2,
        "mt": ["a", "b", "c", "d", "e", "f"],
        "mu": [-1.0, -2.0, -3.0, -4.0, -9.0, -8.0],
        "lower": [-12.0, -5.0, -6.0, -20.0, -20.0, -19.0],
        "upper": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        "risk": [0.40, 0.20, 0.10, 0.60, 0.80, 0.70],
        "mbr_mu": [-3.0, -2.5, -2.0, -1.0, -5.0, -6.0],
        "mbr_lower": [-9.0, -4.0, -3.0, -8.0, -10.0, -11.0],
    }
)


@pytest.mark.parametrize(
    ("rule", "pick_g", "pick_h"),
    [("mu", "a", "f"), ("lcb", "b", "f"), ("risk", "c", "f"), ("mbr", "d", "e"), ("mbr_lcb", "c", "e")],
)
def test_each_rule_picks_its_candidate(rule, pick_g, pick_h):
    picks = rerank(CANDIDATES, RerankSettings(rule=rule, max_risk=0.5))
    assert picks["group"].tolist() == ["g", "h"]
    assert picks["mt"].tolist() == [pick_g, pick_h]
    assert picks["rule"].eq(rule).all()
    assert picks["n_candidates"].tolist() == [4, 2]
    # The pick's served numbers travel with it; abstain = its risk > max_risk ("h": every risk > 0.5).
    row = CANDIDATES.set_index("mt").loc[pick_g]
    assert picks.loc[0, ["mu", "lower", "risk"]].tolist() == [row["mu"], row["lower"], row["risk"]]
    assert picks["abstain"].tolist() == [bool(row["risk"] > 0.5), True]


def test_unknown_rule_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"rule='best' not supported; choose from \['lcb', 'mbr', 'mbr_lcb', 'mu', 'risk'\]"):
        RerankSettings(rule="best")
    assert sorted(RULES) == ["lcb", "mbr", "mbr_lcb", "mu", "risk"]


def test_ties_go_to_the_higher_mu_then_the_first_row():
    table = pd.DataFrame(
        {"group": ["g"] * 3, "mu": [-3.0, -1.0, -1.0], "lower": [-25.0] * 3, "upper": [0.0] * 3, "risk": [0.3] * 3}
    )
    for rule in ("lcb", "risk"):
        assert rerank(table, RerankSettings(rule=rule))["row"].tolist() == [1]


def test_mbr_without_pseudo_reference_columns_is_an_error():
    with pytest.raises(DataError, match="rule 'mbr' needs the column 'mbr_mu'"):
        rerank(CANDIDATES.drop(columns=["mbr_mu"]), RerankSettings(rule="mbr"))


def test_missing_group_column_and_empty_group_are_errors():
    with pytest.raises(DataError, match="no group column 'source'"):
        rerank(CANDIDATES, RerankSettings(), group_column="source")
    with pytest.raises(DataError, match="row 2: empty 'group'"):
        rerank(CANDIDATES.assign(group=["g", "g", None, "g", "h", "h"]), RerankSettings())


def test_max_risk_none_never_abstains():
    assert not rerank(CANDIDATES, RerankSettings(rule="mu", max_risk=None))["abstain"].any()


def test_pseudo_references_are_the_other_candidates_capped():
    refs = pseudo_reference_lists(["g", "g", "g", "h", "h"], ["a", "b", "c", "d", "e"])
    assert refs == [["b", "c"], ["a", "c"], ["a", "b"], ["e"], ["d"]]
    capped = pseudo_reference_lists(["g"] * 5, list("abcde"), max_refs=2, seed=3)
    assert all(len(r) == 2 and text not in r for r, text in zip(capped, "abcde", strict=True))
    with pytest.raises(DataError, match="group 'h' has one candidate"):
        pseudo_reference_lists(["g", "g", "h"], ["a", "b", "c"])


def test_served_columns_are_the_calibrations_answers_clipped():
    from uamt.serving.model_calibration import Calibration

    rng = np.random.default_rng(0)
    n = 400
    human = np.clip(rng.normal(-4, 4, n), -25, 0)
    dev = pd.DataFrame({"lp": ["en-de"] * n, "human": human, "mu": human + rng.normal(0, 2, n), "sigma": rng.uniform(1, 3, n)})
    calibration = Calibration.fit(dev)
    mu, sigma, lp = dev["mu"].to_numpy()[:20], dev["sigma"].to_numpy()[:20], np.array(["en-de"] * 20, dtype=object)
    served = served_columns(calibration, mu, sigma, lp, confidence=0.8, chi=-5.0, bounds=(-25.0, 0.0))
    np.testing.assert_allclose(served["risk"], calibration.risk(mu, sigma, -5.0, lp))
    lower, upper = calibration.interval(mu, sigma, 0.8, lp, "gaussian" if calibration.is_gaussian else "conformal")
    np.testing.assert_allclose(served["lower"], np.clip(lower, -25, 0))
    np.testing.assert_allclose(served["upper"], np.clip(upper, -25, 0))
    assert (served["mu"] <= 0).all()
    # chi at or above the top of the scale: every translation is "bad" for sure.
    top = served_columns(calibration, mu, sigma, lp, confidence=0.8, chi=0.0, bounds=(-25.0, 0.0))
    assert (top["risk"] == 1.0).all()


# ----------------------------------------------------------------------------------------------
# Flagging


def test_flags_and_their_quality():
    risk = np.array([0.05, 0.3, 0.6, 0.9])
    human = np.array([0.0, -6.0, -1.0, -10.0])
    assert flags(risk, 0.5).tolist() == [False, False, True, True]
    quality = flag_quality(risk, human, 0.5, -5.0)
    assert quality == {"n": 4, "n_bad": 2, "flagged_share": 0.5, "precision": 0.5, "recall": 0.5, "miss_rate": 0.5}
    with pytest.raises(DataError, match="max_risk=1.5 must be a probability"):
        flags(risk, 1.5)


@pytest.mark.parametrize(
    ("n", "alpha", "allowed"),
    [(9, 0.1, 0), (19, 0.1, 1), (99, 0.1, 9), (100, 0.1, 9), (8, 0.1, None)],
)
def test_crc_threshold_leaves_the_largest_number_of_misses_the_bound_allows(n, alpha, allowed):
    scores = np.linspace(0.01, 0.99, n)
    threshold = crc_threshold(scores, alpha)
    if allowed is None:  # B / (n + 1) > alpha: no threshold can be certified, flag everything
        assert threshold == -math.inf
        return
    assert int(np.sum(scores <= threshold)) == allowed
    assert crc_bound(scores, threshold) <= alpha + 1e-12
    # One more miss would break the bound.
    assert (allowed + 2) / (n + 1) > alpha


def test_crc_guarantee_holds_on_exchangeable_draws():
    """The expected miss rate of a new bad row is <= alpha (Monte Carlo over dev/test draws)."""
    rng = np.random.default_rng(0)
    misses = []
    for _ in range(2000):
        scores = rng.beta(2, 5, size=41)  # 40 bad dev rows + 1 new bad row, exchangeable
        misses.append(scores[-1] <= crc_threshold(scores[:-1], 0.1))
    assert np.mean(misses) <= 0.1 + 3 * math.sqrt(0.1 * 0.9 / 2000)


def test_crc_refuses_bad_input():
    with pytest.raises(DataError, match="alpha=0 must be in"):
        crc_threshold([0.1], 0)
    with pytest.raises(DataError, match="no bad dev rows"):
        crc_threshold([], 0.1)


# ----------------------------------------------------------------------------------------------
# Annotation selection


def test_uncertainty_takes_the_highest_sigma_diversity_spreads_over_documents_and_lps():
    sigma = np.array([9, 8, 7, 6, 5, 4, 3, 2], dtype=float)
    docs = ["d1", "d1", "d1", "d1", "d2", "d3", "d4", "d4"]
    lps = ["en-de"] * 6 + ["zh-en"] * 2
    assert select_rows(sigma, 3, strategy="uncertainty").tolist() == [0, 1, 2]
    chosen = select_rows(sigma, 4, strategy="diversity", docs=docs, lps=lps)
    assert sorted(chosen.tolist()) == [0, 4, 5, 6]  # one per document (cap ceil(4/4) = 1), both LPs
    # The budget is always spent: caps double until it is.
    assert len(select_rows(sigma, 7, strategy="diversity", docs=docs, lps=lps)) == 7
    assert select_rows(sigma, 2, strategy="uncertainty", exclude=[True, True] + [False] * 6).tolist() == [2, 3]
    random = select_rows(sigma, 4, strategy="random", seed=1)
    assert random.tolist() == select_rows(sigma, 4, strategy="random", seed=1).tolist() and len(set(random)) == 4
    with pytest.raises(ValueError, match=r"strategy='greedy' not supported; choose from \['diversity', 'random', 'uncertainty'\]"):
        select_rows(sigma, 2, strategy="greedy")


def test_annotation_frame_is_accepted_by_incoming_once_scored(tmp_path):
    from uamt.ingest import IncomingConfig, validate_file

    pool = pd.DataFrame(
        {
            "lp": ["en-de", "en-de"],
            "src": ["Der Hund schläft.", "Die Katze sitzt."],
            "mt": ["The dog sleeps.", "The cat sits."],
            "ref": ["The dog is sleeping.", "The cat is sitting."],
            "doc": ["doc-1", "doc-2"],
        }
    )
    frame = annotation_frame(pool, np.array([1, 0]), dataset="wmt23_mqm", source="pool.csv")
    assert list(frame.columns) == list(ANNOTATION_COLUMNS)
    assert frame["mt"].tolist() == ["The cat sits.", "The dog sleeps."] and (frame["score"] == "").all()
    unscored = tmp_path / "to_annotate.csv"
    frame.to_csv(unscored, index=False)
    cfg = IncomingConfig(published_dir=None)
    assert validate_file(unscored, cfg).row_problems  # an empty score is refused until annotated
    scored = tmp_path / "annotated.csv"
    frame.assign(score=[-1.0, 0.0]).to_csv(scored, index=False)
    result = validate_file(scored, cfg)
    assert not result.file_problems and not result.row_problems, result.report()
    assert len(result.good) == 2


def test_score_flags_read_the_served_risk_never_a_gaussian_stand_in():
    from uamt.core.errors import UamtError
    from uamt.serving.scores import segment_records

    out = pd.DataFrame({"mu": [-2.0, -8.0], "sigma": [1.0, 1.0], "lower": [-4.0, -10.0], "upper": [0.0, -6.0], "risk": [0.1, 0.9]})
    # Same threshold: the served risk column itself.
    records = segment_records(out, flag_below=-5.0, max_risk=0.5, risk_threshold=-5.0)
    assert [r["flagged"] for r in records] == [False, True]
    # Another threshold: the caller must pass the served P(Q <= flag_below); a Gaussian from mu and
    # sigma (what was computed before) would say 0.999 for the first row, the served risk 0.2.
    with pytest.raises(UamtError, match="the served P\\(Q <= flag_below\\) is needed"):
        segment_records(out, flag_below=-1.0, max_risk=0.5, risk_threshold=-5.0)
    records = segment_records(out, flag_below=-1.0, max_risk=0.5, risk_threshold=-5.0, flag_risk=np.array([0.2, 0.95]))
    assert [r["flag_risk"] for r in records] == [0.2, 0.95]
    assert [r["flagged"] for r in records] == [False, True]


# ----------------------------------------------------------------------------------------------
# The analyses on synthetic fixtures


def _groups(n_groups=6, size=4, seed=0):
    rng = np.random.default_rng(seed)
    human = np.clip(rng.normal(-4, 4, n_groups * size), -25, 0)
    return pd.DataFrame(
        {
            "group": np.repeat([f"g{k}" for k in range(n_groups)], size),
            "subset": np.repeat(["wmt21 en-de", "wmt23 zh-en"], n_groups * size // 2),
            "score": human,
        }
    )


def test_rerank_analysis_a_perfect_mu_has_no_regret_and_random_is_the_group_mean():
    from uamt.experiments.rerank import analyse, selective_curve

    rows = _groups()
    human = rows["score"].to_numpy()
    served = {"m": pd.DataFrame({"mu": human, "lower": human - 1, "upper": human + 1, "risk": (human <= -5).astype(float)})}
    result = analyse(rows, served, chrf=None, n_bootstrap=50)
    pooled = result["results"]["all"]
    assert pooled["mu:m"]["regret"] == pytest.approx(0.0) and pooled["mu:m"]["oracle_share"] == 1.0
    assert pooled["random"]["mean_mqm"] == pytest.approx(rows.groupby("group")["score"].mean().mean())
    assert pooled["oracle"]["mean_mqm"] == pytest.approx(rows.groupby("group")["score"].max().mean())
    assert result["lcb_vs_mu"]["m"]["all"]["same_pick"] == 1.0  # lower = mu - 1: the same order
    kept, rate, area = selective_curve(np.array([3.0, 2.0, 1.0]), np.array([False, True, True]))
    assert kept.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0]) and rate.tolist() == pytest.approx([0.0, 0.5, 2 / 3])
    assert area == pytest.approx((0 + 0.5 + 2 / 3) / 3)


def test_flagging_analysis_reports_the_promise_and_the_realised_miss_rate():
    from uamt.experiments.flagging import analyse

    rng = np.random.default_rng(1)

    def table(n):
        human = np.clip(rng.normal(-4, 4, n), -25, 0)
        risk = np.clip((-human - 2) / 10 + rng.normal(0, 0.05, n), 0, 1)
        return pd.DataFrame({"subset": rng.choice(["a", "b"], n), "human": human, "mu": human, "risk": risk})

    result = analyse({"m": table(2000)}, {"m": table(2000)}, chi=-5.0, thresholds=(0.1, 0.5), alpha=0.1)
    crc = result["models"]["m"]["crc"]["risk"]
    assert crc["pooled_dev_bound"] <= 0.1
    # Exchangeable dev and test: the realised miss rate is close to (at most about) alpha.
    assert crc["subsets"]["all"]["pooled"]["miss_rate"] <= 0.1 + 0.03
    assert set(result["models"]["m"]["fixed"]["a"]) == {"0.1", "0.5"}


def test_annotation_simulation_curves_and_efficiency():
    from uamt.experiments.annotation import AnnotationSettings, efficiency, rows_to_reach, simulate

    rng = np.random.default_rng(2)
    x = rng.normal(size=(900, 6)).astype(np.float32)
    y = x @ np.array([1.0, -0.5, 0.3, 0.0, 0.0, 0.2]) + rng.normal(0, 0.5, 900)
    settings = AnnotationSettings(seed_rows=40, batch_rows=30, steps=2, seeds=2, ridge=1.0)
    curves = simulate(
        x[:600], y[:600], np.arange(600).astype(str), np.array(["en-de"] * 600), x[600:], y[600:] - 2, settings
    )
    assert set(curves) == {"random", "uncertainty", "diversity"}
    assert curves["random"]["rows"] == [40, 70, 100]
    assert np.array(curves["uncertainty"]["pps"]).shape == (2, 3)
    assert all(p > 0.5 for p in np.array(curves["diversity"]["pps"])[:, -1])
    ratios = efficiency(curves)
    # Random reaches its own final PPS by its last step at the latest.
    assert all(r is not None and r <= 1.0 for r in ratios["random"]["ratios"])
    assert rows_to_reach([10, 20, 30], [0.1, 0.3, 0.5], 0.4) == pytest.approx(25.0)
    assert rows_to_reach([10, 20], [0.1, 0.2], 0.9) is None


@pytest.mark.parametrize(
    ("docs", "lps", "share", "held_docs"),
    [
        # Per LP whole documents until the share is reached, one always left in the pool.
        (["a"] * 4 + ["b"] * 4 + ["c"] * 4, ["x"] * 12, 0.3, 1),
        (["a"] * 4 + ["b"] * 4 + ["c"] * 4, ["x"] * 12, 0.9, 2),
        # A big document that would overshoot the share is skipped for a smaller one ...
        (["a"] * 2 + ["b"] * 2 + ["c"] * 2 + ["d"] * 20, ["x"] * 26, 0.1, 1),
        # ... and when every document overshoots, the smallest is held out.
        (["a"] * 9 + ["b"] * 7 + ["c"] * 8, ["x"] * 24, 0.1, 1),
        # An LP with one document cannot be split: it stays wholly in the pool.
        (["a"] * 5 + ["b"] * 3 + ["c"] * 3, ["x"] * 5 + ["y"] * 6, 0.3, 1),
        (["a"] * 5, ["x"] * 5, 0.5, 0),
    ],
)
def test_document_split_never_puts_a_document_on_both_sides(docs, lps, share, held_docs):
    from uamt.experiments.annotation import document_split

    docs, lps = np.array(docs), np.array(lps)
    for seed in range(4):
        held = document_split(docs, lps, share, seed=seed)
        assert not set(docs[held]) & set(docs[~held])
        assert len(set(docs[held])) == held_docs
        if share == 0.1:  # the held-out document is the small one
            assert set(docs[held]) <= {"a", "b", "c"} and held.sum() <= 7
        # Every LP keeps at least one document in the pool.
        assert all((~held[lps == lp]).any() for lp in set(lps))


def test_document_split_depends_on_the_seed_and_reaches_the_share():
    from uamt.experiments.annotation import document_split

    docs = np.repeat(np.arange(40), 10).astype(str)
    lps = np.where(np.arange(400) < 200, "en-de", "zh-en")
    splits = [document_split(docs, lps, 0.33, seed=seed) for seed in range(3)]
    # Within half a document (10 of 200 rows) of the share.
    assert all(abs(s[lps == lp].mean() - 0.33) <= 0.025 + 1e-9 for s in splits for lp in ("en-de", "zh-en"))
    assert len({tuple(np.flatnonzero(s)) for s in splits}) == 3


@pytest.mark.parametrize(
    ("values", "first"),
    [
        ([0.5, 0.7, 0.88, 0.91, 0.9], 200),     # enters the band at 200 and stays
        ([0.88, 0.8, 0.88, 0.91, 0.9], 200),    # in the band at 0, leaves it, comes back
        ([0.9, 0.9, 0.9, 0.9, 0.9], 0),         # the news model alone is already there
        ([0.5, 0.9, 0.9, 0.9, 0.95], None),     # overshoots at the whole pool: never stays
        ([0.5, 0.9, None, 0.9, 0.9], 300),      # an unmeasured point breaks the run
    ],
)
def test_reach_and_stay_is_the_first_point_of_the_last_run_in_the_band(values, first):
    from uamt.experiments.annotation import reach_and_stay

    assert reach_and_stay([0, 100, 200, 300, 1000], values, 0.87, 0.93) == first


def _shifted_domain(seed=0):
    """News rows and a new domain whose features are shifted and whose labels follow other weights."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=8)
    news_x = rng.normal(size=(1500, 8)).astype(np.float32)
    news_y = news_x @ weights + rng.normal(0, 1, 1500)
    domain_x = (rng.normal(size=(1200, 8)) + 1.0).astype(np.float32)
    other = weights.copy()
    other[:4] *= -1
    domain_y = domain_x @ other + rng.normal(0, 1, 1200)
    docs = np.repeat(np.arange(60), 20).astype(str)
    lps = np.where(np.arange(1200) < 600, "en-de", "zh-en")
    return news_x, news_y, domain_x, domain_y, docs, lps


def test_new_domain_simulation_measures_each_budget_and_the_plateau():
    from uamt.experiments.annotation import (
        AnnotationSettings,
        NewDomainSettings,
        document_split,
        simulate_domain,
        summarise_domain,
    )

    news_x, news_y, x, y, docs, lps = _shifted_domain()
    domain = NewDomainSettings(budgets=(20, 50, 100, 400, 5000), min_lp_eval_rows=300, coverage_tolerance=0.05)
    settings = AnnotationSettings(seeds=2, ridge=1.0, domain=domain)
    runs = []
    for seed in range(2):
        held = document_split(docs, lps, domain.eval_share, seed=seed)
        runs.append(simulate_domain(news_x, news_y, x[~held], y[~held], docs[~held], lps[~held], x[held], y[held], lps[held], settings, seed))
    pool = int((~document_split(docs, lps, domain.eval_share, seed=0)).sum())
    # Budgets beyond the pool are dropped; the whole pool closes every curve.
    assert runs[0]["rows"] == [0, 20, 50, 100, 400, pool]
    points = runs[0]["strategies"]
    assert set(points) == {"random", "uncertainty", "diversity"}
    # The news-only start and the whole-pool plateau are the same fit for every strategy.
    assert points["random"][0] == points["uncertainty"][0] and points["random"][-1] == points["diversity"][-1]
    start, plateau = points["random"][0], points["random"][-1]
    # Shifted domain: the news model is wrong there, annotation fixes it.
    assert start["coverage"] < 0.8 and plateau["pps"] > start["pps"] + 0.1
    assert abs(plateau["coverage"] - 0.9) < 0.05
    assert set(start["lps"]) == {"en-de", "zh-en"} and start["lps"]["en-de"]["rows"] + start["lps"]["zh-en"]["rows"] == start["rows"]
    summary = summarise_domain(runs, domain)
    assert summary["rows"] == [0, 20, 50, 100, 400]
    assert set(summary["lps"]) == set()  # fewer than 300 evaluation rows per LP
    for strategy, t in summary["thresholds"].items():
        assert t["pps"]["reached"] == 2, strategy
        assert 0 < t["pps"]["mean"] <= pool
        assert t["coverage"]["seeds"] == 2
    assert summarise_domain(runs, NewDomainSettings(min_lp_eval_rows=100))["lps"].keys() == {"en-de", "zh-en"}


def test_new_domain_settings_refuse_bad_values_and_unknown_keys(tmp_path):
    import yaml

    from uamt.core.config import ConfigError, load_section
    from uamt.experiments.annotation import AnnotationSettings, NewDomainSettings

    with pytest.raises(ValueError, match=r"domain\.budgets=\[50, 50\] must be positive and strictly increasing"):
        NewDomainSettings(budgets=(50, 50))
    with pytest.raises(ValueError, match=r"domain\.eval_share=1\.0 must lie in \(0, 1\)"):
        NewDomainSettings(eval_share=1.0)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"exp_annotation": {"domain": {"datasets": ["ted_mqm"], "budget": [10]}}}))
    with pytest.raises(ConfigError, match=r"params\.yaml:exp_annotation\.domain: unknown key\(s\) \['budget'\]"):
        load_section(AnnotationSettings, "exp_annotation", params)
    params.write_text(yaml.safe_dump({"exp_annotation": {"domain": {"budgets": [10, "x"]}}}))
    with pytest.raises(ConfigError, match=r"params\.yaml:exp_annotation\.domain\.budgets\[1\]: expected int"):
        load_section(AnnotationSettings, "exp_annotation", params)
    params.write_text(yaml.safe_dump({"exp_annotation": {"domain": {"datasets": [], "budgets": [10, 30]}}}))
    loaded = load_section(AnnotationSettings, "exp_annotation", params)
    assert loaded.domain == NewDomainSettings(datasets=(), budgets=(10, 30))


def _text_features(texts):
    """Deterministic fake cached embeddings [n, 2 layers, 6 dims] (one vector per distinct text)."""
    import zlib

    return np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=(2, 6)) for t in texts]).astype(np.float32)


def _mqm_rows(dataset, n, docs_per_lp, seed):
    rng = np.random.default_rng(seed)
    lps = np.where(np.arange(n) < n // 2, "en-de", "zh-en")
    doc = [f"{dataset}/{lp}/d{i * docs_per_lp // (n // 2)}" for lp, i in zip(lps, np.arange(n) % (n // 2), strict=True)]
    return pd.DataFrame({
        "dataset": dataset, "lp": lps, "doc": doc,
        "src": [f"s{seed}-{i}" for i in range(n)], "mt": [f"m{seed}-{i}" for i in range(n)], "ref": [f"r{seed}-{i}" for i in range(n)],
        "score": -np.abs(rng.normal(0, 4, n)),
    })


def test_domain_findings_wire_news_rows_and_each_domain_dataset():
    from uamt.experiments.annotation import AnnotationSettings, NewDomainSettings, domain_findings

    news, news_test = _mqm_rows("wmt21_mqm", 300, 6, 0), _mqm_rows("wmt21_mqm", 100, 4, 1)
    ood = pd.concat([_mqm_rows("ted_mqm", 240, 4, 2), _mqm_rows("bio_mqm", 200, 8, 3)], ignore_index=True)
    domain = NewDomainSettings(datasets=("ted_mqm", "bio_mqm"), budgets=(10, 40, 500), min_lp_eval_rows=30)
    settings = AnnotationSettings(seeds=2, components=4, ridge=10.0, domain=domain)
    found = domain_findings(news, news_test, ood, _text_features, settings)
    assert found["start"] == {"datasets": ["wmt21_mqm", "wmt23_mqm"], "split": "d_q", "rows": 300}
    assert list(found["datasets"]) == ["ted_mqm", "bio_mqm"]
    for name, block in found["datasets"].items():
        assert len(block["runs"]) == 2 and block["lps"] == ["en-de", "zh-en"]
        for size, run in zip(block["sizes"], block["runs"], strict=True):
            assert size["pool"] + size["eval"] == len(ood[ood["dataset"] == name])
            assert run["rows"] == [0, 10, 40, size["pool"]]  # 500 is beyond the pool
        assert set(block["summary"]["thresholds"]) == {"random", "uncertainty", "diversity"}
        assert 0 <= block["news_test"]["coverage"] <= 1
    with pytest.raises(DataError, match=r"exp_annotation\.domain\.datasets: 'bio_mqm' has no rows in the ood split \(have \['ted_mqm'\]\)"):
        domain_findings(news, news_test, ood[ood["dataset"] == "ted_mqm"], _text_features, settings)
    one_doc = _mqm_rows("bio_mqm", 40, 1, 4)
    with pytest.raises(DataError, match="bio_mqm: no LP has two documents"):
        domain_findings(news, news_test, one_doc, _text_features, AnnotationSettings(seeds=1, components=4, domain=NewDomainSettings(datasets=("bio_mqm",))))


def test_domain_figure_is_written_when_the_new_domain_case_is_off(tmp_path):
    """dvc.yaml declares reports/figures/annotation_domain.png, so the stage writes it even without
    new-domain datasets (the smoke profile): a figure that says the case was not run."""
    from uamt.core.fileio import atomic_save_figure
    from uamt.experiments.annotation import domain_figure

    path = tmp_path / "annotation_domain.png"
    fig = domain_figure(None)
    assert "not run" in fig.axes[0].texts[0].get_text()
    atomic_save_figure(fig, path)
    assert path.stat().st_size > 0
