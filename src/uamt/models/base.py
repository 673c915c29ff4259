"""The COMET-style estimator every uncertainty method builds on.

Architecture (unbabel-comet 2.2.7 ``RegressionMetric`` / ``ReferencelessRegression``): per side, COMET's
:class:`~comet.modules.LayerwiseAttention` mixes the mean-pooled hidden states of every encoder layer
into one sentence embedding (``layer_norm=False``: then mixing pooled layers equals pooling mixed
layers, so it works from the embedding cache); the features

* reference-based: ``[mt, ref, mt*ref, |mt-ref|, mt*src, |mt-src|]`` (6 x dim),
* reference-free (QE): ``[mt, src, mt*src, |mt-src|]`` (4 x dim),

go through COMET's :class:`~comet.modules.FeedForward`.  Each method fills three hooks:

``build_head(in_dim)``
    the module on top of the features (default: ``FeedForward`` with ``out_dim`` outputs);
``loss(output, batch)``
    the training objective on the standardised target ``batch["y"]``;
``predict_distribution(batch, n_samples)``
    ``{"mu", "var"[, "epistemic", "aleatoric", "q_hat"]}`` tensors [B], on the standardised scale
    (variances, never standard deviations).

Two feature paths: (a) cached embeddings (frozen encoder; batches hold ``src``/``mt``/``ref``
[B, L, D]) and (b) ``finetune=True``: a copy of the unbabel-comet encoder is a sub-module, batches hold the
texts and ``encoder.pooled_layers(texts, train=True)`` runs inside the network, trained with COMET's
layer-wise learning-rate decay and a frozen encoder for the first ``nr_frozen_epochs``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from comet.modules import FeedForward, LayerwiseAttention
from torch import nn

from uamt.errors import DataError, UamtError
from uamt.fileio import atomic_path
from uamt.models.config import TrainConfig
from uamt.models.data import EncodedRows, make_loader, targets_of


class NonFiniteLossError(UamtError):
    """Training produced a NaN or infinite loss; no checkpoint of that run is marked valid."""


def owned_copy(encoder):
    """A copy of ``encoder`` whose torch module is a deep copy (the tokenizer is shared).

    The fine-tuned network trains (and loads its checkpoint into) this copy, never the caller's encoder:
    that one usually sits behind an embedding cache keyed by the frozen weights' id, and other models
    trained in the same process start from it.
    """
    comet_encoder = getattr(encoder, "comet_encoder", None)
    if not isinstance(comet_encoder, nn.Module):
        raise UamtError(
            f"finetune=True needs a torch encoder (encode.encoder hf or minilm); {encoder!r} has none"
        )
    tokenizer = getattr(comet_encoder, "tokenizer", None)
    memo = {} if tokenizer is None else {id(tokenizer): tokenizer}
    own = copy.copy(encoder)
    own.comet_encoder = copy.deepcopy(comet_encoder, memo)
    return own


def inputs_follow_weights(encoder) -> None:
    """Send the owned encoder's token ids where its weights are.

    The fine-tuned encoder is a sub-module, so Lightning moves it with the network
    (``train_base.accelerator``), while the encoder object still names ``encode.encoder.device`` (where
    the caller's frozen encoder runs): without this, ``accelerator: gpu`` with an encoder on ``cpu`` (or
    the reverse) fails with a device mismatch.
    """
    config = getattr(encoder, "config", None)
    weights = next(encoder.comet_encoder.parameters(), None)
    if config is None or weights is None or not dataclasses.is_dataclass(config):
        return
    device = weights.device
    if torch.device(config.device) != device:
        encoder.config = dataclasses.replace(config, device=str(device))


class Estimator(pl.LightningModule):
    """Base LightningModule: layer-wise attention + COMET features + a head filled by the method.

    Parameters
    ----------
    cfg : TrainConfig
    num_layers, dim : int
        Shape of one text's pooled embeddings [num_layers, dim].
    encoder : object, optional
        A ``uamt.encoders`` encoder (``comet_encoder``, ``pooled_layers``); required when
        ``cfg.finetune`` (a deep copy of its ``comet_encoder`` becomes a trained sub-module; the
        caller's encoder is never modified).
    """

    #: Width of the head's output (1 for a point score, 2 for (mu, log sigma^2)).
    out_dim: int = 1
    #: Whether the head's output is (mu, log var) rather than a point score.
    has_variance_output: bool = False

    def __init__(self, cfg: TrainConfig, num_layers: int, dim: int, encoder=None) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_layers = num_layers
        self.dim = dim
        self.layerwise_attention = LayerwiseAttention(
            num_layers=num_layers,
            layer_norm=False,
            dropout=cfg.dropout,
            layer_transformation=cfg.layer_transformation,
        )
        self.n_sides = 4 if cfg.reference_free else 6
        self.head = self.build_head(self.n_sides * dim)
        self.comet_encoder = None
        self.attach_encoder(None)
        self._frozen = False
        if cfg.finetune:
            if encoder is None:
                raise UamtError("finetune=True needs the encoder (uamt.encoders.get_encoder)")
            own = owned_copy(encoder)
            self.attach_encoder(own)
            # Registered as a sub-module: its (fine-tuned) weights are part of this model's state.
            # In this module's mode (get_encoder leaves encoders in eval mode for feature extraction).
            self.comet_encoder = own.comet_encoder.train(self.training)

    # ----------------------------------------------------------------- hooks
    def build_head(self, in_dim: int) -> nn.Module:
        """The module on the COMET features (default: COMET's FeedForward with ``out_dim`` outputs)."""
        return FeedForward(
            in_dim=in_dim,
            out_dim=self.out_dim,
            hidden_sizes=list(self.cfg.hidden_sizes),
            activations=self.cfg.activations,
            dropout=self.cfg.dropout,
        )

    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_distribution(self, batch: dict, n_samples: int | None = None) -> dict[str, torch.Tensor]:
        """Standardised-scale ``mu`` and ``var`` [B] (plus optional parts); see module docstring."""
        raise NotImplementedError  # pragma: no cover - abstract

    @classmethod
    def target_columns(
        cls, df, scaler, cfg: TrainConfig, where: str, state: dict
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """Per-row training columns for ``df`` and an optional boolean mask of rows to keep.

        ``state`` carries what is learned on the training split (filled on the first call, the
        training split) and stored in the checkpoint.  Default: ``{"y": standardised score}``.
        """
        return {"y": scaler.transform(targets_of(df, where))}, None

    @classmethod
    def dropout_scope(cls, cfg: TrainConfig) -> str | None:
        """Where inference applies MC dropout: None (a single deterministic pass), ``"head"`` (the
        head on cached embeddings) or ``"full"`` (through the encoder, which then needs the texts)."""
        return None

    # ----------------------------------------------------------- the network
    @property
    def needs_texts(self) -> bool:
        """Whether batches must carry texts (the encoder runs inside the network)."""
        return self.comet_encoder is not None

    def attach_encoder(self, encoder) -> None:
        """Give an inference-time encoder (``mcd_full`` / ``hts_mcd`` with ``mcd_scope='full'``).

        A fine-tuned network keeps running its own encoder: the caller's one holds the frozen weights.
        """
        if self.comet_encoder is not None:
            return
        # Not registered as a sub-module: its weights are not part of this model's state.
        object.__setattr__(self, "_encoder", encoder)

    def embed(self, batch: dict, side: str, encoder_train: bool | None = None) -> torch.Tensor:
        """Pooled layers [B, L, D] of one side: from the batch, or through the encoder."""
        through_encoder = self.needs_texts or encoder_train is not None
        if not through_encoder:
            return batch[side]
        if self._encoder is None:
            raise UamtError("this prediction runs the encoder inside the network; pass the encoder")
        train = self.training if encoder_train is None else encoder_train
        texts = batch[f"{side}_texts"]
        if self.comet_encoder is not None:
            inputs_follow_weights(self._encoder)
        return self._encoder.pooled_layers(texts, batch_size=len(texts), train=train).to(self.device)

    def mix(self, layers: torch.Tensor) -> torch.Tensor:
        """COMET layer-wise attention over pooled layers: [B, L, D] -> [B, D]."""
        return self.layerwise_attention(list(layers.unbind(dim=1)))

    def sentence_features(self, batch: dict, encoder_train: bool | None = None) -> torch.Tensor:
        """COMET features [B, 6 * dim] (reference-based) or [B, 4 * dim] (reference-free)."""
        src = self.mix(self.embed(batch, "src", encoder_train))
        mt = self.mix(self.embed(batch, "mt", encoder_train))
        prod_src, diff_src = mt * src, torch.abs(mt - src)
        if self.cfg.reference_free:
            return torch.cat((mt, src, prod_src, diff_src), dim=1)
        ref = self.mix(self.embed(batch, "ref", encoder_train))
        return torch.cat((mt, ref, mt * ref, torch.abs(mt - ref), prod_src, diff_src), dim=1)

    def head_forward(self, features: torch.Tensor, batch: dict, repeats: int = 1) -> torch.Tensor:
        """Head output [B * repeats, out_dim]; ``features`` already repeated ``repeats`` times."""
        return self.head(features)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.head_forward(self.sentence_features(batch), batch)

    # ------------------------------------------------------------- training
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(self(batch), batch)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"{type(self).__name__}: training loss is {loss.item()} at epoch {self.current_epoch}, "
                f"batch {batch_idx}; lower train_base.learning_rate or check the targets"
            )
        self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["y"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(self(batch), batch)
        self.log("val_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["y"]))
        return loss

    def on_validation_epoch_end(self) -> None:
        value = self.trainer.callback_metrics.get("val_loss")
        if value is not None and not torch.isfinite(value) and not self.trainer.sanity_checking:
            raise NonFiniteLossError(f"{type(self).__name__}: dev loss is {value.item()}")

    def configure_optimizers(self):
        top = list(self.head.parameters()) + list(self.layerwise_attention.parameters())
        groups = [{"params": top, "lr": self.cfg.learning_rate}]
        if self.comet_encoder is not None:
            groups = (
                self.comet_encoder.layerwise_lr(self.cfg.encoder_learning_rate, self.cfg.layerwise_decay)
                + groups
            )
        return torch.optim.Adam(groups, lr=self.cfg.learning_rate)

    # Frozen encoder for the first nr_frozen_epochs (fractions allowed), as COMET does.
    def on_train_start(self) -> None:
        if self.comet_encoder is None:
            return
        if self.cfg.nr_frozen_epochs > 0:
            self.comet_encoder.freeze()
            self._frozen = True
        if self.cfg.keep_embeddings_frozen:
            self.comet_encoder.freeze_embeddings()

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        if not self._frozen:
            return
        n_batches = max(int(self.trainer.num_training_batches), 1)
        if self.current_epoch + batch_idx / n_batches >= self.cfg.nr_frozen_epochs:
            self.comet_encoder.unfreeze()
            if self.cfg.keep_embeddings_frozen:
                self.comet_encoder.freeze_embeddings()
            self._frozen = False

    # ------------------------------------------------------------ inference
    @torch.no_grad()
    def predict_rows(self, rows: EncodedRows, n_samples: int | None = None) -> dict[str, torch.Tensor]:
        """Run :meth:`predict_distribution` over all rows in batches; tensors [n_rows] (standardised)."""
        self.eval()
        parts: dict[str, list[torch.Tensor]] = {}
        for batch in make_loader(
            rows,
            self.cfg.predict_batch_size,
            shuffle=False,
            with_texts=self.needs_texts or self.dropout_scope(self.cfg) == "full",
        ):
            for key, value in self.predict_distribution(batch, n_samples).items():
                parts.setdefault(key, []).append(value.detach().cpu().double())
        return {key: torch.cat(values) for key, values in parts.items()}


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
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
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
    try:
        with warnings.catch_warnings():
            # Single-process loaders are deliberate (rows are gathered from an in-memory table).
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*LeafSpec.*")
            trainer.fit(module, train_loader, dev_loader)
        best = checkpoint.best_model_path
        if not best:
            raise NonFiniteLossError(f"{type(module).__name__}: no valid epoch finished; nothing saved")
        state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state)
        module.best_val_loss = float(checkpoint.best_model_score)
        if not math.isfinite(module.best_val_loss):
            raise NonFiniteLossError(f"{type(module).__name__}: best dev loss is {module.best_val_loss}")
    finally:
        for path in sorted(ckpt_dir.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        ckpt_dir.rmdir()
    module.eval()
    return module


def save_weights(module: nn.Module, path: Path) -> None:
    """``torch.save(state_dict)`` to a temp file in the same folder, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(module.state_dict(), tmp)
