"""HTS + MC dropout (Eq. 4): total variance = Var[Q] (epistemic) + E[Sigma] (aleatoric).

The model is trained as HTS; at inference M dropout passes give samples q_j and sigma_j^2.
``mcd_scope='head'`` (default) drops out in the head on cached embeddings (one batched forward);
``'full'`` drops out through the encoder too (the paper's setting; needs the encoder).
"""

from __future__ import annotations

import torch

from uamt.models.hts import LOG_VAR_RANGE, HTSEstimator
from uamt.models.mcd import full_mc_outputs, head_mc_outputs, n_passes, sample_moments


class HTSMCDEstimator(HTSEstimator):
    """Heteroscedastic model with MC dropout at inference; reports epistemic and aleatoric parts."""

    @classmethod
    def dropout_scope(cls, cfg) -> str:
        return cfg.mcd_scope

    def predict_distribution(self, batch: dict, n_samples: int | None = None) -> dict[str, torch.Tensor]:
        n = n_passes(self, n_samples)
        runner = full_mc_outputs if self.dropout_scope(self.cfg) == "full" else head_mc_outputs
        mu_samples, log_var_samples = self.split(runner(self, batch, n))
        mu, epistemic = sample_moments(mu_samples)
        aleatoric = torch.exp(log_var_samples.clamp(*LOG_VAR_RANGE)).mean(dim=0)
        return {"mu": mu, "var": epistemic + aleatoric, "epistemic": epistemic, "aleatoric": aleatoric}
