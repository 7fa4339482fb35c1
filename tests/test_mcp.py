"""`arag mcp`: the six tools through the SDK's client, in-process over memory streams on a small
hash-embedder library (6 QASPER papers, no reranker) with a scripted LLM, then once over real stdio
against `python -m arag.mcp_server`."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import typer
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent
from typer.testing import CliRunner

from arag.api import PAPERS_FIX, Library
from arag.cli.mcp import register
from arag.library.manage import build_library
from arag.mcp_server import build_server
from arag.settings import Settings, get_settings
from arag.text import has_placeholder
from service_util import echo_llm

COMPOSE = "1601.01705"
SMALL = {"embedding": {"provider": "hash"}, "topics": {"k": 2}, "rerank": {"provider": "none"}}
TOOLS = {"search_papers", "ask", "get_paper", "list_papers", "summarise_paper", "related_papers"}


@pytest.fixture(scope="module")
def lib_dir(small_library: Callable[..., Settings]) -> Path:
    return small_library("mcp", **SMALL).data_dir  # its own: the tools' Library writes beside it


@pytest.fixture(scope="module")
def library(lib_dir: Path) -> Iterator[Library]:
    settings = get_settings(data_dir=lib_dir, llm={"provider": "llama-cpp"}, **SMALL)
    with Library(settings, llm=echo_llm()) as lib:  # the scripted LLM stands in for llama-cpp
        yield lib


def with_client(library: Library, body: Callable[[Client], Awaitable[Any]]) -> Any:
    """Run ``body`` with a client connected to the library's server over memory streams."""

    async def main() -> Any:
        async with Client(build_server(library), mode="legacy", raise_exceptions=True) as client:
            return await body(client)

    return anyio.run(main)


def call(library: Library, tool: str, **args: Any) -> CallToolResult:
    async def body(client: Client) -> CallToolResult:
        return await client.call_tool(tool, args)

    result: CallToolResult = with_client(library, body)
    return result


def ok(result: CallToolResult) -> dict[str, Any]:
    """The structured content of a successful call (its text content is there too)."""
    assert not result.is_error, result.content
    assert isinstance(result.content[0], TextContent) and result.content[0].text
    assert result.structured_content is not None
    return result.structured_content


def test_lists_the_six_tools_with_descriptions_and_schemas(library: Library) -> None:
    async def body(client: Client) -> Any:
        return (await client.list_tools()).tools, client.server_info

    tools, info = with_client(library, body)
    assert info is not None and info.name == "arag"
    by_name = {t.name: t for t in tools}
    assert set(by_name) == TOOLS
    for t in tools:
        assert t.description and len(t.description) > 150, t.name
        assert t.input_schema["type"] == "object" and t.output_schema is not None
        assert t.annotations is not None and t.annotations.read_only_hint
        for name, prop in t.input_schema["properties"].items():
            assert prop.get("description"), (t.name, name)
    search = by_name["search_papers"].input_schema
    assert search["required"] == ["query"]
    assert search["properties"]["k"]["default"] == 8 and search["properties"]["k"]["maximum"] == 50
    assert by_name["ask"].input_schema["required"] == ["question"]
    assert by_name["get_paper"].input_schema["required"] == ["paper_id"]
    assert by_name["list_papers"].input_schema["properties"]["limit"]["default"] == 20


