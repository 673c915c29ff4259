"""KL divergence minimisation (Eq. 3): the target is N(mu*, sigma*^2) from the annotators.

mu* = ``score`` (the annotators' mean on the training scale), sigma* = ``score_std`` (std of the
per-annotator scores).  Rows with fewer than 2 annotators have no sigma*; ``kl_missing_std`` names
the rule they follow (:data:`MISSING_STD_RULES`; unknown names are refused):

* ``"hts"`` (default): the row is trained with the heteroscedastic loss (Eq. 2) on its one score.
  That is Eq. 3 in the limit sigma* -> 0 (the KL to a point mass at the score, up to a constant that
  does not depend on the model).  A single rating already carries its rater's noise in
  (q* - mu_hat)^2, so the sigma_hat^2 it asks for, (q* - mu_hat)^2, estimates the spread of one
  rater's score, as (mu* - mu_hat)^2 + sigma*^2 does on a multi-rater row; a filled sigma*^2 on top
  would count the rater noise twice.
* ``"by_score"``: sigma* is read off the row's score: on the training rows with >= 2 annotators the
  item's std is averaged (as a variance) in quantile bins of each rater's own score, since a
  single-rater row's score is one rater's score, not a mean.  Binned by the item mean instead, the
  fit says "no spread" at a perfect score only because every rater of those items gave 0.  On the
  news MQM it ranks errors neither better nor worse than ``"hts"`` once calibrated (within
  +-0.02 UPS over four seeds), and leaves the raw sigma about 1.3x too wide.
* ``"mean"``: the mean ``score_std`` over training rows with >= 2 annotators;
* ``"floor"``: ``kl_std_floor``;
* ``"drop"``: the row is not used for training or early stopping.

Every sigma* is then floored at ``kl_std_floor`` (``score`` units) because annotators who agree
exactly would make log(sigma_hat^2 / sigma*^2) infinite.  What a rule learns is fitted on the
training split, applied unchanged to the dev split, and stored in the checkpoint (``state``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from uamt.core.errors import DataError
from uamt.models.data import targets_of
from uamt.models.hts import HTSEstimator, row_beta, with_row_beta
from uamt.models.losses import kl_hts_loss

#: ``by_score``: at most this many quantile bins of the rater scores ...
FILL_MAX_BINS = 10
#: ... and at least this many multi-rater items per bin (an item with n raters gives each of its n
#: pairs weight 1/n), so that a bin's mean variance rests on enough items to be stable.
FILL_MIN_ITEMS_PER_BIN = 50.0


def annotator_std(df: pd.DataFrame, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(score_std as float64 [n], mask of rows with a usable std: >= 2 annotators and finite)."""
    if "score_std" not in df.columns:
        raise DataError(f"{where}: column 'score_std' is missing; method 'kl' needs annotator disagreement")
    std = pd.to_numeric(df["score_std"], errors="coerce").to_numpy(dtype=np.float64)
    valid = np.isfinite(std) & (std >= 0)
    if "n_annotators" in df.columns:
        valid &= pd.to_numeric(df["n_annotators"], errors="coerce").fillna(0).to_numpy() >= 2
    return std, valid


