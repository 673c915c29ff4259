"""Critical-error perturbations of translations: the challenge set and the synthetic training rows.

Each mode turns a translation into one a user fears (MetricX-23's synthetic failure cases, plus
negation flips and number changes as in the critical-error challenge sets of the WMT metrics task):

``omission_end``
    the last half of the words cut (at least 2 words; translations of >= 4 words).
``omission_sentence``
    one sentence removed (translations of >= 2 sentences of >= 3 words,
    :func:`uamt.surface_features.sentences`: mostly WMT23's paragraphs).
``duplication``
    the translation repeated twice.
``unrelated``
    a fluent but unrelated sentence: the reference of another document of the same language pair.
``gibberish``
    as many words as the translation, drawn at random from the vocabulary of the language pair's
    references (right language and words, no meaning).
``untranslated``
    the source copied as the translation.
``wrong_language``
    the right content in another language: the reference of the *same source sentence* in another
    language pair (WMT21 en-de <-> en-ru share English sources), so only rows whose source has such
    a translation qualify.
``negation``
    one negation added or removed (English, German and Russian rules; rows where a rule applies).
``number``
    the first number changed (digits; rows with a number).

:func:`perturb` applies one mode to one row (``None`` where the mode does not apply);
:func:`challenge_set` samples rows per mode; :func:`synthetic_failures` draws MetricX-style
training rows (the worst score of the scale; a reference copied as the translation gets the best).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.core.naming import SYNTHETIC_SYSTEM_PREFIX
from uamt.surface_features import sentences

MODES = (
    "omission_end",
    "omission_sentence",
    "duplication",
    "unrelated",
    "gibberish",
    "untranslated",
    "wrong_language",
    "negation",
    "number",
)

#: Modes MetricX-23 trains on (negation and number changes stay test-only challenges).
TRAINING_MODES = ("omission_end", "omission_sentence", "duplication", "unrelated", "gibberish", "untranslated", "wrong_language")

_NUMBER = re.compile(r"\d+")

# (pattern, replacement) per target language, tried in order; the first that matches is applied once.
_NEGATION_RULES: dict[str, list[tuple[str, str]]] = {
    "en": [
        (r"\b(is|are|was|were|do|does|did|has|have|had|can|could|will|would|should|must) not\b", r"\1"),
        (r"\b(can)not\b", r"\1"),
        (r"\b(is|are|was|were|will|can|could|would|should|must|has|have|had)\b", r"\1 not"),
    ],
    "de": [
        (r"\s+nicht\b", ""),
        (r"\bkeine?\b", "eine"),
        (r"\b(ist|sind|war|waren|wird|werden|kann|können|hat|haben|muss|müssen)\b", r"\1 nicht"),
    ],
    "ru": [
        (r"\bне\s+", ""),
        (r"\b(может|могут|будет|будут|является|являются|был|была|были|было)\b", r"не \1"),
    ],
}


def target_language(lp: str) -> str:
    """The target language code of ``lp`` (``en-de`` -> ``de``)."""
    parts = str(lp).split("-")
    if len(parts) != 2 or not all(parts):
        raise DataError(f"lp={lp!r} is not of the form <src>-<tgt>")
    return parts[1]


@dataclass(frozen=True)
class Pools:
    """What the modes draw from, per language pair: the references (with their document, for
    ``unrelated``), the reference vocabulary (``gibberish``) and, per source sentence, the references
    in other target languages (``wrong_language``)."""

    refs: dict[str, tuple[np.ndarray, np.ndarray]]
    vocab: dict[str, np.ndarray]
    other_language_refs: dict[tuple[str, str], list[tuple[str, str]]]

    @classmethod
    def from_rows(cls, df: pd.DataFrame) -> Pools:
        for column in ("lp", "src", "ref", "doc"):
            if column not in df.columns:
                raise DataError(f"challenge rows: column {column!r} is missing")
        refs, vocab = {}, {}
        for lp, part in df.groupby("lp"):
            unique = part.drop_duplicates("ref")
            refs[lp] = (unique["ref"].astype(str).to_numpy(), unique["doc"].astype(str).to_numpy())
            words = " ".join(unique["ref"].astype(str)).split()
            vocab[lp] = np.array(sorted(set(words)))
        others: dict[tuple[str, str], list[tuple[str, str]]] = {}
        by_src = df.drop_duplicates(["src", "lp"]).groupby("src")
        for src, part in by_src:
            if part["lp"].nunique() < 2:
                continue
            for lp in part["lp"]:
                mine = target_language(lp)
                others[(src, lp)] = [
                    (other_lp, ref)
                    for other_lp, ref in zip(part["lp"], part["ref"], strict=True)
                    if target_language(other_lp) != mine
                ]
        return cls(refs, vocab, others)


def _omission_end(row, pools, rng) -> str | None:
    words = str(row["mt"]).split()
    if len(words) < 4:
        return None
    return " ".join(words[: len(words) - max(2, len(words) // 2)])


def _omission_sentence(row, pools, rng) -> str | None:
    parts = sentences(row["mt"])
    if len(parts) < 2:
        return None
    drop = int(rng.integers(len(parts)))
    return " ".join(s for i, s in enumerate(parts) if i != drop)


def _duplication(row, pools, rng) -> str | None:
    return f"{row['mt']} {row['mt']}"


def _unrelated(row, pools, rng) -> str | None:
    refs, docs = pools.refs.get(row["lp"], (np.array([]), np.array([])))
    candidates = np.flatnonzero(docs != str(row["doc"]))
    if candidates.size == 0:
        return None
    return str(refs[rng.choice(candidates)])


def _gibberish(row, pools, rng) -> str | None:
    vocab = pools.vocab.get(row["lp"])
    if vocab is None or vocab.size < 10:
        return None
    n = max(3, len(str(row["mt"]).split()))
    return " ".join(rng.choice(vocab, n))


def _untranslated(row, pools, rng) -> str | None:
    return str(row["src"])


def _wrong_language(row, pools, rng) -> str | None:
    options = pools.other_language_refs.get((str(row["src"]), str(row["lp"])))
    if not options:
        return None
    return str(options[int(rng.integers(len(options)))][1])


def _negation(row, pools, rng) -> str | None:
    mt = str(row["mt"])
    for pattern, replacement in _NEGATION_RULES.get(target_language(row["lp"]), []):
        changed, count = re.subn(pattern, replacement, mt, count=1)
        if count and changed != mt:
            return changed
    return None


def _number(row, pools, rng) -> str | None:
    mt = str(row["mt"])
    match = _NUMBER.search(mt)
    if match is None:
        return None
    value = int(match.group())
    new = value + int(rng.integers(1, 10)) if value < 10 else value * int(rng.choice([2, 3, 10]))
    return mt[: match.start()] + str(new) + mt[match.end() :]


PERTURBATIONS: dict[str, Callable] = {
    "omission_end": _omission_end,
    "omission_sentence": _omission_sentence,
    "duplication": _duplication,
    "unrelated": _unrelated,
    "gibberish": _gibberish,
    "untranslated": _untranslated,
    "wrong_language": _wrong_language,
    "negation": _negation,
    "number": _number,
}


def check_mode(mode: str) -> str:
    if mode not in PERTURBATIONS:
        raise ValueError(f"mode={mode!r} not supported; choose from {sorted(PERTURBATIONS)}")
    return mode


def perturb(row, mode: str, pools: Pools, rng: np.random.Generator) -> str | None:
    """The translation of ``row`` (``mt``, ``src``, ``lp``, ``doc``) perturbed by ``mode``, or None
    where the mode does not apply to it."""
    out = PERTURBATIONS[check_mode(mode)](row, pools, rng)
    return None if out is None or out.strip() == str(row["mt"]).strip() else out


def challenge_set(
    df: pd.DataFrame, modes=MODES, per_mode: int = 300, seed: int = 0, min_score: float | None = -1.0
) -> pd.DataFrame:
    """Up to ``per_mode`` perturbed rows per mode, each beside its original (``mt_original``).

    Rows are drawn (seeded) from ``df`` -- held-out test rows -- whose human score is at least
    ``min_score`` (None: any): a critical error in a good translation is unambiguously worse than
    the original.  Each mode draws from its own generator (``seed`` and the mode's place in
    :data:`MODES`).  Columns: those of ``df`` plus ``mode``, ``mt_original`` and ``mt`` (perturbed).
    """
    pools = Pools.from_rows(df)
    pool = df if min_score is None else df[df["score"] >= min_score]
    parts = []
    for mode in modes:
        check_mode(mode)
        # One generator per mode: a mode's rows do not depend on which other modes are drawn, or
        # on how many rows another mode's rule accepts.
        rng = np.random.default_rng([seed, MODES.index(mode)])
        order = rng.permutation(len(pool))
        picked, texts = [], []
        for i in order:
            row = pool.iloc[i]
            out = perturb(row, mode, pools, rng)
            if out is None:
                continue
            picked.append(i)
            texts.append(out)
            if len(picked) == per_mode:
                break
        chosen = pool.iloc[picked].copy()
        chosen["mode"] = mode
        chosen["mt_original"] = chosen["mt"].astype(str)
        chosen["mt"] = texts
        parts.append(chosen)
    return pd.concat(parts, ignore_index=True)


def synthetic_failures(
    df: pd.DataFrame,
    fraction: float,
    worst_score: float,
    best_score: float,
    modes=TRAINING_MODES,
    seed: int = 0,
) -> pd.DataFrame:
    """MetricX-style synthetic training rows for the training rows ``df``.

    ``fraction`` x len(df) rows (split evenly over ``modes``, each a perturbed row of ``df`` with
    score ``worst_score``) plus as many again, split evenly, of references copied as the translation
    with score ``best_score``.  Rows keep every other column of their source row (dataset, lp,
    split, doc, ...), so they stay in their row's split and document; ``system`` names the mode.
    """
    if not 0 <= fraction <= 0.05:
        raise ValueError(f"fraction={fraction!r} must be in [0, 0.05] (MetricX uses 0.001-0.01)")
    n = int(round(fraction * len(df)))
    if n == 0:
        return df.iloc[:0].copy()
    per_mode = max(1, n // len(modes))
    bad = challenge_set(df, modes=modes, per_mode=per_mode, seed=seed, min_score=None)
    bad = bad.drop(columns=["mt_original", "mode"]).assign(
        score=float(worst_score), system=[SYNTHETIC_SYSTEM_PREFIX + m for m in bad["mode"]]
    )
    rng = np.random.default_rng(seed + 1)
    good = df.iloc[rng.choice(len(df), size=min(n, len(df)), replace=False)].copy()
    good["mt"] = good["ref"]
    good["score"] = float(best_score)
    good["system"] = SYNTHETIC_SYSTEM_PREFIX + "reference"
    out = pd.concat([bad, good], ignore_index=True)
    for column in ("score_raw", "score_std"):
        if column in out.columns:
            out[column] = np.nan
    return out


#: The MQM penalty of a non-translation (WMT MQM guidelines: 25 points, the most one segment gets
#: in WMT21): the worst score of an MQM scale, whose declared range (WMT23: -200) only bounds
#: what is plausible for long paragraphs.
NON_TRANSLATION_MQM = -25.0


def synthetic_score_range(low: float, high: float) -> tuple[float, float]:
    """``(worst, best)`` synthetic scores of an MQM scale declared as ``[low, high]`` (penalties,
    ``high == 0``): :data:`NON_TRANSLATION_MQM` and 0.

    Raises
    ------
    DataError
        Another scale (DA z-scores, HTER): where its worst lies is not defined by the scale (a DA
        z of -20 is 20 standard deviations out), so no synthetic score is invented for it.
    """
    if high == 0 and low < 0:
        return max(float(low), NON_TRANSLATION_MQM), 0.0
    raise DataError(f"synthetic failures are defined for MQM scales (high end 0); got range [{low}, {high}]")


def with_synthetic_failures(df: pd.DataFrame, fraction: float, seed: int = 0) -> pd.DataFrame:
    """``df`` (training rows) plus :func:`synthetic_failures` drawn per dataset, scored at the ends
    of the dataset's scale (:func:`synthetic_score_range` of ``DATASET_SPECS[dataset].score_range``);
    ``fraction`` 0 returns ``df`` unchanged."""
    if fraction == 0:
        return df
    from uamt.data.datasets import DATASET_SPECS

    parts = [df]
    for dataset, rows in df.groupby("dataset", sort=True):
        if dataset not in DATASET_SPECS:
            raise DataError(f"synthetic failures: dataset {dataset!r} has no declared score range")
        try:
            worst, best = synthetic_score_range(*DATASET_SPECS[dataset].score_range)
        except DataError as exc:
            raise DataError(f"synthetic failures: dataset {dataset!r}: {exc}") from exc
        added = synthetic_failures(rows.reset_index(drop=True), fraction, worst_score=worst, best_score=best, seed=seed)
        if "n_annotators" in added.columns:
            added["n_annotators"] = 1
        if "annotator_scores" in added.columns:
            added["annotator_scores"] = [[float(score)] for score in added["score"]]
        parts.append(added)
    return pd.concat(parts, ignore_index=True)


__all__ = [
    "MODES",
    "PERTURBATIONS",
    "TRAINING_MODES",
    "Pools",
    "challenge_set",
    "check_mode",
    "perturb",
    "synthetic_failures",
    "synthetic_score_range",
    "target_language",
    "with_synthetic_failures",
]
