"""QASPER's official metrics: Answer-F1 and Evidence-F1 (Dasigi et al., NAACL 2021).

A re-implementation of the official evaluator (``scripts/evaluator.py`` of allenai/qasper-led-baseline,
also shipped as ``qasper_evaluator.py``), with identical semantics, including its edge cases:

- Answers are compared as SQuAD-normalised bags of tokens. An empty prediction, or one that normalises to
  nothing, scores 0.0 even against an empty reference (the official ``token_f1_score`` returns 0 whenever
  no token is shared).
- Each annotation becomes one reference: unanswerable -> ``"Unanswerable"`` with no evidence (type
  ``none``); otherwise the first non-empty of extractive spans (joined with ``", "``, type ``extractive``),
  free-form answer (``abstractive``), yes/no (``"Yes"``/``"No"``, ``boolean``).
- Evidence-F1 compares paragraphs as exact strings. Precision divides by the length of the predicted
  list (duplicates count), recall by the length of the reference list. Both empty -> 1.0.
- Answer-F1 and Evidence-F1 are each maximised over the annotations *independently*; the answer type
  reported is that of the first annotation reaching the best Answer-F1.
- "FLOAT SELECTED" evidence (figure/table captions) is kept by default, as the official script does
  unless run with ``--text_evidence_only``; ``text_evidence_only=True`` drops it.
- A question without a prediction counts 0.0 in both overall means, in no per-type mean, and in the
  ``missing_predictions`` count. Predictions for unknown questions are ignored.
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from arag.corpus.qasper_questions import FLOAT_MARKER
from arag.errors import InputError

logger = logging.getLogger(__name__)

AnswerType = Literal["extractive", "abstractive", "boolean", "none"]
ANSWER_TYPES: tuple[AnswerType, ...] = ("extractive", "abstractive", "boolean", "none")
UNANSWERABLE = "Unanswerable"

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


class Reference(BaseModel):
    """One annotation turned into what the evaluator compares against."""

    model_config = ConfigDict(frozen=True)

    answer: str
    evidence: list[str]
    type: AnswerType


class QuestionScore(BaseModel):
    """The scores of one predicted answer and evidence against all annotations of a question."""

    model_config = ConfigDict(frozen=True)

    answer_f1: float
    evidence_f1: float
    # Type of the first annotation that reached answer_f1 (the official script's tie-break).
    answer_type: AnswerType
    answer_annotation: int
    evidence_annotation: int


class QasperReport(BaseModel):
    """Aggregate QASPER scores over a set of questions, as the official evaluator reports them."""

    model_config = ConfigDict(frozen=True)

    answer_f1: float
    evidence_f1: float
    answer_f1_by_type: dict[AnswerType, float]
    questions_by_type: dict[AnswerType, int]
    num_questions: int
    missing_predictions: int
    missing_question_ids: list[str]
    scores: dict[str, QuestionScore]

    def official_dict(self) -> dict[str, Any]:
        """The report in the official script's output shape (same keys, same values)."""
        return {
            "Answer F1": self.answer_f1,
            "Answer F1 by type": {t: self.answer_f1_by_type[t] for t in ANSWER_TYPES},
            "Evidence F1": self.evidence_f1,
            "Missing predictions": self.missing_predictions,
        }


