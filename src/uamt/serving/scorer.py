"""The one scoring use case: texts -> a scored batch.

``uamt score`` and ``uamt compare`` (:mod:`uamt.cli.scoring`), the REST server (:class:`uamt.serving.rest.ScoringService`),
batch scoring (:func:`uamt.serving.batch.score_partition`) and the Python API
(:meth:`uamt.serving.api.Model.score`) all score through :func:`score_texts`:

1. the calibration language pair of every row (:func:`row_language_pairs`): ``lp`` given for all
   rows (rows whose text contradicts it are scored as the unseen pair ``und``), else the row's own
   ``lp`` value, else detected from the row's ``src`` and ``mt``;
2. the predictor's calibrated predictions, clipped to the scale's range (``predict_frame``);
3. the output checked once (:func:`check_output`: every column of
   :data:`uamt.serving.predictor.OUTPUT_COLUMNS`, one row per input row) and returned with how each row's
   pair was chosen (:class:`ScoredBatch`).

The settings every path shares are validated once, here (:class:`ScoringSettings`,
:func:`check_confidence`).  What each path makes of a :class:`ScoredBatch` (JSON lines and a
summary, a REST answer, a Parquet part, a DataFrame) stays with the path.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from uamt.core.errors import DataError, UamtError

#: Per-segment variances some methods add to :data:`uamt.serving.predictor.OUTPUT_COLUMNS`.
VARIANCE_COLUMNS = ("epistemic_var", "aleatoric_var")
#: How the pair of a row was chosen: ``lp`` given, the row's ``lp`` value, detected from the row's
#: texts, not detectable (scored as the unseen pair ``und``), nothing to choose (a model calibrated
#: globally only), or the text contradicts the given ``lp`` (scored as ``und``).
LP_GIVEN, LP_COLUMN, LP_DETECTED, LP_UNDETERMINED, LP_GLOBAL_ONLY, LP_CONTRADICTED = (
    "given",
    "column",
    "detected",
    "undetermined",
    "global-only model",
    "contradicts --lp",
)


def check_confidence(confidence: Any, name: str = "confidence") -> float:
    """``confidence`` as a float when it is a level in (0, 1), else DataError naming ``name``.

    The one check of the confidence level, for every command, the REST server, the model and the
    Python API (``name`` is how the caller calls it: ``--confidence``, ``confidence``).
    """
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0.0 < confidence < 1.0:
        raise DataError(f"{name} must be in (0, 1), got {confidence!r}")
    return float(confidence)


@dataclass(frozen=True)
class ScoringSettings:
    """What the numbers of a scored batch depend on besides the model and the texts.

    Attributes
    ----------
    confidence : float
        Level of the central interval ``[lower, upper]``, in (0, 1).
    risk_threshold : float, optional
        chi of ``risk = P(Q <= chi)`` on the model's scale; None: the scale's own.
    batch_size : int
        Segments per model batch (>= 1).
    """

    confidence: float = 0.9
    risk_threshold: float | None = None
    batch_size: int = 64

    def __post_init__(self) -> None:
        check_confidence(self.confidence)
        chi = self.risk_threshold
        if chi is not None and (isinstance(chi, bool) or not isinstance(chi, int | float) or not math.isfinite(chi)):
            raise DataError(f"risk threshold must be a finite number, got {chi!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise DataError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")

    def threshold_for(self, predictor) -> float:
        """The risk threshold in force for ``predictor``: the one set, else its scale's default."""
        return self.risk_threshold if self.risk_threshold is not None else predictor.scale.default_risk_threshold


def _finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float (JSON allows any number of digits)
        return False


@dataclass(frozen=True)
class FlagSettings:
    """Flag for post-editing: ``flagged`` = served P(Q <= flag_below) > max_risk.

    Attributes
    ----------
    flag_below : float
        chi on the model's scale: a translation with quality <= chi is a bad one.
    max_risk : float
        The largest risk left unflagged, in [0, 1] (0.5: flag what is more likely bad than not).
    """

    flag_below: float
    max_risk: float = 0.5

    def __post_init__(self) -> None:
        if not _finite_number(self.flag_below):
            raise DataError(f"flag_below must be a finite number, got {self.flag_below!r}")
        if not _finite_number(self.max_risk) or not 0.0 <= self.max_risk <= 1.0:
            raise DataError(f"max_risk must be a probability in [0, 1], got {self.max_risk!r}")


