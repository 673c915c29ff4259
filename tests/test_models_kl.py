"""KL's rules for rows without an annotator std (uamt.models.kl), with hand-computed values."""

from __future__ import annotations

import math
import typing

import numpy as np
import pandas as pd
import pytest
import torch

from tests.fakes import FEATURES
from tests.test_models import CFG, DEV, TRAIN
from uamt.core.config import ConfigError
from uamt.core.errors import DataError
from uamt.models import TrainConfig, load, train
from uamt.models.data import TargetScaler
from uamt.models.kl import (
    MISSING_STD_RULES,
    KLEstimator,
    fill_by_score,
    fit_fill_by_score,
    get_missing_std_rule,
    rater_score_pairs,
)
from uamt.models.losses import hts_loss, kl_hts_loss, kl_loss

# Six ratings, weight 1 each, sorted: scores -10, -5, -2, -1, 0, 0 with item stds 6, 4, 3, 1, 0, 2.
SCORES = np.array([0.0, 0.0, -1.0, -2.0, -5.0, -10.0])
STDS = np.array([0.0, 2.0, 1.0, 3.0, 4.0, 6.0])
ONES = np.ones(6)


@pytest.mark.parametrize(
    ("max_bins", "min_items", "cuts", "stds"),
    [
        # 3 bins: cut k is the first score whose cumulative share reaches k/3: -5 (2/6), -1 (4/6);
        # bins [<-5] {6}, [-5, -1) {4, 3}, [>= -1] {1, 0, 2}: root mean variance per bin
        (3, 1.0, [-5.0, -1.0], [6.0, math.sqrt((16 + 9) / 2), math.sqrt((1 + 0 + 4) / 3)]),
        # 6 items / 2.5 per bin -> 2 bins, cut at -2 (share 3/6): {6, 4} and {3, 1, 0, 2}
        (10, 2.5, [-2.0], [math.sqrt((36 + 16) / 2), math.sqrt((9 + 1 + 0 + 4) / 4)]),
        # fewer items than one bin needs: one bin, the root mean variance of all
        (10, 100.0, [], [math.sqrt((0 + 4 + 1 + 9 + 16 + 36) / 6)]),
    ],
)
def test_fit_fill_by_score_hand_computed(max_bins, min_items, cuts, stds):
    got_cuts, got_stds = fit_fill_by_score(SCORES, STDS, ONES, max_bins=max_bins, min_items_per_bin=min_items)
    assert got_cuts == pytest.approx(cuts)
    assert got_stds == pytest.approx(stds)


def test_fit_fill_by_score_ties_stay_in_one_bin_and_weights_count():
    # every rating 0: a cut at the minimum would leave an empty bin, so there is one bin
    cuts, stds = fit_fill_by_score(
        np.zeros(4), np.array([0.0, 1.0, 1.0, 2.0]), np.ones(4), max_bins=3, min_items_per_bin=1
    )
    assert cuts == [] and stds == pytest.approx([math.sqrt(6 / 4)])
    # weights: std 3 counts 3 times as much as std 1 -> sqrt((3*9 + 1*1) / 4)
    _, stds = fit_fill_by_score(np.zeros(2), np.array([3.0, 1.0]), np.array([3.0, 1.0]), min_items_per_bin=1)
    assert stds == pytest.approx([math.sqrt(28 / 4)])


def test_fill_by_score_looks_up_bins_left_closed():
    state = {"kl_fill_cuts": [-5.0, -1.0], "kl_fill_stds": [6.0, 3.5, 1.3]}
    got = fill_by_score(state, np.array([-20.0, -5.0, -3.0, -1.0, 0.0, 3.0]))
    assert got.tolist() == [6.0, 3.5, 3.5, 1.3, 1.3, 1.3]


def test_rater_score_pairs_one_pair_per_rating_weighted_per_item():
    df = pd.DataFrame(
        {
            "score": [-2.0, -1.0, -4.0, -3.0],
            "annotator_scores": [[-1.0, -3.0], [-1.0] * 8, [-4.0], None],
        }
    )
    std = np.array([1.4, 0.0, np.nan, 2.0])
    valid = np.array([True, True, False, True])
    x, y, w = rater_score_pairs(df, df["score"].to_numpy(), std, valid)
    # row 0: its 2 raters (1/2 each); row 1: 8 raters (1/8 each); row 2 has no std; row 3 lists no
    # raters: one pair with the item score
    assert x.tolist() == [-1.0, -3.0] + [-1.0] * 8 + [-3.0]
    assert y.tolist() == [1.4, 1.4] + [0.0] * 8 + [2.0]
    assert w.tolist() == pytest.approx([0.5, 0.5] + [0.125] * 8 + [1.0])
    # without the column every valid row gives its item score
    x, _, w = rater_score_pairs(df.drop(columns=["annotator_scores"]), df["score"].to_numpy(), std, valid)
    assert x.tolist() == [-2.0, -1.0, -3.0] and w.tolist() == [1.0, 1.0, 1.0]


def test_unknown_fill_rule_is_refused():
    with pytest.raises(
        ValueError,
        match=r"kl_missing_std='median' not supported; choose from \['by_score', "
        r"'drop', 'floor', 'hts', 'mean'\]",
    ):
        get_missing_std_rule("median")
    with pytest.raises(
        ConfigError, match=r"kl_missing_std: 'median' not supported; choose from \['by_score'"
    ):
        CFG.replace(kl_missing_std="median")
    # the params type and the registry name the same rules
    field = typing.get_type_hints(TrainConfig)["kl_missing_std"]
    assert sorted(typing.get_args(field)) == sorted(MISSING_STD_RULES)


