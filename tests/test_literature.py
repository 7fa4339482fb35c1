"""Open questions: paper aggregation (exact order on a hand-made pool), the planner that never damages a
question (scripted LLM replies from the issue's cases), and the literature answer end to end on a small
hash-embedder library of QASPER papers (five on sarcasm and irony, two others), extractive and with a
scripted LLM overview."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest

from arag.agent import build_agent, prompts
from arag.agent.count import count_question, count_sentence, count_terms, library_count, papers_holding
from arag.agent.deps import AgentDeps
from arag.agent.literature import (
    Point,
    about,
    addresses,
    draw_point,
    focus_terms,
    group_points,
    literature_short_answer,
    point_score,
    refers_to_its_paper,
)
from arag.agent.planner import make_planner, plan_rules, protect, repair_ids, validate_llm_plan
from arag.agent.reformulator import make_reformulator, reformulate_rules
from arag.agent.state import ContextPassage, Draft, Grade
from arag.agent.support import LexicalSupport
from arag.agent.terms import (
    cited_numbers,
    entities,
    reported,
    sentences,
    strip_citations,
    strip_self_reference,
)
from arag.agent.verifier import misattributed, split_claims, verify_literature
from arag.agent.wording import (
    complete_sentences,
    first_mention,
    fragment,
    markers_as_words,
    names_authors,
    one_paper,
    ordinals_as_words,
    this_paper_as_words,
)
from arag.eval.open import TitleAbstractBM25, precision_at, recall_at
from arag.library.manage import load_resolver, open_for_search
from arag.llm.base import ChatMessage
from arag.llm.scripted import ScriptedLLM
from arag.models.reranker import IdentityReranker
from arag.records import Answer, Chunk, LibraryCount, RankedPaper, ScoredChunk
from arag.retrieval.hybrid import HybridRetriever
from arag.retrieval.papers import PaperPool, aggregate_papers, rank_papers
from arag.retrieval.pipeline import Retriever, make_reranking_retriever
from arag.settings import AgentSettings, RetrievalSettings, Settings
from arag.text import held_terms

SARCASM = ["1709.05404", "1804.00520", "1804.08094", "1809.09795", "1904.04019"]
OTHERS = ["1601.00901", "1601.01705"]


def _hit(pid: str, index: int, kind: str = "passage") -> ScoredChunk:
    text = f"text {pid} {index}"
    chunk = Chunk(
        id=f"{pid}:{index:04d}:00000000",
        paper_id=pid,
        index=index,
        title=f"Paper {pid}",
        type=kind,  # type: ignore[arg-type]
        text=text,
        embed_text=text,
        n_tokens=3,
    )
    return ScoredChunk(chunk=chunk, score=1.0)


# --- paper aggregation ---------------------------------------------------------------------------


def test_aggregate_papers_exact_order() -> None:
    # A: abstract #1 and passages #3, #4 (three hits); B: passages #1, #2 and BM25 #1; C: abstract #2
    # only; D: BM25 #2 and #3 and passage #5.
    pool = PaperPool(
        abstracts=[_hit("A", 0, "abstract"), _hit("C", 0, "abstract")],
        passages=[_hit("B", 1), _hit("B", 2), _hit("A", 1), _hit("A", 2), _hit("D", 1)],
        bm25=[_hit("B", 1), _hit("D", 2), _hit("D", 3)],
    )
    papers = aggregate_papers(pool, rrf_k=60, hits=3, limit=10)
    # By hand, k = 60, each further hit of a paper in one list worth half the one before:
    # B: 1/61 + 0.5/62 + 1/61 = 0.040851; A: 1/61 + 1/63 + 0.5/64 = 0.039987;
    # D: 1/65 + 1/62 + 0.5/63 = 0.039508; C: 1/62 = 0.016129.
    assert [p.paper_id for p in papers] == ["B", "A", "D", "C"]
    assert [p.rank for p in papers] == [1, 2, 3, 4]
    assert papers[0].score == pytest.approx(1 / 61 + 0.5 / 62 + 1 / 61, abs=1e-6)
    assert papers[1].abstract_rank == 1 and papers[3].abstract_rank == 2 and papers[0].abstract_rank is None
    assert papers[0].passage_hits == 3 and papers[3].passage_hits == 0
    assert papers[0].found_by == ["passages", "bm25"] and papers[1].found_by == ["abstracts", "passages"]
    # Only the first `hits` hits of a paper in one list count; the limit cuts the list.
    assert [p.paper_id for p in aggregate_papers(pool, hits=1, limit=2)] == ["B", "A"]


def test_abstract_bm25_counts_as_abstract_evidence() -> None:
    # C's abstract is also BM25's first abstract: 1/62 + 1/61 = 0.032523 puts it above D (BM25 over
    # every chunk: 1/61 + 0.5/62 = 0.024458), and it is no passage hit; its abstract rank is the
    # dense one.
    pool = PaperPool(
        abstracts=[_hit("A", 0, "abstract"), _hit("C", 0, "abstract")],
        passages=[],
        bm25=[_hit("D", 1), _hit("D", 2)],
        abstract_bm25=[_hit("C", 0, "abstract")],
    )
    papers = aggregate_papers(pool, rrf_k=60, hits=3, limit=10)
    assert [p.paper_id for p in papers] == ["C", "D", "A"]
    assert papers[0].score == pytest.approx(1 / 62 + 1 / 61, abs=1e-6)
    assert papers[0].passage_hits == 0 and papers[0].abstract_rank == 2
    assert papers[0].found_by == ["abstracts", "abstract_bm25"]


def test_rank_papers_carries_the_abstract_an_abstract_search_found() -> None:
    pool = PaperPool(
        abstracts=[_hit("A", 0, "abstract")],
        passages=[_hit("B", 4), _hit("A", 2)],
        bm25=[],
        abstract_bm25=[_hit("A", 0, "abstract")],
    )
    papers = rank_papers("q", pool, IdentityReranker(), RetrievalSettings())
    assert {p.paper_id: p.abstract for p in papers} == {"A": "text A 0", "B": None}


class _CountingReranker:
    """A model's stand-in that scores a passage by its trailing number and records what it read."""

    name = "counting"
    bars = None
    fusion_weight = 0.0

    def __init__(self) -> None:
        self.read: list[str] = []

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        self.read.extend(passages)
        return np.array([float(p.rsplit(" ", 1)[-1]) for p in passages], dtype=np.float32)


