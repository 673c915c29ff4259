"""KL divergence minimisation (Eq. 3): the target is N(mu*, sigma*^2) from the annotators.

mu* = ``score`` (the annotators' mean on the training scale), sigma* = ``score_std`` (std of the
per-annotator scores).  Rows with fewer than 2 annotators have no sigma*; ``kl_missing_std`` says what
they get:

* ``"mean"`` (default): the mean ``score_std`` over training rows with >= 2 annotators;
* ``"floor"``: ``kl_std_floor``;
* ``"drop"``: the row is not used for training or early stopping.

Every sigma* is then floored at ``kl_std_floor`` (``score`` units) because annotators who agree
exactly would make log(sigma_hat^2 / sigma*^2) infinite.  The fill value is learned on the training
split and stored in the checkpoint.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from uamt.errors import DataError
from uamt.models.data import targets_of
from uamt.models.hts import HTSEstimator
from uamt.models.losses import kl_loss


def annotator_std(df: pd.DataFrame, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(score_std as float64 [n], mask of rows with a usable std: >= 2 annotators and finite)."""
    if "score_std" not in df.columns:
        raise DataError(f"{where}: column 'score_std' is missing; method 'kl' needs annotator disagreement")
    std = pd.to_numeric(df["score_std"], errors="coerce").to_numpy(dtype=np.float64)
    valid = np.isfinite(std) & (std >= 0)
    if "n_annotators" in df.columns:
        valid &= pd.to_numeric(df["n_annotators"], errors="coerce").fillna(0).to_numpy() >= 2
    return std, valid


class KLEstimator(HTSEstimator):
    """(mu, log sigma^2) head trained with KL(p* || p_hat)."""

    @classmethod
    def target_columns(cls, df, scaler, cfg, where, state):
        scores = targets_of(df, where)
        std, valid = annotator_std(df, where)
        if "kl_fill_std" not in state:  # the training split
            if cfg.kl_missing_std == "mean":
                if not valid.any():
                    raise DataError(
                        f"{where}: no row has >= 2 annotators, so kl_missing_std='mean' has nothing to "
                        "average; use kl_missing_std='floor' or a multi-annotator dataset"
                    )
                state["kl_fill_std"] = float(std[valid].mean())
            else:
                state["kl_fill_std"] = float(cfg.kl_std_floor)
        filled = np.where(valid, std, state["kl_fill_std"])
        filled = np.maximum(filled, cfg.kl_std_floor)
        keep = valid if cfg.kl_missing_std == "drop" else None
        if keep is not None and not keep.any():
            raise DataError(f"{where}: kl_missing_std='drop' leaves no rows (none has >= 2 annotators)")
        return {"y": scaler.transform(scores), "y_std": filled / scaler.std}, keep

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        mu, log_var = self.split(output)
        return kl_loss(mu, log_var, batch["y"], batch["y_std"])
