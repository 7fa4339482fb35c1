"""Per-run hooks: a cancel flag checked between nodes and between generated tokens, and a callback
for the answer's tokens as the LLM writes them. One compiled agent serves many runs at once, so
hooks travel with each run (LangGraph's config), never in the shared deps."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from arag.errors import Cancelled


@dataclass
class RunHooks:
    """What one run's caller listens to and can stop."""

    on_token: Callable[[str], None] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    def check(self, where: str) -> None:
        """Raise Cancelled when the caller asked to stop."""
        if self.cancel.is_set():
            raise Cancelled("the run was cancelled", where=where, fix="ask again to get an answer")


_current: ContextVar[RunHooks | None] = ContextVar("arag_run_hooks", default=None)


def current_hooks() -> RunHooks | None:
    """The hooks of the run whose node is executing in this thread, if any."""
    return _current.get()


@contextmanager
def using(hooks: RunHooks | None) -> Iterator[None]:
    """Make ``hooks`` current while a node runs."""
    token = _current.set(hooks)
    try:
        yield
    finally:
        _current.reset(token)