def test_search_papers_returns_ranked_passages_of_the_named_paper(library: Library) -> None:
    result = call(
        library, "search_papers", query="neural module networks", k=3, papers=[f"arXiv:{COMPOSE}v2"]
    )
    out = ok(result)
    hits = out["passages"]
    assert 1 <= len(hits) <= 3 and [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
    for h in hits:
        assert h["paper_id"] == COMPOSE and h["arxiv_url"] == f"https://arxiv.org/abs/{COMPOSE}"
        assert h["title"] and h["text"] and isinstance(h["score"], float)
        assert not has_placeholder(h["text"])  # BIBREF3 and kin: as the LLM reads the passage
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    text = result.content[0]
    assert isinstance(text, TextContent) and COMPOSE in text.text and hits[0]["text"][:40] in text.text


def test_ask_returns_an_answer_whose_markers_map_to_sources(library: Library) -> None:
    result = call(library, "ask", question="How is the ontology induced from text?")
    out = ok(result)
    assert not out["abstained"] and out["short_answer"] and out["sources"]
    markers = {int(m) for m in re.findall(r"\[(\d+)\]", out["answer"])}
    assert markers and markers <= {s["n"] for s in out["sources"]}
    for s in out["sources"]:
        assert s["paper_id"] and s["title"] and s["text"] and 0.0 <= s["support"] <= 1.0
        assert s["arxiv_url"] == f"https://arxiv.org/abs/{s['paper_id']}"
    text = result.content[0]
    assert isinstance(text, TextContent) and text.text.startswith("Short answer:") and "Sources:" in text.text


def test_get_paper_gives_its_record_and_a_bare_abstract(library: Library) -> None:
    out = ok(call(library, "get_paper", paper_id=COMPOSE))
    row = library.paper(COMPOSE)
    assert out["paper_id"] == COMPOSE and out["title"] == row.title and out["chunks"] == row.n_chunks > 0
    assert out["arxiv_url"] == f"https://arxiv.org/abs/{COMPOSE}" and out["year"] == row.year
    assert out["abstract"] and not out["abstract"].startswith(("Title:", "Section:"))
    assert out["abstract"] in row.abstract_text


def test_list_papers_pages_and_filters_by_title_words(library: Library) -> None:
    rows = library.papers()
    first = ok(call(library, "list_papers", limit=4))
    assert first["total"] == len(rows) == 6 and first["next_offset"] == 4
    assert [p["paper_id"] for p in first["papers"]] == [r.id for r in rows[:4]]
    rest = ok(call(library, "list_papers", offset=4, limit=4))
    assert [p["paper_id"] for p in rest["papers"]] == [r.id for r in rows[4:]] and rest["next_offset"] is None
    title = library.paper(COMPOSE).title
    words = " ".join(title.upper().split()[:2])  # case-insensitive, every word must appear
    found = ok(call(library, "list_papers", query=words))
    assert COMPOSE in {p["paper_id"] for p in found["papers"]} and found["total"] < len(rows)
    assert ok(call(library, "list_papers", query="zzzunlikelyword"))["total"] == 0


def test_an_unknown_paper_id_is_a_tool_error_carrying_the_fix(library: Library) -> None:
    for tool, args in (
        ("get_paper", {"paper_id": "9999.99999"}),
        ("search_papers", {"query": "modules", "papers": ["9999.99999"]}),
        ("ask", {"question": "What do the modules compute?", "papers": ["9999.99999"]}),
    ):
        result = call(library, tool, **args)
        assert result.is_error, tool
        text = result.content[0]
        assert isinstance(text, TextContent)
        assert "9999.99999" in text.text and f"fix: {PAPERS_FIX}" in text.text and "list_papers" in text.text
    bad = call(library, "search_papers", query="modules", k=0)  # the schema's limits hold too
    assert bad.is_error


def test_the_cli_command_is_registered_with_its_help() -> None:
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command, so `mcp` is a subcommand
    result = CliRunner().invoke(app, ["mcp", "--help"])
    assert result.exit_code == 0 and "Serve the library as MCP tools over stdio" in result.output


def test_serves_over_stdio_in_a_subprocess(tmp_path: Path, qasper_path: Path) -> None:
    # A library of its own: one process at a time may hold an index open, and the fixture's is open.
    data = tmp_path / "lib"
    build_library(get_settings(data_dir=data, corpus={"max_papers": 2}, **SMALL))
    env = {
        **os.environ,
        "ARAG_DATA_DIR": str(data),
        "ARAG_EMBEDDING__PROVIDER": "hash",
        "ARAG_RERANK__PROVIDER": "none",
        "ARAG_LLM__PROVIDER": "extractive",
        "OMP_NUM_THREADS": "1",
    }
    params = StdioServerParameters(command=sys.executable, args=["-m", "arag.mcp_server"], env=env)
    errlog = tmp_path / "stderr.txt"

    async def main() -> tuple[str, set[str], CallToolResult]:
        with errlog.open("w") as err, anyio.fail_after(60):
            async with (
                stdio_client(params, errlog=err) as (read, write),
                ClientSession(read, write) as session,
            ):
                init = await session.initialize()  # the handshake Claude Desktop does
                tools = {t.name for t in (await session.list_tools()).tools}
                result = await session.call_tool("search_papers", {"query": "ontology induction", "k": 2})
                return init.server_info.name, tools, result

    name, tools, result = anyio.run(main)
    assert name == "arag" and tools == TOOLS, errlog.read_text()
    out = ok(result)
    assert 1 <= len(out["passages"]) <= 2 and out["passages"][0]["text"]


def test_a_question_over_the_limit_is_a_tool_error_naming_the_setting(library: Library) -> None:
    for tool, args in (
        ("search_papers", {"query": "modules " * 400}),
        ("ask", {"question": "modules " * 400}),
    ):
        result = call(library, tool, **args)
        assert result.is_error, tool
        text = result.content[0]
        assert isinstance(text, TextContent)
        assert "at most 2,000" in text.text and "ARAG_AGENT__MAX_QUESTION_CHARS" in text.text, text.text
    assert call(library, "search_papers", query="m" * 100_000).is_error  # past the schema's ceiling
