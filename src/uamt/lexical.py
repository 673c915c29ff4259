"""Lexical sentence metrics (sacrebleu) with multiple references and multiple MT hypotheses.

Implements the scoring of Fomicheva, Specia and Guzmán (2020), *Multi-Hypothesis Machine
Translation Evaluation*, §4, for the lexical similarity functions sentence BLEU, chrF and TER.

Notation (paper §4): ``o`` is the MT output under evaluation, ``r`` the reference(s),
``H = {h_1..h_N}`` the additional hypotheses (MC-dropout passes, beams, other systems'
outputs used as pseudo-references) and ``H' = H ∪ {o}``.  ``sim(x, y)`` is the sentence metric
with ``x`` as the hypothesis and ``y`` as the reference.  With several references ``sim(x, r)``
is sacrebleu's multi-reference sentence score: BLEU counts n-gram matches against all
references (Papineni et al.), chrF keeps the best-scoring reference, TER the reference with the
fewest edits (the paper's footnote 6).

Every variant below has an ``avg``, ``min`` and ``max`` form (``*``):

=====================  ==================================================================
``mt-ref``             ``sim(o, r)``
``hyp-ref-*-micro``    ``*_{h in H'} sim(h, r)``  (the N+1 candidates, ``o`` included)
``hyp-ref-*-macro``    ``(*_{i} sim(h_i, r) + sim(o, r)) / 2``
``hyp-self-*``         ``*_{i != j} sim(h'_i, h'_j)`` over ordered pairs of ``H'``
                       (the metrics are asymmetric, so both directions are scored)
``hyp-mt-*``           ``*_{i} sim(h_i, o)``  (reference-free)
``hyp-mt-*-ref``       ``(*_{i} sim(h_i, o) + sim(o, r)) / 2``
=====================  ==================================================================

``min`` and ``max`` are the numeric minimum and maximum of the metric's own scores.  For BLEU
and chrF (higher is better) ``max`` is the closest candidate; for TER (an error rate, lower is
better) ``min`` is the closest.  Scores are reported on sacrebleu's 0–100 scale and never
sign-flipped, so correlations of TER variants with human quality scores are *negative* when
the metric works, exactly as in the paper's tables (e.g. TER mt-ref-1 = -0.413).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from uamt.core.errors import DataError
from uamt.core.stats import pearson_r

#: Supported similarity functions and whether a higher score means a better translation.
HIGHER_IS_BETTER: dict[str, bool] = {"bleu": True, "chrf": True, "ter": False}

#: How hypothesis scores are combined across the N hypotheses (paper §4: avg, min, max).
COMBINERS: dict[str, Callable[[np.ndarray], float]] = {
    "avg": lambda x: float(np.mean(x)),
    "min": lambda x: float(np.min(x)),
    "max": lambda x: float(np.max(x)),
}

#: Which references the hypothesis-based variants compare against.
HYP_REFS = ("all", "first")


def _check_metric(metric: str) -> str:
    if metric not in HIGHER_IS_BETTER:
        raise DataError(f"metric={metric!r} not supported; choose from {sorted(HIGHER_IS_BETTER)}")
    return metric


def make_metric(metric: str):
    """The sacrebleu metric object with sacrebleu's sentence-level defaults.

    BLEU: ``exp`` smoothing, 13a tokenisation, effective n-gram order (as
    ``sacrebleu.sentence_bleu``); chrF: character 6-grams, beta 2; TER: default settings.
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    _check_metric(metric)
    if metric == "bleu":
        return BLEU(effective_order=True)
    if metric == "chrf":
        return CHRF()
    return TER()


class _Similarity:
    """``sim(hypothesis, references)`` with a memo, because MC-dropout hypotheses repeat a lot."""

    def __init__(self, metric: str):
        self._metric = make_metric(metric)
        self._memo: dict[tuple[str, tuple[str, ...]], float] = {}

    def __call__(self, hypothesis: str, references: Sequence[str]) -> float:
        key = (hypothesis, tuple(references))
        value = self._memo.get(key)
        if value is None:
            value = float(self._metric.sentence_score(hypothesis, list(references)).score)
            self._memo[key] = value
        return value

    def clear(self) -> None:
        self._memo.clear()


def _as_streams(streams: Sequence[Sequence[str]] | Sequence[str], what: str) -> list[list[str]]:
    """Accept one stream (a list of strings) or several (a list of lists); return a list of lists."""
    streams = list(streams)
    if streams and all(isinstance(s, str) for s in streams):
        return [list(streams)]  # a single stream
    out = []
    for k, stream in enumerate(streams):
        if isinstance(stream, str):
            raise DataError(f"{what}: mix of strings and streams at position {k}")
        out.append(list(stream))
    return out


def _check_lengths(mt: Sequence[str], streams: Sequence[Sequence[str]], what: str) -> None:
    for k, stream in enumerate(streams, start=1):
        if len(stream) != len(mt):
            raise DataError(f"{what} {k} has {len(stream)} segments but mt has {len(mt)}")


