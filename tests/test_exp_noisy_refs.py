"""uamt.experiments.noisy_refs: the r_good / r_bad rule (hand-made MQM), thresholds and the headline
rule, the Wilson interval, the pick itself on a model whose sigma is known, and the whole analysis
with tiny models on a synthetic MQM-like table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.test_exp_references import CFG, FEATURES, NAMES, make_frame, system_rows
from uamt.core.errors import DataError
from uamt.experiments import noisy_refs as N
from uamt.models import TrainConfig, load, train


def rated(scores: dict[int, dict[str, float]]) -> pd.DataFrame:
    """Rated-reference rows only: seg_id -> {name: MQM}."""
    rows = [
        {"lp": "en-de", "seg_id": sid, "system": f"ref-{name}", "score": value}
        for sid, by_name in scores.items()
        for name, value in by_name.items()
    ]
    return pd.DataFrame(rows)


def test_best_and_worst_reference_rule():
    mqm = N.reference_mqm(
        rated(
            {
                1: {"A": -1, "C": -12, "D": 0},  # good D, bad C, gap 12
                2: {"A": 0, "C": 0, "D": -3},  # tie at the top: first name (A)
                3: {"A": -2, "C": -2, "D": -2},  # no difference: gap 0
                4: {"A": -2, "C": -5},  # D unrated: the two rated ones
                5: {"C": -7},  # a single rated reference: no pair
            }
        ),
        NAMES,
    )
    assert list(mqm.columns) == list(NAMES) and np.isnan(mqm.loc[("en-de", 4), "D"])
    pairs = N.select_pairs(mqm)
    assert pairs.index.tolist() == [("en-de", 1), ("en-de", 2), ("en-de", 3), ("en-de", 4)]
    assert pairs["good"].tolist() == ["D", "A", "A", "A"]
    assert pairs["bad"].tolist() == ["C", "D", "A", "C"]
    assert pairs["gap"].tolist() == [12.0, 3.0, 0.0, 3.0]
    assert N.gap_counts(pairs, (10, 2, 0)) == {"10": 1, "2": 3, "0": 3}
    # strictest threshold keeping >= min_segments segments, else the loosest
    assert N.headline_threshold({"10": 1, "2": 3, "0": 3}, (10, 2, 0), 2) == 2.0
    assert N.headline_threshold({"10": 1, "2": 3, "0": 3}, (10, 2, 0), 1) == 10.0
    assert N.headline_threshold({"10": 1, "2": 3, "0": 3}, (10, 2, 0), 50) == 0.0


def test_bad_reference_input_is_refused():
    with pytest.raises(ValueError, match=r"reference='B' not supported; choose from \['A', 'C', 'D'\]"):
        N.reference_mqm(rated({1: {"A": 0, "C": -1, "D": -2}}), ("A", "B"))
    twice = pd.concat([rated({1: {"A": 0, "C": -1}}), rated({1: {"A": -3}})], ignore_index=True)
    with pytest.raises(DataError, match="reference A is rated twice for lp en-de, seg_id 1"):
        N.reference_mqm(twice, ("A", "C"))


def test_wilson_interval_and_pick_accuracy():
    from scipy.stats import binomtest

    for k, n in ((8, 10), (0, 7), (41, 50)):
        expected = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        np.testing.assert_allclose(
            N.wilson_interval(k, n), (expected.low, expected.high), rtol=1e-6, atol=1e-12
        )
    assert all(np.isnan(N.wilson_interval(0, 0)))
    good = np.array([0.1, 0.5, 0.3, 0.3])
    bad = np.array([0.2, 0.4, 0.3, 0.9])
    out = N.pick_accuracy(good, bad, np.array(["s1", "s1", "s2", "s2"]), n_boot=200)
    assert (out["n"], out["correct"], out["ties"]) == (4, 2, 1)  # a tie is not a correct pick
    assert out["fraction"] == 0.5
    assert N.segment_bootstrap(np.ones(6), np.array(list("aabbcc")), 100) == (1.0, 1.0)
    with pytest.raises(DataError, match="cannot pick a reference"):
        N.pick_accuracy(np.array([np.nan]), np.array([1.0]), np.array(["s"]))


class LengthSigma:
    """A stand-in model whose sigma is the reference's length: the shorter reference is 'certain'."""

    method = "hts"
    aligned_samples = False  # moments only, like HTS
    cfg = TrainConfig(method="hts")

    def predict(self, df, features, n_samples=None):
        return pd.DataFrame({"mu": np.zeros(len(df)), "sigma": df["ref"].str.len().to_numpy(dtype=float)})


