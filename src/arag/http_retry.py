"""Retrying HTTP calls politely, one schedule for every client (arXiv, OpenAI-compatible embeddings
and chat): which answers are worth another try, the server's Retry-After, and doubling back-off."""

from __future__ import annotations

# Answers worth another try: rate limited, or a server (or the proxy before it) failing for now.
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
# Honour a server's Retry-After, but never sleep longer than this per try (OpenAI-compatible APIs).
MAX_RETRY_AFTER_S = 30.0


def retry_after_s(value: str | None, cap: float = MAX_RETRY_AFTER_S) -> float | None:
    """A Retry-After header in seconds, between 0 and ``cap``; None when absent or an HTTP date."""
    if value is None:
        return None
    try:
        return min(max(float(value), 0.0), cap)
    except ValueError:
        return None  # an HTTP date: the caller's own schedule applies


def backoff_delay(attempt: int, base_s: float, retry_after: str | None = None) -> float:
    """Seconds before retry ``attempt`` (0-based): the server's Retry-After if given, else doubling."""
    after = retry_after_s(retry_after)
    return after if after is not None else base_s * (2.0**attempt)
