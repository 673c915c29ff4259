"""Token-alignment features of a translation: what a pooled sentence vector cannot see.

A pooled vector barely moves when one word is dropped, negated or invented. Greedy alignment of
contextual token states (BERTScore, Zhang et al. 2020) does see it: every token of one text is
matched to its most similar token of the other, so a reference token with no good match in the
translation is an omission, a translation token with no match in the reference an addition.

For a pair of texts with unit-normalised token states ``A`` (n x d, the candidate) and ``B``
(m x d, the reference or the source), ``S = A B^T`` (cosine similarities) and

``precision = mean_i max_j S_ij``, ``recall = mean_j max_i S_ij``,
``f = 2 P R / (P + R)``,
``unaligned_ref = mean_j 1[max_i S_ij < tau]`` (omitted mass of the reference / source),
``unaligned_mt = mean_i 1[max_j S_ij < tau]`` (added mass of the translation).

Special tokens ([CLS], [SEP], <s>, </s>) are left out; an empty text has no tokens and gets NaN.
``benchmarks/alignment_features.py`` measures what the features add to the served mu.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.core.errors import DataError

FEATURE_NAMES = ("precision", "recall", "f", "unaligned_ref", "unaligned_mt")


def pair_features(candidate: np.ndarray, other: np.ndarray, tau: float) -> np.ndarray:
    """The five :data:`FEATURE_NAMES` of one pair of token-state matrices.

    Parameters
    ----------
    candidate : ndarray of shape (n_tokens_mt, dim)
        Unit-normalised token states of the translation.
    other : ndarray of shape (n_tokens_other, dim)
        Unit-normalised token states of the reference (or the source).
    tau : float
        Cosine below which a token counts as unaligned.

    Returns
    -------
    ndarray of shape (5,)
        precision, recall, f (cosines in [-1, 1]) and the two unaligned shares (in [0, 1]); NaN
        when either text has no tokens.
    """
    if len(candidate) == 0 or len(other) == 0:
        return np.full(len(FEATURE_NAMES), np.nan)
    sim = candidate @ other.T
    best_for_candidate = sim.max(axis=1)
    best_for_other = sim.max(axis=0)
    precision = float(best_for_candidate.mean())
    recall = float(best_for_other.mean())
    f = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return np.array(
        [precision, recall, f, float((best_for_other < tau).mean()), float((best_for_candidate < tau).mean())]
    )


class TokenStates:
    """Unit-normalised token states of a Hugging Face encoder folder at chosen layers, cached per text.

    ``layers`` index ``hidden_states`` (0 = embeddings, -1 = the last layer).
    """

    def __init__(
        self, folder: str | Path, layers: Sequence[int], *, max_length: int = 256, batch_size: int = 32
    ) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.model = AutoModel.from_pretrained(str(folder)).eval()
        self.layers = tuple(layers)
        self.max_length = max_length
        self.batch_size = batch_size
        self._torch = torch
        self._cache: dict[str, list[np.ndarray]] = {}

    def encode(self, texts: Sequence[str]) -> None:
        """Compute and cache the states of every text not cached yet (longest first, so batches pad little)."""
        torch = self._torch
        todo = sorted({t for t in texts if t not in self._cache}, key=len, reverse=True)
        special = set(self.tokenizer.all_special_ids)
        with torch.inference_mode():
            for start in range(0, len(todo), self.batch_size):
                batch = todo[start : start + self.batch_size]
                enc = self.tokenizer(
                    batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
                )
                out = self.model(**enc, output_hidden_states=True)
                ids = enc["input_ids"].numpy()
                mask = enc["attention_mask"].numpy().astype(bool)
                for row, text in enumerate(batch):
                    keep = mask[row] & ~np.isin(ids[row], list(special))
                    per_layer = []
                    for layer in self.layers:
                        states = out.hidden_states[layer][row].numpy()[keep]
                        norms = np.linalg.norm(states, axis=1, keepdims=True)
                        per_layer.append(states / np.where(norms > 0, norms, 1.0))
                    self._cache[text] = per_layer

    def __getitem__(self, text: str) -> list[np.ndarray]:
        return self._cache[text]


def alignment_features(
    table: pd.DataFrame, states: TokenStates, *, against: str = "ref", tau: float = 0.5, prefix: str = ""
) -> pd.DataFrame:
    """Per row of ``table`` the :data:`FEATURE_NAMES` of ``mt`` against column ``against``, per layer.

    Columns are ``{prefix}{against}_L{layer}_{feature}``; rows keep ``table``'s order and index.
    DataError when ``table`` lacks ``mt`` or ``against``.
    """
    missing = [c for c in ("mt", against) if c not in table.columns]
    if missing:
        raise DataError(f"alignment_features: table has no column(s) {missing}")
    mt = table["mt"].fillna("").astype(str).tolist()
    other = table[against].fillna("").astype(str).tolist()
    states.encode(mt + other)
    values = (
        np.stack(
            [
                np.concatenate([pair_features(a, b, tau) for a, b in zip(states[m], states[o], strict=True)])
                for m, o in zip(mt, other, strict=True)
            ]
        )
        if len(table)
        else np.empty((0, len(states.layers) * len(FEATURE_NAMES)))
    )
    columns = [f"{prefix}{against}_L{layer}_{name}" for layer in states.layers for name in FEATURE_NAMES]
    return pd.DataFrame(values, columns=columns, index=table.index)


__all__ = ["FEATURE_NAMES", "TokenStates", "alignment_features", "pair_features"]
