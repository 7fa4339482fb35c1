"""An OpenAI-compatible ``/v1/embeddings`` client (OpenAI, vLLM, llama.cpp, Ollama, TEI, ...).

``POST {base_url}/embeddings`` with ``{"model": ..., "input": [...]}`` and a Bearer key; 429 and
5xx answers and dropped connections are retried with exponential backoff. Token counts use the
MiniLM word-piece tokenizer as an approximation: the remote model's tokenizer is unknown here,
and chunk sizes only need to be roughly right for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from arag.errors import ConfigError, ModelError, NetworkError
from arag.http_retry import RETRY_STATUS, backoff_delay
from arag.models.embedder import BaseEmbedder, Cache, l2_normalize
from arag.models.onnx_minilm import count_minilm_tokens
from arag.settings import EmbeddingSettings

log = logging.getLogger(__name__)


class OpenAICompatEmbedder(BaseEmbedder):
    """Embeddings from an OpenAI-compatible HTTP endpoint."""

    def __init__(
        self,
        settings: EmbeddingSettings,
        *,
        cache: Cache | None = None,
        retries: int = 4,
        backoff_s: float = 0.5,
    ) -> None:
        if not settings.base_url:
            raise ConfigError(
                "the openai embedding provider needs a base URL",
                where="ARAG_EMBEDDING__BASE_URL",
                fix="set ARAG_EMBEDDING__BASE_URL (e.g. https://api.openai.com/v1 or http://localhost:8000/v1)",
            )
        parts = urlsplit(settings.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"embedding base URL {settings.base_url!r} is not an http(s) URL",
                where="ARAG_EMBEDDING__BASE_URL",
                fix="use a URL like http://localhost:8000/v1",
            )
        # The host is part of the id: two servers may serve different weights under one model name.
        super().__init__(
            model_id=f"openai:{settings.model}@{parts.netloc}",
            dim=settings.dim,
            max_length=settings.max_length,
            batch_size=settings.batch_size,
            cache=cache,
        )
        self.model_name = settings.model
        self.url = settings.base_url.rstrip("/") + "/embeddings"
        self.retries = max(retries, 0)
        self.backoff_s = backoff_s
        headers = {"Content-Type": "application/json"}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self._client = httpx.Client(timeout=settings.timeout_s, headers=headers)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """One request for the batch; rows come back in input order, L2-normalised."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        body = self._post({"model": self.model_name, "input": list(texts)})
        return l2_normalize(self._parse(body, len(texts)))

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Approximate token counts: MiniLM word-pieces (the remote tokenizer is not known here)."""
        return count_minilm_tokens(texts)

    def close(self) -> None:
        """Close the HTTP client and the cache."""
        self._client.close()
        super().close()

    def _post(self, payload: dict[str, Any]) -> Any:
        last: str = ""
        for attempt in range(self.retries + 1):
            try:
                resp = self._client.post(self.url, json=payload)
            except httpx.TimeoutException as exc:
                last = f"timed out: {exc}"
                retry_after = None
            except httpx.TransportError as exc:
                last = f"connection failed: {exc}"
                retry_after = None
            else:
                if resp.status_code == 200:
                    try:
                        return resp.json()
                    except ValueError as exc:
                        raise ModelError(
                            f"embeddings endpoint returned invalid JSON: {exc}",
                            where=self.url,
                            fix="check that ARAG_EMBEDDING__BASE_URL points at an OpenAI-compatible API",
                        ) from exc
                if resp.status_code not in RETRY_STATUS:
                    raise self._client_error(resp)
                last = f"HTTP {resp.status_code}: {_excerpt(resp.text)}"
                retry_after = resp.headers.get("Retry-After")
            if attempt < self.retries:
                delay = backoff_delay(attempt, self.backoff_s, retry_after)
                log.warning("embeddings request failed (%s); retry %d in %.1fs", last, attempt + 1, delay)
                time.sleep(delay)
        raise NetworkError(
            f"embeddings endpoint failed after {self.retries + 1} attempts; last error: {last}",
            where=self.url,
            fix="check that the server is running and reachable at ARAG_EMBEDDING__BASE_URL, then retry",
        )

    def _client_error(self, resp: httpx.Response) -> ModelError:
        if resp.status_code in (401, 403):
            fix = "set a valid key in ARAG_EMBEDDING__API_KEY"
        elif resp.status_code == 404:
            fix = "check ARAG_EMBEDDING__BASE_URL (it should end in /v1) and ARAG_EMBEDDING__MODEL"
        else:
            fix = "check ARAG_EMBEDDING__MODEL and the server's input limit (ARAG_EMBEDDING__BATCH_SIZE)"
        return ModelError(
            f"embeddings endpoint rejected the request with HTTP {resp.status_code}: {_excerpt(resp.text)}",
            where=self.url,
            fix=fix,
        )

    def _parse(self, body: Any, n: int) -> np.ndarray:
        try:
            data = sorted(body["data"], key=lambda d: d.get("index", 0))
            vecs = np.array([d["embedding"] for d in data], dtype=np.float32)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelError(
                f"embeddings response is not in the OpenAI format ({type(exc).__name__}: {exc})",
                where=self.url,
                fix="check that ARAG_EMBEDDING__BASE_URL points at an OpenAI-compatible /v1 API",
            ) from exc
        if vecs.ndim != 2 or vecs.shape[0] != n:
            raise ModelError(
                f"embeddings endpoint returned {vecs.shape[0] if vecs.ndim else 0} vectors for {n} inputs",
                where=self.url,
                fix="check the server; lower ARAG_EMBEDDING__BATCH_SIZE if it drops inputs",
            )
        if vecs.shape[1] != self.dim:
            raise ModelError(
                f"model {self.model_name!r} returned {vecs.shape[1]}-d vectors, settings say {self.dim}",
                where=self.url,
                fix=f"set ARAG_EMBEDDING__DIM={vecs.shape[1]}",
            )
        return vecs


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
