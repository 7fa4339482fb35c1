"""What a local model would write next: the probability of given continuations' first tokens after a
chat prompt and the start of a reply (the model process's ``POST /arag/next-token``).

llama-cpp-python returns token probabilities only from a model that keeps the logits of every
prompt token (``logits_all``: slower prefill, n_ctx x vocabulary floats). The model process keeps
them off, so this reads the one row of logits llama.cpp computes for the last token of a decode.
The prompt is the model's own chat template with the reply's start appended; the KV cache's common
prefix with the last request is kept, so scoring the start of a reply just generated costs a few
tokens, not a second prefill. Imported in the model process only (it needs llama_cpp and numpy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def chat_prompt(llama: Any, messages: Sequence[dict[str, str]]) -> str:
    """The text the chat endpoint feeds the model for ``messages`` (its generation prompt included),
    from the GGUF's own chat template."""
    from llama_cpp import llama_chat_format

    template = llama.metadata.get("tokenizer.chat_template")
    if not template:
        raise ValueError("the model has no chat template in its GGUF metadata")
    model = llama._model
    eos, bos = llama.token_eos(), llama.token_bos()
    formatter = llama_chat_format.Jinja2ChatFormatter(
        template=template,
        eos_token=model.token_get_text(eos) if eos != -1 else "",
        bos_token=model.token_get_text(bos) if bos != -1 else "",
    )
    chat: Any = list(messages)
    return str(formatter(messages=chat).prompt)


def _eval_keeping_prefix(llama: Any, tokens: list[int]) -> None:
    """Decode ``tokens`` reusing the KV cache's common prefix with what was decoded before; the last
    token is always decoded again, so its logits are the ones llama.cpp holds afterwards."""
    keep = 0
    for a, b in zip(llama.input_ids[: llama.n_tokens], tokens, strict=False):
        if a != b:
            break
        keep += 1
    keep = min(keep, len(tokens) - 1)
    llama.n_tokens = keep
    llama.eval(tokens[keep:])


def softmax_row(logits: Any) -> Any:
    """Probabilities from one row of logits (numerically stable)."""
    import numpy as np

    row = np.asarray(logits, dtype=np.float64)
    row = np.exp(row - row.max())
    return row / row.sum()


def next_token(
    llama: Any,
    messages: Sequence[dict[str, str]],
    reply_prefix: str,
    continuations: Sequence[str],
    *,
    top: int = 5,
) -> dict[str, Any]:
    """``{"probs": {continuation: p of its first token}, "top": [[token, p], ...], "entropy": nats}``
    for the token after ``messages`` and the reply's start ``reply_prefix``."""
    import numpy as np
    from llama_cpp import llama_cpp as lib

    prompt = chat_prompt(llama, messages) + reply_prefix
    tokens = list(llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True))
    if not tokens:
        raise ValueError("the prompt is empty")
    if len(tokens) >= llama.n_ctx():
        raise ValueError(f"the prompt has {len(tokens)} tokens, over the context of {llama.n_ctx()}")
    _eval_keeping_prefix(llama, tokens)
    n_vocab = llama.n_vocab()
    pointer = lib.llama_get_logits_ith(llama.ctx, -1)
    probs = softmax_row(np.ctypeslib.as_array(pointer, shape=(n_vocab,)))
    out: dict[str, float] = {}
    for text in continuations:
        # The continuation's first token as it would follow the prefix (" not" after "answer:").
        ids = llama.tokenize((reply_prefix + text).encode("utf-8"), add_bos=False, special=False)
        base = llama.tokenize(reply_prefix.encode("utf-8"), add_bos=False, special=False)
        first = ids[len(base)] if len(ids) > len(base) and ids[: len(base)] == base else None
        out[text] = float(probs[first]) if first is not None else 0.0
    order = np.argsort(-probs)[:top]
    best = [[llama.detokenize([int(i)]).decode("utf-8", "replace"), float(probs[int(i)])] for i in order]
    entropy = float(-(probs * np.log(np.clip(probs, 1e-30, None))).sum())
    return {"probs": out, "top": best, "entropy": entropy if math.isfinite(entropy) else 0.0}
