from __future__ import annotations

import json
from pathlib import Path

import pytest

from arag.retrieval.resolve import PaperResolver, normalise

PAPERS = [
    ("1810.04805", "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding"),
    ("1706.03762", "Attention Is All You Need"),
    ("2005.11401", "Retrieval-Augmented Generation for Knowledge-Intensive NLP Tasks"),
    ("1901.00001", "Deep Transformers for Language Modeling"),
]


@pytest.fixture(scope="module")
def resolver() -> PaperResolver:
    return PaperResolver(PAPERS)


def test_normalise() -> None:
    assert (
        normalise("  Retrieval-Augmented  Generation: A Study! ") == "retrieval augmented generation a study"
    )
    assert normalise("Improving Yorùbá Diacritic Restoration") == "improving yoruba diacritic restoration"


def test_a_title_with_accents_resolves_typed_with_or_without_them() -> None:
    r = PaperResolver([*PAPERS, ("2003.10564", "Improving Yorùbá Diacritic Restoration")])
    for q in (
        "What data does Improving Yoruba Diacritic Restoration use?",
        "What data does improving yorùbá diacritic restoration use?",
    ):
        ref = r.resolve(q)
        assert ref is not None and ref.paper_id == "2003.10564", q
        assert ref.remainder(q) == "What data does use?"


@pytest.mark.parametrize(
    ("question", "paper", "method"),
    [
        ("What does arXiv:1706.03762v5 propose?", "1706.03762", "arxiv-id"),
        ("In the paper 'Attention Is All You Need': how many heads?", "1706.03762", "quoted-title"),
        ('In "attention is all you need", how many heads?', "1706.03762", "quoted-title"),
        ("In “Retrieval Augmented Generation for Knowledge Intensive NLP Tasks” what is the retriever?",
         "2005.11401", "quoted-title"),
        ("In 'Retreival-Augmented Generation for Knowledge-Intensive NLP Task', what is the retriever?",
         "2005.11401", "quoted-title"),  # typos
        ("how many heads does attention is all you need use", "1706.03762", "title"),
        ("which corpus is bert pre training of deep bidirectional transformers for language understanding "
         "trained on?", "1810.04805", "title"),
        ("In Retrieval-Augmented Generation for Knowledge-Intensive NLP, which retriever?", "2005.11401",
         "title-part"),
    ],
)  # fmt: skip
def test_resolves_the_ways_people_name_papers(
    resolver: PaperResolver, question: str, paper: str, method: str
) -> None:
    ref = resolver.resolve(question)
    assert ref is not None, question
    assert (ref.paper_id, ref.method) == (paper, method)
    assert ref.reason()


@pytest.mark.parametrize(
    "question",
    [
        "How do transformers handle long documents?",
        "Which deep transformers are best for language?",  # words shared with two titles, no span
        "What is 1234.56789 in the table?",  # an id not in the library
        "In 'a paper nobody wrote', what happens?",
        "attention",
    ],
)
def test_weak_or_absent_names_resolve_to_nothing(resolver: PaperResolver, question: str) -> None:
    assert resolver.resolve(question) is None


def test_real_titles_and_validation_questions(qasper_path: Path, shared_dir: Path) -> None:
    from arag.corpus.qasper import load_qasper

    papers, _ = load_qasper(qasper_path)
    r = PaperResolver([(p.id, p.title) for p in papers])
    qs = json.loads((shared_dir / "benchmarks" / "qasper" / "questions_validation.json").read_text())
    forms = {
        "template": lambda q: f"In the paper '{q['paper_title']}': {q['question']}",
        "unquoted, at the end": lambda q: f"{q['question'].rstrip('?')} in {q['paper_title']}?",
        "lowercase, no punctuation": lambda q: f"in {normalise(q['paper_title'])} {q['question']}",
        "arXiv id": lambda q: f"arXiv:{q['paper_id']}v2 {q['question']}",
        "double quotes, upper case": lambda q: f'What does "{q["paper_title"].upper()}" say: {q["question"]}',
    }
    for name, form in forms.items():
        got = [r.resolve(form(q)) for q in qs]
        right = sum(1 for g, q in zip(got, qs, strict=True) if g and g.paper_id == q["paper_id"])
        assert right == len(qs), name
    # The raw questions name no paper: resolving them must (almost) never scope.
    wrong = [q for q in qs if (g := r.resolve(q["question"])) and g.paper_id != q["paper_id"]]
    assert len(wrong) == 0
    # Part of a title: may decline, must not pick a wrong paper.
    parts = []
    for q in qs:
        toks = q["paper_title"].split()
        parts.append((q, r.resolve(f"In {' '.join(toks[: max(3, int(len(toks) * 0.7))])}, {q['question']}")))
    assert all(g.paper_id == q["paper_id"] for q, g in parts if g)
    assert sum(1 for _, g in parts if g) > 0.4 * len(qs)


@pytest.mark.parametrize(
    ("question", "rest"),
    [
        ("In the paper 'Attention Is All You Need': how many heads?", "how many heads?"),
        ('how many heads does "attention is all you need" use', "how many heads does use"),
        ("What does arXiv:1706.03762v5 propose?", "What does propose?"),
        (
            "In Retrieval-Augmented Generation for Knowledge-Intensive NLP, which retriever?",
            "which retriever?",
        ),
        ("ATTENTION IS ALL YOU NEED", "ATTENTION IS ALL YOU NEED"),  # nothing left: keep the question
    ],
)
def test_remainder_drops_the_papers_name(resolver: PaperResolver, question: str, rest: str) -> None:
    ref = resolver.resolve(question)
    assert ref is not None
    assert ref.remainder(question) == rest


def test_a_100k_character_question_costs_linear_work(resolver: PaperResolver) -> None:
    """Title-part resolution walks a trie of title spans from each question token: bounded by the
    longest title, not the question (spans of every length were tried before: a 24k-character
    question took 46 s, a 100k one about an hour). The title at the end is still found."""
    import threading

    filler = " ".join(["deep transformers for retrieval augmented language tasks"] * 1_800)
    question = f"{filler} and in attention is all you need how many heads"
    assert len(question) > 100_000
    found: list[object] = []
    worker = threading.Thread(target=lambda: found.append(resolver.resolve(question)), daemon=True)
    worker.start()
    worker.join(timeout=60)  # generous: it takes well under a second
    assert found, "resolution of a 100k-character question did not finish"
    ref = found[0]
    assert ref is not None and ref.paper_id == "1706.03762"  # type: ignore[attr-defined]
