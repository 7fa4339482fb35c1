"""`arag library migrate`: a hash-embedder library copied from Edge to qdrant-client's local mode."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from arag.cli.main import app
from arag.errors import InputError, StoreError
from arag.index.qdrant_edge import EdgeStore
from arag.index.qdrant_server import QdrantServerStore
from arag.library.build import Progress
from arag.library.manage import open_for_search
from arag.library.migrate import copy_store, migrate_library
from arag.records import Chunk, SparseVector
from arag.retrieval.hybrid import HybridRetriever
from arag.settings import Settings, get_settings
from test_store_contract import assert_same_ranking

QUERIES = ["ontology semantic parser grammar Wikipedia", "which datasets do they use?", "the of and"]


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    # Its own (a migration records beside it); built without the shell's server: the source is the
    # Edge store.
    return small_library("migrate", corpus={"max_papers": 4})


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARAG_QDRANT_URL", raising=False)
    monkeypatch.delenv("ARAG_STORE__BACKEND", raising=False)


def test_migrate_to_local_mode_then_search_there(lib: Settings, tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    progress = Progress(
        start=lambda n: calls.append(("start", n)), advance=lambda n: calls.append(("adv", n))
    )
    target = f"path:{tmp_path / 'qdrant'}"
    report = migrate_library(lib, target, batch=50, progress=progress)
    assert report.points == report.target_points > 100
    assert report.by_type == report.target_by_type and set(report.by_type) >= {"abstract", "passage"}
    assert report.sampled == 64 and report.min_cosine >= 0.9999
    assert calls[0] == ("start", report.points)
    assert sum(n for k, n in calls if k == "adv") == report.points and len(calls) > 3  # batches of 50

    there = lib.model_copy(update={"qdrant_url": target})
    src_store, embedder = open_for_search(lib)
    dst_store, _ = open_for_search(there)
    try:
        assert isinstance(src_store, EdgeStore) and isinstance(dst_store, QdrantServerStore)
        assert dst_store.list_papers() == src_store.list_papers()
        src = HybridRetriever(src_store, embedder, lib.retrieval)
        dst = HybridRetriever(dst_store, embedder, lib.retrieval)
        for q in QUERIES:
            a, b = src.search(q), dst.search(q)
            s = lib.retrieval
            assert_same_ranking(b.dense_passages, a.dense_passages, s.passage_k, f"passages {q}")
            assert_same_ranking(b.dense_abstracts, a.dense_abstracts, s.abstract_k, f"abstracts {q}")
            assert_same_ranking(b.bm25, a.bm25, s.bm25_k, f"bm25 {q}")
            # No tie is cut at a list's end on this library, so the fused lists are identical too.
            assert [h.chunk.id for h in b.fused] == [h.chunk.id for h in a.fused], q
    finally:
        src_store.close()
        dst_store.close()


def test_migrate_cli_refuses_a_filled_target_unless_replace(
    lib: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    runner = CliRunner()
    to = f"path:{tmp_path / 'q'}"
    first = runner.invoke(app, ["library", "migrate", "--to", to, "--collection", "copy", "--batch", "100"])
    assert first.exit_code == 0, first.output
    assert (
        "verified" in first.output
        and "min cosine" in first.output
        and "ARAG_STORE__COLLECTION=copy" in first.output
    )
    again = runner.invoke(app, ["library", "migrate", "--to", to, "--collection", "copy"])
    assert again.exit_code == StoreError.exit_code and "--replace" in again.output
    replaced = runner.invoke(app, ["library", "migrate", "--to", to, "--collection", "copy", "--replace"])
    assert replaced.exit_code == 0, replaced.output


def test_migrate_needs_a_library_and_another_target(tmp_path: Path, lib: Settings) -> None:
    with pytest.raises(InputError, match="arag library build"):
        migrate_library(get_settings(data_dir=tmp_path / "none", embedding={"provider": "hash"}), ":memory:")
    same = lib.model_copy(update={"qdrant_url": ":memory:"})
    with pytest.raises(InputError, match="own store"):
        migrate_library(same, ":memory:")


class _Lossy(QdrantServerStore):
    """A target that drops the last point of every batch."""

    def upsert(self, chunks: Sequence[Chunk], dense: np.ndarray, sparse: Sequence[SparseVector]) -> None:
        super().upsert(chunks[:-1], dense[:-1], sparse[:-1])


class _Noisy(QdrantServerStore):
    """A target that stores other dense vectors and other BM25 weights."""

    def upsert(self, chunks: Sequence[Chunk], dense: np.ndarray, sparse: Sequence[SparseVector]) -> None:
        noise = np.random.default_rng(0).standard_normal(dense.shape).astype(np.float32)
        sparse = [SparseVector(indices=s.indices, values=[v * 2 for v in s.values]) for s in sparse]
        super().upsert(chunks, dense + 0.2 * noise, sparse)


@pytest.mark.parametrize(("cls", "message"), [(_Lossy, "the target holds"), (_Noisy, "dense vectors differ")])
def test_verification_says_what_differs(lib: Settings, cls: type[QdrantServerStore], message: str) -> None:
    source = EdgeStore.open(lib.index_dir, 384, create=False)
    target = cls.open(":memory:", 384)
    try:
        with pytest.raises(StoreError, match=message) as err:
            copy_store(source, target, batch=64, sample=16)
        if cls is _Noisy:
            assert "BM25 vectors differ" in str(err.value)
        assert "--replace" in str(err.value)
    finally:
        source.close()
        target.close()
