"""The first run: ``arag serve`` on an empty data directory answers at once, builds the default library
in the background while questions are answered over the papers indexed so far (each answer says how
much it searched), resumes that build after a SIGKILL, and picks up a reranker trained meanwhile.

Hash embedder and scripted LLM through the same factories as the real ones; a real uvicorn server (or
the real ``arag serve`` in a subprocess for the kill)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from arag.library.manage import BuildTarget, build_library, pending_build
from arag.service import create_app
from arag.service.background import open_serving_library
from arag.settings import Settings, get_settings
from arag.stress.common import cli_command, cli_env, snapshot
from arag.stress.crash import check_consistency
from conftest import qasper_papers
from service_util import SMALL as SERVICE_SMALL
from service_util import echo_llm, free_port, running_server

PAPERS = 24
# The service tests' small library, its build in batches of two papers.
SMALL: dict[str, Any] = {**SERVICE_SMALL, "store": {"papers_per_batch": 2}}


def fresh_settings(data: Path, papers: int = PAPERS, **extra: Any) -> Settings:
    return get_settings(data_dir=data, corpus={"max_papers": papers}, **{**SMALL, **extra})


def wait_for(url: str, ok: Callable[[dict[str, Any]], bool], timeout: float = 180.0) -> dict[str, Any]:
    """GET /ready until ``ok`` holds for its body; that body."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            body = httpx.get(f"{url}/ready", timeout=5).json()
            if ok(body):
                return body
        except httpx.HTTPError:
            body = {}
        if time.monotonic() > deadline:
            raise AssertionError(f"/ready never got there; last: {body}")
        time.sleep(0.05)


def test_pending_build_says_what_a_data_dir_needs(tmp_path: Path, qasper_path: Path) -> None:
    s = fresh_settings(tmp_path / "d", papers=4)
    assert pending_build(s) == BuildTarget(max_papers=4, reason="empty")
    build_library(s)
    assert pending_build(s) is None  # complete: serving never extends a finished library
    other = fresh_settings(tmp_path / "d", papers=6)
    assert pending_build(other) is None  # ... even when the settings now ask for more


def test_an_empty_library_serves_at_once_and_answers_over_what_is_indexed(
    tmp_path: Path, qasper_path: Path
) -> None:
    settings = fresh_settings(tmp_path / "data")
    lib = open_serving_library(settings, llm=echo_llm())
    try:
        with running_server(create_app(settings, library=lib, background=True)) as url:
            assert httpx.get(f"{url}/health").status_code == 200
            r = httpx.get(f"{url}/ready")
            first = r.json()
            assert r.status_code == 200 and first["ready"] and first["state"] == "building", first
            assert first["build"]["state"] in ("loading", "building") and first["build"]["reason"] == "empty"
            assert first["papers"] < PAPERS

            # A question while the build runs: answered over the papers indexed by then, and saying so.
            mid = wait_for(url, lambda b: b["papers"] >= 4 and b["state"] == "building")
            assert mid["build"]["papers_total"] == PAPERS and mid["build"]["chunks_done"] > 0
            assert mid["build"]["papers_per_s"] > 0 and mid["build"]["eta_s"] is not None
            # A paper not indexed yet (the corpus's last: the last batch's): a 404 saying why.
            last = qasper_papers(PAPERS)[-1].id
            r = httpx.post(f"{url}/query", json={"question": "What is it?", "papers": [last]}, timeout=60)
            if r.status_code == 404:
                assert "still being built" in r.json()["error"] and "GET /ready" in r.json()["fix"]
            else:  # the build got there first
                assert r.status_code == 200, r.text
            indexed = {p["id"]: p["title"] for p in httpx.get(f"{url}/papers?limit=200").json()["papers"]}
            pid, title = next(iter(indexed.items()))
            q = f"In the paper '{title}': what do the authors propose?"
            answer = httpx.post(f"{url}/query", json={"question": q}, timeout=60).json()
            cov = answer["coverage"]
            assert cov["of"] == PAPERS and not cov["complete"], cov
            assert len(indexed) <= cov["papers"] < PAPERS
            assert answer["citations"], answer["text"]
            assert {c["paper_id"] for c in answer["chunks"]} == {pid}  # the named paper, resolved
            hits = httpx.post(f"{url}/search", json={"query": "neural network", "k": 10}, timeout=60).json()
            assert hits["hits"] and hits["coverage"]["of"] == PAPERS
            # Searches see only whole papers: every hit's paper has all its chunks in the index.
            after = {p["id"]: p["chunks"] for p in httpx.get(f"{url}/papers?limit=200").json()["papers"]}
            for h in hits["hits"]:
                if h["paper_id"] in after:
                    n = lib.store.count(_paper(h["paper_id"]))
                    assert n == after[h["paper_id"]]

            done = wait_for(url, lambda b: b["state"] == "complete")
            assert done["build"]["state"] == "complete" and done["papers"] == PAPERS
            assert done["checks"]["index"] == "ok"
            assert done["build"]["papers_done"] == PAPERS and done["build"]["eta_s"] == 0
            last = httpx.post(f"{url}/query", json={"question": q}, timeout=60).json()["coverage"]
            assert last == {"papers": PAPERS, "of": PAPERS, "complete": True}
    finally:
        lib.close()
    # The library the server built is the one `arag library build` builds.
    assert check_consistency(settings) == []
    assert pending_build(settings) is None


