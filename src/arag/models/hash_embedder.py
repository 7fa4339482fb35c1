"""A deterministic hashing embedder: the fast fake for tests, with no model files.

Each lowercase word adds +-1 to one of ``dim`` buckets (signed feature hashing with blake2b, so
it is stable across processes and machines); its character trigrams add a little weight too, so
"embedding" and "embeddings" land near each other. Same text, same vector; texts sharing words
have a positive cosine. Token counts use the MiniLM word-piece tokenizer, like the real model.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence

import numpy as np

from arag.errors import ConfigError
from arag.models.embedder import BaseEmbedder, Cache, l2_normalize
from arag.models.onnx_minilm import count_minilm_tokens
from arag.settings import EmbeddingSettings

_WORD = re.compile(r"\w+")
TRIGRAM_WEIGHT = 0.2


@functools.lru_cache(maxsize=200_000)
def hashed_feature(feature: str, dim: int) -> tuple[int, float]:
    """``(bucket, sign)`` of a feature string: blake2b's first 8 bytes, bucket by modulo, sign by top bit."""
    h = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
    return h % dim, (1.0 if h >> 63 == 0 else -1.0)


def word_features(text: str) -> list[tuple[str, float]]:
    """The weighted features of ``text``: each word (1.0) and each trigram of ``<word>`` (TRIGRAM_WEIGHT)."""
    feats: list[tuple[str, float]] = []
    for word in _WORD.findall(text.lower()):
        feats.append(("w:" + word, 1.0))
        padded = f"<{word}>"
        feats.extend(("c:" + padded[i : i + 3], TRIGRAM_WEIGHT) for i in range(len(padded) - 2))
    return feats


def hash_vector(text: str, dim: int) -> np.ndarray:
    """The unnormalised float32 hashed feature vector of ``text``."""
    vec = np.zeros(dim, dtype=np.float32)
    for feature, weight in word_features(text):
        bucket, sign = hashed_feature(feature, dim)
        vec[bucket] += sign * weight
    return vec


class HashEmbedder(BaseEmbedder):
    """Signed feature hashing of words and trigrams; ``model_id`` is ``hash-{dim}``."""

    def __init__(self, settings: EmbeddingSettings, *, cache: Cache | None = None) -> None:
        if settings.dim < 1:
            raise ConfigError(
                f"embedding dim must be >= 1, got {settings.dim}",
                where="ARAG_EMBEDDING__DIM",
                fix="use 384",
            )
        super().__init__(
            model_id=f"hash-{settings.dim}",
            dim=settings.dim,
            max_length=settings.max_length,
            batch_size=settings.batch_size,
            cache=cache,
        )

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Hashed vectors, L2-normalised (a text with no words gives a zero row)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = hash_vector(text, self.dim)
        return l2_normalize(out)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """MiniLM word-pieces per text, so chunk sizes match the real default model."""
        return count_minilm_tokens(texts)
