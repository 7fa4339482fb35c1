"""The real app on loopback with the real small models on three papers: the packaged MiniLM embedder
and Qwen2.5-Coder 0.5B through llama.cpp, opened by the app's own start-up; and `arag serve` itself
as a process, as a user starts it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from arag.library.manage import build_library, list_papers
from arag.service import create_app
from arag.settings import Settings, get_settings
from service_util import free_port, running_server, sse_events

pytestmark = pytest.mark.real_models

ONTOLOGY = "1601.00901"
ENV = {
    "ARAG_CORPUS__PAPER_IDS": json.dumps([ONTOLOGY, "1601.01705", "1603.01913"]),
    "ARAG_TOPICS__K": "2",
    "ARAG_RERANK__PROVIDER": "none",  # no trained reranker in a fresh data directory
    "ARAG_LLM__PROVIDER": "llama-cpp",
    "ARAG_LLM__MODEL": "qwen2.5-coder-0.5b",
    "ARAG_LLM__CONTEXT_TOKENS": "2048",
}


@pytest.fixture(scope="module")
def real_settings(tmp_path_factory: pytest.TempPathFactory, qasper_path: Path) -> Settings:
    pytest.importorskip("llama_cpp")
    data = tmp_path_factory.mktemp("service-real")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARAG_DATA_DIR", str(data))
        for k, v in ENV.items():
            mp.setenv(k, v)
        s = get_settings()
        build_library(s)
    return s


@pytest.fixture(scope="module")
def url(real_settings: Settings) -> Iterator[str]:
    with running_server(create_app(real_settings), timeout=300) as base:
        yield base


def test_the_app_loads_the_real_models_once_and_is_ready(url: str, real_settings: Settings) -> None:
    ready = httpx.get(f"{url}/ready").json()
    assert ready["ready"] and ready["papers"] == len(list_papers(real_settings)) >= 2 and ready["chunks"] > 0
    system = httpx.get(f"{url}/v1/system").json()
    assert system["models"]["llm"] == "qwen2.5-coder-0.5b"
    assert system["models"]["embedder"].startswith("all-MiniLM-L6-v2")


def test_a_streamed_answer_has_tokens_and_valid_citations(url: str) -> None:
    question = (
        "What is the main finding of the paper 'Joint learning of ontology and semantic parser from text'?"
    )
    with httpx.stream("POST", f"{url}/query/stream", json={"question": question}, timeout=300) as r:
        assert r.status_code == 200
        events = sse_events(r.read().decode())
    kinds = [k for k, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "answer" and "token" in kinds
    answer = json.loads(events[-1][1])
    assert not answer["abstained"] and answer["mode"] == "llm" and answer["citations"]
    used = {c["chunk_id"] for c in answer["chunks"]}
    assert all(c["chunk_id"] in used and c["paper_id"] == ONTOLOGY for c in answer["citations"])
    tokens = "".join(json.loads(d)["text"] for k, d in events if k == "token")
    assert "Short answer" in tokens or answer["short_answer"] in tokens


def test_search_and_health_while_a_question_runs(url: str) -> None:
    import threading

    done = threading.Event()

    def ask() -> None:
        httpx.post(
            f"{url}/query", json={"question": "How are the modules of the network composed?"}, timeout=300
        )
        done.set()

    t = threading.Thread(target=ask)
    t.start()
    worst = 0.0
    while not done.is_set():
        t0 = time.perf_counter()
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        worst = max(worst, time.perf_counter() - t0)
        time.sleep(0.05)
    t.join()
    # Not a timing test (the benchmark measures it): only that /health never waited for the answer.
    assert worst < 2.0, worst
    hits = httpx.post(f"{url}/search", json={"query": "ontology induction", "k": 3}, timeout=60).json()[
        "hits"
    ]
    assert len(hits) == 3 and all(h["found_by"] for h in hits)


def test_the_model_process_killed_under_a_query(url: str) -> None:
    """SIGKILL of the real model process mid-generation: that /query gets 503 with the reason, /health
    answers throughout, and the next /query is answered by the restarted process."""
    import signal
    import threading

    import psutil

    (proc,) = httpx.get(f"{url}/ready").json()["llm_processes"]
    model = psutil.Process(proc["pid"])
    result: dict[str, httpx.Response] = {}
    # A question no other test asks: a cached reply would never reach the model.
    question = "Which datasets does the paper 'Joint learning of ontology and semantic parser from text' use?"
    t = threading.Thread(
        target=lambda: result.update(r=httpx.post(f"{url}/query", json={"question": question}, timeout=300))
    )
    busy = model.cpu_times().user
    t.start()
    # The model process burns CPU only while it generates: that is when the query is in flight.
    deadline = time.monotonic() + 120
    while model.cpu_times().user < busy + 0.5:
        assert time.monotonic() < deadline and t.is_alive(), "the query never reached the model"
        time.sleep(0.05)
    model.send_signal(signal.SIGKILL)
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    t.join(300)
    r = result["r"]
    assert r.status_code == 503 and "SIGKILL" in r.json()["error"], r.text
    # Another new question about the paper (the one-paper path, whose answer the LLM writes),
    # answered by the restarted process, not from the cache.
    paper = "In the paper 'Joint learning of ontology and semantic parser from text': "
    again = httpx.post(
        f"{url}/query", json={"question": paper + "what does the semantic parser output?"}, timeout=300
    )
    assert again.status_code == 200, again.text
    assert again.json()["mode"].startswith("llm"), again.json()
    (after,) = httpx.get(f"{url}/ready").json()["llm_processes"]
    assert (
        after["pid"] != proc["pid"]
        and after["restarts"] == proc["restarts"] + 1
        and after["state"] == "ready"
    )


def _gone(pid: int, seconds: float = 15) -> bool:
    import psutil

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_arag_serve_starts_says_where_and_serves_the_page(real_settings: Settings, tmp_path: Path) -> None:
    # A copy of the library (the app above holds its index open), with the model assembled there.
    data = tmp_path / "lib"
    shutil.copytree(real_settings.data_dir, data, ignore=shutil.ignore_patterns("models"))
    gguf = next((real_settings.data_dir / "models" / "llm").glob("*0.5b*.gguf"))
    port = free_port()
    env = {
        **os.environ,
        **ENV,
        "ARAG_DATA_DIR": str(data),
        "ARAG_LLM__MODEL": str(gguf),
        "ARAG_SERVICE__PORT": str(port),
    }
    cmd = [sys.executable, "-c", "from arag.cli.main import app; app()", "serve"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "arag is serving" in line:
                break
        out = "".join(lines)
        assert f"http://127.0.0.1:{port}" in out, out
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        (model,) = httpx.get(f"http://127.0.0.1:{port}/ready").json()["llm_processes"]
        assert model["state"] == "ready" and model["pid"] != proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # No model process outlives the server it served.
    assert _gone(model["pid"]), f"model process {model['pid']} outlived arag serve"