def test_rank_papers_scores_only_what_the_passage_stage_did_not() -> None:
    pool = PaperPool(
        abstracts=[_hit("A", 0, "abstract")],
        passages=[_hit("B", 4), _hit("A", 2), _hit("B", 1)],
        bm25=[_hit("A", 3)],
    )
    full = _CountingReranker()
    every = rank_papers("q", pool, full, RetrievalSettings())
    assert sorted(full.read) == ["text A 0", "text A 2", "text A 3", "text B 1", "text B 4"]
    # The passage stage scored B:4 and A:2 (with other scores than the model's own, to see which
    # were used): those are not read again, and the rest are.
    reuse = _CountingReranker()
    known = {_hit("B", 4).chunk.id: 40.0, _hit("A", 2).chunk.id: 20.0}
    papers = rank_papers("q", pool, reuse, RetrievalSettings(), known)
    assert sorted(reuse.read) == sorted(t for t in full.read if t not in {"text B 4", "text A 2"})
    best = {p.paper_id: [(c.chunk.index, c.rerank_score) for c in p.passages] for p in papers}
    # A's abstract, last of its candidates, comes after its best two (see the next test).
    assert best == {"A": [(2, 20.0), (3, 3.0), (0, 0.0)], "B": [(4, 40.0), (1, 1.0)]}
    assert {p.paper_id: p.best_rerank for p in every} == {"A": 3.0, "B": 4.0}
    # Without a model nothing is scored, whatever is passed.
    assert all(
        c.rerank_score is None
        for p in rank_papers("q", pool, IdentityReranker(), RetrievalSettings(), known)
        for c in p.passages
    )


def test_a_ranked_papers_abstract_follows_its_best_passages() -> None:
    # The reranker, trained on one-paper questions' paragraphs, seldom puts an abstract first, and the
    # abstract is where an open question's answer finds what each paper does.
    settings = RetrievalSettings(papers_k=10, passages_per_paper=2, paper_hits=2)
    others = [_hit(pid, 0, "abstract") for pid in "VWXYZ"]
    pool = PaperPool(
        abstracts=[],
        passages=[_hit("A", 4), _hit("A", 2), _hit("A", 1), _hit("B", 6), _hit("B", 3), _hit("B", 5)],
        bm25=[],
        abstract_bm25=[_hit("A", 0, "abstract"), *others, _hit("B", 0, "abstract")],
    )
    papers = {p.paper_id: p for p in rank_papers("q", pool, _CountingReranker(), settings)}
    # A's abstract is one of its three candidates, scored and ranked last: it comes third.
    assert [(c.chunk.index, c.rerank_score) for c in papers["A"].passages] == [(4, 4.0), (2, 2.0), (0, 0.0)]
    # B's is not among its candidates (its passages rank above it): it is added unscored, from the
    # abstract search that found it.
    b = papers["B"].passages
    assert [(c.chunk.index, c.rerank_score) for c in b] == [(6, 6.0), (5, 5.0), (0, None)]
    assert b[-1].found_by == ["abstract_bm25"] and b[-1].chunk.type == "abstract"
    # A paper whose abstract no search found keeps its best passages only.
    pool = PaperPool(abstracts=[], passages=[_hit("C", 2), _hit("C", 7), _hit("C", 1)], bm25=[])
    (c,) = rank_papers("q", pool, _CountingReranker(), settings)
    assert [x.chunk.index for x in c.passages] == [7, 2]
    # One whose abstract is among its best keeps it once, where it ranks.
    pool = PaperPool(abstracts=[_hit("D", 0, "abstract")], passages=[_hit("D", 9), _hit("D", 3)], bm25=[])
    (d,) = rank_papers("q", pool, IdentityReranker(), settings)
    assert [x.chunk.index for x in d.passages] == [0, 9]


def _paper(title: str, abstract: str | None) -> RankedPaper:
    return RankedPaper(paper_id="p", title=title, rank=1, score=1.0, abstract=abstract)


def test_about_needs_the_topic_in_the_title_or_abstract() -> None:
    fifa = "Which team won the 2018 FIFA World Cup?"
    terms, names = focus_terms(fifa), entities(strip_self_reference(fifa))
    assert names == ["FIFA"]
    linking = _paper(
        "Joint Entity Linking with Deep Reinforcement Learning",
        "Entity linking maps mentions in text to entities of a knowledge base, in the real world.",
    )
    assert not about(linking, terms, names)  # "world" alone: one of five terms, no name
    assert about(_paper("Predicting FIFA match results", "We model football."), terms, names)
    # A generic acronym the abstract does not spell out: half the terms will do.
    code = "How do NLP systems handle code-mixed text that switches between languages?"
    cterms, cnames = focus_terms(code), entities(code)
    assert cnames == ["NLP"]
    mixed = _paper("Code-switching", "Text that mixes two languages, code-switched, is hard to handle.")
    assert about(mixed, cterms, cnames)
    # Without names one term in the title or abstract is enough; no abstract found: not about it.
    humour = focus_terms("How can computers recognise or generate humour?")
    assert about(_paper("Humour generation with templates", "Jokes."), humour, [])
    assert not about(_paper("Humour generation with templates", None), humour, [])
    assert not about(_paper("Parsing", "Dependency parsing of tweets."), humour, [])


def test_question_answering_is_a_topic_of_an_open_question() -> None:
    # "question" and "answer" are generic in a question about one paper, not in this one.
    terms = focus_terms("Summarise what the library says about BERT fine-tuning for question answering.")
    assert terms == ["bert", "fine", "tune", "question", "answer"]
    assert "question" in focus_terms("Which models answer natural language questions over tables?")
    assert "question" not in focus_terms("How is sarcasm detected?")


def test_rank_papers_keeps_each_papers_best_passages() -> None:
    pool = PaperPool(
        abstracts=[_hit("A", 0, "abstract")],
        passages=[_hit("B", 4), _hit("A", 2), _hit("B", 1), _hit("A", 5)],
        bm25=[_hit("A", 5)],
    )
    settings = RetrievalSettings(papers_k=10, passages_per_paper=2)
    papers = rank_papers("q", pool, IdentityReranker(), settings)
    assert [p.paper_id for p in papers] == ["A", "B"]
    # Without a model, a paper's chunks keep their best rank in any search (A:5 is BM25's first).
    assert [c.chunk.id.split(":")[1] for c in papers[0].passages] == ["0000", "0005"]
    assert [c.chunk.id.split(":")[1] for c in papers[1].passages] == ["0004", "0001"]
    assert all(c.chunk.paper_id == p.paper_id for p in papers for c in p.passages)


# --- the planner -------------------------------------------------------------------------------

ID_Q = "Which multilingual approaches are compared in 1912.01214?"


def _planner_deps(llm: ScriptedLLM) -> AgentDeps:
    return AgentDeps(retriever=None, llm=llm, support=LexicalSupport(), settings=AgentSettings())  # type: ignore[arg-type]


def test_planner_rejects_a_cut_arxiv_id_and_an_invented_sub_question() -> None:
    # The case: the LLM cut "1912.01214" into "1912" and invented a question about the year.
    reply = (
        '{"kind": "compound", "sub_queries": ["Which multilingual approaches were compared in 1912?", '
        '"In which year was this research conducted?"]}'
    )
    llm = ScriptedLLM([reply])
    step = make_planner(_planner_deps(llm))({"question": ID_Q})
    assert llm.calls and llm.calls[0][0].content == prompts.PLANNER_SYSTEM
    assert step.update["plan"] == [ID_Q]
    assert "rules (LLM reply unusable)" in step.decision