def _paper(pid: str) -> Any:
    from arag.records import SearchFilter

    return SearchFilter(paper_ids=[pid])


def _recorded(state_db: Path) -> int:
    try:
        with sqlite3.connect(state_db, timeout=1) as db:
            return int(db.execute("SELECT COUNT(*) FROM papers").fetchone()[0])
    except sqlite3.Error:
        return 0


def _serve(data: Path, port: int, log: Path, papers: int) -> subprocess.Popen[bytes]:
    env = cli_env(
        data,
        ARAG_SERVICE__PORT=str(port),
        ARAG_EMBEDDING__PROVIDER="hash",
        ARAG_CORPUS__MAX_PAPERS=str(papers),
        ARAG_STORE__PAPERS_PER_BATCH="2",
        ARAG_TOPICS__K="2",
        ARAG_RERANK__PROVIDER="none",
        ARAG_LLM__PROVIDER="extractive",
    )
    with log.open("ab") as out:
        return subprocess.Popen(cli_command("serve"), env=env, stdout=out, stderr=subprocess.STDOUT)


def test_sigkill_during_the_background_build_is_resumed_by_the_next_start(
    tmp_path: Path, qasper_path: Path
) -> None:
    papers = 30
    data, log = tmp_path / "data", tmp_path / "serve.log"
    settings = fresh_settings(data, papers=papers, llm={"provider": "extractive"})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(data, port, log, papers)
    try:
        wait_for(url, lambda b: b["state"] == "building", timeout=120)
        deadline = time.monotonic() + 120
        while _recorded(settings.state_db) < 6:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed_at = _recorded(settings.state_db)
    assert 6 <= killed_at < papers, "the build finished before the kill: nothing was tested"
    # Only whole papers: the recorded ones and, at most, the one batch in flight.
    assert check_consistency(settings, after_kill=True) == []
    assert pending_build(settings) == BuildTarget(max_papers=papers, reason="interrupted")

    proc = _serve(data, port, log, papers)
    try:
        body = wait_for(url, lambda b: b["build"] is not None and b["build"]["state"] != "loading", 120)
        assert body["build"]["reason"] == "interrupted"
        assert body["build"]["state"] == "complete" or body["build"]["papers_todo"] == papers - killed_at
        done = wait_for(url, lambda b: b["state"] == "complete", 180)
        assert done["papers"] == papers
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode in (0, 130) and "Traceback" not in log.read_text(), log.read_text()[-2000:]

    # Nothing lost, nothing twice: the same chunks as an uninterrupted build.
    assert check_consistency(settings) == []
    ref = fresh_settings(tmp_path / "ref", papers=papers, llm={"provider": "extractive"})
    build_library(ref)
    got, want = snapshot(settings), snapshot(ref)
    assert got.store_count == len(got.chunks) == want.store_count
    assert set(got.chunks) == set(want.chunks)
    assert pending_build(settings) is None