def test_kl_hts_loss_hand_computed():
    mu, log_var = torch.zeros(2), torch.zeros(2)  # sigma_hat^2 = 1
    target, std = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 2.0])
    # KL row: ((1 - 0)^2 + 4) / 2 + (0 - log 4) / 2 - 1/2 = 2 - log 2; HTS row: (2 - 0)^2 / 2 + 0 = 2
    mixed = kl_hts_loss(mu, log_var, target, std, torch.tensor([1.0, 0.0]))
    assert mixed.item() == pytest.approx(((2 - math.log(2)) + 2.0) / 2)
    assert kl_hts_loss(mu, log_var, target, std, torch.ones(2)).item() == pytest.approx(
        kl_loss(mu, log_var, target, std).item()
    )
    assert kl_hts_loss(mu, log_var, target, std, torch.zeros(2)).item() == pytest.approx(
        hts_loss(mu, log_var, target).item()
    )


def _columns(rule: str, df: pd.DataFrame, state: dict | None = None):
    scaler = TargetScaler(0.0, 2.0)
    state = {} if state is None else state
    cols, keep = KLEstimator.target_columns(
        df, scaler, CFG.replace(kl_missing_std=rule), "training split", state
    )
    return cols, keep, state


SMALL = pd.DataFrame(
    {
        "score": [0.0, -2.0, -6.0, -1.0, 0.0],
        "score_std": [0.0, 2.0, 4.0, np.nan, np.nan],
        "n_annotators": [3, 3, 3, 1, 1],
        "annotator_scores": [[0.0, 0.0, 0.0], [0.0, -2.0, -4.0], [-2.0, -6.0, -10.0], [-1.0], [0.0]],
    }
)


def test_target_columns_per_rule():
    # hts: single-rater rows get the HTS loss (y_has_std 0); the std of the others is floored
    cols, keep, state = _columns("hts", SMALL)
    assert keep is None and state == {"kl_missing_std": "hts"}
    assert cols["y_has_std"].tolist() == [1, 1, 1, 0, 0]
    assert cols["y_std"][:3].tolist() == pytest.approx([0.01 / 2, 1.0, 2.0])  # score units / scaler std
    # mean: (0 + 2 + 4) / 3 = 2 MQM for the two single-rater rows
    cols, keep, state = _columns("mean", SMALL)
    assert state["kl_fill_std"] == pytest.approx(2.0)
    assert cols["y_has_std"].tolist() == [1] * 5 and cols["y_std"][3:].tolist() == pytest.approx([1.0, 1.0])
    # drop: only the multi-rater rows are kept
    _, keep, _ = _columns("drop", SMALL)
    assert keep.tolist() == [True, True, True, False, False]
    # by_score: 9 ratings of 3 items (1/3 each, 3 items < 50 per bin: one bin) -> sqrt((0 + 4 + 16) / 3)
    cols, _, state = _columns("by_score", SMALL)
    assert state["kl_fill_cuts"] == [] and state["kl_fill_stds"] == pytest.approx([math.sqrt(20 / 3)])
    assert cols["y_std"][3:].tolist() == pytest.approx([math.sqrt(20 / 3) / 2] * 2)
    # the dev split reuses the training split's fit, and refuses another rule's
    dev_cols, _, _ = _columns("by_score", SMALL.iloc[3:], state)
    assert dev_cols["y_std"].tolist() == pytest.approx([math.sqrt(20 / 3) / 2] * 2)
    with pytest.raises(ValueError, match="filled with kl_missing_std='by_score', not 'mean'"):
        _columns("mean", SMALL.iloc[3:], state)


def test_by_score_fill_follows_the_rater_score(monkeypatch):
    monkeypatch.setattr("uamt.models.kl.FILL_MIN_ITEMS_PER_BIN", 1.0)
    cols, _, state = _columns("by_score", SMALL)
    # 9 ratings of weight 1/3, sorted: -10 (std 4), -6 (4), -4 (2), -2 (2), -2 (4), 0 (0 x3), 0 (2);
    # 3 items -> 3 bins; cuts where the cumulative share reaches 1/3 (-4) and 2/3 (0)
    assert state["kl_fill_cuts"] == [-4.0, 0.0]
    assert state["kl_fill_stds"] == pytest.approx(
        [4.0, math.sqrt((4 + 4 + 16) / 3), math.sqrt((0 + 0 + 0 + 4) / 4)]
    )
    # single-rater rows: -1 -> bin [-4, 0), 0 -> bin [0, ...)
    assert (cols["y_std"][3:] * 2).tolist() == pytest.approx([math.sqrt(8), 1.0])


@pytest.mark.parametrize("rule", ["hts", "by_score"])
def test_kl_trains_with_each_new_rule(tmp_path, rule):
    model = load(train("kl", CFG.replace(kl_missing_std=rule, max_epochs=1), TRAIN, DEV, FEATURES, tmp_path))
    assert model.meta["n_train"] == len(TRAIN) and model.meta["state"]["kl_missing_std"] == rule


def test_hts_rule_needs_no_multi_rater_row(tmp_path):
    only_single = TRAIN.assign(score_std=np.nan, n_annotators=1)
    hts = CFG.replace(kl_missing_std="hts", max_epochs=1)
    model = load(train("kl", hts, only_single, DEV, FEATURES, tmp_path / "h"))
    assert model.meta["n_train"] == len(TRAIN)
    for rule in ("mean", "by_score"):
        with pytest.raises(DataError, match=rf"no row has >= 2 annotators, so kl_missing_std='{rule}'"):
            train("kl", CFG.replace(kl_missing_std=rule), only_single, DEV, FEATURES, tmp_path / rule)
