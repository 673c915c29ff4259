"""Sentence encoders (the catalog, by name) and the on-disk cache of their pooled per-layer embeddings.

>>> from uamt.encoders import EncoderConfig, EmbeddingCache, get_encoder
>>> encoder = get_encoder(EncoderConfig(name="minilm"))          # doctest: +SKIP
>>> cache = EmbeddingCache("cache/embeddings", encoder)          # doctest: +SKIP
>>> cache.get(["Ein Satz.", "A sentence."]).shape                # doctest: +SKIP
(2, 7, 384)
"""

from uamt.encoders.cache import EmbeddingCache, text_key
from uamt.encoders.catalog import (
    ENCODERS,
    CometPooledEncoder,
    EncoderConfig,
    PooledEncoder,
    USEPooledEncoder,
    default_minilm_path,
    get_encoder,
)
from uamt.encoders.precompute import EncodeConfig, precompute_embeddings

__all__ = [
    "ENCODERS",
    "CometPooledEncoder",
    "EmbeddingCache",
    "EncodeConfig",
    "EncoderConfig",
    "PooledEncoder",
    "USEPooledEncoder",
    "default_minilm_path",
    "get_encoder",
    "precompute_embeddings",
    "text_key",
]
