from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from arag.corpus.qasper_questions import EvalQuestion, count_skipped, load_questions
from arag.errors import InputError
from arag.eval.retrieval import bootstrap_ci, evaluate_retrieval, hits_per_rank, mrr_at, ndcg_at, recall_at
from arag.records import Chunk, ScoredChunk, SearchFilter

GOLD = [
    "We train on the Penn Treebank. The corpus has one million words.",
    "Results are in Table TABREF3. Our model wins by two points.",
]


def test_hits_match_sentences_of_gold_paragraphs() -> None:
    chunks = [
        "Unrelated text about something else entirely.",
        "the corpus has one million words.\nResults are in Table TABREF3.",  # parts of both
        "We  train on the Penn   Treebank.",  # whitespace differs
    ]
    assert hits_per_rank(chunks, GOLD) == [set(), {0, 1}, {0}]


def test_recall_and_ndcg_exact() -> None:
    hits = [set(), {0}, {0}, {1}]
    assert recall_at(hits, 2, 1) == 0.0
    assert recall_at(hits, 2, 2) == 0.5
    assert recall_at(hits, 2, 10) == 1.0
    ideal = 1 + 1 / math.log2(3)
    assert ndcg_at(hits, 2, 10) == pytest.approx((1 / math.log2(3) + 1 / math.log2(5)) / ideal)
    assert ndcg_at([{0, 1}], 2, 10) == pytest.approx(1 / ideal)  # one chunk, one gain
    assert ndcg_at([], 3, 10) == 0.0


def test_mrr_and_bootstrap() -> None:
    assert mrr_at([set(), set(), {1}], 10) == pytest.approx(1 / 3)
    assert mrr_at([set(), {0}], 1) == 0.0
    lo, hi = bootstrap_ci([0.0, 1.0] * 50)
    assert 0.38 < lo < 0.5 < hi < 0.62
    assert bootstrap_ci([0.0, 1.0] * 50) == (lo, hi)  # fixed seed
    assert bootstrap_ci([]) == (0.0, 0.0)


def _chunk(cid: str, paper: str, text: str) -> ScoredChunk:
    c = Chunk(
        id=cid, paper_id=paper, index=0, title="T", type="passage", text=text, embed_text=text, n_tokens=5
    )
    return ScoredChunk(chunk=c, score=1.0)


def test_evaluate_with_a_scripted_search() -> None:
    q = EvalQuestion(
        question_id="q1", paper_id="p1", paper_title="Title", question="what corpus?", evidence=GOLD
    )
    seen: list[tuple[str, SearchFilter | None]] = []

    def search(query: str, flt: SearchFilter | None) -> list[ScoredChunk]:
        seen.append((query, flt))
        return [_chunk("a", "p2", "noise"), _chunk("b", "p1", GOLD[1])]

    lib = evaluate_retrieval(search, [q], scope="library")
    assert seen[0] == ("In the paper 'Title': what corpus?", None)
    m = {k: v.mean for k, v in lib.metrics.items()}
    assert m["recall@5"] == m["recall@10"] == m["recall@20"] == 0.5
    assert m["paper@5"] == 1.0 and m["mrr@10"] == 0.5
    assert m["ndcg@10"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    assert lib.metrics["recall@10"].lo == lib.metrics["recall@10"].hi == 0.5  # one question: no spread
    evaluate_retrieval(search, [q], scope="paper")
    assert seen[1] == ("what corpus?", SearchFilter(paper_ids=["p1"]))


def test_load_questions_keeps_text_evidence_only(tmp_path: Path) -> None:
    head = {"paper_id": "p", "paper_title": "T", "question": "q?"}
    rows = [
        {**head, "question_id": "a", "answers": [{"evidence": ["FLOAT SELECTED: Table 1", "para one"]}]},
        {**head, "question_id": "a2", "answers": []},
        {**head, "question_id": "b", "answers": [{"evidence": ["FLOAT SELECTED: Figure 2"]}]},
    ]
    rows[0]["answers"].append({"evidence": ["para one", "two"]})
    path = tmp_path / "q.json"
    path.write_text(json.dumps(rows))
    (q,) = load_questions(path)
    assert q.question_id == "a" and q.evidence == ["para one", "two"]
    assert count_skipped(path) == 2


def test_validation_split_has_892_questions_with_text_evidence(shared_dir: Path) -> None:
    qs = load_questions(shared_dir / "benchmarks" / "qasper" / "questions_validation.json")
    assert len(qs) == 892


def test_official_qasper_v03_format_is_read(tmp_path: Path) -> None:
    official = {
        "1801.00001": {
            "title": "A Paper",
            "abstract": "x",
            "full_text": [{"section_name": "Intro", "paragraphs": ["para one"]}],
            "qas": [
                {
                    "question": "what?",
                    "question_id": "q1",
                    "answers": [
                        {"answer": {"unanswerable": False, "extractive_spans": ["a"], "yes_no": None,
                                    "free_form_answer": "", "evidence": ["para one"]},
                         "annotation_id": "x", "worker_id": "w"},
                    ],
                },
                {"question": "none?", "question_id": "q2", "answers": [{"answer": {"evidence": []}}]},
            ],
        }
    }  # fmt: skip
    path = tmp_path / "qasper-dev-v0.3.json"
    path.write_text(json.dumps(official))
    (q,) = load_questions(path)
    assert (q.paper_id, q.paper_title, q.question_id, q.evidence) == (
        "1801.00001",
        "A Paper",
        "q1",
        ["para one"],
    )
    assert count_skipped(path) == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(InputError, match="not a JSON file"):
        load_questions(bad)


def test_questions_files_are_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    row = {
        "paper_id": "p",
        "paper_title": "Résumé parsing",
        "question_id": "a",
        "question": "Which naïve baseline?",
        "answers": [{"evidence": ["Our naïve baseline uses “quotes”."]}],
    }
    path = tmp_path / "q.json"
    path.write_text(json.dumps([row], ensure_ascii=False), encoding="utf-8")
    # An ASCII locale with Python's UTF-8 mode and locale coercion off: open()'s default is ASCII.
    env = dict(os.environ, LC_ALL="POSIX", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    code = (
        "import sys, pathlib; from arag.corpus.qasper_questions import load_questions as q; "
        "print(ascii(q(pathlib.Path(sys.argv[1]))[0].question))"
    )
    res = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ascii("Which naïve baseline?")
    latin = tmp_path / "latin1.json"
    latin.write_bytes(json.dumps([row], ensure_ascii=False).encode("latin-1", "replace"))
    with pytest.raises(InputError, match="not UTF-8"):
        load_questions(latin)


def test_questions_about_papers_outside_the_library_are_counted_and_left_out() -> None:
    from arag.corpus.qasper_questions import questions_in_library
    from arag.eval.retrieval import check_limit

    qs = [
        EvalQuestion(question_id=str(i), paper_id=p, paper_title="T", question="q?", evidence=["e"])
        for i, p in enumerate(["a", "b", "a", "c"])
    ]
    kept, absent = questions_in_library(qs, {"a", "x"}, where="q.json")
    assert [q.question_id for q in kept] == ["0", "2"] and absent == 2
    with pytest.raises(InputError, match="none of the 4 questions"):
        questions_in_library(qs, {"x"}, where="q.json")
    check_limit(None)
    check_limit(1)
    for bad in (0, -3):
        with pytest.raises(InputError, match="at least 1"):
            check_limit(bad)
