"""Training: the Lightning loop around an :class:`~uamt.models.base.Estimator`.

The estimator is a plain torch module (network, loss, prediction); :class:`LightningAdapter` gives
it to a ``pytorch_lightning.Trainer`` (logging, checkpoints, early stopping, the frozen-encoder
schedule).  Only training imports this module, so loading and scoring a model never pays for
pytorch-lightning (and the torchmetrics / transformers it imports): seconds of start-up.  The
adapter holds no weights of its own; the estimator's state dict, and so ``weights.pt``, is the
same as when the estimator was itself the LightningModule.
"""

from __future__ import annotations

import logging
import math
import tempfile
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

from uamt.core.errors import DataError
from uamt.models.base import Estimator, NonFiniteLossError
from uamt.models.data import EncodedRows, make_loader


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (and dataloader workers) as Lightning does: initial weights and
    the shuffling order depend on it."""
    pl.seed_everything(seed, workers=True, verbose=False)


class LightningAdapter(pl.LightningModule):
    """The Lightning face of an estimator: steps, logging, optimiser, the frozen-encoder schedule."""

    def __init__(self, estimator: Estimator) -> None:
        super().__init__()
        self.estimator = estimator

    def forward(self, batch: dict) -> torch.Tensor:
        return self.estimator(batch)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.estimator.loss(self(batch), batch)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"{type(self.estimator).__name__}: training loss is {loss.item()} at epoch "
                f"{self.current_epoch}, batch {batch_idx}; lower train_base.learning_rate or check the targets"
            )
        self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["y"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.estimator.loss(self(batch), batch)
        self.log("val_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["y"]))
        return loss

    def on_validation_epoch_end(self) -> None:
        value = self.trainer.callback_metrics.get("val_loss")
        if value is not None and not torch.isfinite(value) and not self.trainer.sanity_checking:
            raise NonFiniteLossError(f"{type(self.estimator).__name__}: dev loss is {value.item()}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.estimator.param_groups(), lr=self.estimator.cfg.learning_rate)

    def on_train_start(self) -> None:
        self.estimator.before_training()

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        n_batches = max(int(self.trainer.num_training_batches), 1)
        self.estimator.before_train_batch(self.current_epoch + batch_idx / n_batches)


def fit(module: Estimator, train_rows: EncodedRows, dev_rows: EncodedRows, workdir: Path) -> Estimator:
    """Train ``module`` with pytorch-lightning; returns it holding the best-dev-loss weights.

    ModelCheckpoint keeps the best ``val_loss`` epoch and EarlyStopping stops after ``cfg.patience``
    epochs without improvement.  With ``cfg.deterministic`` the same data, config and seed give the
    same weights.

    Raises
    ------
    DataError
        The training split has fewer rows than ``batch_size`` or the dev split is empty.
    NonFiniteLossError
        A NaN / infinite loss appeared (nothing is saved).
    """
    cfg = module.cfg
    if len(train_rows) < cfg.batch_size:
        raise DataError(
            f"training split has {len(train_rows)} rows, fewer than batch_size={cfg.batch_size}; "
            "lower train_base.batch_size or add data"
        )
    if len(dev_rows) == 0:
        raise DataError("dev split has no rows; early stopping needs a dev set")
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    module.before_fit(train_rows, dev_rows)
    seed_everything(cfg.seed)
    texts = module.needs_texts
    train_loader = make_loader(
        train_rows, cfg.batch_size, shuffle=True, seed=cfg.seed, with_texts=texts, drop_last=False
    )
    dev_loader = make_loader(dev_rows, cfg.predict_batch_size, shuffle=False, with_texts=texts)
    ckpt_dir = Path(tempfile.mkdtemp(prefix=".ckpt-", dir=workdir))
    checkpoint = pl.callbacks.ModelCheckpoint(
        dirpath=ckpt_dir, monitor="val_loss", mode="min", save_top_k=1, save_weights_only=True
    )
    stopper = pl.callbacks.EarlyStopping(monitor="val_loss", mode="min", patience=cfg.patience)
    trainer = pl.Trainer(
        max_epochs=cfg.max_epochs,
        accelerator=cfg.accelerator,
        devices=1,
        deterministic=cfg.deterministic,
        callbacks=[checkpoint, stopper],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(ckpt_dir),
    )
    adapter = LightningAdapter(module)
    try:
        with warnings.catch_warnings():
            # Single-process loaders are deliberate (rows are gathered from an in-memory table).
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*LeafSpec.*")
            trainer.fit(adapter, train_loader, dev_loader)
        best = checkpoint.best_model_path
        if not best:
            raise NonFiniteLossError(f"{type(module).__name__}: no valid epoch finished; nothing saved")
        state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        adapter.load_state_dict(state)
        module.best_val_loss = float(checkpoint.best_model_score)
        if not math.isfinite(module.best_val_loss):
            raise NonFiniteLossError(f"{type(module).__name__}: best dev loss is {module.best_val_loss}")
    finally:
        for path in sorted(ckpt_dir.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        ckpt_dir.rmdir()
    module.eval()
    return module
