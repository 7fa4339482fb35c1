"""Any OpenAI-compatible chat endpoint (OpenAI, Groq, Ollama, vLLM, a llama.cpp server) over httpx.

``POST {base_url}/chat/completions`` with temperature and seed from the settings. 429 and 5xx
answers and dropped connections are retried with doubling backoff. A JSON schema is sent as a
``response_format``; a server that rejects it with 400 gets the request once more without it and
with the schema written into the prompt instead, and later requests skip it. The API key is read
from the environment variable the settings name (never stored in the settings themselves).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from arag.errors import ConfigError, ModelError, NetworkError
from arag.http_retry import RETRY_STATUS, backoff_delay
from arag.llm.base import ChatMessage, Completion
from arag.settings import LLMSettings

log = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
_JSON_INSTRUCTION = "Answer with only a JSON object, no other text, that matches this JSON schema:\n"


def estimate_tokens(text: str) -> int:
    """About four characters a token: the remote tokenizer is unknown (and tiktoken is not
    installed), and context budgets only need to be roughly right."""
    return math.ceil(len(text) / 4) if text else 0


def _error_message(resp: httpx.Response) -> str:
    """The server's own error text, from OpenAI's ``{"error": {"message": ...}}`` or the raw body."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text.strip()[:500] or resp.reason_phrase
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
    return json.dumps(data)[:500]


