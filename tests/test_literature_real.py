"""The literature answer with the real models on six papers (five on sarcasm and irony, one other): the
packaged MiniLM embedder, the fused order (no trained reranker in a fresh data directory) and the
packaged Qwen2.5-Coder 0.5B writing the overview."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arag.agent import Agent, build_agent
from arag.agent.terms import cited_numbers
from arag.library.manage import build_library, load_resolver, open_for_search
from arag.llm.factory import get_llm
from arag.models.reranker import IdentityReranker
from arag.retrieval.hybrid import HybridRetriever
from arag.retrieval.pipeline import make_reranking_retriever
from arag.settings import Settings, get_settings

pytestmark = pytest.mark.real_models

SARCASM = ["1709.05404", "1804.00520", "1804.08094", "1809.09795", "1904.04019"]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, qasper_path: Path) -> Iterator[Agent]:
    pytest.importorskip("llama_cpp")
    s: Settings = get_settings(
        data_dir=tmp_path_factory.mktemp("literature-real"),
        corpus={"paper_ids": [*SARCASM, "1601.00901"]},
        topics={"k": 2},
        llm={"provider": "llama-cpp", "model": "qwen2.5-coder-0.5b", "context_tokens": 2048},
        agent={"support": "lexical"},
    )
    build_library(s)
    store, embedder = open_for_search(s)
    hybrid = HybridRetriever(store, embedder, s.retrieval, load_resolver(s))
    yield build_agent(s, make_reranking_retriever(s, store, hybrid, IdentityReranker()), get_llm(s))
    store.close()


def test_an_open_question_gets_a_cited_overview_of_several_papers(agent: Agent) -> None:
    a = agent.run("How do models recognise sarcasm and irony in text?")
    assert a.form == "literature" and not a.abstained, a.text
    cited = {c.paper_id for c in a.citations}
    assert len(cited) >= 3 and cited <= set(SARCASM)
    numbered = {c.n: c.chunk_id for c in a.chunks if c.n is not None}
    assert set(cited_numbers(a.text)) == {c.n for c in a.citations} <= set(numbered)
    assert all(c.supported and numbered[c.n] == c.chunk_id for c in a.citations)
    assert all(p.url == f"https://arxiv.org/abs/{p.paper_id}" for p in a.papers)


def test_an_off_library_question_is_declined(agent: Agent) -> None:
    a = agent.run("How do I bake sourdough bread?")
    assert a.abstained and a.citations == []
