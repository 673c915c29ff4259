"""Heteroscedastic regression (HTS, Eq. 2): the head outputs mu and log sigma^2."""

from __future__ import annotations

import torch

from uamt.models.base import Estimator
from uamt.models.losses import hts_loss

#: log sigma^2 is clamped to this range at inference so exp() never overflows.
LOG_VAR_RANGE = (-30.0, 30.0)


class HTSEstimator(Estimator):
    """Two outputs (mu, log sigma^2) trained with L_HTS (beta-NLL with ``nll_beta`` > 0); sigma^2 is aleatoric."""

    out_dim = 2
    has_variance_output = True

    def split(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Head output [..., 2] -> (mu, log_var) [...]."""
        return output[..., 0], output[..., 1]

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        mu, log_var = self.split(output)
        return hts_loss(mu, log_var, batch["y"], beta=self.cfg.nll_beta)

    def predict_distribution(self, batch: dict, n_samples: int | None = None) -> dict[str, torch.Tensor]:
        mu, log_var = self.split(self(batch))
        var = torch.exp(log_var.clamp(*LOG_VAR_RANGE))
        return {"mu": mu, "var": var, "aleatoric": var}