def test_planner_repairs_cut_ids_and_keeps_names_verbatim() -> None:
    assert repair_ids(ID_Q, "multilingual approaches compared in 1912") == (
        "multilingual approaches compared in 1912.01214"
    )
    assert repair_ids(ID_Q, "approaches of arXiv 01214") == "approaches of 1912.01214"
    # A question naming one paper by id has it in every sub-query.
    assert repair_ids(ID_Q, "baselines") == "In 1912.01214: baselines"
    q = "How do BERT and ELMo compare on SQuAD in 1912.01214?"
    got = validate_llm_plan(
        q, {"kind": "compound", "sub_queries": ["bert results on squad in 1912", "elmo results on squad"]}
    )
    assert got == ["BERT results on SQuAD in 1912.01214", "In 1912.01214: ELMo results on SQuAD"]
    # A name that no sub-query keeps: the plan is not used.
    assert protect("Compare BERT and ELMo", ["BERT results", "results of the other model"]) is None
    # A quoted title is a name: it must survive whole.
    title_q = "Compare 'Joint learning of ontology and semantic parser from text' and ELMo"
    assert protect(title_q, ["joint learning of ontology", "ELMo"]) is None


def test_planner_drops_words_about_the_library() -> None:
    q = "What are common ways the papers in this library detect fake news, and where do they fail?"
    subs = plan_rules(q)
    assert subs == [
        "What are common ways papers detect fake news",
        "where do they fail (common detect fake news)",
    ]
    assert all("library" not in s for s in subs)
    assert plan_rules("Summarise what the library says about BERT fine-tuning for question answering.") == [
        "Summarise BERT fine-tuning for question answering."
    ]
    assert strip_self_reference("Which papers use the NLTK library?") == "Which papers use the NLTK library?"
    # An LLM reformulation that searches "library" loses the word.
    llm = ScriptedLLM(['{"queries": ["common library detect fake news"]}'])
    step = make_reformulator(_planner_deps(llm))(
        {"question": q, "grade": Grade(verdict="unrelated", missing_terms=["fake"]), "sub_queries": subs}
    )
    assert step.update["pending"] == ["common detect fake news"]
    rules = reformulate_rules(q, Grade(verdict="unrelated"), subs, None)
    assert rules and all("library" not in query.lower() for query, _ in rules)


def test_compare_for_x_and_for_y_splits_at_the_repeated_preposition() -> None:
    q = (
        "Compare the evaluation datasets used for zero-shot NMT with cross-lingual pre-training and for "
        "joint ontology and semantic parser learning."
    )
    assert plan_rules(q) == [
        "the evaluation datasets used for zero-shot NMT with cross-lingual pre-training",
        "the evaluation datasets used for joint ontology and semantic parser learning",
    ]


# --- the pieces of a literature answer ---------------------------------------------------------


def test_addresses_needs_the_names_and_most_terms() -> None:
    terms = focus_terms("How much compute was used to train GPT-4?")
    assert not addresses(["We train GPT-2 with much compute."], terms, ["GPT-4"])
    sarcasm = focus_terms("How do researchers automatically detect sarcasm in tweets?")
    assert sarcasm == ["detect", "sarcasm", "tweet"]
    assert addresses(["We detect sarcasm in tweets with a CNN."], sarcasm, [])
    assert not addresses(["We detect named entities."], sarcasm, [])
    # Two terms: both are needed (one would be half).
    capital = focus_terms("What is the capital of Australia?")
    assert capital == ["capit", "australia"]
    assert not addresses(["GeoQA relations such as capital-of link states and cities."], capital, [])
    assert addresses(["Canberra is the capital of Australia."], capital, [])


def test_a_paper_addresses_a_term_it_spells_open() -> None:
    # The one-paper grader's spellings hold for open questions too: "data set" is "dataset".
    datasets = focus_terms("What datasets are there for sarcasm?")
    assert datasets == ["dataset", "sarcasm"]
    assert addresses(["We collect a data set of sarcastic tweets on sarcasm."], datasets, [])
    assert not addresses(["We collect data, then set a sarcasm threshold."], datasets, [])
    assert about(_paper("A data set of tweets", "We collect tweets."), datasets, [])
    assert not about(_paper("Data of tweets", "We set a threshold."), datasets, [])


def test_a_point_that_ends_where_its_list_begins_loses_to_a_whole_one() -> None:
    terms = ["bert", "question", "answer"]
    dangling = "We apply our unanswerable questions to the following BERT question answering models:"
    whole = "We fine-tune BERT on SQuAD, and question answering F1 rises by 2 points."
    assert point_score(whole, terms, abstract=False) > point_score(dangling, terms, abstract=False)
    # Without the colon the first sentence would have won: it holds more of the terms.
    assert point_score(dangling.rstrip(":") + ".", terms, abstract=False) > point_score(
        whole, terms, abstract=False
    )


def test_a_papers_joke_is_not_its_point() -> None:
    # The click-bait filter paper's abstract, which the answer to "How do researchers detect fake news?"
    # showed as its point.
    terms = focus_terms("How do researchers detect fake news?")
    joke = "So, we did this research on fake news detection and trust us, it is great research, it really is!"
    method = "Disregarding the actual reason, we use features from author profiling and style detection."
    assert point_score(method, terms, abstract=True) > point_score(joke, terms, abstract=True)
    assert point_score(joke.rstrip("!") + ".", terms, abstract=True) > point_score(
        method, terms, abstract=True
    )


def test_a_point_is_not_drawn_from_what_a_paper_says_of_other_papers() -> None:
    # Asked "What methods detect hate speech?", a Greek offensive-language paper's point was its
    # related-work summary of others' classifiers, shown as if the paper had built them.
    terms = ["hate", "speech", "detect"]
    others = "Detecting hate speech with logistic regression and a linear SVM gave strong baselines."
    own = "We train a BiLSTM to detect offensive posts in a Greek corpus."
    assert point_score(others, terms, abstract=False) > point_score(own, terms, abstract=False)
    assert point_score(others, terms, abstract=False, section="Related Work") < point_score(
        own, terms, abstract=False, section="Experiments"
    )
    # In any section, a sentence that names others' work ("et al.", "their model") loses too ...
    cited = "Davidson et al. detect hate speech with logistic regression and a linear SVM."
    assert point_score(cited, terms, abstract=False) < point_score(own, terms, abstract=False)
    # ... but not one that speaks of this paper, wherever it stands.
    mine = "In this paper, we detect hate speech in Greek tweets with a BiLSTM."
    assert point_score(mine, terms, abstract=False, section="Background") == point_score(
        mine, terms, abstract=False, section="Introduction"
    )

    def passage(n: int, section: str, text: str) -> ContextPassage:
        chunk = _hit("G", n).chunk.model_copy(update={"text": text, "embed_text": text, "section": section})
        return ContextPassage(n=n, chunk=chunk, text=text, score=1.0, tokens=len(text.split()))

    point = draw_point([passage(1, "Related Work ::: Hate speech", others), passage(2, "Data", own)], terms)
    assert point is not None and (point.n, point.sentence) == (2, own)
    # A sentence that cited other work, by a stand-in the answer no longer shows or a citation key
    # left in the text ("EMNLP19DaSanMartino focuses on ..."), is about that work.
    stand_in = "A linear SVM BIBREF3 detects hate speech in tweets well."
    key = "EMNLP19DaSanMartino detects hate speech with a linear SVM."
    for text in (stand_in, key):
        point = draw_point([passage(1, "Introduction", f"{text} {own}")], terms)
        assert point is not None and point.sentence == own, text
    assert draw_point([passage(1, "Introduction", stand_in)], terms) is not None  # a last resort


