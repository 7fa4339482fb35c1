"""Fitting the answer specialists' thresholds (``arag train answers --calibrate TRACES``).

TRACES is what ``arag eval answers --traces`` wrote for questions of the held-out QASPER train papers
with the reader off: per question, the agent's answer, its official Answer-F1 and the passages it
kept. The reader reads those passages as the specialists node would; each threshold is then chosen,
one at a time and twice round, to maximise the mean official Answer-F1 of :func:`decide`'s outcome,
"off" included (a rule that does not beat the answers as they are stays off). Pure functions but
for :func:`load_cases`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from arag.agent.answer_type import strip_lead
from arag.agent.specialists import Summary, Thresholds, decide, summarize
from arag.corpus.qasper_questions import library_query
from arag.errors import InputError
from arag.eval.answers import AnswerQuestion, traced_answers
from arag.eval.qasper_metrics import UNANSWERABLE, Reference, references_for_question, score_references
from arag.index.store import Store
from arag.models.reader import Reader

# Candidate thresholds per rule: quantiles of the rule's confidence over the cases it acts on.
GRID = 25
# A rule must add this many right answers' worth of Answer-F1 over the fit questions to be turned on
# (the first fit, on 150 held-out questions without it, turned a span rule on for +0.002, five changed
# answers: on validation the same rule changed four answers and lost 0.004).
MIN_GAIN_ANSWERS = 1.0


@dataclass(frozen=True)
class Case:
    """One fit question: what the agent answered and what each specialist would answer instead."""

    question_id: str
    kind: str
    answer_type: str | None
    abstained: bool
    agent_f1: float
    summary: Summary
    refs: tuple[Reference, ...]

    def f1(self, short: str) -> float:
        return score_references(short, [], list(self.refs)).answer_f1


def outcome(case: Case, th: Thresholds) -> float:
    """The Answer-F1 of the case's answer after the specialists with ``th``."""
    action, short = decide(case.answer_type, case.abstained, case.summary, th)  # type: ignore[arg-type]
    if action == "keep":
        return case.agent_f1
    if action == "abstain":
        return case.f1(UNANSWERABLE)
    return case.f1(short)


def mean_f1(cases: Sequence[Case], th: Thresholds) -> float:
    return float(np.mean([outcome(c, th) for c in cases])) if cases else 0.0


# Each rule's confidence and the value that turns it off.
RULES: dict[str, tuple[Callable[[Summary], float], float]] = {
    "abstain": (lambda s: s.p_answer, -math.inf),
    "evidence": (lambda s: s.evidence, -math.inf),
    "answer": (lambda s: s.span_conf, math.inf),
    "span": (lambda s: s.span_conf, math.inf),
    "free": (lambda s: s.span_conf, math.inf),
    "yes_no": (lambda s: s.yes_no_margin, math.inf),
}


def candidates(cases: Sequence[Case], rule: str) -> list[float]:
    """The rule's off value and quantiles of its confidence (a threshold just above each)."""
    conf, off = RULES[rule]
    values = np.asarray([conf(c.summary) for c in cases], dtype=np.float64)
    if values.size == 0:
        return [off]
    qs = np.unique(np.round(np.quantile(values, np.linspace(0.0, 1.0, GRID)), 4))
    return [off, *[float(q) for q in qs]]


def fit_thresholds(cases: Sequence[Case], rounds: int = 2) -> tuple[Thresholds, dict[str, Any]]:
    """The thresholds with the best mean Answer-F1 (coordinate ascent from all rules off), and the
    figures: before (all off), after, and what each rule changed. A rule is turned on only when it
    adds at least one whole right answer's worth over the fit questions (MIN_GAIN_ANSWERS): a gain
    smaller than that is one lucky question, which does not carry over to other questions."""
    th = Thresholds()
    before = mean_f1(cases, th)
    need = MIN_GAIN_ANSWERS / max(1, len(cases))
    for _ in range(rounds):
        for rule in RULES:
            _, off = RULES[rule]
            base = mean_f1(cases, replace(th, **{rule: off}))
            best = (base, off)
            for v in candidates(cases, rule):
                f = mean_f1(cases, replace(th, **{rule: v}))
                if f > best[0] + 1e-9:
                    best = (f, v)
            th = replace(th, **{rule: best[1] if best[0] >= base + need else off})
    actions: dict[str, int] = {}
    for c in cases:
        a, _ = decide(c.answer_type, c.abstained, c.summary, th)  # type: ignore[arg-type]
        actions[a] = actions.get(a, 0) + 1
    figures = {
        "questions": len(cases),
        "answer_f1_before": round(before, 4),
        "answer_f1_after": round(mean_f1(cases, th), 4),
        "actions": actions,
    }
    return th, figures


def thresholds_dict(th: Thresholds) -> dict[str, float]:
    """The rules that are on and their thresholds (a rule left out is off: JSON has no infinity)."""
    return {k: getattr(th, k) for k in RULES if math.isfinite(getattr(th, k))}


def load_cases(
    traces: Path, questions: Sequence[AnswerQuestion], store: Store, reader: Reader, *, config: str = "full"
) -> list[Case]:
    """The fit cases: each traced one-paper answer of ``config`` with its kept passages read."""
    if not traces.is_file():
        raise InputError(
            f"no traces file at {traces}",
            where="arag train answers --calibrate",
            fix="write one with `arag eval answers --questions <train file> --held-out --traces FILE`",
        )
    cases: list[Case] = []
    for _, row, q in traced_answers(traces, questions, config=config):
        kept = sorted((k for k in row.kept if k.n is not None), key=lambda k: k.n or 0)
        chunks = {c.id: c for c in store.get_chunks([k.chunk_id for k in kept])}
        found = [k for k in kept if k.chunk_id in chunks]
        texts = [chunks[k.chunk_id].text for k in found]
        readings = reader.read(strip_lead(library_query(q)), texts) if texts else []
        refs = references_for_question(q.answers, text_evidence_only=True, where=q.question_id)
        cases.append(
            Case(
                question_id=q.question_id,
                kind=q.kind,
                answer_type=row.answer_type,
                abstained=row.abstained,
                agent_f1=row.answer_f1,
                summary=summarize(readings, [k.score for k in found]),
                refs=tuple(refs),
            )
        )
    return cases
