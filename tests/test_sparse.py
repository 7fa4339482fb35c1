"""BM25 tokenizer and encoders, and BM25 ranking through the real engine against a numpy reference."""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from arag.index.qdrant_edge import EdgeStore
from arag.index.sparse import BM25Encoder, bm25_tf_weight, term_id
from arag.records import Chunk, SparseVector, chunk_id
from arag.text import STOPWORDS, joined_terms, tokenize

# -- tokenizer -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # stopwords (incl. contraction pieces), possessives, hyphens, case, decimals kept whole
        ("Don't we use the models' F1-scores? It's 2 or 3.5!", ["use", "model", "f1", "score", "2", "3.5"]),
        # every QASPER placeholder kind disappears, including a trailing one
        (
            "Unlike BIBREF12, TABREF3 shows (FIGREF1, SECREF2): INLINEFORM0 = DISPLAYFORM0 and EQREF4.",
            ["unlik", "show"],
        ),
        # alphanumeric tokens stay whole; a footnote digit after a word splits off; 1-char letters go
        (
            "GPT2 and word2vec, e.g. x and y; section 4.2. The corpus.3 arXiv:1810.04805 v1.5",
            ["gpt2", "word2vec", "section", "4.2", "corpus", "3", "arxiv", "1810.04805", "v1.5"],
        ),
        # accents folded, ligatures expanded, then stemmed
        ("Naïve café ﬁne-tuning RÉSUMÉ", ["naiv", "cafe", "fine", "tune", "resum"]),
        (
            "running runs ran easily generalization generalizes",
            ["run", "run", "ran", "easili", "general", "general"],
        ),
        # single digits survive, single letters do not; underscores split
        ("a I x 7 __init__ snake_case", ["7", "init", "snake", "case"]),
        ("", []),
        ("the of and, to!", []),
    ],
)
def test_tokenize(text: str, expected: list[str]) -> None:
    assert tokenize(text) == expected


def test_joined_terms_are_adjacent_words_written_as_one() -> None:
    text = "Our data set and pre-trained BERT; fine tuned on GPT2 data, corpus.3 word net"
    assert joined_terms(text) == {
        "ourdata",
        "dataset",
        "setand",
        "andpr",
        "pretrain",
        "trainedbert",
        "finetun",
        "tunedon",
        "wordnet",
    }
    # Punctuation, digits and stand-ins are not a compound's join.
    assert joined_terms("data; set, data.set 2 data BIBREF3 set") == set()


def test_placeholders_only_removed_when_numbered() -> None:
    # "bibref" without a number is an ordinary (odd) word, not a placeholder
    assert tokenize("bibref BIBREF") == ["bibref", "bibref"]


def test_stopword_list_is_the_standard_english_one() -> None:
    assert len(STOPWORDS) == 179
    assert {"the", "of", "which", "should've", "wouldn't"} <= STOPWORDS
    assert "model" not in STOPWORDS


# -- term ids --------------------------------------------------------------------------------------


def test_term_id_is_stable_across_processes() -> None:
    # pinned values: a change here silently breaks every existing index
    assert term_id("bert") == 3831950178
    assert term_id("model") == 4249768482
    assert term_id("3.5") == 2925258103


def test_term_ids_are_unsigned_32_bit() -> None:
    ids = [term_id(f"t{i}") for i in range(2000)]
    assert all(0 <= i < 2**32 for i in ids)
    assert len(set(ids)) == len(ids)


# -- weights ---------------------------------------------------------------------------------------


def _as_dict(v: SparseVector) -> dict[int, float]:
    assert v.indices == sorted(v.indices)
    assert len(v.indices) == len(v.values)
    return dict(zip(v.indices, v.values, strict=True))


def test_document_weights_by_hand() -> None:
    # "cats cats dog" -> [cat, cat, dog], length 3
    enc = BM25Encoder(k1=1.2, b=0.75, avg_len=3.0)
    # length == avg_len: cat = 2*2.2/(2+1.2) = 1.375, dog = 2.2/(1+1.2) = 1.0
    assert _as_dict(enc.encode_document("cats cats dog")) == pytest.approx(
        {term_id("cat"): 1.375, term_id("dog"): 1.0}, abs=1e-12
    )
    # avg_len 6: norm = 0.25 + 0.75*0.5 = 0.625, k1*norm = 0.75 -> cat 4.4/2.75 = 1.6, dog 2.2/1.75
    enc6 = BM25Encoder(avg_len=6.0)
    assert _as_dict(enc6.encode_document("The cats, the cats and a dog.")) == pytest.approx(
        {term_id("cat"): 1.6, term_id("dog"): 2.2 / 1.75}, abs=1e-12
    )
    # b=0 ignores length; k1=0 makes every present term weigh 1
    assert _as_dict(BM25Encoder(b=0.0, avg_len=100).encode_document("cats cats dog"))[
        term_id("cat")
    ] == pytest.approx(1.375)
    assert set(_as_dict(BM25Encoder(k1=0.0).encode_document("cats cats dog")).values()) == {1.0}


def test_tf_weight_saturates() -> None:
    w = [bm25_tf_weight(tf, 100, k1=1.2, b=0.75, avg_len=100) for tf in (1, 2, 10, 1000)]
    assert w == sorted(w)
    assert w[0] == pytest.approx(1.0)
    assert w[-1] < 2.2  # bounded by k1 + 1


def test_query_weights_one_per_distinct_term() -> None:
    q = BM25Encoder().encode_query("Which models, which MODELS and the datasets?")
    assert _as_dict(q) == {term_id("model"): 1.0, term_id("dataset"): 1.0}
    assert BM25Encoder().encode_query("the and of") == SparseVector(indices=[], values=[])