def test_group_points_by_approach() -> None:
    pts = [
        Point(n=1, paper_id="a", title="Rumour stance with BERT", sentence="We fine-tune BERT on stance."),
        Point(n=2, paper_id="b", title="Capsule networks", sentence="A capsule network detects fake news."),
        Point(n=3, paper_id="c", title="A fake news corpus", sentence="We release a corpus of fake news."),
        Point(n=4, paper_id="d", title="RoBERTa for rumours", sentence="RoBERTa with an LSTM head."),
        Point(n=5, paper_id="e", title="Annotated claims", sentence="We annotate claims for checking."),
        Point(n=6, paper_id="f", title="Cues", sentence="Satire differs from fake news."),
    ]
    groups = group_points(pts, "How are rumours and fake news detected?")
    assert [(label, [p.paper_id for p in ps]) for label, ps in groups] == [
        ("Pre-trained transformers (BERT and kin)", ["a", "d"]),
        ("Datasets, corpora and shared tasks", ["c", "e"]),
        ("Other approaches", ["b", "f"]),  # one neural network paper left: no group of its own
    ]
    # An approach the question names is shared by all: not a group.
    by_bert = group_points(pts, "How is BERT used to detect rumours?")
    assert "Pre-trained transformers (BERT and kin)" not in [label for label, _ in by_bert]
    assert group_points(pts[:2], "q") == [("Papers", pts[:2])]


def test_open_eval_metrics_and_bm25_baseline() -> None:
    bm25 = TitleAbstractBM25(
        [("a", "sarcasm detection in tweets"), ("b", "machine translation"), ("c", "sarcasm")]
    )
    assert bm25.search("sarcasm tweets", 2) == ["a", "c"]
    assert precision_at(["a", "c"], {"a", "x"}, 10) == 0.1 and recall_at(["a", "c"], {"a", "x"}, 10) == 0.5


# --- the literature answer end to end -----------------------------------------------------------


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    # Its own: the service test writes beside it.
    return small_library(
        "literature",
        corpus={"paper_ids": SARCASM + OTHERS},
        rerank={"provider": "none"},
        llm={"provider": "extractive"},
    )


@pytest.fixture  # per test: the service test opens the index itself (one holder at a time)
def retriever(lib: Settings) -> Iterator[Retriever]:
    store, embedder = open_for_search(lib)
    hybrid = HybridRetriever(store, embedder, lib.retrieval, load_resolver(lib))
    yield make_reranking_retriever(lib, store, hybrid, IdentityReranker())
    store.close()


def _check_literature(a: Answer, *, min_papers: int = 3) -> None:
    assert a.form == "literature" and not a.abstained and a.groups and a.papers
    # Every sentence of the text cites a passage, and every citation names a numbered passage.
    numbered = {c.n: c for c in a.chunks if c.n is not None}
    for para in a.text.split("\n\n"):
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", para):
            assert cited_numbers(sentence), sentence
    assert {c.n for c in a.citations} == set(cited_numbers(a.text)) <= set(numbered)
    for c in a.citations:
        assert numbered[c.n].chunk_id == c.chunk_id and c.supported
    cited = {c.paper_id for c in a.citations}
    assert len(cited) >= min_papers
    assert {p.paper_id for p in a.papers} <= cited
    for p in a.papers:
        assert p.url == f"https://arxiv.org/abs/{p.paper_id}" and f"[{p.n}]" in p.point
    # A paper's "we" is shown as its authors: arag built none of it.
    for shown in (a.text, *(p.point for p in a.papers)):
        assert not re.search(r"\b(?:[Ww]e|[Oo]urs?|us)\b", shown), shown


def test_extractive_literature_answer_cites_several_papers(lib: Settings, retriever: Retriever) -> None:
    agent = build_agent(lib, retriever, None)
    a = agent.run("How do researchers automatically detect sarcasm and irony in tweets?")
    _check_literature(a)
    assert a.mode == "extractive" and set(SARCASM) >= {c.paper_id for c in a.citations}
    grader = next(e for e in a.events if e.node == "grader")
    assert grader.decision.startswith("sufficient (literature)")
    assert [e.node for e in a.events] == [
        "router", "planner", "retriever", "grader", "context", "synthesizer", "verifier",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "question", ["How do I bake sourdough bread?", "How much compute was used to train GPT-4?"]
)
def test_off_library_questions_are_declined(lib: Settings, retriever: Retriever, question: str) -> None:
    a = build_agent(lib, retriever, None).run(question)
    assert a.abstained and a.citations == [] and a.retries == 1


def _overview_llm(bad: bool = False) -> ScriptedLLM:
    """An LLM whose overview copies the first two points (citing them) and adds an invented claim."""

    def reply(messages: Sequence[ChatMessage]) -> str:
        system, user = messages[0].content, messages[-1].content
        if system == prompts.PLANNER_SYSTEM:
            return '{"kind": "simple", "sub_queries": []}'
        assert system == prompts.OVERVIEW_SYSTEM, system[:60]
        points = re.findall(r"^\[(\d+)\] [^:\n]*: (.*)$", user, re.M)
        assert len(points) >= 3
        (n1, s1), (n2, s2) = points[0], points[1]
        invented = "Quokkas annotated every tweet by hand in Perth [1]."
        if bad:
            return invented
        return f"{s1.rstrip(' .…')} [{n1}]. {s2.rstrip(' .…')} [{n2}][99]. {invented}"

    return ScriptedLLM([], default=reply)


def test_llm_overview_is_verified_and_streams_nothing_unchecked(lib: Settings, retriever: Retriever) -> None:
    settings = lib.model_copy(update={"llm": lib.llm.model_copy(update={"provider": "llama-cpp"})})
    llm = _overview_llm()
    a = build_agent(settings, retriever, llm).run(
        "How do researchers automatically detect sarcasm and irony in tweets?"
    )
    _check_literature(a)
    assert a.mode == "llm" and "Quokkas" not in a.text and "[99]" not in a.text and a.dropped_claims >= 1
    # The overview is one call (after the planner's), with the points only: a short prompt.
    overview = [c for c in llm.calls if c[0].content == prompts.OVERVIEW_SYSTEM]
    assert len(overview) == 1 and len(overview[0][-1].content) < 4000
    # A useless overview costs only the overview: the points stand.
    a = build_agent(settings, retriever, _overview_llm(bad=True)).run(
        "How do researchers automatically detect sarcasm and irony in tweets?"
    )
    _check_literature(a)
    assert "Quokkas" not in a.text


def test_a_question_naming_a_paper_is_answered_as_before(lib: Settings, retriever: Retriever) -> None:
    title = "Joint learning of ontology and semantic parser from text"
    a = build_agent(lib, retriever, None).run(f"In the paper '{title}': how is the ontology induced?")
    assert a.form == "answer" and a.groups == [] and {c.paper_id for c in a.chunks} == {"1601.00901"}


