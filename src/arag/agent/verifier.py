"""The verifier: the answer split into claims, each scored against the passages it cites. Unsupported
claims are dropped (or marked); a claim's markers that do not support it are removed when another
does; an uncited supported claim gets its best passage's marker. When the core answer (the first
claim, and for a span answer the span itself) is unsupported, the agent abstains: fail closed.
The verifier also assembles the final ``Answer``."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from arag.agent import prompts
from arag.agent.count import count_sentence
from arag.agent.deps import AgentDeps
from arag.agent.literature import literature_short_answer
from arag.agent.state import AgentState, ContextPassage, Draft, Grade, Step
from arag.agent.support import SupportScorer
from arag.agent.synthesizer import with_marker
from arag.agent.terms import (
    as_answered,
    cited_numbers,
    coverage,
    entities,
    holds,
    key_terms,
    reported,
    sentences,
    strip_citations,
)
from arag.agent.wording import first_mention, fragment, names_authors, one_paper
from arag.corpus.arxiv_ids import arxiv_url
from arag.records import Answer, AnswerType, ApproachGroup, Citation, PaperHit, PaperPoint, UsedChunk
from arag.text import held_terms, strip_placeholders, tokenize

UNSUPPORTED_MARK = " (not supported by the cited passages)"
# A span answer must have this share of its words in the passages: a span comes from a paper.
SPAN_GROUNDING = 0.5


@dataclass
class Verified:
    """The claims that survived, the support per cited passage, and what happened."""

    explanation: str
    support: dict[int, float] = field(default_factory=dict)
    claims: int = 0
    supported: int = 0
    dropped: int = 0
    core_supported: bool = False
    reason: str = ""


def split_claims(explanation: str, *, quoted: bool = False) -> list[str]:
    """The answer's sentences; a sentence of markers alone ("[1].") joins the claim before it.
    The LLM's sentence may start in lower case ("... in the paper [1]. word2vec is used [2]."): the
    splitter's default, made for papers' prose, would make the two one claim, checked against the
    second's passage alone, so the first would ride on a citation that is not its own. ``quoted``:
    papers' own sentences (a literature answer's points), split as the papers' prose is."""
    claims: list[str] = []
    for s in sentences(explanation, lower_starts=not quoted):
        if claims and not strip_citations(s).strip(" .;,:"):
            claims[-1] = f"{claims[-1].rstrip()} {s}"
        else:
            claims.append(s)
    return claims


def _remark(body: str, numbers: list[int]) -> str:
    """A claim's text with exactly ``numbers`` as its markers."""
    out = body
    for n in numbers:
        out = with_marker(out, n)
    # with_marker puts each marker before the final period: "x [1] [2]." reads fine.
    return out


def verify_claims(
    draft: Draft,
    passages: list[ContextPassage],
    scorer: SupportScorer,
    answer_type: AnswerType,
    *,
    mark: bool,
) -> Verified:
    """Score every claim of the draft against its cited passages (a pure function of its inputs). An
    extractive draft's sentences are the papers' own, split as their prose is."""
    by_n = {p.n: p for p in passages}
    out: list[str] = []
    result = Verified(explanation="")
    first_content: bool | None = None
    for claim in split_claims(draft.explanation, quoted=draft.mode == "extractive"):
        body = strip_citations(claim)
        if not key_terms(body):
            out.append(claim)  # "Yes." or a connective: nothing to check
            continue
        result.claims += 1
        cited = [n for n in cited_numbers(claim) if n in by_n]
        pool = cited or list(by_n)
        scores = {n: scorer.score(body, by_n[n].full_text) for n in pool}
        good = [n for n in pool if scores[n] >= scorer.threshold]
        for n in cited:
            result.support[n] = max(result.support.get(n, 0.0), scores[n])
        if good:
            result.supported += 1
            keep = good if cited else [max(good, key=lambda n: (scores[n], -n))]
            for n in keep:
                result.support[n] = max(result.support.get(n, 0.0), scores[n])
            out.append(_remark(body, keep))
        else:
            result.dropped += 1
            if mark:
                out.append(claim.rstrip() + UNSUPPORTED_MARK)
        if first_content is None:
            first_content = bool(good)
    result.explanation = " ".join(out)
    if first_content is None:
        result.reason = "the answer makes no checkable claim"
    elif not first_content:
        result.reason = "the core claim is not supported by its passages"
    else:
        result.core_supported = True
    if result.core_supported and answer_type == "span" and draft.short_answer:
        have = set(tokenize(" ".join(p.full_text for p in passages)))
        if coverage(key_terms(draft.short_answer), have) < SPAN_GROUNDING:
            result.core_supported = False
            result.reason = f"the short answer {draft.short_answer!r} is not in the passages"
    return result


