"""A disk cache of LLM calls: the same backend, model, prompt and parameters give the stored reply.

Generation runs at temperature 0 with a fixed seed, so a reply is a function of its key and a rerun
(an evaluation, a repeated question) costs nothing. Hits are counted per thread, so the agent can
mark the steps whose LLM work came from the cache (``llm_cached`` in a node's counts). Streams are
stored only when they finish: a cancelled generation is not a reply.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from arag.llm.base import LLM, ChatMessage, Completion, NextToken, next_token

_local = threading.local()
# A change in what is stored, or in how keys are made, starts a new cache.
CACHE_FORMAT = 1


def cache_hits() -> int:
    """LLM calls answered from a cache in this thread so far."""
    return int(getattr(_local, "hits", 0))


def _count_hit() -> None:
    _local.hits = cache_hits() + 1


class CachedLLM:
    """Wraps an LLM; replies are looked up in (and written to) an SQLite file."""

    def __init__(self, inner: LLM, path: Path, *, backend: str, params: dict[str, Any]) -> None:
        self.inner = inner
        self.name = inner.name
        self.context_tokens = inner.context_tokens
        self.path = path
        self._backend = backend
        # Settings that change replies beyond the call's own arguments (temperature, seed).
        self._params = params
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS replies "
            "(key TEXT PRIMARY KEY, completion TEXT NOT NULL, created REAL)"
        )

    def key(self, messages: Sequence[ChatMessage], **call: Any) -> str:
        """The cache key of a call: backend, model, messages, call arguments and reply settings."""
        blob = json.dumps(
            {
                "format": CACHE_FORMAT,
                "backend": self._backend,
                "model": self.name,
                "messages": [m.model_dump() for m in messages],
                "call": call,
                "params": self._params,
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def _get(self, key: str) -> Completion | None:
        with self._lock:
            row = self._db.execute("SELECT completion FROM replies WHERE key = ?", (key,)).fetchone()
        return Completion.model_validate_json(row[0]) if row else None

    def _put(self, key: str, completion: Completion) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO replies (key, completion, created) VALUES (?, ?, ?)",
                (key, completion.model_dump_json(), time.time()),
            )

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        key = self.key(messages, max_tokens=max_tokens, stop=list(stop or []), json_schema=json_schema)
        hit = self._get(key)
        if hit is not None:
            _count_hit()
            return hit.model_copy(update={"cached": True, "seconds": 0.0})
        out = self.inner.complete(messages, max_tokens=max_tokens, stop=stop, json_schema=json_schema)
        self._put(key, out)
        return out

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
    ) -> Iterator[str]:
        # A streamed reply is the same reply as a completed one: one key for both.
        key = self.key(messages, max_tokens=max_tokens, stop=list(stop or []), json_schema=None)
        hit = self._get(key)
        if hit is not None:
            _count_hit()
            yield hit.text
            return
        pieces: list[str] = []
        t0 = time.perf_counter()
        inner = self.inner.stream(messages, max_tokens=max_tokens, stop=stop)
        try:
            for piece in inner:
                pieces.append(piece)
                yield piece
        finally:
            close = getattr(inner, "close", None)
            if close is not None:
                close()
        # Reached only when the stream ran to its end (a closed generator stops at the yield).
        self._put(
            key, Completion(text="".join(pieces), seconds=time.perf_counter() - t0, finish_reason="stop")
        )

    def next_token(
        self, messages: Sequence[ChatMessage], reply_prefix: str, continuations: Sequence[str]
    ) -> NextToken | None:
        # Stored beside the replies (its own key), so a cached answer keeps its scores as well.
        key = self.key(messages, next_token={"prefix": reply_prefix, "continuations": list(continuations)})
        with self._lock:
            row = self._db.execute("SELECT completion FROM replies WHERE key = ?", (key,)).fetchone()
        if row is not None:
            _count_hit()
            return NextToken.model_validate_json(row[0])
        out = next_token(self.inner, messages, reply_prefix, continuations)
        if out is not None:
            with self._lock:
                self._db.execute(
                    "INSERT OR REPLACE INTO replies (key, completion, created) VALUES (?, ?, ?)",
                    (key, out.model_dump_json(), time.time()),
                )
        return out

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def close(self) -> None:
        """Close the cache and the model behind it."""
        with self._lock:
            self._db.close()
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()
