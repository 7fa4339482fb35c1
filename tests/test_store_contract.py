"""One contract for every Store backend, and the same answers from each on the same library.

Backends: Qdrant Edge (a shard in a temporary folder), qdrant-client's local mode (``:memory:`` and
``path:DIR``), and a real Qdrant server when ``ARAG_QDRANT_URL`` is set (a throwaway collection per
store, deleted afterwards):

    ARAG_QDRANT_URL=http://host:6333 .venv/bin/pytest tests/test_store_contract.py

The library: the chunks of six QASPER papers (~400), hash-embedder vectors and BM25 vectors, the
same arrays written to every backend. QASPER gives every paper the same year and no table chunks,
so years, a paper without a year and a few table chunks are assigned here for the filters to bite.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from arag.errors import ConfigError, StoreError
from arag.index import qdrant_edge, qdrant_server
from arag.index.factory import open_store, store_backend
from arag.index.qdrant_edge import EdgeStore
from arag.index.qdrant_server import QdrantServerStore
from arag.index.sparse import BM25Encoder
from arag.index.store import PaperCount, Store
from arag.ingest.chunker import chunk_paper
from arag.models.hash_embedder import HashEmbedder
from arag.records import Chunk, ScoredChunk, SearchFilter, SparseVector
from arag.retrieval.hybrid import HybridRetriever
from arag.settings import ChunkSettings, EmbeddingSettings, RetrievalSettings, get_settings
from arag.text import tokenize
from conftest import qasper_papers

DIM = 128
SERVER_URL = os.environ.get("ARAG_QDRANT_URL")
SERVER_KEY = os.environ.get("ARAG_QDRANT_API_KEY")
BACKENDS = [
    "edge",
    "memory",
    "path",
    pytest.param(
        "server",
        marks=pytest.mark.skipif(
            not SERVER_URL or SERVER_URL == ":memory:" or SERVER_URL.startswith("path:"),
            reason="set ARAG_QDRANT_URL=http://host:6333 to run the contract against a real Qdrant server",
        ),
    ),
]
QUERIES = [
    "semantic parsing with an ontology grammar",
    "neural machine translation attention",
    "word embeddings evaluation dataset",
    "sentiment classification of tweets",
    "question answering over a knowledge base",
    "results table accuracy baseline",
]


@dataclass
class Library:
    chunks: list[Chunk]
    dense: np.ndarray
    sparse: list[SparseVector]
    embedder: HashEmbedder
    encoder: BM25Encoder
    topics: dict[str, tuple[int, str]]

    def ids(self, pred: Callable[[Chunk], bool]) -> set[str]:
        return {c.id for c in self.chunks if pred(c)}

    @property
    def papers(self) -> list[str]:
        return sorted({c.paper_id for c in self.chunks})


@pytest.fixture(scope="module")
def lib() -> Library:
    papers = qasper_papers(6)
    embedder = HashEmbedder(EmbeddingSettings(provider="hash", dim=DIM))
    years = [2015, 2016, 2017, 2018, 2019, None]
    chunks: list[Chunk] = []
    for paper, year in zip(papers, years, strict=True):
        for c in chunk_paper(paper, embedder.count_tokens, ChunkSettings()):
            table = c.type == "passage" and c.index % 9 == 8
            chunks.append(c.model_copy(update={"year": year, "type": "table" if table else c.type}))
    encoder = BM25Encoder(avg_len=sum(len(tokenize(c.text)) for c in chunks) / len(chunks))
    topics = {p.id: (i % 3, f"topic {i % 3}") for i, p in enumerate(papers)}
    return Library(
        chunks=chunks,
        dense=embedder.embed([c.embed_text for c in chunks]),
        sparse=[encoder.encode_document(c.text) for c in chunks],
        embedder=embedder,
        encoder=encoder,
        topics=topics,
    )


class Backend:
    """Opens stores of one kind; remembers what to clean up (server collections)."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.collection = f"arag_contract_{uuid.uuid4().hex[:10]}"
        self.opened: list[Store] = []

    def open(self, *, dim: int = DIM, create: bool = True) -> Store:
        store: Store
        if self.kind == "edge":
            store = EdgeStore.open(self.root / "edge", dim, create=create, threads=1)
        else:
            location = {"memory": ":memory:", "path": f"path:{self.root / 'local'}"}.get(
                self.kind, SERVER_URL
            )
            assert location is not None
            store = QdrantServerStore.open(
                location, dim, collection=self.collection, api_key=SERVER_KEY, create=create
            )
        self.opened.append(store)
        return store

    def filled(self, lib: Library) -> Store:
        store = self.open()
        store.upsert(lib.chunks, lib.dense, lib.sparse)
        store.set_topics(lib.topics)
        store.optimize()
        return store

    def cleanup(self) -> None:
        if self.kind == "server":
            with QdrantServerStore.open(
                SERVER_URL or "", DIM, collection=self.collection, api_key=SERVER_KEY
            ) as s:
                s.drop()
        for s in self.opened:
            s.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, lib: Library) -> Iterator[Callable[[str], Store]]:
    """Read-only filled stores by backend kind, built once per module (the Edge one is the reference)."""
    cache: dict[str, Store] = {}
    backends: list[Backend] = []

    def get(kind: str) -> Store:
        if kind not in cache:
            backends.append(Backend(kind, tmp_path_factory.mktemp(f"ro-{kind}")))
            cache[kind] = backends[-1].filled(lib)
        return cache[kind]

    yield get
    for b in backends:
        b.cleanup()


