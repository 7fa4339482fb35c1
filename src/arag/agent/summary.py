"""Summarise one paper: its problem, method, data, results and limits, each cited [n] to its passages.

Each aspect searches the paper alone (the hybrid search and the reranker, scoped to the paper) with a
description of the aspect, and keeps its best passages, pruned to the sentences that bear on it. The
LLM writes the aspect from those passages (or, without one, the best sentences are taken as they
are); every sentence is then checked against the passages it cites by the verifier's own claim check,
and unsupported ones are dropped. An aspect the passages do not state says so instead of guessing.
Passages are numbered once for the whole summary, so one source list serves every part.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from arag.agent import prompts
from arag.agent.context import format_passages, prune_sentences
from arag.agent.deps import ask
from arag.agent.hooks import RunHooks
from arag.agent.state import ContextPassage, Draft
from arag.agent.support import SupportScorer
from arag.agent.synthesizer import with_marker
from arag.agent.terms import (
    CITE,
    about_others,
    cited_numbers,
    clean_citations,
    exclaims,
    key_terms,
    reported,
    sentences,
    strip_citations,
    strip_instructions,
    unfinished,
)
from arag.agent.verifier import verify_claims
from arag.agent.wording import complete_sentences
from arag.corpus.arxiv_ids import arxiv_url
from arag.errors import AragError, Cancelled
from arag.llm.base import LLM
from arag.records import Answer, Chunk, Citation, NodeEvent, SearchFilter, UsedChunk
from arag.retrieval.pipeline import SearchResult
from arag.text import has_placeholder, strip_placeholders

log = logging.getLogger(__name__)

Aspect = Literal["problem", "method", "data", "results", "limits"]
# (heading, what the LLM is asked for and the search query, cue words the extractive step looks for)
ASPECTS: dict[Aspect, tuple[str, str, str]] = {
    "problem": (
        "Problem",
        "the problem or task the paper addresses and why it matters",
        "problem task challenge challenging difficult motivation lack need important",
    ),
    "method": (
        "Method",
        "the model, method or approach the paper proposes and how it works",
        "model framework architecture algorithm approach propose encoder train learn",
    ),
    "data": (
        "Data",
        "the datasets, corpora or benchmarks the paper trains and evaluates on",
        "dataset datasets corpus corpora benchmark annotated collected data",
    ),
    "results": (
        "Results",
        "the main results: scores, improvements over baselines, what the experiments show",
        "outperforms improvement improves accuracy F1 BLEU score achieves baseline significantly",
    ),
    "limits": (
        "Limits",
        "the limitations, failure cases, error analysis or future work the paper reports",
        "limitation limitations limited fail fails failure error errors future drawback however",
    ),
}
# Passages per aspect, sentences an extractive part takes, tokens of passages per LLM call.
PER_ASPECT = 3
EXTRACTIVE_SENTENCES = 2
# What sentences stating each aspect say, for the extractive step: a paper's own phrasing ("we
# propose", "outperforms") marks its claims better than the aspect's words do.
CUES: dict[Aspect, re.Pattern[str]] = {
    "problem": re.compile(
        r"\b(?:problem|challeng\w*|difficult\w*|task of|lack\w*|costly|expensive|bottleneck|important|"
        r"need(?:s|ed)? (?:to|for)|may not|cannot|remains?|however|address(?:es)? th)",
        re.I,
    ),
    "method": re.compile(
        r"\b(?:we (?:propose|present|introduce|develop|describe|design)|our (?:model|approach|method|system|"
        r"framework)|this (?:paper|work) (?:proposes|presents|introduces)|based on|consists? of|"
        r"architecture|framework|we (?:use|train|learn|model))",
        re.I,
    ),
    "data": re.compile(
        r"\b(?:data ?sets?|corpus|corpora|benchmarks?|annotat\w*|collected|treebank|wikipedia|"
        r"training (?:set|data)|test set|sentences|documents|tweets|pairs|examples)\b",
        re.I,
    ),
    "results": re.compile(
        r"\b(?:outperform\w*|improv\w*|achiev\w*|state[- ]of[- ]the[- ]art|F1|accuracy|BLEU|ROUGE|"
        r"significant\w*|better than|gains?|results show|experiments show|we show)",
        re.I,
    ),
    "limits": re.compile(
        r"\b(?:limitation\w*|limited|future work|fail\w*|errors?|drawbacks?|does not|do not|cannot|"
        r"weakness\w*|remains?|not able)",
        re.I,
    ),
}
ABSTRACT_LEADS = frozenset({"problem", "method", "data", "results"})
# A section named for the aspect ("Data collection", "Discussion"): its best passage among the
# aspect's first SECTION_DEPTH is read right after the abstract. 1804.00982's data part had cited its
# model section ("a dataset of news articles"), its "Data collection" passage ranked below the
# passages read; 1601.00901's limits now come from its Discussion.
SECTIONS: dict[Aspect, re.Pattern[str]] = {
    "problem": re.compile(r"\b(?:introduction|motivation|problem|task)", re.I),
    "method": re.compile(r"\b(?:method|approach|model|architecture|framework|system)", re.I),
    "data": re.compile(r"\b(?:data|corpus|corpora|benchmark|annotation)", re.I),
    "results": re.compile(r"\b(?:results?|evaluation|performance)", re.I),
    "limits": re.compile(r"\b(?:limitation|error|discussion|future|failure)", re.I),
}
SECTION_DEPTH = 10
ASPECT_TOKENS = 320
ANSWER_TOKENS = 100
FALLBACK_SENTENCES = 3


class PaperSearch(Protocol):
    """What the summary searches with: ``arag.retrieval.pipeline.Retriever`` (or a test fake)."""

    def search(self, query: str, flt: SearchFilter | None = None) -> SearchResult: ...


class SummarySource(BaseModel):
    """A numbered passage of the summary, with the best support of the sentences that cite it."""

    n: int
    chunk_id: str
    section: str | None
    text: str
    support: float = Field(description="the claim check's best score of a sentence citing it, 0 to 1")


class SummaryPart(BaseModel):
    """One aspect: its text with [n] markers (empty when the passages do not state it)."""

    aspect: Aspect
    heading: str
    text: str
    mode: Literal["llm", "extractive", "none"]
    sentences: int = Field(description="sentences kept (each supported by a passage it cites)")
    dropped: int = Field(description="sentences dropped as unsupported by their passages")
    note: str = ""


class PaperSummary(BaseModel):
    """A paper's summary: the parts, the numbered passages they cite, and the steps that made it."""

    paper_id: str
    title: str
    arxiv_url: str | None
    parts: list[SummaryPart]
    sources: list[SummarySource]
    llm: str = Field(description="the LLM that wrote the parts, or 'extractive (no LLM)'")
    events: list[NodeEvent] = Field(default_factory=list)
    total_ms: float = 0.0


