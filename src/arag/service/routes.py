"""The API's routes. ``public``: liveness and readiness, never behind a key. ``api``: everything
else, behind the key guard when keys are configured."""

from __future__ import annotations

import asyncio
import platform
from collections.abc import AsyncIterator
from importlib import metadata
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from arag.agent.graph import validate_question
from arag.agent.hooks import RunHooks
from arag.agent.related import RelatedPapers
from arag.agent.summary import PaperSummary
from arag.errors import AragError, Cancelled, InputError
from arag.library.map import LibraryMap
from arag.records import Answer, NodeEvent
from arag.service.guard import BodyTooLarge
from arag.service.jobs import check_upload, parse_arxiv_ids
from arag.service.schemas import (
    ChatRequest,
    ChatResponse,
    ErrorBody,
    Health,
    IngestJob,
    PaperDetail,
    PaperList,
    PaperOut,
    QueryRequest,
    QueryResponse,
    Ready,
    SearchRequest,
    SearchResponse,
    StartEvent,
    SystemInfo,
    TokenEvent,
    TrainStatus,
)
from arag.version import __version__


def _svc(request: Request) -> Any:
    return request.app.state.svc


def _guard(request: Request) -> None:
    _svc(request).guard(request)


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "invalid input (an empty question, a bad id)",
        401: "no valid API key (when keys are on)",
        404: "an unknown paper or job id",
        422: "a request that does not match the schema",
        429: "the key is over its rate",
        503: "the service is busy, or the library is not loaded",
    }.items()
}
public = APIRouter(tags=["health"])
api = APIRouter(dependencies=[Depends(_guard)], responses=_ERRORS)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_DOC = (
    "Server-Sent Events: `start` ({request_id, question}); `node` per agent step as it finishes "
    "(node, ms, decision, counts); `token` ({text}) as the LLM writes the answer, where it "
    "streams: an unverified draft; then `answer`, the verified result as POST /query returns it "
    "(unsupported claims dropped), or `error` (status, error, where, fix). A client that "
    "disconnects stops the run at its next step or token."
)


# -- health ----------------------------------------------------------------------------------------


@public.get("/health", response_model=Health, summary="Liveness: the process answers")
async def health() -> Health:
    return Health()


