"""The answer reader: a MiniLM cross-encoder trained on QASPER (``arag train answers``) that reads a
(question, passage) pair and says what the passage holds for the question: nothing, an extractive
span (with its start and end), a yes, a no, or a free-form answer. The agent's answer specialists
(:mod:`arag.agent.specialists`) combine its readings of the kept passages into a short answer.

The span is copied from the passage's own characters (the official metric is token F1 against the
annotators' spans), so decoding maps word-piece positions back through the tokenizer's offsets."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from pydantic import Field

from arag.errors import ModelError
from arag.models.onnx_files import (
    CARD_FILE,
    MODEL_FILE,
    TrainedCard,
    open_session,
    read_model_card,
    replace_model_card,
)
from arag.settings import Settings

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

# The passage classes, in the order of the model's class logits.
CLASSES: tuple[str, ...] = ("none", "span", "yes", "no", "free")
NONE, SPAN, YES, NO, FREE = range(len(CLASSES))
RETRAIN = "arag train answers --force"
# Questions are cut to this many word-pieces, so the passage keeps its room.
MAX_QUESTION_TOKENS = 48
# A span longer than this many word-pieces is not a short answer.
MAX_SPAN_TOKENS = 30
WHERE = "ARAG_READER__PROVIDER=trained"
FIX = (
    "train it once with `arag train answers` (about 25 minutes on 2 cores; `make serve` does it on "
    "first run), or set ARAG_READER__PROVIDER=none to answer with the LLM alone"
)


class ReaderCard(TrainedCard):
    """What a trained reader is, how it was made, and its thresholds (fit on held-out QASPER train
    papers; the figures on validation are recorded for reading, never fit on)."""

    layers: int
    max_length: int
    # The specialists' thresholds (see arag.agent.specialists.Thresholds), fit on the held-out slice.
    thresholds: dict[str, float] = Field(default_factory=dict)
    held_out: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class Reading:
    """What the reader found in one passage: class probabilities (in ``CLASSES`` order), the best
    span's text, its character offsets in the passage and its probability within the passage."""

    probs: tuple[float, ...]
    span: str
    start: int
    end: int
    span_prob: float

    @property
    def p_answer(self) -> float:
        """The probability that the passage answers the question at all."""
        return 1.0 - self.probs[NONE]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def best_span(
    start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray, max_tokens: int = MAX_SPAN_TOKENS
) -> tuple[int, int, float]:
    """The (start, end) token pair, end inclusive, with start <= end < start + ``max_tokens``, both
    where ``allowed``, maximising start + end logit; and its probability under the two softmaxes over
    the allowed tokens. (-1, -1, 0.0) when no token is allowed."""
    idx = np.flatnonzero(allowed)
    if idx.size == 0:
        return -1, -1, 0.0
    s = np.where(allowed, start_logits, -np.inf)
    e = np.where(allowed, end_logits, -np.inf)
    ps, pe = softmax(s), softmax(e)
    n = len(s)
    # Score matrix over (start, end) restricted to the band end - start in [0, max_tokens).
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    band = (j >= i) & (j - i < max_tokens)
    total = np.where(band, s[:, None] + e[None, :], -np.inf)
    flat = int(np.argmax(total))
    a, b = divmod(flat, n)
    if not np.isfinite(total[a, b]):
        return -1, -1, 0.0
    return a, b, float(ps[a] * pe[b])


def passage_mask(enc: Encoding) -> np.ndarray:
    """True at the passage's word-pieces (second sequence, not special tokens)."""
    types = np.asarray(enc.type_ids)
    special = np.asarray(enc.special_tokens_mask)
    attn = np.asarray(enc.attention_mask)
    return (types == 1) & (special == 0) & (attn == 1)


def char_span(enc: Encoding, start: int, end: int) -> tuple[int, int]:
    """Character offsets in the passage of word-pieces ``start``..``end`` (inclusive)."""
    return enc.offsets[start][0], enc.offsets[end][1]


