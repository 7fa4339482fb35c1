"""llama-cpp-python, imported only where a local model is used: it is compiled from source at install
time, and everything else in arag works without it. The model itself runs in processes of its own
(llm/process.py, llm/model_server.py); this process loads only its vocabulary (llm/local.py)."""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator
from typing import Any

from arag.errors import ModelError

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


# A vocabulary-only model has no training context (0), so llama.cpp 0.3.36 logs this at ERROR level,
# which llama-cpp-python prints even with verbose=False: every `arag ask` began with the line.
_SPURIOUS = b"> n_ctx_train (0) -- possible training context overflow"


@contextlib.contextmanager
def quiet_vocab_load(llama_cpp: Any) -> Iterator[None]:
    """Drop llama.cpp's one spurious message about a vocabulary-only model; pass every other one."""
    _logger = llama_cpp._logger

    @llama_cpp.llama_log_callback
    def _filter(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if _SPURIOUS not in text:
            _logger.llama_log_callback(level, text, user_data)

    llama_cpp.llama_log_set(_filter, ctypes.c_void_p(0))
    try:
        yield
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
