"""Does a passage support a claim? The verifier's scorer protocol and its implementations.

- ``CrossEncoderSupport`` (the offline default): the cross-encoder ``arag train support`` fine-tunes on
  QASPER train (premise: an evidence chunk; hypothesis: question + gold answer), on ONNX Runtime.
- ``LexicalSupport`` is a baseline: the share of the claim's content words found in the passage. It
  catches invented details (names, numbers, terms the passage never mentions) but not a claim that
  rearranges the passage's own words into something false.
- ``LLMJudgeSupport`` asks the LLM, for capable hosted models.
- ``HubNLISupport``: a sentence-transformers NLI cross-encoder by name (a DeBERTa-v3 NLI model, say);
  the score is its entailment probability. No NLI model ships on PyPI: its weights must be on disk.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from arag.agent import prompts
from arag.agent.terms import key_terms, strip_citations
from arag.errors import AragError, ModelError, ModelUnavailable
from arag.llm.base import LLM, ChatMessage
from arag.models.onnx_files import CARD_FILE, MODEL_FILE
from arag.models.reranker import OnnxReranker
from arag.text import strip_placeholders, tokenize

log = logging.getLogger(__name__)


@runtime_checkable
class SupportScorer(Protocol):
    """Scores how well ``passage`` supports ``claim``, in [0, 1]; ``threshold`` is where support begins."""

    name: str
    threshold: float

    def score(self, claim: str, passage: str) -> float: ...


class LexicalSupport:
    """Content-word overlap: the share of the claim's key terms (stemmed) that the passage holds.

    Numbers must match exactly (a claim's "84.2" against a passage's "82.4" is no support), so each
    number the claim states but the passage lacks halves the score.
    """

    name = "lexical"

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold

    def score(self, claim: str, passage: str) -> float:
        terms = key_terms(strip_placeholders(strip_citations(claim)))
        if not terms:
            return 1.0  # nothing to check ("Yes.", connectives)
        have = set(tokenize(passage))
        share = sum(t in have for t in terms) / len(terms)
        numbers = [t for t in terms if re.fullmatch(r"\d+(?:\.\d+)?", t)]
        for num in numbers:
            if num not in have:
                share /= 2
        return round(share, 4)


class LLMJudgeSupport:
    """Asks the LLM whether the passage supports the claim (yes: 1.0, no: 0.0). A failed call scores
    0.5, which does not clear the default threshold 0.6: fail closed."""

    name = "llm-judge"

    def __init__(self, llm: LLM, threshold: float = 0.6) -> None:
        self.llm = llm
        self.threshold = threshold

    def score(self, claim: str, passage: str) -> float:
        messages = [
            ChatMessage(role="system", content=prompts.JUDGE_SYSTEM),
            ChatMessage(
                role="user",
                content=prompts.JUDGE_USER.format(passage=passage, claim=strip_citations(claim)),
            ),
        ]
        try:
            reply = self.llm.complete(messages, max_tokens=4).text
        except ModelUnavailable:
            raise
        except AragError as exc:
            log.warning("support judge failed: %s", exc)
            return 0.5
        word = re.match(r"\W*(\w+)", reply.lower())
        if word is None:
            return 0.5
        return 1.0 if word.group(1) in {"yes", "supported", "true"} else 0.0


def platt(logit: float, a: float, b: float) -> float:
    """sigmoid(a * logit + b): a cross-encoder's logit as a probability (Platt scaling)."""
    z = a * logit + b
    # The two branches keep exp() from overflowing for logits far from the threshold.
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class CrossEncoderSupport:
    """The support cross-encoder ``arag train support`` installs (ONNX; no torch at query time).

    The score is the model's logit for (claim, passage), Platt-scaled on the QASPER validation pairs
    into a probability of support; the threshold is the one with the best validation F1. Both are
    in the model card's ``calibration``."""

    def __init__(self, folder: Path, *, threads: int = 2) -> None:
        if not (folder / MODEL_FILE).is_file() or not (folder / CARD_FILE).is_file():
            raise ModelError(
                f"no trained support model in {folder}",
                where="ARAG_AGENT__SUPPORT=trained (the offline default)",
                fix="train it once with `arag train support` (about as long as `arag train reranker`), "
                "or check claims lexically with ARAG_AGENT__SUPPORT=lexical",
            )
        try:
            self._model = OnnxReranker(folder, threads=threads)
            cal = self._model.card.calibration
            self.a, self.b = float(cal["platt_a"]), float(cal["platt_b"])
            self.threshold = float(cal["threshold"])
        except (ModelError, KeyError, TypeError, ValueError) as exc:
            raise ModelError(
                f"the support model in {folder} could not be loaded: "
                f"{exc.what if isinstance(exc, ModelError) else f'no calibration ({exc!r})'}",
                where=str(folder),
                fix="retrain it with `arag train support --force`",
            ) from exc
        self.name = f"trained:{self._model.card.model_id}"

    def score(self, claim: str, passage: str) -> float:
        logit = float(self._model.score(claim, [passage])[0])
        return platt(logit, self.a, self.b)


