"""Training objectives of the papers, on standardised targets; every function returns the batch mean.

Shapes: all tensor arguments are [B].  ``log_var`` is log sigma_hat^2 (a log-variance).
"""

from __future__ import annotations

import torch


def mse_loss(mu: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Squared error (q* - q_hat)^2 (vanilla COMET)."""
    return torch.mean((target - mu) ** 2)


def nll_weights(log_var: torch.Tensor, beta: float | torch.Tensor) -> torch.Tensor | float:
    """beta-NLL row weights sigma_hat^(2 beta), held constant in the gradient (Seitzer et al. 2022).

    Under Eq. 2 the gradient of mu is (mu - q*) / sigma^2: a row the network finds hard is given a
    large sigma and then barely pulls mu (a critical error trained at the worst score lands a few
    points below the others, its error absorbed by sigma).  Weighting each row's loss by
    sigma^(2 beta) makes that gradient (mu - q*) / sigma^(2 - 2 beta): beta = 0 is Eq. 2, beta = 1
    fits mu as the squared error does while sigma^2 still learns the squared residual.  Returns the
    scalar 1.0 for beta = 0 so Eq. 2 stays bit-identical.  ``beta`` may be a tensor [B], one beta
    per row (``train_base.synthetic_nll_beta``: the synthetic failure rows apart).
    """
    if not isinstance(beta, torch.Tensor) and beta == 0.0:
        return 1.0
    return torch.exp(beta * log_var).detach()


def hts_loss(
    mu: torch.Tensor, log_var: torch.Tensor, target: torch.Tensor, beta: float | torch.Tensor = 0.0
) -> torch.Tensor:
    """Heteroscedastic loss, Eq. 2: (q* - mu)^2 / (2 sigma^2) + log(sigma^2) / 2; with ``beta`` > 0
    each row is weighted by :func:`nll_weights` (beta-NLL)."""
    return torch.mean(nll_weights(log_var, beta) * ((target - mu) ** 2 / (2 * torch.exp(log_var)) + 0.5 * log_var))


def kl_loss(
    mu: torch.Tensor, log_var: torch.Tensor, target_mu: torch.Tensor, target_std: torch.Tensor
) -> torch.Tensor:
    """KL(N(mu*, sigma*^2) || N(mu, sigma^2)), Eq. 3.

    ((mu* - mu)^2 + sigma*^2) / (2 sigma^2) + log(sigma^2 / sigma*^2) / 2 - 1/2; ``target_std`` is
    sigma* (a standard deviation, > 0).
    """
    target_var = target_std**2
    return torch.mean(
        ((target_mu - mu) ** 2 + target_var) / (2 * torch.exp(log_var))
        + 0.5 * (log_var - torch.log(target_var))
        - 0.5
    )


def kl_hts_loss(
    mu: torch.Tensor,
    log_var: torch.Tensor,
    target_mu: torch.Tensor,
    target_std: torch.Tensor,
    has_std: torch.Tensor,
    beta: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """Eq. 3 (:func:`kl_loss`) on rows with ``has_std`` = 1, Eq. 2 (:func:`hts_loss`) on the others.

    Eq. 2 is Eq. 3 as sigma* -> 0 less the model-free constant -log(sigma*) - 1/2: the KL to a point
    mass at the one score a single-rater row has.  ``target_std`` of the Eq. 2 rows is not read
    (any finite value).  ``beta`` > 0 weights every row by :func:`nll_weights` (beta-NLL).
    """
    target_var = target_std**2
    inv_two_var = 1.0 / (2 * torch.exp(log_var))
    squared = (target_mu - mu) ** 2
    kl = (squared + target_var) * inv_two_var + 0.5 * (log_var - torch.log(target_var)) - 0.5
    hts = squared * inv_two_var + 0.5 * log_var
    return torch.mean(nll_weights(log_var, beta) * torch.where(has_std > 0.5, kl, hts))


def dup_abs_loss(eps_hat: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """DUP L_ABS^E, Eq. 5: (eps* - eps_hat)^2."""
    return torch.mean((eps - eps_hat) ** 2)


def dup_sq_loss(eps_hat: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """DUP L_SQ^E, Eq. 6: (eps*^2 - eps_hat^2)^2."""
    return torch.mean((eps**2 - eps_hat**2) ** 2)


def dup_hts_loss(eps_hat: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """DUP L_HTS^E, Eq. 7: eps*^2 / (2 eps_hat^2) + log(eps_hat^2) / 2."""
    return torch.mean(eps**2 / (2 * eps_hat**2) + 0.5 * torch.log(eps_hat**2))


#: DUP second-stage losses by name (params: ``train_dup.dup_loss``).
LOSSES = {"abs": dup_abs_loss, "sq": dup_sq_loss, "hts": dup_hts_loss}


def get_loss(name: str):
    """The DUP loss ``name``; unknown names raise ValueError listing the choices."""
    if name not in LOSSES:
        raise ValueError(f"loss={name!r} not supported; choose from {sorted(LOSSES)}")
    return LOSSES[name]