@public.get(
    "/ready",
    response_model=Ready,
    summary="Readiness: models loaded, index open and consistent",
    responses={503: {"model": Ready, "description": "not ready; `checks` says why"}},
)
async def ready(request: Request) -> JSONResponse:
    svc = _svc(request)
    checks: dict[str, str] = {}
    papers = chunks = 0
    bg = svc.background
    build = bg.build_status() if bg is not None else None
    training = bg.train_status() if bg is not None else None
    building = build is not None and build.state in ("loading", "building")
    if svc.library is None:
        checks["library"] = svc.load_error.what if svc.load_error else "loading"
    else:
        lib = svc.library
        rows = lib.papers()
        papers = len(rows)
        building = building or lib.building
        try:
            chunks = await asyncio.to_thread(lib.chunk_count)
        except AragError as exc:
            checks["index"] = exc.what
        else:
            expected = sum(r.n_chunks for r in rows)
            running = svc.jobs is not None and any(j.state == "running" for j in svc.jobs.all())
            if chunks == expected or running or building:
                note = " (the library is being built)" if building else " (an ingest is running)"
                checks["index"] = "ok" + (note if chunks != expected else "")
            else:
                checks["index"] = f"{chunks} chunks in the index, {expected} recorded by the build"
        checks["models"] = "ok"
        procs = lib.llm_processes()
        if procs:
            down = [p for p in procs if p.state != "ready"]
            checks["llm"] = (
                f"ok ({len(procs)} model process{'es' if len(procs) > 1 else ''})"
                if not down
                else "; ".join(
                    f"model process {p.state}" + (f" after {p.last_exit}" if p.last_exit else "")
                    for p in down
                )  # fmt: skip
            )
    ok = all(v.startswith("ok") for v in checks.values())
    state: Literal["loading", "building", "complete", "incomplete", "failed"]
    if svc.library is None:
        state = "failed" if svc.load_error else "loading"
    elif building:
        state = "building"
    else:
        state = "complete" if svc.library.coverage().complete else "incomplete"
    body = Ready(
        ready=ok,
        state=state,
        papers=papers,
        chunks=chunks,
        checks=checks,
        build=build,
        reranker=training,
        llm_processes=svc.library.llm_processes() if svc.library is not None else [],
    )
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@api.get("/v1/system", response_model=SystemInfo, summary="Models, library figures, versions, settings")
async def system(request: Request) -> SystemInfo:
    svc = _svc(request)
    lib = svc.lib()
    s = svc.settings

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    training = svc.background.train_status() if svc.background is not None else None
    dists = ("fastapi", "langgraph", "onnxruntime", "qdrant-edge-py", "llama-cpp-python", "pydantic")
    rows = lib.papers()
    return SystemInfo(
        version=__version__,
        versions={"python": platform.python_version(), **{d: version(d) for d in dists}},
        models={
            "embedder": lib.embedder_id,
            "reranker": _reranker_line(lib.reranker_name, training),
            "llm": lib.llm.name if lib.llm is not None else "extractive (no LLM)",
            "support": lib.agent.deps.support.name,
        },
        library={"papers": len(rows), "chunks": sum(r.n_chunks for r in rows), "data_dir": str(s.data_dir)},
        settings={
            "llm_provider": s.llm.provider,
            "llm_cache": s.llm.cache,
            "llm_processes": s.llm.processes,
            "llm_threads": s.llm.threads,
            "llm_build": s.llm.build,
            "rerank_provider": s.rerank.provider,
            "retrieval_strategy": s.retrieval.strategy,
            "support": s.agent.support,
            "workers": s.service.workers,
            "search_workers": s.service.search_workers,
            "queue_size": s.service.queue_size,
            "api_keys": svc.guard.enabled,
            "rate_limit_per_minute": s.service.rate_limit_per_minute,
            "cors_origins": s.service.cors_origins,
            "max_upload_mb": s.service.max_upload_mb,
        },
        pool={
            "in_flight": svc.pool.in_flight,
            "capacity": svc.pool.capacity,
            "rejected": svc.pool.rejected,
            "search_in_flight": svc.search_pool.in_flight,
            "search_capacity": svc.search_pool.capacity,
        },
        build=svc.background.build_status() if svc.background is not None else None,
        reranker=training,
        llm_processes=lib.llm_processes(),
    )


def _reranker_line(name: str, training: TrainStatus | None) -> str:
    """The reranker searches use, saying so when it is the fused order until one is trained."""
    if name != "none" or training is None or training.state in ("installed", "off"):
        return name
    return f"none: searches use the fused order until the trained reranker is installed ({training.state})"


# -- questions -------------------------------------------------------------------------------------


@api.post("/query", response_model=QueryResponse, summary="Answer a question (the full agent run)")
async def query(body: QueryRequest, request: Request) -> QueryResponse:
    lib = _svc(request).lib()
    answer: Answer = await _svc(request).pool.run(lambda: lib.ask(body.question, papers=body.papers))
    return QueryResponse(**answer.model_dump(), request_id=request.state.request_id)


def sse(event: str, data: BaseModel) -> bytes:
    """One Server-Sent Event (the JSON is one line)."""
    return f"event: {event}\ndata: {data.model_dump_json()}\n\n".encode()


