"""The packaged GGUF model, served by supervised processes of its own and reached over loopback HTTP.

``LocalLLM`` implements the :class:`~arag.llm.base.LLM` protocol over one or more
:class:`~arag.llm.process.ModelProcess` (``ARAG_LLM__PROCESSES``), each taking one request at a
time: a request waits here, in arag, for a free process, so the HTTP timeout covers generation only.
Requests go through :class:`~arag.llm.openai_chat.OpenAICompatLLM` (llama-cpp-python's server is
OpenAI-compatible). Token counts come from the model's vocabulary loaded in this process (no weights,
no compute kernels), so context budgets stay exact without a round trip. A process that dies under a
request costs that request a :class:`~arag.errors.ModelUnavailable` (503); the next one waits for
the restart.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from arag.errors import AragError, ModelError, ModelUnavailable, NetworkError
from arag.llm.base import ChatMessage, Completion, NextToken
from arag.llm.builds import Build
from arag.llm.openai_chat import OpenAICompatLLM
from arag.llm.process import ModelProcess, ProcessInfo
from arag.settings import LLMSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
# Penalties off: they change greedy output depending on what came before (the server's default
# repeat penalty is 1.1, llama.cpp's in-process one 1.0).
_SAMPLING = {"repeat_penalty": 1.0}


class VocabTokenizer:
    """The model's tokenizer alone (``vocab_only``: no weights are read, nothing is computed)."""

    def __init__(self, model_path: Path) -> None:
        from arag.llm.llama_cpp import import_llama_cpp, quiet_vocab_load

        llama_cpp = import_llama_cpp()
        try:
            with quiet_vocab_load(llama_cpp):
                self._llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelError(
                f"llama.cpp could not read the model's vocabulary: {exc}",
                where=str(model_path),
                fix="check the file is a complete GGUF model; delete it to have it assembled again",
            ) from exc

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))


class LocalLLM:
    """A local GGUF chat model in supervised processes (see the module's docstring)."""

    def __init__(
        self,
        model_path: Path,
        settings: LLMSettings,
        *,
        name: str,
        log_dir: Path,
        tokenizer: Callable[[str], int] | None = None,
        command: list[str] | None = None,
        build: Build | None = None,
    ) -> None:
        """``build``: the llama.cpp build the processes run (None: the portable one);
        ``tokenizer`` and ``command`` replace the vocabulary and the child program (tests)."""
        self.name = name
        self.context_tokens = settings.context_tokens
        self.model_path = model_path
        self._settings = settings
        n = max(1, settings.processes)
        # The cores are shared out, never oversubscribed (ggml slows 10-40x past the core count).
        threads = max(1, settings.threads // n)
        self.processes = [
            ModelProcess(
                model_path,
                alias=name,
                threads=threads,
                context_tokens=settings.context_tokens,
                seed=settings.seed,
                gpu_layers=settings.gpu_layers,
                log_dir=log_dir,
                start_timeout_s=settings.start_timeout_s,
                command=command,
                build=build,
            )
            for _ in range(n)
        ]
        self._free: queue.Queue[int] = queue.Queue()
        self._clients: dict[tuple[int, str], OpenAICompatLLM] = {}
        self._clients_lock = threading.Lock()
        try:
            self._count = tokenizer or VocabTokenizer(model_path).count
            for i, proc in enumerate(self.processes):
                proc.start()
                self._free.put(i)
        except BaseException:
            self.close()
            raise

    # -- plumbing ---------------------------------------------------------------------------------

    def _client(self, index: int, base_url: str) -> OpenAICompatLLM:
        """One HTTP client per process and port (a restart picks a new port)."""
        with self._clients_lock:
            key = (index, base_url)
            client = self._clients.get(key)
            if client is None:
                for old in [k for k in self._clients if k[0] == index]:
                    self._clients.pop(old).close()
                cfg = self._settings.model_copy(
                    update={"base_url": base_url, "model": self.name, "retries": 0, "api_key_env": ""}
                )
                client = OpenAICompatLLM(cfg, schema_format="llama-cpp", extra_body=_SAMPLING)
                self._clients[key] = client
            return client

    def _acquire(self) -> int:
        try:
            return self._free.get(timeout=self._settings.queue_timeout_s)
        except queue.Empty:
            raise ModelUnavailable(
                f"every local LLM process stayed busy for {self._settings.queue_timeout_s:.0f} s",
                where=self.name,
                fix="retry later, or raise ARAG_LLM__QUEUE_TIMEOUT_S / ARAG_LLM__PROCESSES",
            ) from None

    def _translate(self, proc: ModelProcess, generation: int, exc: AragError) -> AragError:
        """A broken request: the process's death when that is what broke it, else the error itself."""
        # Only a broken connection can mean a dead process: an HTTP error came from a live one.
        if not isinstance(exc, NetworkError):
            return exc
        cause = proc.died_since(generation)
        if cause is None:
            return exc
        return ModelUnavailable(
            f"the local LLM process died during this request ({cause}); arag is restarting it",
            where=f"{self.name} (log: {proc.log_path})",
            fix="ask again in a few seconds",
        )

    def _call(self, fn: Callable[[OpenAICompatLLM], T]) -> T:
        index = self._acquire()
        proc = self.processes[index]
        try:
            base_url, generation = proc.url()
            try:
                return fn(self._client(index, base_url))
            except AragError as exc:
                raise self._translate(proc, generation, exc) from exc
        finally:
            self._free.put(index)

    # -- the LLM protocol -------------------------------------------------------------------------

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        return self._call(
            lambda c: c.complete(messages, max_tokens=max_tokens, stop=stop, json_schema=json_schema)
        )

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
    ) -> Iterator[str]:
        # The process stays taken until the stream ends or its consumer closes it (a cancelled run).
        index = self._acquire()
        proc = self.processes[index]
        try:
            base_url, generation = proc.url()
            pieces = self._client(index, base_url).stream(messages, max_tokens=max_tokens, stop=stop)
            assert isinstance(pieces, Generator)
            try:
                yield from pieces
            except AragError as exc:
                raise self._translate(proc, generation, exc) from exc
            finally:
                pieces.close()
        finally:
            self._free.put(index)

    def next_token(
        self, messages: Sequence[ChatMessage], reply_prefix: str, continuations: Sequence[str]
    ) -> NextToken | None:
        """The model's next-token probabilities after ``messages`` and the start of a reply (the
        process's ``/arag/next-token``; its KV cache makes this cheap right after a generation).
        None when the process cannot score this prompt (no chat template, over the context)."""
        body = {
            "messages": [m.model_dump() for m in messages],
            "reply_prefix": reply_prefix,
            "continuations": list(continuations),
        }
        try:
            data = self._call(lambda c: c.post_json("/arag/next-token", body))
        except ModelUnavailable:
            raise
        except ModelError as exc:
            log.warning("the model process could not score the next token: %s", exc)
            return None
        return NextToken.model_validate(data)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the model's own tokenizer."""
        return self._count(text)

    # -- supervision ------------------------------------------------------------------------------

    def info(self) -> list[ProcessInfo]:
        """Each model process: pid, state, restarts, last exit, build flags."""
        return [p.info() for p in self.processes]

    def close(self) -> None:
        """Stop the model processes and close the HTTP clients."""
        for proc in self.processes:
            proc.stop()
        with self._clients_lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