def flag_columns(risk, risk_threshold: float | None, flag: FlagSettings, flag_risk=None) -> dict[str, Any]:
    """The flag columns of rows whose served ``risk`` was computed at ``risk_threshold``.

    The one rule of flagging, for ``uamt score`` (single-file and batch) and the REST server.

    Parameters
    ----------
    risk : array-like, shape [n]
        The served P(Q <= risk_threshold).
    risk_threshold : float or None
    flag : FlagSettings
    flag_risk : array-like, shape [n], optional
        The served P(Q <= flag.flag_below), needed when ``flag.flag_below`` differs from
        ``risk_threshold`` (the predictor's own risk at that threshold, never a Gaussian stand-in).

    Returns
    -------
    dict
        ``flagged`` (bool array), and ``flag_risk`` (float array) when it was needed; in that order
        of columns: ``flag_risk`` first.
    """
    import numpy as np

    risk = np.asarray(risk, dtype=float)
    if risk_threshold is not None and math.isclose(flag.flag_below, risk_threshold):
        return {"flagged": risk > flag.max_risk}
    if flag_risk is None:
        raise UamtError(
            f"--flag-below {flag.flag_below:g} differs from the risk threshold {risk_threshold!r}: the served "
            "P(Q <= flag_below) is needed (flag_risk)"
        )
    flag_risk = np.asarray(flag_risk, dtype=float)
    if flag_risk.shape != risk.shape:
        raise UamtError(f"flag_risk has shape {flag_risk.shape}; expected {risk.shape}")
    return {"flag_risk": flag_risk, "flagged": flag_risk > flag.max_risk}


def served_flag_risk(predictor, frame, scored: ScoredBatch, flag: FlagSettings, **score_options):
    """The served P(Q <= flag.flag_below) of ``frame``'s rows when it is not ``scored``'s ``risk``
    (another threshold): a second :func:`score_texts` pass with ``scored``'s settings at that
    threshold and the same ``score_options`` (``lp``, ``detect_lp``, ``group_by_lp``, ``deadline``);
    else None."""
    if math.isclose(flag.flag_below, scored.risk_threshold):
        return None
    settings = replace(scored.settings, risk_threshold=flag.flag_below)
    return score_texts(predictor, frame, settings, **score_options).out["risk"].to_numpy()


def score_flags(predictor, frame, scored: ScoredBatch, flag: FlagSettings, **score_options) -> dict[str, Any]:
    """:func:`flag_columns` of ``scored`` (``frame`` scored by :func:`score_texts` with
    ``score_options``), with the second pass :func:`served_flag_risk` where the thresholds differ."""
    flag_risk = served_flag_risk(predictor, frame, scored, flag, **score_options)
    return flag_columns(scored.out["risk"].to_numpy(), scored.risk_threshold, flag, flag_risk)


class ModelOutputError(UamtError):
    """The model's output lacks a column of :data:`uamt.serving.predictor.OUTPUT_COLUMNS` or has another
    number of rows than its input: not a uamt model, or a broken one."""


class ScoringTimeout(UamtError):
    """Scoring passed its deadline between two chunks; ``done`` of ``total`` rows were scored."""

    def __init__(self, done: int, total: int):
        super().__init__(f"scoring passed its deadline after {done} of {total} rows")
        self.done = done
        self.total = total


def output_columns(out) -> list[str]:
    """The prediction columns of ``out`` in their order: the required ones, then the variances it has."""
    from uamt.serving.predictor import OUTPUT_COLUMNS

    return [*OUTPUT_COLUMNS, *[c for c in VARIANCE_COLUMNS if c in out.columns]]


def check_output(out, n_rows: int):
    """``out`` with a fresh index, after checking it has every output column and ``n_rows`` rows.

    The one check of a model's output (:class:`ModelOutputError` otherwise).
    """
    from uamt.serving.predictor import OUTPUT_COLUMNS

    missing = [c for c in OUTPUT_COLUMNS if c not in out.columns]
    if missing:
        raise ModelOutputError(
            f"the model returned no {missing} columns (got {list(out.columns)}); is it a uamt model?"
        )
    if len(out) != n_rows:
        raise ModelOutputError(f"the model returned {len(out)} rows for {n_rows} segments")
    return out.reset_index(drop=True)