@pytest.mark.real_models
def test_a_reranker_trained_while_serving_is_picked_up(tmp_path: Path, shared_dir: Path) -> None:
    """The real training pipeline (1 layer, a few questions) in the server's background thread, mining
    through its open index; searches use the fused order until the model is installed, then it."""
    from arag.train.reranker_pipeline import train_reranker
    from test_train_reranker import CFG, TRAIN_PAPERS, VAL_PAPERS

    qdir = tmp_path / "questions"
    qdir.mkdir()
    paths = []
    for split, papers in (("train", TRAIN_PAPERS), ("validation", VAL_PAPERS)):
        src = shared_dir / "benchmarks" / "qasper" / f"questions_{split}.json"
        if not src.is_file():
            pytest.skip(f"{src} is missing")
        items = [q for q in json.loads(src.read_text()) if q["paper_id"] in papers]
        (qdir / src.name).write_text(json.dumps(items))
        paths.append(qdir / src.name)
    settings = get_settings(
        data_dir=tmp_path / "data",
        corpus={"paper_ids": TRAIN_PAPERS + VAL_PAPERS},
        **{**SMALL, "rerank": {"provider": "trained"}},
    )
    build_library(settings)
    calls: list[str] = []

    def trainer(s: Settings, store: Any, progress: Any) -> str:
        from arag.models.factory import library_embedder

        calls.append("train")
        emb = library_embedder(s)
        card = train_reranker(
            s, CFG, train_path=paths[0], val_path=paths[1], train_limit=30, val_limit=10,
            progress=progress, library=(store, emb),
        )  # fmt: skip
        return card.model_id

    lib = open_serving_library(settings, train=True, llm=echo_llm())
    assert lib.reranker_name == "none"  # the fused order until a model is installed
    try:
        with running_server(create_app(settings, library=lib, background=True, trainer=trainer)) as url:
            system = httpx.get(f"{url}/v1/system").json()
            assert system["models"]["reranker"].startswith("none: searches use the fused order")
            assert system["reranker"]["state"] in ("training", "installed")
            done = wait_for(url, lambda b: b["reranker"]["state"] not in ("waiting", "training"), 600)
            assert done["reranker"]["state"] == "installed", done["reranker"]
            assert done["state"] == "complete" and done["build"]["state"] == "off"
            hits = httpx.post(f"{url}/search", json={"query": "sentiment", "k": 5}).json()
            assert hits["model"].startswith("trained:minilm-l1-qasper-")
            assert all(h["rerank_score"] is not None for h in hits["hits"])
            assert httpx.get(f"{url}/v1/system").json()["models"]["reranker"] == hits["model"]
    finally:
        lib.close()
    assert calls == ["train"] and (settings.reranker_dir / "card.json").is_file()


