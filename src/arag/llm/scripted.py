"""A deterministic fake LLM for tests: replies come from a script, never from a model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from arag.llm.base import ChatMessage, Completion, NextToken

Reply = str | Callable[[Sequence[ChatMessage]], str]
# A scripted next-token answer: fixed, or a function of the messages (None: "cannot tell").
NextTokens = NextToken | Callable[[Sequence[ChatMessage]], NextToken | None] | None


class ScriptedLLM:
    """Replies in order from ``replies`` (a string, or a function of the messages); when the script
    runs out, ``default`` answers (a function of the messages, or a fixed string). Records every
    prompt in ``calls`` so tests can check what each node asked. ``next_tokens`` answers
    :meth:`next_token` (by default it cannot tell, as a hosted API)."""

    def __init__(
        self,
        replies: Sequence[Reply] = (),
        *,
        default: Reply | None = None,
        name: str = "scripted",
        context_tokens: int = 4096,
        next_tokens: NextTokens = None,
    ) -> None:
        self.name = name
        self.context_tokens = context_tokens
        self._replies = list(replies)
        self._default = default
        self.calls: list[list[ChatMessage]] = []
        self._next_tokens = next_tokens

    def _next(self, messages: Sequence[ChatMessage]) -> str:
        self.calls.append(list(messages))
        if self._replies:
            reply = self._replies.pop(0)
        elif self._default is not None:
            reply = self._default
        else:
            raise AssertionError(f"ScriptedLLM ran out of replies at call {len(self.calls)}")
        return reply(messages) if callable(reply) else reply

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        text = self._next(messages)
        return Completion(
            text=text,
            prompt_tokens=sum(self.count_tokens(m.content) for m in messages),
            completion_tokens=self.count_tokens(text),
            finish_reason="stop",
        )

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
    ) -> Iterator[str]:
        text = self._next(messages)
        for i in range(0, len(text), 8):
            yield text[i : i + 8]

    def next_token(
        self, messages: Sequence[ChatMessage], reply_prefix: str, continuations: Sequence[str]
    ) -> NextToken | None:
        script = self._next_tokens
        return script(messages) if callable(script) else script

    def count_tokens(self, text: str) -> int:
        # About four characters a token, like the real tokenizers on English.
        return max(1, len(text) // 4) if text else 0