@pytest.fixture(scope="module", params=BACKENDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def ro(kind: str, built: Callable[[str], Store]) -> Store:
    return built(kind)


@pytest.fixture
def backend(kind: str, tmp_path: Path) -> Iterator[Backend]:
    b = Backend(kind, tmp_path)
    yield b
    b.cleanup()


@pytest.fixture
def rw(backend: Backend, lib: Library) -> Store:
    """A filled store of its own, for tests that change it."""
    return backend.filled(lib)


# -- the protocol ---------------------------------------------------------------------------------


def test_is_a_store(ro: Store) -> None:
    assert isinstance(ro, Store)
    assert ro.dim == DIM


def test_counts_and_papers(ro: Store, lib: Library, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (qdrant_edge, qdrant_server):
        monkeypatch.setattr(module, "_SCROLL_PAGE", 7)  # list_papers must page through the scroll
    assert ro.count() == len(lib.chunks)
    assert ro.count_by_type() == dict(Counter(c.type for c in lib.chunks))
    assert set(ro.count_by_type()) == {"abstract", "passage", "table"}
    assert ro.paper_ids() == set(lib.papers)
    per_paper = Counter(c.paper_id for c in lib.chunks)
    titles = {c.paper_id: c.title for c in lib.chunks}
    assert ro.list_papers() == [
        PaperCount(paper_id=p, title=titles[p], chunks=per_paper[p]) for p in lib.papers
    ]


def test_get_chunks_and_vectors(ro: Store, lib: Library) -> None:
    picks = [7, 0, len(lib.chunks) - 1, 123]
    ids = [lib.chunks[7].id, "no-such-chunk", lib.chunks[0].id, lib.chunks[-1].id, lib.chunks[123].id]
    topic = {pid: t for pid, (t, _) in lib.topics.items()}
    want = [lib.chunks[i] for i in picks]
    got = ro.get_chunks(ids)
    assert [c.model_copy(update={"topic": None, "topic_label": None}) for c in got] == want
    assert [c.topic for c in got] == [topic[c.paper_id] for c in want]
    assert ro.get_chunks([]) == []
    vecs = ro.get_vectors(ids)
    assert vecs.shape == (5, DIM) and vecs.dtype == np.float32
    assert np.allclose(vecs[[0, 2, 3, 4]], lib.dense[picks], atol=1e-6)
    assert not vecs[1].any()  # unknown ids give zero rows
    assert ro.get_vectors([]).shape == (0, DIM)


def test_dense_search_finds_the_exact_vector_first(ro: Store, lib: Library) -> None:
    for i in (0, 5, 200, len(lib.chunks) - 1):
        hits = ro.dense_search(lib.dense[i] * 3.0, 5)  # scale is irrelevant under cosine
        assert len(hits) == 5 and hits[0].chunk.id == lib.chunks[i].id
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert all(h.source == "dense" for h in hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    with pytest.raises(StoreError, match="dimensions"):
        ro.dense_search(np.ones(DIM + 1, dtype=np.float32), 3)
    assert ro.dense_search(lib.dense[0], 0) == []


def test_sparse_search(ro: Store, lib: Library) -> None:
    hits = ro.sparse_search(lib.encoder.encode_query("ontology grammar"), 10)
    assert hits and all(h.source == "sparse" for h in hits)
    assert all("ontolog" in h.chunk.text.lower() or "grammar" in h.chunk.text.lower() for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert ro.sparse_search(lib.encoder.encode_query("the of and"), 4) == []
    assert ro.sparse_search(lib.encoder.encode_query("zzyzxq"), 4) == []


def _filters(lib: Library) -> list[tuple[SearchFilter, Callable[[Chunk], bool]]]:
    p = lib.papers
    topic = {pid: t for pid, (t, _) in lib.topics.items()}
    return [
        (SearchFilter(paper_ids=[p[1]]), lambda c: c.paper_id == p[1]),
        (SearchFilter(paper_ids=[p[0], p[5]]), lambda c: c.paper_id in (p[0], p[5])),
        (SearchFilter(types=["abstract", "table"]), lambda c: c.type != "passage"),
        (SearchFilter(topics=[1]), lambda c: topic[c.paper_id] == 1),
        (SearchFilter(topics=[0, 2]), lambda c: topic[c.paper_id] in (0, 2)),
        (SearchFilter(year_min=2017), lambda c: c.year is not None and c.year >= 2017),
        (SearchFilter(year_max=2016), lambda c: c.year is not None and c.year <= 2016),
        (SearchFilter(year_min=2018, year_max=2018), lambda c: c.year == 2018),
        (
            SearchFilter(paper_ids=[p[0], p[3]], types=["passage"], year_min=2018),
            lambda c: c.paper_id == p[3] and c.type == "passage",
        ),
        (SearchFilter(paper_ids=[]), lambda c: False),
        (SearchFilter(year_min=2020, year_max=2019), lambda c: False),
        (SearchFilter(), lambda c: True),
    ]


def test_filters(ro: Store, lib: Library) -> None:
    q = lib.dense[3]
    for flt, pred in _filters(lib):
        want = lib.ids(pred)
        dense = {h.chunk.id for h in ro.dense_search(q, 1000, flt)}
        assert dense == want, flt
        assert ro.count(flt) == len(want), flt
        sparse = ro.sparse_search(lib.encoder.encode_query("model"), 1000, flt)
        assert {h.chunk.id for h in sparse} <= want, flt


def test_hybrid_retriever_is_rrf_of_the_stores_searches(ro: Store, lib: Library) -> None:
    """Hybrid search through the public retriever on each backend: the abstract, passage and BM25
    lists are the store's own searches, and every fused hit scores sum(1 / (k + rank)) over them."""
    s = RetrievalSettings()
    retriever = HybridRetriever(ro, lib.embedder, s)
    for text, flt in [(QUERIES[0], None), (QUERIES[2], SearchFilter(year_min=2017)), ("the", None)]:
        r = retriever.search(text, flt)
        vec, terms = lib.embedder.embed_query(text), lib.encoder.encode_query(text)
        base = flt or SearchFilter()
        lists = [
            ro.dense_search(vec, s.abstract_k, base.model_copy(update={"types": ["abstract"]})),
            ro.dense_search(vec, s.passage_k, base.model_copy(update={"types": ["passage", "table"]})),
            ro.sparse_search(terms, s.bm25_k, flt) if terms.indices else [],
        ]
        assert [[h.chunk.id for h in hits] for hits in (r.dense_abstracts, r.dense_passages, r.bm25)] == [
            [h.chunk.id for h in hits] for hits in lists
        ]
        expected: dict[str, float] = {}
        for hits in lists:
            for rank, h in enumerate(hits, start=1):
                expected[h.chunk.id] = expected.get(h.chunk.id, 0.0) + 1.0 / (s.rrf_k + rank)
        top = sorted(expected.values(), reverse=True)[: s.fused_k]
        assert [h.score for h in r.fused] == pytest.approx(top)
        assert all(h.score == pytest.approx(expected[h.chunk.id]) for h in r.fused)
        assert all(h.source == "fused" for h in r.fused)
    assert not lists[2], "a query of stopwords alone has no BM25 list"


def test_upsert_rejects_mismatched_inputs(ro: Store, lib: Library) -> None:
    sparse = lib.sparse[:2]
    for dense, sv in [
        (lib.dense[:3], sparse),
        (np.ones((2, DIM + 1), np.float32), sparse),
        (lib.dense[:2], sparse[:1]),
    ]:
        with pytest.raises(StoreError, match="expected dense"):
            ro.upsert(lib.chunks[:2], dense, sv)


def test_upsert_is_idempotent_and_replaces(rw: Store, lib: Library) -> None:
    rw.upsert(lib.chunks, lib.dense, lib.sparse)  # again: same ids, nothing added
    assert rw.count() == len(lib.chunks)
    changed = lib.chunks[2].model_copy(update={"section": "Results"})
    new_vec = lib.embedder.embed(["an entirely new vector for this chunk"])
    rw.upsert([changed], new_vec, [lib.encoder.encode_document(changed.text)])
    assert rw.count() == len(lib.chunks)
    assert rw.get_chunks([changed.id]) == [changed]  # the payload is replaced whole (topic too)
    assert rw.dense_search(new_vec[0], 1)[0].chunk == changed
    rw.upsert([], np.zeros((0, DIM), dtype=np.float32), [])
    assert rw.count() == len(lib.chunks)


def test_delete_paper_removes_only_that_paper(rw: Store, lib: Library) -> None:
    gone = lib.papers[2]
    rw.delete_paper(gone)
    rw.delete_paper("not-there")
    kept = [c for c in lib.chunks if c.paper_id != gone]
    assert rw.count() == len(kept)
    assert rw.paper_ids() == set(lib.papers) - {gone}
    assert rw.count_by_type() == dict(Counter(c.type for c in kept))
    assert [p.paper_id for p in rw.list_papers()] == [p for p in lib.papers if p != gone]
    assert [c.id for c in rw.get_chunks([c.id for c in lib.chunks])] == [c.id for c in kept]
    assert rw.count(SearchFilter(paper_ids=[gone])) == 0
    assert gone not in {h.chunk.paper_id for h in rw.sparse_search(lib.encoder.encode_query("model"), 1000)}


def test_set_topics_then_filter(rw: Store, lib: Library) -> None:
    p = lib.papers
    n = Counter(c.paper_id for c in lib.chunks)
    rw.set_topics({p[0]: (7, "parsing"), p[1]: (7, "parsing"), p[2]: (8, "translation")})
    assert rw.count(SearchFilter(topics=[7])) == n[p[0]] + n[p[1]]
    assert rw.count(SearchFilter(topics=[8])) == n[p[2]]
    assert rw.count(SearchFilter(topics=[7, 8])) == n[p[0]] + n[p[1]] + n[p[2]]
    first = next(c for c in lib.chunks if c.paper_id == p[2])
    got = rw.get_chunks([first.id])[0]
    assert (got.topic, got.topic_label) == (8, "translation")
    assert got.model_copy(update={"topic": None, "topic_label": None}) == first  # the rest is untouched
    rw.set_topics({p[0]: (8, "translation")})  # topics can be reassigned
    assert rw.count(SearchFilter(topics=[8])) == n[p[0]] + n[p[2]]


def test_close_reopen_and_open_errors(backend: Backend, lib: Library) -> None:
    store = backend.filled(lib)
    store.delete_paper(lib.papers[0])
    store.flush()
    store.close()
    store.close()  # a second close is harmless
    with pytest.raises(StoreError, match="closed"):
        store.count()
    want = len([c for c in lib.chunks if c.paper_id != lib.papers[0]])
    if backend.kind == "memory":  # nothing outlives a :memory: client
        with pytest.raises(StoreError, match="no index") as err:
            backend.open(create=False)
        assert "arag library build" in str(err.value)
        return
    again = backend.open(create=False)
    assert again.count() == want
    assert again.dense_search(lib.dense[100], 1)[0].chunk.id == lib.chunks[100].id
    assert again.count(SearchFilter(topics=[lib.topics[lib.papers[1]][0]])) > 0
    again.close()
    with pytest.raises(StoreError) as err:
        backend.open(dim=DIM + 8)
    assert f"{DIM}-dimensional" in str(err.value) and str(DIM + 8) in str(err.value)


# -- the same answers everywhere ------------------------------------------------------------------


def _tie_groups(scores: list[float], tol: float) -> list[range]:
    """Runs of consecutive positions whose neighbouring scores differ by at most ``tol`` (relative)."""
    groups: list[range] = []
    start = 0
    for i in range(1, len(scores) + 1):
        if i == len(scores) or abs(scores[i - 1] - scores[i]) > tol * max(1.0, abs(scores[i - 1])):
            groups.append(range(start, i))
            start = i
    return groups


def assert_same_ranking(got: list[ScoredChunk], ref: list[ScoredChunk], limit: int, what: str) -> None:
    """Same length, same scores position by position, and the same ids in the same order.

    Ties: engines order equal scores differently (Edge by internal offset, local mode by its own
    storage order), and float32 arithmetic differs in the last bits, so scores within 1e-5
    (relative) of their neighbour form one tie group, compared as a set. When the list is full
    (``limit`` hits) its last group may continue past the cut, so each side may have kept other
    members of it: that group is compared by size and scores only.
    """
    assert len(got) == len(ref), what
    for g, r in zip(got, ref, strict=True):
        assert g.score == pytest.approx(r.score, rel=1e-4, abs=1e-6), what
    groups = _tie_groups([h.score for h in ref], 1e-5)
    if len(ref) == limit:
        groups = groups[:-1]
    for grp in groups:
        assert {got[i].chunk.id for i in grp} == {ref[i].chunk.id for i in grp}, (what, list(grp))
    # the tie handling must not hide everything: most positions are compared one by one
    assert sum(len(g) for g in groups if len(g) == 1) >= len(ref) // 2, what


def test_same_results_as_edge(kind: str, ro: Store, built: Callable[[str], Store], lib: Library) -> None:
    """Dense and BM25 rankings agree with the Edge store's on the same data.

    Exact search everywhere: a few hundred points stay below every engine's HNSW threshold. The
    stores were optimized after their last write: Edge (and a server) count replaced or deleted
    points in the IDF statistics until a segment is rewritten, local mode never does, so BM25
    scores can differ between a write and the next optimize."""
    if kind == "edge":
        pytest.skip("edge is the reference")
    ref = built("edge")
    flts = [
        None,
        SearchFilter(types=["passage", "table"]),
        SearchFilter(paper_ids=lib.papers[:2]),
        SearchFilter(year_min=2017),
    ]
    vecs = lib.embedder.embed(QUERIES)
    for text, vec in zip(QUERIES, vecs, strict=True):
        terms = lib.encoder.encode_query(text)
        for flt in flts:
            what = f"{text!r} {flt}"
            dense, bm25 = ro.dense_search(vec, 20, flt), ro.sparse_search(terms, 20, flt)
            assert_same_ranking(dense, ref.dense_search(vec, 20, flt), 20, "dense " + what)
            assert_same_ranking(bm25, ref.sparse_search(terms, 20, flt), 20, "bm25 " + what)


# -- backend selection and errors -----------------------------------------------------------------


def test_settings_pick_the_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARAG_QDRANT_URL", raising=False)
    s = get_settings(data_dir=tmp_path)
    assert s.store.backend == "auto" and store_backend(s) == "edge"
    assert (s.store.collection, s.store.shards, s.store.replication_factor) == ("arag", 1, 1)
    assert store_backend(get_settings(store={"backend": "qdrant-edge"})) == "edge"  # the old name
    monkeypatch.setenv("ARAG_QDRANT_URL", ":memory:")
    monkeypatch.setenv("ARAG_QDRANT_API_KEY", "secret")
    monkeypatch.setenv("ARAG_STORE__COLLECTION", "mine")
    s = get_settings(data_dir=tmp_path)
    assert store_backend(s) == "qdrant" and s.qdrant_api_key is not None
    assert "secret" not in repr(s)
    store = open_store(s, DIM)
    try:
        assert isinstance(store, QdrantServerStore) and store.collection == "mine"
    finally:
        store.close()
    assert store_backend(get_settings(store={"backend": "edge"})) == "edge"
    monkeypatch.delenv("ARAG_QDRANT_URL")
    with pytest.raises(ConfigError, match="ARAG_QDRANT_URL"):
        open_store(get_settings(data_dir=tmp_path, store={"backend": "qdrant"}), DIM)


def test_unreachable_server_names_the_setting() -> None:
    with pytest.raises(StoreError) as err:
        QdrantServerStore.open("http://127.0.0.1:9", DIM, timeout=2)
    assert "could not reach Qdrant" in str(err.value) and "ARAG_QDRANT_URL" in str(err.value)


def test_local_folder_is_locked_while_open(tmp_path: Path) -> None:
    with (
        QdrantServerStore.open(f"path:{tmp_path}", DIM),
        pytest.raises(StoreError, match="in use by another arag process"),
    ):
        QdrantServerStore.open(f"path:{tmp_path}", DIM)
    QdrantServerStore.open(f"path:{tmp_path}", DIM, create=False).close()


def test_delete_stale_keeps_the_given_chunks_of_those_papers(rw: Store, lib: Library) -> None:
    a, b = lib.papers[0], lib.papers[1]
    keep = [c.id for c in lib.chunks if c.paper_id == a][:2]
    rw.delete_stale([a, b], keep)
    rw.delete_stale([], keep)  # no paper: nothing happens
    gone = {c.id for c in lib.chunks if c.paper_id in (a, b)} - set(keep)
    assert rw.count() == len(lib.chunks) - len(gone)
    assert rw.count(SearchFilter(paper_ids=[a])) == 2 and rw.count(SearchFilter(paper_ids=[b])) == 0
    assert rw.paper_ids() == set(lib.papers) - {b}
    assert [c.id for c in rw.get_chunks(keep)] == keep
