"""Open the configured store: the one place that knows which backend to build."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from arag.errors import ConfigError
from arag.index.lock import acquire
from arag.index.store import Store
from arag.settings import Settings

if TYPE_CHECKING:
    from arag.index.qdrant_edge import EdgeStore
    from arag.index.qdrant_server import QdrantServerStore


def store_backend(settings: Settings) -> Literal["edge", "qdrant"]:
    """The backend in force: ``auto`` means qdrant when ``qdrant_url`` is set, else edge."""
    backend = settings.store.backend
    if backend == "auto":
        return "qdrant" if settings.qdrant_url else "edge"
    return backend


def open_store(settings: Settings, dim: int, *, create: bool = True) -> Store:
    """The store for these settings (Qdrant Edge in the data directory by default), holding the
    library lock (shared) until it is closed, so that no rebuild swaps the library under it."""
    lock = acquire(settings.data_dir)
    try:
        store = _open_store(settings, dim, create=create)
    except BaseException:
        lock.release()
        raise
    store.release_on_close(lock.release)
    return store


def _open_store(settings: Settings, dim: int, *, create: bool) -> EdgeStore | QdrantServerStore:
    backend = store_backend(settings)
    if backend == "edge":
        from arag.index.qdrant_edge import EdgeStore

        return EdgeStore.open(settings.index_dir, dim, create=create, threads=settings.threads)
    if backend == "qdrant":
        from arag.index.qdrant_server import QdrantServerStore

        if not settings.qdrant_url:
            raise ConfigError(
                "the qdrant store backend needs a server address",
                where="ARAG_STORE__BACKEND=qdrant",
                fix="set ARAG_QDRANT_URL (http://host:6333, or :memory: / path:DIR for local mode), "
                "or ARAG_STORE__BACKEND=edge",
            )
        return QdrantServerStore.open(
            settings.qdrant_url,
            dim,
            collection=settings.collection,
            api_key=settings.qdrant_key,
            create=create,
            shards=settings.store.shards,
            replication_factor=settings.store.replication_factor,
        )
    raise AssertionError(f"unknown store backend {backend!r}")  # settings validate the literal
