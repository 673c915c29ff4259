"""The Python API: load a registered (or local) uamt model once, score lists of texts.

>>> import uamt
>>> model = uamt.load_model("models:/uamt-comet@champion")          # doctest: +SKIP
>>> scores = model.score(src=["Der Hund schläft."], mt=["The dog sleeps."],
...                      ref=["The dog is sleeping."])                # doctest: +SKIP
>>> scores[["mu", "sigma", "lower", "upper", "risk"]]                # doctest: +SKIP

The numbers are those ``uamt score`` prints for the same texts and settings: both go through the
one scoring use case, :func:`uamt.serving.scorer.score_texts`.  ``docs/python-api.md`` says how
to read them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from uamt.core.errors import DataError, UamtError

#: Columns of :meth:`Model.score`'s frame besides the variances some methods add.
RESULT_COLUMNS = ("mu", "sigma", "lower", "upper", "risk", "clipped", "lp", "warnings")


@contextlib.contextmanager
def _tracking_uri(uri: str | None) -> Iterator[None]:
    """``$MLFLOW_TRACKING_URI`` set to ``uri`` while the model loads (the store every uamt command
    reads it from), restored after."""
    if uri is None:
        yield
        return
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before


def load_model(
    model: str | os.PathLike | None = None,
    *,
    reference_free: bool = False,
    tracking_uri: str | None = None,
    params_path: str | os.PathLike | None = None,
) -> Model:
    """Load a calibrated uamt model for :meth:`Model.score`.

    Parameters
    ----------
    model : str or path, optional
        ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` (a registered model), ``runs:/ID/model``,
        or a local pyfunc folder, as ``uamt score --model`` takes.  Default: the registered
        champion, ``models:/uamt-comet@champion`` (``models:/uamt-comet-qe@champion`` with
        ``reference_free``; the name from ``register.model_name`` of ``params_path`` where given).
    reference_free : bool
        Default model only: the reference-free (QE) champion.
    tracking_uri : str, optional
        The MLflow store of registered models; default ``$MLFLOW_TRACKING_URI``, else
        ``sqlite:///mlflow/mlflow.db`` under the working folder.  The store is only read.
    params_path : str or path, optional
        A params file whose ``register.model_name`` names the default model.

    Raises
    ------
    uamt.core.errors.UamtError
        The store, model, version or alias does not exist, or a model file is corrupt (named).

    Examples
    --------
    >>> import uamt
    >>> model = uamt.load_model("models:/uamt-comet@champion")  # doctest: +SKIP
    >>> model.score(src=["Das ist gut."], mt=["This is good."], ref=["That is good."])  # doctest: +SKIP
    """
    from uamt.serving.predictor import load_predictor
    from uamt.serving.scores import default_model_uri

    if model is None:
        uri = default_model_uri(reference_free=reference_free, params_path=params_path)
    elif isinstance(model, str | os.PathLike):
        uri = os.fspath(model)
    else:
        raise DataError(f"model must be a model URI or a folder path, got {type(model).__name__}")
    if not uri.startswith(("models:/", "runs:/")) and "://" not in uri:
        folder = Path(uri).expanduser()
        if not folder.is_dir():
            raise UamtError(f"could not load model {uri!r}: no model folder at {folder.resolve()}")
        uri = str(folder)
    with _tracking_uri(tracking_uri):
        predictor = load_predictor(uri)
    return Model(predictor, uri)


def _texts(name: str, values: Any, n: int | None = None) -> list[str]:
    """``values`` as a list of non-blank strings (``n`` of them where given), else DataError."""
    from uamt.core.textcheck import text_problem

    if isinstance(values, str) or not isinstance(values, Sequence | Iterator) and not hasattr(values, "tolist"):
        raise DataError(f"{name} must be a list of strings (one per segment), got {type(values).__name__}")
    texts = list(values.tolist() if hasattr(values, "tolist") else values)
    for i, text in enumerate(texts):
        if problem := text_problem(text):
            raise DataError(f"{name}[{i}] {problem}")
    if n is not None and len(texts) != n:
        raise DataError(f"{name} has {len(texts)} texts but src has {n}: they must be aligned, one per segment")
    return texts


class Model:
    """A loaded, calibrated uamt model: :meth:`score` turns texts into μ, σ, interval and risk.

    Attributes
    ----------
    uri : str
        The model as loaded (URI or folder).
    predictor : uamt.serving.predictor.Predictor
        The calibrated predictor inside.
    """

    def __init__(self, predictor, uri: str):
        self.predictor = predictor
        self.uri = uri

    def __repr__(self) -> str:
        return f"<uamt.Model {self.uri} ({self.method}, scale {self.scale})>"

    @property
    def method(self) -> str:
        """The uncertainty method (``hts``, ``mcd``, ...)."""
        return self.predictor.method

    @property
    def scale(self) -> str:
        """The human score scale μ, the interval and the risk threshold are on (``MQM``, ...)."""
        return self.predictor.scale.name

    @property
    def uses_references(self) -> bool:
        """False for a reference-free (QE) model: call :meth:`score` without ``ref``."""
        return bool(self.predictor.uses_references)

    @property
    def known_lps(self) -> list[str]:
        """Language pairs with a calibration of their own (others are scored as unseen, widened)."""
        return list(getattr(self.predictor, "known_lps", None) or [])

    def score(
        self,
        src: Sequence[str],
        mt: Sequence[str],
        ref: Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        lp: str | Sequence[str | None] | None = None,
        campaign: str | Sequence[str | None] | None = None,
        confidence: float = 0.9,
        risk_threshold: float | None = None,
        batch_size: int = 64,
        progress: bool = False,
    ):
        """Score translations: one row per segment, the numbers ``uamt score`` gives.

        Parameters
        ----------
        src, mt : list of str
            Source sentences and their translations, aligned.
        ref : list of str, or list of lists of str, optional
            One reference per segment, or several (their predictions are averaged, as
            ``uamt score -r A -r B`` does).  None for a reference-free (QE) model.
        lp : str or list of (str or None), optional
            The language pair ``xx-yy`` of every segment, or of each (None: detect that one).
            Default: detected from the texts, as ``uamt score`` does without ``--lp``; rows whose
            text contradicts a given pair, or whose pair cannot be determined, are scored as an
            unseen pair (wider intervals) and say so in ``warnings``.
        campaign : str or list of (str or None), optional
            The annotation campaign whose judgements to predict (e.g. ``"wmt21_mqm"``), for every
            segment or each (None: the pair's calibration over all its campaigns, the default):
            the model's calibration fitted on that campaign's rows of the segment's pair
            (:mod:`uamt.campaigns`); a campaign it has none for is refused (DataError naming the row).
        confidence : float
            Level of the central interval ``[lower, upper]``, in (0, 1).
        risk_threshold : float, optional
            chi of ``risk = P(Q <= chi)``, on the model's scale (default: the scale's own).
        batch_size : int
            Segments per model batch.
        progress : bool
            A progress bar on stderr.

        Returns
        -------
        pandas.DataFrame
            One row per segment, in input order: ``mu`` (mean quality), ``sigma`` (its standard
            deviation), ``lower``/``upper`` (central interval at ``confidence``), ``risk``
            (P(quality <= risk threshold)), ``epistemic_var``/``aleatoric_var`` (where the method
            gives them), ``clipped`` (mu or the interval was clipped to the scale's range), ``lp``
            (the pair whose calibration scored the row; ``und``: undetermined, None: global) and
            ``warnings`` (a list of messages about the row, empty when none).  ``.attrs`` holds
            the model, method, scale, confidence and risk threshold.

        Raises
        ------
        uamt.core.errors.DataError
            A text is not a string or is empty, the lists are not aligned, ``lp`` is not ``xx-yy``,
            ``confidence`` is outside (0, 1) (the argument and index named).
        uamt.core.errors.UamtError
            References given to a reference-free model, or none to a reference-based one.

        Examples
        --------
        >>> scores = model.score(  # doctest: +SKIP
        ...     src=["Der Hund schläft im Garten."],
        ...     mt=["The dog sleeps in the garden."],
        ...     ref=["The dog is sleeping in the garden."],
        ...     lp="de-en",
        ... )
        >>> scores.loc[0, ["mu", "lower", "upper", "risk"]]  # doctest: +SKIP
        """
        import pandas as pd

        from uamt.serving import scorer

        settings = scorer.ScoringSettings(confidence, risk_threshold, batch_size)
        src = _texts("src", src)
        if not src:
            raise DataError("src is empty: give at least one segment")
        frame = pd.DataFrame({"src": src, "mt": _texts("mt", mt, len(src))})
        self._check_references(ref is not None)
        if ref is not None:
            column, values = _references(ref, len(src))
            frame[column] = values
        given_lp = _language_pairs(lp, len(src))
        if isinstance(given_lp, list):
            frame["lp"] = pd.Series(given_lp, dtype=object)
            given_lp = None
        if campaign is not None:
            campaigns = [campaign] * len(src) if isinstance(campaign, str) else list(campaign)
            if len(campaigns) != len(src):
                raise DataError(f"campaign has {len(campaigns)} entries for {len(src)} segments")
            frame["campaign"] = pd.Series(campaigns, dtype=object)
        scored = scorer.score_texts(self.predictor, frame, settings, lp=given_lp, progress=progress)
        table = scored.out[scorer.output_columns(scored.out)].copy()
        clipped = scored.out["clipped"] if "clipped" in scored.out.columns else False
        table["clipped"] = pd.Series(clipped, index=table.index, dtype=bool)
        table["lp"] = pd.Series(scored.lps, index=table.index, dtype=object)
        table["warnings"] = self._warnings(frame, scored, lp)
        bounds = getattr(self.predictor.scale, "bounds", None)
        table.attrs.update(
            model=self.uri,
            method=self.method,
            scale=self.scale,
            scale_range=list(bounds) if bounds is not None else None,
            confidence=settings.confidence,
            risk_threshold=scored.risk_threshold,
        )
        return table

    def _check_references(self, given: bool) -> None:
        if given and not self.uses_references:
            raise UamtError(
                f"{self.uri} is a reference-free (QE) model ({self.method}): call score without ref, "
                "or load a reference-based model"
            )
        if not given and self.uses_references:
            raise UamtError(
                f"{self.uri} is a reference-based model ({self.method}) and needs ref=[...], one reference "
                "per segment; or load a reference-free (QE) model (uamt.load_model(reference_free=True))"
            )

    def _warnings(self, frame, scored, lp) -> list[list[str]]:
        """What each row's numbers need read with: an unseen, undetermined or contradicted language
        pair (wider interval), a text the encoder reads only the beginning of."""
        from uamt.serving.language_pair import UNDETERMINED_LP, predictor_language_pair
        from uamt.serving.scorer import LP_CONTRADICTED, LP_UNDETERMINED

        facts = predictor_language_pair(self.predictor, [], [], None)  # known pairs and widening
        widened = (
            f"its interval is widened x{facts.sigma_factor:.2f}"
            if facts.sigma_factor > 1
            else "the global calibration is used for it"
        )
        known = ", ".join(facts.known_lps)
        rows: list[list[str]] = [[] for _ in range(len(frame))]
        for i, (pair, how) in enumerate(zip(scored.lps, scored.hows, strict=True)):
            if how == LP_CONTRADICTED:
                rows[i].append(
                    f"the text contradicts lp {lp}: scored as an unseen language pair and {widened}; check lp"
                )
            elif how == LP_UNDETERMINED:
                rows[i].append(
                    "the language pair could not be determined confidently: scored as an unseen language pair "
                    f"and {widened}; pass lp if you know it"
                )
            elif pair not in (None, UNDETERMINED_LP) and facts.known_lps and pair not in facts.known_lps:
                rows[i].append(
                    f"language pair {pair} was never seen in training (the model knows {known}): the score is "
                    f"less reliable and {widened}"
                )
        check = getattr(self.predictor, "truncated", None)
        if callable(check):
            limit = getattr(self.predictor, "max_tokens", None)
            limit = f"{limit} tokens" if limit else "its maximum length"
            for column in ("src", "mt", "ref"):
                if column in frame.columns:
                    for i in check(frame[column].tolist()):
                        rows[i].append(f"{column} is longer than the encoder reads ({limit}): scored on its beginning only")
            if "refs" in frame.columns:
                flat = [(i, text) for i, options in enumerate(frame["refs"]) for text in options]
                for i in sorted({flat[k][0] for k in check([text for _, text in flat])}):
                    rows[i].append(f"a reference is longer than the encoder reads ({limit}): scored on its beginning only")
        return rows


def _references(ref: Any, n: int) -> tuple[str, list]:
    """``("ref", [str])`` for one reference per segment, ``("refs", [[str, ...]])`` for several."""
    if isinstance(ref, str) or not hasattr(ref, "__len__"):
        raise DataError(f"ref must be a list of strings (one per segment), got {type(ref).__name__}")
    items = list(ref.tolist() if hasattr(ref, "tolist") else ref)
    if len(items) != n:
        raise DataError(f"ref has {len(items)} entries but src has {n}: they must be aligned, one per segment")
    if all(isinstance(item, str) for item in items):
        return "ref", _texts("ref", items)
    options = []
    for i, item in enumerate(items):
        texts = [item] if isinstance(item, str) else _texts(f"ref[{i}]", item)
        if not texts:
            raise DataError(f"ref[{i}] is an empty list: give at least one reference per segment")
        options.append(_texts(f"ref[{i}]", texts))
    return "refs", options


def _language_pairs(lp: Any, n: int) -> str | list[str | None] | None:
    """``lp`` checked: None, one ``xx-yy`` for every row, or a list of ``xx-yy``/None per row."""
    from uamt.serving.language_pair import parse_language_pair

    def check(value: Any, where: str) -> str:
        try:
            return parse_language_pair(value)
        except ValueError as exc:
            raise DataError(f"{where}: {exc}") from None

    if lp is None:
        return None
    if isinstance(lp, str):
        return check(lp, "lp")
    values = list(lp.tolist() if hasattr(lp, "tolist") else lp)
    if len(values) != n:
        raise DataError(f"lp has {len(values)} entries but src has {n}: give one per segment, or one string")
    return [None if value is None else check(value, f"lp[{i}]") for i, value in enumerate(values)]
