"""The REST contract of ``uamt serve``: request bodies -> the predictor's frame, predictions -> JSON.

Kept apart from the HTTP transport (:mod:`uamt.serving.server`), so that every rule below is tested without
a socket.

Request (``POST /invocations``), one of MLflow's JSON formats
    ``{"dataframe_records": [{"src": .., "mt": .., "ref": ..}, ...]}``,
    ``{"dataframe_split": {"columns": [...], "data": [[...], ...]}}``,
    ``{"inputs": [records] | {column: [values]}}`` (``instances`` is an alias of ``inputs``);
    optionally with MLflow's ``"params": {"flag_below": CHI, "max_risk": P}`` beside them, which adds
    ``flagged`` = served P(Q <= CHI) > P (P defaults to 0.5) and, when CHI is not the server's risk
    threshold, ``flag_risk`` = that probability (a second scoring pass) to each prediction.
    Each record has ``src``, ``mt`` (strings), for a reference-based model ``ref`` (string) or
    ``refs`` (list of strings, combined by averaging), and optionally ``lp`` (on all records or
    none; it selects the per-LP calibration).  A pair the model has no calibration of its own for
    (never seen in training) is scored with the global calibration widened by the model's
    ``unseen_lp_sigma_factor`` and warned about.  Records without ``lp`` get the global calibration:
    the pair is not detected per request (a few short records are too little text to detect a
    language reliably, and detection would cost every request); send ``lp``.
Answer
    ``{"predictions": [{"mu", "sigma", "lower", "upper", "risk"[, "epistemic_var",
    "aleatoric_var"][, "clipped"][, "flag_risk"][, "flagged"][, "calibration",
    "lp_seen_in_training"]}, ...][, "warnings":
    [...]]}`` in request order; ``clipped``: mu or the interval was clipped to the scale's range;
    ``calibration`` (when ``lp`` is given): ``"per-lp"`` or ``"global"``; ``lp_seen_in_training``:
    false for an LP outside the model's calibration, whose interval is widened; ``warnings``: one
    message per such LP.

The same bodies as pydantic models derived from the model's signature, for the OpenAPI schema
(``make_app(service).openapi()``): :mod:`uamt.serving.rest_schema`.

Every malformed request raises :class:`RequestError` (HTTP 400, or 413 for a limit) with a message
naming the record and field.  Calls into the model are serialised by the caller (torch modules
are not safe to run concurrently).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from uamt.campaigns import CAMPAIGN_NAME, CAMPAIGN_NAME_RULE
from uamt.core.errors import UamtError
from uamt.core.textcheck import blank_detail, is_blank
from uamt.serving.predictor import Predictor
from uamt.serving.scorer import FlagSettings, ScoringSettings, work_chunks  # noqa: F401 - work_chunks: its old home

FORMAT_KEYS = ("dataframe_records", "dataframe_split", "inputs", "instances")
#: Fields of the request's ``params`` (MLflow's place for inference parameters beside the data).
PARAM_FIELDS = ("flag_below", "max_risk")
RECORD_FIELDS = ("src", "mt", "ref", "refs", "lp", "campaign")
MAX_LP_CHARS = 32
#: Characters per second the served model reads (MiniLM on ONNX, one process on 2 busy CPU cores,
#: measured for :data:`MAX_WORK_CHARS`); only the first estimate of :class:`AdmissionControl`, which
#: then measures its own rate for ``Retry-After``.
ASSUMED_CHARS_PER_S = 12_000
#: Default work budget of one request, in characters read by the model (:func:`scoring_work`):
#: about 4 s of scoring at the rate above, so a small request waits at most that long behind it.
MAX_WORK_CHARS = 60_000


@dataclass(frozen=True)
class ServeSettings:
    """Limits and prediction settings of the server (all fixed at startup)."""

    confidence: float = 0.9
    risk_threshold: float | None = None
    batch_size: int = 64
    max_batch: int = 256
    max_chars: int = 2000
    max_body_bytes: int = 16 * 1024 * 1024
    #: References per record, and (segment, reference) pairs per request: each pair is one scoring
    #: pass under the model lock, so these bound how long one request can stall the others.
    max_refs: int = 8
    max_pairs: int = 1024
    #: Seconds a client may take to send a request's headers, and then its body (slow clients).
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    #: Admission control (:class:`AdmissionControl`): the characters the model reads for one request
    #: (:func:`scoring_work`), how many requests may wait for the model while one is scored, and how
    #: long a request may take from admission to answer, waiting included.
    max_work_chars: int = MAX_WORK_CHARS
    max_waiting: int = 64
    request_timeout_s: float = 30.0


class RequestError(Exception):
    """A client error: HTTP ``status`` and a message saying what to change; ``retry_after``:
    seconds after which the same request may succeed (a busy server's 503)."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


def decode_body(body: bytes) -> Any:
    """The JSON value of ``body``; RequestError 400 for anything Python's json cannot hold."""
    try:
        return json.loads(body.decode("utf-8-sig"))  # a leading BOM is dropped (RFC 8259 §8.1)
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"body is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise RequestError(400, f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError(400, "body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits)
        raise RequestError(400, f"body is not valid JSON: {exc}") from None


