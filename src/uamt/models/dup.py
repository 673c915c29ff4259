"""Direct uncertainty prediction (DUP, Jain et al. 2021; DUP paper §4.2 and App. C).

Stage 1 is a trained point model M_Q (``base_model_dir``).  Stage 2 runs M_Q over D_E, takes the
target eps* = |q_hat - q*| (in M_Q's standardised units) and trains M_E: the same COMET architecture
with q_hat entering through a bottleneck layer between the feed-forward layers::

    features -> Linear(in, h0) -> act -> dropout -> Linear(h0, bottleneck) -> act      (COMET FeedForward)
             -> concat q_hat -> Linear(bottleneck + 1, h1) -> act -> dropout -> Linear(h1, 1)
             -> softplus + 1e-6 = eps_hat > 0

with loss ``abs`` (Eq. 5), ``sq`` (Eq. 6) or ``hts`` (Eq. 7, default).  Prediction: mu = q_hat,
sigma = eps_hat (times sqrt(pi/2) for ``abs``: :func:`dup_sigma`).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from uamt.models.base import Estimator
from uamt.models.comet_parts import FeedForward, feedforward_from_dropout, feedforward_until_dropout
from uamt.models.losses import get_loss

#: Keeps eps_hat strictly positive (Eq. 7 divides by eps_hat^2).
EPS_FLOOR = 1e-6


#: Standard deviation per unit of DUP's predicted error, by second-stage loss (Zerva et al., 2022,
#: Eqs. 5-7).  For a Gaussian error eps ~ N(0, sigma^2), the ABS loss (eps* - eps_hat)^2 is minimised
#: by eps_hat = E|eps| = sigma sqrt(2/pi), so sigma = eps_hat sqrt(pi/2); the SQ and HTS losses are
#: minimised by eps_hat^2 = E[eps^2] = sigma^2.
DUP_SIGMA_PER_ERROR = {"abs": math.sqrt(math.pi / 2.0), "sq": 1.0, "hts": 1.0}


def dup_sigma(eps_hat, loss: str):
    """DUP's predicted error ``eps_hat`` (array or tensor, any shape) as a standard deviation.

    .. math:: \\hat\\sigma = c_{loss}\\,\\hat\\epsilon, \\qquad c_{abs} = \\sqrt{\\pi/2}, \\; c_{sq} = c_{hts} = 1

    Raises
    ------
    ValueError
        For a loss not in :data:`DUP_SIGMA_PER_ERROR`.
    """
    if loss not in DUP_SIGMA_PER_ERROR:
        raise ValueError(f"loss={loss!r} not supported; choose from {sorted(DUP_SIGMA_PER_ERROR)}")
    return eps_hat * DUP_SIGMA_PER_ERROR[loss]


class BottleneckHead(nn.Module):
    """COMET FeedForward split at a bottleneck where the extra scalar q_hat is concatenated."""

    def __init__(self, in_dim: int, hidden_sizes, bottleneck: int, activations: str, dropout: float) -> None:
        super().__init__()
        hidden_sizes = list(hidden_sizes)
        self.pre = FeedForward(
            in_dim=in_dim,
            out_dim=bottleneck,
            hidden_sizes=hidden_sizes[:1],
            activations=activations,
            final_activation=activations,
            dropout=dropout,
        )
        self.post = FeedForward(
            in_dim=bottleneck + 1,
            out_dim=1,
            hidden_sizes=hidden_sizes[1:] or [bottleneck],
            activations=activations,
            dropout=dropout,
        )

    def forward(self, features: torch.Tensor, q_hat: torch.Tensor) -> torch.Tensor:
        return self.post(torch.cat((self.pre(features), q_hat.view(-1, 1)), dim=1))

    def until_dropout(self, features: torch.Tensor) -> torch.Tensor:
        """The deterministic start of :meth:`forward` (``pre``'s first Linear and activation)."""
        return feedforward_until_dropout(self.pre, features)

    def from_dropout(self, hidden: torch.Tensor, q_hat: torch.Tensor) -> torch.Tensor:
        """The rest of :meth:`forward` over :meth:`until_dropout`'s output; q_hat still enters at the
        bottleneck."""
        return self.post(torch.cat((feedforward_from_dropout(self.pre, hidden), q_hat.view(-1, 1)), dim=1))


class DUPEstimator(Estimator):
    """M_E: predicts eps_hat from <src, mt[, ref], q_hat>; batches carry ``q_hat`` and target ``y`` = eps*."""

    out_dim = 1

    def __init__(self, cfg, num_layers: int, dim: int, encoder=None) -> None:
        loss_fn = get_loss(cfg.dup_loss)  # fail before building the network
        super().__init__(cfg, num_layers, dim, encoder)
        self.loss_fn = loss_fn

    def build_head(self, in_dim: int) -> nn.Module:
        cfg = self.cfg
        return BottleneckHead(in_dim, cfg.hidden_sizes, cfg.bottleneck_size, cfg.activations, cfg.dropout)

    def head_forward(self, features: torch.Tensor, batch: dict, repeats: int = 1) -> torch.Tensor:
        q_hat = batch["q_hat"].to(features.dtype).repeat(repeats)
        return F.softplus(self.head(features, q_hat)) + EPS_FLOOR

    def head_until_dropout(self, features: torch.Tensor, batch: dict) -> torch.Tensor:
        return self.head.until_dropout(features)

    def head_from_dropout(self, hidden: torch.Tensor, batch: dict, repeats: int = 1) -> torch.Tensor:
        q_hat = batch["q_hat"].to(hidden.dtype).repeat(repeats)
        return F.softplus(self.head.from_dropout(hidden, q_hat)) + EPS_FLOOR

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        return self.loss_fn(output.view(-1), batch["y"])

    def predict_distribution(self, batch: dict, n_samples: int | None = None) -> dict[str, torch.Tensor]:
        eps_hat = self(batch).view(-1)
        q_hat = batch["q_hat"].to(eps_hat.dtype)
        return {"mu": q_hat, "var": dup_sigma(eps_hat, self.cfg.dup_loss) ** 2, "q_hat": q_hat}
