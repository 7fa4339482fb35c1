"""`arag library build --rebuild`: beside the current library, with every added paper, under the
library lock, switched to in one rename (hash embedder, a few QASPER papers, a real PDF)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arag.errors import InputError, StoreError
from arag.index.factory import open_store
from arag.library.manage import add_pdfs, build_library, library_status, list_papers
from arag.library.sources import stored_source
from arag.settings import Settings, get_settings

PDF = "papermage_2020.acl-main.447.pdf"


def _settings(data_dir: Path, n: int, **extra: object) -> Settings:
    return get_settings(
        data_dir=data_dir,
        corpus={"max_papers": n},
        embedding={"provider": "hash"},
        topics={"k": 3},
        store={"papers_per_batch": 2},
        **extra,
    )


def _with_pdf(tmp_path: Path, shared_dir: Path, n: int) -> tuple[Settings, str, Path]:
    """A library of ``n`` QASPER papers plus one PDF added from a copy the user then deletes."""
    s = _settings(tmp_path / "lib", n)
    build_library(s)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    copy = inbox / PDF
    shutil.copyfile(shared_dir / "pdfs" / PDF, copy)
    assert add_pdfs(s, [copy]).papers_added == 1
    (pdf_id,) = [r.id for r in list_papers(s) if r.source == "pdf"]
    return s, pdf_id, copy


def test_rebuild_keeps_added_papers_and_switches_generations(tmp_path: Path, shared_dir: Path) -> None:
    s, pdf_id, copy = _with_pdf(tmp_path, shared_dir, 3)
    before = {r.id: r.n_chunks for r in list_papers(s)}
    copy.unlink()  # the user's file is gone: the library kept its own
    assert stored_source(s, pdf_id).is_file()

    summary = build_library(s, rebuild=True)
    assert summary.papers_added == 4 and summary.papers_failed == 0
    assert {r.id: r.n_chunks for r in list_papers(s)} == before
    row = next(r for r in list_papers(s) if r.id == pdf_id)
    assert row.source == "pdf" and row.source_path == str(copy)  # as it was added
    first = s.generation()
    assert first and s.state_db.parent == s.data_dir / "generations" / first
    # The library that was in the data dir itself is gone; nothing is left beside the new one.
    assert not (s.data_dir / "index").exists() and not (s.data_dir / "library.sqlite3").exists()
    st = library_status(s)
    assert st.papers == 4 and st.chunks == sum(before.values())

    again = build_library(s, rebuild=True)
    assert again.papers_added == 4 and again.texts_embedded == 0  # vectors from the shared cache
    assert s.generation() != first
    assert [d.name for d in (s.data_dir / "generations").iterdir()] == [s.generation()]
    assert {r.id: r.n_chunks for r in list_papers(s)} == before


def test_rebuild_refuses_when_a_source_is_gone(tmp_path: Path, shared_dir: Path) -> None:
    s, pdf_id, copy = _with_pdf(tmp_path, shared_dir, 2)
    copy.unlink()
    stored_source(s, pdf_id).unlink()
    with pytest.raises(InputError, match="--drop-missing") as err:
        build_library(s, rebuild=True)
    assert pdf_id in str(err.value)
    assert len(list_papers(s)) == 3  # untouched
    summary = build_library(s, rebuild=True, drop_missing=True)
    assert summary.papers_added == 2 and pdf_id not in {r.id for r in list_papers(s)}


_HOLDER = """
import sys, time
from arag.library.manage import open_for_search
from arag.settings import get_settings
store, _ = open_for_search(get_settings(embedding={"provider": "hash"}))
print("ready", flush=True)
time.sleep(120)
"""


def test_rebuild_waits_for_nobody_and_names_the_holder(tmp_path: Path, qasper_path: Path) -> None:
    s = _settings(tmp_path / "lib", 3)
    build_library(s)
    env = dict(os.environ, ARAG_DATA_DIR=str(s.data_dir))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready", (
            holder.stderr.read() if holder.stderr else ""
        )
        with pytest.raises(StoreError, match=f"pid {holder.pid} ") as err:
            build_library(s, rebuild=True)
        assert "cannot be rebuilt" in str(err.value)
    finally:
        holder.kill()
        holder.wait()
    assert library_status(s).papers == 3 and s.generation() == ""  # nothing was touched
    # In this process too: an open store keeps the rebuild out; closed, it goes ahead.
    store = open_store(s, 384, create=False)
    with pytest.raises(StoreError, match="already has the library open"):
        build_library(s, rebuild=True)
    store.close()
    assert build_library(s, rebuild=True).papers_added == 3


def _recorded(data_dir: Path) -> int:
    for db in (data_dir / "generations").glob("*/library.sqlite3"):
        try:
            with sqlite3.connect(db, timeout=1) as con:
                return int(con.execute("SELECT count(*) FROM papers").fetchone()[0])
        except sqlite3.OperationalError:
            return 0
    return 0


def test_killed_rebuild_leaves_the_old_library_then_resumes(tmp_path: Path, shared_dir: Path) -> None:
    n = 30
    s, pdf_id, _ = _with_pdf(tmp_path, shared_dir, n)
    before = {r.id: r.n_chunks for r in list_papers(s)}
    env = dict(
        os.environ,
        ARAG_DATA_DIR=str(s.data_dir),
        ARAG_EMBEDDING__PROVIDER="hash",
        ARAG_CORPUS__MAX_PAPERS=str(n),
        ARAG_STORE__PAPERS_PER_BATCH="2",
        ARAG_TOPICS__K="3",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "arag", "library", "build", "--rebuild"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 180
    while _recorded(s.data_dir) < 6:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "the rebuild made no progress"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 6 <= _recorded(s.data_dir) < n + 1, "the rebuild finished before it could be killed"

    # The old library is whole and opens; the half-built generation waits beside it.
    assert s.generation() == ""
    assert {r.id: r.n_chunks for r in list_papers(s)} == before
    assert library_status(s).chunks == sum(before.values())

    resumed = build_library(s, rebuild=True)
    assert resumed.papers_skipped >= 6 and resumed.papers_added == n + 1 - resumed.papers_skipped
    assert {r.id: r.n_chunks for r in list_papers(s)} == before and pdf_id in before
    assert [d.name for d in (s.data_dir / "generations").iterdir()] == [s.generation()]
    assert not (s.data_dir / "generation.next").exists()


def test_while_a_rebuild_holds_the_library_nothing_opens_it(tmp_path: Path, qasper_path: Path) -> None:
    s = _settings(tmp_path / "lib", 2)
    build_library(s)
    code = (
        "import sys, time; from pathlib import Path; from arag.index.lock import acquire\n"
        "lock = acquire(Path(sys.argv[1]), exclusive=True); print('ready', flush=True); time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(s.data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match=f"locked by pid {proc.pid} .*rebuilding it since"):
            open_store(s, 384, create=False)
    finally:
        proc.kill()
        proc.wait()
    open_store(s, 384, create=False).close()  # the lock died with its process


def test_a_resumed_rebuild_keeps_only_what_is_asked_and_cleans_up(tmp_path: Path, qasper_path: Path) -> None:
    from arag.corpus.qasper import load_qasper
    from arag.library.build import LibraryBuilder
    from arag.library.rebuild import _start_generation

    s = _settings(tmp_path / "lib", 6)
    build_library(s)
    # A rebuild of 6 papers killed just before its switch: a complete generation, still pending.
    name = _start_generation(s)
    with LibraryBuilder(s.at_generation(name)) as b:
        b.index_papers(load_qasper(qasper_path, max_papers=6)[0])
    fewer = _settings(tmp_path / "lib", 4)
    summary = build_library(fewer, rebuild=True)
    assert fewer.generation() == name  # resumed, not started over
    assert summary.papers_skipped == 4 and summary.papers_added == 0
    rows = list_papers(fewer)
    assert len(rows) == 4 and library_status(fewer).chunks == sum(r.n_chunks for r in rows)
    assert all(r.topic is not None for r in rows)
    # What a rebuild killed during its cleanup leaves (the first library's files) goes next time.
    (fewer.data_dir / "index").mkdir()
    (fewer.data_dir / "library.sqlite3").write_bytes(b"")
    build_library(fewer, rebuild=True)
    assert not (fewer.data_dir / "index").exists() and not (fewer.data_dir / "library.sqlite3").exists()
    assert len(list_papers(fewer)) == 4
