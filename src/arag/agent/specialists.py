"""The answer specialists: after the verifier, the trained reader (:mod:`arag.models.reader`) reads
the context passages and may change the short answer, by the question's type:

- a span question answered by the LLM gets the reader's best span, copied from its passage, when
  the reader is confident enough (the official metric is token F1 against annotators' spans); so
  does a free-form question, by its own threshold (QASPER's annotators answer many "what is"
  questions with a span);
- a yes/no question answered by the LLM gets the reader's yes or no when its margin is large;
- an abstention becomes an answer when the reader finds a span it is confident of: the sentence
  holding it, cited, is the claim, checked by the support scorer like any other;
- an answer becomes an abstention when no passage holds an answer by the reader's reckoning, or
  when the best passage's rerank score is low (a calibrated abstention from the retrieval signal).

Each rule has a threshold fit on QASPER train papers held out of the reader's training (``arag
train answers --calibrate``); a rule whose best threshold does not beat leaving the answer as it is
stays off (its threshold is ``inf`` or, for abstaining, ``-inf``). :func:`decide` is pure; the same
function scores the rules offline."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from arag.agent import prompts
from arag.agent.answer_type import normalize_short_answer, strip_lead
from arag.agent.deps import AgentDeps
from arag.agent.state import AgentState, ContextPassage, Step
from arag.agent.synthesizer import with_marker
from arag.agent.terms import as_answered, sentences
from arag.models.reader import NO, SPAN, YES, Reading
from arag.records import Answer, AnswerType, Citation

Action = Literal["keep", "span", "yes_no", "answer", "abstain"]


@dataclass(frozen=True)
class Thresholds:
    """When each rule acts (see the module doc); the defaults leave every answer as it is."""

    span: float = math.inf
    free: float = math.inf
    yes_no: float = math.inf
    answer: float = math.inf
    abstain: float = -math.inf
    # An answer whose best passage's rerank score is below this abstains.
    evidence: float = -math.inf

    @classmethod
    def of(cls, values: Mapping[str, float]) -> Thresholds:
        return cls(**{k: float(v) for k, v in values.items() if k in cls.__dataclass_fields__})

    def active(self) -> bool:
        """Whether any rule can change an answer."""
        return self != Thresholds()


def uses_reader(deps: AgentDeps) -> bool:
    """Whether the specialists have anything to do: a reader with at least one rule on (a reader
    whose thresholds were never fit leaves every answer as it is, so it is not run)."""
    return deps.reader is not None and Thresholds.of(deps.reader.thresholds).active()


@dataclass(frozen=True)
class Summary:
    """The readings of a question's passages in a few numbers: the most likely answering passage's
    probability, the best span (its passage index and confidence), and the yes/no vote."""

    p_answer: float
    span: str
    span_index: int
    span_conf: float
    yes_no: str | None
    yes_no_margin: float
    evidence: float = 0.0


def summarize(readings: Sequence[Reading], scores: Sequence[float] = ()) -> Summary:
    """The readings' summary, with the best of the passages' retrieval ``scores`` (a pure function)."""
    evidence = max(scores) if scores else 0.0
    if not readings:
        return Summary(0.0, "", -1, 0.0, None, 0.0, evidence)
    p_answer = max(r.p_answer for r in readings)
    confs = [r.probs[SPAN] * r.span_prob if r.span.strip() else 0.0 for r in readings]
    k = max(range(len(readings)), key=lambda i: confs[i])
    yes = sum(r.probs[YES] for r in readings)
    no = sum(r.probs[NO] for r in readings)
    mass = yes + no
    margin = abs(yes - no) / mass if mass > 0 else 0.0
    # The vote counts only when some passage is mostly about yes or no.
    strongest = max(r.probs[YES] + r.probs[NO] for r in readings)
    yes_no = ("Yes" if yes >= no else "No") if mass > 0 else None
    # The span as a short answer: without BIBREF-style stand-ins or a trailing stop.
    span = normalize_short_answer(readings[k].span, "span") if readings[k].span.strip() else ""
    if span == prompts.NOT_IN_LIBRARY:
        span = ""
    return Summary(p_answer, span, k, confs[k], yes_no, margin * strongest, evidence)


def decide(answer_type: AnswerType | None, abstained: bool, s: Summary, th: Thresholds) -> tuple[Action, str]:
    """What to do with an answer and the new short answer ("" when kept or abstaining)."""
    if abstained:
        if answer_type == "span" and s.span and s.span_conf >= th.answer:
            return "answer", s.span
        return "keep", ""
    if s.p_answer < th.abstain or s.evidence < th.evidence:
        return "abstain", ""
    if answer_type == "span" and s.span and s.span_conf >= th.span:
        return "span", s.span
    if answer_type == "free_form" and s.span and s.span_conf >= th.free:
        return "span", s.span
    if answer_type == "yes_no" and s.yes_no is not None and s.yes_no_margin >= th.yes_no:
        return "yes_no", s.yes_no
    return "keep", ""


def span_sentence(passage: str, start: int, end: int) -> str:
    """The sentence of ``passage`` that holds characters [start, end) (the passage when none does)."""
    pos = 0
    for s in sentences(passage):
        i = passage.find(s, pos)
        if i < 0:
            continue
        pos = i + len(s)
        if i <= start < i + len(s):
            return s
    return passage[max(0, start - 200) : end + 200]


def make_specialists(deps: AgentDeps):
    """The specialists node (a no-op without a reader, or for literature and non-research answers)."""
    reader = deps.reader
    scorer = deps.support
    thresholds = Thresholds.of(reader.thresholds) if reader is not None else Thresholds()

    def specialists(state: AgentState) -> Step:
        answer: Answer = state["answer"]
        passages: list[ContextPassage] = list(state.get("context", []))
        if reader is None or answer.route != "research" or answer.form != "answer" or not passages:
            return Step({}, "not a one-paper answer", {})
        readings = reader.read(strip_lead(answer.question), [p.chunk.text for p in passages])
        s = summarize(readings, [p.score for p in passages])
        action, short = decide(answer.answer_type, answer.abstained, s, thresholds)
        counts = {"p_answer": round(s.p_answer, 3), "span_conf": round(s.span_conf, 3)}
        if action == "keep":
            return Step({}, f"kept (answer p={s.p_answer:.2f}, span {s.span_conf:.2f})", counts)
        if action in ("span", "yes_no"):
            new = answer.model_copy(update={"short_answer": short})
            return Step({"answer": new}, f"{action}: {answer.short_answer!r} -> {short!r}", counts)
        if action == "abstain":
            new = answer.model_copy(
                update={"short_answer": prompts.NOT_IN_LIBRARY, "abstained": True, "mode": "abstain"}
            )
            return Step({"answer": new}, f"abstain: answer p={s.p_answer:.2f}", counts)
        p = passages[s.span_index]
        r = readings[s.span_index]
        claim = " ".join(span_sentence(p.chunk.text, r.start, r.end).split())
        support_score = scorer.score(claim, p.full_text)
        if support_score < scorer.threshold:
            return Step(
                {}, f"kept abstention: the span's sentence is unsupported ({support_score:.2f})", counts
            )
        citation = Citation(
            n=p.n,
            chunk_id=p.chunk.id,
            paper_id=p.chunk.paper_id,
            title=p.chunk.title,
            section=p.chunk.section,
            support=round(support_score, 4),
            supported=True,
        )
        new = answer.model_copy(
            update={
                "short_answer": short,
                "text": with_marker(as_answered(claim), p.n),
                "citations": [citation],
                "abstained": False,
                "mode": "extractive",
            }
        )
        return Step({"answer": new}, f"answered from the reader: {short!r} [{p.n}]", counts)

    return specialists