@dataclass
class VerifiedLiterature:
    """A literature draft checked: the overview's surviving claims, the supported points by group,
    and the support of each cited passage."""

    overview: str
    groups: list[tuple[str, list[tuple[int, str]]]]
    support: dict[int, float] = field(default_factory=dict)
    claims: int = 0
    supported: int = 0
    dropped: int = 0


# An overview claim a third of whose words (three at least) are found only in the passages of papers it
# does not cite drew on them: the 1.5B lists six papers' approaches and cites one ("Several papers
# propose ... rhetorical analysis, ..., a hard-selection approach ... [15]"), or gives one paper
# another's method ("... treat it as a domain adaptation problem [3]", the title of a paper it did not
# cite). The words that name papers ("one paper", "another study": wording.py's) do not count.
MISATTRIBUTED_SHARE = 0.3
MISATTRIBUTED_TERMS = 3
_NAMING_WORDS = frozenset(tokenize("one another same two three four five six paper study work article"))


def misattributed(claim: str, cited: set[str], others: set[str]) -> bool:
    """Whether an overview claim draws on papers it does not cite: enough of its key terms are held
    (``text.held_terms``) by ``others`` (the passages of the papers it does not cite) and not by
    ``cited`` (those of the papers it cites), a term counting in any of its spellings."""
    terms = [t for t in key_terms(strip_citations(claim)) if t not in _NAMING_WORDS]
    only = [t for t in terms if not holds(cited, t) and holds(others, t)]
    return len(only) >= MISATTRIBUTED_TERMS and len(only) >= MISATTRIBUTED_SHARE * len(terms)


def unnamed(claim: str, cited: set[str]) -> list[str]:
    """The names an overview claim gives (acronyms, mixed-case and alphanumeric names: ``entities``)
    that the papers it cites never write (``cited``: their passages' and titles' held terms): asked how
    ELMo and BERT embeddings differ, the 1.5B wrote "ELMo embeddings are subword-aware, while BERT
    embeddings are not [8]" of a paper on ELMo alone, which the lexical check passed on its other words."""
    return [
        name for name in entities(strip_citations(claim)) if any(not holds(cited, t) for t in key_terms(name))
    ]


# Two sentences whose words (in order) match this closely say the same thing ("In their first task,
# the authors use ..." and "In their first task the authors use ...").
REPEAT_RATIO = 0.9


def said_words(sentence: str) -> list[str]:
    """A sentence's words as a reader compares them: lowercase, in the third person, no [n] markers."""
    return reported(strip_citations(sentence)).lower().rstrip(" .!?").split()


def repeats(words: list[str], earlier: list[str]) -> bool:
    """Whether a sentence (its :func:`said_words`) says again what an earlier one said."""
    return difflib.SequenceMatcher(None, words, earlier).ratio() >= REPEAT_RATIO


def verify_literature(
    draft: Draft, passages: list[ContextPassage], scorer: SupportScorer
) -> VerifiedLiterature:
    """Check a literature draft (a pure function of its inputs): the overview claim by claim, like any
    answer (unsupported claims dropped, and claims drawn from papers they do not cite), its papers
    named as the reader can follow them, and each paper's point against the passage it was drawn
    from (a point that its passage does not support is dropped)."""
    by_n = {p.n: p for p in passages}
    out = VerifiedLiterature(overview="", groups=[])
    if draft.overview:
        v = verify_claims(
            draft.model_copy(update={"explanation": draft.overview}),
            passages,
            scorer,
            "free_form",
            mark=False,
        )
        # A "sentence" of markers or connectives alone says nothing, nor does a title cited alone or a
        # sentence the LLM copied from a clipped point and that stops there: an overview keeps claims.
        # One that names other papers' authors ("Mendoza et al.") credits the cited paper with theirs.
        said = [
            c
            for c in split_claims(v.explanation)
            if key_terms(strip_citations(c)) and not fragment(c) and not names_authors(c)
        ]
        out.claims, out.supported, out.dropped = v.claims, v.supported, v.dropped
        texts: dict[str, list[str]] = {}
        by_pid: dict[str, str] = {}
        for p in passages:
            texts.setdefault(p.chunk.paper_id, []).append(p.full_text)
            by_pid[p.chunk.paper_id] = p.chunk.title
        # Each paper's terms once, not once per claim.
        held = {pid: held_terms(" ".join(t)) for pid, t in texts.items()}
        # A claim may name a paper's model by its title, which the LLM read beside its point.
        titled = {pid: held[pid] | held_terms(by_pid[pid]) for pid in held}
        attributed: list[str] = []
        named: set[str] = set()
        # The 1.5B may write one sentence once per pair of papers ("Two papers use X [2] [5]. Two
        # papers use X [9] [12].") or copy a point the answer shows below it: said again, a claim
        # tells the reader nothing new.
        seen = [said_words(s) for _, points in draft.groups for _, s in points]
        for c in said:
            words = said_words(c)
            if any(repeats(words, earlier) for earlier in seen):
                out.supported, out.dropped = out.supported - 1, out.dropped + 1
                continue
            papers = {by_n[n].chunk.paper_id for n in cited_numbers(c) if n in by_n}
            cited = set().union(*(held[pid] for pid in papers))
            others = set().union(*(h for pid, h in held.items() if pid not in papers))
            if misattributed(c, cited, others) or unnamed(c, set().union(*(titled[pid] for pid in papers))):
                out.supported, out.dropped = out.supported - 1, out.dropped + 1
                continue
            seen.append(words)
            # "The papers compare ... [2]", "They propose ... [5]": what one paper does, said of several.
            lead = "The same" if papers <= named else "Another" if attributed else "One"
            single = one_paper(c, lead) if len(papers) == 1 else None
            attributed.append(single or c)
            named |= papers
        # The LLM named its papers one and another in its own order; the first left is the first named.
        attributed[:1] = [first_mention(c) for c in attributed[:1]]
        out.overview, out.support = " ".join(attributed), dict(v.support)
    for label, points in draft.groups:
        kept: list[tuple[int, str]] = []
        for n, sentence in points:
            if n not in by_n:
                out.dropped += 1
                continue
            score = scorer.score(sentence, by_n[n].full_text)
            out.claims += 1
            if score >= scorer.threshold:
                out.supported += 1
                out.support[n] = max(out.support.get(n, 0.0), score)
                kept.append((n, sentence))
            else:
                out.dropped += 1
        if kept:
            out.groups.append((label, kept))
    return out