class InverseLengthSigma(LengthSigma):
    """The opposite: the longer reference gets the lower sigma."""

    def predict(self, df, features, n_samples=None):
        out = super().predict(df, features, n_samples)
        return out.assign(sigma=1e4 - out["sigma"])


def test_pick_uses_the_good_and_bad_reference_of_each_segment():
    frame = make_frame(20, 21, n_systems=3)
    # Make the worst-rated reference of every segment the longest text, and the best the shortest.
    for _, part in frame[N.reference_rows(frame)].groupby("seg_id"):
        order = part.sort_values("score", kind="stable")
        frame.loc[order.index[0], "score"] -= 20  # unique worst, gap > 10
        frame.loc[order.index[-1], "score"] = 0.5  # unique best
    long = {}
    for _, row in frame[N.reference_rows(frame)].iterrows():
        name = row["system"][-1]
        long[(row["seg_id"], name)] = row["mt"] + " x" * int(-row["score"] + 1)
    for idx, row in frame.iterrows():  # rewrite texts consistently in ref rows and in refs lists
        if row["system"].startswith("ref-"):
            frame.at[idx, "mt"] = long[(row["seg_id"], row["system"][-1])]
            frame.at[idx, "refs"] = [long[(row["seg_id"], x)] for x in NAMES if x != row["system"][-1]]
        else:
            frame.at[idx, "refs"] = [long[(row["seg_id"], x)] for x in NAMES]
    result = N.run_noisy_refs({"hts": LengthSigma()}, frame, FEATURES, thresholds=(10, 0), n_boot=50)
    top = result["thresholds"][0]
    assert (top["threshold"], top["n_segments"], top["n_pairs"]) == (10.0, 20, 60)
    assert top["methods"]["hts"]["raw"]["fraction"] == 1.0
    assert result["headline_threshold"] == 0.0  # 20 segments < min_segments = 30 at every threshold
    result = N.run_noisy_refs({"hts": InverseLengthSigma()}, frame, FEATURES, thresholds=(10,), n_boot=50)
    assert result["thresholds"][0]["methods"]["hts"]["raw"]["fraction"] == 0.0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("noisy-models")
    train_df, dev_df = system_rows(make_frame(40, 1)), system_rows(make_frame(10, 2))
    paths = {m: train(m, CFG, train_df, dev_df, FEATURES, root / m) for m in ("point", "mcd_head", "hts")}
    return {m: load(p) for m, p in paths.items()}


