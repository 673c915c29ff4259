"""Monte Carlo dropout (Glushkova et al. 2021, §3): N stochastic passes, Gaussian fit to the samples.

* ``mcd_head``: dropout in the feed-forward head only, on cached embeddings.  The sentence features
  and the head's layers before its first dropout are computed once, and the N passes run as one
  batched forward of that output repeated N times (chunked to bound memory), not N Python loops.
  Every batch's passes start from the model's seed, so batches of one size draw the same dropout
  noise: it is drawn for the first such batch and replayed for the others (:class:`NoiseReplay`).
* ``mcd_full``: dropout through the whole network, encoder included (the paper's MCD, dropout at
  encoder, pooling and feed-forward layers): N passes of the encoder; needs the encoder at inference.

mu = mean of the samples, var = their population variance (1/N, as Eq. 4), reported as ``epistemic``.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from uamt.core.errors import UamtError
from uamt.models.base import Estimator
from uamt.models.data import make_loader
from uamt.models.hts import LOG_VAR_RANGE
from uamt.models.point import PointEstimator

#: Upper bound on rows x passes per head forward (memory of the repeated batch).
MAX_REPEATED_ROWS = 16384
#: Upper bound on the dropout noise kept per model for replay (bytes); a batch shape whose noise
#: would exceed it draws its noise afresh each time, as without replay.
MAX_REPLAYED_NOISE_BYTES = 256 * 2**20


def n_passes(model: Estimator, n_samples: int | None) -> int:
    n = model.cfg.mc_samples if n_samples is None else int(n_samples)
    if n < 2:
        raise UamtError(f"{type(model).__name__}: n_samples={n}; MC dropout needs at least 2 passes")
    return n


def seeded_passes(fn):
    """Run ``fn(model, batch, n)`` with the global RNG seeded from ``model.cfg.seed`` (restored after),
    so the same model, input and seed give the same MC-dropout samples: identical predictions."""

    def wrapper(model: Estimator, batch: dict, n: int) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(model.cfg.seed)
            return fn(model, batch, n)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def dropout_noise(x: torch.Tensor, p: float) -> torch.Tensor:
    """What ``nn.Dropout(p)`` in training mode multiplies ``x`` by on the CPU, drawn as ATen draws it
    (``bernoulli_(1 - p)`` of a tensor like ``x``, divided by ``1 - p``; 0 < p < 1): the same global-RNG
    calls, so ``x * dropout_noise(x, p)`` equals the module's output bit for bit (tested)."""
    return torch.empty_like(x).bernoulli_(1 - p).div_(1 - p)


class NoiseReplay:
    """Dropout noise of a model's head MC passes, kept per batch shape and replayed.

    :func:`head_mc_outputs` seeds every batch's passes from the model's seed, so two batches with the
    same number of rows make the head's dropout layers draw the same noise in the same order.  Drawing
    it (Bernoulli samples for rows x passes x hidden units) costs more than the layers it masks; it is
    drawn once per ``key`` (seed, rows, passes per chunk, the hidden state's width and dtype, the rates) and
    multiplied in for every later batch: the same samples, bit for bit.  Noise is kept while it fits
    :data:`MAX_REPLAYED_NOISE_BYTES`; the store goes with the model (weak reference).
    """

    _stores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @classmethod
    @contextmanager
    def around(cls, model: Estimator, key: tuple):
        """Within the block, the head's active dropout layers (0 < p < 1, training mode) record their
        noise for ``key`` (with the layers' rates) on first use and replay it afterwards, in call order."""
        layers = [m for m in model.head.modules() if isinstance(m, nn.Dropout) and m.training and 0 < m.p < 1]
        key = (*key, tuple(layer.p for layer in layers))
        store = cls._stores.setdefault(model, {})
        recorded = store.get(key)
        drawn: list[torch.Tensor] = []

        def forward(x: torch.Tensor, p: float) -> torch.Tensor:
            if recorded is None:
                drawn.append(dropout_noise(x, p))
                return x * drawn[-1]
            noise = recorded[len(drawn)]
            if noise.shape != x.shape or noise.dtype != x.dtype:
                raise UamtError(f"dropout replay: noise {tuple(noise.shape)} for an input {tuple(x.shape)}")
            drawn.append(noise)
            return x * noise

        for layer in layers:
            layer.forward = lambda x, p=layer.p: forward(x, p)
        try:
            yield
        finally:
            for layer in layers:
                del layer.forward
        if recorded is None and _nbytes(drawn) + sum(_nbytes(kept) for kept in store.values()) <= MAX_REPLAYED_NOISE_BYTES:
            store[key] = tuple(drawn)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@seeded_passes
