"""Open the configured store: the one place that knows which backend to build."""

from __future__ import annotations

from arag.index.store import Store
from arag.settings import Settings


def open_store(settings: Settings, dim: int, *, create: bool = True) -> Store:
    """The store for these settings (Qdrant Edge in the data directory by default)."""
    if settings.store.backend == "qdrant-edge":
        from arag.index.qdrant_edge import EdgeStore

        return EdgeStore.open(settings.index_dir, dim, create=create, threads=settings.threads)
    raise AssertionError(f"unknown store backend {settings.store.backend!r}")  # settings validate the literal
