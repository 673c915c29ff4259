"""Generate additional MT hypotheses from a seq2seq MT model (Fomicheva et al. 2020, §3).

Methods (``METHODS``):

``mc-dropout``
    Monte Carlo dropout (Gal and Ghahramani 2016): the model stays in eval mode except its
    dropout, which is switched on with probability ``dropout``; N decodings of the whole source,
    pass ``i`` seeded with ``seed + i``.  Written as ``hyp.1.txt .. hyp.N.txt`` (one per pass).
``beam``
    The N best beams of one beam search (``num_beams = max(N, num_beams)``,
    ``num_return_sequences = N``), ranked: ``hyp.k.txt`` is beam rank k.  Rank 1 is usually
    the MT output itself; the paper's Table 1 uses ranks 2..5.
``diverse-beam``
    Diverse (group) beam search with Hamming diversity (Vijayakumar et al. 2016): N beams in
    ``num_beam_groups`` groups (default N: one beam per group); group g's log-probabilities at
    step t are lowered by ``diversity_penalty`` × (how often each token was chosen at step t by
    groups 1..g-1).  transformers 4.57 moved group beam search to a Hub repo (not reachable
    offline), so the groups are decoded here one after another with a logits processor; because
    group g depends only on groups < g, this equals the lock-step algorithm.
``sample``
    Ancestral sampling with nucleus (``top_p``) and ``temperature``; N samples per segment.

Several models (an ensemble) give one hypothesis set each, numbered consecutively
(model 1: ``hyp.1..hyp.N``, model 2: ``hyp.N+1..hyp.2N`` ...); ``manifest.json`` records which
file came from which model.  ``top.txt`` is the first model's deterministic output (dropout off,
``num_beams`` beams, greedy when 1): the translation ``o`` the hypotheses are compared with when
the MT output under evaluation came from this model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from uamt.core.errors import DataError, UamtError
from uamt.core.fileio import atomic_write_json, atomic_write_text

METHODS = ("mc-dropout", "beam", "diverse-beam", "sample")
DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How hypotheses are generated (CLI flags of ``uamt hypotheses generate``)."""

    method: str = "mc-dropout"
    n: int = 30  # hypotheses per segment and per model
    dropout: float = 0.3  # mc-dropout: probability of the hidden/residual dropout
    seed: int = 0
    batch_size: int = 16
    device: str = "cpu"
    num_beams: int = 1  # beam width of top.txt and of every mc-dropout pass (1 = greedy)
    max_new_tokens: int | None = None  # None = the model's generation config
    top_p: float = 0.9  # sample
    temperature: float = 1.0  # sample
    diversity_penalty: float = 0.5  # diverse-beam
    num_beam_groups: int | None = None  # diverse-beam; None = n (one beam per group)
    threads: int | None = None  # torch CPU threads; None = torch's default

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise DataError(f"method={self.method!r} not supported; choose from {sorted(METHODS)}")
        if self.device not in DEVICES:
            raise DataError(f"device={self.device!r} not supported; choose from {sorted(DEVICES)}")
        if self.threads is not None and self.threads < 1:
            raise DataError(f"threads must be >= 1, got {self.threads}")
        for name in ("n", "batch_size", "num_beams"):
            if getattr(self, name) < 1:
                raise DataError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise DataError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0.0 < self.dropout < 1.0 and self.method == "mc-dropout":
            raise DataError(f"dropout must be in (0, 1) for mc-dropout, got {self.dropout}")
        if not 0.0 < self.top_p <= 1.0:
            raise DataError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature <= 0:
            raise DataError(f"temperature must be > 0, got {self.temperature}")
        if self.method == "diverse-beam":
            groups = self.groups
            if groups < 1 or self.n % groups:
                raise DataError(f"num_beam_groups={groups} must be >= 1 and divide n={self.n}")
            if self.diversity_penalty < 0:
                raise DataError(f"diversity_penalty must be >= 0, got {self.diversity_penalty}")

    @property
    def groups(self) -> int:
        return self.num_beam_groups if self.num_beam_groups is not None else self.n


# ----------------------------------------------------------------------------------------------
# Model loading and MC dropout


