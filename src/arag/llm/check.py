"""``arag llm check``: one real generation on a long prompt, in the model's own process.

Set-up runs it right after installing (``make venv``): a llama.cpp build that uses an instruction the
CPU or its OS does not allow dies only on a long enough prompt (a few hundred tokens reach the
matrix kernels), so a short "hello" proves nothing. A crash ends the child, never the caller, and
the error names the signal, the build's instruction sets, the CPU's and the fix.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from pydantic import BaseModel

from arag.errors import ModelError
from arag.llm.builds import PORTABLE, Build, record_check
from arag.llm.process import ModelProcess, cpu_flags, start_fix
from arag.settings import LLMSettings

# Varied research prose (a repeated sentence would let the model answer from a pattern).
_TEXT = (
    "Retrieval-augmented generation conditions a language model on passages found by a retriever. "
    "Dense retrievers embed questions and passages in one vector space; sparse ones such as BM25 "
    "weigh exact term matches by their rarity. Reciprocal rank fusion combines ranked lists without "
    "calibrating their scores. A cross-encoder reads the question and a passage together and scores "
    "their relevance more accurately, at a higher cost per pair. Evaluations on QASPER ask questions "
    "about NLP papers whose answers are spans, yes or no, free-form text, or unanswerable. "
)


class CheckResult(BaseModel):
    """What one check measured (prefill is the time to the first token)."""

    model: str
    threads: int
    prompt_tokens: int
    load_s: float
    prefill_s: float
    prompt_tokens_per_s: float
    generated_tokens: int
    generate_s: float
    generated_tokens_per_s: float
    reply: str
    build: str
    build_name: str = PORTABLE
    cpu: str


class BuildCheck(BaseModel):
    """One build's check in ``arag llm check --build all``: its figures, or why it failed."""

    build_name: str
    result: CheckResult | None = None
    error: str | None = None


def _prompt(base_url: str, client: httpx.Client, target: int) -> tuple[str, int]:
    """A prompt of at least ``target`` tokens, counted by the model's own tokenizer."""
    root = base_url.removesuffix("/v1")
    text, n = "", 0
    while n < target:
        text += _TEXT
        resp = client.post(f"{root}/extras/tokenize/count", json={"input": text})
        resp.raise_for_status()
        n = int(resp.json()["count"])
    return text, n


def check_model(
    model_path: Path,
    settings: LLMSettings,
    *,
    name: str,
    log_dir: Path,
    prompt_tokens: int = 600,
    max_tokens: int = 48,
    command: list[str] | None = None,
    build: Build | None = None,
) -> CheckResult:
    """Start the model in its own process (with ``build``: None, the portable one), stream one reply
    to a prompt of ``prompt_tokens`` tokens, stop it. A :class:`ModelError` that names the cause when
    the process cannot start or dies."""
    proc = ModelProcess(
        model_path,
        alias=name,
        threads=settings.threads,
        context_tokens=max(settings.context_tokens, prompt_tokens + max_tokens + 64),
        seed=settings.seed,
        log_dir=log_dir,
        start_timeout_s=settings.start_timeout_s,
        max_backoff_s=0.0,
        command=command,
        build=build,
    )
    started = time.perf_counter()
    proc.start()
    load_s = time.perf_counter() - started
    try:
        base_url, generation = proc.url()
        with httpx.Client(timeout=httpx.Timeout(settings.timeout_s * 5, connect=10.0)) as client:
            try:
                text, n = _prompt(base_url, client, prompt_tokens)
                question = f"{text}\n\nIn one sentence: what does a cross-encoder do?"
                body = {
                    "model": name,
                    "messages": [{"role": "user", "content": question}],
                    "max_tokens": max_tokens,
                    "temperature": 0.0,
                    "seed": settings.seed,
                    "repeat_penalty": 1.0,
                    "stream": True,
                }
                pieces: list[str] = []
                first = done = 0.0
                t0 = time.perf_counter()
                with client.stream("POST", f"{base_url}/chat/completions", json=body) as resp:
                    resp.raise_for_status()
                    for line in resp.iter_lines():
                        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                            continue
                        piece = (json.loads(line[5:])["choices"][0].get("delta") or {}).get("content")
                        if piece:
                            if not pieces:
                                first = time.perf_counter()
                            pieces.append(piece)
                done = time.perf_counter()
            except httpx.HTTPError as exc:
                cause = proc.died_since(generation, grace_s=3.0)
                info = proc.info()
                if cause is None:
                    raise ModelError(
                        f"the model check failed: {type(exc).__name__}: {exc}",
                        where=f"{model_path} (log: {proc.log_path})",
                        fix="read the log; run `arag llm check` again",
                    ) from exc
                raise ModelError(
                    f"llama.cpp died on a {prompt_tokens}-token prompt: {cause}. "
                    f"The build uses: {info.build or 'unknown'}. The CPU lists: {cpu_flags()}",
                    where=f"{model_path} (log: {proc.log_path})",
                    fix=start_fix(cause),
                ) from exc
        if not pieces:
            raise ModelError(
                "the model answered a long prompt with nothing",
                where=f"{model_path} (log: {proc.log_path})",
                fix="delete the model file to have it assembled again, then rerun `arag llm check`",
            )
        prefill = first - t0
        generate = done - first
        gen_tokens = len(pieces)
        return CheckResult(
            model=name,
            threads=settings.threads,
            prompt_tokens=n,
            load_s=round(load_s, 2),
            prefill_s=round(prefill, 2),
            prompt_tokens_per_s=round(n / prefill, 1) if prefill > 0 else 0.0,
            generated_tokens=gen_tokens,
            generate_s=round(generate, 2),
            # The first token came with the prefill: the rate counts the ones after it.
            generated_tokens_per_s=round((gen_tokens - 1) / generate, 1) if generate > 0 else 0.0,
            reply="".join(pieces).strip(),
            build=proc.info().build,
            build_name=proc.llama_build.name,
            cpu=cpu_flags(),
        )
    finally:
        proc.stop()


def check_builds(
    model_path: Path,
    settings: LLMSettings,
    builds: list[Build],
    *,
    name: str,
    log_dir: Path,
    root: Path,
    flags: frozenset[str],
    prompt_tokens: int = 600,
    max_tokens: int = 48,
    command: list[str] | None = None,
    keep_going: bool = True,
) -> list[BuildCheck]:
    """:func:`check_model` with each build in turn (the portable one first), in the same run, so
    their speeds compare. A build other than the portable one is stamped as checked on this CPU when
    it passes, and unstamped when it fails (``auto`` then keeps to the portable build); its failure
    is reported, not raised (``keep_going=False``: raised). The portable build's failure is raised:
    nothing would run."""
    out: list[BuildCheck] = []
    for build in builds:
        try:
            result = check_model(
                model_path,
                settings,
                name=name,
                log_dir=log_dir,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                command=command,
                build=build,
            )
        except ModelError as exc:
            if build.name == PORTABLE:
                raise
            record_check(root, build.name, flags, passed=False)
            if not keep_going:
                raise
            out.append(BuildCheck(build_name=build.name, error=str(exc)))
            continue
        if build.name != PORTABLE:
            record_check(root, build.name, flags, passed=True)
        out.append(BuildCheck(build_name=build.name, result=result))
    return out