def test_bench_first_run_times_a_small_first_run(
    tmp_path: Path, qasper_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`arag bench first-run` end to end on 6 papers (hash embedder, extractive answers, no training):
    every figure it reports comes from the run, in the order a user meets them."""
    from arag.bench.first_run import FirstRunResult, run_first_run_bench

    for var, value in {
        "ARAG_EMBEDDING__PROVIDER": "hash",
        "ARAG_TOPICS__K": "2",
        "ARAG_STORE__PAPERS_PER_BATCH": "2",
        "ARAG_RERANK__PROVIDER": "none",
    }.items():
        monkeypatch.setenv(var, value)
    data = tmp_path / "fresh"
    data.mkdir()
    r = run_first_run_bench(
        papers=6, llm="extractive", train=False, port=free_port(), data_dir=data, echo=lambda _: None
    )
    assert r.health_s is not None and r.page_s is not None and 0 < r.health_s <= r.page_s
    assert r.first_answer_s is not None and r.first_answer_s >= r.health_s
    assert r.first_answer_papers is not None and 1 <= r.first_answer_papers <= 6
    assert r.build_s is not None and r.build_s >= r.health_s and r.reranker_s is None
    assert r.chunks > 0 and r.health_idle.n == 40 and r.search_idle.n == 20 and r.health_building.n > 0
    assert r.full_build_s_extrapolated is not None and r.full_build_s_extrapolated > 0
    assert r.before["page_s"] == 17 * 60 + 4347 + 1257
    assert FirstRunResult.model_validate_json(r.model_dump_json()) == r


def test_a_first_run_that_trains_samples_held_out_train_papers_to_calibrate_on(qasper_path: Path) -> None:
    from arag.bench.first_run import sample_papers
    from arag.corpus.qasper_questions import default_questions_path, held_out_paper

    train = {q["paper_id"] for q in json.loads(default_questions_path("train").read_text())}
    papers = sample_papers(40)
    assert len(set(papers)) == 40 and set(papers) <= train
    assert sum(held_out_paper(p) for p in papers) == 10


def test_searches_while_batches_are_written_see_whole_papers(tmp_path: Path) -> None:
    """The store contract the background build relies on: one thread writes batches (delete + one
    upsert per batch, as the build does) while another searches the same open Edge shard; every
    search sees each paper with all of its chunks or with none, and never fails."""
    import threading

    import numpy as np

    from arag.index.qdrant_edge import EdgeStore
    from arag.index.sparse import BM25Encoder
    from arag.records import Chunk, chunk_id

    dim, per_paper, papers = 16, 7, 60
    rng = np.random.default_rng(0)
    enc = BM25Encoder(avg_len=4.0)
    store = EdgeStore.open(tmp_path / "index", dim)
    seen: list[dict[str, int]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for start in range(0, papers, 3):
                batch = []
                for p in range(start, start + 3):
                    pid = f"p{p:03d}"
                    store.delete_paper(pid)
                    for i in range(per_paper):
                        text = f"shared words paper {pid} part {i}"
                        batch.append(Chunk(
                            id=chunk_id(pid, i, text), paper_id=pid, index=i, title=pid, type="passage",
                            text=text, embed_text=text, n_tokens=6,
                        ))  # fmt: skip
                vecs = rng.normal(size=(len(batch), dim)).astype(np.float32)
                store.upsert(batch, vecs, [enc.encode_document(c.text) for c in batch])
                store.flush()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def read() -> None:
        try:
            while not done.is_set():
                hits = store.dense_search(rng.normal(size=dim).astype(np.float32), papers * per_paper)
                counts: dict[str, int] = {}
                for h in hits:
                    counts[h.chunk.paper_id] = counts.get(h.chunk.paper_id, 0) + 1
                seen.append(counts)
                terms = store.sparse_search(enc.encode_query("shared words"), papers * per_paper)
                seen.append({pid: sum(1 for h in terms if h.chunk.paper_id == pid) for pid in {
                    h.chunk.paper_id for h in terms}})  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=write), threading.Thread(target=read)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert len(seen) > 2 and any(0 < len(c) < papers for c in seen), "no search ran mid-build"
        for counts in seen:
            assert all(n == per_paper for n in counts.values()), counts
        assert store.count() == papers * per_paper
    finally:
        store.close()


def test_a_build_that_fails_leaves_the_server_answering_and_says_why(tmp_path: Path) -> None:
    settings = get_settings(
        data_dir=tmp_path / "data", corpus={"qasper_path": tmp_path / "missing.jsonl.gz"}, **SMALL
    )
    lib = open_serving_library(settings, llm=echo_llm())
    try:
        with running_server(create_app(settings, library=lib, background=True)) as url:
            body = wait_for(url, lambda b: b["build"]["state"] not in ("loading", "building"), 60)
            assert body["state"] == "incomplete" and body["ready"], body
            assert body["build"]["state"] == "failed" and "missing.jsonl.gz" in (
                body["build"]["error"] + (body["build"]["fix"] or "") + str(body["build"])
            )
            assert body["build"]["fix"]
            assert httpx.get(f"{url}/health").status_code == 200
            answer = httpx.post(f"{url}/query", json={"question": "What is BERT?"}, timeout=60).json()
            assert answer["abstained"] and answer["coverage"] == {"papers": 0, "of": 0, "complete": False}
    finally:
        lib.close()
    assert pending_build(settings) == BuildTarget(reason="empty")
