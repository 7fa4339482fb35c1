"""The LLM protocol every backend implements, and the records it speaks in."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

Role = Literal["system", "user", "assistant"]


class ChatMessage(BaseModel):
    """One message of a chat prompt."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str


class Completion(BaseModel):
    """A finished generation and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    finish_reason: str = ""
    # Answered from the disk cache of LLM calls (llm/cache.py), not generated now.
    cached: bool = False


class NextToken(BaseModel):
    """What a model would write next after a prompt and the start of its reply (``next_token``)."""

    # The probability of each asked-for continuation's first token.
    probs: dict[str, float]
    # The most likely next tokens and their probabilities, best first.
    top: list[tuple[str, float]] = []
    # The next token's entropy, in nats.
    entropy: float = 0.0


@runtime_checkable
class LLM(Protocol):
    """A chat model. Temperature 0 and a fixed seed where the backend allows, so runs repeat."""

    name: str
    # The prompt + answer budget in the model's own tokens.
    context_tokens: int

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        """Generate a reply. With ``json_schema`` the reply is constrained to (or asked for as) JSON
        matching it; callers still validate and fall back on failure."""
        ...

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
    ) -> Iterator[str]:
        """Generate a reply piece by piece (the pieces concatenate to the reply)."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the model's own tokenizer (for context budgets)."""
        ...


def next_token(
    llm: object, messages: Sequence[ChatMessage], reply_prefix: str, continuations: Sequence[str]
) -> NextToken | None:
    """The next-token probabilities after ``messages`` and ``reply_prefix``, from a backend that can
    tell (arag's local model processes, the scripted fake); None from one that cannot (a hosted API).
    Optional, so a backend without it still implements :class:`LLM`."""
    fn = getattr(llm, "next_token", None)
    if fn is None:
        return None
    out = fn(messages, reply_prefix, continuations)
    return out if isinstance(out, NextToken) else None