class CombinedSupport:
    """The trained cross-encoder and the lexical overlap together: a logistic regression over (lexical
    share, model logit, their product), fit on the calibration pairs (held-out train papers by default).
    Each alone misses what the other catches (a paraphrase the words miss; a wrong number or a name the
    2-layer model glosses over): two-fold AUC 0.861, against 0.811 lexical and 0.750 the model alone. The
    weights and the threshold (best two-fold F1) are in the model card's ``calibration.combined``."""

    def __init__(self, folder: Path, *, threads: int = 2) -> None:
        self._model = CrossEncoderSupport(folder, threads=threads)
        combined = self._model._model.card.calibration.get("combined")
        if not isinstance(combined, dict) or "coef" not in combined:
            raise ModelError(
                f"the support model in {folder} has no combined calibration",
                where="ARAG_AGENT__SUPPORT=combined",
                fix="fit it (a minute, the weights are untouched): arag train support --recalibrate",
            )
        self.coef = [float(c) for c in combined["coef"]]
        self.intercept = float(combined["intercept"])
        self.threshold = float(combined["threshold"])
        self._lexical = LexicalSupport()
        self.name = f"combined:{self._model._model.card.model_id}+lexical"

    def score(self, claim: str, passage: str) -> float:
        lex = self._lexical.score(claim, passage)
        logit = float(self._model._model.score(claim, [passage])[0])
        return combined_probability(lex, logit, self.coef, self.intercept)


def combined_probability(lexical: float, logit: float, coef: list[float], intercept: float) -> float:
    """sigmoid(c0 * lexical + c1 * logit + c2 * lexical * logit + intercept)."""
    z = coef[0] * lexical + coef[1] * logit + coef[2] * lexical * logit + intercept
    return platt(z, 1.0, 0.0)


def _load_cross_encoder(model: str, threads: int) -> Any:
    try:
        import torch
        from sentence_transformers import CrossEncoder
    except ImportError as exc:
        raise ModelError(
            "sentence-transformers is not installed",
            where="ARAG_AGENT__SUPPORT=nli",
            fix="pip install -e '.[torch]' (with torch==2.13.0 first), or use the trained support model",
        ) from exc
    torch.set_num_threads(threads)
    try:
        return CrossEncoder(model, device="cpu")
    except Exception as exc:
        raise ModelError(
            f"could not load the NLI cross-encoder {model!r}: {exc}",
            where="ARAG_AGENT__SUPPORT_MODEL",
            fix="give a local path or a hub name whose weights are on disk (no NLI model ships on PyPI), "
            "or use ARAG_AGENT__SUPPORT=trained",
        ) from exc


class HubNLISupport:
    """A sentence-transformers NLI cross-encoder (premise: the passage, hypothesis: the claim); the
    score is the entailment probability. ``encoder`` stands in for the loaded model in tests."""

    def __init__(self, model: str, threshold: float = 0.5, *, threads: int = 2, encoder: Any = None) -> None:
        self._model = encoder if encoder is not None else _load_cross_encoder(model, threads)
        labels = {int(k): str(v).lower() for k, v in self._model.config.id2label.items()}
        entail = [i for i, label in sorted(labels.items()) if label.startswith("entail")]
        if not entail:
            raise ModelError(
                f"{model!r} is not an NLI model: its labels are {sorted(labels.values())}",
                where="ARAG_AGENT__SUPPORT_MODEL",
                fix="name an NLI cross-encoder, e.g. cross-encoder/nli-deberta-v3-base",
            )
        self._entail = entail[0]
        self._width = len(labels)
        self._lock = threading.Lock()
        self.name = f"nli:{model}"
        self.threshold = threshold

    def score(self, claim: str, passage: str) -> float:
        with self._lock:
            probs = self._model.predict(
                [(passage, strip_citations(claim))], apply_softmax=True, show_progress_bar=False
            )
        return float(np.asarray(probs, dtype=np.float64).reshape(-1, self._width)[0, self._entail])
