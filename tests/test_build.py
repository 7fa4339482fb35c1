"""The library build on a few real QASPER papers, with the hash embedder (fast, deterministic)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arag.errors import AragError
from arag.library.build import LibraryBuilder
from arag.library.manage import build_library, library_status, list_papers
from arag.settings import Settings, get_settings


def _settings(data_dir: Path, n: int, **extra: object) -> Settings:
    return get_settings(
        data_dir=data_dir,
        corpus={"max_papers": n},
        embedding={"provider": "hash"},
        topics={"k": 3},
        store={"papers_per_batch": 3},
        **extra,
    )


def test_build_then_status_then_noop(tmp_path: Path, qasper_path: Path) -> None:
    s = _settings(tmp_path / "lib", 8)
    summary = build_library(s)
    assert summary.papers_added == 8 and summary.papers_failed == 0
    assert summary.chunks_by_type["abstract"] == 8  # one per paper, long ones embedded in parts
    assert summary.chunks_by_type["passage"] > 8 * 5
    assert 0.0 < summary.mean_overlap_sentences <= 2.0
    st = library_status(s)
    assert st.papers == 8
    assert st.chunks == summary.chunks_added == sum(st.chunks_by_type.values())
    assert st.embedding_model == "hash-384"
    assert st.index_bytes > 0
    rows = list_papers(s)
    assert sum(r.n_chunks for r in rows) == st.chunks
    assert all(r.topic is not None and r.topic_label for r in rows)
    assert len(st.topics) == 3

    again = build_library(s)
    assert again.papers_added == 0 and again.papers_skipped == 8 and again.chunks_added == 0
    assert library_status(s).chunks == st.chunks

    # From scratch again: every vector comes from the embedding cache, none from the model.
    assert summary.texts_embedded >= summary.chunks_added
    rebuilt = build_library(s, rebuild=True)
    assert rebuilt.chunks_added == summary.chunks_added and rebuilt.texts_embedded == 0


def test_topic_filter_lists_a_partition(tmp_path: Path, qasper_path: Path) -> None:
    s = _settings(tmp_path / "lib", 8)
    build_library(s)
    by_topic = [list_papers(s, topic=t) for t in range(3)]
    assert sorted(p.id for group in by_topic for p in group) == sorted(p.id for p in list_papers(s))


def test_growing_the_library_adds_only_new_papers(tmp_path: Path, qasper_path: Path) -> None:
    build_library(_settings(tmp_path / "lib", 4))
    s6 = _settings(tmp_path / "lib", 6)
    summary = build_library(s6)
    assert summary.papers_added == 2 and summary.papers_skipped == 4 and summary.papers_updated == 0
    assert library_status(s6).papers == 6


def test_changed_chunking_rebuilds_without_duplicates(tmp_path: Path, qasper_path: Path) -> None:
    s = _settings(tmp_path / "lib", 3)
    build_library(s)
    smaller = _settings(tmp_path / "lib", 3, chunking={"target_tokens": 120})
    summary = build_library(smaller)
    assert summary.papers_added == summary.papers_updated == 3
    st = library_status(smaller)
    assert st.chunks == summary.chunks_added  # old chunks of those papers are gone


def test_model_change_requires_rebuild(tmp_path: Path, qasper_path: Path) -> None:
    s = _settings(tmp_path / "lib", 2)
    build_library(s)
    other = s.model_copy(update={"embedding": s.embedding.model_copy(update={"dim": 64})})
    with pytest.raises(AragError, match="--rebuild"):
        LibraryBuilder(other)
    summary = build_library(other, rebuild=True)
    assert summary.papers_added == 2


def _build_env(data_dir: Path, n: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ARAG_DATA_DIR=str(data_dir),
        ARAG_EMBEDDING__PROVIDER="hash",
        ARAG_CORPUS__MAX_PAPERS=str(n),
        ARAG_STORE__PAPERS_PER_BATCH="2",
        ARAG_TOPICS__K="4",
    )
    return env


def _recorded(state_db: Path) -> int:
    if not state_db.exists():
        return 0
    try:
        with sqlite3.connect(state_db, timeout=1) as db:
            return int(db.execute("SELECT count(*) FROM papers").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def test_killed_build_resumes_to_the_same_library(tmp_path: Path, qasper_path: Path) -> None:
    n = 120
    killed_dir = tmp_path / "killed"
    cmd = [sys.executable, "-m", "arag", "library", "build"]
    proc = subprocess.Popen(
        cmd, env=_build_env(killed_dir, n), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 180
    while _recorded(killed_dir / "library.sqlite3") < 10:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "the build made no progress"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_at_kill = _recorded(killed_dir / "library.sqlite3")
    assert proc.returncode == -signal.SIGKILL
    assert done_at_kill < n, "the build finished before it could be killed"

    resumed = subprocess.run(cmd, env=_build_env(killed_dir, n), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    clean_dir = tmp_path / "clean"
    clean = subprocess.run(cmd, env=_build_env(clean_dir, n), capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr

    a = get_settings(data_dir=killed_dir, embedding={"provider": "hash"})
    b = get_settings(data_dir=clean_dir, embedding={"provider": "hash"})
    sa, sb = library_status(a), library_status(b)
    assert sa.papers == sb.papers == n
    assert sa.chunks_by_type == sb.chunks_by_type
    assert {r.id: r.n_chunks for r in list_papers(a)} == {r.id: r.n_chunks for r in list_papers(b)}


def test_add_pdfs_with_tables_and_bad_files(tmp_path: Path, shared_dir: Path) -> None:
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    (pdfs / "corrupt.pdf").write_bytes(b"%PDF-1.7\n" + os.urandom(2048))
    (pdfs / "empty.pdf").write_bytes(b"")
    s = _settings(tmp_path / "lib", 0)
    from arag.library.manage import add_pdfs

    real = shared_dir / "pdfs" / "papermage_2020.acl-main.447.pdf"
    summary = add_pdfs(s, [real, pdfs])
    assert summary.papers_added == 1
    assert summary.chunks_by_type.get("table", 0) >= 1
    assert sorted(Path(f.key).name for f in summary.failures) == ["corrupt.pdf", "empty.pdf"]
    st = library_status(s)
    assert st.papers_by_source == {"pdf": 1}
    assert {Path(f.key).name for f in st.failures} == {"corrupt.pdf", "empty.pdf"}
    (row,) = list_papers(s)
    assert row.id.startswith("pdf:") and "S2ORC" in row.title
    # adding the same file again changes nothing
    again = add_pdfs(s, [real])
    assert again.papers_added == 0 and again.papers_skipped == 1


def test_a_chunk_in_parts_gets_the_mean_of_its_part_vectors(tmp_path: Path) -> None:
    import numpy as np

    from arag.records import Chunk

    s = _settings(tmp_path / "lib", 0)
    with LibraryBuilder(s) as builder:
        whole = Chunk(
            id="p:0000:a", paper_id="p", index=0, title="T", type="abstract", text="x", embed_text="x y",
            embed_parts=["alpha beta gamma", "delta epsilon"], n_tokens=3,
        )  # fmt: skip
        plain = whole.model_copy(
            update={"id": "p:0001:b", "embed_parts": [], "embed_text": "alpha beta gamma"}
        )
        vecs = builder._chunk_vectors([whole, plain])
        parts = builder.embedder.embed(["alpha beta gamma", "delta epsilon"])
    mean = parts.mean(axis=0)
    assert np.allclose(vecs[0], mean / np.linalg.norm(mean), atol=1e-6)
    assert np.allclose(vecs[1], parts[0], atol=1e-6)


class _FailingWrites:
    """The real store, but every upsert fails (a full disk, a crash at that write)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def upsert(self, *args: object) -> None:
        from arag.errors import StoreError

        raise StoreError("no space left on device", where="test", fix="-")

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_a_failed_rewrite_leaves_the_papers_old_chunks(tmp_path: Path, qasper_path: Path) -> None:
    from arag.corpus.qasper import load_qasper
    from arag.errors import StoreError
    from arag.index.factory import open_store
    from arag.records import SearchFilter

    s = _settings(tmp_path / "lib", 3)
    build_library(s)
    before = {r.id: r.n_chunks for r in list_papers(s)}
    smaller = _settings(tmp_path / "lib", 3, chunking={"target_tokens": 120})
    papers, _ = load_qasper(qasper_path, max_papers=3)
    store = open_store(smaller, 384, create=False)
    try:
        failing = _FailingWrites(store)
        with LibraryBuilder(smaller, store=failing) as builder, pytest.raises(StoreError, match="no space"):  # type: ignore[arg-type]
            builder.index_papers(papers)
        # The new chunks could not be written: each paper still has all of its old ones.
        assert {p: store.count(SearchFilter(paper_ids=[p])) for p in before} == before
    finally:
        store.close()
    assert build_library(smaller).papers_added == 3  # the next build rewrites them
    assert library_status(smaller).chunks == sum(r.n_chunks for r in list_papers(smaller))


