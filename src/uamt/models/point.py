"""Point estimate: vanilla COMET trained with the squared error.

``sigma`` of a point model is NaN: it has no uncertainty of its own.  A fixed-variance Gaussian
(Eq. 11 of the DUP paper, sigma^2 = mean squared dev error) is fitted later by ``uamt.uncertainty``
calibration, which reads ``mu`` only.
"""

from __future__ import annotations

import torch

from uamt.models.base import Estimator
from uamt.models.losses import mse_loss


class PointEstimator(Estimator):
    """COMET regression: one output q_hat, MSE loss; ``var`` = NaN."""

    out_dim = 1

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        return mse_loss(output.view(-1), batch["y"])

    def predict_distribution(self, batch: dict, n_samples: int | None = None) -> dict[str, torch.Tensor]:
        mu = self(batch).view(-1)
        return {"mu": mu, "var": torch.full_like(mu, float("nan"))}
