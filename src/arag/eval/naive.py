"""The naive RAG baseline: the top 5 dense chunks of the query, whole, straight into one prompt to the
same LLM. No routing, planning, BM25, fusion, reranking, grading, retry, pruning or verification, as in
the seed projects' baselines. Its reply is parsed like the agent's (short answer, explanation) and its
short answer normalised by the same rules (Yes/No, "not in the library"), so the comparison measures
the pipeline rather than output formatting; its [n] markers are left as the model wrote them."""

from __future__ import annotations

import time

from arag.agent import prompts
from arag.agent.answer_type import detect_answer_type, normalize_short_answer
from arag.agent.deps import ask
from arag.agent.synthesizer import parse_reply
from arag.agent.terms import cited_numbers
from arag.index.store import Store
from arag.llm.base import LLM
from arag.models.embedder import BaseEmbedder
from arag.records import Answer, Chunk, Citation, NodeEvent, ScoredChunk, SearchFilter, UsedChunk

NAIVE_K = 5
# Starts differently from the agent's prompts, so a scripted test LLM can tell them apart.
NAIVE_SYSTEM = (
    "Answer a question about research papers from the numbered passages below and nothing else. "
    "Cite the passage number in brackets after each sentence, like [1]. If the passages do not contain "
    "the answer, the short answer is: not in the library."
)
NAIVE_USER = (
    "Passages:\n{passages}\n\nQuestion: {question}\n\n"
    "Write exactly two lines:\n"
    "Short answer: <Yes or No for a yes/no question; otherwise the exact words from a passage, or a "
    "short phrase>\n"
    "Explanation: <one to three sentences, each ending with its passage number in brackets>"
)


def format_chunks(chunks: list[ScoredChunk]) -> str:
    """The chunks numbered [1..k], each under its title and section, in full."""
    out = []
    for i, h in enumerate(chunks, 1):
        c = h.chunk
        section = f" — {c.section}" if c.section else ""
        out.append(f"[{i}] {c.title}{section}\n{c.text}")
    return "\n\n".join(out)


class NaiveRAG:
    """Dense top-k retrieval and one LLM call."""

    def __init__(
        self,
        store: Store,
        embedder: BaseEmbedder,
        llm: LLM,
        *,
        k: int = NAIVE_K,
        max_answer_tokens: int = 320,
        book: dict[str, Chunk] | None = None,
    ) -> None:
        """``book``: where every retrieved chunk is kept by id (the evaluation scores cited chunks)."""
        self.store = store
        self.embedder = embedder
        self.llm = llm
        self.k = k
        self.max_answer_tokens = max_answer_tokens
        self.book = book if book is not None else {}

    def retrieve(self, query: str, flt: SearchFilter | None = None) -> list[ScoredChunk]:
        """The top ``k`` chunks by dense similarity to the query (any chunk type)."""
        return self.store.dense_search(self.embedder.embed_query(query), self.k, flt)

    def run(self, question: str, flt: SearchFilter | None = None) -> Answer:
        """Retrieve, prompt once, parse: an ``Answer`` with two timed steps (retrieve, generate)."""
        t0 = time.perf_counter()
        chunks = self.retrieve(question, flt)
        self.book.update({h.chunk.id: h.chunk for h in chunks})
        t1 = time.perf_counter()
        user = NAIVE_USER.format(passages=format_chunks(chunks), question=question)
        raw = ask(self.llm, NAIVE_SYSTEM, user, max_tokens=self.max_answer_tokens)
        t2 = time.perf_counter()
        answer_type = detect_answer_type(question)
        short_raw, explanation = parse_reply(raw)
        short = normalize_short_answer(short_raw, answer_type)
        abstained = short == prompts.NOT_IN_LIBRARY
        numbered = {i: h.chunk for i, h in enumerate(chunks, 1)}
        citations = [
            Citation(
                n=n,
                chunk_id=c.id,
                paper_id=c.paper_id,
                title=c.title,
                section=c.section,
                support=0.0,  # not verified: the baseline has no verifier
                supported=False,
            )
            for n in cited_numbers(explanation)
            if (c := numbered.get(n)) is not None
        ]
        events = [
            NodeEvent(
                node="retrieve",
                ms=round(1000 * (t1 - t0), 2),
                decision=f"dense top {self.k}: {len(chunks)} chunks",
                counts={"chunks": len(chunks)},
            ),
            NodeEvent(
                node="generate",
                ms=round(1000 * (t2 - t1), 2),
                decision=f"llm; short answer {short!r}",
                counts={"citations": len(citations)},
            ),
        ]
        return Answer(
            question=question,
            short_answer=short,
            text=explanation,
            citations=citations,
            abstained=abstained,
            route="research",
            answer_type=answer_type,
            mode="abstain" if abstained else "llm",
            sub_queries=[question],
            chunks=[
                UsedChunk(
                    n=i,
                    chunk_id=h.chunk.id,
                    paper_id=h.chunk.paper_id,
                    title=h.chunk.title,
                    section=h.chunk.section,
                    score=round(h.score, 4),
                    query=question,
                    pass_index=0,
                )
                for i, h in enumerate(chunks, 1)
            ],
            timings={e.node: e.ms for e in events},
            events=events,
            total_ms=round(1000 * (time.perf_counter() - t0), 2),
        )