def rater_score_pairs(
    df: pd.DataFrame, scores: np.ndarray, std: np.ndarray, valid: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rater score, item std, weight) for every rating of the rows in ``valid``.

    Each rater's score comes from ``annotator_scores`` where the row lists at least two; otherwise
    (a table without per-rater scores) the row gives one pair with its ``score``.  An item's pairs
    weigh 1/n together 1, so an 8-rater item counts as much as a 3-rater one.
    """
    listed = df["annotator_scores"].to_numpy() if "annotator_scores" in df.columns else None
    x: list[np.ndarray] = []
    y: list[np.ndarray] = []
    w: list[np.ndarray] = []
    for i in np.flatnonzero(valid):
        raters = np.asarray([] if listed is None or listed[i] is None else listed[i], dtype=np.float64)
        raters = raters[np.isfinite(raters)]
        if raters.size < 2:
            raters = np.asarray([scores[i]], dtype=np.float64)
        x.append(raters)
        y.append(np.full(raters.size, std[i]))
        w.append(np.full(raters.size, 1.0 / raters.size))
    return np.concatenate(x), np.concatenate(y), np.concatenate(w)


def fit_fill_by_score(
    rater_scores: np.ndarray,
    item_std: np.ndarray,
    weights: np.ndarray,
    max_bins: int = FILL_MAX_BINS,
    min_items_per_bin: float = FILL_MIN_ITEMS_PER_BIN,
) -> tuple[list[float], list[float]]:
    """Binned fit of the rater spread against one rater's score.

    Parameters
    ----------
    rater_scores, item_std, weights : ndarray [n]
        One entry per rating: the rater's score, the std of its item, the weight of the pair.
    max_bins, min_items_per_bin
        The number of bins is ``min(max_bins, floor(sum(weights) / min_items_per_bin))``, at least 1.

    Returns
    -------
    cuts : list of float
        Increasing cut points; bin ``k`` holds the scores ``s`` with ``cuts[k-1] <= s < cuts[k]``
        (``np.searchsorted(cuts, s, side="right")``).  Cut ``k`` is the smallest score whose weighted
        cumulative share reaches ``k / bins``, so ties (many MQM scores are exactly 0) stay in one bin.
    stds : list of float
        Per bin, sqrt of the weighted mean of ``item_std**2``: the KL loss depends on sigma* through
        sigma*^2, so the fill that matches a bin's expected loss is the root mean variance.
    """
    order = np.argsort(rater_scores, kind="stable")
    x, y2, w = rater_scores[order], item_std[order] ** 2, weights[order]
    total = float(w.sum())
    bins = max(1, min(max_bins, int(total // min_items_per_bin)))
    share = np.cumsum(w) / total
    cuts = sorted({float(x[np.searchsorted(share, k / bins - 1e-12)]) for k in range(1, bins)})
    cuts = [c for c in cuts if c > x[0]]  # a cut at the minimum would leave bin 0 empty
    index = np.searchsorted(np.asarray(cuts), x, side="right")
    stds = [float(np.sqrt(np.average(y2[index == k], weights=w[index == k]))) for k in range(len(cuts) + 1)]
    return cuts, stds


def fill_by_score(state: dict, scores: np.ndarray) -> np.ndarray:
    """sigma* of rows with these scores from a fit of :func:`fit_fill_by_score` stored in ``state``."""
    cuts = np.asarray(state["kl_fill_cuts"], dtype=np.float64)
    stds = np.asarray(state["kl_fill_stds"], dtype=np.float64)
    return stds[np.searchsorted(cuts, scores, side="right")]


@dataclass(frozen=True)
class MissingStdRule:
    """What a row without an annotator std is trained with.

    ``fit(df, scores, std, valid, cfg, where) -> state`` runs on the training split;
    ``fill(state, scores, cfg) -> sigma*`` gives those rows a target std (None: ``loss`` decides);
    ``drop``: the rows are left out; ``hts``: they are trained with the HTS loss.
    """

    fit: Callable[..., dict]
    fill: Callable[[dict, np.ndarray, object], np.ndarray] | None = None
    drop: bool = False
    hts: bool = False


def _need_multi(valid: np.ndarray, rule: str, where: str) -> None:
    if not valid.any():
        raise DataError(
            f"{where}: no row has >= 2 annotators, so kl_missing_std={rule!r} has nothing to fit; "
            "use kl_missing_std='hts' or 'floor', or a multi-annotator dataset"
        )


def _fit_mean(df, scores, std, valid, cfg, where) -> dict:
    _need_multi(valid, "mean", where)
    return {"kl_fill_std": float(std[valid].mean())}


def _fit_by_score(df, scores, std, valid, cfg, where) -> dict:
    _need_multi(valid, "by_score", where)
    cuts, stds = fit_fill_by_score(
        *rater_score_pairs(df, scores, std, valid),
        max_bins=FILL_MAX_BINS,
        min_items_per_bin=FILL_MIN_ITEMS_PER_BIN,
    )
    return {"kl_fill_cuts": cuts, "kl_fill_stds": stds}


def _fit_nothing(df, scores, std, valid, cfg, where) -> dict:
    return {}


def _drop_check(df, scores, std, valid, cfg, where) -> dict:
    if not valid.any():
        raise DataError(f"{where}: kl_missing_std='drop' leaves no rows (none has >= 2 annotators)")
    return {}


#: ``train_base.kl_missing_std``: how rows with fewer than 2 annotators are trained.
MISSING_STD_RULES: dict[str, MissingStdRule] = {
    "hts": MissingStdRule(_fit_nothing, hts=True),
    "by_score": MissingStdRule(_fit_by_score, fill=lambda state, scores, cfg: fill_by_score(state, scores)),
    "mean": MissingStdRule(
        _fit_mean, fill=lambda state, scores, cfg: np.full(len(scores), state["kl_fill_std"])
    ),
    "floor": MissingStdRule(
        _fit_nothing, fill=lambda state, scores, cfg: np.full(len(scores), cfg.kl_std_floor)
    ),
    "drop": MissingStdRule(_drop_check, drop=True),
}


def get_missing_std_rule(name: str) -> MissingStdRule:
    """The rule ``name`` of :data:`MISSING_STD_RULES`; unknown names raise ValueError listing the choices."""
    if name not in MISSING_STD_RULES:
        raise ValueError(f"kl_missing_std={name!r} not supported; choose from {sorted(MISSING_STD_RULES)}")
    return MISSING_STD_RULES[name]


class KLEstimator(HTSEstimator):
    """(mu, log sigma^2) head trained with KL(p* || p_hat) (and L_HTS on rows the rule says)."""

    @classmethod
    def target_columns(cls, df, scaler, cfg, where, state):
        rule = get_missing_std_rule(cfg.kl_missing_std)
        scores = targets_of(df, where)
        std, valid = annotator_std(df, where)
        if "kl_missing_std" not in state:  # the training split
            state.update(rule.fit(df, scores, std, valid, cfg, where), kl_missing_std=cfg.kl_missing_std)
        elif state["kl_missing_std"] != cfg.kl_missing_std:
            raise ValueError(
                f"{where}: the training split was filled with kl_missing_std={state['kl_missing_std']!r}, "
                f"not {cfg.kl_missing_std!r}"
            )
        filled = std.copy()
        missing = ~valid
        if rule.fill is not None:
            filled[missing] = rule.fill(state, scores[missing], cfg)
        else:
            filled[missing] = 1.0  # never read: dropped, or trained with L_HTS (a finite placeholder)
        filled = np.maximum(filled, cfg.kl_std_floor)
        has_std = valid if rule.hts else np.ones(len(df), dtype=bool)
        keep = valid if rule.drop else None
        columns = {
            "y": scaler.transform(scores),
            "y_std": filled / scaler.std,
            "y_has_std": has_std.astype(np.float32),
        }
        return with_row_beta(columns, df, cfg), keep

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        mu, log_var = self.split(output)
        return kl_hts_loss(mu, log_var, batch["y"], batch["y_std"], batch["y_has_std"], beta=row_beta(batch, self.cfg))
