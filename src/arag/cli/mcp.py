"""``arag mcp``: the library as Model Context Protocol tools over stdio (Claude Desktop, IDE agents)."""

from __future__ import annotations

import typer

from arag.cli.ask import LlmOpt, ModelOpt, llm_overrides
from arag.cli.common import handle_errors, load_settings


def register(app: typer.Typer) -> None:
    """Add the ``mcp`` command to the top-level app."""
    app.command("mcp")(mcp_cmd)


@handle_errors
def mcp_cmd(llm: LlmOpt = None, model: ModelOpt = None) -> None:
    """Serve the library as MCP tools over stdio, for Claude Desktop and IDE agents.

    Tools: search_papers (ranked passages), ask (a cited, verified answer), get_paper and list_papers.
    The client starts this command and talks to it over stdin/stdout; logs go to stderr. Claude
    Desktop: {"mcpServers": {"arag": {"command": "/path/to/.venv/bin/arag", "args": ["mcp"]}}}
    """
    from arag.mcp_server import run_stdio

    # load_settings logs to stderr: stdout carries the protocol.
    run_stdio(load_settings(**llm_overrides(llm, model)))
