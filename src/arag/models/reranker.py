"""Cross-encoder rerankers behind one small protocol.

- ``trained``: the MiniLM cross-encoder that ``arag train reranker`` fine-tunes on QASPER train and
  exports to ONNX (no torch at query time). Its folder holds ``model.onnx`` and ``card.json``, the
  model card with the training data, steps, validation metrics and the calibrated bars.
- ``cross-encoder``: a sentence-transformers ``CrossEncoder`` by hub name or local path (needs the
  ``torch`` extra, and the weights on disk or a reachable hub).
- ``none``: the identity; the fused order stands (also the fake the fast tests use).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, Field

from arag.errors import ConfigError, ModelError
from arag.models.onnx_files import (
    MODEL_FILE,
    TrainedCard,
    open_session,
    read_model_card,
    replace_model_card,
)
from arag.records import Chunk
from arag.settings import Settings

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# The question is cut to this many word-pieces before the passage is: a pasted paragraph as the
# question must not leave the passage no room.
MAX_QUERY_TOKENS = 64


class Bars(BaseModel):
    """Rerank score thresholds: ``lower`` for candidates the fusion ranked high, ``upper`` for the rest."""

    lower: float
    upper: float


class ModelCard(TrainedCard):
    """What a trained reranker is, how it was made, and how well it did on its calibration questions
    (the held-out train papers' by default)."""

    layers: int
    max_length: int
    # Pairs are cut to this many word-pieces at query time (None: max_length, as trained).
    inference_max_length: int | None = None
    bars: Bars | None = None
    # The final score is model score + fusion_weight * -ln(fused rank): how much the hybrid
    # search's own ranking still counts after reranking (fit on the calibration questions; 0: none).
    fusion_weight: float = 0.0
    calibration: dict[str, Any] = Field(default_factory=dict)

    @property
    def reranker_name(self) -> str:
        return f"trained:{self.model_id}"

    def query_length(self, override: int | None = None) -> int:
        """Word-pieces per pair at query time: ``override`` (the settings'), else the card's."""
        return override or self.inference_max_length or self.max_length


replace_card = replace_model_card


def pair_text(chunk: Chunk) -> str:
    """What the cross-encoder reads of a chunk: its section and text. The title is left out: the
    candidates of a resolved question share one paper, so its title would only cost word-pieces."""
    return f"{chunk.section}: {chunk.text}" if chunk.section else chunk.text


@runtime_checkable
class Reranker(Protocol):
    """Scores (question, passage) pairs; higher is more relevant. Scores of one model compare across
    questions (the bars rely on it), not across models."""

    name: str
    bars: Bars | None
    fusion_weight: float

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """One float per passage."""
        ...


class IdentityReranker:
    """No reranking: scores that keep the given order (first is best)."""

    name = "none"
    bars: Bars | None = None
    fusion_weight = 0.0

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        return -np.arange(len(passages), dtype=np.float32)


def load_pair_tokenizer(max_length: int) -> Tokenizer:
    """MiniLM word-pieces for a (question, passage) pair: [CLS] q [SEP] p [SEP], cut to ``max_length``
    by trimming the longer side first, padded to the longest pair of a batch."""
    from arag.models.onnx_minilm import load_tokenizer

    tok = load_tokenizer(max_length)
    tok.enable_truncation(max_length=max_length, strategy="longest_first")
    return tok


def encode_pairs(
    tok: Tokenizer, query: str, passages: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """input_ids, attention_mask, token_type_ids (int64, padded) for one question and its passages."""
    q_ids = tok.encode(query, add_special_tokens=False).ids
    if len(q_ids) > MAX_QUERY_TOKENS:
        query = tok.decode(q_ids[:MAX_QUERY_TOKENS])
    encs = tok.encode_batch([(query, p) for p in passages])
    ids = np.asarray([e.ids for e in encs], dtype=np.int64)
    mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
    types = np.asarray([e.type_ids for e in encs], dtype=np.int64)
    return ids, mask, types


RETRAIN = "arag train reranker --force"


def read_card(folder: Path) -> ModelCard:
    """The model card of a trained reranker; a ModelError saying what to do when absent or broken."""
    missing = ModelError(
        f"no trained reranker in {folder}",
        where="ARAG_RERANK__PROVIDER=trained",
        fix="train it once with `arag train reranker` (about 35 minutes on 2 cores; `make serve` "
        "does it on first run), or set ARAG_RERANK__PROVIDER=none to search without reranking",
    )
    return read_model_card(folder, ModelCard, missing=missing, what="reranker", retrain=RETRAIN)


class OnnxReranker:
    """The trained cross-encoder on ONNX Runtime (2 threads by default)."""

    def __init__(
        self,
        folder: Path,
        *,
        threads: int = 2,
        max_length: int | None = None,
        card: ModelCard | None = None,
        model_file: Path | None = None,
    ) -> None:
        """Load ``folder``'s model and card; training passes a ``card`` and ``model_file`` directly
        to score candidates before anything is installed."""
        self.card = card or read_card(folder)
        self._session = open_session(
            model_file or folder / MODEL_FILE,
            threads,
            sha256=None if card is not None else self.card.onnx_sha256,
            what="reranker",
            retrain=RETRAIN,
        )
        self.name = self.card.reranker_name
        self.bars: Bars | None = self.card.bars
        self.fusion_weight = self.card.fusion_weight
        self.max_length = self.card.query_length(max_length)
        self._tok = load_pair_tokenizer(self.max_length)
        self._lock = threading.Lock()  # tokenizers' padding state is per object
        self._inputs = {i.name for i in self._session.get_inputs()}

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        if not passages:
            return np.zeros(0, dtype=np.float32)
        with self._lock:
            ids, mask, types = encode_pairs(self._tok, query, passages)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        out = self._session.run(None, {k: v for k, v in feeds.items() if k in self._inputs})[0]
        return np.asarray(out, dtype=np.float32).reshape(-1)


class HubCrossEncoder:
    """A sentence-transformers CrossEncoder (e.g. ``cross-encoder/ms-marco-MiniLM-L-6-v2``)."""

    def __init__(self, model: str, *, threads: int = 2, max_length: int | None = None) -> None:
        try:
            import torch
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise ModelError(
                "sentence-transformers is not installed",
                where="ARAG_RERANK__PROVIDER=cross-encoder",
                fix="pip install -e '.[torch]' (with torch==2.13.0 first), or use the trained reranker",
            ) from exc
        torch.set_num_threads(threads)
        try:
            self._model = CrossEncoder(model, device="cpu", max_length=max_length)
        except Exception as exc:
            raise ModelError(
                f"could not load the cross-encoder {model!r}: {exc}",
                where="ARAG_RERANK__MODEL",
                fix="give a local path or a hub name whose weights are on disk (this machine has no hub "
                "access), or use ARAG_RERANK__PROVIDER=trained",
            ) from exc
        self.name = f"cross-encoder:{model}"
        self.bars: Bars | None = None
        self.fusion_weight = 0.0
        self.max_length = max_length

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        if not passages:
            return np.zeros(0, dtype=np.float32)
        scores = self._model.predict([(query, p) for p in passages], show_progress_bar=False)
        return np.asarray(scores, dtype=np.float32).reshape(-1)


def get_reranker(settings: Settings) -> Reranker:
    """The reranker the settings select; bars given in the settings replace the model's own."""
    rs = settings.rerank
    reranker: Reranker
    if rs.provider == "none":
        reranker = IdentityReranker()
    elif rs.provider == "trained":
        reranker = OnnxReranker(settings.reranker_dir, threads=rs.threads, max_length=rs.max_length)
    elif rs.provider == "cross-encoder":
        reranker = HubCrossEncoder(rs.model, threads=rs.threads, max_length=rs.max_length)
    else:  # pragma: no cover - pydantic rejects other values
        raise ConfigError(f"unknown reranker {rs.provider!r}", where="ARAG_RERANK__PROVIDER", fix="")
    reranker.fusion_weight, reranker.bars = _calibration(settings, reranker.fusion_weight, reranker.bars)
    return reranker


def _calibration(settings: Settings, fusion_weight: float, bars: Bars | None) -> tuple[float, Bars | None]:
    """The fusion weight and bars in use: the settings' where given, else the model's."""
    rs = settings.rerank
    if rs.fusion_weight is not None:
        fusion_weight = rs.fusion_weight
    if rs.lower_bar is not None or rs.upper_bar is not None:
        lower = rs.lower_bar if rs.lower_bar is not None else (bars.lower if bars else None)
        upper = rs.upper_bar if rs.upper_bar is not None else (bars.upper if bars else None)
        if lower is None or upper is None:
            raise ConfigError(
                "only one rerank bar is set and the model has none to complete it",
                where="ARAG_RERANK__LOWER_BAR / ARAG_RERANK__UPPER_BAR",
                fix="set both bars",
            )
        bars = Bars(lower=lower, upper=upper)
    return fusion_weight, bars


def score_scale(name: str, max_length: int | None, fusion_weight: float, bars: Bars | None) -> str:
    """What a final rerank score means: the model, the length its pairs are cut to, the fusion weight
    and the bars. Anything fit on final scores (the calibrated abstention) holds on this scale only."""
    head = f"{name}@{max_length}" if max_length else name
    tail = f", bars {bars.lower:g} / {bars.upper:g}" if bars is not None else ""
    return f"{head}, fusion weight {fusion_weight:g}{tail}"


def reranker_scale(reranker: Reranker) -> str:
    """:func:`score_scale` of a loaded reranker."""
    length = getattr(reranker, "max_length", None)
    return score_scale(reranker.name, length, reranker.fusion_weight, reranker.bars)


def settings_scale(settings: Settings) -> str:
    """:func:`score_scale` of the reranker the settings select, read from its card without loading
    the model (what :func:`get_reranker` would give)."""
    rs = settings.rerank
    if rs.provider == "trained":
        card = read_card(settings.reranker_dir)
        weight, bars = _calibration(settings, card.fusion_weight, card.bars)
        return score_scale(card.reranker_name, card.query_length(rs.max_length), weight, bars)
    if rs.provider == "cross-encoder":
        weight, bars = _calibration(settings, 0.0, None)
        return score_scale(f"cross-encoder:{rs.model}", rs.max_length, weight, bars)
    weight, bars = _calibration(settings, IdentityReranker.fusion_weight, IdentityReranker.bars)
    return score_scale(IdentityReranker.name, None, weight, bars)
