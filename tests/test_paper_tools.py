"""The research tools around a paper: "summarise <paper>" and "related work for <paper>", as pure
functions, through the Python API with a scripted LLM (every part cited, unsupported sentences
dropped), asked as questions, over HTTP, as MCP tools and on the command line. Small hash-embedder
libraries: 6 QASPER papers, and a hand-made corpus of 5 abstracts whose related order is known."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from fastapi.testclient import TestClient
from mcp import Client
from mcp.types import CallToolResult, TextContent
from typer.testing import CliRunner

from arag.agent import prompts
from arag.agent.paper_request import paper_request, tool_route
from arag.agent.related import LibraryPaper, extractive_line, rank_related, supported_by_both
from arag.agent.state import ContextPassage
from arag.agent.summary import Aspect, aspect_ranking, named_for, write_part
from arag.agent.support import LexicalSupport
from arag.agent.terms import cited_numbers, sentences
from arag.api import Library
from arag.cli.main import app
from arag.library.build import LibraryBuilder
from arag.llm.base import ChatMessage
from arag.llm.scripted import ScriptedLLM
from arag.mcp_server import build_server
from arag.records import Chunk, Paper
from arag.service import create_app
from arag.settings import Settings, get_settings
from service_util import SMALL, sse_events

ONTOLOGY = "1601.00901"
ONTOLOGY_TITLE = "Joint learning of ontology and semantic parser from text"
INVENTED = "The authors trained it on 9000 Martian telescopes"
runner = CliRunner()


# -- the pure parts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "tool", "target"),
    [
        ("summarise 1912.01214", "summary", "1912.01214"),
        ("Summarize the paper 'Joint learning of ontology and semantic parser from text'.", "summary",
         ONTOLOGY_TITLE),
        ("Give me a summary of 1601.00901?", "summary", "1601.00901"),
        ("related work for Joint learning of ontology and semantic parser from text", "related",
         ONTOLOGY_TITLE),
        ("What are the papers related to 1601.00901?", "related", "1601.00901"),
        ("Find similar papers to 'Many Languages, One Parser'", "related", "Many Languages, One Parser"),
    ],
)  # fmt: skip
def test_a_paper_tool_question_names_its_tool_and_paper(question: str, tool: str, target: str) -> None:
    req = paper_request(question)
    assert req is not None and (req.tool, req.target) == (tool, target)
    assert tool_route(question) == tool


@pytest.mark.parametrize(
    "question",
    [
        "Summarise what the library says about BERT fine-tuning for question answering.",
        "How do researchers detect fake news?",
        "Which multilingual approaches are compared in 1912.01214?",
        "What related work does 1601.00901 cite?",
    ],
)
def test_other_questions_are_research(question: str) -> None:
    assert paper_request(question) is None and tool_route(question) == "research"


def _papers(*texts: tuple[str, str]) -> list[LibraryPaper]:
    return [LibraryPaper(id=f"p{i}", title=t, abstract=a) for i, (t, a) in enumerate(texts)]


def test_related_ranking_fuses_vector_and_term_ranks_in_an_exact_order() -> None:
    # Vectors rank p1 > p2 > p3 > p4 (cosine 0.9, 0.8, 0.7, 0.1 with p0); shared terms rank
    # p2 > p3 > p1 > p4. RRF (k = 60): p2 1/62 + 1/61 > p1 1/61 + 1/63 > p3 1/63 + 1/62 > p4 2/64.
    papers = _papers(
        ("alpha beta gamma delta", "epsilon zeta eta theta"),
        ("alpha", "unrelated words here"),
        ("alpha beta gamma delta", "epsilon zeta eta"),
        ("alpha beta gamma", "epsilon zeta"),
        ("nothing shared", "at all"),
    )
    cos = [1.0, 0.9, 0.8, 0.7, 0.1]
    vectors = np.array(
        [[c, float(np.sqrt(1 - c * c)) * (1 if i % 2 else -1), 0.0] for i, c in enumerate(cos)]
    )
    vectors[0] = [1.0, 0.0, 0.0]
    ranked = rank_related(0, papers, vectors, k=4)
    assert [papers[r.index].id for r in ranked] == ["p2", "p1", "p3", "p4"]
    assert [(r.dense_rank, r.term_rank) for r in ranked] == [(2, 1), (1, 3), (3, 2), (4, 4)]
    assert ranked[0].score == pytest.approx(1 / 62 + 1 / 61, abs=1e-6)
    # The shared terms most distinctive first: "delta" (only p0 and p2) before "alpha" (in four papers).
    assert ranked[0].shared[0] == "delta" and "alpha" not in ranked[0].shared and ranked[-1].shared == []
    assert rank_related(0, papers, vectors, k=2) == ranked[:2]


def test_a_line_on_what_two_papers_share_needs_both_abstracts() -> None:
    paper = LibraryPaper(id="a", title="Semantic parsing", abstract="We learn a semantic parser of questions")
    modules = "Neural modules are assembled for semantic parsing of questions."
    other = LibraryPaper(id="b", title="Neural modules", abstract=modules)
    lexical = LexicalSupport(0.44)
    assert supported_by_both("Both papers parse questions semantically.", paper, other, lexical)
    # Words of one abstract only: supported by the two together, not by each.
    line = "Both papers assemble neural modules."
    assert not supported_by_both(line, paper, other, lexical)
    joined = LibraryPaper(id="ab", title="", abstract=f"{paper.abstract} {other.title}. {other.abstract}")
    assert supported_by_both(line, joined, joined, lexical)


def test_a_related_line_names_each_shared_word_once() -> None:
    # "concept" and "text" are two shared terms of one hyphenated word: shown once, not twice.
    paper = LibraryPaper(id="a", title="Ontology verbalisation", abstract="Concept-to-text from ontologies.")
    abstract = "We extract resources for concept-to-text generation from ontologies."
    other = LibraryPaper(id="b", title="Extracting resources", abstract=abstract)
    line = extractive_line(paper, other, ["concept", "text", "ontolog"])
    assert line == (
        "Also on concept-to-text, ontologies: The authors extract resources for concept-to-text generation "
        "from ontologies."
    )


def test_a_summary_part_leaves_out_a_sentence_the_llm_did_not_finish() -> None:
    # The 1.5B's method part of 1912.01214 ran out of tokens mid-sentence ("... applied in zero").
    text = (
        "We propose a universal encoder with cross-lingual pre-training. The parent model built on the "
        "encoder is trained on annotated data and then directly applied in zero-shot translation."
    )
    chunk = Chunk(
        id="p:0001:aaaaaaaa", paper_id="p", index=1, title="T", type="abstract", text=text,
        embed_text=text, n_tokens=30,
    )  # fmt: skip
    passages = [ContextPassage(n=1, chunk=chunk, text=text, score=1.0, tokens=30)]
    cut = (
        "The paper proposes a universal encoder with cross-lingual pre-training. The parent model is "
        "trained on annotated data and then directly applied in zero"
    )
    part, _ = write_part("method", passages, ScriptedLLM([cut]), LexicalSupport())
    assert part.mode == "llm" and part.text == (
        "The paper proposes a universal encoder with cross-lingual pre-training [1]."
    )
    # A sentence that points at a table the reader cannot see says nothing either.
    table = f"{cut.split('. ')[0]} [1]. The results are shown in Table [1]."
    part, _ = write_part("method", passages, ScriptedLLM([table]), LexicalSupport())
    assert part.text == "The paper proposes a universal encoder with cross-lingual pre-training [1]."
    # Nothing finished at all: the passages' own sentences, and the note says why.
    part, _ = write_part(
        "method", passages, ScriptedLLM(["The parent model is trained on"]), LexicalSupport()
    )
    assert part.mode == "extractive" and part.text and "stopped before its first sentence ended" in part.note


def test_a_section_named_for_an_aspect_follows_the_abstract() -> None:
    assert named_for("data", "Experiments ::: Setup ::: Datasets.") and named_for("data", "Data collection")
    assert named_for("limits", "Discussion") and named_for("results", "Experiments ::: Main Results")
    assert not named_for("data", "Experiments ::: Setup") and not named_for("method", None)
    # Only the innermost heading counts.
    assert not named_for("data", "Data ::: Model training")

    def chunk(i: int, section: str) -> Chunk:
        return Chunk(
            id=f"p:{i:04d}:aaaaaaaa", paper_id="p", index=i, title="T", type="passage", section=section,
            text=f"passage {i}", embed_text=f"passage {i}", n_tokens=2,
        )  # fmt: skip

    abstract = chunk(0, "Abstract")
    names = ["Introduction", "Model", "Setup", "Data collection", *[f"Part {i}" for i in range(5, 10)]]
    ranked = [chunk(i, name) for i, name in enumerate([*names, "Discussion", "Error analysis"], 1)]

    def order(aspect: Aspect, abstract_: list[Chunk]) -> list[int]:
        return [c.index for c in aspect_ranking(aspect, ranked, abstract_)]

    # The abstract leads (the paper states its data there), then the data section, then the rest.
    assert order("data", [abstract]) == [0, 4, 1, 2, 3, *range(5, 12)]
    assert order("method", [abstract]) == [0, 2, 1, 3, *range(4, 12)]
    # Limits: no abstract; "Discussion" is 10th, within the first ten; "Error analysis" is beyond.
    assert order("limits", [abstract]) == [10, *range(1, 10), 11]
    # No section named for it: the ranking as it was, after the abstract.
    assert order("results", [abstract]) == [0, *range(1, 12)]
    assert order("results", []) == list(range(1, 12))


# -- a hand-made library whose related order is known ----------------------------------------------

TINY = [
    ("2001.00001", "Joint ontology learning and semantic parsing",
     "We learn an ontology and a semantic parser jointly from text. The semantic parser induces grammar "
     "rules for ontology concepts."),
    ("2001.00002", "Semantic parsing with ontology grammars",
     "A semantic parser with grammar rules built from an ontology. The parser maps text to ontology "
     "concepts."),
    ("2001.00003", "Ontology population from text",
     "We populate an ontology with concepts extracted from text documents."),
    ("2001.00004", "Grammar formalisms for syntax trees",
     "Unsupervised grammar for syntactic trees of sentences in many languages."),
    ("2001.00005", "Speech recognition with acoustic models",
     "Acoustic models for speech recognition on telephone audio recordings."),
]  # fmt: skip


def tiny_settings(data: Path) -> Settings:
    return get_settings(data_dir=data, **{**SMALL, "llm": {"provider": "extractive"}})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("tiny-lib")
    papers = [Paper(id=i, title=t, abstract=a, source="arxiv", year=2020) for i, t, a in TINY]
    with LibraryBuilder(tiny_settings(data)) as builder:
        builder.index_papers(papers)
    return data


def test_related_papers_on_a_hash_embedded_library_come_in_the_expected_order(tiny_dir: Path) -> None:
    # The parser-and-ontology paper shares the most words, the ontology one fewer, the grammar one only
    # "grammar", the speech one nothing: both rankings agree, and so does their fusion.
    with Library(tiny_settings(tiny_dir)) as lib:
        rel = lib.related("2001.00001", k=4)
    assert [p.paper_id for p in rel.papers] == ["2001.00002", "2001.00003", "2001.00004", "2001.00005"]
    assert [p.dense_rank for p in rel.papers] == [1, 2, 3, 4] and [p.term_rank for p in rel.papers] == [
        1,
        2,
        3,
        4,
    ]
    first = rel.papers[0]
    assert first.arxiv_url == "https://arxiv.org/abs/2001.00002" and first.relation_mode == "extractive"
    assert {"ontology", "semantic", "parser"} <= set(first.shared_terms)
    assert first.relation.startswith("Also on ") and "ontology" in first.relation
    assert rel.papers[-1].shared_terms == [] and "fusion" in rel.method


def test_the_cli_summarises_and_relates_a_paper(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_DATA_DIR", str(tiny_dir))
    for key, value in {
        "ARAG_EMBEDDING__PROVIDER": "hash",
        "ARAG_RERANK__PROVIDER": "none",
        "ARAG_TOPICS__K": "2",
    }.items():
        monkeypatch.setenv(key, value)
    r = runner.invoke(app, ["related", "2001.00001", "-k", "2", "--llm", "extractive"])
    assert r.exit_code == 0, r.output
    assert (
        "Semantic parsing with ontology grammars" in r.output
        and "https://arxiv.org/abs/2001.00002" in r.output
    )
    assert "vector rank 1" in r.output and "reciprocal rank fusion" in r.output
    r = runner.invoke(app, ["related", "2001.00001", "--json", "--llm", "extractive"])
    assert r.exit_code == 0, r.output
    assert [p["paper_id"] for p in json.loads(r.output)["papers"]][:2] == ["2001.00002", "2001.00003"]
    r = runner.invoke(app, ["summarise", "arXiv:2001.00001", "--llm", "extractive"])
    assert r.exit_code == 0, r.output
    for heading in ("Problem", "Method", "Data", "Results", "Limits"):
        assert heading in r.output
    assert "[1]" in r.output and "Sources" in r.output and "extractive (no LLM)" in r.output
    r = runner.invoke(app, ["summarise", "9999.99999", "--llm", "extractive"])
    assert r.exit_code == 8 and "unknown paper id" in r.output and "arag papers" in r.output


# -- the 6-paper QASPER library with a scripted LLM ------------------------------------------------


def _passages(user: str) -> dict[int, str]:
    """The numbered passages of a prompt: [n] header line, then the text."""
    found = re.findall(r"^\[(\d+)\] [^\n]*\n(.*?)(?=\n\n\[\d+\] |\n\nWrite |\Z)", user, re.S | re.M)
    return {int(n): text for n, text in found}


def tools_llm() -> ScriptedLLM:
    """Summary parts: the first sentence of passage [1], cited, then an invented sentence citing [2]
    (which the check must drop). Related lines: a line for paper 1 from its own words, an invented
    one for paper 2. Anything else: the agent's rules decide."""

    def reply(messages: Sequence[ChatMessage]) -> str:
        system, user = messages[0].content, messages[-1].content
        if system == prompts.SUMMARY_SYSTEM:
            first = sentences(_passages(user)[1])[0].rstrip(".")
            return f"{first} [1]. {INVENTED} [2]."
        if system == prompts.RELATED_SYSTEM:
            # Line 1 names words both abstracts use: a claim each abstract supports alone.
            paper = user.split("\n\nRelated papers:")[0]
            first = re.search(r"^1\. (.+)$", user, re.M)
            listing = (first.group(1) if first else "").lower()
            both = [w for w in re.findall(r"[a-z]{5,}", listing) if w in paper.lower()]
            # Line 3 repeats the listing (as the 1.5B does): not a relation, so the extractive line.
            echo = re.search(r"^3\. (.+)$", user, re.M)
            return (
                f"1. Both concern {' and '.join(dict.fromkeys(both[:3]))}.\n"
                "2. Both study volcanoes on Jupiter's moons.\n"
                f"3. 3. {echo.group(1) if echo else ''}"
            )
        if system == prompts.SYNTH_SYSTEM:
            return "Short answer: not in the library\nExplanation: not in the library"
        return "{}"

    return ScriptedLLM([], default=reply)


