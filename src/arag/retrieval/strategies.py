"""Query strategies beside the plain query, each needing an LLM (one generation per query):

- multi-query: the question rewritten into a few variants; the question and each variant get their
  own hybrid search, and the fused lists are fused again with the same RRF.
- HyDE (Gao et al., 2022): the LLM writes a hypothetical passage answering the question; the dense
  searches use that passage's vector, BM25 still reads the question.

Paper scoping follows the question as asked: when it names a paper, every variant is searched in that
paper (without the paper's name, like the question), whether or not the variant repeats the title;
when it names none, a variant is scoped only if it names a paper itself, as any query would be.
An unusable or failed LLM reply leaves the plain query alone, and the result says why.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from pydantic import BaseModel

from arag.errors import AragError, ConfigError, ModelUnavailable
from arag.llm.base import LLM, ChatMessage
from arag.records import ScoredChunk, SearchFilter
from arag.retrieval.fusion import fuse_chunks
from arag.retrieval.hybrid import HybridResult, HybridRetriever
from arag.retrieval.resolve import normalise
from arag.settings import RetrievalSettings

log = logging.getLogger(__name__)

MULTI_QUERY_SYSTEM = (
    "Rewrite a question about NLP research papers as {n} different search queries that find the "
    "passages answering it. Use the words a paper would use: synonyms, spelled-out abbreviations, "
    "related technical terms. Each query asks the same thing and stands alone. "
    'Reply with JSON: {{"queries": [...]}}.'
)
MULTI_QUERY_USER = "Question: {question}"

HYDE_SYSTEM = (
    "Write the passage of an NLP research paper that answers the question: 80 to 120 words, in the "
    "paper's own style and terms (method, data sets, metrics, numbers). If you do not know the answer, "
    "write a plausible one. Reply with the passage only, no title or preamble."
)
HYDE_USER = "Question: {question}"
HYDE_MAX_TOKENS = 200

# A rewrite longer than this is an answer or an essay, not a query.
MAX_VARIANT_CHARS = 300
# Searches run at once for one strategy call (the question and its variants, for each sub-query).
MAX_WORKERS = 8

_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")
_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"(\s*:)?')
_MARKER = re.compile(
    r"^(?:[-*•·>]+\s*|\(?\d{1,2}\s*[.):\]]\s*|(?:query|variant|rewrite)\s*\d*\s*[:.)]\s*)", re.IGNORECASE
)
_QUOTES = "\"'“”‘’`"
# A line that talks about the list instead of being one of its items.
_CHATTER = re.compile(
    r"^(?:here (?:are|is)|sure|certainly|of course|okay|ok\b|i (?:can|cannot|can't|am|'m)|as an ai|"
    r"note:|sorry)",
    re.IGNORECASE,
)


def _json_strings(text: str) -> list[str] | None:
    """The list of strings a JSON reply holds: a list, or an object's first list of strings. A reply
    cut off mid-JSON still yields its complete string values (keys dropped). None: not JSON at all."""
    text = _FENCE.sub("", text.strip()).strip()
    if not text.startswith(("{", "[")):
        # JSON after a line of prose, or inside a code fence.
        m = re.search(r"[\[{].*[\]}]", text, re.DOTALL)
        if m is None:
            return None
        text = _FENCE.sub("", m.group(0)).strip()
        try:
            value: Any = json.loads(text)
        except ValueError:
            return None
    else:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
    if isinstance(value, dict):
        value = next((v for v in value.values() if isinstance(v, list)), [])
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    out = []
    for m in _STRING.finditer(text):
        if m.group(2) is None:  # a key is followed by a colon
            try:
                out.append(json.loads(f'"{m.group(1)}"'))
            except ValueError:
                continue
    return out


def _clean(line: str) -> str:
    """A line without its list marker, markdown emphasis and surrounding quotes."""
    s = line.strip().replace("**", "").strip()
    s = _MARKER.sub("", s).strip()
    s = s.strip().rstrip(",").strip()
    if len(s) >= 2 and s[0] in _QUOTES and s[-1] in _QUOTES:
        s = s[1:-1].strip()
    return re.sub(r"\s+", " ", s)


def parse_variants(reply: str, question: str, n: int) -> tuple[list[str], str]:
    """Up to ``n`` rewrites from an LLM reply (JSON, or one per line with or without numbering or
    bullets), without empties, chatter, repeats or the question itself; and, when none is left, why."""
    items = _json_strings(reply)
    if items is None:
        items = [ln for ln in reply.splitlines() if not ln.rstrip().endswith(":")]
    seen = {normalise(question)}
    out: list[str] = []
    for item in items:
        v = _clean(item)
        key = normalise(v)
        if not key or key in seen or len(v) > MAX_VARIANT_CHARS or _CHATTER.match(v):
            continue
        seen.add(key)
        out.append(v)
    if out:
        return out[:n], ""
    shown = reply.strip().replace("\n", " ")[:80]
    return [], f"no usable rewrite in the LLM reply {shown!r}" if shown else "the LLM reply was empty"


def clean_passage(reply: str) -> str:
    """The hypothetical passage without a label, fences or surrounding quotes."""
    s = _FENCE.sub("", reply.strip()).strip()
    s = re.sub(r"^(?:hypothetical\s+)?passage\s*:\s*", "", s, flags=re.IGNORECASE)
    if len(s) >= 2 and s[0] in _QUOTES and s[-1] in _QUOTES:
        s = s[1:-1]
    return re.sub(r"\s+", " ", s).strip()


class Expanded(BaseModel):
    """One query searched under a strategy: the hybrid result the reranker sees, what the LLM wrote
    (the variants searched, or the passage), why nothing of it was used when so, and each searched
    text's own result (multi-query: the question first, then the variants)."""

    hybrid: HybridResult
    expansion: list[str] = []
    note: str = ""
    per_query: list[HybridResult] = []
    expand_ms: float = 0.0


