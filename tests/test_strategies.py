"""Query strategies (multi-query, HyDE): reply parsing, exact RRF fusion, paper scoping, the pipeline and
the ablation rows, on a small hash-embedder library with a scripted LLM."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from arag.errors import ConfigError, InputError, ModelError
from arag.library.manage import load_resolver, open_for_search
from arag.llm.base import ChatMessage
from arag.llm.scripted import ScriptedLLM
from arag.models.reranker import Bars, IdentityReranker
from arag.retrieval.fusion import fuse_chunks
from arag.retrieval.hybrid import HybridRetriever
from arag.retrieval.pipeline import make_reranking_retriever
from arag.retrieval.strategies import (
    HYDE_SYSTEM,
    MULTI_QUERY_SYSTEM,
    HyDE,
    MultiQuery,
    clean_passage,
    make_strategy,
    parse_variants,
)
from arag.settings import RetrievalSettings, Settings

Q = "Which datasets do they use?"

# --- parsing the rewrites ----------------------------------------------------------------------


def test_parse_numbered_lines() -> None:
    reply = "1. what corpora are used\n2) which data sets do they train on\n3: evaluation benchmarks"
    assert parse_variants(reply, Q, 3) == (
        ["what corpora are used", "which data sets do they train on", "evaluation benchmarks"],
        "",
    )


def test_parse_bullets_quotes_chatter_and_the_question_itself() -> None:
    reply = (
        "Here are three rewrites:\n"
        '- "datasets used for training"\n'
        "\n"
        "* **corpora for evaluation**\n"
        "• which datasets do they use?\n"  # the question again, in other case
        "Query 3: ‘benchmarks and data’"
    )
    assert parse_variants(reply, Q, 3) == (
        ["datasets used for training", "corpora for evaluation", "benchmarks and data"],
        "",
    )


def test_parse_json_object_list_fence_prose_and_cap() -> None:
    obj = '{"queries": ["a b", "c d", "A  b", "e f", "g h"]}'
    assert parse_variants(obj, Q, 3) == (["a b", "c d", "e f"], "")
    assert parse_variants('```json\n["x y", "z w"]\n```', Q, 3) == (["x y", "z w"], "")
    assert parse_variants('Sure! {"variants": ["one two", 3, null]}', Q, 3) == (["one two"], "")
    # Cut off mid-JSON (max_tokens): the complete strings still count, the key does not.
    assert parse_variants('{"queries": ["alpha beta", "gamma \\"delta\\"", "eps', Q, 3) == (
        ["alpha beta", 'gamma "delta"'],
        "",
    )


def test_parse_junk_gives_no_variants_and_says_why() -> None:
    assert parse_variants("", Q, 3) == ([], "the LLM reply was empty")
    for junk in ('{"queries": []}', '{"route": "research"}', "Sure:\n", Q, "x" * 400, "Sorry, I can't."):
        variants, why = parse_variants(junk, Q, 3)
        assert variants == [] and why.startswith("no usable rewrite in the LLM reply")


def test_clean_passage() -> None:
    assert clean_passage('Passage: "We train on  the Penn\nTreebank."') == "We train on the Penn Treebank."
    assert clean_passage("```\nBERT is fine-tuned.\n```") == "BERT is fine-tuned."
    assert clean_passage("  ") == ""


def test_make_strategy_needs_an_llm() -> None:
    llm = ScriptedLLM()
    assert make_strategy(RetrievalSettings(), None) is None
    assert make_strategy(RetrievalSettings(strategy="plain"), llm) is None
    mq = make_strategy(RetrievalSettings(strategy="multi-query", variants=2), llm)
    assert isinstance(mq, MultiQuery) and mq.n == 2 and mq.llm is llm
    assert isinstance(make_strategy(RetrievalSettings(strategy="hyde"), llm), HyDE)
    for name in ("multi-query", "hyde"):
        with pytest.raises(ConfigError, match=f"the {name} retrieval strategy needs an LLM") as exc:
            make_strategy(RetrievalSettings(strategy=name), None)  # type: ignore[arg-type]
        assert "ARAG_LLM__PROVIDER" in str(exc.value)
    with pytest.raises(ConfigError, match="at least 1 variant"):
        MultiQuery(llm, n=0)


# --- on a small library ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    return small_library(rerank={"provider": "none"})


class RecordingReranker:
    """A fake model that keeps the fused order and records the query it was given."""

    name = "recording"
    bars: Bars | None = None
    fusion_weight = 0.0

    def __init__(self) -> None:
        self.queries: list[str] = []

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        self.queries.append(query)
        return -np.arange(len(passages), dtype=np.float32)


def _ids_scores(hits: Sequence) -> list[tuple[str, float]]:  # type: ignore[type-arg]
    return [(h.chunk.id, h.score) for h in hits]


VARIANTS = ["semantic parsing with a grammar", "ontology learning from Wikipedia text", "parser evaluation"]
TOPICAL = "ontology semantic parser grammar Wikipedia"


def test_multi_query_fuses_the_question_and_variants_with_rrf_exactly(lib: Settings) -> None:
    llm = ScriptedLLM(["1. " + VARIANTS[0] + "\n2. " + VARIANTS[1] + "\n3. " + VARIANTS[2]])
    store, embedder = open_for_search(lib)
    batches: list[list[str]] = []
    real = embedder.embed

    def counting(texts, **kw):  # type: ignore[no-untyped-def]
        batches.append(list(texts))
        return real(texts, **kw)

    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval)
        embedder.embed = counting  # type: ignore[method-assign]
        (exp,) = MultiQuery(llm, n=3).search_many(hybrid, [TOPICAL])
        assert batches == [[TOPICAL, *VARIANTS]]  # one embedding batch for the question and variants
        embedder.embed = real  # type: ignore[method-assign]
        lists = [hybrid.search(t).fused for t in [TOPICAL, *VARIANTS]]
    finally:
        store.close()
    assert exp.expansion == VARIANTS and exp.note == "" and exp.expand_ms >= 0
    assert [_ids_scores(r.fused) for r in exp.per_query] == [_ids_scores(f) for f in lists]
    want = fuse_chunks(lists, k=lib.retrieval.rrf_k, limit=lib.retrieval.fused_k)
    assert _ids_scores(exp.hybrid.fused) == _ids_scores(want)
    assert len(want) == 25 and {h.source for h in exp.hybrid.fused} == {"fused"}
    assert exp.hybrid.query == TOPICAL and exp.hybrid.resolved is None
    # Each search's list is the union over the texts, so found_by names every search that found a chunk.
    assert {h.chunk.id for h in exp.hybrid.bm25} == {h.chunk.id for r in exp.per_query for h in r.bm25}
    (call,) = llm.calls
    assert call[0].content == MULTI_QUERY_SYSTEM.format(n=3) and call[1].content == f"Question: {TOPICAL}"


def test_multi_query_with_an_unusable_or_failed_reply_is_the_plain_search(lib: Settings) -> None:
    def fails(messages: Sequence[ChatMessage]) -> str:
        raise ModelError("llama.cpp generation failed: boom", where="test")

    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval)
        plain = hybrid.search(TOPICAL)
        junk, failed = MultiQuery(ScriptedLLM(["Sorry, I can't.", fails])).search_many(
            hybrid, [TOPICAL, TOPICAL], concurrent=False
        )
    finally:
        store.close()
    for exp in (junk, failed):
        assert exp.expansion == [] and _ids_scores(exp.hybrid.fused) == _ids_scores(plain.fused)
    assert junk.note.startswith("no usable rewrite")
    assert failed.note.startswith("the LLM call failed: llama.cpp")


def test_multi_query_variants_stay_in_the_named_paper(lib: Settings) -> None:
    resolver = load_resolver(lib)
    pid = "1601.01705"
    title = resolver.titles[pid]
    question = f"In the paper '{title}': which datasets do they use?"
    variants = ["what corpora are used for training", f"which data sets does {title} evaluate on"]
    llm = ScriptedLLM([json.dumps({"queries": variants})])
    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval, resolver)
        (exp,) = MultiQuery(llm).search_many(hybrid, [question])
        # Searched on its own, the variant without the title ranges over the library.
        alone = hybrid.search(variants[0])
    finally:
        store.close()
    assert alone.resolved is None and len({h.chunk.paper_id for h in alone.fused}) > 1
    assert exp.hybrid.resolved is not None and exp.hybrid.resolved.paper_id == pid
    assert exp.per_query[0].resolved is not None and exp.per_query[0].query == "which datasets do they use?"
    # The variant that repeated the title is searched without it, like the question.
    assert exp.expansion == ["what corpora are used for training", "which data sets does evaluate on"]
    assert [r.query for r in exp.per_query[1:]] == exp.expansion
    for r in exp.per_query:
        assert r.fused and {h.chunk.paper_id for h in r.fused} == {pid}
    assert {h.chunk.paper_id for h in exp.hybrid.fused} == {pid}


def _a_passage_chunk(hybrid: HybridRetriever, question: str):  # type: ignore[no-untyped-def]
    """A passage the question's own dense search does not put first."""
    plain = hybrid.search(question)
    top = plain.dense_passages[0].chunk.id
    return plain, next(
        h.chunk
        for h in plain.dense_passages[3:]
        if h.chunk.type == "passage" and not h.chunk.embed_parts and h.chunk.id != top
    )