@dataclass(frozen=True)
class ScoredBatch:
    """Texts scored: the predictions and how each row's calibration language pair was chosen.

    Attributes
    ----------
    out : pandas.DataFrame
        One row per input row, in input order: ``mu``, ``sigma``, ``lower``, ``upper``, ``risk``;
        ``epistemic_var``, ``aleatoric_var`` where the method gives them; ``clipped`` where the
        scale has bounds.
    lps : tuple of str or None
        The calibration pair of each row (``und``: undetermined or contradicted, scored as unseen;
        None: the global calibration).
    hows : tuple of str
        How each row's pair was chosen (``LP_*`` of this module; "" for no pair).
    contradicting : dict
        Pairs detected on rows that contradict the given ``lp`` -> rows.
    lp_choice : uamt.serving.language_pair.LanguagePairChoice or None
        The choice made on the rows' texts (given ``lp`` or detection), for messages and the
        summary; None when every row had its own ``lp`` or nothing was detected.
    settings : ScoringSettings
    risk_threshold : float
        The threshold ``risk`` was computed at.
    """

    out: Any
    lps: tuple[str | None, ...]
    hows: tuple[str, ...]
    contradicting: dict[str, int]
    lp_choice: Any
    settings: ScoringSettings
    risk_threshold: float


def row_language_pairs(
    predictor, frame, lp: str | None, *, detect: bool = True
) -> tuple[list[str | None], list[str], dict[str, int], Any]:
    """The calibration pair of each row of ``frame``, how it was chosen, what was detected on rows
    that contradict ``lp``, and the :class:`~uamt.serving.language_pair.LanguagePairChoice` made
    on the texts (None where none was made).

    ``lp`` for all rows, except those whose text confidently contradicts it (the unseen pair
    ``und``); else the row's ``lp`` value; else, with ``detect``, the pair detected from the row's
    ``src`` and ``mt``, the other rows without one as context for a line too short to tell (``und``
    where it stays undetermined: widened as unseen), and without ``detect`` None (the global
    calibration).  Detection runs only for a model calibrated per LP
    (:func:`~uamt.serving.language_pair.predictor_language_pair`).
    """
    from uamt.serving.language_pair import UNDETERMINED_LP, predictor_language_pair

    n = len(frame)
    if lp is not None:
        if not detect:
            return [lp] * n, [LP_GIVEN] * n, {}, None
        choice = predictor_language_pair(predictor, frame["src"].tolist(), frame["mt"].tolist(), lp)
        contradicted = set(choice.contradicted)
        lps = [UNDETERMINED_LP if i in contradicted else lp for i in range(n)]
        hows = [LP_CONTRADICTED if i in contradicted else LP_GIVEN for i in range(n)]
        return lps, hows, dict(choice.contradicting_pairs), choice
    column = frame["lp"].tolist() if "lp" in frame.columns else [None] * n
    lps: list[str | None] = list(column)
    hows = [LP_COLUMN if value is not None else "" for value in column]
    missing = [i for i, value in enumerate(column) if value is None]
    choice = None
    if missing and detect:
        src, mt = frame["src"].tolist(), frame["mt"].tolist()
        choice = predictor_language_pair(predictor, [src[i] for i in missing], [mt[i] for i in missing], None)
        for k, i in enumerate(missing):
            found = choice.row_lps[k] if choice.row_lps is not None else choice.lp
            lps[i] = found
            if found is None:
                hows[i] = LP_GLOBAL_ONLY if choice.row_lps is None else LP_UNDETERMINED
            else:
                hows[i] = LP_UNDETERMINED if found == UNDETERMINED_LP else LP_DETECTED
    return lps, hows, {}, choice


def work_chunks(frame, batch_size: int) -> list:
    """``frame`` cut into consecutive chunks of at most ``batch_size`` scoring passes (one encoder
    batch each; a record with more references than that is a chunk of its own)."""
    if "refs" in frame.columns:
        passes = [max(len(options), 1) for options in frame["refs"]]
    else:
        passes = [1] * len(frame)
    chunks, start, filled = [], 0, 0
    for i, n in enumerate(passes):
        if filled and filled + n > batch_size:
            chunks.append(frame.iloc[start:i])
            start, filled = i, 0
        filled += n
    chunks.append(frame.iloc[start:])
    return [c.reset_index(drop=True) for c in chunks]


