"""The disk cache of LLM calls: keys, hits, streams, and the agent's marks on cached steps."""

from __future__ import annotations

from pathlib import Path

from arag.llm.base import LLM, ChatMessage
from arag.llm.cache import CachedLLM, cache_hits
from arag.llm.factory import with_cache
from arag.llm.scripted import ScriptedLLM
from arag.settings import get_settings

MSGS = [
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Capital of France?"),
]


def cached(tmp_path: Path, inner: ScriptedLLM, **params: object) -> CachedLLM:
    return CachedLLM(
        inner, tmp_path / "llm.sqlite3", backend="llama-cpp", params={"temperature": 0.0, **params}
    )


def test_the_same_call_is_answered_from_disk(tmp_path: Path) -> None:
    inner = ScriptedLLM(["Paris", "Lyon", "Nice"])
    llm = cached(tmp_path, inner)
    assert isinstance(llm, LLM)
    first = llm.complete(MSGS, max_tokens=8)
    before = cache_hits()
    again = llm.complete(MSGS, max_tokens=8)
    assert (first.text, first.cached) == ("Paris", False) and (again.text, again.cached) == ("Paris", True)
    assert cache_hits() == before + 1 and len(inner.calls) == 1
    # Other call arguments are other keys.
    assert llm.complete(MSGS, max_tokens=9).text == "Lyon"
    assert llm.complete(MSGS, max_tokens=8, json_schema={"type": "object"}).text == "Nice"
    # A new process (a new wrapper on the same file) finds the stored reply.
    other = cached(tmp_path, ScriptedLLM([]))
    assert other.complete(MSGS, max_tokens=8).text == "Paris"


def test_keys_hold_backend_model_and_reply_settings(tmp_path: Path) -> None:
    a = cached(tmp_path, ScriptedLLM(["x"], name="m1"))
    keys = {
        a.key(MSGS, max_tokens=8),
        cached(tmp_path, ScriptedLLM([], name="m2")).key(MSGS, max_tokens=8),
        cached(tmp_path, ScriptedLLM([], name="m1"), temperature=0.7).key(MSGS, max_tokens=8),
        CachedLLM(
            ScriptedLLM([], name="m1"), tmp_path / "c.db", backend="openai", params={"temperature": 0.0}
        ).key(MSGS, max_tokens=8),
    }
    assert len(keys) == 4 and a.key(MSGS, max_tokens=8) == a.key(list(MSGS), max_tokens=8)


def test_streams_are_stored_when_they_finish_only(tmp_path: Path) -> None:
    inner = ScriptedLLM(["The capital is Paris.", "The capital is Paris."])
    llm = cached(tmp_path, inner)
    gen = llm.stream(MSGS, max_tokens=8)
    next(gen)
    gen.close()  # the client went away: nothing is stored
    assert "".join(llm.stream(MSGS, max_tokens=8)) == "The capital is Paris."
    assert len(inner.calls) == 2
    before = cache_hits()
    assert list(llm.stream(MSGS, max_tokens=8)) == ["The capital is Paris."]  # one piece from disk
    assert llm.complete(MSGS, max_tokens=8).cached and cache_hits() == before + 2


def test_the_factory_wraps_unless_told_not_to(tmp_path: Path) -> None:
    llm = ScriptedLLM([])
    on = with_cache(llm, get_settings(data_dir=tmp_path))
    assert isinstance(on, CachedLLM) and on.path == tmp_path / "cache" / "llm.sqlite3" and on.name == llm.name
    assert with_cache(llm, get_settings(data_dir=tmp_path, llm={"cache": False})) is llm


def test_a_reply_belongs_to_the_llama_cpp_build_that_wrote_it(tmp_path: Path) -> None:
    """The AVX-512 build's kernels round differently from the portable one's: its replies are kept
    apart; the portable build keeps the keys written before builds were chosen."""
    settings = get_settings(data_dir=tmp_path)
    plain, portable, avx512 = (
        with_cache(ScriptedLLM([]), settings, build=b) for b in (None, "portable", "avx512")
    )
    assert isinstance(plain, CachedLLM) and isinstance(portable, CachedLLM) and isinstance(avx512, CachedLLM)
    assert plain.key(MSGS, max_tokens=8) == portable.key(MSGS, max_tokens=8)
    assert avx512.key(MSGS, max_tokens=8) != portable.key(MSGS, max_tokens=8)


def test_the_agent_marks_steps_answered_from_the_cache(tmp_path: Path) -> None:
    from arag.agent.graph import build_agent
    from arag.records import Chunk, RankedChunk
    from arag.retrieval.hybrid import HybridResult
    from arag.retrieval.pipeline import SearchResult

    chunk = Chunk(id="p:0000:aa", paper_id="p", index=0, title="Ontology induction", section="Method",
                  text="The ontology is induced from text by clustering predicates.", type="passage",
                  embed_text="x", n_tokens=12)  # fmt: skip
    hit = RankedChunk(chunk=chunk, score=2.0, fused_rank=1, fused_score=0.1, rerank_score=2.0)

    class OneChunk:
        def search_many(self, queries, flt=None, *, concurrent=True):  # type: ignore[no-untyped-def]
            hyb = HybridResult(fused=[hit], dense_abstracts=[], dense_passages=[hit], bm25=[hit])
            return [
                SearchResult(hybrid=hyb, ranked=[hit], kept=[hit], model="none", timings={}) for _ in queries
            ]

    reply = (
        "Short answer: by clustering predicates [1]\n"
        "Explanation: The ontology is induced by clustering predicates [1]."
    )
    inner = ScriptedLLM([], default=lambda m: reply if "Passages:" in m[-1].content else "{}")
    settings = get_settings(data_dir=tmp_path, agent={"support": "lexical"})
    agent = build_agent(settings, OneChunk(), with_cache(inner, settings))
    first = agent.run("How is the ontology induced from text?")
    second = agent.run("How is the ontology induced from text?")
    assert first.llm_cached_calls == 0 and second.llm_cached_calls >= 1
    assert second.text == first.text and second.short_answer == first.short_answer
    synth = next(e for e in second.events if e.node == "synthesizer")
    assert synth.counts["llm_cached"] == 1
    assert "llm_cached" not in next(e for e in first.events if e.node == "synthesizer").counts


def test_next_token_scores_are_cached_beside_the_replies(tmp_path: Path) -> None:
    from arag.llm.base import NextToken, next_token

    calls: list[int] = []

    def score(messages: object) -> NextToken:
        calls.append(1)
        return NextToken(probs={" not": 0.25}, top=[(" yes", 0.5), (" not", 0.25)], entropy=1.2)

    llm = cached(tmp_path, ScriptedLLM([], next_tokens=score))
    first = next_token(llm, MSGS, "Short answer:", [" not"])
    before = cache_hits()
    again = next_token(llm, MSGS, "Short answer:", [" not"])
    assert first == again and again is not None and again.probs == {" not": 0.25}
    assert len(calls) == 1 and cache_hits() == before + 1
    # Another prefix is another key; a backend that cannot tell stores nothing and says None.
    next_token(llm, MSGS, "Answer:", [" not"])
    assert len(calls) == 2
    blind = cached(tmp_path / "b", ScriptedLLM([]))
    assert next_token(blind, MSGS, "Short answer:", [" not"]) is None
    assert next_token(object(), MSGS, "x", []) is None
