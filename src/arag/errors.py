"""The error hierarchy. Every message says what failed, where, and how to fix it.

The CLI maps each class to an exit code (``exit_code``); the service maps ``http_status`` (and
sends it in SSE ``error`` events). Nothing else in arag raises bare exceptions at a user.
"""

from __future__ import annotations


class AragError(Exception):
    """Base class: a failure the user can act on."""

    exit_code: int = 1
    http_status: int = 500
    # Seconds a client should wait before retrying (sent as Retry-After with 429 and 503).
    retry_after: int | None = None

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.what = what
        self.where = where
        self.fix = fix
        parts = [what]
        if where:
            parts.append(f"(at {where})")
        msg = " ".join(parts)
        if fix:
            msg += f"\n  fix: {fix}"
        super().__init__(msg)


class ConfigError(AragError):
    """Settings are invalid or point at something that does not exist."""

    exit_code = 2
    http_status = 500


class CorpusError(AragError):
    """A corpus source is missing or unreadable."""

    exit_code = 3
    http_status = 500


class IngestError(AragError):
    """One document could not be parsed; builds log it and skip the document."""

    exit_code = 4
    http_status = 422


class ModelError(AragError):
    """A model could not be loaded or failed to run."""

    exit_code = 5
    http_status = 503


class ModelUnavailable(ModelError):
    """The local LLM process died under a request, or is restarting: this answer fails, the service
    stays up, and a retry in a few seconds reaches the restarted model. Never answered by a fallback
    (an extractive answer in its place would be a different result than the one asked for)."""

    retry_after = 5


class IndexError_(AragError):
    """The index is missing, locked, or inconsistent."""

    exit_code = 6
    http_status = 503


class NetworkError(AragError):
    """A remote service (arXiv, an embeddings endpoint) could not be reached."""

    exit_code = 7
    http_status = 502


class InputError(AragError):
    """The user's input is invalid (a bad id, an empty question, a bad filter)."""

    exit_code = 8
    http_status = 400


# The public name: avoid shadowing the builtin IndexError inside arag modules.
StoreError = IndexError_


class NotFoundError(InputError):
    """The request names something the library does not hold (a paper id, a job id)."""

    http_status = 404


class BusyError(AragError):
    """The service's queue is full; the client should retry later."""

    exit_code = 9
    http_status = 503
    retry_after = 5


class AuthError(AragError):
    """A request without a valid API key."""

    exit_code = 10
    http_status = 401


class ForbiddenError(AuthError):
    """A request the service refuses whatever its key: from another site, or beyond loopback
    without keys."""

    http_status = 403


class RateLimitError(AragError):
    """A key over its request rate."""

    exit_code = 11
    http_status = 429


class Cancelled(AragError):
    """The caller went away (a closed stream, Ctrl-C); the run stopped between steps."""

    exit_code = 130
    # nginx's "client closed request": nobody reads it, but logs say what happened.
    http_status = 499


class TooLargeError(InputError):
    """An upload over the size or count limit."""

    http_status = 413


class UnsupportedError(InputError):
    """An upload of a kind arag does not ingest (not a PDF)."""

    http_status = 415