class QueryStrategy(Protocol):
    """Searches queries in some way other than as asked."""

    name: str

    def search_many(
        self,
        hybrid: HybridRetriever,
        queries: Sequence[str],
        flt: SearchFilter | None = None,
        *,
        concurrent: bool = True,
    ) -> list[Expanded]:
        """Each query's expanded search, in query order."""
        ...


def _ask(llm: LLM, system: str, user: str, max_tokens: int, schema: dict[str, Any] | None) -> tuple[str, str]:
    """The reply's text and, when the call failed, why (an empty reply then)."""
    messages = [ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)]
    try:
        return llm.complete(messages, max_tokens=max_tokens, json_schema=schema).text, ""
    except ModelUnavailable:
        raise
    except AragError as exc:
        log.warning("query expansion failed, searching the query alone: %s", exc)
        return "", f"the LLM call failed: {exc.what}"


def search_jobs(
    hybrid: HybridRetriever,
    jobs: Sequence[tuple[str, str, SearchFilter | None]],
    *,
    concurrent: bool = True,
) -> list[HybridResult]:
    """Hybrid searches for ``(query, text to embed, filter)`` jobs: every text embedded in one batch,
    then the searches run concurrently (or in order). The query gives BM25 terms and paper scoping."""
    vectors = hybrid.embedder.embed([text for _, text, _ in jobs])

    def one(i: int) -> HybridResult:
        query, _, flt = jobs[i]
        return hybrid.search_vector(query, vectors[i], flt)

    if concurrent and len(jobs) > 1:
        workers = min(len(jobs), MAX_WORKERS)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arag-strategy") as pool:
            return list(pool.map(one, range(len(jobs))))
    return [one(i) for i in range(len(jobs))]


def _union(lists: Iterable[Sequence[ScoredChunk]]) -> list[ScoredChunk]:
    merged: dict[str, ScoredChunk] = {}
    for hits in lists:
        for h in hits:
            merged.setdefault(h.chunk.id, h)
    return list(merged.values())


def fuse_results(results: Sequence[HybridResult], settings: RetrievalSettings) -> HybridResult:
    """The question's and its variants' results as one: their fused lists fused again with RRF (same
    k, cut at ``fused_k``); scoping and query from the question's. Each search's list is the union
    over the texts, in text order (first occurrence kept), so ``found_by`` names every search that
    found a chunk for any of them. One result alone is returned as it is."""
    first = results[0]
    if len(results) == 1:
        return first
    return HybridResult(
        fused=fuse_chunks([r.fused for r in results], k=settings.rrf_k, limit=settings.fused_k),
        resolved=first.resolved,
        query=first.query,
        dense_abstracts=_union(r.dense_abstracts for r in results),
        dense_passages=_union(r.dense_passages for r in results),
        bm25=_union(r.bm25 for r in results),
    )


