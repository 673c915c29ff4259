"""A fake frozen encoder for model tests: each text's "embedding" [3 layers, 8 dims] is drawn from a
generator seeded by the text's crc32 -- fixed, fast, and different for different texts -- and the
weights that synthetic scores are built from."""

from __future__ import annotations

import zlib

import numpy as np

from uamt.models import FeatureSource

N_LAYERS, DIM = 3, 8
WEIGHTS = np.random.default_rng(0).normal(size=DIM)


def embed(texts):
    return np.stack(
        [np.random.default_rng(zlib.crc32(t.encode())).normal(size=(N_LAYERS, DIM)) for t in texts]
    ).astype(np.float32)


FEATURES = FeatureSource(embed, encoder_id="fake-encoder-000")
