"""Sentence encoders (the catalog, by name) and the on-disk cache of their pooled per-layer embeddings.

>>> from uamt.encoders import EncoderConfig, EmbeddingCache, get_encoder
>>> encoder = get_encoder(EncoderConfig(name="minilm"))          # doctest: +SKIP
>>> cache = EmbeddingCache("cache/embeddings", encoder)          # doctest: +SKIP
>>> cache.get(["Ein Satz.", "A sentence."]).shape                # doctest: +SKIP
(2, 7, 384)
>>> get_encoder(EncoderConfig(runtime="onnx")).encoder_id        # doctest: +SKIP
'minilm-1ffd763853fa+ort'
"""

from uamt.encoders.cache import EmbeddingCache, text_key
from uamt.encoders.catalog import (
    ENCODERS,
    RUNTIMES,
    CometPooledEncoder,
    EncoderConfig,
    PooledEncoder,
    USEPooledEncoder,
    default_minilm_path,
    get_encoder,
    weights_id,
)
from uamt.encoders.precompute import EncodeConfig, precompute_embeddings

__all__ = [
    "ENCODERS",
    "RUNTIMES",
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
    "weights_id",
]