def literature_answer(
    draft: Draft,
    passages: list[ContextPassage],
    scorer: SupportScorer,
    base: dict[str, Any],
    missing: list[str],
) -> tuple[Answer, VerifiedLiterature]:
    """The Answer of a checked literature draft: the overview, then each group's points (every sentence
    cited), the groups, the papers with their points and arXiv links, the citations; an abstention
    when no point survived."""
    v = verify_literature(draft, passages, scorer)
    by_n = {p.n: p for p in passages}
    if not v.groups:
        answer = Answer(
            short_answer=prompts.NOT_IN_LIBRARY,
            text=abstain_text(base["closest"]),
            abstained=True,
            mode="abstain",
            missing=missing,
            dropped_claims=v.dropped,
            **base,
        )
        return answer, v
    groups: list[ApproachGroup] = []
    papers: list[PaperPoint] = []
    # Checked as quoted, shown in the third person (a paper's "we" is its authors, not arag).
    paragraphs = [reported(v.overview)] if v.overview else []
    for label, points in v.groups:
        text = " ".join(with_marker(reported(sentence), n) for n, sentence in points)
        paragraphs.append(text)
        pids = list(dict.fromkeys(by_n[n].chunk.paper_id for n, _ in points))
        groups.append(ApproachGroup(label=label, paper_ids=pids, text=text))
        for n, sentence in points:
            chunk = by_n[n].chunk
            if any(p.paper_id == chunk.paper_id for p in papers):
                continue
            papers.append(
                PaperPoint(
                    n=n,
                    paper_id=chunk.paper_id,
                    title=chunk.title,
                    url=arxiv_url(chunk.paper_id),
                    point=with_marker(reported(sentence), n),
                    group=label,
                )
            )
    text = "\n\n".join(paragraphs)
    if missing:
        text += "\n\nNot found in the library's passages: " + ", ".join(missing) + "."
    citations = [
        Citation(
            n=n,
            chunk_id=by_n[n].chunk.id,
            paper_id=by_n[n].chunk.paper_id,
            title=by_n[n].chunk.title,
            section=by_n[n].chunk.section,
            support=round(v.support.get(n, 0.0), 4),
            supported=v.support.get(n, 0.0) >= scorer.threshold,
        )
        for n in cited_numbers(text)
        if n in by_n
    ]
    short = literature_short_answer([(g.label, g.paper_ids) for g in groups], len(papers))
    answer = Answer(
        short_answer=short,
        text=text,
        citations=citations,
        mode=draft.mode,
        missing=missing,
        dropped_claims=v.dropped,
        groups=groups,
        papers=papers,
        **base,
    )
    return answer, v


def abstain_text(closest: list[PaperHit]) -> str:
    """The abstention and the papers nearest the question."""
    text = prompts.ABSTAIN
    if closest:
        text += "\n\nClosest papers in the library:\n" + "\n".join(
            f"- {p.title} ({p.paper_id})" for p in closest
        )
    return text


