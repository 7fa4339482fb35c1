"""The library as Model Context Protocol tools (``arag mcp``): search, ask, one paper, the paper list.

Each tool returns structured content (its output schema is published) and the same result as
readable text. An arag error comes back as a tool error carrying its fix; the blocking library
calls run in worker threads, so the server keeps answering while one runs.

    python -m arag.mcp_server        # what `arag mcp` runs: stdio until EOF
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, TypeVar, cast

import anyio
import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from arag.api import PAPERS_FIX, Library
from arag.corpus.arxiv_ids import arxiv_url
from arag.errors import AragError
from arag.library.state import PaperRow
from arag.mcp_paper_tools import register_paper_tools
from arag.records import Answer
from arag.retrieval.pipeline import SearchResult
from arag.service.schemas import MAX_PAPERS, PaperDetail
from arag.settings import QUESTION_CHARS_CEILING as MAX_QUESTION_CHARS
from arag.settings import Settings, get_settings
from arag.text import section_path, strip_placeholders

log = logging.getLogger(__name__)
T = TypeVar("T")
LibrarySource = Library | Callable[[], Awaitable[Library]]

INSTRUCTIONS = (
    "arag answers research questions from a local library of AI/ML papers (mostly arXiv), with "
    "numbered citations whose support is checked. Use search_papers to find passages quickly, ask for "
    "a cited answer, list_papers to find papers by title and get_paper for one paper's abstract; "
    "summarise_paper and related_papers are research tools around one paper. "
    "Only the library's papers are searched: when ask abstains, say so rather than answering from memory."
)
_PAPER_IDS = (
    "Paper ids as the library spells them: arXiv ids like '1601.01705' ('arXiv:1601.01705v2' and arXiv "
    "URLs are accepted too) or 'pdf:<name>-<hash>' for PDFs added by hand; list_papers shows them."
)
Papers = Annotated[
    list[str] | None,
    Field(
        max_length=MAX_PAPERS, description=f"Restrict to these papers (at most {MAX_PAPERS}). {_PAPER_IDS}"
    ),
]
_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False, idempotent_hint=True)


# -- what the tools return ---------------------------------------------------------------------------


class Passage(BaseModel):
    rank: int = Field(description="1 = most relevant")
    paper_id: str
    title: str
    section: str | None = Field(description="the section the passage is from (None: the abstract)")
    arxiv_url: str | None = Field(description="the paper's arXiv page (None for PDFs added by hand)")
    score: float = Field(description="relevance, higher is better; compare only within one result")
    text: str


class RankedPaperOut(BaseModel):
    rank: int = Field(description="1 = the paper with the most evidence for the question")
    paper_id: str
    title: str
    arxiv_url: str | None
    score: float = Field(
        description="aggregated evidence of its abstract and passages; compare within one result"
    )
    best_passage: str = Field(description="the paper's passage that best matches the question")


class SearchOut(BaseModel):
    query: str
    papers: list[RankedPaperOut] = Field(
        default_factory=list, description="for a question that names no paper: the papers ranked, best first"
    )
    passages: list[Passage]


class Source(BaseModel):
    n: int = Field(description="the [n] marker in the answer text")
    paper_id: str
    title: str
    section: str | None
    arxiv_url: str | None
    support: float = Field(description="how well the passage supports the claims citing it, 0 to 1")
    supported: bool = Field(description="the verifier accepted the claims citing it")
    text: str = Field(description="the cited passage")


class PaperBrief(BaseModel):
    paper_id: str
    title: str
    year: int | None
    authors: list[str]
    arxiv_url: str | None
    chunks: int = Field(description="passages of the paper in the index")


class PaperUsed(BaseModel):
    paper_id: str
    title: str
    arxiv_url: str | None
    point: str = Field(description="what the paper says on the question, with its [n] marker")
    group: str = Field(description="the approach (or part of the question) it is grouped under")


class AskOut(BaseModel):
    question: str
    short_answer: str = Field(description="a phrase, a number, Yes/No, or 'not in the library'")
    answer: str = Field(description="the answer with [n] markers pointing at sources")
    sources: list[Source]
    abstained: bool = Field(description="the library's passages did not hold the answer")
    missing: list[str] = Field(description="what the passages lacked (when abstained or partial)")
    closest_papers: list[PaperBrief] = Field(description="papers nearest the question (when abstained)")
    papers: list[PaperUsed] = Field(
        default_factory=list, description="a literature answer (an open question): the papers it draws on"
    )


class PaperOut(PaperBrief):
    source: str = Field(description="qasper, arxiv or pdf")
    topic: str | None = Field(description="the topic cluster the library put it in")
    abstract: str


class PaperPage(BaseModel):
    total: int = Field(description="papers matching the filter")
    offset: int
    limit: int
    next_offset: int | None = Field(description="the offset of the next page (None: this is the last)")
    papers: list[PaperBrief]


# -- conversions ----------------------------------------------------------------------------------


def _brief(row: PaperRow) -> PaperBrief:
    return PaperBrief(
        paper_id=row.id,
        title=row.title,
        year=row.year,
        authors=row.authors,
        arxiv_url=arxiv_url(row.id),
        chunks=row.n_chunks,
    )


def _search_out(query: str, result: SearchResult) -> SearchOut:
    return SearchOut(
        query=query,
        papers=[
            RankedPaperOut(
                rank=p.rank,
                paper_id=p.paper_id,
                title=p.title,
                arxiv_url=arxiv_url(p.paper_id),
                score=round(p.score, 6),
                best_passage=strip_placeholders(p.passages[0].chunk.text) if p.passages else "",
            )
            for p in result.papers
        ],
        passages=[
            Passage(
                rank=i,
                paper_id=h.chunk.paper_id,
                title=h.chunk.title,
                section=h.chunk.section,
                arxiv_url=arxiv_url(h.chunk.paper_id),
                score=round(h.score, 4),
                text=strip_placeholders(h.chunk.text),
            )
            for i, h in enumerate(result.ranked, 1)
        ],
    )


def _ask_out(answer: Answer, lib: Library) -> AskOut:
    texts = {c.chunk_id: c.text for c in answer.chunks}
    sources: dict[int, Source] = {}
    for c in answer.citations:
        sources.setdefault(
            c.n,
            Source(
                n=c.n,
                paper_id=c.paper_id,
                title=c.title,
                section=c.section,
                arxiv_url=arxiv_url(c.paper_id),
                support=round(c.support, 3),
                supported=c.supported,
                text=texts.get(c.chunk_id, ""),
            ),
        )
    rows = {r.id: r for r in lib.papers()}
    closest = [
        _brief(rows[h.paper_id])
        if h.paper_id in rows
        else PaperBrief(
            paper_id=h.paper_id,
            title=h.title,
            year=None,
            authors=[],
            arxiv_url=arxiv_url(h.paper_id),
            chunks=0,
        )
        for h in (answer.closest if answer.abstained else [])
    ]
    return AskOut(
        question=answer.question,
        short_answer=answer.short_answer,
        answer=answer.text,
        sources=sorted(sources.values(), key=lambda s: s.n),
        abstained=answer.abstained,
        missing=answer.missing,
        closest_papers=closest,
        papers=[
            PaperUsed(paper_id=p.paper_id, title=p.title, arxiv_url=p.url, point=p.point, group=p.group)
            for p in answer.papers
        ],
    )


def _paper_out(row: PaperRow) -> PaperOut:
    # PaperDetail strips the "Title: ...\nSection: Abstract\n" head the abstract chunk was embedded with.
    detail = PaperDetail.of(row)
    return PaperOut(
        **_brief(row).model_dump(), source=row.source, topic=row.topic_label, abstract=detail.abstract
    )


def _page(rows: list[PaperRow], query: str | None, offset: int, limit: int) -> PaperPage:
    words = (query or "").casefold().split()
    if words:
        rows = [r for r in rows if all(w in r.title.casefold() for w in words)]
    end = offset + limit
    return PaperPage(
        total=len(rows),
        offset=offset,
        limit=limit,
        next_offset=end if end < len(rows) else None,
        papers=[_brief(r) for r in rows[offset:end]],
    )


# -- readable text ----------------------------------------------------------------------------------


def _where(title: str, section: str | None, url: str | None) -> str:
    return f"{title}" + (f" — {section_path(section)}" if section else "") + (f" ({url})" if url else "")


def _search_text(out: SearchOut) -> str:
    if not out.passages:
        return f"No passages found for {out.query!r}."
    lines = []
    if out.papers:
        lines.append(f"{len(out.papers)} papers for {out.query!r}, best first:")
        lines += [f"{p.rank}. {p.paper_id}: {_where(p.title, None, p.arxiv_url)}" for p in out.papers]
        lines.append("")
    lines.append(f"{len(out.passages)} passages for {out.query!r}, best first:")
    for p in out.passages:
        lines.append(f"\n[{p.rank}] {p.paper_id}: {_where(p.title, p.section, p.arxiv_url)}  score {p.score}")
        lines.append(p.text)
    return "\n".join(lines)


def _ask_text(out: AskOut) -> str:
    lines = [f"Short answer: {out.short_answer}", "", out.answer]
    if out.sources:
        lines += ["", "Sources:"]
        for s in out.sources:
            lines.append(
                f"[{s.n}] {s.paper_id}: {_where(s.title, s.section, s.arxiv_url)}  support {s.support}"
            )
    if out.papers:
        lines += ["", "Papers:"]
        lines += [f"- {p.paper_id}: {_where(p.title, None, p.arxiv_url)} [{p.group}]" for p in out.papers]
    if out.abstained:
        lines += ["", "The library does not hold the answer (abstained)."]
    if out.missing:
        lines += ["Missing: " + "; ".join(out.missing)]
    if out.closest_papers:
        lines += ["Closest papers: " + "; ".join(f"{p.paper_id} {p.title}" for p in out.closest_papers)]
    return "\n".join(lines)


def _brief_line(p: PaperBrief) -> str:
    year = f" ({p.year})" if p.year else ""
    return f"- {p.paper_id}: {p.title}{year}, {p.chunks} passages" + (
        f", {p.arxiv_url}" if p.arxiv_url else ""
    )


def _paper_text(p: PaperOut) -> str:
    lines = [f"{p.title} ({p.paper_id})"]
    if p.authors:
        lines.append(", ".join(p.authors))
    meta = [str(p.year) if p.year else "", p.arxiv_url or "", f"{p.chunks} passages in the library"]
    lines.append(" · ".join(m for m in meta if m))
    lines += ["", p.abstract or "(no abstract recorded)"]
    return "\n".join(lines)


def _page_text(page: PaperPage, query: str | None) -> str:
    what = f" with {query!r} in the title" if query and query.strip() else ""
    if not page.papers:
        return f"No papers{what} at offset {page.offset} ({page.total} in all)."
    first, last = page.offset + 1, page.offset + len(page.papers)
    lines = [f"Papers {first}-{last} of {page.total}{what}:"] + [_brief_line(p) for p in page.papers]
    if page.next_offset is not None:
        lines.append(f"More: call again with offset={page.next_offset}.")
    return "\n".join(lines)


def _result(out: BaseModel, text: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=out.model_dump(mode="json")
    )


def _tool_message(exc: AragError) -> str:
    msg = str(exc)  # what (at where) + "\n  fix: ..."
    if exc.fix == PAPERS_FIX:
        msg += "\n  (here: call the list_papers tool to see the library's paper ids)"
    return msg


# -- the server -------------------------------------------------------------------------------------


def build_server(
    library: LibrarySource, *, workers: int | None = None, lifespan: Any = None
) -> MCPServer[Any]:
    """An MCP server whose six tools answer from ``library``, or from the library an async callable
    gives once it is open (``run_stdio`` opens it while the handshake goes on). ``workers``: library
    calls at once (default: the service's setting). The caller closes the library."""
    get_library: Callable[[], Awaitable[Library]]
    if isinstance(library, Library):
        opened = library
        workers = workers or opened.settings.service.workers

        async def get_opened() -> Library:
            return opened

        get_library = get_opened
    else:
        get_library = library
    # Calls at once, in worker threads; past that they wait (the local LLM takes one at a time anyway).
    limiter = anyio.CapacityLimiter(workers or 4)

    async def call(fn: Callable[[Library], T]) -> T:
        try:
            lib = await get_library()
            return await anyio.to_thread.run_sync(fn, lib, limiter=limiter)
        except AragError as exc:
            raise ToolError(_tool_message(exc)) from exc

    server: MCPServer[Any] = MCPServer(
        "arag",
        title="arag research library",
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        log_level=cast(Literal["WARNING"], "WARNING"),
    )

    @server.tool(
        title="Search the papers",
        annotations=_READ_ONLY,
        description=(
            "Retrieval only, fast (about a second): the passages of the library's papers most relevant to "
            "a query, best first. Each passage has its paper id, title, section, arXiv link, a relevance "
            "score (higher is better, comparable only within one call) and its text. Use it to find where "
            "a topic, method, dataset or number is discussed, to quote passages, or to pick papers before "
            "calling ask with `papers`. It writes no answer: use ask for a cited, verified answer."
        ),
    )
    async def search_papers(
        query: Annotated[
            str,
            Field(
                min_length=1,
                max_length=MAX_QUESTION_CHARS,
                description="A question or keywords, in English (e.g. 'how is the ontology induced').",
            ),
        ],
        k: Annotated[int, Field(ge=1, le=50, description="How many passages to return, 1 to 50.")] = 8,
        papers: Papers = None,
    ) -> Annotated[CallToolResult, SearchOut]:
        out = await call(lambda lib: _search_out(query.strip(), lib.search(query, papers=papers, k=k)))
        return _result(out, _search_text(out))

    @server.tool(
        title="Ask the library",
        annotations=_READ_ONLY,
        description=(
            "Answer a research question from the library's papers with arag's full agent: it plans "
            "searches, retrieves and grades passages, writes an answer and checks every claim against the "
            "passage it cites. Slow: seconds to a minute. Returns a short answer (a phrase, number or "
            "Yes/No), the answer text with [n] markers, and the sources: for each n the paper id, title, "
            "section, arXiv link, support score (0 to 1: how well the passage supports the claims citing "
            "it) and the passage. When the papers do not hold the answer, abstained is true, `missing` says "
            "what was lacking and closest_papers lists papers near the question: report that instead of "
            "answering from memory. Pass `papers` to answer only from those papers. For passages without "
            "an answer, search_papers is faster."
        ),
    )
    async def ask(
        question: Annotated[
            str,
            Field(
                min_length=1,
                max_length=MAX_QUESTION_CHARS,
                description="The research question, in English, standalone (no 'it' referring to "
                "earlier turns), e.g. 'What datasets does the NMN paper evaluate on?'.",
            ),
        ],
        papers: Papers = None,
    ) -> Annotated[CallToolResult, AskOut]:
        out = await call(lambda lib: _ask_out(lib.ask(question, papers=papers), lib))
        return _result(out, _ask_text(out))

    @server.tool(
        title="One paper",
        annotations=_READ_ONLY,
        description=(
            "One paper of the library: title, year, authors, arXiv link, how many passages it has in the "
            "index, and its abstract. Use it to describe a paper or check what it is about before asking "
            "about it. An id the library does not hold is an error (list_papers shows the ids)."
        ),
    )
    async def get_paper(
        paper_id: Annotated[str, Field(min_length=1, max_length=200, description=_PAPER_IDS)],
    ) -> Annotated[CallToolResult, PaperOut]:
        out = await call(lambda lib: _paper_out(lib.paper(paper_id)))
        return _result(out, _paper_text(out))

    @server.tool(
        title="List the papers",
        annotations=_READ_ONLY,
        description=(
            "The library's papers, a page at a time, optionally only those whose title contains every word "
            "of `query` (case-insensitive). Each has its id, title, year, authors, arXiv link and passage "
            "count; `total` counts the matches and next_offset gives the next page (None on the last). Use "
            "it to find a paper's id by its title, or to see what the library holds."
        ),
    )
    async def list_papers(
        query: Annotated[
            str | None, Field(max_length=200, description="Words the title must contain (None: all papers).")
        ] = None,
        offset: Annotated[int, Field(ge=0, description="How many matching papers to skip.")] = 0,
        limit: Annotated[int, Field(ge=1, le=200, description="Papers per page, 1 to 200.")] = 20,
    ) -> Annotated[CallToolResult, PaperPage]:
        page = await call(lambda lib: _page(lib.papers(), query, offset, limit))
        return _result(page, _page_text(page, query))

    register_paper_tools(server, call)
    return server


# -- stdio ------------------------------------------------------------------------------------------


class _Opening:
    """The library, opened in a worker thread while the server already answers the handshake (loading
    the LLM can take longer than a client waits for it); tool calls wait for it, or get its error."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.library: Library | None = None
        self.error: str | None = None
        self.ready = anyio.Event()

    def _open(self) -> None:
        # Assigned in the thread: a cancelled wait (EOF while loading) still finds it to close.
        self.library = Library(self.settings)

    async def open(self) -> None:
        try:
            await anyio.to_thread.run_sync(self._open)
        except AragError as exc:
            log.error("arag mcp: the library could not be opened: %s", exc)
            self.error = _tool_message(exc)
        except Exception:
            log.exception("arag mcp: the library could not be opened")
            self.error = "the library could not be opened: this is a bug in arag (see the server's log)"
        finally:
            self.ready.set()

    async def get(self) -> Library:
        await self.ready.wait()
        if self.library is None:
            raise ToolError(self.error or "the library is not open")
        return self.library

    @asynccontextmanager
    async def lifespan(self, _server: Any) -> AsyncIterator[dict[str, Any]]:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.open)
                yield {}
                tg.cancel_scope.cancel()  # EOF before the library opened: stop waiting for it
        finally:
            if self.library is not None:
                self.library.close()


def run_stdio(settings: Settings) -> None:
    """Serve the library's tools over stdin/stdout until the client closes stdin, then close it.
    While serving, stray writes to stdout go to stderr (the SDK diverts the descriptor)."""
    opening = _Opening(settings)
    server = build_server(opening.get, workers=settings.service.workers, lifespan=opening.lifespan)
    anyio.run(server.run_stdio_async)


if __name__ == "__main__":
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    run_stdio(get_settings())
