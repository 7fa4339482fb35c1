"""The agent with the real models on three papers: the packaged MiniLM embedder and the packaged
Qwen2.5-Coder 0.5B through llama.cpp (the smaller of the two shipped LLMs, to keep CI short)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arag.agent import Agent, build_agent
from arag.library.manage import build_library, load_resolver, open_for_search
from arag.llm.factory import get_llm
from arag.models.reranker import IdentityReranker
from arag.retrieval.hybrid import HybridRetriever
from arag.retrieval.pipeline import make_reranking_retriever
from arag.settings import Settings, get_settings

pytestmark = pytest.mark.real_models

ONTOLOGY = "1601.00901"  # Joint learning of ontology and semantic parser from text


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, qasper_path: Path) -> Iterator[Agent]:
    pytest.importorskip("llama_cpp")
    s: Settings = get_settings(
        data_dir=tmp_path_factory.mktemp("agent-real"),
        corpus={"paper_ids": [ONTOLOGY, "1601.01705", "1603.01913"]},
        topics={"k": 2},
        llm={"provider": "llama-cpp", "model": "qwen2.5-coder-0.5b", "context_tokens": 2048},
        agent={"support": "lexical"},
    )
    build_library(s)
    store, embedder = open_for_search(s)
    hybrid = HybridRetriever(store, embedder, s.retrieval, load_resolver(s))
    # No trained reranker in a fresh data directory: the fused order (its own tests train one).
    retriever = make_reranking_retriever(s, store, hybrid, IdentityReranker())
    yield build_agent(s, retriever, get_llm(s))
    store.close()


def test_a_question_about_a_named_paper_is_answered_with_valid_citations(agent: Agent) -> None:
    answer = agent.run(
        "What is the main finding of the paper 'Joint learning of ontology and semantic parser from text'?"
    )
    assert not answer.abstained, answer.text
    assert answer.citations and answer.mode == "llm"
    used = {c.chunk_id for c in answer.chunks}
    assert all(c.chunk_id in used and c.paper_id == ONTOLOGY for c in answer.citations)
    assert [e.node for e in answer.events][:2] == ["router", "planner"]


def test_an_off_topic_question_abstains(agent: Agent) -> None:
    answer = agent.run("What is the capital of Australia?")
    assert answer.abstained and answer.route == "research"
    assert answer.closest  # the closest papers are named instead