def missing_note(grade: Grade) -> list[str]:
    """What the passages lacked, in words, for a partial answer."""
    items = list(grade.missing)
    items.extend(f"evidence for '{q}'" for q in grade.empty_queries)
    return list(dict.fromkeys(items))


def make_verifier(deps: AgentDeps):
    """The verifier node: checks the draft and builds the Answer."""
    settings = deps.settings

    def verifier(state: AgentState) -> Step:
        question = state["question"]
        draft: Draft = state["draft"]
        passages = list(state.get("context", []))
        grade = state.get("grade") or Grade(verdict="unrelated")
        closest = list(state.get("closest", []))
        answer_type = state.get("answer_type", "free_form")
        n_of = {p.chunk.id: p.n for p in passages}
        chunks = [
            UsedChunk(
                n=n_of.get(e.chunk.id),
                chunk_id=e.chunk.id,
                paper_id=e.chunk.paper_id,
                title=e.chunk.title,
                section=e.chunk.section,
                score=round(e.score, 4),
                query=e.query,
                pass_index=e.pass_index,
                text=strip_placeholders(e.chunk.text),
            )
            for e in state.get("evidence", [])
        ]
        count = state.get("library_count")
        base: dict[str, Any] = {
            "question": question,
            "route": "research",
            "answer_type": answer_type,
            "sub_queries": list(state.get("sub_queries", [])),
            "retries": state.get("retries", 0),
            "chunks": chunks,
            "closest": closest,
            "removed_citations": draft.removed_citations,
            "form": "literature" if state.get("literature") else "answer",
            "library_count": count,
        }
        missing = missing_note(grade) if grade.verdict != "sufficient" else []
        declined = abstain_text(closest)
        if count is not None:
            # Asked how many papers: the count stands even when no paper's passages answer.
            declined = f"{count_sentence(count)}.\n\n{declined}"

        def abstention(**extra: Any) -> Answer:
            """Not in the library: what it lacks, and the closest passages it has instead."""
            return Answer(
                short_answer=prompts.NOT_IN_LIBRARY,
                text=declined,
                abstained=True,
                mode="abstain",
                missing=missing,
                **extra,
                **base,
            )

        if draft.mode == "abstain":
            return Step({"answer": abstention()}, f"abstain ({'; '.join(draft.notes)})", {"claims": 0})
        if state.get("literature"):
            lit, vl = literature_answer(draft, passages, deps.support, base, missing)
            lit_counts: dict[str, float] = {
                "claims": vl.claims,
                "supported": vl.supported,
                "dropped": vl.dropped,
            }
            if lit.abstained:
                why = "abstain: no paper's point is supported by its passage"
                return Step({"answer": lit.model_copy(update={"text": declined})}, why, lit_counts)
            if count is not None:
                # Asked how many papers: the library's count, then the few the answer draws on (whose
                # number, said alone, read as the count).
                short = f"{count_sentence(count)}; the answer draws on {lit.short_answer}"
                lit = lit.model_copy(update={"short_answer": short})
            decision = f"{vl.supported}/{vl.claims} claims supported; {len(lit.papers)} papers"
            return Step({"answer": lit}, f"{decision} in {len(lit.groups)} groups", lit_counts)
        v = verify_claims(draft, passages, deps.support, answer_type, mark=settings.unsupported == "mark")
        counts: dict[str, float] = {"claims": v.claims, "supported": v.supported, "dropped": v.dropped}
        if not v.core_supported:
            return Step({"answer": abstention(dropped_claims=v.dropped)}, f"abstain: {v.reason}", counts)
        # Checked as the LLM wrote it, shown as said of the paper ("we" is its authors, not arag).
        text = as_answered(v.explanation)
        if missing:
            text += "\n\nNot found in the library's passages: " + ", ".join(missing) + "."
        citations = [
            Citation(
                n=n,
                chunk_id=p.chunk.id,
                paper_id=p.chunk.paper_id,
                title=p.chunk.title,
                section=p.chunk.section,
                support=round(v.support.get(n, 0.0), 4),
                supported=v.support.get(n, 0.0) >= deps.support.threshold,
            )
            for n in cited_numbers(v.explanation)
            if (p := next((q for q in passages if q.n == n), None)) is not None
        ]
        answer = Answer(
            short_answer=draft.short_answer,
            text=text,
            citations=citations,
            mode=draft.mode,
            missing=missing,
            dropped_claims=v.dropped,
            **base,
        )
        decision = f"{v.supported}/{v.claims} claims supported"
        if v.dropped:
            decision += f", {'marked' if settings.unsupported == 'mark' else 'dropped'} {v.dropped}"
        return Step({"answer": answer}, decision, counts)

    return verifier