def normalize_answer(s: str) -> str:
    """Lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace (SQuAD v1.1)."""
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def token_f1_score(prediction: str, ground_truth: str) -> float:
    """Token-level F1 between two answers after normalisation; 0.0 when they share no token."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def paragraph_f1_score(prediction: Sequence[str], ground_truth: Sequence[str]) -> float:
    """Evidence F1 between predicted and reference paragraphs, compared as exact strings."""
    if not prediction and not ground_truth:
        # Nothing to find and nothing predicted: the official script counts this as perfect.
        return 1.0
    num_same = len(set(ground_truth) & set(prediction))
    if num_same == 0:
        return 0.0
    # The official script divides by list lengths, not set sizes: repeated predictions cost precision.
    precision = num_same / len(prediction)
    recall = num_same / len(ground_truth)
    return (2 * precision * recall) / (precision + recall)


def reference_from_annotation(
    annotation: Mapping[str, Any], *, text_evidence_only: bool = False, where: str | None = None
) -> Reference:
    """Turn one annotation (flat, or QASPER's ``{"answer": {...}}``) into the reference it is scored by."""
    inner = annotation.get("answer")
    info: Mapping[str, Any] = inner if isinstance(inner, Mapping) else annotation
    try:
        if info["unanswerable"]:
            return Reference(answer=UNANSWERABLE, evidence=[], type="none")
        spans = info["extractive_spans"]
        free_form = info["free_form_answer"]
        yes_no = info["yes_no"]
        raw_evidence = info["evidence"]
    except KeyError as exc:
        raise InputError(
            f"QASPER annotation lacks the field {exc.args[0]!r}",
            where=where,
            fix="give each annotation unanswerable, yes_no, free_form_answer, extractive_spans and evidence",
        ) from exc
    answer: str
    answer_type: AnswerType
    # The evaluator's precedence, which differs from the LED reader's (yes/no first); QASPER's
    # annotations never fill two of these at once, so the order only matters for malformed data.
    if spans:
        answer, answer_type = ", ".join(spans), "extractive"
    elif free_form:
        answer, answer_type = free_form, "abstractive"
    elif yes_no is not None:
        answer, answer_type = ("Yes" if yes_no else "No"), "boolean"
    else:
        raise InputError(
            "QASPER annotation has no answer (not unanswerable, no spans, no free-form text, no yes/no)",
            where=where,
            fix="drop the annotation or fix the benchmark file",
        )
    evidence = (
        [e for e in raw_evidence if FLOAT_MARKER not in e] if text_evidence_only else list(raw_evidence)
    )
    return Reference(answer=answer, evidence=evidence, type=answer_type)


def references_for_question(
    gold_answers: Sequence[Mapping[str, Any]], *, text_evidence_only: bool = False, where: str | None = None
) -> list[Reference]:
    """All references of a question, in annotation order."""
    if not gold_answers:
        raise InputError(
            "QASPER question has no annotations to score against",
            where=where,
            fix="drop the question or fix the benchmark file",
        )
    return [
        reference_from_annotation(a, text_evidence_only=text_evidence_only, where=where) for a in gold_answers
    ]


def score_references(
    predicted_answer: str, predicted_evidence: Sequence[str], references: Sequence[Reference]
) -> QuestionScore:
    """Score a prediction against prepared references (see ``score_question``)."""
    if not references:
        raise InputError("no references to score against", fix="pass at least one annotation")
    best_answer, best_answer_i = -1.0, 0
    best_evidence, best_evidence_i = -1.0, 0
    for i, ref in enumerate(references):
        answer_f1 = token_f1_score(predicted_answer, ref.answer)
        # Strictly greater: the first annotation wins ties, as the official stable sort does.
        if answer_f1 > best_answer:
            best_answer, best_answer_i = answer_f1, i
        evidence_f1 = paragraph_f1_score(predicted_evidence, ref.evidence)
        if evidence_f1 > best_evidence:
            best_evidence, best_evidence_i = evidence_f1, i
    return QuestionScore(
        answer_f1=best_answer,
        evidence_f1=best_evidence,
        answer_type=references[best_answer_i].type,
        answer_annotation=best_answer_i,
        evidence_annotation=best_evidence_i,
    )


def score_question(
    predicted_answer: str,
    predicted_evidence: Sequence[str],
    gold_answers: Sequence[Mapping[str, Any]],
    *,
    text_evidence_only: bool = False,
) -> QuestionScore:
    """Answer-F1 and Evidence-F1 of one prediction, each the max over the question's annotations."""
    refs = references_for_question(gold_answers, text_evidence_only=text_evidence_only)
    return score_references(predicted_answer, predicted_evidence, refs)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def evaluate(
    predictions: Mapping[str, tuple[str, Sequence[str]]],
    questions: Sequence[Mapping[str, Any]],
    *,
    text_evidence_only: bool = False,
) -> QasperReport:
    """Official QASPER scores of ``predictions`` (question id -> (answer, evidence)) over ``questions``.

    ``questions`` are benchmark items with ``question_id`` and ``answers``. Every question counts:
    one without a prediction scores 0.0 and is counted as missing.
    """
    answer_f1s: list[float] = []
    evidence_f1s: list[float] = []
    by_type: dict[AnswerType, list[float]] = {t: [] for t in ANSWER_TYPES}
    scores: dict[str, QuestionScore] = {}
    missing: list[str] = []
    seen: set[str] = set()
    for item in questions:
        try:
            qid = str(item["question_id"])
            gold_answers = item["answers"]
        except KeyError as exc:
            raise InputError(
                f"QASPER question lacks the field {exc.args[0]!r}",
                where=str(item.get("question_id", "?")),
                fix="give each question a question_id and a list of answers",
            ) from exc
        if qid in seen:
            raise InputError(
                f"QASPER question id {qid} appears twice", fix="deduplicate the questions before scoring"
            )
        seen.add(qid)
        refs = references_for_question(gold_answers, text_evidence_only=text_evidence_only, where=qid)
        if qid not in predictions:
            missing.append(qid)
            answer_f1s.append(0.0)
            evidence_f1s.append(0.0)
            continue
        answer, evidence = predictions[qid]
        score = score_references(answer, evidence, refs)
        scores[qid] = score
        answer_f1s.append(score.answer_f1)
        evidence_f1s.append(score.evidence_f1)
        by_type[score.answer_type].append(score.answer_f1)
    extra = len(set(predictions) - seen)
    if extra:
        logger.warning("ignored %d predictions for questions that are not in the gold set", extra)
    return QasperReport(
        answer_f1=_mean(answer_f1s),
        evidence_f1=_mean(evidence_f1s),
        answer_f1_by_type={t: _mean(v) for t, v in by_type.items()},
        questions_by_type={t: len(v) for t, v in by_type.items()},
        num_questions=len(answer_f1s),
        missing_predictions=len(missing),
        missing_question_ids=missing,
        scores=scores,
    )