@pytest.fixture(scope="module")
def library(small_library: Callable[..., Settings]) -> Iterator[Library]:
    data = small_library("paper_tools", **SMALL).data_dir  # its own: its Library writes beside it
    with Library(get_settings(data_dir=data, **SMALL), llm=tools_llm()) as lib:
        yield lib


def test_a_summary_cites_every_sentence_and_drops_the_unsupported(library: Library) -> None:
    events: list[str] = []
    s = library.summarise(ONTOLOGY, on_event=lambda e: events.append(e.node))
    assert events == ["retriever"] + ["synthesizer"] * 5 + ["verifier"]
    assert [p.aspect for p in s.parts] == ["problem", "method", "data", "results", "limits"]
    assert s.title == ONTOLOGY_TITLE and s.arxiv_url == f"https://arxiv.org/abs/{ONTOLOGY}"
    sources = {src.n: src for src in s.sources}
    for part in s.parts:
        assert part.mode == "llm" and part.text, part
        assert part.dropped >= 1 and "Martian" not in part.text  # the invented sentence is gone
        for sent in sentences(part.text):
            nums = cited_numbers(sent)
            assert nums and all(n in sources for n in nums), sent
    for src in s.sources:
        assert src.text and src.support >= library.agent.deps.support.threshold
    # Passages are numbered once for the whole summary: the same chunk keeps its number.
    assert len({src.chunk_id for src in s.sources}) == len(s.sources)


