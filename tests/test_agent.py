"""The agent's whole graph: on a small hash-embedder library (6 QASPER papers, no reranking model), with
no LLM (extractive) and with a scripted LLM whose replies are functions of the prompt, and on a fake
retriever for the retry."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import pytest

from arag.agent import Agent, LexicalSupport, build_agent, prompts
from arag.agent.deps import AgentDeps
from arag.agent.graph import NODES
from arag.errors import InputError
from arag.ingest.chunker import ABSTRACT_SECTION
from arag.library.manage import load_resolver, open_for_search
from arag.llm.base import ChatMessage
from arag.llm.scripted import ScriptedLLM
from arag.models.reranker import IdentityReranker
from arag.records import Answer, Chunk, NodeEvent, RankedChunk, SearchFilter
from arag.retrieval.hybrid import HybridResult, HybridRetriever
from arag.retrieval.pipeline import Retriever, SearchResult, make_reranking_retriever
from arag.settings import AgentSettings, Settings

RESEARCH_PATH = ["router", "planner", "retriever", "grader", "context", "synthesizer", "verifier"]
RETRY_PATH = ["router", "planner", "retriever", "grader", "reformulator", "retriever", "grader"]
RETRY_PATH += ["context", "synthesizer", "verifier"]
COMPOSE = "1601.01705"  # Learning to Compose Neural Networks for Question Answering
ONTOLOGY = "1601.00901"  # Joint learning of ontology and semantic parser from text


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    return small_library(rerank={"provider": "none"}, llm={"provider": "extractive"})


@pytest.fixture(scope="module")
def retriever(lib: Settings) -> Iterator[Retriever]:
    store, embedder = open_for_search(lib)
    hybrid = HybridRetriever(store, embedder, lib.retrieval, load_resolver(lib))
    yield make_reranking_retriever(lib, store, hybrid, IdentityReranker())
    store.close()


@pytest.fixture(scope="module")
def extractive(lib: Settings, retriever: Retriever) -> Agent:
    return build_agent(lib, retriever, None)


def _nodes(a: Answer) -> list[str]:
    return [e.node for e in a.events]


def _valid_citations(a: Answer) -> None:
    """Every [n] of the text names a citation, and every citation a chunk of the context."""
    numbers = {int(n) for group in re.findall(r"\[(\d+(?:, \d+)*)\]", a.text) for n in group.split(", ")}
    assert numbers == {c.n for c in a.citations}
    in_context = {c.n: c.chunk_id for c in a.chunks if c.n is not None}
    for c in a.citations:
        assert in_context[c.n] == c.chunk_id and c.supported


# --- no LLM: rules and extractive answers ------------------------------------------------------


def test_extractive_end_to_end(extractive: Agent) -> None:
    seen: list[NodeEvent] = []
    a = extractive.run("How is the ontology induced from text?", on_event=seen.append)
    assert a.route == "research" and a.mode == "extractive" and not a.abstained
    assert a.answer_type == "free_form" and a.sub_queries == ["How is the ontology induced from text?"]
    assert a.short_answer and a.text and a.citations and a.retries == 0
    assert {c.paper_id for c in a.citations} == {ONTOLOGY}
    _valid_citations(a)
    # Events: every node on the path, in order, timed; the callback saw the same ones.
    assert _nodes(a) == RESEARCH_PATH and seen == a.events
    assert all(e.decision for e in a.events)
    # Each step is timed inside the run: the steps' times add up to at most the run's, and the
    # retriever (an embedding and three searches) takes measurable time.
    assert {e.node: e.ms for e in a.events}["retriever"] > 0
    assert sum(e.ms for e in a.events) * 0.5 <= a.total_ms and sum(e.ms for e in a.events) <= a.total_ms
    assert set(a.timings) == set(RESEARCH_PATH)
    assert a.events[1].decision == "simple: 1 sub-query (rules); answer type free_form"
    assert a.events[3].decision.startswith("sufficient")


def test_off_topic_question_abstains_after_exactly_one_retry(extractive: Agent) -> None:
    q = "What is the best pizza recipe in Naples?"
    a = extractive.run(q)
    assert a.abstained and a.mode == "abstain" and a.short_answer == "not in the library"
    assert a.text.startswith("I don't have enough information in the library to answer this.")
    # The closest papers, by title and id.
    assert len(a.closest) == 3
    for p in a.closest:
        assert f"- {p.title} ({p.paper_id})" in a.text
    assert a.citations == []
    # One retry: both passes' queries and chunks are kept (the reducers concatenate).
    assert _nodes(a) == RETRY_PATH and a.retries == 1
    assert a.sub_queries == [q, "pizza recipe Naples best"]
    assert {c.pass_index for c in a.chunks} == {0, 1}
    # An open question: every paper of the library ranked (6), its best 2 passages as evidence, and
    # its abstract after them when they are not it.
    first = [c for c in a.chunks if c.pass_index == 0]
    assert {c.query for c in first} == {q}
    per_paper = Counter(c.paper_id for c in first)
    assert len(per_paper) == 6 and set(per_paper.values()) <= {2, 3}
    with_abstract = {c.paper_id for c in first if c.section == ABSTRACT_SECTION}
    assert {pid for pid, n in per_paper.items() if n == 3} <= with_abstract and 3 in per_paper.values()
    assert len({c.chunk_id for c in a.chunks}) == len(a.chunks)
    assert a.events[4].decision == "1 new query (rules): pizza recipe Naples best"


def test_yes_no_question_gets_a_yes_no_short_answer(extractive: Agent) -> None:
    a = extractive.run("Do they use Wikipedia for the semantic parser?")
    assert a.answer_type == "yes_no" and a.short_answer in ("Yes", "No") and not a.abstained
    _valid_citations(a)


def test_compound_question_retrieves_each_part(extractive: Agent) -> None:
    a = extractive.run("Compare the ontology induction and the paraphrase generation")
    assert a.sub_queries == ["the ontology induction", "the paraphrase generation"]
    assert {c.query for c in a.chunks} == set(a.sub_queries)
    # Deduplicated by chunk id across sub-queries; both papers reach the answer.
    assert len({c.chunk_id for c in a.chunks}) == len(a.chunks)
    assert {ONTOLOGY, "1601.06068"} <= {c.paper_id for c in a.citations}
    _valid_citations(a)


def test_question_naming_a_paper_is_answered_from_it(extractive: Agent) -> None:
    title = "Learning to Compose Neural Networks for Question Answering"
    a = extractive.run(f"In the paper '{title}': what do the modules compute?")
    assert {c.paper_id for c in a.chunks} == {COMPOSE}
    assert "scoped to " + COMPOSE in a.events[2].decision
    assert not a.abstained and {c.paper_id for c in a.citations} == {COMPOSE}


def test_filter_scopes_the_search(extractive: Agent) -> None:
    a = extractive.run("How are the networks assembled?", flt=SearchFilter(paper_ids=[COMPOSE]))
    assert {c.paper_id for c in a.chunks} == {COMPOSE}


def test_direct_and_about_routes_skip_retrieval(extractive: Agent) -> None:
    hi = extractive.run("hello!")
    assert (hi.route, hi.mode, hi.text, _nodes(hi)) == (
        "direct",
        "direct",
        prompts.GREETING_REPLY,
        ["router", "direct"],
    )
    calc = extractive.run("what is 12*7")
    assert calc.short_answer == "84" and calc.chunks == []
    about = extractive.run("What is RAG and why is it better than a plain LLM call here?")
    assert about.route == "about" and _nodes(about) == ["router", "about"] and "citation" in about.text


def test_stream_yields_events_then_the_answer(extractive: Agent) -> None:
    items = list(extractive.stream("How is the ontology induced from text?"))
    assert all(isinstance(i, NodeEvent) for i in items[:-1]) and isinstance(items[-1], Answer)
    assert [i.node for i in items[:-1]] == RESEARCH_PATH  # type: ignore[union-attr]


def test_the_compiled_graph_is_reused_across_threads(extractive: Agent) -> None:
    graph = extractive.graph
    questions = ["How is the ontology induced from text?", "How are the networks assembled?"]
    out: dict[str, Answer] = {}

    def ask(q: str) -> None:
        out[q] = extractive.run(q)

    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert extractive.graph is graph
    for q in questions:
        assert out[q].question == q and out[q].sub_queries == [q]


def test_empty_question_is_an_input_error(extractive: Agent) -> None:
    with pytest.raises(InputError, match="empty"):
        extractive.run("   ")


# --- a scripted LLM whose replies are functions of the prompt -----------------------------------


def _passage(user: str, n: int) -> str:
    """The text of passage [n] in a synthesis prompt."""
    m = re.search(rf"^\[{n}\] [^\n]*\n(.*?)(?:\n\n\[\d+\] |\n\nQuestion:)", user, re.S | re.M)
    assert m, user
    return m.group(1)


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=\.)\s", text.replace("… ", ""))[0].rstrip(".")


def scripted(synth: str = "good", judge: bool = True) -> ScriptedLLM:
    """Replies by prompt kind. ``synth``: good (a supported first claim, an invented one citing [2] and an
    invalid [9]), or bad (an invented core claim)."""

    def reply(messages: Sequence[ChatMessage]) -> str:
        system, user = messages[0].content, messages[-1].content
        if system == prompts.ROUTER_SYSTEM:
            return '{"route": "research"}'
        if system == prompts.PLANNER_SYSTEM:
            return '{"kind": "simple", "sub_queries": []}'
        if system == prompts.GRADER_SYSTEM:
            return '{"sufficient": true}'
        if system == prompts.REFORMULATOR_SYSTEM:
            return '{"queries": ["ontology learning"]}'
        if system == prompts.JUDGE_SYSTEM:
            return "no" if "quokka" in user.lower() else "yes"
        if system == prompts.SYNTH_SYSTEM:
            first = _first_sentence(_passage(user, 1))
            if synth == "bad":
                return "Short answer: quokkas\nExplanation: Quokkas induce the ontology by hand in Perth [1]."
            return (
                f"Short answer: {first.split()[0]} [1]\n"
                f"Explanation: {first} [1][9]. Quokkas annotated every sentence by hand in Perth [2]."
            )
        raise AssertionError(f"unexpected prompt: {system[:60]}")

    return ScriptedLLM([], default=reply)


def test_llm_end_to_end_removes_invalid_citations_and_unsupported_claims(
    lib: Settings, retriever: Retriever
) -> None:
    llm = scripted()
    settings = lib.model_copy(update={"llm": lib.llm.model_copy(update={"provider": "llama-cpp"})})
    agent = build_agent(settings, retriever, llm)
    # Scoped to the paper: the one-answer synthesis (an open question gets a literature answer).
    a = agent.run("How is the ontology induced from text?", flt=SearchFilter(paper_ids=[ONTOLOGY]))
    assert a.mode == "llm" and not a.abstained
    assert a.removed_citations == 1 and a.dropped_claims == 1
    assert "[9]" not in a.text and "Quokkas" not in a.text
    assert [c.n for c in a.citations] == [1]
    _valid_citations(a)
    assert _nodes(a) == RESEARCH_PATH
    # A local model: no LLM grader or judge; the synthesizer is the one call (the planner's only on
    # compound-looking questions).
    kinds = [m[0].content for m in llm.calls]
    assert kinds == [prompts.SYNTH_SYSTEM]
    assert isinstance(agent.deps.support, LexicalSupport)


def test_llm_core_answer_unsupported_abstains(lib: Settings, retriever: Retriever) -> None:
    agent = build_agent(
        lib.model_copy(update={"llm": lib.llm.model_copy(update={"provider": "llama-cpp"})}),
        retriever,
        scripted("bad"),
    )
    a = agent.run("How is the ontology induced from text?", flt=SearchFilter(paper_ids=[ONTOLOGY]))
    assert a.abstained and a.short_answer == "not in the library" and a.citations == []
    assert a.events[-1].decision == "abstain: the core claim is not supported by its passages"
    assert a.closest and a.closest[0].paper_id in a.text


def test_hosted_llm_checks_with_grader_and_judge(lib: Settings, retriever: Retriever) -> None:
    llm = scripted()
    # auto: the LLM judge checks the claims when LLM checks are on (a hosted model).
    hosted = lib.model_copy(
        update={
            "llm": lib.llm.model_copy(update={"provider": "openai"}),
            "agent": lib.agent.model_copy(update={"support": "auto"}),
        }
    )
    agent = build_agent(hosted, retriever, llm)
    # A question that looks compound but that the rules cannot split: the LLM planner is asked.
    q = "How do ontology induction and paraphrase generation relate?"
    a = agent.run(q, flt=SearchFilter(paper_ids=[ONTOLOGY, "1601.06068"]))
    assert not a.abstained and a.dropped_claims == 1 and "Quokkas" not in a.text
    kinds = [m[0].content for m in llm.calls]
    assert kinds[:3] == [prompts.PLANNER_SYSTEM, prompts.GRADER_SYSTEM, prompts.SYNTH_SYSTEM]
    assert set(kinds[3:]) == {prompts.JUDGE_SYSTEM}
    # The planner said "simple": one query, as asked.
    assert a.sub_queries == [q]
    _valid_citations(a)


# --- the retry, on a fake retriever -----------------------------------------------------------


def _chunk(cid: str, text: str) -> Chunk:
    return Chunk(
        id=cid,
        paper_id=cid.split(":")[0],
        index=0,
        title="T " + cid,
        type="passage",
        text=text,
        embed_text=text,
        n_tokens=1,
    )


class FakeRetriever:
    """Preset kept chunks by query; records the queries searched."""

    def __init__(self, table: dict[str, list[Chunk]]) -> None:
        self.table = table
        self.calls: list[list[str]] = []

    def search_many(
        self, queries: Sequence[str], flt: SearchFilter | None = None, *, concurrent: bool = True
    ) -> list[SearchResult]:
        self.calls.append(list(queries))
        out = []
        for q in queries:
            kept = [
                RankedChunk(chunk=c, score=1.0 - 0.1 * i, fused_rank=i + 1, fused_score=0.0)
                for i, c in enumerate(self.table.get(q, []))
            ]
            hybrid = HybridResult(fused=[], dense_abstracts=[], dense_passages=[], bm25=[])
            out.append(SearchResult(hybrid=hybrid, ranked=kept, kept=kept, model="fake", timings={}))
        return out


def test_retry_finds_what_the_first_pass_missed() -> None:
    q = "How is the ontology induced from sarcasm and irony?"
    first = _chunk("A:0001:aa", "The ontology is induced from parsed text by clustering.")
    second = _chunk("B:0001:bb", "Sarcasm and irony are detected before the ontology is induced.")
    fake = FakeRetriever({q: [first], "sarcasm irony ontology induced": [second, first]})
    deps = AgentDeps(retriever=fake, llm=None, support=LexicalSupport(), settings=AgentSettings())
    a = Agent(deps).run(q)
    assert fake.calls == [[q], ["sarcasm irony ontology induced"]]
    assert _nodes(a) == RETRY_PATH and a.retries == 1
    assert [e.decision.split(":")[0] for e in a.events if e.node == "grader"] == ["partial", "sufficient"]
    # The first pass's chunk is kept, the second pass adds only the new one (deduplicated by id).
    assert [(c.chunk_id, c.pass_index) for c in a.chunks] == [(first.id, 0), (second.id, 1)]
    assert not a.abstained and a.missing == []
    # The sentence holding every key term comes first.
    assert a.short_answer == "Sarcasm and irony are detected before the ontology is induced"
    assert a.text == (
        "Sarcasm and irony are detected before the ontology is induced [2]. "
        "The ontology is induced from parsed text by clustering [1]."
    )
    assert [(c.n, c.paper_id) for c in a.citations] == [(2, "B"), (1, "A")]


def test_no_second_retry_and_partial_answer_says_what_is_missing() -> None:
    q = "How is the ontology induced from sarcasm and irony?"
    first = _chunk("A:0001:aa", "The ontology is induced from parsed text by clustering.")
    fake = FakeRetriever({q: [first]})
    deps = AgentDeps(retriever=fake, llm=None, support=LexicalSupport(), settings=AgentSettings())
    a = Agent(deps).run(q)
    assert len(fake.calls) == 2 and a.retries == 1 and _nodes(a) == RETRY_PATH
    assert not a.abstained and a.missing == ["sarcasm", "irony"]
    assert a.text.endswith("Not found in the library's passages: sarcasm, irony.")
    assert NODES[0] == "router"