def test_hyde_searches_dense_with_the_passage_and_bm25_with_the_question(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval)
        plain, chunk = _a_passage_chunk(hybrid, TOPICAL)
        llm = ScriptedLLM([chunk.embed_text])
        (exp,) = HyDE(llm).search_many(hybrid, [TOPICAL])
    finally:
        store.close()
    r = exp.hybrid
    assert plain.dense_passages[0].chunk.id != chunk.id
    assert r.dense_passages[0].chunk.id == chunk.id and r.dense_passages[0].score > 0.99
    assert _ids_scores(r.bm25) == _ids_scores(plain.bm25) and r.query == TOPICAL
    assert exp.expansion == [clean_passage(chunk.embed_text)] and exp.note == ""
    (call,) = llm.calls
    assert call[0].content == HYDE_SYSTEM and call[1].content == f"Question: {TOPICAL}"


def test_hyde_scopes_on_the_question_and_falls_back_on_an_empty_passage(lib: Settings) -> None:
    resolver = load_resolver(lib)
    pid = "1601.01705"
    question = f"In the paper '{resolver.titles[pid]}': which datasets do they use?"
    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval, resolver)
        plain = hybrid.search(question)
        _, elsewhere = _a_passage_chunk(HybridRetriever(store, embedder, lib.retrieval), TOPICAL)
        assert elsewhere.paper_id != pid
        scoped, empty = HyDE(ScriptedLLM([elsewhere.embed_text, "  "])).search_many(
            hybrid, [question, question]
        )
    finally:
        store.close()
    # A passage that reads like another paper still searches only the named paper.
    assert scoped.hybrid.resolved is not None and scoped.hybrid.resolved.paper_id == pid
    assert {h.chunk.paper_id for h in scoped.hybrid.fused} == {pid}
    assert _ids_scores(scoped.hybrid.bm25) == _ids_scores(plain.bm25)
    assert empty.expansion == [] and empty.note == "the LLM reply was empty"
    assert _ids_scores(empty.hybrid.fused) == _ids_scores(plain.fused)


