"""The service over a supervised model process: a model process killed under a request costs that
request a 503 (or an SSE `error`) with the reason, /health keeps answering, the next request is
answered by the restarted process, and /ready and /v1/system show the process. A stand-in model
server (fixtures/fake_model_server.py) runs in the model's place; test_service_real.py does the same
with the real 0.5B."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from arag.api import Library
from arag.llm.local import LocalLLM
from arag.service import create_app
from arag.settings import Settings
from service_util import SMALL, running_server, sse_events
from test_llm_process import FAKE, wait_dead, words

LLM_SMALL = {**SMALL, "llm": {"provider": "llama-cpp", "start_timeout_s": 20, "cache": False}}
QUESTION = "What does the SLOW joint learning of ontology and semantic parser show?"


@pytest.fixture(scope="module")
def served(small_library: Callable[..., Settings]) -> Iterator[tuple[str, LocalLLM]]:
    # Its own: the service and the model's log write beside it.
    settings = small_library("llm_process", corpus={"max_papers": 4}, **LLM_SMALL)
    data = settings.data_dir
    llm = LocalLLM(Path("m.gguf"), settings.llm, name="fake", log_dir=data, tokenizer=words, command=FAKE)
    try:
        with Library(settings, llm=llm) as lib, running_server(create_app(settings, library=lib)) as url:
            yield url, llm
    finally:
        llm.close()


def model_pid(url: str) -> int:
    (proc,) = httpx.get(f"{url}/ready").json()["llm_processes"]
    return int(proc["pid"])


def test_ready_and_system_show_the_model_process(served: tuple[str, LocalLLM]) -> None:
    url, _ = served
    ready = httpx.get(f"{url}/ready").json()
    assert ready["ready"] and ready["checks"]["llm"] == "ok (1 model process)"
    system = httpx.get(f"{url}/v1/system").json()
    (proc,) = system["llm_processes"]
    assert proc["state"] == "ready" and proc["pid"] == model_pid(url) and proc["build"] == "FAKE = 1"
    # Which llama.cpp build answers, and what the settings asked for (llm/builds.py).
    assert proc["build_name"] == "portable" and system["settings"]["llm_build"] == "auto"


def test_sigkill_under_a_query_is_a_503_and_the_service_lives_on(served: tuple[str, LocalLLM]) -> None:
    url, llm = served
    pid = model_pid(url)
    restarts = llm.info()[0].restarts
    result: dict[str, httpx.Response] = {}
    t = threading.Thread(
        target=lambda: result.update(r=httpx.post(f"{url}/query", json={"question": QUESTION}, timeout=60))
    )
    t.start()
    # In flight: the request has reached the model process (it holds a connection from the service).
    deadline = time.monotonic() + 30
    while not any(c.status == "ESTABLISHED" for c in psutil.Process(pid).net_connections()):
        assert time.monotonic() < deadline, "the query never reached the model process"
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    # The service answers meanwhile.
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    t.join(60)
    r = result["r"]
    assert r.status_code == 503, r.text
    body = r.json()
    assert "died during this request (SIGKILL" in body["error"] and body["fix"] and r.headers["retry-after"]
    # The next question waits for the restart and is answered by a new process.
    again = httpx.post(f"{url}/query", json={"question": "How is the ontology induced?"}, timeout=60)
    assert again.status_code == 200, again.text
    assert wait_dead(pid) and model_pid(url) != pid and llm.info()[0].restarts == restarts + 1
    ready = httpx.get(f"{url}/ready").json()
    assert ready["ready"] and ready["llm_processes"][0]["last_exit"].startswith("SIGKILL")


def test_sigkill_under_a_stream_is_an_error_event(served: tuple[str, LocalLLM]) -> None:
    url, _ = served
    pid = model_pid(url)
    with httpx.stream("POST", f"{url}/query/stream", json={"question": QUESTION}, timeout=60) as r:
        assert r.status_code == 200
        text = ""
        for chunk in r.iter_text():
            text += chunk
            if pid and "event: token" in text:
                os.kill(pid, signal.SIGKILL)
                pid = 0
    events = sse_events(text)
    assert [k for k, _ in events][-1] == "error"
    err = json.loads(events[-1][1])
    assert err["status"] == 503 and "SIGKILL" in err["error"]
    assert httpx.post(
        f"{url}/query", json={"question": "How is the ontology induced?"}, timeout=60
    ).is_success
