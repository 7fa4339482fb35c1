"""The Qdrant Edge store: round trips, filters, maintenance, persistence, locking and crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from arag.errors import StoreError
from arag.index import qdrant_edge
from arag.index.payload import directory_size
from arag.index.qdrant_edge import EdgeStore
from arag.index.sparse import BM25Encoder
from arag.index.store import PaperCount, Store
from arag.records import Chunk, ChunkType, SearchFilter, chunk_id

DIM = 32
PAPERS = {"1801.00001": 2018, "1902.00002": 2019, "2003.00003": 2020, "pdf:notes-0a1b2c3d": None}


def make_chunks(per_paper: int = 6) -> list[Chunk]:
    """A few chunks per paper; each text has one word unique to it ("uniq<paper>x<i>")."""
    chunks: list[Chunk] = []
    for p, (pid, year) in enumerate(PAPERS.items()):
        for i in range(per_paper):
            kind: ChunkType = "abstract" if i == 0 else ("table" if i == per_paper - 1 else "passage")
            text = f"paper {p} chunk {i} uniq{p}x{i} attention transformer layers " + "words " * i
            chunks.append(
                Chunk(
                    id=chunk_id(pid, i, text),
                    paper_id=pid,
                    index=i,
                    title=f"Title of {pid}",
                    section=None if kind == "abstract" else "Method",
                    type=kind,
                    text=text,
                    embed_text=f"Title of {pid}. {text}",
                    n_tokens=20 + i,
                    overlap_sentences=i % 2,
                    year=year,
                )
            )
    return chunks


def dense_for(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


ENC = BM25Encoder(avg_len=8.0)


@pytest.fixture(scope="module")
def chunks() -> list[Chunk]:
    return make_chunks()


def _filled(path: Path, chunks: list[Chunk]) -> EdgeStore:
    s = EdgeStore.open(path, DIM)
    s.upsert(chunks, dense_for(len(chunks)), [ENC.encode_document(c.text) for c in chunks])
    return s


@pytest.fixture(scope="module")
def ro_store(tmp_path_factory: pytest.TempPathFactory, chunks: list[Chunk]) -> Iterator[EdgeStore]:
    """One filled store shared by the tests that only read (creating a shard costs fsyncs)."""
    s = _filled(tmp_path_factory.mktemp("ro") / "index", chunks)
    yield s
    s.close()


@pytest.fixture
def store(tmp_path: Path, chunks: list[Chunk]) -> Iterator[EdgeStore]:
    """A filled store of its own, for tests that change it."""
    s = _filled(tmp_path / "index", chunks)
    yield s
    s.close()


def test_is_a_store(ro_store: EdgeStore) -> None:
    assert isinstance(ro_store, Store)
    assert ro_store.dim == DIM


def test_get_chunks_round_trip(ro_store: EdgeStore, chunks: list[Chunk]) -> None:
    ids = [chunks[7].id, "no-such-chunk", chunks[0].id, chunks[-1].id]
    assert ro_store.get_chunks(ids) == [chunks[7], chunks[0], chunks[-1]]
    assert ro_store.get_chunks([]) == []


def test_dense_search_finds_the_exact_vector_first(ro_store: EdgeStore, chunks: list[Chunk]) -> None:
    vecs = dense_for(len(chunks))
    for i in (0, 5, 13, len(chunks) - 1):
        hits = ro_store.dense_search(vecs[i] * 3.0, 5)  # scale is irrelevant under cosine
        assert len(hits) == 5
        assert hits[0].chunk == chunks[i]
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert all(h.source == "dense" for h in hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_dense_search_rejects_wrong_dimension(ro_store: EdgeStore) -> None:
    with pytest.raises(StoreError, match="dimensions"):
        ro_store.dense_search(np.ones(DIM + 1, dtype=np.float32), 3)


def test_sparse_search_finds_the_unique_term(ro_store: EdgeStore, chunks: list[Chunk]) -> None:
    hits = ro_store.sparse_search(ENC.encode_query("uniq2x3 transformer"), 4)
    assert hits[0].chunk == next(c for c in chunks if c.paper_id == "2003.00003" and c.index == 3)
    assert hits[0].source == "sparse"
    assert hits[0].score > hits[1].score
    assert ro_store.sparse_search(ENC.encode_query("the of and"), 4) == []
    assert ro_store.sparse_search(ENC.encode_query("zebra"), 4) == []


def test_filters(ro_store: EdgeStore, chunks: list[Chunk]) -> None:
    q = dense_for(len(chunks))[3]

    def found(flt: SearchFilter) -> set[str]:
        dense = {h.chunk.id for h in ro_store.dense_search(q, 100, flt)}
        sparse = {h.chunk.id for h in ro_store.sparse_search(ENC.encode_query("attention"), 100, flt)}
        assert dense == sparse  # every chunk has "attention", so both searches see the whole filter
        assert ro_store.count(flt) == len(dense)
        return dense

    def ids(pred: Callable[[Chunk], bool]) -> set[str]:
        return {c.id for c in chunks if pred(c)}

    assert found(SearchFilter(paper_ids=["1902.00002"])) == ids(lambda c: c.paper_id == "1902.00002")
    two = ["1801.00001", "pdf:notes-0a1b2c3d"]
    assert found(SearchFilter(paper_ids=two)) == ids(lambda c: c.paper_id in two)
    assert found(SearchFilter(types=["abstract", "table"])) == ids(lambda c: c.type != "passage")
    assert found(SearchFilter(year_min=2019)) == ids(lambda c: c.year is not None and c.year >= 2019)
    assert found(SearchFilter(year_max=2018)) == ids(lambda c: c.year == 2018)
    assert found(SearchFilter(year_min=2019, year_max=2019)) == ids(lambda c: c.year == 2019)
    combined = SearchFilter(paper_ids=["1801.00001", "2003.00003"], types=["passage"], year_min=2020)
    assert found(combined) == ids(lambda c: c.paper_id == "2003.00003" and c.type == "passage")
    # empty lists and empty ranges select nothing; an all-None filter selects everything
    assert found(SearchFilter(paper_ids=[])) == set()
    assert found(SearchFilter(year_min=2020, year_max=2019)) == set()
    assert found(SearchFilter()) == ids(lambda c: True)


def test_counts_and_papers(ro_store: EdgeStore, chunks: list[Chunk], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qdrant_edge, "_SCROLL_PAGE", 5)  # list_papers must page through the scroll
    assert ro_store.count() == len(chunks) == 24
    assert ro_store.count_by_type() == {"abstract": 4, "passage": 16, "table": 4}
    assert ro_store.paper_ids() == set(PAPERS)
    assert ro_store.list_papers() == [
        PaperCount(paper_id=p, title=f"Title of {p}", chunks=6) for p in sorted(PAPERS)
    ]


def test_delete_paper_removes_only_that_paper(store: EdgeStore, chunks: list[Chunk]) -> None:
    store.delete_paper("1902.00002")
    store.delete_paper("not-there")
    assert store.count() == 18
    assert store.paper_ids() == set(PAPERS) - {"1902.00002"}
    assert store.count_by_type() == {"abstract": 3, "passage": 12, "table": 3}
    assert [p.paper_id for p in store.list_papers()] == sorted(set(PAPERS) - {"1902.00002"})
    assert store.get_chunks([c.id for c in chunks]) == [c for c in chunks if c.paper_id != "1902.00002"]
    hits = store.sparse_search(ENC.encode_query("uniq1x3"), 5)
    assert hits == []


def test_set_topics_then_filter(store: EdgeStore, chunks: list[Chunk]) -> None:
    store.set_topics(
        {"1801.00001": (3, "parsing"), "2003.00003": (3, "parsing"), "1902.00002": (7, "translation")}
    )
    assert store.count(SearchFilter(topics=[3])) == 12
    assert store.count(SearchFilter(topics=[7])) == 6
    assert store.count(SearchFilter(topics=[3, 7])) == 18
    assert store.count(SearchFilter(topics=[0])) == 0
    got = store.get_chunks([chunks[0].id, chunks[6].id, chunks[-1].id])
    assert [(c.topic, c.topic_label) for c in got] == [(3, "parsing"), (7, "translation"), (None, None)]
    # everything else in the payload is untouched
    assert got[0].model_copy(update={"topic": None, "topic_label": None}) == chunks[0]
    # topics can be reassigned
    store.set_topics({"1801.00001": (7, "translation")})
    assert store.count(SearchFilter(topics=[7])) == 12


def test_upsert_is_idempotent_and_replaces(store: EdgeStore, chunks: list[Chunk]) -> None:
    store.upsert(chunks, dense_for(len(chunks)), [ENC.encode_document(c.text) for c in chunks])
    assert store.count() == len(chunks)
    # same id, new payload and vector: replaced in place
    changed = chunks[2].model_copy(update={"section": "Results"})
    new_vec = dense_for(1, seed=99)
    store.upsert([changed], new_vec, [ENC.encode_document(changed.text)])
    assert store.count() == len(chunks)
    assert store.get_chunks([changed.id]) == [changed]
    assert store.dense_search(new_vec[0], 1)[0].chunk == changed
    store.upsert([], np.zeros((0, DIM), dtype=np.float32), [])
    assert store.count() == len(chunks)


def test_upsert_rejects_mismatched_inputs(ro_store: EdgeStore, chunks: list[Chunk]) -> None:
    sparse = [ENC.encode_document(c.text) for c in chunks[:2]]
    with pytest.raises(StoreError, match="expected dense"):
        ro_store.upsert(chunks[:2], dense_for(3), sparse)
    with pytest.raises(StoreError, match="expected dense"):
        ro_store.upsert(chunks[:2], np.ones((2, DIM + 1), dtype=np.float32), sparse)
    with pytest.raises(StoreError, match="expected dense"):
        ro_store.upsert(chunks[:2], dense_for(2), sparse[:1])


def test_reopen_after_close_sees_everything(tmp_path: Path, chunks: list[Chunk]) -> None:
    path = tmp_path / "index"
    with EdgeStore.open(path, DIM) as s:
        s.upsert(chunks, dense_for(len(chunks)), [ENC.encode_document(c.text) for c in chunks])
        s.set_topics({"1801.00001": (1, "one")})
        s.delete_paper("pdf:notes-0a1b2c3d")
        s.flush()
    s.close()  # a second close is harmless
    with pytest.raises(StoreError, match="closed"):
        s.count()
    with EdgeStore.open(path, DIM, create=False) as again:
        assert again.count() == 18
        assert again.count(SearchFilter(topics=[1])) == 6
        assert again.dense_search(dense_for(len(chunks))[7], 1)[0].chunk == chunks[7]
        assert set(again.paper_ids()) == set(PAPERS) - {"pdf:notes-0a1b2c3d"}
        # payload indexes were created once and survive the reopen
        assert again.size_bytes() == directory_size(path) > 0


def test_open_missing_without_create(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no index") as err:
        EdgeStore.open(tmp_path / "nothing", DIM, create=False)
    assert "arag library build" in str(err.value)
    assert not (tmp_path / "nothing").exists()


def test_dimension_mismatch_tells_to_rebuild(tmp_path: Path) -> None:
    EdgeStore.open(tmp_path / "index", DIM).close()
    with pytest.raises(StoreError) as err:
        EdgeStore.open(tmp_path / "index", 384)
    msg = str(err.value)
    assert f"{DIM}-dimensional" in msg and "384" in msg and "--rebuild" in msg


def test_size_counts_allocated_bytes_not_preallocated_holes(ro_store: EdgeStore) -> None:
    ro_store.flush()
    apparent = sum(f.stat().st_size for f in ro_store.path.rglob("*") if f.is_file())
    assert 0 < ro_store.size_bytes() < apparent


_CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    from test_store import ENC, dense_for, make_chunks
    from arag.index.qdrant_edge import EdgeStore
    store = EdgeStore.open(__import__("pathlib").Path(sys.argv[1]), 32)
    chunks = make_chunks()
    store.upsert(chunks, dense_for(len(chunks)), [ENC.encode_document(c.text) for c in chunks])
    print("ready", flush=True)  # upserted, never flushed, never closed
    time.sleep(120)
    """
)


def test_locked_while_another_process_holds_it_and_sigkill_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "index"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "ready", child.stderr.read() if child.stderr else line
        with pytest.raises(StoreError, match="in use by another arag process") as err:
            EdgeStore.open(path, DIM)
        assert "wait for it to finish" in str(err.value)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    # the lock died with the process, and the write-ahead log replays the unflushed upsert
    chunks = make_chunks()
    with EdgeStore.open(path, DIM) as s:
        assert s.count() == len(chunks)
        assert s.get_chunks([c.id for c in chunks]) == chunks
        assert s.dense_search(dense_for(len(chunks))[9], 1)[0].chunk == chunks[9]