@api.post(
    "/query/stream",
    summary="Answer a question, streaming each step and the answer's tokens (SSE)",
    description=SSE_DOC,
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
)
async def query_stream(body: QueryRequest, request: Request) -> StreamingResponse:
    svc = _svc(request)
    lib = svc.lib()
    rid: str = request.state.request_id
    # Bad input and a full queue answer with a status code, before the stream starts.
    validate_question(body.question, svc.settings.agent.max_question_chars)
    lib.check_papers(body.papers)
    svc.pool.admit_stream()
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def on_token(text: str) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ("item", TokenEvent(text=text)))

    hooks = RunHooks(on_token=on_token)
    items = svc.pool.stream(
        lambda: lib.stream(body.question, papers=body.papers, hooks=hooks), hooks.cancel, queue
    )

    async def events() -> AsyncIterator[bytes]:
        yield sse("start", StartEvent(request_id=rid, question=body.question))
        try:
            async for item in items:
                if isinstance(item, NodeEvent):
                    yield sse("node", item)
                elif isinstance(item, TokenEvent):
                    yield sse("token", item)
                elif isinstance(item, Answer):
                    yield sse("answer", QueryResponse(**item.model_dump(), request_id=rid))
        except Cancelled:
            return
        except AragError as exc:
            yield sse(
                "error",
                ErrorBody(
                    error=exc.what, where=exc.where, fix=exc.fix, status=exc.http_status, request_id=rid
                ),
            )
        except Exception as exc:  # a bug: the client still gets an error event, not a cut stream
            yield sse(
                "error",
                ErrorBody(
                    error=f"internal error: {type(exc).__name__}",
                    fix="this is a bug in arag: report it with the request id",
                    status=500,
                    request_id=rid,
                ),
            )
        finally:
            await items.aclose()

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


@api.post(
    "/search",
    response_model=SearchResponse,
    summary="Retrieval only: ranked passages and every stage's scores",
)
async def search(body: SearchRequest, request: Request) -> SearchResponse:
    lib = _svc(request).lib()
    coverage = lib.coverage()
    result = await _svc(request).search_pool.run(lambda: lib.search(body.query, papers=body.papers, k=body.k))
    return SearchResponse.build(request.state.request_id, body.query.strip(), result, coverage)


@api.post("/chat", response_model=ChatResponse, summary="One turn of a conversation (follow-ups rewritten)")
async def chat(body: ChatRequest, request: Request) -> ChatResponse:
    lib = _svc(request).lib()
    answer: Answer = await _svc(request).pool.run(
        lambda: lib.chat(body.session_id, body.message, rewrite=body.rewrite, papers=body.papers)
    )
    return ChatResponse(
        **answer.model_dump(),
        request_id=request.state.request_id,
        session_id=body.session_id,
        message=body.message,
    )


# -- papers ----------------------------------------------------------------------------------------


@api.get("/papers", response_model=PaperList, summary="The library's papers (paged, filtered by title)")
async def papers(
    request: Request,
    q: Annotated[str | None, Query(max_length=200, description="words the title contains")] = None,
    topic: Annotated[int | None, Query(ge=0)] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> PaperList:
    rows = _svc(request).lib().papers(topic=topic)
    if q and q.strip():
        words = q.casefold().split()
        rows = [r for r in rows if all(w in r.title.casefold() for w in words)]
    page = rows[offset : offset + limit]
    return PaperList(total=len(rows), offset=offset, limit=limit, papers=[PaperOut.of(r) for r in page])


@api.get(
    "/papers/{paper_id:path}/summary",
    response_model=PaperSummary,
    summary="A paper's problem, method, data, results and limits, each sentence cited to its passages",
    description="Each aspect is written from the paper's passages found for it (by the LLM, or taken "
    "from the passages without one); every sentence is checked against the passage it cites and "
    "dropped when unsupported. `sources` are the cited passages; `events` the steps and their times.",
)
async def paper_summary(paper_id: str, request: Request) -> PaperSummary:
    svc = _svc(request)
    lib = svc.lib()
    lib.paper(paper_id)  # an unknown id is a 404 before the queue
    return await svc.pool.run(lambda: lib.summarise(paper_id))


@api.get(
    "/papers/{paper_id:path}/related",
    response_model=RelatedPapers,
    summary="The papers nearest a paper (abstract vectors and shared terms), with how each relates",
    description="Two rankings of the other papers, by the cosine of abstract vectors and by the TF-IDF "
    "cosine of title and abstract terms, fused by reciprocal rank fusion (k = 60). Each paper has one "
    "line on how it relates (the LLM's when the abstracts support it, else an abstract sentence).",
)
async def paper_related(
    paper_id: str,
    request: Request,
    k: Annotated[int, Query(ge=1, le=50, description="how many related papers")] = 5,
) -> RelatedPapers:
    svc = _svc(request)
    lib = svc.lib()
    lib.paper(paper_id)
    return await svc.pool.run(lambda: lib.related(paper_id, k=k))


@api.get(
    "/map",
    response_model=LibraryMap,
    summary="The map of the library: each paper as a 2-D point from its abstract vector, and the topics",
    responses={503: {"model": ErrorBody, "description": "no map yet: `arag library topics` computes it"}},
)
async def library_map(request: Request) -> LibraryMap:
    lib = _svc(request).lib()
    return await asyncio.to_thread(lib.map)


@api.get("/papers/{paper_id:path}", response_model=PaperDetail, summary="One paper")
async def paper(paper_id: str, request: Request) -> PaperDetail:
    return PaperDetail.of(_svc(request).lib().paper(paper_id))


# -- ingest ----------------------------------------------------------------------------------------

_INGEST_BODY = {
    "requestBody": {
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
                        "arxiv_ids": {"type": "string", "description": "comma- or space-separated arXiv ids"},
                    },
                }
            },
            "application/x-www-form-urlencoded": {
                "schema": {"type": "object", "properties": {"arxiv_ids": {"type": "string"}}}
            },
        }
    }
}


