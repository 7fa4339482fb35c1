"""Choosing the embedder the settings name: the one place that knows every provider's module."""

from __future__ import annotations

from pathlib import Path

from arag.errors import ConfigError
from arag.models.embedder import BaseEmbedder, Cache, EmbeddingCache, NullCache
from arag.settings import EmbeddingSettings, Settings


def get_embedder(
    settings: EmbeddingSettings, cache_path: Path | None = None, *, models_dir: Path | None = None
) -> BaseEmbedder:
    """The embedder ``settings.provider`` names, with a sqlite cache at ``cache_path`` (None: no cache);
    a model derived from a packaged one is kept in ``models_dir`` (None: a temporary folder)."""
    cache: Cache = EmbeddingCache(cache_path) if cache_path is not None else NullCache()
    provider = settings.provider
    try:
        if provider == "onnx-minilm":
            from arag.models.onnx_minilm import OnnxMiniLMEmbedder

            return OnnxMiniLMEmbedder(settings, cache=cache, models_dir=models_dir)
        if provider == "sentence-transformers":
            from arag.models.hub import SentenceTransformerEmbedder

            return SentenceTransformerEmbedder(settings, cache=cache)
        if provider == "openai":
            from arag.models.openai_embedder import OpenAICompatEmbedder

            return OpenAICompatEmbedder(settings, cache=cache)
        if provider == "hash":
            from arag.models.hash_embedder import HashEmbedder

            return HashEmbedder(settings, cache=cache)
    except BaseException:
        cache.close()
        raise
    cache.close()
    raise ConfigError(
        f"unknown embedding provider {provider!r}",
        where="ARAG_EMBEDDING__PROVIDER",
        fix="use one of onnx-minilm, sentence-transformers, openai, hash",
    )


def library_embedder(settings: Settings, *, cached: bool = True) -> BaseEmbedder:
    """The library's embedder: the configured model, its vectors cached in the data directory
    (``cached=False``: none, so that every text runs the model, as a benchmark wants), a derived
    model kept with the library's models."""
    return get_embedder(
        settings.embedding, settings.embedding_cache_db if cached else None, models_dir=settings.embedder_dir
    )
