"""A local GGUF model run in-process by llama-cpp-python.

``llama_cpp`` is imported only when a model is loaded: it is compiled from source at install
time, and everything else in arag works without it. Temperature 0 makes llama.cpp sample
greedily, so replies repeat exactly; the seed matters only at higher temperatures.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from arag.errors import ModelError
from arag.llm.base import ChatMessage, Completion
from arag.settings import LLMSettings

log = logging.getLogger(__name__)

LLAMA_CPP_REQUIREMENT = "llama-cpp-python==0.3.36"


def import_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or a :class:`ModelError` that says how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise ModelError(
            f"the llama-cpp LLM backend needs llama-cpp-python, which is not importable ({exc})",
            where=f"the Python environment {sys.prefix}",
            fix=f"run `make venv` (it builds and caches the wheel), or `pip install {LLAMA_CPP_REQUIREMENT}`;"
            " or set ARAG_LLM__PROVIDER=extractive (no LLM) or openai",
        ) from exc
    return llama_cpp


def _messages(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


class LlamaCppLLM:
    """A GGUF chat model on the CPU, ``settings.threads`` threads, one call at a time."""

    def __init__(self, model_path: Path, settings: LLMSettings, *, name: str | None = None) -> None:
        llama_cpp = import_llama_cpp()
        self.name = name or model_path.stem
        self.context_tokens = settings.context_tokens
        self.model_path = model_path
        self.temperature = settings.temperature
        self.seed = settings.seed
        # llama.cpp contexts are not thread-safe: one generation at a time per model.
        self._lock = threading.Lock()
        started = time.perf_counter()
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(model_path),
                n_ctx=settings.context_tokens,
                n_threads=settings.threads,
                n_threads_batch=settings.threads,
                n_gpu_layers=settings.gpu_layers,
                seed=settings.seed,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelError(
                f"llama.cpp could not load the model: {exc}",
                where=str(model_path),
                fix="check the file is a complete GGUF model; delete it to have it assembled again",
            ) from exc
        seconds = time.perf_counter() - started
        log.info("loaded %s in %.1fs (%d threads)", model_path.name, seconds, settings.threads)

    def _kwargs(self, max_tokens: int, stop: Sequence[str] | None) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "seed": self.seed,
            "max_tokens": max_tokens,
            "stop": list(stop or []),
            # Penalties off: they change greedy output depending on what came before.
            "repeat_penalty": 1.0,
        }

    def _fail(self, exc: Exception) -> ModelError:
        text = str(exc)
        if "context window" in text or "exceed" in text:
            return ModelError(
                f"the prompt does not fit the model's context: {text}",
                where=self.name,
                fix="shorten the prompt (fewer passages) or raise ARAG_LLM__CONTEXT_TOKENS",
            )
        return ModelError(f"llama.cpp generation failed: {text}", where=self.name)

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        kwargs = self._kwargs(max_tokens, stop)
        started = time.perf_counter()
        with self._lock:
            try:
                if json_schema is not None:
                    out = self._complete_json(messages, json_schema, kwargs)
                else:
                    out = self._llm.create_chat_completion(messages=_messages(messages), **kwargs)
            except (ValueError, RuntimeError) as exc:
                raise self._fail(exc) from exc
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return Completion(
            text=choice["message"].get("content") or "",
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            seconds=time.perf_counter() - started,
            finish_reason=choice.get("finish_reason") or "",
        )

    def _complete_json(
        self, messages: Sequence[ChatMessage], schema: dict[str, Any], kwargs: dict[str, Any]
    ) -> Any:
        # llama-cpp-python compiles the schema into a grammar that constrains sampling.
        try:
            return self._llm.create_chat_completion(
                messages=_messages(messages),
                response_format={"type": "json_object", "schema": schema},
                **kwargs,
            )
        except (ValueError, RuntimeError, KeyError, TypeError) as exc:
            if "context window" in str(exc):
                raise
            # A schema feature the grammar converter does not handle: any JSON object, then the
            # caller validates.
            log.warning("JSON schema grammar failed (%s); constraining to any JSON object", exc)
            return self._llm.create_chat_completion(
                messages=_messages(messages), response_format={"type": "json_object"}, **kwargs
            )

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
    ) -> Iterator[str]:
        kwargs = self._kwargs(max_tokens, stop)
        # The lock is held until the generator finishes or is closed.
        with self._lock:
            try:
                for chunk in self._llm.create_chat_completion(
                    messages=_messages(messages), stream=True, **kwargs
                ):
                    piece = chunk["choices"][0].get("delta", {}).get("content")
                    if piece:
                        yield piece
            except (ValueError, RuntimeError) as exc:
                raise self._fail(exc) from exc

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the model's tokenizer. No lock: tokenizing reads only the vocabulary,
        never the context, so it may run beside a generation."""
        if not text:
            return 0
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def close(self) -> None:
        """Free the model's memory now rather than at garbage collection."""
        with self._lock:
            close = getattr(self._llm, "close", None)
            if close is not None:
                close()
