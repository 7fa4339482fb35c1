"""llama-cpp-python, imported only where a local model is used: it is compiled from source at install
time, and everything else in arag works without it. The model itself runs in processes of its own
(llm/process.py, llm/model_server.py); this process loads only its vocabulary (llm/local.py)."""

from __future__ import annotations

import sys
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
