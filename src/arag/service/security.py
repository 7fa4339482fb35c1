"""API keys, per-key rate limits and a limit on wrong keys per client. Off when no key is configured
(a laptop on loopback); on as soon as ``ARAG_API_KEYS`` names one, for every API route except
liveness and readiness."""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from fastapi import Request

from arag.errors import AuthError, RateLimitError

WRONG_KEYS = "this client sent {n} wrong API keys"
FAILURES_SETTING = "ARAG_SERVICE__KEY_FAILURES_PER_MINUTE"
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

    def check(self, key: str, *, what: str = "this key made {n} requests", setting: str = "") -> None:
        """Count one request of ``key``; RateLimitError (with the wait) when it is over its rate."""
        self.over(key, what=what, setting=setting)
        with self._lock:
            if self.per_minute > 0:
                self._hits.setdefault(key, deque()).append(self.clock())

    def over(self, key: str, *, what: str = "this key made {n} requests", setting: str = "") -> None:
        """RateLimitError when ``key`` is at its rate already (nothing is counted)."""
        if self.per_minute <= 0:
            return
        now = self.clock()
        with self._lock:
            hits = self._hits.setdefault(key, deque())
            while hits and hits[0] <= now - 60.0:
                hits.popleft()
            if not hits:
                del self._hits[key]  # clients that come and go leave nothing behind
                return
            if len(hits) >= self.per_minute:
                wait = math.ceil(60.0 - (now - hits[0]))
                err = RateLimitError(
                    f"{what.format(n=len(hits))} in the last minute (at most {self.per_minute})",
                    where="rate limit",
                    fix=f"retry in {wait} s (Retry-After), or raise "
                    f"{setting or 'ARAG_SERVICE__RATE_LIMIT_PER_MINUTE'}",
                )
                err.retry_after = wait
                raise err


class KeyGuard:
    """The check every protected route runs: a known key, under its rate, from a client that has
    not sent too many wrong keys in the last minute (guessing a key costs a minute per few tries)."""

    def __init__(
        self, keys: frozenset[str], limiter: RateLimiter, failures: RateLimiter | None = None
    ) -> None:
        self.keys = keys
        self.limiter = limiter
        self.failures = failures or RateLimiter(10)

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def __call__(self, request: Request) -> None:
        if not self.keys:
            return
        key = key_of(request)
        if key is None:
            raise AuthError("this request has no API key", where=request.url.path, fix=KEY_FIX)
        client = request.client.host if request.client is not None else "unknown"
        # A client over its wrong-key limit is refused before its key is looked at: a right guess
        # made meanwhile would not be told apart.
        self.failures.over(client, what=WRONG_KEYS, setting=FAILURES_SETTING)
        # Constant-time comparison against each key: no timing hint about which prefix matched.
        if not any(hmac.compare_digest(key.encode(), k.encode()) for k in self.keys):
            self.failures.check(client, what=WRONG_KEYS, setting=FAILURES_SETTING)
            raise AuthError("the API key is not valid", where=request.url.path, fix=KEY_FIX)
        self.limiter.check(key)
