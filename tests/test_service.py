"""The HTTP API with FastAPI's test client, on a small hash-embedder library (6 QASPER papers, no
reranking model) with a scripted LLM; the SSE stream, cancellation, auth and rate limits, ingest."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from openapi_spec_validator import validate

from arag.api import Library
from arag.service import create_app
from arag.settings import Settings, get_settings
from arag.text import has_placeholder, strip_placeholders
from service_util import SMALL, echo_llm, running_server, sse_events

COMPOSE = "1601.01705"
# The service answers to its own names only (the Host header): the test client's default,
# "testserver", is not one of them.
LOCAL = "http://127.0.0.1:7860"
# A question naming its paper gets the one-paper answer (an open one, a literature answer).
NAMED = (
    "In the paper 'Joint learning of ontology and semantic parser from text': how is the ontology induced?"
)


@pytest.fixture(scope="module")
def lib_dir(small_library: Callable[..., Settings]) -> Path:
    return small_library("service", **SMALL).data_dir  # its own: the service writes beside it


def small_settings(data: Path, **service: object) -> Settings:
    return get_settings(data_dir=data, **SMALL, service=service)


@pytest.fixture(scope="module")
def library(lib_dir: Path) -> Iterator[Library]:
    with Library(small_settings(lib_dir), llm=echo_llm()) as lib:
        yield lib


@pytest.fixture
def client(library: Library) -> Iterator[TestClient]:
    with TestClient(create_app(library.settings, library=library), base_url=LOCAL) as c:
        yield c


def test_query_returns_a_cited_answer_with_its_trace(client: TestClient) -> None:
    r = client.post("/query", json={"question": NAMED})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["request_id"] == r.headers["x-request-id"]
    assert body["route"] == "research" and not body["abstained"] and body["mode"] == "llm"
    assert body["citations"] and body["sub_queries"] and body["timings"]["synthesizer"] > 0
    in_context = {c["n"]: c for c in body["chunks"] if c["n"] is not None}
    for cit in body["citations"]:
        assert in_context[cit["n"]]["chunk_id"] == cit["chunk_id"] and in_context[cit["n"]]["text"]
        assert 0.0 <= cit["support"] <= 1.0


def test_stream_sends_start_nodes_tokens_then_the_answer(client: TestClient) -> None:
    with client.stream("POST", "/query/stream", json={"question": NAMED}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.read().decode())
    kinds = [k for k, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "answer"
    nodes = [json.loads(d)["node"] for k, d in events if k == "node"]
    assert nodes[:4] == ["router", "planner", "retriever", "grader"] and nodes[-2:] == [
        "synthesizer",
        "verifier",
    ]
    tokens = "".join(json.loads(d)["text"] for k, d in events if k == "token")
    assert tokens.startswith("Short answer:")
    # Tokens come between the synthesizer's start and its event: after the context node's event.
    assert kinds.index("token") > max(
        i for i, (k, d) in enumerate(events) if '"context"' in d and k == "node"
    )
    answer = json.loads(events[-1][1])
    assert answer["request_id"] == json.loads(events[0][1])["request_id"] and answer["citations"]


def test_stream_bad_input_is_a_status_not_a_stream(client: TestClient) -> None:
    r = client.post("/query/stream", json={"question": "   "})
    assert r.status_code == 400 and r.json()["error"] == "the question is empty"
    r = client.post("/query/stream", json={"question": "What?", "papers": ["9999.99999"]})
    assert r.status_code == 404 and "unknown paper id" in r.json()["error"] and r.json()["fix"]


@pytest.mark.parametrize(
    ("path", "payload", "status", "words"),
    [
        ("/query", {"question": ""}, 422, "question"),
        ("/query", {"question": "x" * 2001}, 400, "at most 2,000"),
        ("/search", {"query": "x" * 2001}, 400, "at most 2,000"),
        ("/query", {"question": "x" * 100_000}, 422, "at most 20000"),
        ("/query", {"question": "What?", "extra": 1}, 422, "extra"),
        ("/query", {"question": "What?", "papers": ["nope"]}, 404, "unknown paper id"),
        ("/search", {"query": "modules", "k": 0}, 422, "k"),
        ("/chat", {"session_id": "a/b", "message": "hi"}, 400, "session id"),
    ],
)
def test_bad_requests_get_4xx_with_a_fix(
    client: TestClient, path: str, payload: dict[str, object], status: int, words: str
) -> None:
    r = client.post(path, json=payload)
    assert r.status_code == status, r.text
    body = r.json()
    assert words in body["error"] + (body["where"] or "") and body["fix"] and body["status"] == status


def test_bad_json_unknown_routes_and_methods(client: TestClient) -> None:
    r = client.post("/query", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.json()["error"]
    assert client.get("/nope").status_code == 404 and client.get("/query").status_code == 405


def test_search_shows_every_stage(client: TestClient) -> None:
    r = client.post("/search", json={"query": "How are the networks assembled?", "papers": [COMPOSE], "k": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["hits"]) == 5 and {h["paper_id"] for h in body["hits"]} == {COMPOSE}
    assert [h["rank"] for h in body["hits"]] == [1, 2, 3, 4, 5]
    for h in body["hits"]:
        assert h["found_by"] and set(h["stage_ranks"]) == set(h["found_by"]) and h["fused_rank"] >= 1
    assert any(h["kept"] for h in body["hits"]) and body["timings"]


def test_passages_are_shown_without_citation_stand_ins(client: TestClient, library: Library) -> None:
    # QASPER's text holds S2ORC's BIBREF3 / TABREF1 stand-ins; the LLM reads it without them, and so
    # does a reader of the page, the API and MCP (the library keeps the text as it was indexed).
    question = "How are the networks assembled?"
    stored = {h.chunk.id: h.chunk.text for h in library.search(question, papers=[COMPOSE], k=20).ranked}
    assert any(has_placeholder(t) for t in stored.values())
    hits = client.post("/search", json={"query": question, "papers": [COMPOSE], "k": 20}).json()["hits"]
    assert {h["chunk_id"] for h in hits} == set(stored)
    for h in hits:
        assert h["text"] == strip_placeholders(stored[h["chunk_id"]]) and not has_placeholder(h["text"])
    answer = client.post("/query", json={"question": question, "papers": [COMPOSE]}).json()
    assert answer["chunks"] and not any(has_placeholder(c["text"]) for c in answer["chunks"])


def test_papers_page_filter_and_detail(client: TestClient) -> None:
    everything = client.get("/papers").json()
    assert everything["total"] == 6 and len(everything["papers"]) == 6
    page = client.get("/papers", params={"offset": 2, "limit": 2}).json()
    assert [p["id"] for p in page["papers"]] == [p["id"] for p in everything["papers"][2:4]]
    found = client.get("/papers", params={"q": "compose NEURAL"}).json()
    assert [p["id"] for p in found["papers"]] == [COMPOSE]
    detail = client.get(f"/papers/{COMPOSE}").json()
    assert (
        detail["arxiv_url"] == f"https://arxiv.org/abs/{COMPOSE}"
        and detail["abstract"]
        and detail["chunks"] > 0
    )
    assert client.get("/papers/9999.99999").status_code == 404
    assert client.get("/papers", params={"limit": 0}).status_code == 422


def test_chat_keeps_a_session(client: TestClient) -> None:
    first = client.post(
        "/chat",
        json={
            "session_id": "s-1",
            "message": "How are the networks assembled in the "
            "paper 'Learning to Compose Neural Networks for Question Answering'?",
        },
    )
    assert first.status_code == 200, first.text
    follow = client.post("/chat", json={"session_id": "s-1", "message": "How are they trained?"}).json()
    assert follow["session_id"] == "s-1" and follow["message"] == "How are they trained?"
    assert follow["question"] != follow["message"]  # rewritten with the paper of the first turn


def test_health_ready_system(client: TestClient, library: Library) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready").json()
    assert ready["ready"] and ready["papers"] == 6 and ready["chunks"] == library.chunk_count()
    system = client.get("/v1/system").json()
    assert system["models"]["llm"] == "scripted" and system["library"]["papers"] == 6
    assert system["settings"]["api_keys"] is False


def test_openapi_lists_every_route(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in (
        "/query",
        "/query/stream",
        "/search",
        "/chat",
        "/papers",
        "/papers/{paper_id}",
        "/ingest",
        "/ingest/{job_id}",
        "/health",
        "/ready",
        "/v1/system",
    ):
        assert path in spec["paths"], path
    assert "multipart/form-data" in spec["paths"]["/ingest"]["post"]["requestBody"]["content"]
    validate(spec)  # raises on any violation of the OpenAPI 3.1 schema


def test_docs_pages_load_nothing_from_outside(client: TestClient) -> None:
    for path in ("/docs", "/redoc"):
        page = client.get(path)
        assert page.status_code == 200 and "/openapi.json" in page.text
        assert not re.search(r"https?://(?!127\.0\.0\.1)", page.text.replace(LOCAL, "")), path
        for asset in re.findall(r'"(/docs-static/[^"]+)"', page.text):
            assert client.get(asset).status_code == 200, asset


K1, K2 = "k1-" + "a" * 29, "k2-" + "b" * 29  # keys of 32 characters


def test_api_keys_and_rate_limits(library: Library) -> None:
    settings = get_settings(
        data_dir=library.settings.data_dir,
        **SMALL,
        api_keys=f"{K1},{K2}",
        service={"rate_limit_per_minute": 3},
    )
    with TestClient(create_app(settings, library=library), base_url=LOCAL) as c:
        assert c.get("/health").status_code == 200  # liveness needs no key
        r = c.get("/papers")
        assert r.status_code == 401 and "no API key" in r.json()["error"]
        assert c.get("/papers", headers={"X-API-Key": "wrong"}).status_code == 401
        for _ in range(3):
            assert c.get("/papers", headers={"Authorization": f"Bearer {K1}"}).status_code == 200
        over = c.get("/papers", headers={"Authorization": f"Bearer {K1}"})
        assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
        assert c.get("/papers", headers={"X-API-Key": K2}).status_code == 200  # limits are per key


def test_full_queue_answers_503_and_searches_go_on(library: Library) -> None:
    settings = library.settings.model_copy(
        update={"service": library.settings.service.model_copy(update={"workers": 1, "queue_size": 0})}
    )
    gate = threading.Event()
    app = create_app(settings, library=library)
    with TestClient(app, base_url=LOCAL) as c:
        pool = app.state.svc.pool
        blocker = threading.Thread(target=lambda: c.portal.call(pool.run, gate.wait))
        blocker.start()
        deadline = time.monotonic() + 5
        while pool.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = c.post("/query", json={"question": "What do the modules compute?"})
        assert r.status_code == 503 and r.headers["retry-after"] and "busy" in r.json()["error"]
        r = c.post("/query/stream", json={"question": "What do the modules compute?"})
        assert r.status_code == 503 and "busy" in r.json()["error"]
        # Searches have their own workers: never queued behind answers waiting for the LLM.
        assert c.post("/search", json={"query": "modules"}).status_code == 200
        assert c.get("/health").status_code == 200
        gate.set()
        blocker.join()
        assert c.post("/query", json={"question": "What do the modules compute?"}).status_code == 200


def copy_library(lib_dir: Path, dest: Path) -> Path:
    """A private copy of the module's library (one process may hold an index open at a time)."""
    shutil.copytree(lib_dir, dest)
    return dest


