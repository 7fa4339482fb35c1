"""Text embedders: the protocol, the shared batching/caching base class, and the cache.

Every provider (ONNX MiniLM, sentence-transformers, OpenAI-compatible HTTP, hash) implements only
``embed_batch`` and ``count_tokens``; :class:`BaseEmbedder` adds deduplication, a persistent
sqlite cache keyed by model and text, length-sorted batching, and input-order results.
Build embedders with :func:`arag.models.factory.get_embedder`, never by hand, so settings select
the real or fake one.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from arag.errors import ConfigError, InputError, ModelError, StoreError

log = logging.getLogger(__name__)

# SQLite's default limit on host parameters is far higher now, but 500 stays portable and fast.
_MAX_IN_KEYS = 500


@runtime_checkable
class Embedder(Protocol):
    """What a model provider implements: one batch in, normalised float32 vectors out."""

    model_id: str
    dim: int
    max_length: int

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` as a float32 ``(n, dim)`` array of L2-normalised rows."""
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Word-pieces per text as the model reads them, without special tokens and untruncated."""
        ...


# ---------------------------------------------------------------------------------------------
# Pure maths
# ---------------------------------------------------------------------------------------------


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows of ``x`` scaled to unit L2 norm, as float32; all-zero rows stay zero."""
    arr = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(arr, axis=-1, keepdims=True)
    return (arr / np.maximum(norms, eps)).astype(np.float32, copy=False)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of token vectors ``hidden`` ``(n, seq, d)`` over positions where ``mask`` ``(n, seq)`` is 1."""
    m = np.asarray(mask, dtype=np.float32)[:, :, None]
    summed = (np.asarray(hidden, dtype=np.float32) * m).sum(axis=1)
    # Same clamp as sentence-transformers, so an all-padding row gives zeros rather than NaN.
    counts = np.maximum(m.sum(axis=1), 1e-9)
    return (summed / counts).astype(np.float32, copy=False)


def cache_key(model_id: str, text: str) -> str:
    """The cache key of ``text`` under ``model_id``: sha256 hex of ``model_id + NUL + text``."""
    try:
        data = f"{model_id}\0{text}".encode()
    except UnicodeEncodeError as exc:  # lone surrogates: bytes of another encoding, escaped
        raise InputError(
            "the text is not valid Unicode (it holds bytes of another encoding, or lone surrogates)",
            where="the text to embed",
            fix="send UTF-8 text (on a terminal: a UTF-8 locale, e.g. LANG=C.UTF-8)",
        ) from exc
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------


class NullCache:
    """A cache that stores nothing (tests, one-off queries)."""

    def get_many(self, model_id: str, dim: int, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Nothing is ever cached."""
        return {}

    def put_many(self, model_id: str, items: Mapping[str, np.ndarray]) -> None:
        """Drop the vectors."""

    def close(self) -> None:
        """Nothing to close."""