def load_model(name_or_path: str, device: str = "cpu"):
    """Load a transformers seq2seq model and its tokenizer, in eval mode on ``device``.

    Raises :class:`UamtError` when the folder / hub id cannot be loaded or is not an
    encoder-decoder (``AutoModelForSeq2SeqLM``) model.
    """
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

    if device == "cuda" and not torch.cuda.is_available():
        raise UamtError("device='cuda' requested but torch sees no CUDA device; use --device cpu")
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise UamtError(f"model {name_or_path!r}: cannot load its config: {exc}") from exc
    if not getattr(config, "is_encoder_decoder", False):
        raise UamtError(
            f"model {name_or_path!r} (model_type={config.model_type!r}) is not a seq2seq "
            "encoder-decoder model; give an AutoModelForSeq2SeqLM model (Marian, NLLB, M2M100, mBART, T5)"
        )
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise UamtError(f"model {name_or_path!r}: cannot load it as a seq2seq model: {exc}") from exc
    model.to(device)
    model.eval()
    return model, tokenizer


#: Float attributes through which transformers layers apply functional dropout.
_DROPOUT_ATTRS = ("dropout", "activation_dropout", "attention_dropout")


@contextlib.contextmanager
def mc_dropout(model, p: float) -> Iterator[int]:
    """Switch dropout on at inference, leaving every other module in eval mode.

    * ``torch.nn.Dropout`` modules (T5 and most models): ``p`` set to ``p`` and put in train mode.
    * BART-family layers (Marian, M2M100/NLLB, mBART) apply ``nn.functional.dropout`` with a float
      attribute and ``self.training``: their hidden/residual ``dropout`` is set to ``p``, the
      attention and activation dropout keep the model's trained rates, and only these modules
      (not their children) are put in train mode.
    * LayerDrop (``layerdrop`` attributes, also gated by ``self.training``) is forced to 0, so the
      stochasticity is dropout only.

    Everything is restored on exit.  Yields the number of modules switched on.

    Raises
    ------
    UamtError
        If the model has no dropout at all.
    """
    import torch

    saved: list[tuple[Any, str, Any]] = []
    switched = 0
    for module in model.modules():
        is_attention = type(module).__name__.endswith("Attention")
        attrs = [a for a in _DROPOUT_ATTRS if isinstance(getattr(module, a, None), float)]
        if isinstance(module, torch.nn.Dropout):
            saved.append((module, "p", module.p))
            module.p = p
        elif attrs:
            if "dropout" in attrs and not is_attention:
                saved.append((module, "dropout", module.dropout))
                module.dropout = p
        else:
            continue
        if isinstance(getattr(module, "layerdrop", None), float):
            saved.append((module, "layerdrop", module.layerdrop))
            module.layerdrop = 0.0
        saved.append((module, "training", module.training))
        module.training = True  # this module only: children keep their own mode
        switched += 1
    if switched == 0:
        raise UamtError(
            f"model {type(model).__name__} has no dropout layers (no torch.nn.Dropout and no "
            f"{'/'.join(_DROPOUT_ATTRS)} attributes); MC dropout needs them: use another method"
        )
    try:
        yield switched
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)


# ----------------------------------------------------------------------------------------------
# Diverse beam search with sequential groups


class _GroupDiversity:
    """Logits processor of one beam group: records the tokens it picks per step, penalises
    tokens that earlier groups picked at the same step (Hamming diversity)."""

    def __init__(self, penalty: float, previous: Sequence[_GroupDiversity], beams: int):
        self.penalty = penalty
        self.previous = list(previous)
        self.beams = beams
        self.counts: dict[int, Any] = {}  # position -> tensor (batch, vocab) of token counts

    def __call__(self, input_ids, scores):
        import torch

        length = input_ids.shape[1]
        batch = input_ids.shape[0] // self.beams
        vocab = scores.shape[-1]
        # input_ids[:, -1] are the tokens this group's live beams chose at the previous step
        last = input_ids[:, -1].view(batch, self.beams)
        counts = torch.zeros(batch, vocab, dtype=scores.dtype, device=scores.device)
        counts.scatter_add_(1, last.clamp(max=vocab - 1), torch.ones_like(last, dtype=scores.dtype))
        self.counts[length - 1] = counts
        if self.penalty and self.previous:
            frequency = None
            for group in self.previous:
                c = group.counts.get(length)  # what earlier groups chose at the step being decided
                if c is not None:
                    frequency = c if frequency is None else frequency + c
            if frequency is not None:
                scores = scores - self.penalty * frequency.repeat_interleave(self.beams, dim=0)
        return scores


# ----------------------------------------------------------------------------------------------
# Decoding