def test_without_an_llm_the_summary_is_extractive_and_still_cited(library: Library) -> None:
    llm, library.llm = library.llm, None
    try:
        s = library.summarise(ONTOLOGY)
    finally:
        library.llm = llm
    assert s.llm == "extractive (no LLM)"
    written = [p for p in s.parts if p.text]
    assert len(written) >= 3 and all(p.mode == "extractive" for p in written)
    for p in written:
        assert all(cited_numbers(sent) for sent in sentences(p.text))
        # The paper's "we" is shown as its authors.
        assert not re.search(r"\b(?:[Ww]e|[Oo]urs?|us)\b", p.text), p.text


def test_related_lines_from_the_llm_are_kept_only_when_the_abstracts_support_them(library: Library) -> None:
    rel = library.related(ONTOLOGY, k=3)
    assert len(rel.papers) == 3 and ONTOLOGY not in {p.paper_id for p in rel.papers}
    assert rel.papers[0].relation_mode == "llm" and rel.papers[0].relation.startswith("Both concern")
    assert rel.papers[1].relation_mode == "extractive" and "Jupiter" not in rel.papers[1].relation
    assert rel.papers[2].relation_mode == "extractive" and rel.papers[2].relation.startswith("Also on")
    for p in rel.papers:
        assert not re.search(r"\b(?:[Ww]e|[Oo]urs?|us)\b", p.relation), p.relation
    assert all(p.arxiv_url for p in rel.papers)
    with pytest.raises(Exception, match="k must be 1 to 50"):
        library.related(ONTOLOGY, k=0)


