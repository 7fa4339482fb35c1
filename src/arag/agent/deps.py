"""What nodes need that is not state: the retriever, the LLM (None: rules and extractive answers),
the support scorer, settings and an event callback. Nodes are closures over one ``AgentDeps``."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from arag.agent.support import SupportScorer
from arag.errors import AragError, ModelUnavailable
from arag.llm.base import LLM, ChatMessage
from arag.models.abstention import AbstentionRule
from arag.models.reader import Reader
from arag.records import NodeEvent, ScoredChunk, SearchFilter
from arag.retrieval.pipeline import SearchResult
from arag.settings import AgentSettings

log = logging.getLogger(__name__)


class SearchBackend(Protocol):
    """What the retriever node calls: ``arag.retrieval.pipeline.Retriever`` (or a test fake)."""

    def search_many(
        self, queries: Sequence[str], flt: SearchFilter | None = None, *, concurrent: bool = True
    ) -> list[SearchResult]: ...

    def abstract_matches(self, query: str, flt: SearchFilter | None = None) -> list[ScoredChunk]: ...

    def paper_count(self) -> int: ...


@dataclass
class AgentDeps:
    """Everything a node closes over. ``llm_checks``: the LLM is trusted as a grader (a hosted model)."""

    retriever: SearchBackend
    llm: LLM | None
    support: SupportScorer
    settings: AgentSettings
    max_answer_tokens: int = 320
    llm_checks: bool = False
    on_event: Callable[[NodeEvent], None] | None = None
    # The answer reader of the specialists node (None: the answers stand as the verifier leaves them).
    reader: Reader | None = None
    # The calibrated abstention rule after the verifier (None: no answer is declined there).
    abstention: AbstentionRule | None = None

    def count_tokens(self, text: str) -> int:
        """Tokens in the LLM's own tokenizer; about four characters a token without one."""
        if self.llm is not None:
            return self.llm.count_tokens(text)
        return max(1, len(text) // 4) if text else 0


def ask(
    llm: LLM, system: str, user: str, *, max_tokens: int = 256, json_schema: dict[str, Any] | None = None
) -> str:
    """One system + user exchange; the reply's text."""
    messages = [ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)]
    return llm.complete(messages, max_tokens=max_tokens, json_schema=json_schema).text


def ask_json(
    llm: LLM, system: str, user: str, schema: dict[str, Any], *, max_tokens: int = 200
) -> dict[str, Any] | None:
    """Ask for JSON matching ``schema``; None when the model fails or the reply is not a JSON object
    (callers fall back to their rules)."""
    try:
        text = ask(llm, system, user, max_tokens=max_tokens, json_schema=schema)
    except ModelUnavailable:
        raise  # the model process died: this run fails with the reason, no rules in its place
    except AragError as exc:
        log.warning("LLM call failed, falling back to rules: %s", exc)
        return None
    return parse_json_object(text)


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (models wrap JSON in prose or code fences), or None."""
    text = text.strip()
    candidates = [text]
    m = re.search(r"\{.*\}", text, re.DOTALL)
    if m:
        candidates.append(m.group(0))
    for cand in candidates:
        try:
            value = json.loads(cand)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
