"""``uamt serve``: :mod:`uamt.serving.rest` on FastAPI + uvicorn (h11), the endpoints of ``mlflow models serve`` and
``/metadata``.  Not MLflow's server: it answers limits with 400 not 413, echoes the input in its errors,
drops ``refs`` (outside the signature), predicts concurrently.  h11 refuses conflicting lengths and never
reads a body as a second request; a body over the limit is refused unread; headers and body have deadlines;
each request has a work budget, a place in a bounded queue (503 + ``Retry-After`` when full) and a time limit.
It has no authentication and no TLS: binding an address other machines can reach (``--host 0.0.0.0``) is
warned about on stderr (:func:`exposure_warning`).
"""

import asyncio
import ipaddress
import socket
import sys

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from uamt.core.errors import UamtError
from uamt.serving.rest import AdmissionControl, RequestError, ScoringService, decode_body, frame_work

ENDPOINTS = "POST /invocations, GET /ping, /health, /version, /metadata"


def _error(request: Request, exc: Exception) -> JSONResponse:
    """``{"error", "status"}`` for a RequestError, a routing error (404, 405) or a bug (500)."""
    if isinstance(exc, HTTPException):
        where = f"{request.method} {request.url.path}"
        exc = RequestError(exc.status_code, f"{where}: {exc.detail}; use {ENDPOINTS}")
    elif not isinstance(exc, RequestError):
        exc = RequestError(500, "internal error; see the server log")
    headers = {"Connection": "close"} if exc.status in (408, 411, 413) else {}  # the body is left unread
    if getattr(exc, "retry_after", None) is not None:
        headers["Retry-After"] = str(exc.retry_after)
    return JSONResponse({"error": exc.message, "status": exc.status}, exc.status, headers or None)


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is None or "transfer-encoding" in request.headers:  # a proxy may read either one
        raise RequestError(411, "send the body with a Content-Length and no Transfer-Encoding (no chunks)")
    if int(length) > limit:  # refused before a byte of it is read
        raise RequestError(413, f"body of {length} bytes is over the limit of {limit} bytes")
    return await request.body()


def make_app(service: ScoringService) -> FastAPI:
    """The FastAPI app of ``service``; calls into the model go one at a time (torch is not thread-safe),
    admitted, queued, refused or stopped by :class:`~uamt.serving.rest.AdmissionControl`."""
    from fastapi.openapi.utils import get_openapi

    from uamt import __version__
    from uamt.serving.rest_schema import add_invocations_schema, rest_models

    # No /openapi.json or /docs route (the served surface is MLflow's); app.openapi() gives the schema.
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, title="uamt serve", version=__version__)
    models = rest_models(bool(service.predictor.uses_references))
    limits, admission = service.settings, AdmissionControl(service.settings)
    app.get("/ping")(lambda: PlainTextResponse("\n"))
    app.get("/health")(lambda: {"status": "ok", **service.describe()})
    app.get("/version")(service.version)
    app.get("/metadata")(service.metadata)
    for kind in (RequestError, HTTPException, Exception):
        app.exception_handler(kind)(_error)

    @app.post("/invocations", responses={200: {"model": models["response"]}})
    async def invocations(request: Request):
        content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            raise RequestError(415, f"Content-Type must be application/json, got {content_type or 'none'!r}")
        try:
            body = await asyncio.wait_for(_read_body(request, limits.max_body_bytes), limits.body_timeout_s)
        except (TimeoutError, ClientDisconnect):
            raise RequestError(408, f"body not received within {limits.body_timeout_s:g} s") from None
        frame = await asyncio.to_thread(lambda: service.parse(decode_body(body)))
        async with admission.slot(sum(frame_work(frame))) as deadline:
            return await asyncio.to_thread(service.answer, frame, deadline)

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            app.openapi_schema = add_invocations_schema(schema, models["request"])
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


class HeaderDeadlineH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers (uvicorn has none)."""

    header_timeout_s, _deadline = 10.0, None

    def _arm(self) -> None:
        getattr(self._deadline, "cancel", lambda: None)()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expire)

    def _expire(self) -> None:  # no request in progress: its headers are late (or the client idles)
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()


def exposure_warning(host: str) -> str | None:
    """A warning when ``host`` is an address other machines can reach (anything but loopback), else None.

    A name is resolved; one that does not resolve is left to the bind to refuse.
    """
    name = host.strip("[]")
    try:
        addresses = {ipaddress.ip_address(name.split("%", 1)[0])}
    except ValueError:
        try:
            found = socket.getaddrinfo(name, None)
        except OSError:
            return None
        addresses = {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in found}
    if all(address.is_loopback for address in addresses):
        return None
    where = (
        "every network interface"
        if any(address.is_unspecified for address in addresses)
        else "an interface other machines can reach"
    )
    return (
        f"--host {host} listens on {where}: anyone who can reach this machine can use the model "
        "(the server has no authentication and no TLS; only its request limits protect it). Keep the "
        "default 127.0.0.1 and put an authenticating reverse proxy in front, or firewall the port"
    )


def make_server(service: ScoringService, host: str = "127.0.0.1", port: int = 5000):
    """``(server, sock)``: a uvicorn server for ``service``, to ``server.run(sockets=[sock])``; port 0: a free one.

    A ``host`` other machines can reach is warned about on stderr (:func:`exposure_warning`).
    """
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise UamtError(f"cannot listen on {host}:{port}: {exc}") from None
    warning = exposure_warning(host)
    if warning:
        print(f"uamt serve: warning: {warning}", file=sys.stderr, flush=True)
    protocol = type("Protocol", (HeaderDeadlineH11,), {"header_timeout_s": service.settings.header_timeout_s})
    return uvicorn.Server(uvicorn.Config(make_app(service), http=protocol, log_level="info")), sock