class EmbeddingCache:
    """Vectors by ``cache_key(model_id, text)`` in one sqlite table (WAL mode, safe across processes)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # The lock serialises threads; sqlite's own locking handles other processes.
            self._conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS embeddings"
                " (key TEXT PRIMARY KEY, model TEXT NOT NULL, vec BLOB NOT NULL)"
            )
            self._conn.commit()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"could not open the embedding cache: {exc}",
                where=str(self.path),
                fix="make the directory writable, or delete the file (it is only a cache and is rebuilt)",
            ) from exc

    def get_many(self, model_id: str, dim: int, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """The cached vectors among ``keys`` for ``model_id``; rows of another model or size are ignored."""
        found: dict[str, np.ndarray] = {}
        unique = list(dict.fromkeys(keys))
        try:
            with self._lock:
                for start in range(0, len(unique), _MAX_IN_KEYS):
                    part = unique[start : start + _MAX_IN_KEYS]
                    marks = ",".join("?" * len(part))
                    rows = self._conn.execute(
                        f"SELECT key, vec FROM embeddings WHERE model = ? AND key IN ({marks})",
                        (model_id, *part),
                    ).fetchall()
                    for key, blob in rows:
                        if len(blob) == dim * 4:
                            found[key] = np.frombuffer(blob, dtype=np.float32).copy()
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc
        return found

    def put_many(self, model_id: str, items: Mapping[str, np.ndarray]) -> None:
        """Store vectors by key, in one transaction."""
        if not items:
            return
        rows = [(k, model_id, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items.items()]
        try:
            with self._lock, self._conn:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO embeddings (key, model, vec) VALUES (?, ?, ?)", rows
                )
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def count(self, model_id: str | None = None) -> int:
        """Number of cached vectors, for one model or all."""
        with self._lock:
            if model_id is None:
                row = self._conn.execute("SELECT COUNT(*) FROM embeddings").fetchone()
            else:
                row = self._conn.execute(
                    "SELECT COUNT(*) FROM embeddings WHERE model = ?", (model_id,)
                ).fetchone()
        return int(row[0])

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    def _error(self, action: str, exc: Exception) -> StoreError:
        return StoreError(
            f"could not {action} the embedding cache: {exc}",
            where=str(self.path),
            fix="delete the file (it is only a cache and is rebuilt) and retry",
        )


Cache = EmbeddingCache | NullCache


# ---------------------------------------------------------------------------------------------
# Base class
# ---------------------------------------------------------------------------------------------


class BaseEmbedder:
    """Deduplication, caching and batching around a provider's ``embed_batch``."""

    def __init__(
        self, *, model_id: str, dim: int, max_length: int, batch_size: int, cache: Cache | None = None
    ) -> None:
        if batch_size < 1:
            raise ConfigError(
                f"embedding batch_size must be >= 1, got {batch_size}",
                where="ARAG_EMBEDDING__BATCH_SIZE",
                fix="set a positive batch size (32 is a good default on CPU)",
            )
        self.model_id = model_id
        self.dim = dim
        self.max_length = max_length
        self.batch_size = batch_size
        self.cache: Cache = cache if cache is not None else NullCache()
        # Texts that went through the model (not the cache) since this embedder was made.
        self.texts_run = 0

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed one batch; implemented by each provider."""
        raise NotImplementedError

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Word-pieces per text; implemented by each provider."""
        raise NotImplementedError

    def embed(self, texts: Sequence[str], *, progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Embed ``texts`` as a float32 ``(len(texts), dim)`` array, in input order.

        Duplicates are embedded once, cached vectors are reused, and the misses run in
        batches of similar length so little time goes on padding. ``progress`` is called
        with the number of input texts each step finished; the calls sum to ``len(texts)``.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        positions: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            positions.setdefault(text, []).append(i)
        keys = {text: cache_key(self.model_id, text) for text in positions}
        cached = self.cache.get_many(self.model_id, self.dim, list(keys.values()))
        done = 0
        misses: list[str] = []
        for text, idx in positions.items():
            vec = cached.get(keys[text])
            if vec is None:
                misses.append(text)
            else:
                out[idx] = vec
                done += len(idx)
        if done and progress is not None:
            progress(done)
        # Longest first: the slowest batches show up early, and padding stays within similar lengths.
        misses.sort(key=len, reverse=True)
        self.texts_run += len(misses)
        for start in range(0, len(misses), self.batch_size):
            batch = misses[start : start + self.batch_size]
            vecs = self._checked_batch(batch)
            self.cache.put_many(self.model_id, {keys[t]: v for t, v in zip(batch, vecs, strict=True)})
            n_inputs = 0
            for text, vec in zip(batch, vecs, strict=True):
                out[positions[text]] = vec
                n_inputs += len(positions[text])
            if progress is not None:
                progress(n_inputs)
        return out

    def embed_query(self, text: str) -> np.ndarray:
        """One text as a 1-D float32 vector of length ``dim``."""
        return self.embed([text])[0]

    def close(self) -> None:
        """Release the cache (and, in subclasses, sessions or connections)."""
        self.cache.close()

    def __enter__(self) -> BaseEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _checked_batch(self, batch: Sequence[str]) -> np.ndarray:
        vecs = np.asarray(self.embed_batch(batch), dtype=np.float32)
        if vecs.shape != (len(batch), self.dim):
            raise ModelError(
                f"embedder {self.model_id} returned shape {vecs.shape}, expected {(len(batch), self.dim)}",
                where=type(self).__name__,
                fix="set ARAG_EMBEDDING__DIM to the model's output size",
            )
        if not np.isfinite(vecs).all():
            raise ModelError(
                f"embedder {self.model_id} returned non-finite values",
                where=type(self).__name__,
                fix="check the model files; delete the embedding cache if it was written by a broken run",
            )
        return vecs
