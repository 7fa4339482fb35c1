"""The grader: is the accumulated context enough to answer? Evidence first: whether anything cleared
the reranker's bar, whether every planned sub-query kept evidence, whether the question's key terms
and names appear in the kept passages' text (the passage itself, never only a title or abstract
prefix). With a capable LLM, a context the evidence accepts is also checked by the LLM."""

from __future__ import annotations

import re
from typing import Literal

from arag.agent import prompts
from arag.agent.answer_type import strip_lead
from arag.agent.context import build_context, context_budget, format_passages
from arag.agent.deps import AgentDeps, ask_json
from arag.agent.literature import grade_literature
from arag.agent.state import AgentState, Evidence, Grade, QueryOutcome, Step
from arag.agent.terms import (
    entities,
    has_entity,
    held_share,
    holds,
    key_terms,
    strip_self_reference,
    term_words,
)
from arag.retrieval.resolve import PaperRef
from arag.settings import AgentSettings
from arag.text import held_terms

_ARXIV_ID = re.compile(r"(?<![\d.])\d{4}\.\d{4,5}(?:v\d+)?(?!\d)")


def passage_text(e: Evidence) -> str:
    """What the grader reads of a chunk: its section heading and its whole text."""
    return f"{e.chunk.section or ''} {e.chunk.text}"


def question_focus(question: str, resolved: PaperRef | None) -> str:
    """The question without the paper it names (the title's words are not in the passages' text) and
    without words about the assistant itself ("in this library")."""
    if resolved is not None:
        question = resolved.remainder(question)
    return strip_self_reference(strip_lead(question))


def grade_evidence(
    question: str,
    plan: list[str],
    evidence: list[Evidence],
    outcomes: list[QueryOutcome],
    resolved: PaperRef | None,
    settings: AgentSettings,
) -> Grade:
    """The evidence-based verdict (a pure function): unrelated, partial or sufficient, with reasons."""
    unknown = [m.group(0) for m in _ARXIV_ID.finditer(question)] if resolved is None else []
    if unknown:
        # The question names a paper by arXiv id and no search resolved it: the library lacks it, and
        # other papers' passages do not answer a question about it.
        return Grade(
            verdict="unrelated",
            reasons=[f"paper {', '.join(unknown)} is not in the library"],
            coverage=0.0,
            missing_entities=unknown,
            empty_queries=list(plan),
        )
    if not evidence:
        return Grade(
            verdict="unrelated",
            reasons=["no passage cleared the reranker's bar"],
            coverage=0.0,
            empty_queries=list(plan),
        )
    focus = question_focus(question, resolved)
    texts = [passage_text(e) for e in evidence]
    joined = " ".join(texts)
    # A term counts in any of its spellings, and in a compound the passages spell open ("What datasets
    # did the authors use?" is answered by "Our target data set consists of ...").
    have = held_terms(joined)
    lower = joined.lower()
    terms = key_terms(focus)
    words = term_words(focus)
    cov = held_share(terms, have)
    missing_terms = [words.get(t, t) for t in terms if not holds(have, t)]
    missing_entities = [e for e in entities(focus) if not has_entity(e, lower)]
    served = {o.target for o in outcomes if o.kept > 0}
    empty: list[str] = []
    for sub in plan if len(plan) > 1 else []:
        sub_cov = held_share(key_terms(question_focus(sub, resolved)), have)
        # A sub-query whose own words are absent found nothing on its part of the question.
        if sub not in served or sub_cov < settings.unrelated_coverage:
            empty.append(sub)
    if len(plan) == 1 and plan[0] not in served:
        empty = list(plan)
    reasons: list[str] = []
    if cov < settings.unrelated_coverage:
        verdict: Literal["sufficient", "partial", "unrelated"] = "unrelated"
        reasons.append(f"only {cov:.0%} of the question's key terms are in the passages")
    else:
        if cov < settings.min_coverage:
            reasons.append(f"{cov:.0%} of the question's key terms are in the passages")
        if missing_entities:
            reasons.append("not in the passages: " + ", ".join(missing_entities))
        if empty:
            reasons.append("no evidence for: " + "; ".join(empty))
        verdict = "partial" if reasons else "sufficient"
    best = max((e.rerank_score for e in evidence if e.rerank_score is not None), default=None)
    if verdict == "sufficient":
        reasons.append(f"{len(evidence)} passages hold {cov:.0%} of the key terms")
        if best is not None:
            reasons.append(f"best rerank score {best:.2f}")
    return Grade(
        verdict=verdict,
        reasons=reasons,
        coverage=round(cov, 4),
        missing_terms=missing_terms,
        missing_entities=missing_entities,
        empty_queries=empty,
    )


def make_grade_edge(max_retries: int):
    """The conditional edge after the grader: one reformulation pass at most, then synthesis (which
    answers from partial context or abstains)."""

    def grade_edge(state: AgentState) -> Literal["reformulator", "context"]:
        grade = state.get("grade")
        if grade is not None and grade.verdict != "sufficient" and state.get("retries", 0) < max_retries:
            return "reformulator"
        return "context"

    return grade_edge


def make_grader(deps: AgentDeps):
    """The grader node."""

    def grader(state: AgentState) -> Step:
        question = state["question"]
        evidence = list(state.get("evidence", []))
        if state.get("literature"):
            grade = grade_literature(
                list(state.get("plan", [question])),
                list(state.get("rankings", [])),
                evidence,
                max_papers=deps.settings.literature_papers,
                min_ratio=deps.settings.literature_min_score,
            )
            papers = len({pid for p in grade.parts for pid in p.paper_ids})
            decision = f"{grade.verdict} (literature): " + "; ".join(grade.reasons)
            return Step({"grade": grade}, decision, {"papers": papers, "passages": len(evidence)})
        grade = grade_evidence(
            question,
            list(state.get("plan", [question])),
            evidence,
            list(state.get("outcomes", [])),
            state.get("resolved"),
            deps.settings,
        )
        if grade.verdict == "sufficient" and deps.llm is not None and deps.llm_checks:
            passages, _ = build_context(
                question,
                list(state.get("sub_queries", [])),
                evidence,
                deps.settings,
                deps.count_tokens,
                context_budget(deps),
            )
            reply = ask_json(
                deps.llm,
                prompts.GRADER_SYSTEM,
                prompts.GRADER_USER.format(passages=format_passages(passages), question=question),
                prompts.GRADER_SCHEMA,
                max_tokens=60,
            )
            if reply is not None and reply.get("sufficient") is False:
                missing = str(reply.get("missing") or "").strip()
                grade = grade.model_copy(
                    update={
                        "verdict": "partial",
                        "reasons": [f"LLM: missing {missing or 'something'}"],
                        "missing_terms": [missing] if missing else [],
                    }
                )
            grade = grade.model_copy(update={"llm_checked": reply is not None})
        decision = f"{grade.verdict}: " + "; ".join(grade.reasons)
        counts = {
            "coverage": grade.coverage,
            "passages": len(evidence),
            "missing": len(grade.missing),
            "empty_queries": len(grade.empty_queries),
        }
        return Step({"grade": grade}, decision, counts)

    return grader
