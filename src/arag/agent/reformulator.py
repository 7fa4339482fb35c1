"""The reformulator: new sub-queries aimed at what the grader found missing, for the one retry.
Rules: a planned sub-query with no evidence is searched again as its bare keywords; missing terms
and names are searched together with the question's best-covered terms as an anchor. With an LLM
(and ``reformulate_with_llm``) the model writes them, falling back to the rules on a bad reply.
Either way, words about the assistant itself ("the papers in this library") are never searched, an
arXiv id of the question is never cut up, and a query that shares no word with the question (a
question the user did not ask) is dropped."""

from __future__ import annotations

from typing import Literal

from arag.agent import prompts
from arag.agent.answer_type import strip_lead
from arag.agent.deps import AgentDeps, ask_json
from arag.agent.grader import question_focus
from arag.agent.planner import invented, repair_ids
from arag.agent.state import AgentState, Grade, Step
from arag.agent.terms import content_words, drop_assistant_words, key_terms, safe_label, strip_self_reference
from arag.retrieval.resolve import PaperRef

# Words of the question kept beside the missing ones, so the new query stays on the question's topic.
ANCHOR_WORDS = 3


def _keywords(text: str) -> str:
    return " ".join(content_words(strip_self_reference(strip_lead(text))))


def reformulate_rules(
    question: str, grade: Grade, searched: list[str], resolved: PaperRef | None, max_queries: int = 3
) -> list[tuple[str, str]]:
    """(new query, the planned sub-query it serves) pairs, none already searched (a pure function)."""
    lead = ""
    if resolved is not None:
        # Keep the retry inside the paper the question named.
        lead = f"In the paper '{safe_label(resolved.title)}': "
    focus = strip_self_reference(question_focus(question, resolved))
    done = {q.strip().lower() for q in searched}
    out: list[tuple[str, str]] = []

    def add(query: str, target: str) -> None:
        query = query.strip()
        full = f"{lead}{query}" if lead and query else query
        if key_terms(query) and full.lower() not in done and full.lower() not in {q.lower() for q, _ in out}:
            out.append((full, target))

    for sub in grade.empty_queries:
        add(_keywords(question_focus(sub, resolved)), sub)
    missing = grade.missing
    if missing:
        anchor = [w for w in content_words(focus) if w not in missing][:ANCHOR_WORDS]
        add(" ".join([*missing, *anchor]), question)
    if not out:
        # Nothing specific is missing (the question is off the passages): its bare keywords.
        add(_keywords(focus), question)
    return out[:max_queries]


def make_reformulate_edge():
    """The conditional edge after the reformulator: search the new queries, or go on without."""

    def reformulate_edge(state: AgentState) -> Literal["retriever", "context"]:
        return "retriever" if state.get("pending") else "context"

    return reformulate_edge


def make_reformulator(deps: AgentDeps):
    """The reformulator node."""
    settings = deps.settings

    def reformulator(state: AgentState) -> Step:
        question = state["question"]
        grade = state["grade"]
        searched = list(state.get("sub_queries", []))
        resolved = state.get("resolved")
        pairs = reformulate_rules(question, grade, searched, resolved, settings.max_sub_queries)
        how = "rules"
        if deps.llm is not None and settings.reformulate_with_llm:
            reply = ask_json(
                deps.llm,
                prompts.REFORMULATOR_SYSTEM,
                prompts.REFORMULATOR_USER.format(
                    question=question,
                    searched="; ".join(searched),
                    missing=", ".join(grade.missing) or "evidence",
                ),
                prompts.REFORMULATOR_SCHEMA,
                max_tokens=80,
            )
            queries = reply.get("queries") if reply else None
            done = {q.strip().lower() for q in searched}
            if isinstance(queries, list):
                fresh = [
                    repair_ids(question, drop_assistant_words(q.strip(), question))
                    for q in queries
                    if isinstance(q, str)
                    and key_terms(drop_assistant_words(q, question))
                    and not invented(question, q)
                ]
                fresh = [q for q in fresh if q.lower() not in done]
                fresh = list(dict.fromkeys(fresh))[: settings.max_sub_queries]
                if fresh:
                    lead = f"In the paper '{safe_label(resolved.title)}': " if resolved is not None else ""
                    pairs = [(f"{lead}{q}", question) for q in fresh]
                    how = "LLM"
            if how != "LLM":
                how = "rules (LLM reply unusable)"
        update = {
            "pending": [q for q, _ in pairs],
            "pending_targets": [t for _, t in pairs],
            "retries": state.get("retries", 0) + 1,
        }
        decision = f"{len(pairs)} new quer{'ies' if len(pairs) != 1 else 'y'} ({how})"
        if pairs:
            decision += ": " + "; ".join(q for q, _ in pairs)
        return Step(update, decision, {"queries": len(pairs)})

    return reformulator