def test_asked_as_a_question_it_routes_to_the_tool(library: Library) -> None:
    a = library.ask(f"summarise {ONTOLOGY}")
    assert a.short_answer == f"Summary of {ONTOLOGY_TITLE}" and not a.abstained
    assert a.events[0].node == "router" and a.events[0].decision.startswith("paper tool: summary")
    assert a.text.startswith("Problem: ") and "Limits:" in a.text and a.citations
    in_context = {c.n: c for c in a.chunks}
    assert all(c.n in in_context and c.paper_id == ONTOLOGY for c in a.citations)
    a = library.ask(f"related work for '{ONTOLOGY_TITLE}'")
    assert a.short_answer.startswith("Related work for") and "https://arxiv.org/abs/" in a.text
    # "this paper" with one paper in scope is that paper.
    a = library.ask("summarise this paper", papers=[ONTOLOGY])
    assert a.short_answer == f"Summary of {ONTOLOGY_TITLE}"
    # A summary of what the library says is an open question: the agent answers it.
    a = library.ask("Summarise what the library says about ontologies.")
    assert a.events[0].node == "router" and not a.events[0].decision.startswith("paper tool")


# -- HTTP and MCP -----------------------------------------------------------------------------------


@pytest.fixture
def client(library: Library) -> Iterator[TestClient]:
    with TestClient(create_app(library.settings, library=library), base_url="http://127.0.0.1:7860") as c:
        yield c