def records_from_payload(payload: Any) -> list[Any]:
    """The list of records of an MLflow-style JSON body (see module docstring)."""
    if not isinstance(payload, dict):
        raise RequestError(400, f"body must be a JSON object with one of {list(FORMAT_KEYS)}")
    unknown = sorted(set(payload) - set(FORMAT_KEYS) - {"params"})
    if unknown:
        raise RequestError(
            400, f"unknown top-level key(s) {unknown}; use exactly one of {list(FORMAT_KEYS)} (and optionally params)"
        )
    present = [k for k in FORMAT_KEYS if k in payload]
    if len(present) != 1:
        raise RequestError(400, f"use exactly one of {list(FORMAT_KEYS)}, got {present or 'none'}")
    key = present[0]
    value = payload[key]
    if key == "dataframe_split":
        if not isinstance(value, dict) or not isinstance(value.get("columns"), list) or "data" not in value:
            raise RequestError(400, 'dataframe_split must be {"columns": [...], "data": [[...], ...]}')
        columns, data = value["columns"], value["data"]
        if not all(isinstance(c, str) for c in columns) or len(set(columns)) != len(columns):
            raise RequestError(400, "dataframe_split.columns must be distinct strings")
        if not isinstance(data, list):
            raise RequestError(400, "dataframe_split.data must be a list of rows")
        rows = []
        for i, row in enumerate(data):
            if not isinstance(row, list) or len(row) != len(columns):
                raise RequestError(400, f"dataframe_split.data[{i}] must be a list of {len(columns)} values")
            rows.append(dict(zip(columns, row, strict=True)))
        return rows
    if isinstance(value, dict) and key in ("inputs", "instances"):
        lengths = {c: len(v) if isinstance(v, list) else None for c, v in value.items()}
        if any(n is None for n in lengths.values()) or len(set(lengths.values())) > 1:
            raise RequestError(400, f"{key} as columns must map each field to a list of one common length")
        n = next(iter(lengths.values()), 0)
        return [{c: value[c][i] for c in value} for i in range(n)]
    if not isinstance(value, list):
        raise RequestError(400, f"{key} must be a list of records")
    return value


