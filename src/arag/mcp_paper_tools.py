"""The research tools around a paper as MCP tools (``arag mcp``): summarise_paper and related_papers.
Registered by :func:`arag.mcp_server.build_server` beside search, ask and the paper list."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from arag.agent.related import RelatedPapers, related_text
from arag.agent.summary import PaperSummary
from arag.api import Library

T = TypeVar("T")
Call = Callable[[Callable[[Library], Any]], Awaitable[Any]]
_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False, idempotent_hint=True)
_PAPER_ID = (
    "The paper's id as the library spells it: an arXiv id like '1601.01705' ('arXiv:1601.01705v2' "
    "and arXiv URLs are accepted too) or 'pdf:<name>-<hash>'; list_papers shows them."
)


def summary_text(s: PaperSummary) -> str:
    """The summary as readable text: one paragraph per aspect, then the cited passages."""
    lines = [f"{s.title} ({s.arxiv_url or s.paper_id})", ""]
    for p in s.parts:
        lines.append(f"{p.heading}: {p.text or 'not stated in the paper' + chr(39) + 's passages.'}")
    if s.sources:
        lines += ["", "Sources:"]
        for src in s.sources:
            where = f" — {src.section}" if src.section else ""
            lines.append(f"[{src.n}]{where} (support {src.support}): {src.text}")
    return "\n".join(lines)


def _result(out: BaseModel, text: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=out.model_dump(mode="json")
    )


def register_paper_tools(server: MCPServer[Any], call: Call) -> None:
    """Add summarise_paper and related_papers to ``server``; ``call`` runs a library call in a worker
    thread and turns an arag error into a tool error with its fix."""

    @server.tool(
        title="Summarise a paper",
        annotations=_READ_ONLY,
        description=(
            "A paper of the library summarised in five parts: problem, method, data, results and limits. "
            "Each part is written from the paper's own passages found for it, every sentence carries an [n] "
            "marker and was checked against that passage (unsupported sentences are dropped); a part the "
            "paper's passages do not state says so. Returns the parts and the numbered source passages "
            "with their support (0 to 1). Slow with a local LLM: up to a minute."
        ),
    )
    async def summarise_paper(
        paper_id: Annotated[str, Field(min_length=1, max_length=200, description=_PAPER_ID)],
    ) -> Annotated[CallToolResult, PaperSummary]:
        out: PaperSummary = await call(lambda lib: lib.summarise(paper_id))
        return _result(out, summary_text(out))

    @server.tool(
        title="Related papers",
        annotations=_READ_ONLY,
        description=(
            "The library's papers nearest one paper, best first: two rankings (cosine of the abstracts' "
            "vectors, and shared title/abstract terms) fused by reciprocal rank fusion. Each has its "
            "id, title, year, arXiv link, the shared terms, its ranks in both rankings and one line on "
            "how it relates to the paper (from the two abstracts)."
        ),
    )
    async def related_papers(
        paper_id: Annotated[str, Field(min_length=1, max_length=200, description=_PAPER_ID)],
        k: Annotated[int, Field(ge=1, le=50, description="How many related papers, 1 to 50.")] = 5,
    ) -> Annotated[CallToolResult, RelatedPapers]:
        out: RelatedPapers = await call(lambda lib: lib.related(paper_id, k=k))
        return _result(out, related_text(out))
