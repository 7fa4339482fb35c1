"""Training examples for the answer reader, from QASPER's annotations and the papers' paragraphs.

Each example is a (question, passage) pair with what the passage holds for the question
(:data:`arag.models.reader.CLASSES`) and, for an extractive answer found in it, the span's
character offsets. Positives are the annotators' evidence paragraphs; negatives are other
paragraphs of the same paper (one sharing the most question terms, one at random), and every
passage of an unanswerable question is a negative. A positive is sometimes joined with its
neighbouring paragraph, as the library's chunks often hold two. Pure functions, seeded."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arag.corpus.qasper_questions import FLOAT_MARKER
from arag.models.reader import FREE, NO, NONE, SPAN, YES
from arag.records import Paper
from arag.text import tokenize


@dataclass(frozen=True)
class ReaderExample:
    """One training pair; ``span`` is (start, end) character offsets in ``passage`` or None."""

    question: str
    passage: str
    label: int
    span: tuple[int, int] | None = None


def annotation_kind(annotation: Mapping[str, Any]) -> int:
    """The passage class an annotation's evidence gets."""
    if annotation.get("unanswerable"):
        return NONE
    if annotation.get("yes_no") is not None:
        return YES if annotation["yes_no"] else NO
    if any(s and s.strip() for s in annotation.get("extractive_spans") or []):
        return SPAN
    return FREE


def find_span(passage: str, spans: Iterable[str]) -> tuple[int, int] | None:
    """The first of ``spans`` found in ``passage`` (exactly, else ignoring case), as offsets."""
    lower = passage.lower()
    for span in spans:
        span = span.strip()
        if not span:
            continue
        i = passage.find(span)
        if i < 0:
            i = lower.find(span.lower())
        if i >= 0:
            return i, i + len(span)
    return None


def paragraphs_of(paper: Paper) -> list[str]:
    """The paper's paragraphs in reading order (abstract first)."""
    out = [paper.abstract] if paper.abstract else []
    out += [p for s in paper.sections for p in s.paragraphs]
    return out


def hard_negative(question: str, candidates: Sequence[str]) -> int | None:
    """The index of the candidate sharing the most question terms (ties: the first), or None."""
    q = set(tokenize(question))
    best, best_n = None, 0
    for i, text in enumerate(candidates):
        n = len(q.intersection(tokenize(text)))
        if n > best_n:
            best, best_n = i, n
    return best


def with_neighbour(
    paragraphs: Sequence[str], index: int, rng: random.Random, joined: float
) -> tuple[str, int]:
    """The paragraph at ``index``, with probability ``joined`` joined with the next or previous one;
    and the offset at which the paragraph's own text starts in the result."""
    text = paragraphs[index]
    if rng.random() >= joined or len(paragraphs) < 2:
        return text, 0
    if index + 1 < len(paragraphs) and (index == 0 or rng.random() < 0.5):
        return f"{text}\n{paragraphs[index + 1]}", 0
    prev = paragraphs[index - 1]
    return f"{prev}\n{text}", len(prev) + 1


def question_examples(
    item: Mapping[str, Any],
    paper: Paper,
    *,
    seed: int,
    negatives: int = 2,
    joined: float = 0.4,
) -> list[ReaderExample]:
    """The examples of one QASPER question record (see the module docstring)."""
    rng = random.Random(f"{seed}:{item['question_id']}")
    question = item["question"]
    paragraphs = paragraphs_of(paper)
    index = {p: i for i, p in enumerate(paragraphs)}
    labelled: dict[str, tuple[int, tuple[int, int] | None]] = {}
    evidence: set[str] = set()
    for ann in item.get("answers", []):
        kind = annotation_kind(ann)
        for text in ann.get("evidence") or []:
            if not text or text.startswith(FLOAT_MARKER):
                continue
            evidence.add(text)
            if kind == NONE:
                continue
            span = find_span(text, ann.get("extractive_spans") or []) if kind == SPAN else None
            old = labelled.get(text)
            # The first annotator decides a passage's class; a later one may add the span.
            if old is None or (old[0] == SPAN and old[1] is None and kind == SPAN and span is not None):
                labelled[text] = (kind, span)
    out: list[ReaderExample] = []
    for text, (kind, span) in labelled.items():
        passage, shift = text, 0
        if text in index:
            passage, shift = with_neighbour(paragraphs, index[text], rng, joined)
        if span is not None:
            span = (span[0] + shift, span[1] + shift)
        out.append(ReaderExample(question, passage, kind, span))
    others = [p for p in paragraphs if p not in evidence]
    if not others:
        return out
    # Unanswerable questions read more passages: every one they are shown must say "none".
    want = negatives + (1 if not labelled else 0)
    chosen: list[int] = []
    hard = hard_negative(question, others)
    if hard is not None:
        chosen.append(hard)
    rest = [i for i in range(len(others)) if i not in chosen]
    chosen += rng.sample(rest, min(len(rest), want - len(chosen)))
    out += [ReaderExample(question, others[i], NONE) for i in chosen]
    return out


def build_examples(
    items: Sequence[Mapping[str, Any]], papers: Mapping[str, Paper], *, seed: int, negatives: int = 2
) -> list[ReaderExample]:
    """All examples of the questions whose paper is in ``papers``."""
    out: list[ReaderExample] = []
    for item in items:
        paper = papers.get(item["paper_id"])
        if paper is not None:
            out += question_examples(item, paper, seed=seed, negatives=negatives)
    return out