def test_service_search_and_query_return_papers(lib: Settings) -> None:
    from fastapi.testclient import TestClient

    from arag.api import Library
    from arag.service import create_app

    q = "How do researchers automatically detect sarcasm and irony in tweets?"
    with (
        Library(lib) as library,
        TestClient(create_app(library.settings, library=library), base_url="http://127.0.0.1:7860") as c,
    ):
        r = c.post("/search", json={"query": q, "k": 5})
        assert r.status_code == 200, r.text
        papers = r.json()["papers"]
        assert papers and papers[0]["paper_id"] in SARCASM and papers[0]["passages"]
        assert papers[0]["arxiv_url"] == f"https://arxiv.org/abs/{papers[0]['paper_id']}"
        named = c.post(
            "/search",
            json={"query": "In the paper 'Joint learning of ontology and semantic parser from text': data"},
        )
        assert named.json()["papers"] == [] and named.json()["resolved_paper"] == "1601.00901"
        body = c.post("/query", json={"question": q}).json()
        assert body["form"] == "literature" and len(body["papers"]) >= 3 and body["groups"]
        assert {p["paper_id"] for p in body["papers"]} <= set(SARCASM)


def test_a_paper_named_by_an_id_the_library_lacks_is_not_answered_from_others(
    lib: Settings, retriever: Retriever
) -> None:
    a = build_agent(lib, retriever, None).run("Which multilingual approaches are compared in 1912.01214?")
    assert a.abstained and a.form == "answer" and a.citations == []
    grader = next(e for e in a.events if e.node == "grader")
    assert "paper 1912.01214 is not in the library" in grader.decision


def test_reported_puts_a_papers_we_in_the_third_person() -> None:
    assert reported("In this paper, we propose a new model for fake news.") == (
        "In this paper, the authors propose a new model for fake news."
    )
    assert reported("We built a filter; our results let us beat the US baseline.") == (
        "The authors built a filter; their results let them beat the US baseline."
    )
    assert reported("We\u2019ve shown what we're after. Ours wins; WE is an acronym.") == (
        "The authors have shown what the authors are after. Theirs wins; WE is an acronym."
    )
    # Words that only begin with the pronouns are left alone.
    assert reported("Western users usually trust ourselves.") == "Western users usually trust themselves."
    assert reported("Wearable user studies.") == "Wearable user studies."
    # A sentence that names the authors only by "our": "Their method ..." out of its paper reads as
    # someone else's. Its first "our" is the authors', the next one theirs; with a "we", "their".
    assert reported("Our method beats our baseline. To the best of our knowledge, it is new.") == (
        "The authors' method beats their baseline. To the best of the authors' knowledge, it is new."
    )
    assert reported("In our work, we introduce co-attention.") == (
        "In their work, the authors introduce co-attention."
    )
    assert reported("The US team and our model.") == "The US team and the authors' model."


def test_an_overview_sentence_cannot_ride_along_with_the_next_ones_citation() -> None:
    def passage(n: int, pid: str, text: str) -> ContextPassage:
        chunk = _hit(pid, n).chunk.model_copy(update={"text": text, "embed_text": text})
        return ContextPassage(n=n, chunk=chunk, text=text, score=1.0, tokens=len(text.split()))

    passages = [
        passage(1, "A", "We classify news articles with a convolutional network over their words."),
        passage(2, "B", "r/Fakeddit is a multimodal fake news dataset of one million Reddit posts."),
    ]
    # The first sentence (no marker) is claimed by no passage; the splitter alone joins it to the
    # second, whose passage then supports the pair on the second's words.
    overview = (
        "Detectors read the sharing graph of retweets and follower cascades. r/Fakeddit is a multimodal "
        "fake news dataset of one million Reddit posts [2]."
    )
    draft = Draft(short_answer="", explanation="", mode="llm", overview=overview)
    scorer = LexicalSupport()
    assert len(sentences(overview)) == 1
    assert len(split_claims(overview)) == 2
    assert scorer.score(strip_citations(overview), passages[1].chunk.text) >= scorer.threshold
    v = verify_literature(draft, passages, scorer)
    assert v.overview == "r/Fakeddit is a multimodal fake news dataset of one million Reddit posts [2]."
    assert (v.claims, v.supported, v.dropped) == (2, 1, 1)


def test_an_overview_says_each_sentence_once() -> None:
    # The 1.5B's overview of reinforcement learning for dialogue generation, verbatim: one sentence
    # written once per pair of papers. The first is kept; the same words again tell the reader nothing.
    def passage(n: int, pid: str) -> ContextPassage:
        text = f"We use reinforcement learning for dialogue generation with reward {n}."
        chunk = _hit(pid, n).chunk.model_copy(update={"text": text, "embed_text": text})
        return ContextPassage(n=n, chunk=chunk, text=text, score=1.0, tokens=len(text.split()))

    passages = [passage(n, pid) for n, pid in [(2, "A"), (5, "B"), (9, "C"), (12, "D")]]
    overview = markers_as_words(
        "[2] and [5] papers use reinforcement learning for dialogue generation.\n"
        "[9] and [12] papers use reinforcement learning for dialogue generation."
    )
    draft = Draft(short_answer="", explanation="", mode="llm", overview=overview)
    v = verify_literature(draft, passages, LexicalSupport())
    assert v.overview == "Two papers use reinforcement learning for dialogue generation [2] [5]."
    assert (v.claims, v.supported, v.dropped) == (2, 1, 1)
    # Other words are another claim, kept.
    other = overview.replace("[9] [12] use reinforcement learning for", "[9] [12] use a reward for")
    v = verify_literature(draft.model_copy(update={"overview": other}), passages, LexicalSupport())
    assert (v.claims, v.supported, v.dropped) == (2, 2, 0)
    # A claim that copies a point the answer shows below it (near enough: "we" read as "the authors",
    # a comma gone) says it twice too.
    point = "We use reinforcement learning for dialogue generation with reward 2."
    copied = "The authors use reinforcement learning, for dialogue generation with reward 2 [2]."
    draft = Draft(
        short_answer="", explanation="", mode="llm", overview=copied, groups=[("Papers", [(2, point)])]
    )
    v = verify_literature(draft, passages, LexicalSupport())
    assert v.overview == "" and [pts for _, pts in v.groups] == [[(2, point)]]


