"""The FastAPI app: built by :func:`create_app`, the library (models, index, compiled agent) opened
once at start-up and shared by every request. Blocking work runs in bounded worker pools (one for
answers, one for searches), so a slow answer never stalls ``/health``, a search or another request.

    uvicorn --factory arag.service.app:create_app     # or: arag serve
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from arag.api import Library
from arag.errors import AragError, StoreError
from arag.service.background import Background, Trainer, open_serving_library, start_background
from arag.service.guard import PAGE_HEADERS, BodyTooLarge, Policy, RequestGuard, check_bind, error_response
from arag.service.jobs import Jobs
from arag.service.runner import WorkPool
from arag.service.schemas import ErrorBody
from arag.service.security import KeyGuard, RateLimiter
from arag.settings import Settings, get_settings
from arag.version import __version__

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).parent / "web"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass
class Service:
    """What the routes share: settings, the open library (or why it could not open), the worker
    pool, the ingest jobs and the key guard."""

    settings: Settings
    pool: WorkPool
    search_pool: WorkPool
    guard: KeyGuard
    library: Library | None = None
    jobs: Jobs | None = None
    load_error: AragError | None = None
    background: Background | None = None

    def lib(self) -> Library:
        """The open library; the start-up error (503) when it could not be opened."""
        if self.library is None:
            raise self.load_error or StoreError(
                "the library is still loading", where="start-up", fix="retry in a few seconds"
            )
        return self.library

    def ingest(self) -> Jobs:
        self.lib()
        assert self.jobs is not None
        return self.jobs


def _validation_message(exc: RequestValidationError) -> tuple[str, str]:
    """One line per invalid field: 'body.question: String should have at least 1 character'."""
    parts, wheres = [], []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
        wheres.append(loc)
    return "; ".join(parts) or "invalid request", ", ".join(dict.fromkeys(wheres)) or "body"


def create_app(
    settings: Settings | None = None,
    *,
    library: Library | None = None,
    background: bool | None = None,
    trainer: Trainer | None = None,
) -> FastAPI:
    """The app. ``library``: serve this open library (tests, benchmarks) instead of opening the
    configured one at start-up; the app then leaves it open at shutdown. ``background``: build an
    empty or interrupted default library while serving, and train the reranker with ``trainer``
    after it (as the settings allow); by default only when the app opens the library itself. A
    ConfigError when the settings would serve beyond loopback without API keys, or name a key under
    32 characters."""
    background = library is None if background is None else background
    settings = settings if settings is not None else get_settings()
    check_bind(settings)
    svc = Service(
        settings=settings,
        pool=WorkPool(settings.service.workers, settings.service.queue_size),
        search_pool=WorkPool(settings.service.search_workers, settings.service.queue_size),
        guard=KeyGuard(
            settings.service_keys(),
            RateLimiter(settings.service.rate_limit_per_minute),
            RateLimiter(settings.service.key_failures_per_minute),
        ),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owns = library is None
        if library is not None:
            svc.library = library
        else:
            try:
                # Models load in a thread: the loop stays free for /health meanwhile.
                if background:
                    svc.library = await svc.pool.run(
                        lambda: open_serving_library(settings, train=trainer is not None)
                    )
                else:
                    svc.library = await svc.pool.run(Library, settings)
            except AragError as exc:
                log.error("the library could not be opened: %s", exc)
                svc.load_error = exc
        if svc.library is not None:
            svc.jobs = Jobs(settings, svc.library)
            if background:
                svc.background = start_background(settings, svc.library, trainer)
        try:
            yield
        finally:
            if svc.background is not None:
                svc.background.stop()
            if svc.jobs is not None:
                svc.jobs.shutdown()
            svc.pool.shutdown()
            svc.search_pool.shutdown()
            if owns and svc.library is not None:
                svc.library.close()

    app = FastAPI(
        title="arag",
        version=__version__,
        summary="Cited, verified answers to research questions over a library of papers.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.svc = svc

    if settings.service.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.service.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type", "X-Request-ID"],
        )
    # Inside the request-id middleware (added next, so outside this one): refusals carry the id.
    app.add_middleware(RequestGuard, policy=Policy.of(settings))

    @app.middleware("http")
    async def request_id(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        sent = request.headers.get("x-request-id", "")
        rid = sent if _REQUEST_ID.match(sent) else uuid.uuid4().hex[:12]
        request.state.request_id = rid
        response = await call_next(request)
        response.headers["X-Request-ID"] = rid
        return response

    @app.exception_handler(AragError)
    async def arag_error(request: Request, exc: AragError) -> JSONResponse:
        if exc.http_status >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.url.path, exc.http_status, exc)
        return error_response(exc, getattr(request.state, "request_id", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        what, where = _validation_message(exc)
        body = ErrorBody(
            error=what,
            where=where,
            fix="correct the request as the message says (the schema is at /docs)",
            status=422,
            request_id=getattr(request.state, "request_id", None),
        )
        return JSONResponse(body.model_dump(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        fixes = {
            400: "send a valid JSON body (UTF-8) as the schema at /docs describes",
            404: "see /docs for the API's routes and methods",
            405: "see /docs for the API's routes and methods",
        }
        if isinstance(exc, BodyTooLarge):
            return error_response(exc.error, getattr(request.state, "request_id", None))
        fix = fixes.get(exc.status_code)
        body = ErrorBody(
            error=str(exc.detail),
            where=request.url.path,
            fix=fix,
            status=exc.status_code,
            request_id=getattr(request.state, "request_id", None),
        )
        return JSONResponse(body.model_dump(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        body = ErrorBody(
            error=f"internal error: {type(exc).__name__}",
            where=request.url.path,
            fix="this is a bug in arag: report it with the request id",
            status=500,
            request_id=getattr(request.state, "request_id", None),
        )
        return JSONResponse(body.model_dump(), status_code=500)

    from arag.service import routes

    app.include_router(routes.public)
    app.include_router(routes.api)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache", **PAGE_HEADERS})

    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    _offline_docs(app)
    return app


def _offline_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc from files installed with the package: FastAPI's own pages load
    them from a CDN, which an offline machine cannot reach."""
    import fastapi_offline
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.responses import HTMLResponse

    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount("/docs-static", StaticFiles(directory=assets), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="arag API",
            swagger_js_url="/docs-static/swagger-ui-bundle.js",
            swagger_css_url="/docs-static/swagger-ui.css",
            swagger_favicon_url="/docs-static/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title="arag API",
            redoc_js_url="/docs-static/redoc.standalone.js",
            redoc_favicon_url="/docs-static/favicon.png",
            with_google_fonts=False,
        )