def test_whole_analysis_with_tiny_models(models, tmp_path):
    from uamt.experiments.common import save_figure
    from uamt.serving.model_calibration import Calibration
    from uamt.uncertainty import evaluate_predictions

    frame = make_frame(16, 31, n_systems=3)
    dev = system_rows(make_frame(12, 32))
    calibrations = {}
    for method in ("mcd_head", "hts"):
        table = models[method].predictions_table(dev, FEATURES)
        calibrations[method] = Calibration.from_result(evaluate_predictions(table, table)["calibration"])
    result = N.run_noisy_refs(
        models, frame, FEATURES, calibrations=calibrations, thresholds=(10, 5, 0), min_segments=5, n_boot=100
    )
    assert result["skipped"] == {"point": N.NO_SIGMA["point"]}
    blocks = result["thresholds"]
    assert [b["threshold"] for b in blocks] == [10.0, 5.0, 0.0]
    counts = result["data"]["segments_above"]
    for b in blocks:
        assert b["n_segments"] == counts[N.threshold_label(b["threshold"])]
        assert b["n_pairs"] == 3 * b["n_segments"]
        assert sum(b["good"].values()) == b["n_pairs"] == sum(b["bad"].values())
        for kinds in b["methods"].values():
            assert set(kinds) == {"raw", "calibrated"}
            for out in kinds.values():
                if out["n"]:
                    low, high = out["wilson95"]
                    assert 0 <= low <= out["fraction"] <= high <= 1
    head = N.headline_block(result)
    assert head["n_segments"] >= 5 or head["threshold"] == 0.0
    text = N.render(result)
    assert text.startswith("## 2. Noisy-reference detection") and "figures/noisy_refs.png" in text
    assert f"{100 * head['methods']['hts']['raw']['fraction']:.1f} %" in text
    assert save_figure(N.figure(result), tmp_path / "noisy.png").stat().st_size > 1000


def _pick(fraction: float, n: int, bootstrap: tuple[float, float]) -> dict:
    return {
        "n": n,
        "correct": round(fraction * n),
        "ties": 0,
        "fraction": fraction,
        "wilson95": list(N.wilson_interval(round(fraction * n), n)),
        "segment_bootstrap95": list(bootstrap),
    }


def _noisy_result(hts: tuple[float, float] | None, mcd: tuple[float, float]) -> dict:
    """Headline threshold 1 (40 pairs) and the paper's threshold 10 (8 pairs of one segment)."""
    methods = {"mcd_head": {"raw": _pick(0.4, 40, mcd)}}
    if hts is not None:
        methods["hts"] = {"raw": _pick(0.7, 40, hts)}
    return {
        "headline_threshold": 1.0,
        "paper": {"threshold": 10.0, **N.PAPER},
        "thresholds": [
            {
                "threshold": 10.0,
                "n_segments": 1,
                "n_pairs": 8,
                "methods": {"hts": {"raw": _pick(1.0, 8, (1, 1))}},
            },
            {"threshold": 1.0, "n_segments": 12, "n_pairs": 40, "methods": methods},
        ],
    }


@pytest.mark.parametrize(
    ("hts", "mcd", "verdicts"),
    [
        # HTS above chance and reaching 82 %; MCD containing 38 %, below chance
        ((0.6, 0.9), (0.2, 0.45), ("held", "held")),
        # HTS above chance but below 82 %; MCD containing 38 % and 50 %
        ((0.55, 0.7), (0.3, 0.6), ("partly", "partly")),
        # HTS: chance inside; MCD: 38 % outside
        ((0.4, 0.9), (0.45, 0.7), ("not held", "not held")),
        (None, (0.39, 0.6), ("n/a", "not held")),
    ],
)
def test_report_findings_verdicts_follow_the_stated_rules(hts, mcd, verdicts):
    from uamt.experiments.report import verdict_of

    rows = N.report_findings(_noisy_result(hts, mcd))
    assert [r[0].split()[0] for r in rows] == ["HTS", "MC"]
    assert "> 82 %" in rows[0][1] and "38 %" in rows[1][1] and "gap > 10" in rows[0][1]
    assert tuple(verdict_of(r[2]) for r in rows) == verdicts
    mcd_text = rows[1][2]
    assert "40.0 % of 40 pairs (12 segments) at MQM gap > 1" in mcd_text
    assert f"segment-bootstrap 95 % [{100 * mcd[0]:.0f}, {100 * mcd[1]:.0f}] %" in mcd_text
    if hts is None:
        assert rows[0][2] == "n/a: not run at MQM gap > 1"
    else:
        # the paper's strict threshold is quoted beside the headline
        assert "at the paper's gap > 10 only 8 pairs (1 segment(s)): 100.0 %" in rows[0][2]