def test_empty_document() -> None:
    assert BM25Encoder().encode_document("BIBREF3 the") == SparseVector(indices=[], values=[])


@pytest.mark.parametrize("kwargs", [{"k1": -1.0}, {"b": 1.5}, {"avg_len": 0.0}])
def test_encoder_rejects_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BM25Encoder(**kwargs)


# -- the engine's IDF, and BM25 end to end against numpy -----------------------------------------


def _chunk(paper_id: str, i: int, text: str) -> Chunk:
    return Chunk(
        id=chunk_id(paper_id, i, text),
        paper_id=paper_id,
        index=i,
        title=paper_id,
        type="passage",
        text=text,
        embed_text=text,
        n_tokens=len(text.split()),
    )


def _engine_idf(n: int, big_n: int) -> float:
    return math.log(1.0 + (big_n - n + 0.5) / (n + 0.5))


def test_engine_idf_is_bm25_idf(tmp_path: Path) -> None:
    # four documents, one of them with no terms: N counts only documents with a sparse vector
    texts = ["cats dog", "cats", "cats bird bird", "the of"]
    enc = BM25Encoder(avg_len=2.0)
    chunks = [_chunk("p", i, t) for i, t in enumerate(texts)]
    dense = np.eye(4, 8, dtype=np.float32) + 0.01
    with EdgeStore.open(tmp_path / "idx", 8) as store:
        store.upsert(chunks, dense, [enc.encode_document(t) for t in texts])
        hits = store.sparse_search(enc.encode_query("dog"), 10)
        assert [h.chunk.index for h in hits] == [0]
        w_dog = bm25_tf_weight(1, 2, k1=1.2, b=0.75, avg_len=2.0)
        assert hits[0].score == pytest.approx(_engine_idf(1, 3) * w_dog, abs=1e-5)
        # "cats" is in 3 of the 3 non-empty documents: a small but positive IDF
        hits = store.sparse_search(enc.encode_query("cat"), 10)
        assert [h.chunk.index for h in hits][0] == 1  # shortest document with the term wins
        assert hits[0].score == pytest.approx(
            _engine_idf(3, 3) * bm25_tf_weight(1, 1, k1=1.2, b=0.75, avg_len=2.0)
        )


def _qasper_sample(qasper_path: Path, questions_path: Path, n_paragraphs: int) -> tuple[list[str], list[str]]:
    """The first 8 paragraphs of validation papers until ``n_paragraphs``, and 20 questions on them."""
    questions = json.loads(questions_path.read_text(encoding="utf-8"))
    first_question: dict[str, str] = {}
    for q in questions:
        first_question.setdefault(q["paper_id"], q["question"])
    paragraphs: list[str] = []
    queries: list[str] = []
    with gzip.open(qasper_path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["id"] not in first_question:
                continue
            paragraphs.extend([p for s in rec["sections"] for p in s["paragraphs"] if p.strip()][:8])
            queries.append(first_question[rec["id"]])
            if len(paragraphs) >= n_paragraphs and len(queries) >= 20:
                break
    return paragraphs, queries[:20]


def test_engine_bm25_matches_numpy_reference(tmp_path: Path, qasper_path: Path, shared_dir: Path) -> None:
    questions_path = shared_dir / "benchmarks" / "qasper" / "questions_validation.json"
    if not questions_path.is_file():
        pytest.skip(f"{questions_path} is missing")
    paragraphs, queries = _qasper_sample(qasper_path, questions_path, 200)
    assert len(paragraphs) >= 200 and len(queries) == 20

    docs = [tokenize(p) for p in paragraphs]
    enc = BM25Encoder(avg_len=float(np.mean([len(d) for d in docs])))
    chunks = [_chunk("qasper", i, p) for i, p in enumerate(paragraphs)]
    dense = np.random.default_rng(0).standard_normal((len(chunks), 16)).astype(np.float32)

    # reference: BM25 with the engine's IDF over the documents that have at least one term
    vocab: dict[int, int] = {}
    tfs = [Counter(term_id(t) for t in d) for d in docs]
    for tf in tfs:
        for tid in tf:
            vocab.setdefault(tid, len(vocab))
    weights = np.zeros((len(docs), len(vocab)))
    for row, (d, tf) in enumerate(zip(docs, tfs, strict=True)):
        for tid, c in tf.items():
            weights[row, vocab[tid]] = bm25_tf_weight(c, len(d), k1=enc.k1, b=enc.b, avg_len=enc.avg_len)
    df = (weights > 0).sum(axis=0)
    big_n = int((weights > 0).any(axis=1).sum())
    idf = np.log(1.0 + (big_n - df + 0.5) / (df + 0.5))

    with EdgeStore.open(tmp_path / "idx", 16) as store:
        store.upsert(chunks, dense, [enc.encode_terms(d) for d in docs])
        for query in queries:
            cols = [vocab[t] for t in {term_id(t) for t in tokenize(query)} if t in vocab]
            ref = (weights[:, cols] * idf[cols]).sum(axis=1)
            hits = store.sparse_search(enc.encode_query(query), 10)
            ref_top = np.sort(ref[ref > 0])[::-1][:10]
            got = np.array([h.score for h in hits])
            # the same scores rank by rank, and every returned chunk has the reference's score
            assert got == pytest.approx(ref_top, abs=1e-4), query
            for h in hits:
                assert h.score == pytest.approx(ref[h.chunk.index], abs=1e-4), query
