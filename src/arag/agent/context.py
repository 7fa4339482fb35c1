"""The synthesis context: evidence ordered fairly across sub-queries, pruned to the sentences that bear on
the question, capped in the LLM's own tokens (prefill dominates latency on a CPU), numbered [1..n].
The numbers are assigned after pruning, so every number names a passage the LLM actually saw."""

from __future__ import annotations

from collections.abc import Callable

from arag.agent.deps import AgentDeps
from arag.agent.literature import literature_context
from arag.agent.state import AgentState, ContextPassage, Evidence, Step
from arag.agent.terms import (
    clean_label,
    key_terms,
    safe_label,
    sentences,
    strip_instructions,
)
from arag.settings import AgentSettings
from arag.text import strip_placeholders, tokenize

GAP = " … "
# A query's best passage that shares no word with the question still goes in (the reranker may
# have matched it on meaning): its first sentences, this many.
FALLBACK_SENTENCES = 2


def order_evidence(evidence: list[Evidence]) -> list[Evidence]:
    """Round-robin over the queries in the order they were searched, each query's chunks best first:
    every sub-query of a comparison reaches the context even under a tight budget."""
    by_query: dict[str, list[Evidence]] = {}
    for e in evidence:
        by_query.setdefault(e.query, []).append(e)
    queues = [sorted(v, key=lambda e: e.rank) for v in by_query.values()]
    out: list[Evidence] = []
    depth = 0
    while any(depth < len(q) for q in queues):
        out.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return out


def prune_sentences(text: str, terms: set[str], neighbours: int = 1) -> tuple[list[str], int]:
    """The sentences of ``text`` that share a term with the question, each with the ``neighbours``
    sentences after it (a number often follows the sentence naming what it measures), in order.
    Returns (kept sentences, total sentences); a gap between kept runs is marked with GAP."""
    sents = sentences(text)
    keep: set[int] = set()
    for i, s in enumerate(sents):
        if terms & set(tokenize(s)):
            keep.update(range(i, min(len(sents), i + neighbours + 1)))
    out: list[str] = []
    prev = -1
    for i in sorted(keep):
        out.append(sents[i] if prev in (-1, i - 1) or not out else GAP.strip() + " " + sents[i])
        prev = i
    return out, len(sents)


def header(n: int, e: Evidence) -> str:
    return passage_header(n, e.chunk.title, e.chunk.section)


def passage_header(n: int, title: str, section: str | None) -> str:
    """``[n] title — section``: the labels filtered like the passages' text (see ``clean_label``)."""
    label = safe_label(section) if section else ""
    return f"[{n}] {safe_label(title)}{f' — {label}' if label else ''}\n"


def build_context(
    question: str,
    queries: list[str],
    evidence: list[Evidence],
    settings: AgentSettings,
    count_tokens: Callable[[str], int],
    budget: int,
) -> tuple[list[ContextPassage], dict[str, float]]:
    """Numbered, pruned passages within ``budget`` tokens, and counts (sentences kept, tokens)."""
    terms = set(key_terms(" ".join([question, *queries])))
    best: dict[str, Evidence] = {}
    for e in evidence:
        if e.query not in best or e.rank < best[e.query].rank:
            best[e.query] = e
    firsts = {e.chunk.id for e in best.values()}
    passages: list[ContextPassage] = []
    used = total_sents = kept_sents = dropped = instructions = 0
    for e in order_evidence(evidence):
        if len(passages) >= settings.max_passages:
            break
        text, removed = strip_instructions(strip_placeholders(e.chunk.text))
        instructions += removed + clean_label(e.chunk.title)[1]
        instructions += clean_label(e.chunk.section)[1] if e.chunk.section else 0
        kept, n_sents = prune_sentences(text, terms, settings.neighbour_sentences)
        total_sents += n_sents
        if not kept:
            if e.chunk.id not in firsts:
                dropped += 1
                continue
            kept = sentences(text)[:FALLBACK_SENTENCES]
        head = header(len(passages) + 1, e)
        while kept and used + count_tokens(head + " ".join(kept)) > budget:
            kept.pop()
        if not kept:
            break
        body = " ".join(kept)
        tokens = count_tokens(head + body)
        used += tokens
        kept_sents += len(kept)
        passages.append(
            ContextPassage(n=len(passages) + 1, chunk=e.chunk, text=body, score=e.score, tokens=tokens)
        )
    counts: dict[str, float] = {
        "passages": len(passages),
        "tokens": used,
        "sentences_kept": kept_sents,
        "sentences_seen": total_sents,
        "dropped": dropped,
        "instructions_removed": instructions,
    }
    return passages, counts


def format_passages(passages: list[ContextPassage]) -> str:
    """The passages as the LLM reads them."""
    out = []
    for p in passages:
        out.append(passage_header(p.n, p.chunk.title, p.chunk.section) + p.text)
    return "\n\n".join(out)


def context_budget(deps: AgentDeps) -> int:
    """Tokens for the passages: the configured cap, or less when the LLM's window is smaller."""
    s = deps.settings
    if deps.llm is None:
        return s.context_tokens
    room = deps.llm.context_tokens - deps.max_answer_tokens - s.prompt_reserve_tokens
    return max(64, min(s.context_tokens, room))


def make_context(deps: AgentDeps):
    """The context node."""

    def context(state: AgentState) -> Step:
        if state.get("literature"):
            grade = state.get("grade")
            parts = grade.parts if grade is not None else []
            lit = literature_context(
                parts, list(state.get("evidence", [])), deps.settings.literature_passages
            )
            n_papers = len({p.chunk.paper_id for p in lit})
            decision = f"{len(lit)} passages of {n_papers} papers (literature)"
            return Step({"context": lit}, decision, {"passages": len(lit), "papers": n_papers})
        passages, counts = build_context(
            state["question"],
            list(state.get("sub_queries", [])),
            list(state.get("evidence", [])),
            deps.settings,
            deps.count_tokens,
            context_budget(deps),
        )
        seen = counts["sentences_seen"] or 1
        decision = (
            f"{len(passages)} passages, {int(counts['tokens'])} tokens "
            f"(kept {counts['sentences_kept'] / seen:.0%} of sentences)"
        )
        if counts["instructions_removed"]:
            decision += f"; removed {int(counts['instructions_removed'])} instruction-like sentence(s)"
        return Step({"context": passages}, decision, counts)

    return context