def named_for(aspect: Aspect, section: str | None) -> bool:
    """Whether a passage's section is named for the aspect: its innermost heading ("Datasets." of
    "Experiments ::: Setup ::: Datasets.") matches the aspect's ``SECTIONS`` pattern."""
    if not section:
        return False
    return SECTIONS[aspect].search(section.split(":::")[-1]) is not None


def aspect_ranking(aspect: Aspect, ranked: list[Chunk], abstract: list[Chunk]) -> list[Chunk]:
    """The aspect's passages in the order they are read: the paper's ``abstract`` (a one-item list,
    or empty) first for the aspects it states, then the best passage among the first SECTION_DEPTH
    whose section is named for the aspect, then the rest as ranked."""
    named = next((c for c in ranked[:SECTION_DEPTH] if named_for(aspect, c.section)), None)
    lead = ([*abstract] if aspect in ABSTRACT_LEADS else []) + ([named] if named is not None else [])
    out: dict[str, Chunk] = {}
    for c in [*lead, *ranked]:
        out.setdefault(c.id, c)
    return list(out.values())


def _aspect_passages(
    aspect: Aspect, ranked: list[Chunk], numbers: dict[str, int], chunks: dict[int, Chunk]
) -> list[ContextPassage]:
    """The aspect's best passages, pruned to its sentences, numbered once for the whole summary."""
    _, description, cues = ASPECTS[aspect]
    terms = set(key_terms(f"{description} {cues}"))
    out: list[ContextPassage] = []
    used = 0
    for chunk in ranked[:PER_ASPECT]:
        text, _ = strip_instructions(strip_placeholders(chunk.text))
        kept, _ = prune_sentences(text, terms, 1)
        kept = kept or sentences(text)[:FALLBACK_SENTENCES]
        body = " ".join(kept)
        tokens = max(1, len(body) // 4)
        if out and used + tokens > ASPECT_TOKENS:
            break
        used += tokens
        n = numbers.setdefault(chunk.id, len(numbers) + 1)
        chunks[n] = chunk
        out.append(ContextPassage(n=n, chunk=chunk, text=body, score=0.0, tokens=tokens))
    return out


def _llm_part(llm: LLM, aspect: Aspect, passages: list[ContextPassage]) -> str | None:
    """The LLM's text for an aspect, its [k] markers (1..len(passages)) turned into the summary's;
    None when the LLM finds the aspect not stated. A last sentence cut off where the reply ran out
    of tokens ("... and then directly applied in zero") is left out, and so is one that points at a
    table or figure."""
    local = [p.model_copy(update={"n": i}) for i, p in enumerate(passages, 1)]
    heading, description, _ = ASPECTS[aspect]
    user = prompts.SUMMARY_USER.format(
        passages=format_passages(local), aspect=heading.lower(), description=description
    )
    reply = ask(llm, prompts.SUMMARY_SYSTEM, user, max_tokens=ANSWER_TOKENS).strip()
    if reply.lower().strip(" .") == prompts.SUMMARY_NOT_STATED:
        return None
    text, _ = clean_citations(strip_placeholders(reply), range(1, len(local) + 1))
    text = complete_sentences(" ".join(text.split()))
    to_global = {i: p.n for i, p in enumerate(passages, 1)}

    def renumber(sentence: str) -> str:
        # Markers are rewritten from the local numbers the LLM saw to the summary's numbers.
        return CITE.sub(
            lambda m: " [" + ", ".join(str(to_global[n]) for n in cited_numbers(m.group(0))) + "]", sentence
        )

    # A sentence that points at what the reader cannot see ("The results are shown in Table [5].",
    # the table's stand-in gone) or stops where its list begins says nothing.
    said = [x for x in sentences(text) if not unfinished(strip_citations(x))]
    return " ".join(renumber(x) for x in said)


def extractive_part(
    aspect: Aspect, passages: list[ContextPassage], used: set[str] | None = None
) -> Draft | None:
    """The passages' sentences that state the aspect best, cited, in reading order; None when none
    does. A sentence scores by the aspect's phrasing (CUES) and words, more in the abstract (where a
    paper states its problem, method and results) and in better-ranked passages; a sentence that
    cited other work (a placeholder) reads worse once the citation is gone. A sentence must use the
    aspect's phrasing, and one already in ``used`` (an earlier part) is not repeated."""
    _, description, cues = ASPECTS[aspect]
    terms = set(key_terms(f"{description} {cues}"))
    scored: list[tuple[float, int, int, str]] = []
    for rank, p in enumerate(passages):
        raw = strip_instructions(p.chunk.text)[0]
        for j, sent in enumerate(sentences(raw)):
            clean = strip_placeholders(sent)
            words = clean.split()
            if not 6 <= len(words) <= 60 or unfinished(clean) or exclaims(clean) or not clean[:1].isupper():
                continue
            phrasing = len(CUES[aspect].findall(clean))
            if phrasing == 0 or (used is not None and clean in used):
                continue
            hits = phrasing + 0.5 * len(terms & set(key_terms(clean)))
            score = hits + (1.0 if p.chunk.type == "abstract" and aspect != "limits" else 0.0)
            score -= 0.3 * rank + (0.5 if has_placeholder(sent) else 0.0)
            score -= 1.5 if about_others(p.chunk.section) else 0.0
            if score > 0:
                scored.append((score, p.n, j, clean))
    if not scored:
        return None
    best = sorted(scored, key=lambda x: (-x[0], x[1], x[2]))[:EXTRACTIVE_SENTENCES]
    best.sort(key=lambda x: (x[1], x[2]))
    if used is not None:
        used.update(sent for _, _, _, sent in best)
    text = " ".join(with_marker(sent, n) for _, n, _, sent in best)
    return Draft(short_answer="", explanation=text, mode="extractive")


def write_part(
    aspect: Aspect,
    passages: list[ContextPassage],
    llm: LLM | None,
    scorer: SupportScorer,
    used: set[str] | None = None,
) -> tuple[SummaryPart, dict[int, float]]:
    """One aspect written from its passages and checked sentence by sentence; the support per cited
    passage. Without an LLM (or when it fails, or none of its sentences is supported) the part is
    the passages' best sentences for the aspect, and the part's mode and note say so. When the LLM
    reads the passages and finds the aspect not stated, the part says so."""
    heading = ASPECTS[aspect][0]
    if not passages:
        return SummaryPart(
            aspect=aspect, heading=heading, text="", mode="none", sentences=0, dropped=0,
            note="no passage of the paper was found for it",
        ), {}  # fmt: skip
    note = ""
    dropped = 0
    if llm is not None:
        text: str | None
        try:
            text = _llm_part(llm, aspect, passages)
        except Cancelled:
            raise
        except AragError as exc:
            log.warning("summary LLM failed on %s: %s", aspect, exc)
            text, note = "", f"the LLM failed ({exc.what}); sentences taken from the passages"
        if text is None:
            return SummaryPart(
                aspect=aspect, heading=heading, text="", mode="none", sentences=0, dropped=0,
                note="the LLM found it not stated in the passages",
            ), {}  # fmt: skip
        if text:
            v = verify_claims(
                Draft(short_answer="", explanation=text, mode="llm"),
                passages,
                scorer,
                "free_form",
                mark=False,
            )
            if v.supported:
                part = SummaryPart(
                    aspect=aspect, heading=heading, text=reported(v.explanation), mode="llm",
                    sentences=v.supported, dropped=v.dropped,
                )  # fmt: skip
                return part, v.support
            dropped = v.dropped
            note = (
                f"the LLM's {v.dropped} sentence(s) were not supported by the passages; "
                "sentences taken from them"
            )
        elif not note:
            note = (
                "the LLM's reply stopped before its first sentence ended; sentences taken from the passages"
            )
    draft = extractive_part(aspect, passages, used)
    if draft is None:
        return SummaryPart(
            aspect=aspect, heading=heading, text="", mode="none", sentences=0, dropped=dropped,
            note="the paper's passages do not state it",
        ), {}  # fmt: skip
    v = verify_claims(draft, passages, scorer, "free_form", mark=False)
    mode: Literal["extractive", "none"] = "extractive" if v.supported else "none"
    part = SummaryPart(
        aspect=aspect, heading=heading, text=reported(v.explanation) if v.supported else "", mode=mode,
        sentences=v.supported, dropped=dropped + v.dropped, note=note,
    )  # fmt: skip
    return part, v.support


def iter_summary(
    paper_id: str,
    title: str,
    search: PaperSearch,
    llm: LLM | None,
    scorer: SupportScorer,
    *,
    hooks: RunHooks | None = None,
) -> Iterator[NodeEvent | PaperSummary]:
    """Each step's event as it finishes (retriever, one synthesizer per aspect, verifier), then the
    summary. ``hooks`` can stop it between steps."""
    t_start = time.perf_counter()
    events: list[NodeEvent] = []

    def event(node: str, t0: float, decision: str, counts: dict[str, float]) -> NodeEvent:
        e = NodeEvent(
            node=node, ms=round(1000 * (time.perf_counter() - t0), 2), decision=decision, counts=counts
        )
        events.append(e)
        return e

    def check(where: str) -> None:
        if hooks is not None:
            hooks.check(where)

    flt = SearchFilter(paper_ids=[paper_id])
    t0 = time.perf_counter()
    numbers: dict[str, int] = {}
    chunks: dict[int, Chunk] = {}
    per_aspect: dict[Aspect, list[ContextPassage]] = {}
    # The abstract is where a paper states its problem, method, data and results: it leads those parts.
    head = [
        h.chunk for h in search.search(title, SearchFilter(paper_ids=[paper_id], types=["abstract"])).ranked
    ]
    for aspect, (_, description, _) in ASPECTS.items():
        check("retriever")
        ranked = aspect_ranking(aspect, [h.chunk for h in search.search(description, flt).ranked], head[:1])
        per_aspect[aspect] = _aspect_passages(aspect, ranked, numbers, chunks)
    yield event(
        "retriever", t0, f"{len(numbers)} passages of {paper_id} for 5 aspects",
        {"passages": len(numbers)},
    )  # fmt: skip
    parts: list[SummaryPart] = []
    support: dict[int, float] = {}
    used: set[str] = set()  # sentences already taken by an extractive part
    for aspect in ASPECTS:
        check("synthesizer")
        t0 = time.perf_counter()
        part, sup = write_part(aspect, per_aspect[aspect], llm, scorer, used)
        for n, s in sup.items():
            support[n] = max(support.get(n, 0.0), s)
        parts.append(part)
        decision = f"{aspect}: {part.mode}, {part.sentences} sentence(s)" + (
            f"; {part.note}" if part.note else ""
        )
        yield event("synthesizer", t0, decision, {"sentences": part.sentences, "dropped": part.dropped})
    t0 = time.perf_counter()
    kept = sum(p.sentences for p in parts)
    dropped = sum(p.dropped for p in parts)
    cited = sorted({n for p in parts for n in cited_numbers(p.text)})
    sources = [
        SummarySource(
            n=n,
            chunk_id=chunks[n].id,
            section=chunks[n].section,
            text=strip_placeholders(chunks[n].text),
            support=round(support.get(n, 0.0), 4),
        )
        for n in cited
    ]
    yield event(
        "verifier", t0, f"{kept} sentences supported, {dropped} dropped; {len(sources)} passages cited",
        {"supported": kept, "dropped": dropped},
    )  # fmt: skip
    yield PaperSummary(
        paper_id=paper_id,
        title=title,
        arxiv_url=arxiv_url(paper_id),
        parts=parts,
        sources=sources,
        llm=llm.name if llm is not None else "extractive (no LLM)",
        events=events,
        total_ms=round(1000 * (time.perf_counter() - t_start), 2),
    )


def summarise(
    paper_id: str,
    title: str,
    search: PaperSearch,
    llm: LLM | None,
    scorer: SupportScorer,
    *,
    on_event: Callable[[NodeEvent], None] | None = None,
) -> PaperSummary:
    """The summary of one paper; ``on_event`` sees each step."""
    for item in iter_summary(paper_id, title, search, llm, scorer):
        if isinstance(item, PaperSummary):
            return item
        if on_event is not None:
            on_event(item)
    raise AssertionError("the summary ended without a result")


def summary_text(summary: PaperSummary) -> str:
    """The parts as paragraphs: 'Problem: ... [1].' (an aspect not stated says so)."""
    return "\n\n".join(
        f"{p.heading}: {p.text}" if p.text else f"{p.heading}: not stated in the paper's passages."
        for p in summary.parts
    )


def summary_answer(question: str, summary: PaperSummary, threshold: float) -> Answer:
    """The summary as the agent's answer (for "summarise <paper>" asked as a question)."""
    by_n = {s.n: s for s in summary.sources}
    written = [p for p in summary.parts if p.text]
    modes = {p.mode for p in written}
    return Answer(
        question=question,
        short_answer=f"Summary of {summary.title}",
        text=summary_text(summary) if written else prompts.ABSTAIN,
        citations=[
            Citation(
                n=s.n,
                chunk_id=s.chunk_id,
                paper_id=summary.paper_id,
                title=summary.title,
                section=s.section,
                support=s.support,
                supported=s.support >= threshold,
            )
            for s in summary.sources
        ],  # fmt: skip
        abstained=not written,
        route="research",
        answer_type="free_form",
        mode="abstain" if not written else ("llm" if "llm" in modes else "extractive"),
        sub_queries=[ASPECTS[p.aspect][1] for p in summary.parts],
        chunks=[
            UsedChunk(
                n=n,
                chunk_id=s.chunk_id,
                paper_id=summary.paper_id,
                title=summary.title,
                section=s.section,
                score=s.support,
                query="summary",
                pass_index=0,
                text=s.text,
            )
            for n, s in by_n.items()
        ],  # fmt: skip
        dropped_claims=sum(p.dropped for p in summary.parts),
    )