class MultiQuery:
    """The question and ``n`` LLM rewrites of it, each searched, fused with RRF."""

    name = "multi-query"

    def __init__(self, llm: LLM, n: int = 3) -> None:
        if n < 1:
            raise ConfigError(
                f"multi-query needs at least 1 variant, got {n}",
                where="ARAG_RETRIEVAL__VARIANTS",
                fix="set a positive number of variants (3 is the default)",
            )
        self.llm = llm
        self.n = n

    def rewrite(self, question: str) -> tuple[list[str], str, float]:
        """The question's rewrites, why there are none (if so), and the milliseconds it took."""
        t0 = time.perf_counter()
        schema = {
            "type": "object",
            "properties": {
                "queries": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": self.n}
            },
            "required": ["queries"],
        }
        reply, failed = _ask(
            self.llm,
            MULTI_QUERY_SYSTEM.format(n=self.n),
            MULTI_QUERY_USER.format(question=question),
            48 * self.n + 24,
            schema,
        )
        variants, why = parse_variants(reply, question, self.n) if not failed else ([], failed)
        return variants, why, 1000 * (time.perf_counter() - t0)

    def search_many(
        self,
        hybrid: HybridRetriever,
        queries: Sequence[str],
        flt: SearchFilter | None = None,
        *,
        concurrent: bool = True,
    ) -> list[Expanded]:
        """Every query and its variants in one embedding batch and one pool of searches; the LLM
        writes the variants one query at a time (local backends generate one reply at a time)."""
        jobs: list[tuple[str, str, SearchFilter | None]] = [(q, q, flt) for q in queries]
        plans: list[tuple[list[int], list[str], str, float]] = []
        for i, q in enumerate(queries):
            variants, why, ms = self.rewrite(q)
            # Scoping as the question's: a variant that drops (or garbles) the title is still searched
            # in the named paper, and one that keeps it is searched without it, like the question.
            scoped, vflt, resolved = hybrid.scope(q, flt)
            if resolved is not None:
                variants = [resolved.remainder(v) for v in variants]
            seen = {normalise(q), normalise(scoped)}
            texts = []
            for v in variants:
                if normalise(v) not in seen:
                    seen.add(normalise(v))
                    texts.append(v)
            idx = [i]
            for v in texts:
                idx.append(len(jobs))
                jobs.append((v, v, vflt))
            if variants and not texts:
                why = "every rewrite repeated the question"
            plans.append((idx, texts, why, ms))
        results = search_jobs(hybrid, jobs, concurrent=concurrent)
        out = []
        for idx, texts, why, ms in plans:
            mine = [results[j] for j in idx]
            out.append(
                Expanded(
                    hybrid=fuse_results(mine, hybrid.settings),
                    expansion=texts,
                    note=why,
                    per_query=mine,
                    expand_ms=ms,
                )
            )
        return out


class HyDE:
    """Dense searches with the vector of a hypothetical answer passage the LLM writes."""

    name = "hyde"

    def __init__(self, llm: LLM) -> None:
        self.llm = llm

    def passage(self, question: str) -> tuple[str, str, float]:
        """The hypothetical passage (empty when unusable), why it is empty, and the milliseconds."""
        t0 = time.perf_counter()
        reply, failed = _ask(
            self.llm, HYDE_SYSTEM, HYDE_USER.format(question=question), HYDE_MAX_TOKENS, None
        )
        text = clean_passage(reply)
        why = failed or ("" if text else "the LLM reply was empty")
        return text, why, 1000 * (time.perf_counter() - t0)

    def search_many(
        self,
        hybrid: HybridRetriever,
        queries: Sequence[str],
        flt: SearchFilter | None = None,
        *,
        concurrent: bool = True,
    ) -> list[Expanded]:
        """The passages embedded in one batch, the searches run concurrently; a query whose passage
        is unusable is searched with its own vector."""
        made = [self.passage(q) for q in queries]
        # Without a passage, the plain search: the question as scoped (without a named paper's title).
        jobs = [
            (q, text or hybrid.scope(q, flt)[0], flt) for q, (text, _, _) in zip(queries, made, strict=True)
        ]
        results = search_jobs(hybrid, jobs, concurrent=concurrent)
        return [
            Expanded(hybrid=r, expansion=[text] if text else [], note=why, expand_ms=ms)
            for r, (text, why, ms) in zip(results, made, strict=True)
        ]


def make_strategy(settings: RetrievalSettings, llm: LLM | None) -> QueryStrategy | None:
    """The strategy ``settings.strategy`` names (None for plain). Raises rather than searching plainly
    when it needs an LLM and there is none: an ablation or config must not silently mean something else."""
    if settings.strategy == "plain":
        return None
    if llm is None:
        raise ConfigError(
            f"the {settings.strategy} retrieval strategy needs an LLM, and none was given",
            where="ARAG_RETRIEVAL__STRATEGY",
            fix="set ARAG_LLM__PROVIDER to llama-cpp or openai (not extractive), "
            "or ARAG_RETRIEVAL__STRATEGY=plain",
        )
    if settings.strategy == "multi-query":
        return MultiQuery(llm, settings.variants)
    return HyDE(llm)