def test_an_overview_claim_names_only_what_its_papers_write() -> None:
    # Asked how ELMo and BERT embeddings differ, the 1.5B contrasted each ELMo paper with BERT, which
    # those papers never mention; the lexical check passed the claims on their other words.
    def passage(n: int, pid: str, title: str, text: str) -> ContextPassage:
        chunk = _hit(pid, n).chunk.model_copy(update={"text": text, "embed_text": text, "title": title})
        return ContextPassage(n=n, chunk=chunk, text=text, score=1.0, tokens=len(text.split()))

    passages = [
        passage(8, "A", "Subword ELMo", "We present subword-aware ELMo embeddings for rare words."),
        passage(
            12, "B", "Comparing BERT and ELMo", "BERT embeddings outperform ELMo embeddings on most tasks."
        ),
        passage(15, "C", "SIM: a simulator", "Our simulator decodes each turn with a recurrent generator."),
    ]
    overview = (
        "ELMo embeddings are subword-aware, while BERT embeddings are not [8]. BERT embeddings outperform "
        "ELMo embeddings on most tasks [12]. SIM decodes each turn with a recurrent generator [15]."
    )
    draft = Draft(short_answer="", explanation="", mode="llm", overview=overview)
    scorer = LexicalSupport()
    assert (
        scorer.score("ELMo embeddings are subword-aware, while BERT embeddings are not", passages[0].text)
        >= scorer.threshold
    )
    v = verify_literature(draft, passages, scorer)
    # Kept: the names its paper writes, in its passage or (SIM) its title.
    assert v.overview == (
        "BERT embeddings outperform ELMo embeddings on most tasks [12]. "
        "SIM decodes each turn with a recurrent generator [15]."
    )
    assert (v.claims, v.supported, v.dropped) == (3, 2, 1)


def test_a_part_about_the_paper_the_first_part_asks_for() -> None:
    q1 = "Which paper learns an ontology jointly with a semantic parser"
    assert refers_to_its_paper(q1, "what data was it evaluated on (learns ontology jointly semantic)")
    assert refers_to_its_paper(q1, "how large is the paper's grammar")
    # Papers in the plural, or a first part that asks for no paper, are answered across papers.
    assert not refers_to_its_paper("Which papers learn an ontology", "what data were they evaluated on")
    assert not refers_to_its_paper("How do researchers detect fake news", "how well does it work")
    assert not refers_to_its_paper(q1, "what other parsers exist (learns ontology)")
    assert not refers_to_its_paper("What work has been done on sarcasm detection", "how well does it do")


def test_a_part_about_the_paper_is_searched_in_that_paper_alone(lib: Settings, retriever: Retriever) -> None:
    a = build_agent(lib, retriever, None).run(
        "Which paper learns an ontology jointly with a semantic parser, and what data was it evaluated on?"
    )
    retrieve = next(e for e in a.events if e.node == "retriever")
    assert "1 part about the first part's paper searched in 1601.00901" in retrieve.decision
    assert a.form == "literature" and [g.label for g in a.groups] == [
        "Which paper learns an ontology jointly with a semantic parser",
        "What data was it evaluated on",
    ]
    first, second = a.groups
    assert first.paper_ids[0] == "1601.00901" and second.paper_ids == ["1601.00901"]


def test_an_overview_keeps_no_fragment_the_llm_copied_from_a_clipped_point() -> None:
    # The overview prompt clips points at 25 words ("... for a …"); the 1.5B copied such ends, and
    # cited titles alone. Each was supported word for word by its passage, and none is a sentence.
    assert fragment("Speech Model Pre-training [9].") and fragment("Incorporating External Knowledge [12].")
    assert fragment("Social media offers new opportunities for a [4].")
    assert fragment("It detects propaganda techniques as well as their [3].")
    assert fragment("BLEU improves for the low-resource language pairs: [9].")
    assert not fragment("BERT improves accuracy on SQuAD [2].")
    assert not fragment("Results are in Table 3 [2].")

    text = "Social media offers new opportunities for a study of the mood of users."
    chunk = _hit("A", 1).chunk.model_copy(update={"text": text, "embed_text": text})
    passages = [ContextPassage(n=1, chunk=chunk, text=text, score=1.0, tokens=14)]
    overview = "Social media offers new opportunities for a study of moods [1]. Users share moods for a [1]."
    draft = Draft(short_answer="", explanation="", mode="llm", overview=overview)
    v = verify_literature(draft, passages, LexicalSupport())
    assert v.overview == "Social media offers new opportunities for a study of moods [1]."


def test_markers_the_llm_wrote_as_words_are_given_words() -> None:
    # The 1.5B's overview of reinforcement learning for dialogue (its reply, verbatim but cut short):
    # the verifier moves each claim's markers to its end, which left "and papers use ...".
    reply = (
        "[2] and [7] papers use reinforcement learning for dialogue systems. [2] updates both the dialogue "
        "policy and belief trackers, while [7] uses reinforcement learning after supervised learning."
    )
    assert markers_as_words(reply) == (
        "Two papers [2] [7] use reinforcement learning for dialogue systems. One paper [2] updates both the "
        "dialogue policy and belief trackers, while another paper [7] uses reinforcement learning after "
        "supervised learning."
    )
    cases = {
        "[1], [2] and [3] study sarcasm.": "Three papers [1] [2] [3] study sarcasm.",
        "Both [1] and [2] also use BERT.": "Both papers [1] [2] also use BERT.",
        "Results improve [2], and [3] reports it.": "Results improve [2], and one paper [3] reports it.",
        "It is used in [2] to help.": "It is used in one paper [2] to help.",
        "The first two papers [1] and [2] parse.": "The first two papers [1] [2] parse.",
        # Citations after the words they cite stay as they are ("," and "and" between them go).
        "Sarcasm is studied [1], [2] and [3] in tweets.": "Sarcasm is studied [1] [2] [3] in tweets.",
        "X is shown with a reward function [4] and a policy [5] in dialogue.": (
            "X is shown with a reward function [4] and a policy [5] in dialogue."
        ),
        "The model [1] is better.": "The model [1] is better.",
        "[3] Models predict political bias.": "[3] Models predict political bias.",
        # Markers as the citation cleaner writes lists and ranges.
        "[2, 7] papers use RL.": "Two papers [2, 7] use RL.",
        "[2-4] use RL.": "Three papers [2-4] use RL.",
        # The 1.5B's "The study by [3]": the marker names the study ("by one paper" is no author).
        "The study by [3] proposes a method.": "The study [3] proposes a method.",
        "The authors of [4] say so.": "The authors of one paper [4] say so.",
    }
    for text, expected in cases.items():
        assert markers_as_words(text) == expected, text


def test_an_overview_cut_off_mid_sentence_loses_its_last_sentence() -> None:
    cut = "Two papers [2] [7] use reinforcement learning [2]. One paper [4] uses sentiment to identify"
    assert complete_sentences(cut) == "Two papers [2] [7] use reinforcement learning [2]."
    assert complete_sentences("Models detect rumours [2].") == "Models detect rumours [2]."
    assert complete_sentences('It is called "Fakeddit".') == 'It is called "Fakeddit".'
    assert complete_sentences("One paper uses a GRU to decode") == ""