def test_a_client_that_disconnects_stops_the_run(lib_dir: Path, tmp_path: Path) -> None:
    llm = echo_llm(delay_s=0.2)
    with Library(small_settings(copy_library(lib_dir, tmp_path / "lib")), llm=llm) as lib:
        app = create_app(lib.settings, library=lib)
        with running_server(app) as url:
            with httpx.stream("POST", f"{url}/query/stream", json={"question": NAMED}, timeout=30) as r:
                for line in r.iter_lines():
                    if line.startswith("event: token"):
                        break  # hang up mid-answer
            pool = app.state.svc.pool
            deadline = time.monotonic() + 10
            while pool.in_flight and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pool.in_flight == 0
            time.sleep(0.5)
            # The run stopped at the next piece: most of the answer was never generated.
            assert 1 <= llm.pieces_sent < llm.pieces_total - 3, (llm.pieces_sent, llm.pieces_total)


def test_ingest_uploads_and_rejects(tmp_path: Path, lib_dir: Path, shared_dir: Path) -> None:
    data = copy_library(lib_dir, tmp_path / "lib")
    pdf = next((shared_dir / "pdfs").glob("*.pdf"))
    with (
        Library(small_settings(data), llm=echo_llm()) as lib,
        TestClient(create_app(lib.settings, library=lib), base_url=LOCAL) as c,
    ):
        r = c.post("/ingest", files=[("files", ("notes.txt", b"hello", "text/plain"))])
        assert r.status_code == 415 and "not a PDF" in r.json()["error"]
        assert c.post("/ingest", data={"arxiv_ids": "not-an-id"}).status_code == 400
        assert c.post("/ingest", json={"files": []}).status_code == 400
        before = c.get("/papers").json()["total"]
        r = c.post(
            "/ingest",
            files=[
                ("files", ("../../etc/My Paper.pdf", pdf.read_bytes(), "application/pdf")),
                ("files", ("empty.pdf", b"%PDF-1.4\n", "application/pdf")),
            ],
        )
        assert r.status_code == 202, r.text
        job = r.json()
        deadline = time.monotonic() + 120
        while job["state"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
            job = c.get(f"/ingest/{job['id']}").json()
        assert job["state"] == "done", job
        assert job["summary"]["papers_added"] == 1 and [f["key"] for f in job["failures"]] == ["empty.pdf"]
        papers = c.get("/papers", params={"limit": 200}).json()
        assert papers["total"] == before + 1
        added = [p for p in papers["papers"] if p["id"].startswith("pdf:my-paper-")]
        assert added and added[0]["chunks"] > 0
        stored = list((data / "uploads" / job["id"]).iterdir())
        assert [p.name for p in stored if p.name.startswith("my-paper")] == [
            "my-paper.pdf"
        ]  # no path from the name
        assert c.get("/ready").json()["ready"]
        assert c.get("/ingest/000000000000").status_code == 404


def test_ingest_fetches_arxiv_ids_and_caps_uploads(tmp_path: Path, lib_dir: Path, shared_dir: Path) -> None:
    """arXiv ids are fetched from the configured PDF URL (a local server here, never the network);
    an id the server does not have is a listed failure; an upload over the limit is a 413."""
    import http.server

    pdf = next((shared_dir / "pdfs").glob("*.pdf")).read_bytes()

    class PDFs(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/pdf/2203.00130"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/pdf")
            self.end_headers()
            if found:
                self.wfile.write(pdf)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), PDFs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    data = copy_library(lib_dir, tmp_path / "lib")
    settings = get_settings(
        data_dir=data,
        **SMALL,
        arxiv={"pdf_url": f"http://127.0.0.1:{server.server_port}/pdf/{{id}}", "retries": 0, "delay_s": 0},
        service={"max_upload_mb": 0.05},
    )
    try:
        with (
            Library(settings, llm=echo_llm()) as lib,
            TestClient(create_app(settings, library=lib), base_url=LOCAL) as c,
        ):
            r = c.post("/ingest", files=[("files", ("big.pdf", b"%PDF-" + b"x" * 60_000, "application/pdf"))])
            assert r.status_code == 413 and "at most" in r.json()["error"]
            r = c.post("/ingest", data={"arxiv_ids": "arXiv:2203.00130, 1111.11111"})
            assert r.status_code == 202, r.text
            job = r.json()
            assert job["arxiv_ids"] == ["2203.00130", "1111.11111"]
            deadline = time.monotonic() + 120
            while job["state"] in ("queued", "running") and time.monotonic() < deadline:
                time.sleep(0.2)
                job = c.get(f"/ingest/{job['id']}").json()
            assert job["state"] == "done", job
            assert job["summary"]["papers_added"] == 1
            assert [(f["key"], f["source"]) for f in job["failures"]] == [("1111.11111", "arxiv")]
            assert c.get("/papers").json()["total"] == 7
    finally:
        server.shutdown()
