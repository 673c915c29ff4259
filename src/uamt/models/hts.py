"""Heteroscedastic regression (HTS, Eq. 2): the head outputs mu and log sigma^2."""

from __future__ import annotations

import numpy as np
import torch

from uamt.core.naming import is_synthetic
from uamt.models.base import Estimator
from uamt.models.losses import hts_loss

#: log sigma^2 is clamped to this range at inference so exp() never overflows.
LOG_VAR_RANGE = (-30.0, 30.0)


def with_row_beta(columns: dict[str, np.ndarray], df, cfg) -> dict[str, np.ndarray]:
    """``columns`` plus ``y_beta`` [n_rows], each row's beta-NLL beta, when the synthetic failure
    rows have their own (``cfg.synthetic_nll_beta``; the natural rows keep ``cfg.nll_beta``);
    ``columns`` unchanged otherwise."""
    if cfg.synthetic_nll_beta is None:
        return columns
    beta = np.where(is_synthetic(df), cfg.synthetic_nll_beta, cfg.nll_beta).astype(np.float32)
    return {**columns, "y_beta": beta}


def row_beta(batch: dict, cfg) -> float | torch.Tensor:
    """The beta-NLL beta of a batch: per row where :func:`with_row_beta` set one, else ``cfg.nll_beta``."""
    return batch.get("y_beta", cfg.nll_beta)


class HTSEstimator(Estimator):
    """Two outputs (mu, log sigma^2) trained with L_HTS (beta-NLL with ``nll_beta`` > 0); sigma^2 is aleatoric."""

    out_dim = 2
    has_variance_output = True

    def split(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Head output [..., 2] -> (mu, log_var) [...]."""
        return output[..., 0], output[..., 1]

    @classmethod
    def target_columns(cls, df, scaler, cfg, where, state):
        columns, keep = super().target_columns(df, scaler, cfg, where, state)
        return with_row_beta(columns, df, cfg), keep

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        mu, log_var = self.split(output)
        return hts_loss(mu, log_var, batch["y"], beta=row_beta(batch, self.cfg))

    def predict_distribution(self, batch: dict, n_samples: int | None = None) -> dict[str, torch.Tensor]:
        mu, log_var = self.split(self(batch))
        var = torch.exp(log_var.clamp(*LOG_VAR_RANGE))
        return {"mu": mu, "var": var, "aleatoric": var}