def score_texts(
    predictor,
    frame,
    settings: ScoringSettings = ScoringSettings(),
    *,
    lp: str | None = None,
    detect_lp: bool = True,
    group_by_lp: bool = False,
    progress: bool = False,
    deadline: float | None = None,
) -> ScoredBatch:
    """Score the texts of ``frame`` with ``predictor``: the one scoring use case (module docstring).

    Parameters
    ----------
    predictor : uamt.serving.predictor.Predictor
    frame : pandas.DataFrame
        ``src``, ``mt`` (str); ``ref`` (str) or ``refs`` (list of str) for a reference-based model;
        optionally ``lp`` (each row's pair, None to have it detected).
    settings : ScoringSettings
    lp : str, optional
        The pair of every row (``--lp``); an ``lp`` column is then ignored.
    detect_lp : bool
        Detect the pair of rows without one (and check a given ``lp`` against the text); the REST
        server does not (a few short records are too little text).
    group_by_lp : bool
        Score the rows of each pair in a call of their own (batch scoring's partitions); else one
        call over all rows, as ``uamt score`` does.  Rows without a pair beside rows with one are
        always scored apart (the global calibration).
    progress : bool
        A progress bar on stderr (one call over all rows only).
    deadline : float, optional
        ``time.monotonic()`` past which scoring stops between chunks of about one model batch
        (:class:`ScoringTimeout`).

    Raises
    ------
    ModelOutputError
        The model's output lacks a column or a row.
    ScoringTimeout
        ``deadline`` passed with rows left.
    uamt.core.errors.UamtError
        The model refused the inputs (message names the row and field).
    """
    lps, hows, contradicting, choice = row_language_pairs(predictor, frame, lp, detect=detect_lp)
    threshold = settings.threshold_for(predictor)
    kwargs = dict(confidence=settings.confidence, risk_threshold=threshold, batch_size=settings.batch_size)
    model_input = frame.drop(columns=["lp"]) if "lp" in frame.columns else frame
    with_lp = [value is not None for value in lps]
    if group_by_lp or (any(with_lp) and not all(with_lp)):
        out = _predict_per_language_pair(predictor, model_input, lps, kwargs)
    else:
        if all(with_lp) and len(lps):
            model_input = model_input.assign(lp=list(lps))
        out = _predict(predictor, model_input, kwargs, progress=progress, deadline=deadline)
    return ScoredBatch(out, tuple(lps), tuple(hows), contradicting, choice, settings, threshold)


def _predict(predictor, frame, kwargs: dict, *, progress: bool, deadline: float | None):
    """``predict_frame`` over all rows (with a ``deadline``: chunk by chunk, stopping once it has
    passed), the output checked."""
    import pandas as pd

    chunks = [frame] if deadline is None else work_chunks(frame, kwargs["batch_size"])
    parts = []
    for k, chunk in enumerate(chunks):
        if k and time.monotonic() > deadline:
            raise ScoringTimeout(sum(len(c) for c in chunks[:k]), len(frame))
        parts.append(predictor.predict_frame(chunk, progress=progress, **kwargs))
    out = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    return check_output(out, len(frame))


def _predict_per_language_pair(predictor, model_input, lps: Sequence[str | None], kwargs: dict):
    """``predict_frame`` once per distinct pair of ``lps`` (its rows with that ``lp``; None: no
    ``lp`` column, the global calibration), the outputs back in row order."""
    import pandas as pd

    groups: dict[str | None, list[int]] = {}
    for position, lp in enumerate(lps):
        groups.setdefault(lp, []).append(position)
    outputs = []
    for lp, positions in groups.items():
        rows = model_input.iloc[positions].reset_index(drop=True)
        if lp is not None:
            rows = rows.assign(lp=lp)
        out = check_output(predictor.predict_frame(rows, progress=False, **kwargs), len(rows))
        out.index = positions
        outputs.append(out)
    if len(outputs) == 1:
        return outputs[0].reset_index(drop=True)
    return pd.concat(outputs).sort_index().reset_index(drop=True)
