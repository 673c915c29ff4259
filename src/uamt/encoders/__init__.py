"""Sentence encoders (registry) and the on-disk cache of their pooled per-layer embeddings.

>>> from uamt.encoders import EncoderConfig, EmbeddingCache, get_encoder
>>> encoder = get_encoder(EncoderConfig(name="minilm"))          # doctest: +SKIP
>>> cache = EmbeddingCache("cache/embeddings", encoder)          # doctest: +SKIP
>>> cache.get(["Ein Satz.", "A sentence."]).shape                # doctest: +SKIP
(2, 7, 384)
"""

from uamt.encoders.cache import EmbeddingCache, text_key
from uamt.encoders.registry import (
    ENCODERS,
    CometPooledEncoder,
    EncoderConfig,
    PooledEncoder,
    USEPooledEncoder,
    default_minilm_path,
    get_encoder,
)

__all__ = [
    "ENCODERS",
    "CometPooledEncoder",
    "EmbeddingCache",
    "EncoderConfig",
    "PooledEncoder",
    "USEPooledEncoder",
    "default_minilm_path",
    "get_encoder",
    "text_key",
]