#: Fewest pairs per worker process worth forking for (below it one process scores everything).
PARALLEL_MIN_PAIRS = 1000


def segment_scores(
    mt: Sequence[str], refs: Sequence[Sequence[str]] | Sequence[str], metric: str
) -> np.ndarray:
    """Sentence-level scores of ``mt`` against one or several reference streams.

    Parameters
    ----------
    mt : sequence of str, length n
        Translations, one per segment.
    refs : sequence of reference streams, each of length n (or a single stream of str)
        With several streams, segment ``i`` is scored against ``[ref[i] for ref in refs]`` with
        sacrebleu's multi-reference sentence score.
    metric : {"bleu", "chrf", "ter"}

    Returns
    -------
    np.ndarray, shape (n,), float64
        Scores on sacrebleu's 0–100 scale; TER is an error rate (lower is better).
    """
    _check_metric(metric)
    streams = _as_streams(refs, "refs")
    if not streams:
        raise DataError("segment_scores needs at least one reference stream")
    _check_lengths(mt, streams, "reference")
    pairs = [(o, tuple(s[i] for s in streams)) for i, o in enumerate(mt)]
    workers = min(_cpu_count(), len(pairs) // PARALLEL_MIN_PAIRS)
    if workers < 2:
        return np.array(_score_pairs(metric, pairs), dtype=np.float64)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # sacrebleu is pure Python (TER on 10k WMT pairs: ~95 s on one core), so big batches are cut
    # into chunks scored by worker processes: the same scores, in the same order. Forked, not
    # spawned: a child only runs sacrebleu (no torch threads), and spawning would re-import the
    # calling stage.
    size = -(-len(pairs) // (4 * workers))
    chunks = [pairs[start : start + size] for start in range(0, len(pairs), size)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        scored = pool.map(_score_pairs, [metric] * len(chunks), chunks)
        return np.array([value for chunk in scored for value in chunk], dtype=np.float64)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _score_pairs(metric: str, pairs: Sequence[tuple[str, tuple[str, ...]]]) -> list[float]:
    """``sim(hypothesis, references)`` of each ``(hypothesis, references)`` pair."""
    sim = _Similarity(metric)
    return [sim(hypothesis, references) for hypothesis, references in pairs]


def reference_variants(
    mt: Sequence[str], refs: Sequence[Sequence[str]] | Sequence[str], metric: str
) -> dict[str, np.ndarray]:
    """``mt-ref`` for a single reference; ``mt-ref-1..K`` and ``mt-ref-multi`` for K > 1 references."""
    streams = _as_streams(refs, "refs")
    if len(streams) == 1:
        return {"mt-ref": segment_scores(mt, streams, metric)}
    out = {f"mt-ref-{k}": segment_scores(mt, [s], metric) for k, s in enumerate(streams, start=1)}
    out["mt-ref-multi"] = segment_scores(mt, streams, metric)
    return out


def multihyp_variants(
    mt: Sequence[str],
    refs: Sequence[Sequence[str]] | Sequence[str],
    hyps: Sequence[Sequence[str]],
    metric: str,
    *,
    prefix: str = "hyp",
    hyp_refs: str = "all",
) -> dict[str, np.ndarray]:
    """Every scoring variant of paper §4 for one set of additional hypotheses.

    Parameters
    ----------
    mt : sequence of str, length n
        The MT output ``o`` under evaluation.
    refs : sequence of reference streams (each length n), possibly empty
        With no references only the reference-free variants (``hyp-self-*``, ``hyp-mt-*``) are
        returned.
    hyps : sequence of N >= 1 hypothesis streams, each of length n
        Additional hypotheses ``h_1..h_N`` (e.g. the files ``hyp.1.txt .. hyp.N.txt``) or
        pseudo-references (outputs of other MT systems).
    metric : {"bleu", "chrf", "ter"}
    prefix : str
        Name prefix of the hypothesis variants: ``"hyp"`` (model hypotheses) or ``"pseudo"``
        (other systems' outputs, the paper's ``pseudo-mt-*``).
    hyp_refs : {"all", "first"}
        References used inside the hypothesis variants: all of them (multi-reference ``sim``)
        or only the first (the paper's Table 2 uses ref-1 for every variant but mt-ref-multi).

    Returns
    -------
    dict of str -> np.ndarray, shape (n,)
        The ``mt-ref`` variants (see :func:`reference_variants`) and, for each combination
        ``*`` in avg/min/max: ``{prefix}-ref-*-micro``, ``{prefix}-ref-*-macro``,
        ``{prefix}-self-*``, ``{prefix}-mt-*`` and ``{prefix}-mt-*-ref``.  Scores are on the
        metric's 0–100 scale and keep its direction (TER: lower is better).
    """
    _check_metric(metric)
    if hyp_refs not in HYP_REFS:
        raise DataError(f"hyp_refs={hyp_refs!r} not supported; choose from {list(HYP_REFS)}")
    ref_streams = _as_streams(refs, "refs") if len(refs) else []
    hyp_streams = _as_streams(hyps, "hyps")
    if not hyp_streams:
        raise DataError("multihyp_variants needs at least one hypothesis stream")
    _check_lengths(mt, ref_streams, "reference")
    _check_lengths(mt, hyp_streams, "hypothesis")
    used_refs = ref_streams[:1] if hyp_refs == "first" else ref_streams

    n = len(mt)
    out: dict[str, np.ndarray] = reference_variants(mt, ref_streams, metric) if ref_streams else {}
    patterns = ["ref-{}-micro", "ref-{}-macro", "mt-{}-ref"] if used_refs else []
    patterns += ["mt-{}", "self-{}"]
    names = [f"{prefix}-{pattern.format(comb)}" for pattern in patterns for comb in COMBINERS]
    values = {name: np.empty(n, dtype=np.float64) for name in names}

    sim = _Similarity(metric)
    for i, o in enumerate(mt):
        sim.clear()  # memo per segment: keeps memory flat on large test sets
        h = [stream[i] for stream in hyp_streams]
        candidates = h + [o]  # H'
        hyp_mt = np.array([sim(x, [o]) for x in h])
        self_pairs = np.array(
            [sim(a, [b]) for ia, a in enumerate(candidates) for ib, b in enumerate(candidates) if ia != ib]
        )
        if used_refs:
            r = [stream[i] for stream in used_refs]
            mt_ref = sim(o, r)
            hyp_ref = np.array([sim(x, r) for x in h])
            hyp_ref_all = np.append(hyp_ref, mt_ref)
        for comb, f in COMBINERS.items():
            values[f"{prefix}-self-{comb}"][i] = f(self_pairs)
            values[f"{prefix}-mt-{comb}"][i] = f(hyp_mt)
            if used_refs:
                values[f"{prefix}-ref-{comb}-micro"][i] = f(hyp_ref_all)
                values[f"{prefix}-ref-{comb}-macro"][i] = (f(hyp_ref) + mt_ref) / 2.0
                values[f"{prefix}-mt-{comb}-ref"][i] = (f(hyp_mt) + mt_ref) / 2.0
    out.update(values)
    return out


def correlations(variants: Mapping[str, np.ndarray], human: np.ndarray) -> dict[str, float]:
    """Pearson correlation of every variant with the human scores.

    Parameters
    ----------
    variants : mapping of name -> array, shape (n,)
    human : array, shape (n,)
        Human quality scores (e.g. DA z-scores, higher is better).

    Returns
    -------
    dict of str -> float
        Pearson r in [-1, 1], sign as computed: TER variants correlate negatively with DA when
        they work.  NaN where a variant is constant (correlation undefined).
    """
    human = np.asarray(human, dtype=np.float64)
    if human.ndim != 1 or len(human) < 2:
        raise DataError(f"human scores must be a 1-d array with >= 2 values, got shape {human.shape}")
    out = {}
    for name, scores in variants.items():
        scores = np.asarray(scores, dtype=np.float64)
        if scores.shape != human.shape:
            raise DataError(f"variant {name!r} has shape {scores.shape} but human scores {human.shape}")
        out[name] = pearson_r(scores, human)
    return out


# ----------------------------------------------------------------------------------------------
# Reading aligned text files


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file, one segment per line (``\\n`` or ``\\r\\n``).

    Only ``\\n`` separates segments (``str.splitlines`` would also split on U+2028 and friends
    and break the alignment); a leading UTF-8 byte-order mark is dropped.  Raises
    :class:`DataError` for a missing or empty file and for bytes that are not UTF-8, naming the
    file and the 1-based line.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte-order mark (Windows editors) is not part of the first segment
    if not data:  # "\n\n" is two empty segments (e.g. empty MT outputs), not an empty file
        raise DataError(f"{path}: file is empty")
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the final newline ends the last line, it does not start a new one
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}:{number}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    return lines


def read_scores(path: str | Path) -> np.ndarray:
    """Human scores, one number per line; raises :class:`DataError` naming file and line otherwise."""
    values = []
    for number, line in enumerate(read_lines(path), start=1):
        try:
            value = float(line.strip())
        except ValueError:
            raise DataError(f"{path}:{number}: human score {line.strip()!r} is not a number") from None
        if not np.isfinite(value):
            raise DataError(f"{path}:{number}: human score {line.strip()!r} is not finite")
        values.append(value)
    return np.array(values, dtype=np.float64)


def check_aligned(named: Mapping[str, Sequence]) -> int:
    """All files have the same number of segments; return it, else name both files and counts."""
    items = list(named.items())
    first_name, first = items[0]
    for name, values in items[1:]:
        if len(values) != len(first):
            raise DataError(
                f"line counts differ: {first_name} has {len(first)} lines but {name} has {len(values)}"
            )
    return len(first)
