"""A fake frozen encoder for model tests: each text's "embedding" [3 layers, 8 dims] is drawn from a
generator seeded by the text's crc32 -- fixed, fast, and different for different texts -- and the
weights that synthetic scores are built from."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from uamt.models import FeatureSource

N_LAYERS, DIM = 3, 8
WEIGHTS = np.random.default_rng(0).normal(size=DIM)


def make_embed(n_layers: int) -> Callable[[Sequence[str]], np.ndarray]:
    """A fake encoder of ``n_layers`` layers: texts -> float32 [n_texts, n_layers, DIM]."""

    def embed(texts):
        return np.stack(
            [np.random.default_rng(zlib.crc32(t.encode())).normal(size=(n_layers, DIM)) for t in texts]
        ).astype(np.float32)

    return embed


embed = make_embed(N_LAYERS)

FEATURES = FeatureSource(embed, encoder_id="fake-encoder-000")


def signal(mt: str, ref: str, embed=embed) -> tuple[float, np.ndarray]:
    """The noiseless synthetic score of ``mt`` against ``ref``, and ``mt``'s layer-mean embedding."""
    fm, fr = embed([mt])[0].mean(0), embed([ref])[0].mean(0)
    return fm @ WEIGHTS - 0.5 * fr @ WEIGHTS, fm


def synthetic_table(
    n: int,
    seed: int,
    *,
    texts: tuple[str, str, str] = ("src {seed}-{i}", "mt {seed}-{i}", "ref {seed}-{i}"),
    embed=embed,
) -> pd.DataFrame:
    """``n`` rows of src, mt, ref (``texts`` formatted with ``seed`` and row ``i``) and a score: the
    ``signal`` of mt against ref plus homoscedastic noise (sd 0.3) drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        src, mt, ref = (text.format(seed=seed, i=i) for text in texts)
        clean, _ = signal(mt, ref, embed)
        rows.append({"src": src, "mt": mt, "ref": ref, "score": float(clean + 0.3 * rng.normal())})
    return pd.DataFrame(rows)