def head_mc_outputs(model: Estimator, batch: dict, n: int) -> torch.Tensor:
    """Head outputs [n, B, out_dim] of n dropout passes over the head (layer mix deterministic).

    The head's layers before its first dropout (:meth:`Estimator.head_until_dropout`: the widest
    Linear, features x hidden_sizes[0]) give the same output on every pass, so they run once on the
    B rows; only their output is repeated for the passes (:meth:`Estimator.head_from_dropout`).  The
    dropout layers see the same tensors in the same order as a forward of the repeated features, so
    they draw the same masks: the samples are those of ``head_forward(features.repeat(n, 1))``.
    The masks themselves are drawn for the first batch of each size and replayed (:class:`NoiseReplay`).
    """
    features = model.sentence_features(batch)
    rows = features.shape[0]
    chunk = max(1, MAX_REPEATED_ROWS // max(rows, 1))
    was_training = model.head.training
    model.head.train()
    try:
        hidden = model.head_until_dropout(features, batch)
        outs = []
        key = (model.cfg.seed, rows, n, chunk, hidden.shape[1:], hidden.dtype)
        with NoiseReplay.around(model, key):
            for start in range(0, n, chunk):
                reps = min(chunk, n - start)
                outs.append(model.head_from_dropout(hidden.repeat(reps, 1), batch, repeats=reps))
    finally:
        model.head.train(was_training)
    return torch.cat(outs).view(n, rows, -1)


@seeded_passes
def full_mc_outputs(model: Estimator, batch: dict, n: int) -> torch.Tensor:
    """Head outputs [n, B, out_dim] of n passes with dropout in encoder, layer mix and head."""
    if model._encoder is None:
        raise UamtError(
            f"{type(model).__name__}: MC dropout through the encoder needs the encoder; "
            "pass features built with uamt.models.data.features_from_cache / features_from_encoder"
        )
    was_training = model.training
    model.train()
    try:
        outs = [
            model.head_forward(model.sentence_features(batch, encoder_train=True), batch).detach()
            for _ in range(n)
        ]
    finally:
        model.train(was_training)
    return torch.stack(outs)


def sample_moments(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance over dim 0: [n, B] -> ([B], [B])."""
    return samples.mean(dim=0), samples.var(dim=0, unbiased=False)


@torch.no_grad()
def head_samples(model: Estimator, rows, n_samples: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Standardised per-pass outputs of head MC dropout over all ``rows``: ``(mu [n, K], var [n, K])``,
    ``var`` None unless the head predicts a variance.

    The batches are those of :meth:`Estimator.predict_rows` and each batch's passes are seeded from the
    model's seed (:func:`seeded_passes`), so pass k applies the same dropout masks to rows that differ
    only in one input (e.g. the reference): the samples are aligned across such inputs.
    """
    model.eval()
    n = n_passes(model, n_samples)
    mus, variances = [], []
    for batch in make_loader(rows, model.cfg.predict_batch_size, shuffle=False):
        out = head_mc_outputs(model, batch, n).double()  # [K, B, out_dim]
        mus.append(out[..., 0].T.numpy())
        if model.has_variance_output:
            variances.append(torch.exp(out[..., 1].clamp(*LOG_VAR_RANGE)).T.numpy())
    return np.concatenate(mus), (np.concatenate(variances) if model.has_variance_output else None)


class _MCDropoutEstimator(PointEstimator):
    """Point model trained with MSE; inference = N dropout passes (``mc_outputs``), Gaussian fit."""

    #: Where dropout stays on at inference ("head" or "full").
    scope: str
    #: ``(model, batch, n) -> [n, B, out_dim]``: the outputs of the n dropout passes.
    mc_outputs = None

    @classmethod
    def dropout_scope(cls, cfg) -> str:
        return cls.scope

    def predict_distribution(self, batch: dict, n_samples: int | None = None) -> dict[str, torch.Tensor]:
        samples = type(self).mc_outputs(self, batch, n_passes(self, n_samples))[..., 0]
        mu, var = sample_moments(samples)
        return {"mu": mu, "var": var, "epistemic": var}


class MCDHeadEstimator(_MCDropoutEstimator):
    """Point model trained with MSE; inference = N dropout passes of the head (one batched forward)."""

    scope = "head"
    mc_outputs = staticmethod(head_mc_outputs)


class MCDFullEstimator(_MCDropoutEstimator):
    """Point model; inference = N dropout passes through encoder + layer mix + head (paper's MCD)."""

    scope = "full"
    mc_outputs = staticmethod(full_mc_outputs)
