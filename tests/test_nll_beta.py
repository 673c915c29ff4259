"""beta-NLL (``train_base.nll_beta``): the weights, the loss by hand, what the weighting does to the
gradient of mu and sigma, the config's bounds, and trained HTS / KL models that read and record it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from tests.fakes import FEATURES, synthetic_table
from uamt.core.naming import is_synthetic
from uamt.models import TrainConfig, load, train
from uamt.models.hts import with_row_beta
from uamt.models.losses import hts_loss, kl_hts_loss, nll_weights


def test_beta_zero_is_eq_2_bit_for_bit():
    mu, log_var, target = torch.tensor([0.3, -1.0]), torch.tensor([0.5, -0.2]), torch.tensor([1.0, 2.0])
    eq2 = torch.mean((target - mu) ** 2 / (2 * torch.exp(log_var)) + 0.5 * log_var)
    assert hts_loss(mu, log_var, target, beta=0.0).item() == eq2.item()
    assert nll_weights(log_var, 0.0) == 1.0


def test_hand_computed_loss_and_weights():
    # sigma^2 = 4, residual 2: Eq. 2 per row = 4 / 8 + log(4) / 2 = 0.5 + log 2; weight sigma^(2 beta)
    mu, log_var, target = torch.zeros(1), torch.full((1,), math.log(4.0)), torch.full((1,), 2.0)
    row = 0.5 + math.log(2.0)
    assert hts_loss(mu, log_var, target, beta=0.5).item() == pytest.approx(2.0 * row)
    assert hts_loss(mu, log_var, target, beta=1.0).item() == pytest.approx(4.0 * row)
    assert nll_weights(log_var, 0.5).item() == pytest.approx(2.0)
    # the KL family weights every row (Eq. 3 and Eq. 2 rows) the same way
    std, has_std = torch.full((1,), 1.0), torch.zeros(1)
    assert kl_hts_loss(mu, log_var, target, std, has_std, beta=0.5).item() == pytest.approx(2.0 * row)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_mu_minimises_at_the_sigma_weighted_mean(beta):
    # With the variances held fixed, the loss is minimised in a shared mu at the mean of the targets
    # weighted by sigma^(2 beta - 2): Eq. 2 (beta = 0) all but ignores the noisy row, beta = 1 is
    # the plain mean (the squared error's mu).
    target = torch.tensor([0.0, 10.0])
    log_var = torch.log(torch.tensor([1.0, 100.0]))
    weights = torch.exp((beta - 1.0) * log_var)
    mean = float((weights * target).sum() / weights.sum())
    mu = torch.full((2,), mean, requires_grad=True)
    hts_loss(mu, log_var, target, beta=beta).backward()
    assert mu.grad.sum().item() == pytest.approx(0.0, abs=1e-6)
    assert {0.0: 0.099, 0.5: 0.909, 1.0: 5.0}[beta] == pytest.approx(mean, abs=1e-3)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_sigma_still_learns_the_squared_residual(beta):
    # d loss / d log sigma^2 vanishes where sigma^2 = (q* - mu)^2, whatever beta (the weight is
    # held constant in the gradient).
    mu, target = torch.zeros(1), torch.full((1,), 3.0)
    log_var = torch.full((1,), math.log(9.0), requires_grad=True)
    hts_loss(mu, log_var, target, beta=beta).backward()
    assert log_var.grad.item() == pytest.approx(0.0, abs=1e-6)


def test_config_refuses_beta_outside_zero_one():
    with pytest.raises(ValueError, match=r"nll_beta=1.5: must be in \[0, 1\]"):
        TrainConfig(nll_beta=1.5)
    with pytest.raises(ValueError, match=r"nll_beta=-0.1"):
        TrainConfig().replace(nll_beta=-0.1)


def test_trained_models_read_and_record_beta(tmp_path):
    # Training is seeded and deterministic: the same rows and seed give different networks only if
    # the loss reads nll_beta (HTS and KL; hts_mcd trains as HTS).
    # every other row has two raters (KL's Eq. 3 rows), the rest one (its Eq. 2 rows)
    train_rows, dev, test = (
        synthetic_table(n, seed).assign(lp="en-de", score_std=lambda f: np.where(f.index % 2 == 0, 0.5, np.nan))
        for n, seed in ((160, 1), (40, 2), (30, 3))
    )
    cfg = TrainConfig(hidden_sizes=(16, 8), max_epochs=2, batch_size=16)
    for method in ("hts", "kl"):
        mus = {}
        for beta in (0.0, 1.0):
            model = load(train(method, cfg.replace(nll_beta=beta), train_rows, dev, FEATURES, tmp_path / f"{method}{beta}"))
            assert model.cfg.nll_beta == beta  # recorded with the model
            mus[beta] = model.predict(test, FEATURES)["mu"].to_numpy()
        assert np.abs(mus[0.0] - mus[1.0]).max() > 1e-4, method


def test_per_row_beta_by_hand():
    # one beta per row: row 0 (beta 0) weighs 1, row 1 (beta 1) weighs its sigma^2 = 4
    mu, target = torch.zeros(2), torch.tensor([1.0, 2.0])
    log_var = torch.log(torch.tensor([1.0, 4.0]))
    rows = torch.tensor([0.5, 0.5 + math.log(2.0)])  # Eq. 2 per row: 1 / 2 + 0; 4 / 8 + log(4) / 2
    expected = (1.0 * rows[0] + 4.0 * rows[1]) / 2
    assert hts_loss(mu, log_var, target, beta=torch.tensor([0.0, 1.0])).item() == pytest.approx(expected.item())
    assert nll_weights(log_var, torch.tensor([0.0, 1.0])).tolist() == pytest.approx([1.0, 4.0])


def test_synthetic_rows_get_their_own_beta():
    df = pd.DataFrame({"system": ["Online-W", "synthetic-gibberish", "synthetic-reference", "synthetic"]})
    assert is_synthetic(df).tolist() == [False, True, True, False]
    assert not is_synthetic(df.drop(columns="system")).any()
    columns = {"y": np.zeros(4, dtype=np.float32)}
    assert with_row_beta(columns, df, TrainConfig(nll_beta=0.25)) is columns  # no synthetic beta: unchanged
    betas = with_row_beta(columns, df, TrainConfig(nll_beta=0.25, synthetic_nll_beta=1.0))["y_beta"]
    assert betas.tolist() == [0.25, 1.0, 1.0, 0.25]
    with pytest.raises(ValueError, match=r"synthetic_nll_beta=2.0: must be in \[0, 1\] or null"):
        TrainConfig(synthetic_nll_beta=2.0)


def test_synthetic_beta_moves_only_models_trained_on_synthetic_rows(tmp_path):
    # Seeded and deterministic: a synthetic beta changes nothing without synthetic rows (the weights
    # are exactly 1), and changes the network when a fifth of the rows are synthetic at a far score.
    train_rows, dev, test = (synthetic_table(n, seed).assign(system="sys") for n, seed in ((160, 1), (40, 2), (30, 3)))
    with_synthetic = train_rows.assign(
        system=np.where(train_rows.index % 5 == 0, "synthetic-gibberish", "sys"),
        score=np.where(train_rows.index % 5 == 0, -5.0, train_rows["score"]),
    )
    cfg = TrainConfig(hidden_sizes=(16, 8), max_epochs=2, batch_size=16)

    def mu(rows, name, **changes):
        model = load(train("hts", cfg.replace(**changes), rows, dev, FEATURES, tmp_path / name))
        return model.predict(test, FEATURES)["mu"].to_numpy()

    assert np.array_equal(mu(train_rows, "plain"), mu(train_rows, "plain_synth", synthetic_nll_beta=1.0))
    assert np.abs(mu(with_synthetic, "synth") - mu(with_synthetic, "synth_beta", synthetic_nll_beta=1.0)).max() > 1e-4
