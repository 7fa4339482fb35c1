"""The real path on a few papers: packaged int8 MiniLM, real tokenizer, Qdrant Edge on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from arag.index.factory import open_store
from arag.index.sparse import BM25Encoder
from arag.library.manage import build_library, library_status, list_papers
from arag.models.factory import library_embedder
from arag.records import SearchFilter
from arag.settings import get_settings

pytestmark = pytest.mark.real_models

IDS = ["1601.00901", "1601.01705", "1601.02166", "1601.02543"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, qasper_path: Path):  # type: ignore[no-untyped-def]
    data = tmp_path_factory.mktemp("real-lib")
    settings = get_settings(data_dir=data, corpus={"paper_ids": IDS}, topics={"k": 2})
    summary = build_library(settings)
    return settings, summary


def test_real_build_fits_the_model_and_is_complete(built) -> None:  # type: ignore[no-untyped-def]
    settings, summary = built
    assert summary.papers_added == 4 and summary.papers_failed == 0
    st = library_status(settings)
    assert st.embedding_model == "all-MiniLM-L6-v2-onnx-dynamic-int8" and st.embedding_dim == 384
    assert st.papers == 4 and st.chunks == summary.chunks_added
    store = open_store(settings, 384, create=False)
    try:
        counts = {p.paper_id: p.chunks for p in store.list_papers()}
        assert counts == {r.id: r.n_chunks for r in list_papers(settings)}
    finally:
        store.close()
    # The no-op rebuild loads no paper twice and writes nothing.
    again = build_library(settings)
    assert again.papers_added == 0 and again.papers_skipped == 4


def test_dense_and_bm25_find_the_right_paper(built) -> None:  # type: ignore[no-untyped-def]
    settings, _ = built
    embedder = library_embedder(settings)
    store = open_store(settings, embedder.dim, create=False)
    try:
        q = "learning an ontology and a semantic parser jointly from Wikipedia sentences about people"
        dense = store.dense_search(embedder.embed_query(q), 5)
        assert dense[0].chunk.paper_id == "1601.00901"
        abstracts = store.dense_search(embedder.embed_query(q), 2, SearchFilter(types=["abstract"]))
        assert abstracts[0].chunk.paper_id == "1601.00901" and abstracts[0].chunk.type == "abstract"
        sparse = store.sparse_search(BM25Encoder().encode_query("ontology semantic parser grammar"), 5)
        assert sparse[0].chunk.paper_id == "1601.00901"
        assert all(hit.chunk.topic is not None for hit in dense)
    finally:
        store.close()
