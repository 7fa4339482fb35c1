"""Who may call and how much they may send: checks every HTTP request passes before any route runs.

- ``Host`` must name this server (an IP address, a loopback name, ``ARAG_SERVICE__HOST`` or one of
  ``ARAG_SERVICE__ALLOWED_HOSTS``), else 400: DNS rebinding points a name of the attacker's at
  127.0.0.1, so a page of theirs could read every route; its requests carry that name.
- Without API keys, a request that reached the server on a non-loopback address is refused (403).
  ``arag serve`` and ``create_app`` refuse a non-loopback ``ARAG_SERVICE__HOST`` without keys at
  start-up; this covers the app served by another command (``uvicorn --factory ... --host 0.0.0.0``),
  whose bind address the app cannot see: the ASGI scope's ``server`` is the local address each
  connection arrived at, which is what matters.
- A state-changing request (POST, PUT, PATCH, DELETE) whose ``Origin`` (or, without one, ``Referer``)
  is another site's is refused (403): a form on any web page can POST to 127.0.0.1 without a CORS
  preflight. Same-origin requests (the page arag serves) and ``ARAG_SERVICE__CORS_ORIGINS`` pass;
  so do clients that send neither header (curl, scripts: not a browser acting for a web page).
- Request bodies are counted as they stream, per route (``ARAG_SERVICE__MAX_BODY_KB``; ``/ingest``:
  its upload limits), and stopped at the limit with 413, whatever ``Content-Length`` says.
- Every response says ``X-Content-Type-Options: nosniff``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from arag.errors import AragError, ConfigError, ForbiddenError, InputError, TooLargeError
from arag.service.schemas import ErrorBody
from arag.settings import Settings

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
KEYS_FIX = "set ARAG_API_KEYS (keys of 32 characters or more) and send one, or serve on 127.0.0.1"
# The page's policy: its script and style are files of the same origin, nothing inline, no framing.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def is_loopback(host: str) -> bool:
    """A loopback address or the name ``localhost``."""
    h = host.strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def check_bind(settings: Settings) -> None:
    """A ConfigError when the service is set to listen beyond loopback without API keys."""
    host = settings.service.host
    if not is_loopback(host) and not settings.service_keys():
        raise ConfigError(
            f"refusing to serve on {host} without API keys: anyone who reaches it could use it",
            where="ARAG_SERVICE__HOST / --host",
            fix=KEYS_FIX,
        )


def error_response(exc: AragError, request_id: str | None) -> JSONResponse:
    """The JSON error body every failure gets: ``{error, where, fix, status, request_id}``."""
    body = ErrorBody(
        error=exc.what, where=exc.where, fix=exc.fix, status=exc.http_status, request_id=request_id
    )
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    return JSONResponse(body.model_dump(), status_code=exc.http_status, headers=headers)


class BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive`` when a body passes its route's limit: FastAPI lets HTTP exceptions
    out of its body parsing, so the app's handler answers it with the usual JSON body."""

    def __init__(self, error: TooLargeError) -> None:
        super().__init__(status_code=413, detail=error.what)
        self.error = error


def _host_name(host_header: str) -> str:
    """The name in a Host header, without its port (IPv6 literals keep their brackets off)."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")].lower() if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0].lower() if host_header.count(":") == 1 else host_header.lower()


def _netloc(url: str) -> str | None:
    """``host[:port]`` of an http(s) URL, the default port dropped; None for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = 443 if parts.scheme == "https" else 80
    return host.lower() if port in (None, default) else f"{host.lower()}:{port}"


def _same_host(host_header: str, scheme: str) -> str:
    return _netloc(f"{scheme}://{host_header}") or host_header.lower()


@dataclass(frozen=True)
class Policy:
    """What the guard allows, from the settings."""

    keys_on: bool
    names: frozenset[str]
    cors_origins: frozenset[str]
    json_limit: int
    ingest_limit: int

    @classmethod
    def of(cls, settings: Settings) -> Policy:
        s = settings.service
        names = {n.lower() for n in (*LOOPBACK_NAMES, s.host, *s.allowed_hosts)}
        origins = frozenset(o for o in (_netloc(o) for o in s.cors_origins) if o)
        return cls(
            keys_on=bool(settings.service_keys()),
            names=frozenset(names),
            cors_origins=origins,
            json_limit=s.max_body_kb * 1000,
            ingest_limit=int(s.max_upload_mb * 1e6) * s.max_upload_files + 1_000_000,
        )

    def limit(self, method: str, path: str) -> int:
        return self.ingest_limit if method == "POST" and path.rstrip("/") == "/ingest" else self.json_limit

    def refuse(self, scope: Scope, headers: Headers) -> AragError | None:
        """Why this request may not go on, or None."""
        host_header = headers.get("host", "")
        name = _host_name(host_header)
        if not (name in self.names or _is_ip(name)):
            return InputError(
                f"this server does not answer to the name {name!r} (the Host header)",
                where="Host",
                fix="call it by its address or 'localhost'; a name of your own must be listed in "
                "ARAG_SERVICE__ALLOWED_HOSTS",
            )
        server = scope.get("server")
        if not self.keys_on and server is not None and not is_loopback(str(server[0])):
            return ForbiddenError(
                f"this request reached the server on {server[0]}, beyond loopback, and no API keys are set",
                where="listen address",
                fix=KEYS_FIX,
            )
        if scope["method"] in UNSAFE_METHODS:
            sent = headers.get("origin")
            source = "Origin"
            if sent is None and headers.get("referer"):
                sent, source = headers["referer"], "Referer"
            if sent is not None:
                origin = _netloc(sent)
                same = origin is not None and origin == _same_host(host_header, scope.get("scheme", "http"))
                if not (same or origin in self.cors_origins):
                    return ForbiddenError(
                        f"a {scope['method']} from another site ({source}: {sent[:100]!r}) is refused",
                        where=source,
                        fix="use the page this server serves, or list the site's origin in "
                        "ARAG_SERVICE__CORS_ORIGINS",
                    )
        return None


class RequestGuard:
    """The ASGI middleware that applies a :class:`Policy` to every HTTP request."""

    def __init__(self, app: ASGIApp, policy: Policy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_nosniff(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-content-type-options", b"nosniff")]
            await send(message)

        rid = scope.get("state", {}).get("request_id")
        headers = Headers(scope=scope)
        refusal = self.policy.refuse(scope, headers)
        if refusal is not None:
            await error_response(refusal, rid)(scope, receive, send_nosniff)
            return
        limit = self.policy.limit(scope["method"], scope["path"])
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await error_response(_too_large(int(declared), limit, scope["path"]), rid)(
                scope, receive, send_nosniff
            )
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(_too_large(seen, limit, scope["path"]))
            return message

        try:
            await self.app(scope, counted, send_nosniff)
        except BodyTooLarge as exc:  # read outside FastAPI's body parsing (a form): answered here
            if started:
                raise
            await error_response(exc.error, rid)(scope, receive, send_nosniff)


def _too_large(size: int, limit: int, path: str) -> TooLargeError:
    setting = (
        "ARAG_SERVICE__MAX_UPLOAD_MB / __MAX_UPLOAD_FILES"
        if path.startswith("/ingest")
        else ("ARAG_SERVICE__MAX_BODY_KB")
    )
    return TooLargeError(
        f"the request body is over this route's limit of {limit:,} bytes ({size:,} bytes so far)",
        where="body",
        fix=f"send a smaller body (the limit is set by {setting})",
    )