def test_papers_the_llm_counted_off_are_one_and_another() -> None:
    # The 1.5B's hate-speech overview: "first" and "second" are its prompt's order, which no reader sees.
    counted = (
        "The first paper proposes a novel task [6], while the second addresses the limitations of "
        "classifiers [6]. The third emphasizes context [8]."
    )
    assert ordinals_as_words(counted) == (
        "One paper proposes a novel task [6], while another paper addresses the limitations of "
        "classifiers [6]. Another paper emphasizes context [8]."
    )
    assert (
        ordinals_as_words("The first two papers focus on parsing [2].") == "Two papers focus on parsing [2]."
    )
    # Not counting papers: an ordinal is the paper's own word.
    kept = "The authors present the first code-switching treebank [5]. The second results hold [5]."
    assert ordinals_as_words(kept) == kept
    assert ordinals_as_words("The first paper finds gains [1]. The first results show it [1].") == (
        "One paper finds gains [1]. The first results show it [1]."
    )
    # The ontology question's two parts, both drawn from 1601.00901 ([1] and [2]): not "another paper".
    two_parts = "The first paper proposes joint learning [1]. The second paper evaluates it on DBpedia [2]."
    papers = {1: "1601.00901", 2: "1601.00901", 3: "1708.09025"}
    assert ordinals_as_words(two_parts, papers) == (
        "One paper proposes joint learning [1]. The same paper evaluates it on DBpedia [2]."
    )
    assert ordinals_as_words(two_parts.replace("[2]", "[3]"), papers) == (
        "One paper proposes joint learning [1]. Another paper evaluates it on DBpedia [3]."
    )


def test_this_paper_in_an_overview_of_several_is_one_and_another() -> None:
    # The 1.5B's poetry overview: each "This paper" is another paper, and only the markers say which.
    papers = {3: "2003.11528", 4: "2003.11528", 6: "2003.01119", 7: "1909.09534"}
    poems = (
        "This paper proposes generating classical Chinese poems from vernacular [3]. This paper proposes "
        "a GPT-2 based framework [6]. This paper uses three datasets [7]."
    )
    assert this_paper_as_words(poems, papers) == (
        "One paper proposes generating classical Chinese poems from vernacular [3]. Another paper "
        "proposes a GPT-2 based framework [6]. Another paper uses three datasets [7]."
    )
    # A paper cited before (its two passages [3] and [4]); the noun is the LLM's own.
    again = (
        "Poems are generated from vernacular [3]. The study also tests style transfer [4]. "
        "The work uses GPT-2 [6]."
    )
    assert this_paper_as_words(again, papers) == (
        "Poems are generated from vernacular [3]. The same study also tests style transfer [4]. "
        "Another work uses GPT-2 [6]."
    )
    # One paper cited, a sentence citing two, "this paper" inside a sentence: left as written.
    # The 1.5B's leading markers stay where it put them (the verifier moves them).
    led = "[3] This paper proposes a novel task. [6] The paper proposes a framework."
    assert this_paper_as_words(led, papers) == (
        "[3] One paper proposes a novel task. [6] Another paper proposes a framework."
    )
    one = "This paper proposes X [3]. This paper also evaluates Y [4]."
    assert this_paper_as_words(one, papers) == one
    both = "This paper and its follow-up compare X [3] [6]. In this paper, the authors propose Y [7]."
    assert this_paper_as_words(both, papers) == both


def test_the_short_answer_counts_each_groups_papers() -> None:
    # The first label alone ("8 papers: Neural networks (CNN, RNN, attention)") read as if it were all 8.
    groups = [("Neural networks (CNN, RNN, attention)", ["a", "b"]), ("Other approaches", ["c", "d", "e"])]
    assert literature_short_answer(groups, 5) == (
        "5 papers: Neural networks (CNN, RNN, attention) (2); Other approaches (3)"
    )
    # One group of fewer than three papers has no label to give; a compound question's parts may
    # share a paper, which each part counts (and the total once).
    assert literature_short_answer([("Papers", ["a", "b"])], 2) == "2 papers"
    assert literature_short_answer(
        [("Ways to detect fake news", ["a", "b", "b"]), ("Where they fail", ["b"])], 2
    ) == ("2 papers: Ways to detect fake news (2); Where they fail (1)")
    assert literature_short_answer([("Papers", ["a"])], 1) == "1 paper"


def test_an_overview_claim_drawn_from_papers_it_does_not_cite_is_dropped() -> None:
    # The 1.5B's gender-bias overview gave paper [3] the method of a paper it did not cite.
    claim = (
        "The proposed approach for mitigating gender bias is to treat it as a domain adaptation problem [3]."
    )
    cited = "We propose a new loss function for mitigating gender bias in word-level language models."
    other = "Reducing gender bias in machine translation as a domain adaptation problem: we treat it so."
    assert misattributed(claim, held_terms(cited), held_terms(other))
    # The words are the cited paper's, or nobody's: kept (a claim the cited passages do not support is
    # the support check's to drop).
    assert not misattributed(
        claim, held_terms(f"{cited} We treat it as domain adaptation."), held_terms(other)
    )
    assert not misattributed(claim, held_terms(cited), held_terms("Unrelated text about parsing."))
    # Two terms only in another paper are not enough.
    sim = "SIM and the policy both use a GRU to decode [8]."
    assert not misattributed(sim, held_terms("A GRU decodes the policy."), held_terms("SIM"))


def test_the_overview_names_its_first_paper_one_once_the_claims_before_it_are_dropped() -> None:
    assert (
        first_mention("Another paper finds that images help [12].")
        == "One paper finds that images help [12]."
    )
    assert first_mention("[8] The same study uses context.") == "[8] One study uses context."
    assert first_mention("Another approach uses context [8].") == "Another approach uses context [8]."


def test_a_claim_about_several_papers_that_cites_one_is_said_of_one() -> None:
    # The 1.5B's "The papers compare ... [2]" and "Two papers focus on ... [2]", each citing one paper.
    assert one_paper("The papers compare the prevalence of distorted thinking [2].") == (
        "One paper compares the prevalence of distorted thinking [2]."
    )
    assert one_paper("Two papers focus on learner English [2].", "Another") == (
        "Another paper focuses on learner English [2]."
    )
    assert one_paper("Several studies have proposed parsers [3].") == "One study has proposed parsers [3]."
    assert one_paper("Most works also rely on BERT [4].") == "One work also relies on BERT [4]."
    assert one_paper("[3] The papers study sarcasm.") == "[3] One paper studies sarcasm."
    # The 1.5B's "They propose ... [5]. They investigate ... [9].": each "they" is the paper cited.
    assert one_paper("They propose a method [5].", "Another") == "Another paper proposes a method [5]."
    assert one_paper("They also use recurrent models [9].", "The same") == (
        "The same paper also uses recurrent models [9]."
    )
    assert one_paper("Their method works [2].") is None
    # Not about several papers, or no verb to agree with: None (the claim stays as written).
    assert one_paper("The paper compares X [2].") is None
    assert one_paper("The papers in this area use X [1].") is None
    assert one_paper("Researchers compare X [2].") is None


def test_an_overview_claim_naming_other_papers_authors_is_no_claim_of_the_cited_paper() -> None:
    # The 1.5B copied the citations inside the rumour points: "[1] Mendoza et al. [2] used Gaussian
    # Processes ... than other classifiers [4] Yang et. al. [5] used novelty detection ...".
    assert names_authors("Mendoza et al. One paper used Gaussian Processes [1] [2].")
    assert names_authors("It beats other classifiers Yang et [1] [2].")
    assert names_authors("As in Yang et. al., novelty detection finds rumours [5].")
    assert not names_authors("Novelty detection finds rumours in the ET corpus [5].")
    assert not names_authors("The authors detect rumours with Gaussian Processes [2].")


