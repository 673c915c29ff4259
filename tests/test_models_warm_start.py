"""``train_base.init_from``: a training starts from another model's weights (DA first, then MQM)."""

from __future__ import annotations

import pytest
import torch

from tests.fakes import FEATURES, synthetic_table
from uamt.core.errors import UamtError
from uamt.models import TrainConfig, load, train

CFG = TrainConfig(hidden_sizes=(16,), max_epochs=2, batch_size=16, patience=2)


def table(n: int, seed: int):
    return synthetic_table(n, seed, texts=("Quelle {seed} {i}", "output {seed} {i}", "reference {seed} {i}"))


@pytest.fixture(scope="module")
def first(tmp_path_factory, one_torch_thread):
    """An hts model trained from scratch: the 'DA' model the second training starts from."""
    return train("hts", CFG, table(120, 1), table(40, 2), FEATURES, tmp_path_factory.mktemp("da") / "hts")


def weights(model_dir) -> dict[str, torch.Tensor]:
    return load(model_dir).module.state_dict()


def test_the_second_training_starts_from_the_first_models_weights(first, tmp_path, monkeypatch):
    import uamt.models.training as training

    # No optimisation step: the weights saved are the ones training started from.
    monkeypatch.setattr(training, "fit", lambda module, *args, **kwargs: setattr(module, "best_val_loss", 0.0))
    same = train("hts", CFG.replace(init_from=str(first)), table(80, 3), table(40, 4), FEATURES, tmp_path / "a")
    scratch = train("hts", CFG, table(80, 3), table(40, 4), FEATURES, tmp_path / "b")
    start, loaded, fresh = weights(first), weights(same), weights(scratch)
    assert all(torch.equal(start[key], loaded[key]) for key in start)
    assert not all(torch.equal(start[key], fresh[key]) for key in start)
    assert load(same).meta["config"]["init_from"] == str(first)


def test_warm_started_training_runs_and_moves_away(first, tmp_path):
    """hts_mcd shares hts's network: an hts model starts it, and training moves the weights."""
    tuned = train("hts_mcd", CFG.replace(init_from=str(first)), table(80, 5), table(40, 6), FEATURES, tmp_path / "m")
    start, end = weights(first), weights(tuned)
    assert set(start) == set(end) and not all(torch.equal(start[key], end[key]) for key in start)


@pytest.mark.parametrize(
    ("method", "changes", "message"),
    [
        ("point", {}, r"its head is 2, this training needs 1"),
        ("hts", {"hidden_sizes": [8]}, r"its hidden_sizes is \[16\], this training needs \[8\]"),
        ("hts", {"reference_free": True}, r"its reference_free is False, this training needs True"),
    ],
)
def test_a_model_of_another_shape_is_refused(first, tmp_path, method, changes, message):
    cfg = CFG.replace(init_from=str(first), **changes)
    with pytest.raises(UamtError, match=rf"init_from=.*hts: {message}"):
        train(method, cfg, table(80, 3), table(40, 4), FEATURES, tmp_path / method)
    assert not (tmp_path / method).exists()  # nothing half-written


def test_a_folder_without_a_model_is_refused(tmp_path):
    with pytest.raises(UamtError, match="model.json"):
        train("hts", CFG.replace(init_from=str(tmp_path)), table(80, 3), table(40, 4), FEATURES, tmp_path / "x")