def test_the_http_routes_serve_the_summary_related_papers_and_the_map(client: TestClient) -> None:
    r = client.get(f"/papers/{ONTOLOGY}/summary")
    assert r.status_code == 200, r.text
    body = r.json()
    assert [p["aspect"] for p in body["parts"]] == ["problem", "method", "data", "results", "limits"]
    assert body["sources"] and all(p["text"] for p in body["parts"])
    r = client.get(f"/papers/arXiv:{ONTOLOGY}/related", params={"k": 2})
    assert r.status_code == 200, r.text
    assert len(r.json()["papers"]) == 2 and r.json()["papers"][0]["arxiv_url"].startswith(
        "https://arxiv.org/abs/"
    )
    assert client.get(f"/papers/{ONTOLOGY}/related", params={"k": 0}).status_code == 422
    bad = client.get("/papers/9999.99999/summary")
    assert bad.status_code == 404 and "arag papers" in bad.json()["fix"]
    assert client.get(f"/papers/{ONTOLOGY}").json()["id"] == ONTOLOGY  # the paper route still answers
    m = client.get("/map")
    assert m.status_code == 200, m.text
    body = m.json()
    assert body["method"] == "pca" and len(body["papers"]) == 6  # under 10 papers: PCA
    assert all(-1.0 <= p["x"] <= 1.0 and -1.0 <= p["y"] <= 1.0 for p in body["papers"])
    assert sum(t["papers"] for t in body["topics"]) == 6 and all(t["label"] for t in body["topics"])
    spec = client.get("/openapi.json").json()
    for path, schema in (
        ("/papers/{paper_id}/summary", "PaperSummary"),
        ("/papers/{paper_id}/related", "RelatedPapers"),
        ("/map", "LibraryMap"),
    ):
        ok = spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok["$ref"].endswith(f"/{schema}") and schema in spec["components"]["schemas"]


