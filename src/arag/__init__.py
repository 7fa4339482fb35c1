"""arag: an adaptive retrieval-augmented research assistant.

``arag.ask(question)`` and ``arag.Library`` (see :mod:`arag.api`) are loaded on first use, so that
``import arag`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from arag.version import __version__

if TYPE_CHECKING:
    from arag.api import Library, ask

__all__ = ["Library", "__version__", "ask"]


def __getattr__(name: str) -> Any:
    if name in ("ask", "Library"):
        from arag import api

        return getattr(api, name)
    raise AttributeError(f"module 'arag' has no attribute {name!r}")