class _FlushFailsOnce:
    """The engine's shard, but its second flush fails as Qdrant Edge's once did mid-build here."""

    def __init__(self, shard: object) -> None:
        self._shard = shard
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        if self.flushes == 2:
            raise RuntimeError(
                "Service internal error: Failed to flush mmap sparse vector gridstore: "
                "tracker_journal.dat is shorter than expected"
            )
        self._shard.flush()  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._shard, name)


def test_a_failed_flush_is_fixed_by_running_the_build_again(tmp_path: Path, qasper_path: Path) -> None:
    from arag.corpus.qasper import load_qasper
    from arag.errors import StoreError
    from arag.index.factory import open_store

    s = _settings(tmp_path / "lib", 9)  # three batches of three papers
    papers, _ = load_qasper(qasper_path, max_papers=9)
    store = open_store(s, 384)
    try:
        store._shard = _FlushFailsOnce(store._shard)  # type: ignore[attr-defined]
        with LibraryBuilder(s, store=store) as builder, pytest.raises(StoreError) as failed:
            builder.index_papers(papers)
    finally:
        store.close()
    # The engine's words, what failed, and the cheap fix first: a rerun, not a 20-minute rebuild.
    assert "tracker_journal.dat" in failed.value.what and "(flush)" in failed.value.what
    assert failed.value.fix is not None and failed.value.fix.startswith("run the same command again")
    assert "--rebuild" in failed.value.fix  # only if the rerun fails the same way
    # The batch whose flush failed was not recorded: the rerun writes it again.
    assert len(list_papers(s)) == 3

    again = build_library(s)
    assert again.papers_skipped == 3 and again.papers_added == 6 and again.papers_failed == 0
    clean = _settings(tmp_path / "clean", 9)
    build_library(clean)
    assert {r.id: r.n_chunks for r in list_papers(s)} == {r.id: r.n_chunks for r in list_papers(clean)}
    assert library_status(s).chunks_by_type == library_status(clean).chunks_by_type
    assert library_status(s).chunks == sum(r.n_chunks for r in list_papers(s))