class OpenAICompatLLM:
    """A chat model behind an OpenAI-compatible HTTP API."""

    def __init__(
        self,
        settings: LLMSettings,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        schema_format: Literal["openai", "llama-cpp"] = "openai",
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        """``schema_format``: how a JSON schema is sent (OpenAI's ``json_schema`` response format, or
        llama-cpp-python's ``json_object`` with a ``schema``, which it compiles into a grammar);
        ``extra_body``: fields sent with every request (a server's own sampling options)."""
        base_url = (settings.base_url or OPENAI_BASE_URL).rstrip("/")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"LLM base URL {base_url!r} is not an http(s) URL",
                where="ARAG_LLM__BASE_URL",
                fix="use a URL like https://api.openai.com/v1 or http://localhost:11434/v1",
            )
        self.name = f"openai:{settings.model}"
        self.context_tokens = settings.context_tokens
        self.model = settings.model
        self.temperature = settings.temperature
        self.seed = settings.seed
        self.url = base_url + "/chat/completions"
        self.retries = max(settings.retries, 0)
        self.backoff_s = settings.backoff_s
        self.key_env = settings.api_key_env
        self._sleep = sleep
        self._schema_format = schema_format
        self._extra_body = dict(extra_body or {})
        # None until a server shows whether it takes response_format json_schema.
        self._schema_format_ok: bool | None = None
        # The key lives in the variable the user named (OPENAI_API_KEY, GROQ_API_KEY, ...).
        key = os.environ.get(settings.api_key_env, "").strip() if settings.api_key_env else ""
        if not key and parts.hostname == urlsplit(OPENAI_BASE_URL).hostname:
            raise ModelError(
                f"the OpenAI API needs a key, and ${settings.api_key_env or '<unset>'} is empty",
                where="ARAG_LLM__API_KEY_ENV",
                fix=f"export {settings.api_key_env or 'OPENAI_API_KEY'}=sk-..., "
                "or point ARAG_LLM__BASE_URL at a local server",
            )
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        timeout = httpx.Timeout(settings.timeout_s, connect=min(settings.timeout_s, 10.0))
        self._client = httpx.Client(timeout=timeout, headers=headers, transport=transport)

    # -- requests ---------------------------------------------------------------------------

    def _body(
        self,
        messages: Sequence[ChatMessage],
        max_tokens: int,
        stop: Sequence[str] | None,
        *,
        stream: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "temperature": self.temperature,
            "seed": self.seed,
            "max_tokens": max_tokens,
        }
        body.update(self._extra_body)
        if stop:
            body["stop"] = list(stop)
        if stream:
            body["stream"] = True
        return body

    def _send(self, body: dict[str, Any], *, stream: bool = False) -> httpx.Response:
        """POST with retries on 429/5xx and transport errors; returns the last answer (open when
        ``stream``: the caller closes it)."""
        attempts = self.retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                request = self._client.build_request("POST", self.url, json=body)
                resp = self._client.send(request, stream=stream)
            except httpx.TransportError as exc:
                if last:
                    raise NetworkError(
                        f"the LLM endpoint could not be reached after {attempts} attempts: "
                        f"{type(exc).__name__}: {exc}",
                        where=self.url,
                        fix="check that the server runs and ARAG_LLM__BASE_URL is right, or raise"
                        " ARAG_LLM__TIMEOUT_S",
                    ) from exc
                delay = backoff_delay(attempt, self.backoff_s)
                log.warning("LLM request failed (%s); retrying in %.1fs", exc, delay)
                self._sleep(delay)
                continue
            if resp.status_code in RETRY_STATUS and not last:
                retry_after = resp.headers.get("retry-after")
                resp.read()
                resp.close()
                delay = backoff_delay(attempt, self.backoff_s, retry_after)
                log.warning("LLM endpoint answered %d; retrying in %.1fs", resp.status_code, delay)
                self._sleep(delay)
                continue
            return resp
        raise AssertionError("unreachable")

    def _raise_for(self, resp: httpx.Response) -> None:
        """Turn a non-2xx answer into an arag error that says what to do."""
        if resp.is_success:
            return
        resp.read()
        status = resp.status_code
        message = _error_message(resp)
        what = f"the LLM endpoint answered {status}: {message}"
        if status in RETRY_STATUS:
            raise NetworkError(
                f"{what} (after {self.retries + 1} attempts)",
                where=self.url,
                fix="try again later, or use another endpoint or ARAG_LLM__PROVIDER=llama-cpp",
            )
        if status in (401, 403):
            raise ModelError(
                what,
                where=self.url,
                fix=f"set a valid API key in ${self.key_env} (ARAG_LLM__API_KEY_ENV names the variable)",
            )
        if status == 404:
            raise ModelError(
                what,
                where=self.url,
                fix="check ARAG_LLM__BASE_URL (it usually ends in /v1) "
                "and that ARAG_LLM__MODEL is served there",
            )
        raise ModelError(what, where=self.url, fix="check ARAG_LLM__MODEL and the request settings")

    def _parse(self, resp: httpx.Response) -> dict[str, Any]:
        try:
            data = resp.json()
            choice = data["choices"][0]
            choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ModelError(
                f"the LLM endpoint's answer is not a chat completion: {resp.text[:300]!r}",
                where=self.url,
                fix="check that ARAG_LLM__BASE_URL is an OpenAI-compatible API",
            ) from exc
        return data

    # -- the LLM protocol ---------------------------------------------------------------------

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        started = time.perf_counter()
        body = self._body(messages, max_tokens, stop)
        if json_schema is not None and self._schema_format_ok is not False:
            body["response_format"] = (
                {"type": "json_object", "schema": json_schema}
                if self._schema_format == "llama-cpp"
                else {"type": "json_schema", "json_schema": {"name": "reply", "schema": json_schema}}
            )
            resp = self._send(body)
            if resp.status_code == 500 and self._schema_format == "llama-cpp":
                # A schema feature llama.cpp's grammar converter lacks: any JSON object instead (the
                # caller validates), as llama-cpp-python's own fallback would.
                log.warning("the model server could not use the JSON schema (%s)", _error_message(resp))
                body["response_format"] = {"type": "json_object"}
                resp = self._send(body)
            elif resp.status_code == 400:
                log.warning(
                    "the LLM endpoint rejected response_format (%s); asking for JSON in the prompt",
                    _error_message(resp),
                )
                resp = self._send(self._body(_with_json_instruction(messages, json_schema), max_tokens, stop))
                if resp.is_success:
                    self._schema_format_ok = False
            elif resp.is_success:
                self._schema_format_ok = True
        elif json_schema is not None:
            resp = self._send(self._body(_with_json_instruction(messages, json_schema), max_tokens, stop))
        else:
            resp = self._send(body)
        self._raise_for(resp)
        data = self._parse(resp)
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        usage = data.get("usage") or {}
        return Completion(
            text=text,
            prompt_tokens=int(
                usage.get("prompt_tokens") or sum(estimate_tokens(m.content) for m in messages)
            ),
            completion_tokens=int(usage.get("completion_tokens") or estimate_tokens(text)),
            seconds=time.perf_counter() - started,
            finish_reason=choice.get("finish_reason") or "",
        )

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
    ) -> Iterator[str]:
        resp = self._send(self._body(messages, max_tokens, stop, stream=True), stream=True)
        try:
            self._raise_for(resp)
            yield from self._sse_pieces(resp)
        except httpx.TransportError as exc:
            raise NetworkError(
                f"the LLM stream broke off: {type(exc).__name__}: {exc}",
                where=self.url,
                fix="try again; raise ARAG_LLM__TIMEOUT_S if the server is slow",
            ) from exc
        finally:
            resp.close()

    def _sse_pieces(self, resp: httpx.Response) -> Iterator[str]:
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, ": keep-alive" comments, event: lines
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            try:
                event = json.loads(payload)
            except ValueError as exc:
                raise ModelError(
                    f"the LLM stream sent a line that is not JSON: {payload[:200]!r}",
                    where=self.url,
                ) from exc
            if isinstance(event, dict) and event.get("error"):
                err = event["error"]
                detail = err.get("message", err) if isinstance(err, dict) else err
                raise ModelError(
                    f"the LLM endpoint failed mid-stream: {detail}",
                    where=self.url,
                )
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    yield piece

    def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the server's root, not its ``/v1`` API (an extension of a
        server arag runs itself, such as a model process's ``/arag/next-token``); one attempt."""
        root = self.url.removesuffix("/chat/completions").removesuffix("/v1")
        try:
            resp = self._client.post(root + path, json=body)
        except httpx.TransportError as exc:
            raise NetworkError(
                f"the LLM server could not be reached: {type(exc).__name__}: {exc}",
                where=root + path,
                fix="check that the server runs",
            ) from exc
        if not resp.is_success:
            raise ModelError(
                f"the LLM server answered {resp.status_code}: {_error_message(resp)}",
                where=root + path,
                fix="check that the server is arag's own model process",
            )
        try:
            data = resp.json()
        except ValueError as exc:
            raise ModelError(
                f"{root + path} answered with no JSON: {resp.text[:200]!r}", where=root + path
            ) from exc
        if not isinstance(data, dict):
            raise ModelError(f"{root + path} answered {data!r}, not a JSON object", where=root + path)
        return data

    def count_tokens(self, text: str) -> int:
        """An estimate, about four characters a token (see :func:`estimate_tokens`)."""
        return estimate_tokens(text)

    def close(self) -> None:
        self._client.close()


def _with_json_instruction(messages: Sequence[ChatMessage], schema: dict[str, Any]) -> list[ChatMessage]:
    """The messages with the schema written into the last user turn (or a new one)."""
    note = _JSON_INSTRUCTION + json.dumps(schema, separators=(",", ":"))
    out = list(messages)
    if out and out[-1].role == "user":
        out[-1] = ChatMessage(role="user", content=f"{out[-1].content}\n\n{note}")
    else:
        out.append(ChatMessage(role="user", content=note))
    return out