def test_a_summary_question_streams_the_tools_steps(client: TestClient) -> None:
    with client.stream("POST", "/query/stream", json={"question": f"Summarise {ONTOLOGY}"}) as r:
        assert r.status_code == 200
        events = sse_events(r.read().decode())
    nodes = [json.loads(d)["node"] for k, d in events if k == "node"]
    assert nodes == ["router", "retriever"] + ["synthesizer"] * 5 + ["verifier"]
    answer = json.loads(events[-1][1])
    assert (
        events[-1][0] == "answer" and answer["citations"] and answer["short_answer"].startswith("Summary of")
    )


def _call(library: Library, tool: str, **args: Any) -> CallToolResult:
    async def main() -> CallToolResult:
        async with Client(build_server(library), mode="legacy", raise_exceptions=True) as c:
            result: CallToolResult = await c.call_tool(tool, args)
            return result

    return anyio.run(main)


def test_the_mcp_tools_summarise_and_relate(library: Library) -> None:
    r = _call(library, "summarise_paper", paper_id=ONTOLOGY)
    assert not r.is_error and r.structured_content is not None
    assert (
        isinstance(r.content[0], TextContent)
        and "Problem:" in r.content[0].text
        and "Sources:" in r.content[0].text
    )
    assert len(r.structured_content["parts"]) == 5
    r = _call(library, "related_papers", paper_id=ONTOLOGY, k=2)
    assert not r.is_error and r.structured_content is not None
    assert len(r.structured_content["papers"]) == 2
    assert isinstance(r.content[0], TextContent) and "https://arxiv.org/abs/" in r.content[0].text
    r = _call(library, "related_papers", paper_id="9999.99999")
    assert r.is_error and isinstance(r.content[0], TextContent) and "list_papers" in r.content[0].text