# --- "how many papers ...": the library's count ---------------------------------------------------


def test_a_count_question_is_told_from_other_questions() -> None:
    for q in (
        "How many papers in the library are about sentiment analysis?",
        "how many NLP papers study sarcasm?",
        "What is the number of papers on fake news?",
    ):
        assert count_question(q), q
    for q in (
        "How many layers does the model have?",
        "How do papers detect sarcasm?",
        "How many parameters do the papers' models have?",
        "how many articles are in the dataset?",
    ):
        assert not count_question(q), q
    # The count's own frame is no topic term.
    assert count_terms("How many papers in the library are about sentiment analysis?") == [
        "sentiment",
        "analysi",
    ]
    assert count_terms("What is the number of papers on fake news?") == ["fake", "news"]


def test_papers_holding_every_term_in_title_or_abstract() -> None:
    def abstract(pid: str, title: str, text: str) -> ScoredChunk:
        chunk = Chunk(id=f"{pid}:0000:00000000", paper_id=pid, index=0, title=title, type="abstract",
                      text=text, embed_text=text, n_tokens=len(text.split()))  # fmt: skip
        return ScoredChunk(chunk=chunk, score=1.0)

    hits = [
        abstract("a", "Sentiment analysis of tweets", "We classify tweets."),
        abstract("b", "Opinion mining", "We analyse the sentiment of reviews."),  # British spelling
        abstract("c", "Emotion detection", "Sentiment is one of our labels."),  # no analysis
        abstract("a", "Sentiment analysis of tweets", "A second piece of a's abstract."),
    ]
    assert papers_holding(hits, ["sentiment", "analysi"]) == ["a", "b"]
    asked: list[str] = []
    count = library_count("How many papers are about sentiment analysis?", lambda q: asked.append(q) or hits)
    assert asked == ["sentiment analysis"]
    assert count == LibraryCount(papers=2, words=["sentiment", "analysis"])
    assert count_sentence(count) == (
        '2 papers in the library have "sentiment" and "analysis" in their title or abstract'
    )
    one = LibraryCount(papers=1, words=["sarcasm"])
    assert count_sentence(one) == '1 paper in the library has "sarcasm" in its title or abstract'
    assert library_count("How many papers are there?", lambda q: hits) is None
    mt = library_count(
        "How many papers are on machine translation for low-resource languages?", lambda q: hits
    )
    assert mt == LibraryCount(papers=0, words=["machine", "translation", "low-resource", "languages"])


def test_a_count_question_gets_the_librarys_count(lib: Settings, retriever: Retriever) -> None:
    import gzip
    import json

    # Counted independently: the small library's papers whose title or abstract say "sarcas...".
    with gzip.open(lib.corpus.qasper_path, "rt") as f:
        papers = [json.loads(line) for line in f]
    expected = sum(
        "sarcas" in f"{p['title']} {p['abstract']}".lower() for p in papers if p["id"] in SARCASM + OTHERS
    )
    assert expected >= 3
    agent = build_agent(lib, retriever, None)
    a = agent.run("How many papers in the library are about sarcasm?")
    _check_literature(a)
    head = f'{expected} papers in the library have "sarcasm" in their title or abstract; the answer draws on '
    assert a.short_answer.startswith(head), a.short_answer
    # The number the answer draws on follows, as for any literature answer.
    assert re.match(rf"{re.escape(head)}\d+ papers", a.short_answer)
    # API clients read the count as a field, not from the short answer's words.
    assert a.library_count == LibraryCount(papers=expected, words=["sarcasm"])
    retrieved = next(e for e in a.events if e.node == "retriever")
    assert head.split(";")[0] in retrieved.decision
    # Any other open question's short answer is as before.
    b = agent.run("How do researchers automatically detect sarcasm and irony in tweets?")
    assert re.match(r"\d+ papers", b.short_answer)
    assert b.library_count is None


def test_arag_ask_prints_the_count_and_each_paper_once(
    lib: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from typer.testing import CliRunner

    from arag.cli.main import app

    env = {
        "ARAG_DATA_DIR": str(lib.data_dir),
        "ARAG_CORPUS__PAPER_IDS": json.dumps(SARCASM + OTHERS),
        "ARAG_EMBEDDING__PROVIDER": "hash",
        "ARAG_TOPICS__K": "2",
        "ARAG_RERANK__PROVIDER": "none",
        "ARAG_LLM__PROVIDER": "extractive",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    res = CliRunner().invoke(app, ["ask", "How many papers in the library are about sarcasm?"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert re.search(
        r'^\d+ papers in the library have "sarcasm" in their title or abstract; the answer draws on',
        out,
        re.M,
    )
    assert "Sources (the papers, each with its [n] markers)" in out
    lines = [line for line in out.splitlines() if re.match(r"\s+\[\d+\]", line)]
    ids = [re.search(r"arxiv\.org/abs/(\S+)", line)[1] for line in lines]  # type: ignore[index]
    assert ids and len(ids) == len(set(ids)) and set(ids) <= set(SARCASM + OTHERS)


def test_how_many_papers_with_no_topic_is_the_librarys_size(lib: Settings, retriever: Retriever) -> None:
    from arag.agent.router import route_rules

    for q in (
        "How many papers?",
        "How many papers are in the library?",
        "What is the number of papers here?",
    ):
        assert route_rules(q).route == "about", q
    assert route_rules("How many papers use BERT?").route == "research"
    agent = build_agent(lib, retriever, None)
    a = agent.run("How many papers are in the library?")
    n = len(SARCASM + OTHERS)
    assert (a.route, a.short_answer, a.abstained) == ("about", f"{n} papers", False)
    assert a.text.startswith(f"The library holds {n} papers")
    assert a.library_count == LibraryCount(papers=n, words=[])


def test_a_compound_question_counts_the_part_that_asks_how_many(lib: Settings, retriever: Retriever) -> None:
    agent = build_agent(lib, retriever, None)
    a = agent.run("How many papers are about sarcasm, and how do they detect it?")
    assert a.form == "literature" and len(a.groups) == 2
    # The count is of the first part's topic, not of "sarcasm" and "detect".
    counted = r'\d+ papers? in the library (?:have|has) "sarcasm" in (?:their|its) title or abstract;'
    assert re.match(counted, a.short_answer), a.short_answer


def test_a_count_question_the_library_cannot_answer_still_gives_its_count(
    lib: Settings, retriever: Retriever
) -> None:
    a = build_agent(lib, retriever, None).run("How many papers are about sourdough bread?")
    assert a.abstained and a.short_answer == prompts.NOT_IN_LIBRARY
    assert a.library_count == LibraryCount(papers=0, words=["sourdough", "bread"])
    assert a.text.startswith(
        '0 papers in the library have "sourdough" and "bread" in their title or abstract.\n\n'
    )
    assert prompts.ABSTAIN in a.text