@api.post(
    "/ingest",
    response_model=IngestJob,
    status_code=202,
    summary="Add PDFs (upload) or arXiv ids to the library, as a background job",
    openapi_extra=_INGEST_BODY,
    responses={413: {"model": ErrorBody}, 415: {"model": ErrorBody}},
)
async def ingest(request: Request) -> IngestJob:
    svc = _svc(request)
    jobs = svc.ingest()
    limits = svc.settings.service
    max_bytes = int(limits.max_upload_mb * 1e6)
    # The body as a whole is capped as it streams (service.guard); each file is checked here.
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise InputError(
            "POST /ingest takes a form (multipart for files)",
            where="Content-Type",
            fix="send files=@paper.pdf and/or arxiv_ids=... as form fields",
        )
    try:
        form = await request.form(max_files=limits.max_upload_files, max_fields=4, max_part_size=64_000)
    except BodyTooLarge:
        raise  # over the route's limit as it streamed: 413
    except Exception as exc:  # python-multipart / starlette parse errors: a bad request, not a 500
        raise InputError(
            f"unreadable form: {exc}", where="body", fix="send a multipart/form-data body"
        ) from exc
    uploads: list[tuple[str, bytes]] = []
    raw_ids = ""
    for key, value in form.multi_items():
        if key == "files" and not isinstance(value, str):
            data = await value.read(max_bytes + 1)
            name = value.filename or "upload.pdf"
            check_upload(name, data, max_bytes)
            uploads.append((name, data))
        elif key == "arxiv_ids" and isinstance(value, str):
            raw_ids += " " + value
        else:
            raise InputError(
                f"unexpected form field {key!r}", where="body", fix="send only 'files' and 'arxiv_ids'"
            )
    ids = parse_arxiv_ids(raw_ids)
    if not uploads and not ids:
        raise InputError("nothing to ingest", where="body", fix="attach PDFs as 'files' or list 'arxiv_ids'")
    return await asyncio.to_thread(jobs.submit, uploads, ids)


@api.get("/ingest/{job_id}", response_model=IngestJob, summary="An ingest job's progress and result")
async def ingest_job(job_id: str, request: Request) -> IngestJob:
    return _svc(request).ingest().get(job_id)


@api.get("/ingest", response_model=list[IngestJob], summary="Recent ingest jobs, newest first")
async def ingest_jobs(request: Request) -> list[IngestJob]:
    return _svc(request).ingest().all()
