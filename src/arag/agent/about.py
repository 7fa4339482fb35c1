"""arag's description of itself, so it can answer "what is RAG and why is it better than a plain LLM
call here?" or "how does arag work?" from what it is rather than from a model's memory."""

from __future__ import annotations

from arag.agent import prompts
from arag.agent.terms import key_terms

# (topic, text); the topic's words count when matching a question to sections.
SECTIONS: tuple[tuple[str, str], ...] = (
    (
        "what arag is, overview",
        "arag is a retrieval-augmented (RAG) research assistant over a library of AI/ML papers. It finds "
        "the passages that bear on a question, answers from those passages with numbered citations that "
        "point at the exact chunks, and says so when the library does not hold the answer. Everything "
        "runs offline on a laptop CPU.",
    ),
    (
        "the library, papers, corpus, data, QASPER",
        "The default library is QASPER (Dasigi et al., NAACL 2021): the full text of 1,585 arXiv NLP "
        "papers, licensed CC-BY 4.0. Papers are split into abstract and passage chunks of about 200 "
        "word-pieces, about 62,000 chunks in all. Your own PDFs (arag library add) and arXiv selections "
        "can be added.",
    ),
    (
        "retrieval, search, index, embeddings, BM25, reranker",
        "Each question runs three searches over one embedded Qdrant Edge index: dense search over "
        "abstracts, dense search over passages and tables (all-MiniLM-L6-v2 embeddings), and BM25 over "
        "all chunks, fused with reciprocal rank fusion. A question that names a paper, by arXiv id or "
        "title, is scoped to that paper. A cross-encoder reranker reorders the candidates and keeps at "
        "most 8 that clear score bars calibrated on QASPER.",
    ),
    (
        "the agent, pipeline, how arag works, steps",
        "A LangGraph agent routes each message (a research question, small talk, or a question about "
        "arag), splits compound questions into two or three sub-queries, retrieves for each "
        "concurrently, grades whether the evidence suffices (reranker scores, whether every sub-query "
        "found evidence, whether the question's key terms and names appear in the passages) and "
        "reformulates once if not. It prunes the context to the sentences that bear on the question "
        "within a token budget, writes a short answer above an explanation with [n] citations, and "
        "checks every claim against the passages it cites: unsupported claims are dropped, and when the "
        "core answer is unsupported arag abstains.",
    ),
    (
        "models, LLM, language model, extractive",
        "Answers are written by a local model (qwen2.5-coder-1.5b through llama.cpp by default) or by "
        "any OpenAI-compatible endpoint. Without a model, arag answers extractively: the best-supported "
        "sentences of the top passages, with citations.",
    ),
    (
        "why RAG, retrieval-augmented generation, better than a plain LLM call, hallucination",
        "RAG answers from retrieved passages instead of the model's memory. A plain LLM call answers "
        "from what the model absorbed in training: it cannot show where a claim comes from and invents "
        "details of papers it saw rarely or never. Here every claim carries a citation you can check, "
        "the answer abstains when the library lacks the evidence instead of guessing, new papers count "
        "as soon as they are added (no retraining), and the system is measured: arag eval reports "
        "evidence recall and nDCG on QASPER's questions, with confidence intervals.",
    ),
    (
        "limits, limitations, mistakes",
        "Answers are only as good as the passages found, and a small local model can misread a passage; "
        "that is why claims are verified against their citations and arag abstains rather than guess. "
        "The library knows only the papers built into it.",
    ),
)

DESCRIPTION = "\n\n".join(text for _, text in SECTIONS)


def relevant_sections(question: str, k: int = 2) -> list[str]:
    """The ``k`` sections that share most key terms with the question; the overview when none does."""
    q = set(key_terms(question))
    scored = []
    for i, (topic, text) in enumerate(SECTIONS):
        topic_terms = set(key_terms(topic))
        body_terms = set(key_terms(text))
        # Topic words weigh double: they say what the section is for.
        scored.append((2 * len(q & topic_terms) + len(q & body_terms), -i, text))
    scored.sort(reverse=True)
    picked = [text for score, _, text in scored[:k] if score > 0]
    return picked or [SECTIONS[0][1]]


def about_prompt() -> str:
    """The about route's system prompt, with the description in it."""
    return prompts.ABOUT_SYSTEM.format(description=DESCRIPTION)
