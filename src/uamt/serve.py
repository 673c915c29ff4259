"""REST server over a calibrated predictor (stdlib ``http.server``, one thread per connection).

Endpoints
    ``POST /invocations``  MLflow-style JSON body, one of
        ``{"dataframe_records": [{"src": .., "mt": .., "ref": ..}, ...]}``,
        ``{"dataframe_split": {"columns": [...], "data": [[...], ...]}}``,
        ``{"inputs": [records] | {column: [values]}}`` (``instances`` is an alias of ``inputs``);
        each record has ``src``, ``mt`` (strings), for a reference-based model ``ref`` (string)
        or ``refs`` (list of strings, combined by averaging), and optionally ``lp`` (all or none).  Answer:
        ``{"predictions": [{"mu", "sigma", "lower", "upper", "risk"[, "epistemic_var",
        "aleatoric_var"][, "clipped"]}, ...]}``, in request order (``clipped``: mu or the interval
        was clipped to the scale's range).
    ``GET /health``   ``{"status": "ok", "model": .., "method": .., "scale": ..}``
    ``GET /ping``     200, empty line (as ``mlflow models serve``)
    ``GET /version``  uamt and MLflow versions, model URI, method, scale

Every malformed request gets a 4xx with a one-line JSON ``{"error": ...}`` and the server keeps
serving.  The model is loaded once at startup and never chosen by a client; calls into it are
serialised with a lock (torch modules are not safe to run concurrently).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pandas as pd

from uamt.errors import UamtError
from uamt.predictor import OUTPUT_COLUMNS, Predictor
from uamt.textcheck import blank_detail, is_blank

log = logging.getLogger("uamt.serve")

FORMAT_KEYS = ("dataframe_records", "dataframe_split", "inputs", "instances")
RECORD_FIELDS = ("src", "mt", "ref", "refs", "lp")
MAX_LP_CHARS = 32
OPTIONAL_COLUMNS = ("epistemic_var", "aleatoric_var")


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


class RequestError(Exception):
    """A client error: HTTP ``status`` and a message saying what to change."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _records_from_payload(payload: Any) -> list[Any]:
    """The list of records of an MLflow-style JSON body (see module docstring)."""
    if not isinstance(payload, dict):
        raise RequestError(400, f"body must be a JSON object with one of {list(FORMAT_KEYS)}")
    unknown = sorted(set(payload) - set(FORMAT_KEYS))
    if unknown:
        raise RequestError(400, f"unknown top-level key(s) {unknown}; use exactly one of {list(FORMAT_KEYS)}")
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
    """Validates requests and scores them with one shared predictor (thread-safe)."""

    def __init__(self, predictor: Predictor, model_uri: str, settings: ServeSettings = ServeSettings()):
        if not 0.0 < settings.confidence < 1.0:
            raise UamtError(f"confidence must be in (0, 1), got {settings.confidence}")
        if settings.risk_threshold is not None and not math.isfinite(settings.risk_threshold):
            raise UamtError(f"risk threshold must be a finite number, got {settings.risk_threshold}")
        self.predictor = predictor
        self.model_uri = model_uri
        self.settings = settings
        self.risk_threshold = (
            settings.risk_threshold
            if settings.risk_threshold is not None
            else predictor.scale.default_risk_threshold
        )
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ request -> frame
    def _check_text(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise RequestError(400, f"{where} must be a string, got {type(value).__name__}")
        if is_blank(value):
            detail = blank_detail(value)
            raise RequestError(400, f"{where} is empty" + (f" ({detail})" if detail else ""))
        if len(value) > self.settings.max_chars:
            raise RequestError(
                413, f"{where} has {len(value)} characters, over the limit of {self.settings.max_chars}"
            )
        return value

    def parse(self, payload: Any) -> pd.DataFrame:
        """Validate a decoded JSON body and build the predictor's input frame."""
        records = _records_from_payload(payload)
        if not records:
            raise RequestError(400, "empty batch: send at least one record")
        if len(records) > self.settings.max_batch:
            raise RequestError(
                413,
                f"batch of {len(records)} records is over the limit of {self.settings.max_batch}; split it",
            )
        uses_refs = self.predictor.uses_references
        src, mt, refs, lps = [], [], [], []
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
            elif ref is not None:
                options = [self._check_text(ref, f"{where}.ref")]
            else:
                options = []
            if options and not uses_refs:
                raise RequestError(
                    400, f"{where}: this model is reference-free ({self.predictor.method}); drop ref/refs"
                )
            if not options and uses_refs:
                raise RequestError(
                    400, f"{where}: this model is reference-based ({self.predictor.method}); give ref or refs"
                )
            refs.append(options)
            pairs = sum(max(len(o), 1) for o in refs)
            if pairs > self.settings.max_pairs:
                raise RequestError(
                    413,
                    f"request needs {pairs}+ (segment, reference) scoring passes by {where}, over the limit "
                    f"of {self.settings.max_pairs}; send fewer records or references",
                )
            lp = record.get("lp")
            if lp is not None and (not isinstance(lp, str) or not lp.strip() or len(lp) > MAX_LP_CHARS):
                raise RequestError(400, f"{where}.lp must be a language pair string like 'en-de'")
            lps.append(lp)
        frame = pd.DataFrame({"src": src, "mt": mt})
        if any(lp is not None for lp in lps):
            if any(lp is None for lp in lps):
                missing = [i for i, lp in enumerate(lps) if lp is None]
                raise RequestError(
                    400, f"lp given on some records but not on records {missing[:10]}; give it on all"
                )
            frame["lp"] = lps
        if uses_refs:
            if all(len(options) == 1 for options in refs):
                frame["ref"] = [options[0] for options in refs]
            else:
                frame["refs"] = refs
        return frame

    # ------------------------------------------------------------------ scoring
    def predict(self, frame: pd.DataFrame) -> list[dict[str, Any]]:
        with self._lock:  # one forward pass at a time through the (torch) model
            out = self.predictor.predict_frame(
                frame,
                confidence=self.settings.confidence,
                risk_threshold=self.risk_threshold,
                batch_size=self.settings.batch_size,
                progress=False,
            )
        if len(out) != len(frame) or any(c not in out.columns for c in OUTPUT_COLUMNS):
            raise RuntimeError(f"model returned {len(out)} rows with columns {list(out.columns)}")
        columns = [*OUTPUT_COLUMNS, *[c for c in OPTIONAL_COLUMNS if c in out.columns]]
        rows = out[columns].astype(float).to_dict(orient="records")
        rows = [{k: (v if math.isfinite(v) else None) for k, v in row.items()} for row in rows]
        if "clipped" in out.columns:
            for row, clipped in zip(rows, out["clipped"].astype(bool).tolist(), strict=True):
                row["clipped"] = clipped
        return rows

    def invocations(self, body: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(body.decode("utf-8-sig"))  # a leading BOM is dropped (RFC 8259 §8.1)
        except UnicodeDecodeError as exc:
            raise RequestError(400, f"body is not UTF-8: {exc}") from None
        except json.JSONDecodeError as exc:
            raise RequestError(400, f"body is not valid JSON: {exc}") from None
        frame = self.parse(payload)
        try:
            predictions = self.predict(frame)
        except UamtError as exc:  # the model refused these inputs (e.g. text it cannot encode)
            raise RequestError(422, str(exc)) from None
        return {"predictions": predictions}

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.model_uri,
            "method": self.predictor.method,
            "uses_references": bool(self.predictor.uses_references),
            "scale": self.predictor.scale.name,
            "scale_description": self.predictor.scale.description,
            "scale_range": list(getattr(self.predictor.scale, "bounds", None) or []) or None,
            "confidence": self.settings.confidence,
            "risk_threshold": self.risk_threshold,
        }

    def version(self) -> dict[str, Any]:
        import mlflow
        from uamt import __version__

        return {"uamt": __version__, "mlflow": mlflow.__version__, **self.describe()}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uamt-serve"
    timeout = 60  # a stalled client cannot hold a thread forever
    service: ScoringService  # set on the subclass made by make_server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.info("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, payload: Any, *, text: str | None = None) -> None:
        body = (text if text is not None else json.dumps(payload, allow_nan=False) + "\n").encode("utf-8")
        self.send_response(status)
        self.send_header(
            "Content-Type", "text/plain; charset=utf-8" if text is not None else "application/json"
        )
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": message, "status": status})

    @property
    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = self._path
        if path == "/ping":
            self._send(200, None, text="\n")
        elif path == "/health":
            self._send(200, {"status": "ok", **self.service.describe()})
        elif path == "/version":
            self._send(200, self.service.version())
        elif path == "/invocations":
            self._error(405, "use POST for /invocations")
        else:
            self._error(
                404, f"no endpoint {path}; endpoints: POST /invocations, GET /health, /ping, /version"
            )

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if self._path != "/invocations":
            self._error(404, f"no endpoint POST {self._path}; POST /invocations")
            return
        limit = self.service.settings.max_body_bytes
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._error(411, "send the body with a Content-Length (chunked transfer is not supported)")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            self._error(411, "a valid Content-Length header is required")
            return
        if length > limit:
            self.close_connection = True  # the unread body must not be parsed as the next request
            if length <= 2 * limit:
                # Read and drop a moderately large body: closing a socket with unread data sends a
                # TCP reset, and the client might never see the 413 and its message.
                self._discard(length)
            self._error(413, f"body of {length} bytes is over the limit of {limit} bytes")
            return
        body = self.rfile.read(length)
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            self._error(415, f"Content-Type must be application/json, got {content_type or 'none'!r}")
            return
        try:
            result = self.service.invocations(body)
        except RequestError as exc:
            self._error(exc.status, exc.message)
            return
        except Exception:  # noqa: BLE001 - the server must stay up; details go to the log only
            log.exception("scoring failed")
            self._error(500, "internal error while scoring; see the server log")
            return
        self._send(200, result)

    def _discard(self, length: int, chunk: int = 1 << 16) -> None:
        while length > 0:
            data = self.rfile.read(min(chunk, length))
            if not data:
                break
            length -= len(data)

    def _method_not_allowed(self) -> None:
        self._error(405, f"method {self.command} not allowed")

    do_PUT = do_DELETE = do_PATCH = _method_not_allowed  # noqa: N815 - stdlib naming


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog of 5 resets connections when many clients connect at once.
    request_queue_size = 128
    daemon_threads = True


def make_server(service: ScoringService, host: str = "127.0.0.1", port: int = 5000) -> ThreadingHTTPServer:
    """A threading HTTP server bound to ``host:port`` (port 0: a free one; see ``server_address``)."""
    handler = type("UamtHandler", (_Handler,), {"service": service})
    return _Server((host, port), handler)


def run_server(model: str, settings: ServeSettings, *, host: str = "127.0.0.1", port: int = 5000) -> None:
    """Load ``model`` once and serve until interrupted."""
    from uamt.predictor import load_predictor

    predictor = load_predictor(model)
    service = ScoringService(predictor, model, settings)
    try:
        server = make_server(service, host, port)
    except OSError as exc:
        raise UamtError(f"cannot listen on {host}:{port}: {exc}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    bound_host, bound_port = server.server_address[:2]
    print(
        f"uamt serve: {model} ({predictor.method}, scale {predictor.scale.name}) on http://{bound_host}:{bound_port} "
        f"[{json.dumps(asdict(settings))}]",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