def _with_strategy(s: Settings, strategy: str) -> Settings:
    return s.model_copy(update={"retrieval": s.retrieval.model_copy(update={"strategy": strategy})})


def test_retriever_expands_but_reranks_the_question(lib: Settings) -> None:
    resolver = load_resolver(lib)
    question = f"In the paper '{resolver.titles['1601.01705']}': which datasets do they use?"
    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval, resolver)
        mq = _with_strategy(lib, "multi-query")
        model = RecordingReranker()
        llm = ScriptedLLM(default=json.dumps({"queries": VARIANTS}))
        retriever = make_reranking_retriever(mq, store, hybrid, model, llm)
        one = retriever.search(question)
        many = retriever.search_many([question, TOPICAL])
        hy = _with_strategy(lib, "hyde")
        hyde = make_reranking_retriever(
            hy, store, hybrid, model, ScriptedLLM(default="A passage on datasets.")
        )
        passage = hyde.search(question)
        with pytest.raises(ConfigError, match="the hyde retrieval strategy needs an LLM"):
            make_reranking_retriever(hy, store, hybrid, IdentityReranker())
    finally:
        store.close()
    assert model.queries == [question, question, TOPICAL, question]
    assert one.expansion == VARIANTS and set(one.timings) == {"expand", "search", "rerank"}
    assert [c.chunk.id for c in one.ranked] == [h.chunk.id for h in one.hybrid.fused]
    assert [r.expansion for r in many] == [VARIANTS, VARIANTS] and len(llm.calls) == 3
    assert passage.expansion == ["A passage on datasets."] and passage.expansion_note == ""


def test_eval_retrieval_strategy_rows(
    lib: Settings, shared_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import arag.cli.eval as eval_cli
    from arag.cli.main import app
    from arag.library.manage import list_papers

    ids = {r.id for r in list_papers(lib)}
    train = json.loads((shared_dir / "benchmarks" / "qasper" / "questions_train.json").read_text())
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps([q for q in train if q["paper_id"] in ids][:3]))
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_RERANK__PROVIDER", "none")

    def reply(messages: Sequence[ChatMessage]) -> str:
        if messages[0].content.startswith("Rewrite"):
            return json.dumps({"queries": ["datasets used", "evaluation corpora"]})
        return "We evaluate on the Penn Treebank and report accuracy."

    llm = ScriptedLLM(default=reply)
    monkeypatch.setattr(eval_cli, "_make_llm", lambda settings: llm)
    out = tmp_path / "r.json"
    args = ["eval", "retrieval", "--questions", str(qfile), "--scope", "library", "--json", str(out)]
    res = CliRunner().invoke(app, [*args, "--methods", "hybrid+resolve,+multi-query,+hyde"])
    assert res.exit_code == 0, res.output
    reports = json.loads(out.read_text())
    assert [(r["scope"], r["method"]) for r in reports] == [
        ("library", "hybrid+resolve"),
        ("library", "+multi-query"),
        ("library", "+hyde"),
    ]
    n = reports[0]["questions"]
    assert n >= 1 and len(llm.calls) == 2 * n  # one generation per question per strategy
    for r in reports:
        assert r["questions"] == n and 0.0 <= r["metrics"]["recall@10"]["mean"] <= 1.0

    # With the extractive provider (no LLM) the strategy rows are refused before anything runs.
    monkeypatch.setenv("ARAG_LLM__PROVIDER", "extractive")
    bad = CliRunner().invoke(app, [*args, "--methods", "hybrid,+hyde"])
    assert bad.exit_code == InputError.exit_code and "need an LLM" in bad.output
    assert len(llm.calls) == 2 * n
