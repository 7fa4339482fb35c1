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
