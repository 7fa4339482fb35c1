"""API keys and per-key rate limits. Off when no key is configured (a laptop on loopback); on as
soon as ``ARAG_API_KEYS`` names one, for every API route except liveness and readiness."""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from fastapi import Request

from arag.errors import AuthError, RateLimitError

KEY_FIX = "send the key as 'Authorization: Bearer KEY' or 'X-API-Key: KEY' (keys are set in ARAG_API_KEYS)"


def key_of(request: Request) -> str | None:
    """The key a request carries, if any."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


class RateLimiter:
    """At most ``per_minute`` requests per key in any sliding 60-second window."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._hits: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, key: str) -> None:
        """Count one request of ``key``; RateLimitError (with the wait) when it is over its rate."""
        if self.per_minute <= 0:
            return
        now = self.clock()
        with self._lock:
            hits = self._hits.setdefault(key, deque())
            while hits and hits[0] <= now - 60.0:
                hits.popleft()
            if len(hits) >= self.per_minute:
                wait = math.ceil(60.0 - (now - hits[0]))
                err = RateLimitError(
                    f"this key made {len(hits)} requests in the last minute (at most {self.per_minute})",
                    where="rate limit",
                    fix=f"retry in {wait} s (Retry-After), or raise ARAG_SERVICE__RATE_LIMIT_PER_MINUTE",
                )
                err.retry_after = wait
                raise err
            hits.append(now)


class KeyGuard:
    """The check every protected route runs: a known key, under its rate."""

    def __init__(self, keys: frozenset[str], limiter: RateLimiter) -> None:
        self.keys = keys
        self.limiter = limiter

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def __call__(self, request: Request) -> None:
        if not self.keys:
            return
        key = key_of(request)
        if key is None:
            raise AuthError("this request has no API key", where=request.url.path, fix=KEY_FIX)
        # Constant-time comparison against each key: no timing hint about which prefix matched.
        if not any(hmac.compare_digest(key.encode(), k.encode()) for k in self.keys):
            raise AuthError("the API key is not valid", where=request.url.path, fix=KEY_FIX)
        self.limiter.check(key)