def _batches(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _clean(text: str) -> str:
    # One segment per line: a newline inside a decoded string would break the alignment.
    return " ".join(text.replace("\r", " ").replace("\n", " ").split())


def decode(
    model,
    tokenizer,
    sources: Sequence[str],
    *,
    batch_size: int,
    seed: int | None = None,
    num_return_sequences: int = 1,
    progress=None,
    **generate_kwargs,
) -> list[list[str]]:
    """Translate ``sources``; returns ``num_return_sequences`` outputs per source, in rank order.

    ``seed`` (if given) seeds torch once before the first batch, so a decoding is reproducible for
    a fixed batch size and device.  ``progress`` is a tqdm bar advanced by one per batch.
    """
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    device = next(model.parameters()).device
    outputs: list[list[str]] = []
    for batch in _batches(sources, batch_size):
        encoded = tokenizer(batch, return_tensors="pt", padding=True, truncation=True).to(device)
        with torch.no_grad():
            generated = model.generate(
                **encoded, num_return_sequences=num_return_sequences, **generate_kwargs
            )
        texts = [_clean(t) for t in tokenizer.batch_decode(generated, skip_special_tokens=True)]
        for i in range(len(batch)):
            outputs.append(texts[i * num_return_sequences : (i + 1) * num_return_sequences])
        if progress is not None:
            progress.update(1)
    return outputs


def _length_kwargs(cfg: GenerationConfig) -> dict[str, Any]:
    return {} if cfg.max_new_tokens is None else {"max_new_tokens": cfg.max_new_tokens}


def top_outputs(model, tokenizer, sources, cfg: GenerationConfig, progress=None) -> list[str]:
    """The deterministic translation: dropout off, ``cfg.num_beams`` beams (greedy when 1)."""
    model.eval()
    out = decode(
        model,
        tokenizer,
        sources,
        batch_size=cfg.batch_size,
        progress=progress,
        do_sample=False,
        num_beams=cfg.num_beams,
        **_length_kwargs(cfg),
    )
    return [o[0] for o in out]


def hypotheses_for_model(model, tokenizer, sources, cfg: GenerationConfig, progress=None) -> list[list[str]]:
    """``cfg.n`` hypothesis streams (each aligned with ``sources``) from one model."""
    length = _length_kwargs(cfg)
    if cfg.method == "mc-dropout":
        streams = []
        with mc_dropout(model, cfg.dropout):
            for i in range(cfg.n):
                out = decode(
                    model,
                    tokenizer,
                    sources,
                    batch_size=cfg.batch_size,
                    seed=cfg.seed + i,
                    progress=progress,
                    do_sample=False,
                    num_beams=cfg.num_beams,
                    **length,
                )
                streams.append([o[0] for o in out])
        return streams
    if cfg.method in ("beam", "sample"):
        # The two differ only in the search: the n best beams, or n nucleus samples.
        if cfg.method == "beam":
            search = {"do_sample": False, "num_beams": max(cfg.n, cfg.num_beams)}
        else:
            search = {
                "do_sample": True,
                "num_beams": 1,
                "top_p": cfg.top_p,
                "top_k": 0,
                "temperature": cfg.temperature,
            }
        per_segment = decode(
            model,
            tokenizer,
            sources,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            num_return_sequences=cfg.n,
            progress=progress,
            **search,
            **length,
        )
    else:  # diverse-beam
        from transformers import LogitsProcessorList

        beams = cfg.n // cfg.groups
        per_segment: list[list[str]] = [[] for _ in sources]
        for start in range(0, len(sources), cfg.batch_size):
            batch = list(sources[start : start + cfg.batch_size])
            done: list[_GroupDiversity] = []  # the groups already decoded for this batch
            for _ in range(cfg.groups):
                processor = _GroupDiversity(cfg.diversity_penalty, done, beams)
                out = decode(
                    model,
                    tokenizer,
                    batch,
                    batch_size=len(batch),
                    seed=cfg.seed,
                    num_return_sequences=beams,
                    progress=progress,
                    do_sample=False,
                    num_beams=beams,
                    logits_processor=LogitsProcessorList([processor]),
                    **length,
                )
                done.append(processor)
                for i, o in enumerate(out):
                    per_segment[start + i].extend(o)
    return [[seg[k] for seg in per_segment] for k in range(cfg.n)]


# ----------------------------------------------------------------------------------------------
# Files


def read_sources(path: str | Path) -> list[str]:
    """Source segments, one per line; empty lines are refused (file and line named)."""
    from uamt.lexical import read_lines

    lines = read_lines(path)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise DataError(f"{path}:{number}: empty source line; every line must hold one segment")
    return lines


def _write_lines(path: Path, lines: Sequence[str]) -> None:
    atomic_write_text(path, "".join(f"{line}\n" for line in lines))


def generate(
    models: Sequence[str],
    source_path: str | Path,
    out_dir: str | Path,
    cfg: GenerationConfig,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Generate hypotheses for every source line with every model and write them to ``out_dir``.

    Writes ``top.txt``, ``hyp.1.txt .. hyp.{len(models) * n}.txt`` (each aligned with the source)
    and ``manifest.json``.  Everything is generated before anything is written, and each file is
    written to a temporary file then renamed, so a failure leaves no half-written set.

    Returns
    -------
    dict
        The manifest (models, method, n, seed, dropout, files, timings in seconds and
        ``ms_per_segment_per_hypothesis``).
    """
    from tqdm.auto import tqdm

    import uamt

    if not models:
        raise DataError("give at least one --model")
    out_dir = Path(out_dir)
    existing = sorted(out_dir.glob("hyp.*.txt")) + sorted(out_dir.glob("manifest.json"))
    if existing and not overwrite:
        raise UamtError(
            f"{out_dir} already holds hypotheses ({existing[0].name}, ...); pass --overwrite or use another folder"
        )
    sources = read_sources(source_path)
    if cfg.threads is not None:
        import torch

        torch.set_num_threads(cfg.threads)

    timings: dict[str, float] = {"load_s": 0.0, "top_s": 0.0, "hypotheses_s": 0.0}
    n_batches = -(-len(sources) // cfg.batch_size)
    passes = {"mc-dropout": cfg.n, "diverse-beam": cfg.groups}.get(cfg.method, 1)  # decodings per batch
    bar = tqdm(
        total=n_batches * (1 + passes * len(models)), desc=f"hypotheses ({cfg.method})", disable=not progress
    )
    streams: list[list[str]] = []
    provenance: list[dict[str, Any]] = []
    top: list[str] = []
    try:
        for index, name in enumerate(models):
            t0 = time.perf_counter()
            model, tokenizer = load_model(name, cfg.device)
            timings["load_s"] += time.perf_counter() - t0
            if index == 0:
                t0 = time.perf_counter()
                top = top_outputs(model, tokenizer, sources, cfg, progress=bar)
                timings["top_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            model_streams = hypotheses_for_model(model, tokenizer, sources, cfg, progress=bar)
            timings["hypotheses_s"] += time.perf_counter() - t0
            for k, stream in enumerate(model_streams, start=1):
                provenance.append({"model": str(name), "rank" if cfg.method != "mc-dropout" else "pass": k})
                streams.append(stream)
            del model
    finally:
        bar.close()

    for stream in [top, *streams]:
        if len(stream) != len(sources):  # pragma: no cover - guards the invariant the files rely on
            raise UamtError(f"internal error: {len(stream)} outputs for {len(sources)} sources")

    n_hyps = len(streams)
    timings["ms_per_segment_per_hypothesis"] = 1000.0 * timings["hypotheses_s"] / (len(sources) * n_hyps)
    timings["top_ms_per_segment"] = 1000.0 * timings["top_s"] / len(sources)
    import transformers

    manifest = {
        "models": [str(m) for m in models],
        "source": str(source_path),
        "n_segments": len(sources),
        "config": dataclasses.asdict(cfg),
        "method": cfg.method,
        "n": cfg.n,
        "seed": cfg.seed,
        "dropout": cfg.dropout if cfg.method == "mc-dropout" else None,
        "top": "top.txt",
        "hypotheses": [{"file": f"hyp.{k}.txt", **p} for k, p in enumerate(provenance, start=1)],
        "timings": timings,
        "versions": {"uamt": uamt.__version__, "transformers": transformers.__version__},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_lines(out_dir / "top.txt", top)
    for k, stream in enumerate(streams, start=1):
        _write_lines(out_dir / f"hyp.{k}.txt", stream)
    wanted = {f"hyp.{k}.txt" for k in range(1, n_hyps + 1)}
    for stale in out_dir.glob("hyp.*.txt"):  # a previous, larger run (only reached with overwrite)
        if stale.name not in wanted:
            stale.unlink()
    atomic_write_json(out_dir / "manifest.json", manifest, indent=2)
    return manifest
