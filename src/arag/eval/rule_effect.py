"""What the calibrated abstention rule changed, paired, from one `arag eval answers` run.

A rule that declines an answer withholds a short answer the run never scores; its abstention step
names it in its decision, so the same questions can be scored as they would have been without the
rule. Paired on the same answers, the difference carries no sampling noise of its own, which two
separate runs (rule on, rule off) could not give: their LLM answers differ run to run only by the
rule, but their CIs would overlap whatever it did.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from arag.eval.answers import AnswerMetric, AnswerQuestion, TraceRow, metric, short_prediction
from arag.eval.qasper_metrics import references_for_question, score_references
from arag.eval.retrieval import bootstrap_ci

_WITHHELD = re.compile(r"withheld short answer ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


def declined_by_rule(row: TraceRow) -> bool:
    """The abstention step declined this answer (not the verifier, not the synthesizer)."""
    return any(
        d.get("node") == "abstention" and str(d.get("decision", "")).startswith("abstain:")
        for d in row.decisions
    )


def withheld_short_answer(row: TraceRow) -> str | None:
    """The short answer the rule withheld: named in the step's decision, or, in traces written
    before it was, the synthesizer's draft (the same answer when no specialist rule is on)."""
    for d in row.decisions:
        if d.get("node") == "abstention":
            m = _WITHHELD.search(str(d.get("decision", "")))
            if m is not None:
                value = ast.literal_eval(m.group(1))
                return value if isinstance(value, str) else None
    return row.draft_short_answer


class RuleEffect(BaseModel):
    """One configuration's answers with the rule (as run) and without it (the withheld answers)."""

    declined: int
    declined_unanswerable: int
    declined_answerable: int
    unknown: int  # declined, but the withheld answer is not in the trace: scored as declined
    answer_f1_with: AnswerMetric
    answer_f1_without: AnswerMetric
    difference: AnswerMetric  # with - without, per question, bootstrapped (paired)
    abstain_unanswerable_without: float
    answered_answerable_without: float


def rule_effect(rows: Sequence[TraceRow], questions: Sequence[AnswerQuestion]) -> RuleEffect | None:
    """The paired effect of the abstention rule over ``rows``; None when it declined nothing."""
    declined = [r for r in rows if declined_by_rule(r)]
    if not declined:
        return None
    by_id = {q.question_id: q for q in questions}
    with_rule: list[float] = []
    without: list[float] = []
    abstained_without: list[tuple[str, bool]] = []
    unknown = 0
    for r in rows:
        f1, abstained = r.answer_f1, r.abstained
        if declined_by_rule(r):
            short = withheld_short_answer(r)
            if short is None:
                unknown += 1
            else:
                refs = references_for_question(by_id[r.question_id].answers, text_evidence_only=True)
                f1 = score_references(short_prediction(short), [], refs).answer_f1
                abstained = False
        with_rule.append(r.answer_f1)
        without.append(f1)
        abstained_without.append((r.kind, abstained))
    diff = [a - b for a, b in zip(with_rule, without, strict=True)]
    lo, hi = bootstrap_ci(diff)
    unans = [a for k, a in abstained_without if k == "unanswerable"]
    ans = [not a for k, a in abstained_without if k != "unanswerable"]
    return RuleEffect(
        declined=len(declined),
        declined_unanswerable=sum(r.kind == "unanswerable" for r in declined),
        declined_answerable=sum(r.kind != "unanswerable" for r in declined),
        unknown=unknown,
        answer_f1_with=metric(with_rule),
        answer_f1_without=metric(without),
        difference=AnswerMetric(mean=float(np.mean(diff)), lo=lo, hi=hi, n=len(diff)),
        abstain_unanswerable_without=float(np.mean(unans)) if unans else 0.0,
        answered_answerable_without=float(np.mean(ans)) if ans else 0.0,
    )
