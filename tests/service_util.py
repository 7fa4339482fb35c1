"""A real uvicorn server on loopback for tests: started in a thread, on a free port, stopped after."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from arag.agent import prompts
from arag.llm.base import ChatMessage
from arag.llm.scripted import ScriptedLLM
from arag.stress.fuzz import sse_events

__all__ = ["SMALL", "echo_llm", "free_port", "running_server", "sse_events"]

# The small test libraries' settings overrides: hash embeddings, two topics, no reranker, and the
# local LLM named so that the scripted one (echo_llm) stands in for it.
SMALL: dict[str, Any] = {
    "embedding": {"provider": "hash"},
    "topics": {"k": 2},
    "rerank": {"provider": "none"},
    "llm": {"provider": "llama-cpp"},  # the scripted LLM stands in for it
    "chat": {"rewrite_with_llm": False},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(app: FastAPI, *, timeout: float = 60.0) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 until the block ends; yields the base URL once /ready answers."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code in (200, 503) and server.started:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"the test server on {url} did not start")
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def echo_llm(delay_s: float = 0.0) -> ScriptedLLM:
    """A scripted LLM whose answer is the first sentence of passage [1], cited: supported by
    construction, so the verifier keeps it. ``delay_s`` slows each streamed piece (cancel tests)."""

    def reply(messages: Sequence[ChatMessage]) -> str:
        system, user = messages[0].content, messages[-1].content
        if system == prompts.SYNTH_SYSTEM:
            m = re.search(r"^\[1\] [^\n]*\n(.*?)(?:\n\n\[\d+\] |\n\nQuestion:)", user, re.S | re.M)
            first = re.split(r"(?<=\.)\s", (m.group(1) if m else "nothing").replace("… ", ""))[0].rstrip(".")
            return f"Short answer: {' '.join(first.split()[:4])} [1]\nExplanation: {first} [1]."
        if system == prompts.OVERVIEW_SYSTEM:  # a literature answer's overview: the first point, cited
            m = re.search(r"^\[(\d+)\] [^:\n]*: (.*)$", user, re.M)
            return f"{m.group(2).rstrip(' .…')} [{m.group(1)}]." if m else ""
        return "{}"  # router, planner, grader: the rules decide

    class Slow(ScriptedLLM):
        pieces_sent = 0
        pieces_total = 0

        def stream(self, messages, *, max_tokens=256, stop=None):  # type: ignore[no-untyped-def]
            pieces = list(super().stream(messages, max_tokens=max_tokens, stop=stop))
            self.pieces_total += len(pieces)
            for piece in pieces:
                time.sleep(delay_s)
                self.pieces_sent += 1
                yield piece

    return Slow([], default=reply) if delay_s else ScriptedLLM([], default=reply)
