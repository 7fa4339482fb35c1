"""Build the LLM the settings ask for."""

from __future__ import annotations

import logging

from arag.llm.base import LLM
from arag.llm.builds import PORTABLE, choose_build
from arag.llm.gguf import PACKAGED_MODELS, AssemblyProgress, resolve_model_path
from arag.settings import Settings

log = logging.getLogger(__name__)


def get_llm(settings: Settings, progress: AssemblyProgress | None = None) -> LLM | None:
    """The configured LLM, or None for the ``extractive`` provider (answers without an LLM).

    For ``llama-cpp`` a packaged model is assembled from its part packages first (once; later
    starts reuse the verified file); ``progress`` follows that assembly.
    """
    cfg = settings.llm
    if cfg.provider == "extractive":
        return None
    llm: LLM
    if cfg.provider == "openai":
        from arag.llm.openai_chat import OpenAICompatLLM

        llm = OpenAICompatLLM(cfg)
    else:
        from arag.llm.llama_cpp import import_llama_cpp
        from arag.llm.local import LocalLLM

        # Fail on a missing runtime before spending a minute assembling a model it cannot run.
        import_llama_cpp()
        path = resolve_model_path(cfg.model, settings.data_dir, progress)
        name = cfg.model if cfg.model in PACKAGED_MODELS else path.stem
        # The model runs in supervised processes of its own: a crash of llama.cpp costs the requests
        # in flight, never this process (see llm/process.py).
        build = choose_build(cfg.build)
        if build.why:
            log.info("llama.cpp: the %s build (%s)", build.name, build.why)
        llm = LocalLLM(path, cfg, name=name, log_dir=settings.logs_dir, build=build)
        # Another build's kernels round differently, and greedy decoding can then take another word
        # (about a third of 20 answers differed between the portable and AVX-512 builds): a cached
        # reply belongs to the build that wrote it.
        return with_cache(llm, settings, build=build.name)
    return with_cache(llm, settings)


def with_cache(llm: LLM, settings: Settings, *, build: str | None = None) -> LLM:
    """``llm`` behind the disk cache of LLM calls, when the settings keep one (``build``: the local
    model's llama.cpp build, part of the key)."""
    if not settings.llm.cache:
        return llm
    from arag.llm.cache import CachedLLM

    cfg = settings.llm
    params: dict[str, object] = {
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "context_tokens": cfg.context_tokens,
    }
    if build is not None and build != PORTABLE:
        # The portable build's keys stay as they were, so caches written before builds were chosen
        # still answer.
        params["build"] = build
    return CachedLLM(llm, settings.llm_cache_db, backend=cfg.provider, params=params)