def load_card(folder: Path) -> ReaderCard:
    """The reader's model card; a ModelError saying what to do when absent or broken."""
    missing = ModelError(f"no trained answer reader in {folder}", where=WHERE, fix=FIX)
    return read_model_card(folder, ReaderCard, missing=missing, what="answer reader", retrain=RETRAIN)


replace_reader_card = replace_model_card


def load_reader_tokenizer(max_length: int) -> Tokenizer:
    """Word-pieces of a (question, passage) pair, the passage cut first (the question is short)."""
    from arag.models.onnx_minilm import load_tokenizer

    tok = load_tokenizer(max_length)
    tok.enable_truncation(max_length=max_length, strategy="only_second")
    return tok


def cut_question(tok: Tokenizer, question: str) -> str:
    """The question cut to ``MAX_QUESTION_TOKENS`` word-pieces."""
    q_ids = tok.encode(question, add_special_tokens=False).ids
    return tok.decode(q_ids[:MAX_QUESTION_TOKENS]) if len(q_ids) > MAX_QUESTION_TOKENS else question


def encode_reader_pairs(tok: Tokenizer, question: str, passages: Sequence[str]) -> list[Encoding]:
    """The encodings of (question, passage) pairs, padded to the longest."""
    question = cut_question(tok, question)
    return tok.encode_batch([(question, p) for p in passages])


def as_arrays(encs: Sequence[Encoding]) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.asarray([e.ids for e in encs], dtype=np.int64),
        "attention_mask": np.asarray([e.attention_mask for e in encs], dtype=np.int64),
        "token_type_ids": np.asarray([e.type_ids for e in encs], dtype=np.int64),
    }


def decode_readings(
    encs: Sequence[Encoding],
    passages: Sequence[str],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    class_logits: np.ndarray,
) -> list[Reading]:
    """One Reading per passage from the model's three outputs (a pure function)."""
    out = []
    probs = softmax(np.asarray(class_logits, dtype=np.float64))
    for k, (enc, passage) in enumerate(zip(encs, passages, strict=True)):
        a, b, p = best_span(start_logits[k], end_logits[k], passage_mask(enc))
        if a < 0:
            s, e, text = 0, 0, ""
        else:
            s, e = char_span(enc, a, b)
            text = passage[s:e]
        out.append(Reading(tuple(float(x) for x in probs[k]), text, s, e, p))
    return out


class Reader(Protocol):
    """What the answer specialists call: :class:`OnnxReader` (or a test fake). ``thresholds``: the
    specialists' thresholds fit for this model."""

    name: str
    thresholds: dict[str, float]

    def read(self, question: str, passages: Sequence[str]) -> list[Reading]: ...


class OnnxReader:
    """The trained reader on ONNX Runtime."""

    def __init__(
        self,
        folder: Path,
        *,
        threads: int = 2,
        card: ReaderCard | None = None,
        model_file: Path | None = None,
    ) -> None:
        self.card = card or load_card(folder)
        self._session = open_session(
            model_file or folder / MODEL_FILE,
            threads,
            sha256=None if card is not None else self.card.onnx_sha256,
            what="answer reader",
            retrain=RETRAIN,
        )
        self.name = f"reader:{self.card.model_id}"
        self.thresholds = dict(self.card.thresholds)
        self.max_length = self.card.max_length
        self._tok = load_reader_tokenizer(self.max_length)
        self._lock = threading.Lock()  # tokenizers' padding state is per object

    def read(self, question: str, passages: Sequence[str]) -> list[Reading]:
        """The reader's Reading of each passage for ``question``."""
        if not passages:
            return []
        with self._lock:
            encs = encode_reader_pairs(self._tok, question, passages)
        start, end, cls = self._session.run(None, as_arrays(encs))
        return decode_readings(encs, passages, start, end, cls)


def get_reader(settings: Settings) -> OnnxReader | None:
    """The reader the settings select; None when off, or (``auto``) when none is installed."""
    rs = settings.reader
    if rs.provider == "none":
        return None
    if rs.provider == "auto" and not (settings.reader_dir / CARD_FILE).is_file():
        return None
    return OnnxReader(settings.reader_dir, threads=rs.threads)