class ScoringService:
    """Validates requests and scores them with one shared predictor (the caller serialises calls).

    ``registered``: what the registry says about the model (name, version, alias), for /metadata.
    """

    def __init__(
        self,
        predictor: Predictor,
        model_uri: str,
        settings: ServeSettings = ServeSettings(),
        registered: dict[str, Any] | None = None,
    ):
        #: What the numbers depend on, checked once (confidence in (0, 1), a finite threshold).
        self.scoring = ScoringSettings(settings.confidence, settings.risk_threshold, settings.batch_size)
        self.predictor = predictor
        self.model_uri = model_uri
        self.settings = settings
        self.registered = registered or {}
        self.risk_threshold = self.scoring.threshold_for(predictor)
        #: lp -> "per-lp" | "global" for a uamt pyfunc; None: the predictor does not say (any lp passes)
        self.language_pairs: dict[str, str] | None = getattr(predictor, "language_pairs", None)

    # ------------------------------------------------------------------ request -> frame
    def _check_text(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise RequestError(400, f"{where} must be a string, got {type(value).__name__}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # JSON allows "\ud800"; no tokenizer can read it
            bad = value[exc.start]
            raise RequestError(
                400, f"{where} is not valid Unicode (lone surrogate U+{ord(bad):04X})"
            ) from None
        if is_blank(value):
            detail = blank_detail(value)
            raise RequestError(400, f"{where} is empty" + (f" ({detail})" if detail else ""))
        if len(value) > self.settings.max_chars:
            raise RequestError(
                413, f"{where} has {len(value)} characters, over the limit of {self.settings.max_chars}"
            )
        return value

    def _check_lp(self, lp: Any, where: str) -> str:
        if not isinstance(lp, str) or not lp.strip() or len(lp) > MAX_LP_CHARS:
            raise RequestError(400, f"{where} must be a language pair string like 'en-de'")
        return lp

    def _lp_choices(self, frame: pd.DataFrame) -> dict[str, Any]:
        """lp -> :class:`~uamt.serving.language_pair.LanguagePairChoice` of each distinct ``lp`` of
        ``frame`` (an unseen one is scored with the widened global calibration and warned about)."""
        from uamt.serving.language_pair import predictor_language_pair

        if "lp" not in frame.columns:
            return {}
        return {lp: predictor_language_pair(self.predictor, [], [], lp) for lp in sorted(set(frame["lp"]))}

    def _references(self, record: dict, where: str) -> list[str]:
        ref, ref_list = record.get("ref"), record.get("refs")
        if ref is not None and ref_list is not None:
            raise RequestError(400, f"{where}: give either ref or refs, not both")
        if ref_list is not None:
            if not isinstance(ref_list, list) or not ref_list:
                raise RequestError(400, f"{where}.refs must be a non-empty list of strings")
            if len(ref_list) > self.settings.max_refs:
                raise RequestError(
                    413,
                    f"{where}.refs has {len(ref_list)} references, over the limit of "
                    f"{self.settings.max_refs} per record",
                )
            options = [self._check_text(r, f"{where}.refs[{k}]") for k, r in enumerate(ref_list)]
        else:
            options = [self._check_text(ref, f"{where}.ref")] if ref is not None else []
        kind = "reference-free" if not self.predictor.uses_references else "reference-based"
        if bool(options) != bool(self.predictor.uses_references):
            action = "drop ref/refs" if options else "give ref or refs"
            raise RequestError(400, f"{where}: this model is {kind} ({self.predictor.method}); {action}")
        return options

    def parse(self, payload: Any) -> pd.DataFrame:
        """Validate a decoded JSON body and build the predictor's input frame."""
        records = records_from_payload(payload)
        if not records:
            raise RequestError(400, "empty batch: send at least one record")
        if len(records) > self.settings.max_batch:
            raise RequestError(
                413,
                f"batch of {len(records)} records is over the limit of {self.settings.max_batch}; split it",
            )
        src, mt, refs, lps, campaigns = [], [], [], [], []
        for i, record in enumerate(records):
            where = f"record {i}"
            if not isinstance(record, dict):
                raise RequestError(
                    400, f"{where} must be an object with src, mt[, ref], got {type(record).__name__}"
                )
            unknown = sorted(set(record) - set(RECORD_FIELDS))
            if unknown:
                raise RequestError(
                    400, f"{where}: unknown field(s) {unknown}; fields are {list(RECORD_FIELDS)}"
                )
            for field in ("src", "mt"):
                if field not in record:
                    raise RequestError(400, f"{where}: missing field {field!r}")
            src.append(self._check_text(record["src"], f"{where}.src"))
            mt.append(self._check_text(record["mt"], f"{where}.mt"))
            refs.append(self._references(record, where))
            pairs = sum(max(len(o), 1) for o in refs)
            if pairs > self.settings.max_pairs:
                raise RequestError(
                    413,
                    f"request needs {pairs}+ (segment, reference) scoring passes by {where}, over the limit "
                    f"of {self.settings.max_pairs}; send fewer records or references",
                )
            lp = record.get("lp")
            lps.append(None if lp is None else self._check_lp(lp, f"{where}.lp"))
            campaign = record.get("campaign")
            if campaign is not None and not (isinstance(campaign, str) and CAMPAIGN_NAME.fullmatch(campaign)):
                raise RequestError(400, f"{where}.campaign must be a campaign name ({CAMPAIGN_NAME_RULE})")
            campaigns.append(campaign)
        flag = self.flag_of(payload)
        works = scoring_work(src, mt, refs)
        if flag is not None and not math.isclose(flag.flag_below, self.risk_threshold):
            works *= 2  # a second pass gives the risk at flag_below
        self._check_work(works)
        frame = pd.DataFrame({"src": src, "mt": mt})
        # The request's own option travels with its frame from parse() to answer().
        frame.attrs["flag"] = flag
        if any(lp is not None for lp in lps):
            missing = [i for i, lp in enumerate(lps) if lp is None]
            if missing:
                raise RequestError(
                    400, f"lp given on some records but not on records {missing[:10]}; give it on all"
                )
            frame["lp"] = lps
        if any(c is not None for c in campaigns):  # checked against the model's campaigns when scored
            frame["campaign"] = campaigns
        if self.predictor.uses_references:
            if all(len(options) == 1 for options in refs):
                frame["ref"] = [options[0] for options in refs]
            else:
                frame["refs"] = refs
        return frame

    @staticmethod
    def flag_of(payload: Any) -> FlagSettings | None:
        """The request's flag settings from ``params`` (``flag_below``, ``max_risk`` default 0.5),
        or None; RequestError 400 naming the field otherwise."""
        params = payload.get("params") if isinstance(payload, dict) else None
        if params is None:
            return None
        if not isinstance(params, dict):
            raise RequestError(400, f"params must be an object with {list(PARAM_FIELDS)}, got {type(params).__name__}")
        unknown = sorted(set(params) - set(PARAM_FIELDS))
        if unknown:
            raise RequestError(400, f"params: unknown field(s) {unknown}; fields are {list(PARAM_FIELDS)}")
        for field in PARAM_FIELDS:
            value = params.get(field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise RequestError(400, f"params.{field} must be a number, got {type(value).__name__}")
        if params.get("flag_below") is None:
            if params.get("max_risk") is not None:
                raise RequestError(400, "params.max_risk needs params.flag_below (the quality threshold the risk is about)")
            return None
        try:
            return FlagSettings(params["flag_below"], 0.5 if params.get("max_risk") is None else params["max_risk"])
        except UamtError as exc:
            raise RequestError(400, f"params.{exc}") from None

    def _check_work(self, work: int) -> None:
        limit = self.settings.max_work_chars
        if work > limit:
            raise RequestError(
                413,
                f"request needs {work:,} characters of scoring work (src + mt + reference of every scoring "
                f"pass), over the limit of {limit:,} per request (about {limit / ASSUMED_CHARS_PER_S:.0f} s "
                "of the model); split it into smaller requests",
            )

    # ------------------------------------------------------------------ scoring
    def predict(self, frame: pd.DataFrame, deadline: float | None = None) -> list[dict[str, Any]]:
        """JSON-ready prediction rows of ``frame``, scored by :func:`uamt.serving.scorer.score_texts`
        (no detection: each record's ``lp`` or the global calibration); with a ``deadline``
        (time.monotonic) in chunks of about one encoder batch.  A model refusal of the inputs ->
        RequestError 422; past ``deadline`` -> RequestError 504."""
        from uamt.serving import scorer

        flag = frame.attrs.get("flag")
        try:
            scored = scorer.score_texts(self.predictor, frame, self.scoring, detect_lp=False, deadline=deadline)
            flags = {} if flag is None else scorer.score_flags(
                self.predictor, frame, scored, flag, detect_lp=False, deadline=deadline
            )
        except scorer.ModelOutputError as exc:  # the server's model is broken: not the client's fault
            raise RuntimeError(str(exc)) from None
        except scorer.ScoringTimeout as exc:
            raise RequestError(
                504,
                f"scoring took longer than the limit of {self.settings.request_timeout_s:g} s per request "
                f"(waiting included); stopped after {exc.done} of {exc.total} records and nothing was "
                "returned; send fewer or shorter records",
            ) from None
        except UamtError as exc:  # the model refused these inputs (e.g. text it cannot encode)
            raise RequestError(422, str(exc)) from None
        out = scored.out
        rows = out[scorer.output_columns(out)].astype(float).to_dict(orient="records")
        rows = [{k: (v if math.isfinite(v) else None) for k, v in row.items()} for row in rows]
        if "clipped" in out.columns:
            for row, clipped in zip(rows, out["clipped"].astype(bool).tolist(), strict=True):
                row["clipped"] = clipped
        for column, values in flags.items():
            for row, value in zip(rows, values.tolist(), strict=True):
                row[column] = value if column == "flagged" or math.isfinite(value) else None
        choices = self._lp_choices(frame)
        if choices:
            for row, lp in zip(rows, frame["lp"].tolist(), strict=True):
                if self.language_pairs is not None:
                    row["calibration"] = self.language_pairs.get(lp, "global")
                if choices[lp].known_lps:  # a predictor that names no LP cannot tell
                    row["lp_seen_in_training"] = not choices[lp].unseen
        return rows

    def warnings(self, frame: pd.DataFrame) -> list[str]:
        """What the client should read about ``frame``'s LPs (unseen ones), most important first."""
        return [message for choice in self._lp_choices(frame).values() for message in choice.messages()]

    def answer(self, frame: pd.DataFrame, deadline: float | None = None) -> dict[str, Any]:
        """The response body for a parsed request: ``predictions`` and, where any, ``warnings``."""
        answer: dict[str, Any] = {"predictions": self.predict(frame, deadline)}
        warnings = self.warnings(frame)
        if warnings:
            answer["warnings"] = warnings
        return answer

    def invocations(self, body: bytes) -> dict[str, Any]:
        """Parse, validate and score one request body (RequestError for a client error)."""
        return self.answer(self.parse(decode_body(body)))

    # ------------------------------------------------------------------ what the server says about itself
    def describe(self) -> dict[str, Any]:
        """The model and the settings in force (``/health``); the model as :func:`public_model_name`
        says it (never a path on the server's disk)."""
        scale = self.predictor.scale
        return {
            "model": public_model_name(self.model_uri),
            **{k: v for k, v in self.registered.items() if k in ("version", "alias")},
            "method": self.predictor.method,
            "uses_references": bool(self.predictor.uses_references),
            "scale": scale.name,
            "scale_description": scale.description,
            "scale_range": list(getattr(scale, "bounds", None) or []) or None,
            "confidence": self.settings.confidence,
            "risk_threshold": self.risk_threshold,
        }

    def version(self) -> dict[str, Any]:
        """uamt and MLflow versions and the model (``/version``)."""
        import mlflow
        from uamt import __version__

        return {"uamt": __version__, "mlflow": mlflow.__version__, **self.describe()}

    def metadata(self) -> dict[str, Any]:
        """What the model was trained and calibrated on, and the limits in force (``/metadata``)."""
        from dataclasses import asdict

        own = getattr(self.predictor, "metadata", None)  # a uamt pyfunc's: datasets, LPs, calibration
        return {
            **self.version(),
            "registered_model": self.registered or None,
            **(own() if callable(own) else {}),
            "limits": asdict(self.settings),
        }


def public_model_name(model_uri: str) -> str:
    """What the server tells clients its model is: a ``models:/`` or ``runs:/`` URI as given, any
    other (a local folder, a ``file:`` or remote URI) by its last path component only -- where the
    model lies on the server's disk is no client's business."""
    if model_uri.startswith(("models:/", "runs:/")):
        return model_uri
    from pathlib import PurePosixPath
    from urllib.parse import unquote, urlparse

    path = unquote(urlparse(model_uri).path) if "://" in model_uri else model_uri
    return PurePosixPath(path.rstrip("/")).name or "model"


def registered_version(model_uri: str, tracking_uri: str | None = None) -> dict[str, Any]:
    """Name, version and alias of a ``models:/NAME@ALIAS`` or ``models:/NAME/N`` URI (read-only);
    empty for a run or a folder.

    The alias is looked up in the store every command uses (:func:`uamt.registry.store.tracking_uri`;
    ``$MLFLOW_REGISTRY_URI`` where set, as :func:`uamt.serving.predictor.load_predictor` does), never in
    MLflow's own default (which would create ``mlflow.db`` in the working folder).
    """
    if not model_uri.startswith("models:/"):
        return {}
    from uamt.registry import store as registry

    name, _, rest = model_uri[len("models:/") :].partition("@")
    if rest:
        from mlflow import MlflowClient

        uri = registry.tracking_uri(tracking_uri)
        registry_uri = registry.registry_uri(uri)
        registry.check_store_schema(registry_uri)  # read-only: never create or migrate it
        with registry.store_errors(registry_uri):
            client = MlflowClient(tracking_uri=uri, registry_uri=registry_uri)
            version = client.get_model_version_by_alias(name, rest)
        return {"name": name, "version": str(version.version), "alias": rest}
    name, _, number = name.partition("/")
    return {"name": name, "version": number or None}


# ---------------------------------------------------------------------------------- admission control
def scoring_work(src: Sequence[str], mt: Sequence[str], refs: Sequence[Sequence[str]]) -> int:
    """Characters the model reads to score these records: for every scoring pass (one per reference,
    or one without references), the record's ``src`` + ``mt`` + that reference.  Scoring time is
    about proportional to it (the encoder reads every text; texts past its token limit are counted
    in full, which errs on the safe side)."""
    work = 0
    for s, m, options in zip(src, mt, refs, strict=True):
        base = len(s) + len(m)
        work += sum(base + len(r) for r in options) if options else base
    return work


def frame_work(frame: pd.DataFrame) -> list[int]:
    """:func:`scoring_work` of each row of a parsed request frame."""
    if "refs" in frame.columns:
        refs = frame["refs"].tolist()
    elif "ref" in frame.columns:
        refs = [[r] for r in frame["ref"].tolist()]
    else:
        refs = [[] for _ in range(len(frame))]
    return [scoring_work([s], [m], [r]) for s, m, r in zip(frame["src"], frame["mt"], refs, strict=True)]


class AdmissionControl:
    """Who gets the model, and when a request is refused instead of left waiting.

    One request is scored at a time (torch modules are not safe to run concurrently), the others
    wait in arrival order.  At most ``settings.max_waiting`` may wait: the next one gets 503 at
    once.  A request that has not reached the model ``settings.request_timeout_s`` after admission
    gets 503; one still scoring then is stopped between encoder batches with 504
    (:meth:`ScoringService.answer`'s deadline).  Each 503 carries ``Retry-After``: the seconds the
    work admitted before it should take, at the rate measured on this server's past requests.
    Together with the work budget per request (``max_work_chars``, checked when the request is
    parsed) this bounds how long a small request can wait behind large ones.

    Not thread-safe: used from the server's one event loop.
    """

    def __init__(self, settings: ServeSettings):
        if not (math.isfinite(settings.request_timeout_s) and settings.request_timeout_s > 0):
            raise UamtError(f"request_timeout_s must be a number of seconds > 0, got {settings.request_timeout_s}")
        if settings.max_waiting < 0 or settings.max_work_chars < 1:
            raise UamtError(
                f"max_waiting must be >= 0 and max_work_chars >= 1, got {settings.max_waiting} and "
                f"{settings.max_work_chars}"
            )
        self.settings = settings
        self.waiting = 0
        self.pending_work = 0  # characters of the requests admitted and not answered yet
        self.chars_per_s = float(ASSUMED_CHARS_PER_S)
        self._lock = asyncio.Lock()

    def retry_after(self) -> int:
        """Seconds until the work admitted now should be done (at least 1)."""
        return max(1, math.ceil(self.pending_work / self.chars_per_s))

    @contextlib.asynccontextmanager
    async def slot(self, work: int) -> AsyncIterator[float]:
        """Hold the model for a request of ``work`` characters; yields its deadline (time.monotonic)."""
        limit = self.settings.request_timeout_s
        deadline = time.monotonic() + limit
        if self._lock.locked() and self.waiting >= self.settings.max_waiting:
            raise RequestError(
                503,
                f"server busy: {self.waiting} requests are already waiting for the model (the limit); "
                f"retry after {self.retry_after()} s",
                retry_after=self.retry_after(),
            )
        self.waiting += 1
        self.pending_work += work
        try:
            try:
                await asyncio.wait_for(self._lock.acquire(), timeout=limit)
            except TimeoutError:
                raise RequestError(
                    503,
                    f"server busy: the model was not free within the limit of {limit:g} s per request; "
                    f"retry after {self.retry_after()} s",
                    retry_after=self.retry_after(),
                ) from None
            finally:
                self.waiting -= 1
            started = time.monotonic()
            try:
                yield deadline
            finally:
                self._lock.release()
                elapsed = time.monotonic() - started
                if work and elapsed > 0.05:  # too short a request says little about the rate
                    self.chars_per_s = 0.7 * self.chars_per_s + 0.3 * (work / elapsed)
        finally:
            self.pending_work -= work
