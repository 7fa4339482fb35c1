"""How many of the library's papers are on a topic: "How many papers in the library are about sentiment
analysis?"

A literature answer cites the few papers that address a question best (8 at most), and its short
answer counts them ("8 papers: ..."), which, asked for a number, read as the library's count. A
question asking how many papers gets the count too: every paper whose title or abstract holds each
of the topic's terms (in any of the spellings the grader counts), found among the abstracts that
BM25 matches on any of them. The answer says which words were counted, so the number can be checked;
a paper holding the words only in its title, none in its abstract, is not found (BM25 indexes the
abstract's text).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from arag.agent.literature import focus_terms
from arag.agent.terms import held_share, term_words
from arag.records import LibraryCount, ScoredChunk
from arag.text import held_terms, tokenize

# Papers, not "articles" ("how many articles are in the dataset?" asks about a news corpus).
_COUNT = re.compile(
    r"\bhow\s+many\s+(?:[\w-]+\s+){0,2}?(?:papers|publications|studies)\b"
    r"|\b(?:number|count)\s+of\s+(?:[\w-]+\s+){0,2}?(?:papers|publications|studies)\b",
    re.IGNORECASE,
)
# The words of the count's own frame ("how many", "the number of papers").
_COUNT_WORDS = frozenset(tokenize("many number count total"))


def count_question(question: str) -> bool:
    """The question asks how many papers (of the library) are on a topic."""
    return _COUNT.search(question) is not None


def library_size_question(question: str) -> bool:
    """ "How many papers (are in the library)?": a count with no topic, of the whole library."""
    return count_question(question) and not count_terms(question)


def count_terms(question: str) -> list[str]:
    """The topic's key terms: the open question's focus terms, less the count's frame."""
    return [t for t in focus_terms(question) if t not in _COUNT_WORDS]


def papers_holding(hits: Sequence[ScoredChunk], terms: Sequence[str]) -> list[str]:
    """The ids of the papers whose title and abstract (``hits``: abstract chunks) hold every term, in
    the hits' order (a pure function)."""
    out: dict[str, None] = {}
    for h in hits:
        pid = h.chunk.paper_id
        if pid not in out and held_share(terms, held_terms(f"{h.chunk.title} {h.chunk.text}")) == 1.0:
            out[pid] = None
    return list(out)


def library_count(
    question: str, abstract_matches: Callable[[str], Sequence[ScoredChunk]]
) -> LibraryCount | None:
    """The count for a count question (None when the question has no topic term to count):
    ``abstract_matches`` gives the abstracts BM25 matches on a query of the topic's words."""
    terms = count_terms(question)
    if not terms:
        return None
    words = term_words(question)
    # One word may give two terms ("low-resource": "low", "resourc"); it is said once.
    said = list(dict.fromkeys(words.get(t, t) for t in terms))
    hits = abstract_matches(" ".join(said))
    return LibraryCount(papers=len(papers_holding(hits, terms)), words=said)


def count_sentence(count: LibraryCount) -> str:
    """ "23 papers in the library have "sentiment" and "analysis" in their title or abstract"."""
    quoted = [f'"{w}"' for w in count.words]
    words = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
    noun = "paper" if count.papers == 1 else "papers"
    verb, their = ("has", "its") if count.papers == 1 else ("have", "their")
    return f"{count.papers} {noun} in the library {verb} {words} in {their} title or abstract"
