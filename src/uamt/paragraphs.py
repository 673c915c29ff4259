"""Paragraphs scored sentence by sentence: the model's μ for a multi-sentence row.

The network reads a text as one pooled vector, so one sentence dropped from five barely moves a
paragraph's score.  Here a multi-sentence row is cut into sentences
(:func:`uamt.surface_features.sentences`), the translation's sentences are aligned to the
reference's (:func:`align_sentences`), every aligned (source, translation, reference) unit is
scored by the same network, and the row's μ becomes a least-squares blend (fitted per language
pair when the model is trained, on the rows of ``train_base.paragraph_splits`` it never trained on,
:func:`fit_blend`) of

* ``paragraph``: the network's μ of the whole row,
* ``sum``: the sum of its units' μ (MQM penalties add up over a paragraph's errors),
* ``omitted``: reference sentences no translation sentence aligns to,
* ``added``: translation sentences aligned to no reference sentence,

and an intercept, expressed in the units of the network's μ for the rows it scores whole (one
level for both kinds of row, :func:`fit_blend`).  Single-sentence rows, rows whose source and
reference have different sentence counts (the source of a reference sentence is then unknown), rows
of a language pair with too few multi-sentence fitting rows or whose units add nothing there (an
F-test, :func:`fit_blend`) and rows given without ``lp`` keep the network's μ.  The
blend is part of the model's ``predict``, so calibration, evaluation, the gates and the served
distribution all see it (benchmarks/sentence_scoring.py measured it first; docs/quality.md).

A reference-free model has no reference to align to: its blend (``alignment="source"``) aligns the
translation's sentences to the source's by their length (:func:`align_by_length`, the source's
lengths scaled by the pair's median translation/source ratio), scores (source, translation) units, and
counts unaligned source sentences as ``omitted``; a row whose source is one sentence is scored
whole.  It reads nothing a request without a reference lacks.  Every blend's weights keep the signs
of :data:`SIGNS`.

Only μ changes; σ and the variance parts stay the network's for the whole row, and the calibration
fitted afterwards on this μ's errors sets the served width.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.core.errors import UamtError
from uamt.core.stats import pearson_r
from uamt.surface_features import sentences

#: A link is kept where its sentence chrF (0-1) reaches this; below it both sides stay unaligned.
#: 0.1 and 0.2 gave the same test Pearson on WMT23 en-de (.723 both, docs/quality.md).
MIN_CHRF = 0.2
#: Key of the blend in a model's ``model.json``.
MANIFEST_KEY = "paragraphs"
#: Columns of the blend's least squares (``1``: the intercept).
COLUMNS = ("1", "paragraph", "sum", "omitted", "added")
#: A language pair with fewer multi-sentence dev rows than this keeps the whole-row μ.
MIN_FIT_ROWS = 50
#: The blend is adopted for a pair where the F-test of the units against the whole-row μ gives p
#: below this (strict: rows of one document are not independent).
MAX_P = 1e-3
#: Rows whose alignment one process remembers (calibration predicts the same rows for many models).
REMEMBERED_ROWS = 2**16
#: Reference-free alignment: a link is kept where the shorter side reaches this share of the longer
#: one (lengths in characters, the source's scaled by the pair's translation/source ratio).  0.3, 0.5
#: and 0.7 gave the HTS QE model about the same en-de fit (F 225 / 221 / 202 on dev + d_e) and test
#: Pearson (WMT23 en-de .639 / .635 / .624; free weights, before :data:`SIGNS`; docs/quality.md).
MIN_LENGTH_RATIO = 0.5
#: What a 2-1 or 1-2 link of the length alignment gives up against two 1-1 links of equal ratio:
#: lengths alone cannot tell a merge from two sentences, and translations keep the source's
#: sentences far more often than they merge them.
MERGE_PENALTY = 0.05
#: How a blend aligns a row's sentences: to the reference's by chrF, or to the source's by length.
ALIGNMENTS = ("reference", "source")
#: sacrebleu's chrF: character n-grams up to 6, beta 2, white space removed.
CHAR_ORDER = 6
BETA = 2.0

Unit = tuple[str, str, str]


@dataclass(frozen=True)
class ParagraphUnits:
    """A multi-sentence row cut into aligned (src, mt, ref) ``units``, with the counts of reference
    sentences left unaligned (``omitted``) and of translation sentences left unaligned (``added``)."""

    units: tuple[Unit, ...]
    omitted: int
    added: int


def _char_ngrams(text: str) -> list[Counter]:
    line = "".join(text.split())
    return [Counter(line[i : i + n] for i in range(len(line) - n + 1)) for n in range(1, CHAR_ORDER + 1)]


def chrf_from_ngrams(hyp: list[Counter], ref: list[Counter]) -> float:
    """Sentence chrF on a 0-1 scale from :func:`_char_ngrams` counters: sacrebleu 2's ``CHRF()``
    (precision and recall averaged over the orders both texts have, then F-beta), so a paragraph's
    n-grams are counted once and every candidate link costs only the intersections."""
    precision = recall = 0.0
    orders = 0
    for hyp_n, ref_n in zip(hyp, ref, strict=True):
        n_hyp, n_ref = sum(hyp_n.values()), sum(ref_n.values())
        if n_hyp and n_ref:
            # the clipped matches, summed over the shared n-grams without building the
            # intersection Counter (``sum((hyp_n & ref_n).values())``, the same integer; 2/3 of the
            # alignment's time went to building it)
            match = sum(min(hyp_n[gram], ref_n[gram]) for gram in hyp_n.keys() & ref_n.keys())
            precision += match / n_hyp
            recall += match / n_ref
            orders += 1
    if not orders:
        return 0.0
    precision, recall = precision / orders, recall / orders
    if precision + recall == 0:
        return 0.0
    factor = BETA**2
    return (1 + factor) * precision * recall / (factor * precision + recall)


def _span_ngrams(pieces: list[str]) -> dict[tuple[int, int], list[Counter]]:
    """N-grams of every span of one or two consecutive sentences, keyed by (start, stop)."""
    return {
        (i, i + k): _char_ngrams(" ".join(pieces[i : i + k]))
        for k in (1, 2)
        for i in range(len(pieces) - k + 1)
    }


def _monotone_alignment(n: int, m: int, gain: Callable[[int, int, int, int], float]):
    """The monotone alignment of n left and m right sentences that maximises the summed ``gain(i, a,
    j, b)`` of its links (left ``i:a`` with right ``j:b``: 1-1, 1-2 and 2-1), a sentence left
    unaligned gaining 0 (dynamic programming over (i, j)).  Returns ``(links, unaligned_left,
    unaligned_right)``: links as (left indices, right indices) tuples, the others sorted indices."""
    best = np.full((n + 1, m + 1), -np.inf)
    back: dict[tuple[int, int], tuple[int, int]] = {}
    best[0, 0] = 0.0
    for i in range(n + 1):
        for j in range(m + 1):
            if not math.isfinite(best[i, j]):
                continue
            for di, dj in ((1, 1), (1, 2), (2, 1), (1, 0), (0, 1)):
                a, b = i + di, j + dj
                if a > n or b > m:
                    continue
                step = gain(i, a, j, b) if di and dj else 0.0
                if best[i, j] + step > best[a, b]:
                    best[a, b] = best[i, j] + step
                    back[(a, b)] = (i, j)
    links, unaligned_left, unaligned_right = [], [], []
    a, b = n, m
    while (a, b) != (0, 0):
        i, j = back[(a, b)]
        if a > i and b > j:
            links.append((tuple(range(i, a)), tuple(range(j, b))))
        elif a > i:
            unaligned_left.append(i)
        else:
            unaligned_right.append(j)
        a, b = i, j
    return links[::-1], sorted(unaligned_left), sorted(unaligned_right)


def align_sentences(mt: list[str], ref: list[str], min_chrf: float = MIN_CHRF):
    """Monotonic alignment of translation sentences ``mt`` to reference sentences ``ref``.

    Links are 1-1, 2-1 (two translation sentences for one reference sentence: a split) and 1-2 (a
    merge); a link gains its sentence chrF minus ``min_chrf``, a sentence left unaligned gains 0,
    and the alignment maximises the total (dynamic programming over (i, j)).

    Returns
    -------
    links : list of (ref indices, mt indices) tuples
    unaligned_ref, unaligned_mt : sorted lists of indices
    """
    ref_grams, mt_grams = _span_ngrams(ref), _span_ngrams(mt)
    return _monotone_alignment(
        len(ref), len(mt), lambda i, a, j, b: chrf_from_ngrams(mt_grams[(j, b)], ref_grams[(i, a)]) - min_chrf
    )


def _length(text: str) -> int:
    return len("".join(text.split()))


def align_by_length(src: list[str], mt: list[str], min_ratio: float = MIN_LENGTH_RATIO, scale: float | None = None):
    r"""Monotonic alignment of translation sentences ``mt`` to source sentences ``src`` by length
    (reference-free; Gale and Church's idea without their probability model).

    With :math:`c` = ``scale``, the language pair's translation/source length ratio (characters,
    white space removed; :func:`length_scales`; None: the row's own, which a dropped long sentence
    shrinks), a link of source span :math:`S` and translation span :math:`T` gains
    :math:`\min(c|S|, |T|)/\max(c|S|, |T|)` minus ``min_ratio``, minus :data:`MERGE_PENALTY` for
    a 2-1 or 1-2 link; a sentence left unaligned gains 0 (:func:`_monotone_alignment`).

    Returns
    -------
    links : list of (src indices, mt indices) tuples
    unaligned_src, unaligned_mt : sorted lists of indices
    """
    src_len, mt_len = [_length(t) for t in src], [_length(t) for t in mt]
    if scale is None or not scale > 0:
        scale = max(sum(mt_len), 1) / max(sum(src_len), 1)

    def gain(i: int, a: int, j: int, b: int) -> float:
        left, right = scale * sum(src_len[i:a]), float(sum(mt_len[j:b]))
        ratio = min(left, right) / max(left, right) if max(left, right) > 0 else 0.0
        return ratio - min_ratio - (MERGE_PENALTY if a - i + b - j > 2 else 0.0)

    return _monotone_alignment(len(src), len(mt), gain)


@lru_cache(maxsize=REMEMBERED_ROWS)
def _units(src: str, mt: str, ref: str, min_chrf: float) -> ParagraphUnits | None:
    src_s, mt_s, ref_s = sentences(src), sentences(mt), sentences(ref)
    if len(src_s) != len(ref_s) or not mt_s or max(len(ref_s), len(mt_s)) < 2:
        return None
    links, unaligned_ref, unaligned_mt = align_sentences(mt_s, ref_s, min_chrf)
    units = tuple(
        (" ".join(src_s[i] for i in r), " ".join(mt_s[j] for j in t), " ".join(ref_s[i] for i in r))
        for r, t in links
    )
    return ParagraphUnits(units, len(unaligned_ref), len(unaligned_mt))


def paragraph_units(src, mt, ref, min_chrf: float = MIN_CHRF) -> ParagraphUnits | None:
    """The aligned units of one row, or None where the row is scored whole: a single sentence on
    both sides, source and reference with different sentence counts, no reference, or an empty
    translation.  Remembered per process (:data:`REMEMBERED_ROWS` rows)."""
    if not all(isinstance(text, str) and text.strip() for text in (src, mt, ref)):
        return None
    return _units(src, mt, ref, float(min_chrf))


def length_scales(frame: pd.DataFrame) -> dict[str, float]:
    """Per language pair of ``frame`` (columns ``lp, src, mt``), the median translation/source
    length ratio of its rows (characters, white space removed): the ``scale`` of :func:`align_by_length`."""
    if "lp" not in frame.columns or not len(frame):
        return {}
    src = np.array([_length(t) if isinstance(t, str) else 0 for t in frame["src"].tolist()], dtype=float)
    mt = np.array([_length(t) if isinstance(t, str) else 0 for t in frame["mt"].tolist()], dtype=float)
    lps = frame["lp"].astype(str).to_numpy()
    usable = (src > 0) & (mt > 0)
    return {lp: float(np.median(mt[usable & (lps == lp)] / src[usable & (lps == lp)])) for lp in sorted(set(lps[usable].tolist()))}


@lru_cache(maxsize=REMEMBERED_ROWS)
def _source_units(src: str, mt: str, min_ratio: float, scale: float | None) -> ParagraphUnits | None:
    src_s, mt_s = sentences(src), sentences(mt)
    # One source sentence is one unit: there is nothing to cut, and a translation made longer than
    # it (a duplicated sentence, say) is judged by the whole-row network, as before the blend.
    if len(src_s) < 2 or not mt_s:
        return None
    links, unaligned_src, unaligned_mt = align_by_length(src_s, mt_s, min_ratio, scale)
    units = tuple((" ".join(src_s[i] for i in s), " ".join(mt_s[j] for j in t), "") for s, t in links)
    return ParagraphUnits(units, len(unaligned_src), len(unaligned_mt))


def source_units(src, mt, min_ratio: float = MIN_LENGTH_RATIO, scale: float | None = None) -> ParagraphUnits | None:
    """The reference-free units of one row (:func:`align_by_length` with the pair's length
    ``scale``; each unit's reference is "", ``omitted`` counts unaligned source sentences), or None
    where the row is scored whole: a source of one sentence (its translation duplicated into two
    scored whole, as the network reads it, and not as one unit plus an addition: with the HTS QE
    blend of 2026-11-30 a duplicated en-ru sentence rose above its original), or an empty source or
    translation.  Remembered per process."""
    if not all(isinstance(text, str) and text.strip() for text in (src, mt)):
        return None
    return _source_units(src, mt, float(min_ratio), None if scale is None else float(scale))


def row_units(
    frame: pd.DataFrame,
    alignment: str = "reference",
    min_chrf: float = MIN_CHRF,
    min_length_ratio: float = MIN_LENGTH_RATIO,
    scales: dict[str, float] | None = None,
) -> list[ParagraphUnits | None]:
    """Per row of ``frame`` its units under ``alignment`` (:data:`ALIGNMENTS`): to the reference
    (:func:`paragraph_units`; every row whole where ``frame`` has no ``ref``) or to the source
    (:func:`source_units`, which never reads ``ref``; each row with its pair's length ratio from
    ``scales``, else :func:`length_scales` of ``frame`` itself)."""
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment={alignment!r} not supported; choose from {sorted(ALIGNMENTS)}")
    src, mt = frame["src"].tolist(), frame["mt"].tolist()
    if alignment == "source":
        scales = length_scales(frame) if scales is None else scales
        lps = frame["lp"].astype(str).tolist() if "lp" in frame.columns else [None] * len(frame)
        return [source_units(s, t, min_length_ratio, scales.get(lp)) for s, t, lp in zip(src, mt, lps, strict=True)]
    if "ref" not in frame.columns:
        return [None] * len(frame)
    return [paragraph_units(s, t, r, min_chrf) for s, t, r in zip(src, mt, frame["ref"].tolist(), strict=True)]


def unit_texts(frame: pd.DataFrame, min_chrf: float = MIN_CHRF, min_length_ratio: float = MIN_LENGTH_RATIO) -> list[str]:
    """The distinct texts of every unit of ``frame``'s multi-sentence rows under both alignments
    (what the encode stage stores ahead, so that no model encodes them on demand)."""
    seen: dict[str, None] = {}
    for alignment in ALIGNMENTS:
        for found in row_units(frame, alignment, min_chrf, min_length_ratio):
            for unit in found.units if found is not None else ():
                seen.update(dict.fromkeys(text for text in unit if text))
    return list(seen)


Predict = Callable[[pd.DataFrame], pd.DataFrame]


def blend_inputs(
    predict: Predict,
    frame: pd.DataFrame,
    min_chrf: float = MIN_CHRF,
    rows: np.ndarray | None = None,
    alignment: str = "reference",
    min_length_ratio: float = MIN_LENGTH_RATIO,
    scales: dict[str, float] | None = None,
):
    """``(whole, inputs)``: the network's predictions for ``frame`` (``predict``: rows -> DataFrame
    with ``mu`` on the score scale) and, per row, the blend's inputs ``paragraph, sum, omitted,
    added`` (NaN where the row is scored whole, or is not among ``rows``, a boolean mask), its units
    aligned as ``alignment`` says (:func:`row_units`; ``"source"`` units carry no ``ref``, and
    ``scales`` are the pairs' length ratios, those of ``frame`` when None).  Units
    are scored in one call of ``predict``."""
    whole = predict(frame)
    inputs = pd.DataFrame(np.nan, index=range(len(frame)), columns=list(COLUMNS[1:]))
    if not len(frame):
        return whole, inputs
    if alignment == "source" and scales is None:
        scales = length_scales(frame)
    selected = frame if rows is None else frame[np.asarray(rows, dtype=bool)]
    found_units = row_units(selected, alignment, min_chrf, min_length_ratio, scales)
    positions = np.arange(len(frame)) if rows is None else np.flatnonzero(rows)
    lps = frame["lp"].tolist() if "lp" in frame.columns else [None] * len(frame)
    unit_rows: list[dict] = []
    owner: list[int] = []
    gaps: dict[int, tuple[int, int]] = {}
    for k, found in zip(positions.tolist(), found_units, strict=True):
        if found is None:
            continue
        gaps[k] = (found.omitted, found.added)
        for u_src, u_mt, u_ref in found.units:
            unit_rows.append({"src": u_src, "mt": u_mt, "ref": u_ref, "lp": lps[k]})
            owner.append(k)
    if not gaps:
        return whole, inputs
    units = pd.DataFrame(unit_rows, columns=["src", "mt", "ref", "lp"])
    if "lp" not in frame.columns:
        units = units.drop(columns="lp")
    if alignment == "source":
        units = units.drop(columns="ref")
    unit_mu = predict(units)["mu"].to_numpy(dtype=float) if len(units) else np.empty(0)
    sums = np.bincount(np.asarray(owner, dtype=int), weights=unit_mu, minlength=len(frame))
    split = np.fromiter(gaps, dtype=int)
    inputs.loc[split, "paragraph"] = whole["mu"].to_numpy(dtype=float)[split]
    inputs.loc[split, "sum"] = sums[split]
    inputs.loc[split, ["omitted", "added"]] = np.array([gaps[k] for k in split], dtype=float)
    return whole, inputs


def _design(inputs: pd.DataFrame) -> np.ndarray:
    return np.column_stack([np.ones(len(inputs)), inputs[list(COLUMNS[1:])].to_numpy(dtype=float)])


#: The sign each input's weight may take (intercept free): a worse whole row or worse units lower
#: the score, so do an omitted or an added sentence.
SIGNS = (0, 1, 1, -1, -1)


def _lstsq(inputs: pd.DataFrame, human: np.ndarray) -> np.ndarray:
    """Least squares of ``human`` on :data:`COLUMNS`, held to :data:`SIGNS` where the free fit breaks
    them (bounded least squares; the free fit where it keeps them).  Free, the HTS QE en-de blend
    weighed the whole row -0.985 against the units' sum 1.881 (collinear inputs), so a failure the
    whole row sees but its units less so (gibberish) scored above its original more often."""
    design = _design(inputs)
    free = np.linalg.lstsq(design, human, rcond=None)[0]
    signs = np.asarray(SIGNS)
    if np.all(free * signs >= 0):
        return free
    from scipy.optimize import lsq_linear

    lower = np.where(signs > 0, 0.0, -np.inf)
    upper = np.where(signs < 0, 0.0, np.inf)
    return lsq_linear(design, human, bounds=(lower, upper)).x


@dataclass(frozen=True)
class ParagraphBlend:
    """Per language pair, the weights of :data:`COLUMNS` (inputs on the score scale, the blended μ
    in the units of the pair's whole-row μ: :func:`fit_blend`), the ``alignment`` of its units
    (:data:`ALIGNMENTS`: to the reference by chrF, or, for a reference-free model, to the source by
    length) with its threshold, and ``report``: what :func:`fit_blend` found per pair of the rows it
    was fitted on (stored under ``dev`` in the manifest, the key of the time it was fitted on dev
    alone; ``fitted_on`` beside it names the splits)."""

    weights: dict[str, tuple[float, ...]]
    min_chrf: float = MIN_CHRF
    report: dict[str, dict] = field(default_factory=dict)
    alignment: str = "reference"
    min_length_ratio: float = MIN_LENGTH_RATIO
    #: Source alignment: per pair, the translation/source length ratio of the fitting rows.
    length_scales: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.alignment not in ALIGNMENTS:
            raise UamtError(f"paragraph blend: alignment={self.alignment!r} not supported; choose from {sorted(ALIGNMENTS)}")
        for lp, weights in self.weights.items():
            if len(weights) != len(COLUMNS) or not all(math.isfinite(w) for w in weights):
                raise UamtError(
                    f"paragraph blend of {lp}: {len(COLUMNS)} finite weights for {list(COLUMNS)} expected, got {list(weights)}"
                )

    def to_dict(self) -> dict:
        return {
            "columns": list(COLUMNS),
            "weights": {lp: [float(w) for w in weights] for lp, weights in sorted(self.weights.items())},
            "alignment": self.alignment,
            **(
                {"min_length_ratio": self.min_length_ratio, "length_scales": dict(sorted(self.length_scales.items()))}
                if self.alignment == "source"
                else {"min_chrf": self.min_chrf}
            ),
            "dev": self.report,
        }

    @classmethod
    def from_manifest(cls, meta: dict, where) -> ParagraphBlend | None:
        """The blend a model manifest (``model.json``) records, None where it records none."""
        return cls.from_dict(meta.get(MANIFEST_KEY), f"{where}:{MANIFEST_KEY}")

    @classmethod
    def from_model_dir(cls, model_dir) -> ParagraphBlend | None:
        """:meth:`from_manifest` of the model folder ``model_dir`` (read without torch: the ONNX head)."""
        path = Path(model_dir) / "model.json"
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UamtError(f"{path}: cannot read the model manifest ({exc})") from None
        return cls.from_manifest(meta, path)

    @classmethod
    def from_dict(cls, fields: dict | None, where: str) -> ParagraphBlend | None:
        """The blend a model manifest records under ``paragraphs`` (None: none fitted), else
        UamtError naming ``where``."""
        if not fields or not fields.get("weights"):
            return None
        try:
            if list(fields["columns"]) != list(COLUMNS):
                raise ValueError(f"columns {fields['columns']}, expected {list(COLUMNS)}")
            weights = {str(lp): tuple(float(w) for w in values) for lp, values in dict(fields["weights"]).items()}
            return cls(
                weights,
                float(fields.get("min_chrf", MIN_CHRF)),
                dict(fields.get("dev") or {}),
                str(fields.get("alignment", "reference")),  # manifests before 2026-11-30: the reference
                float(fields.get("min_length_ratio", MIN_LENGTH_RATIO)),
                {str(lp): float(c) for lp, c in dict(fields.get("length_scales") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, UamtError) as exc:
            raise UamtError(f"{where}: unusable paragraph blend ({exc})") from None

    def units(self, frame: pd.DataFrame) -> list[ParagraphUnits | None]:
        """Per row of ``frame`` its units under this blend's alignment (:func:`row_units`)."""
        return row_units(frame, self.alignment, self.min_chrf, self.min_length_ratio, self.length_scales)

    def blended_rows(self, frame: pd.DataFrame) -> np.ndarray:
        """Which rows of ``frame`` (columns ``src, mt, lp``, and ``ref`` for the reference
        alignment) :meth:`apply` blends, shape [n] bool: multi-sentence rows of a language pair the
        blend was fitted for whose units align (:meth:`units`); every other row keeps the whole-row μ."""
        out = np.zeros(len(frame), dtype=bool)
        if "lp" not in frame.columns:
            return out
        fitted = np.isin(frame["lp"].astype(str).to_numpy(), list(self.weights))
        out[np.flatnonzero(fitted)] = [found is not None for found in self.units(frame[fitted])]
        return out

    def apply(self, predict: Predict, frame: pd.DataFrame) -> pd.DataFrame:
        """``predict(frame)`` with ``mu`` replaced by the blend on the multi-sentence rows of the
        language pairs (column ``lp``) it was fitted for; other rows, and every row of a frame
        without ``lp``, keep the whole-row μ."""
        if "lp" not in frame.columns:
            return predict(frame)
        lps = frame["lp"].astype(str).to_numpy()
        fitted = np.isin(lps, list(self.weights))
        if not fitted.any():
            return predict(frame)
        whole, inputs = blend_inputs(
            predict, frame, self.min_chrf, fitted, self.alignment, self.min_length_ratio, self.length_scales
        )
        has = inputs["sum"].notna().to_numpy()
        if has.any():
            whole = whole.copy()
            mu = whole["mu"].to_numpy(dtype=float).copy()
            for lp in np.unique(lps[has]):
                rows = has & (lps == lp)
                mu[rows] = _design(inputs[rows]) @ np.asarray(self.weights[lp])
            whole["mu"] = mu
        return whole


def units_f_test(inputs: pd.DataFrame, human: np.ndarray) -> tuple[float, float]:
    """``(F, p)`` of the nested least squares on multi-sentence rows: the blend (:data:`COLUMNS`)
    against the whole-row μ alone (intercept and μ), 3 and n - 5 degrees of freedom."""
    design = _design(inputs)

    def rss(columns: np.ndarray) -> float:
        fitted = columns @ np.linalg.lstsq(columns, human, rcond=None)[0]
        return float(((human - fitted) ** 2).sum())

    full, reduced = rss(design), rss(design[:, :2])
    dof = len(human) - design.shape[1]
    if dof <= 0 or full <= 0:
        return float("nan"), float("nan")
    from scipy.stats import f as f_distribution

    f_value = ((reduced - full) / (design.shape[1] - 2)) / (full / dof)
    return float(f_value), float(f_distribution.sf(f_value, design.shape[1] - 2, dof))


def whole_row_level(mu, human, scored_whole) -> tuple[float, float, str]:
    """``(alpha, beta, rows)``: the least-squares line ``human ≈ alpha + beta * mu`` of one language
    pair's whole-row μ (shape [n]), fitted on the rows scored whole (``scored_whole``, a boolean mask)
    where at least :data:`MIN_FIT_ROWS` are, else on every row (``rows`` says which)."""
    enough = scored_whole.sum() >= MIN_FIT_ROWS
    use = scored_whole if enough else np.ones_like(scored_whole)
    beta, alpha = np.polyfit(mu[use], human[use], 1) if mu[use].std() > 0 else (0.0, float(human[use].mean()))
    return float(alpha), float(beta), "scored whole" if enough else "all"


def fit_blend(
    predict: Predict,
    frame: pd.DataFrame,
    human,
    min_chrf: float = MIN_CHRF,
    alignment: str = "reference",
    min_length_ratio: float = MIN_LENGTH_RATIO,
) -> tuple[ParagraphBlend | None, str]:
    """Fit the blend per language pair of ``frame`` (human scores ``human`` [n]) by least squares on
    the pair's multi-sentence rows, and adopt it for a pair with at least :data:`MIN_FIT_ROWS` of
    them where the units add to the whole-row μ: the F-test of the blend against intercept + μ on
    those rows (:func:`units_f_test`) gives p < :data:`MAX_P`.  The others keep the whole-row μ.

    One level.  The least squares predicts the human score :math:`\\hat y`; the rows scored whole
    keep the network's μ, which follows the human score along its own line
    :math:`q \\approx \\alpha + \\beta\\mu` (:func:`whole_row_level`, β > 0 required).  The
    adopted weights are folded so that the blend returns :math:`(\\hat y - \\alpha)/\\beta`: both
    kinds of row then lie on one line with the human score, which the calibration's per-pair
    recalibration of μ (:class:`uamt.uncertainty.calibrators.Standardizer`) fits once for both.
    Returned as :math:`\\hat y` (uamt-comet v3), the blended rows had slope 1 with the human score
    while the single sentences' μ had slope β (2.26 for HTS en-de): no one recalibration line fits
    both, and the two kinds of row were ranked against each other on different scales (HTS, fitted
    on dev + d_e, test Pearson without -> with one level: WMT23 en-de .686 -> .711, AUROC of -μ for
    MQM <= -5 .822 -> .848; WMT21 en-de, 128 two-sentence rows of 1,885, .176 -> .173;
    docs/quality.md).

    Per pair, not pooled: weights pooled over every pair, applied to WMT21's two-sentence segments
    and WMT23 zh-en, lowered their test PPS by .012-.024 while WMT23 en-de gained .107.  The F-test,
    not a cross-fit: dev's en-de multi-sentence rows come from 18 documents of three campaigns, and
    cross-fitting over them scored the blend below the whole-row μ for every pair.  The zh-en blend
    it leaves out (HTS on dev: F 0.49, p .69; on dev + d_e F 2.6, p .05; en-de F 82.6, p 5e-50) had
    lowered the WMT21 and side-by-side zh-en test PPS and scored duplicated zh-en translations above
    their original 22 % of the time (docs/quality.md).  ``report`` records per pair its rows,
    multi-sentence rows, F and p, the level (α, β and the rows it was fitted on), and the in-sample
    Pearson r over all its rows of the whole-row μ and of the blended μ.  Returns ``(blend, why)``;
    ``blend.weights`` is empty where no pair adopted it, and ``blend`` is None where ``frame`` has no
    ``lp``.  ``alignment``: how the units are found (:func:`row_units`; ``"source"`` for a
    reference-free model: HTS QE, fitted on dev + d_e, en-de F 218.6 on 2,083 rows, en-ru F 11.1
    on 288; served test PPS WMT23 en-de .543 -> .646, side-by-side en-de .465 -> .563, WMT21 en-de
    .194 -> .178; zh-en and he-en not adopted; docs/quality.md).
    """
    human = np.asarray(human, dtype=float)
    if "lp" not in frame.columns:
        return None, "no lp column: the blend is fitted and served per language pair"
    scales = length_scales(frame) if alignment == "source" else {}
    whole, inputs = blend_inputs(predict, frame, min_chrf, None, alignment, min_length_ratio, scales)
    mu = whole["mu"].to_numpy(dtype=float)
    blended = mu.copy()
    lps = frame["lp"].astype(str).to_numpy()
    has_units = inputs["sum"].notna().to_numpy()
    weights, report = {}, {}
    for lp in sorted(np.unique(lps)):
        rows = (lps == lp) & np.isfinite(human)
        multi = rows & has_units
        entry = {"rows": int(rows.sum()), "multi_sentence_rows": int(multi.sum())}
        report[lp] = entry
        if multi.sum() < MIN_FIT_ROWS:
            entry["why_whole"] = f"< {MIN_FIT_ROWS} multi-sentence rows"
            continue
        f_value, p_value = units_f_test(inputs[multi], human[multi])
        entry["units_f"], entry["units_p"] = round(f_value, 3), float(f"{p_value:.3g}")
        if not p_value < MAX_P:
            entry["why_whole"] = f"the units add nothing to the whole-row mu (F-test p = {p_value:.3g} >= {MAX_P})"
            continue
        alpha, beta, level_rows = whole_row_level(mu[rows], human[rows], ~has_units[rows])
        entry["level"] = {"alpha": round(alpha, 4), "beta": round(beta, 4), "rows": level_rows}
        if not beta > 0:
            entry["why_whole"] = f"the whole-row mu does not rise with the human score (slope {beta:.3g}): no level for the blend"
            continue
        folded = (_lstsq(inputs[multi], human[multi]) - alpha * np.eye(len(COLUMNS))[0]) / beta
        weights[lp] = tuple(float(w) for w in folded)
        blended[multi] = _design(inputs[multi]) @ folded
        entry["pearson_whole"] = round(pearson_r(mu[rows], human[rows], min_rows=3), 4)
        entry["pearson_blend_in_sample"] = round(pearson_r(blended[rows], human[rows], min_rows=3), 4)
    fitted = sorted(weights)
    why = f"adopted for {fitted}" if fitted else "adopted for no language pair"
    scales = {lp: c for lp, c in scales.items() if lp in weights}
    return ParagraphBlend(weights, float(min_chrf), report, alignment, float(min_length_ratio), scales), why


def predict_with_blend(model, frame: pd.DataFrame, features, n_samples=None, encoder=None) -> pd.DataFrame:
    """``model.predict_whole`` with ``mu`` blended on multi-sentence rows where ``model.paragraphs``
    holds a blend (a loaded :class:`uamt.models.api.TrainedModel` or
    :class:`uamt.serving.onnx_head.OnnxHeadModel`)."""

    def whole(rows: pd.DataFrame) -> pd.DataFrame:
        return model.predict_whole(rows, features, n_samples, encoder)

    return whole(frame) if model.paragraphs is None else model.paragraphs.apply(whole, frame)
