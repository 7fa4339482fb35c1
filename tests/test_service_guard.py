"""Who may call the service and how much they may send: body limits counted as the body streams
(chunked, or a Content-Length that lies), the Host header against DNS rebinding, cross-site writes,
no service beyond loopback without keys, wrong-key limits, key length, the page's headers."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from arag.api import Library
from arag.errors import ConfigError
from arag.service import create_app
from arag.settings import Settings, get_settings
from arag.stress.bombs import inflation_bomb, page_bomb
from service_util import SMALL, echo_llm, running_server

LOCAL = "http://127.0.0.1:7860"
KEY = "guard-key-" + "k" * 30


@pytest.fixture(scope="module")
def library(small_library: Callable[..., Settings]) -> Iterator[Library]:
    data = small_library("service_guard", corpus={"max_papers": 3}, **SMALL).data_dir  # its own
    with Library(get_settings(data_dir=data, **SMALL), llm=echo_llm()) as lib:
        yield lib


def with_settings(library: Library, api_keys: str | None = None, **service: Any) -> Settings:
    s = library.settings
    update: dict[str, Any] = {"service": s.service.model_copy(update=service)}
    if api_keys is not None:
        update["api_keys"] = api_keys
    return get_settings(**{**s.model_dump(exclude={"api_keys"}), **update})


@pytest.fixture
def client(library: Library) -> Iterator[TestClient]:
    with TestClient(create_app(library.settings, library=library), base_url=LOCAL) as c:
        yield c


def error_of(r: httpx.Response, status: int, words: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert words in body["error"] and body["fix"] and body["status"] == status, body
    assert body["request_id"] == r.headers["x-request-id"]
    return body


async def asgi_call(
    app: FastAPI,
    method: str,
    path: str,
    headers: dict[str, str],
    chunks: list[bytes],
    server: tuple[str, int],
) -> tuple[int, bytes, int]:
    """One request straight into the app, its body in ``chunks`` whatever the headers say: the
    status, the response body, and how many chunks the app read."""
    sent = list(chunks)
    read = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not sent:
            return {"type": "http.disconnect"}
        read += 1
        body = sent.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(sent)}

    status, out = 0, b""

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, out
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            out += message.get("body", b"")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": server,
    }
    await app(scope, receive, send)
    return status, out, read


# --- bodies ---------------------------------------------------------------------------------------


def test_a_declared_oversized_body_is_refused_before_it_is_read(library: Library) -> None:
    app = create_app(library.settings, library=library)
    with TestClient(app, base_url=LOCAL) as c:
        headers = {"host": "127.0.0.1:7860", "content-type": "application/json", "content-length": "300000"}
        status, body, read = c.portal.call(
            asgi_call, app, "POST", "/query", headers, [b"{}"] * 3, ("127.0.0.1", 7860)
        )
    assert status == 413 and b"256,000 bytes" in body and b"ARAG_SERVICE__MAX_BODY_KB" in body
    assert read == 0


def test_a_body_past_its_limit_is_stopped_whatever_content_length_says(library: Library) -> None:
    """The bytes are counted as they arrive: a Content-Length that lies (10) or none at all."""
    app = create_app(with_settings(library, max_body_kb=4), library=library)
    chunk = b'{"question": "' + b"x" * 1000
    with TestClient(app, base_url=LOCAL) as c:
        for length in ({"content-length": "10"}, {}):
            headers = {"host": "127.0.0.1:7860", "content-type": "application/json", **length}
            status, body, read = c.portal.call(
                asgi_call, app, "POST", "/query", headers, [chunk] * 100, ("127.0.0.1", 7860)
            )
            assert status == 413 and b"4,000 bytes" in body, body
            assert read == 4  # stopped at the first chunk past 4,000 bytes, not at the 100th


def test_a_chunked_upload_past_the_ingest_limit_is_413_and_starts_no_job(library: Library) -> None:
    settings = with_settings(library, max_upload_mb=0.2, max_upload_files=1)  # 1.2 MB with the form
    app = create_app(settings, library=library)
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="big.pdf"\r\n'
        "Content-Type: application/pdf\r\n\r\n%PDF-1.4\n"
    ).encode()

    def body() -> Iterator[bytes]:
        yield head
        for _ in range(400):  # 40 MB if nothing stopped it
            yield b"0" * 100_000

    with running_server(app) as url:
        started = time.perf_counter()
        r = httpx.post(
            f"{url}/ingest",
            content=body(),
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
            timeout=60,
        )
        took = time.perf_counter() - started
        error_of(r, 413, "over this route's limit of 1,200,000 bytes")
        assert "ARAG_SERVICE__MAX_UPLOAD_MB" in r.json()["fix"]
        assert httpx.get(f"{url}/ingest").json() == []  # no job, nothing stored
        assert httpx.get(f"{url}/health").status_code == 200
    assert took < 60


def test_a_chunked_json_body_past_the_limit_on_a_real_server(library: Library) -> None:
    app = create_app(with_settings(library, max_body_kb=8), library=library)

    def body() -> Iterator[bytes]:
        yield b'{"query": "'
        for _ in range(1000):
            yield b"y" * 10_000

    with running_server(app) as url:
        r = httpx.post(
            f"{url}/search", content=body(), headers={"content-type": "application/json"}, timeout=60
        )
        error_of(r, 413, "limit of 8,000 bytes")


# --- who may call ---------------------------------------------------------------------------------


def test_a_foreign_host_name_is_refused(client: TestClient, library: Library) -> None:
    for host in ("rebind.attacker.example", "rebind.attacker.example:7860", "127.0.0.1.nip.io"):
        body = error_of(client.get("/papers", headers={"host": host}), 400, "does not answer to the name")
        assert "ARAG_SERVICE__ALLOWED_HOSTS" in body["fix"]
    for host in ("127.0.0.1:7860", "localhost:7860", "localhost", "[::1]:7860", "10.1.2.3:7860"):
        assert client.get("/papers", headers={"host": host}).status_code == 200, host
    # A name of one's own (a reverse proxy on the same machine, say) is listed.
    app = create_app(with_settings(library, allowed_hosts=["arag.lab.example"]), library=library)
    with TestClient(app, base_url=LOCAL) as c:
        assert c.get("/papers", headers={"host": "arag.lab.example"}).status_code == 200


def test_a_write_from_another_site_is_refused(client: TestClient) -> None:
    question = {"query": "How are the networks assembled?"}
    foreign = (
        {"origin": "http://attacker.example"},
        {"origin": "null"},  # a sandboxed frame or a file
        {"origin": "http://127.0.0.1:8000"},  # another port is another site
        {"referer": "http://attacker.example/page.html"},
    )
    for headers in foreign:
        error_of(client.post("/search", json=question, headers=headers), 403, "from another site")
    # A form post to /ingest from a web page: no CORS preflight for forms, refused before any work.
    r = client.post(
        "/ingest", data={"arxiv_ids": "1601.01705"}, headers={"origin": "http://attacker.example"}
    )
    error_of(r, 403, "from another site")
    assert client.get("/ingest").json() == []
    # The page this server serves, and clients that are not browsers, go on.
    for headers in ({"origin": LOCAL}, {"referer": f"{LOCAL}/#search"}, {}):
        assert client.post("/search", json=question, headers=headers).status_code == 200, headers
    # Reads are not writes (and a foreign page cannot read them: no CORS, and the Host check).
    assert client.get("/papers", headers={"origin": "http://attacker.example"}).status_code == 200


def test_listed_cors_origins_may_write(library: Library) -> None:
    app = create_app(with_settings(library, cors_origins=["https://notebook.lab.example"]), library=library)
    with TestClient(app, base_url=LOCAL) as c:
        r = c.post("/search", json={"query": "modules"}, headers={"origin": "https://notebook.lab.example"})
        assert r.status_code == 200


def test_no_service_beyond_loopback_without_keys(library: Library) -> None:
    with pytest.raises(ConfigError, match="without API keys"):
        create_app(with_settings(library, host="0.0.0.0"), library=library)
    # Served by another command on all interfaces (uvicorn --host 0.0.0.0): a request that arrived
    # on a non-loopback address is refused; one that arrived on loopback goes on.
    app = create_app(library.settings, library=library)
    with TestClient(app, base_url=LOCAL) as c:
        headers = {"host": "192.168.1.5:7860"}
        status, body, _ = c.portal.call(asgi_call, app, "GET", "/papers", headers, [], ("192.168.1.5", 7860))
        assert status == 403 and b"beyond loopback" in body and b"ARAG_API_KEYS" in body
        status, _, _ = c.portal.call(asgi_call, app, "GET", "/papers", headers, [], ("127.0.0.1", 7860))
        assert status == 200
    # With keys it may serve beyond loopback.
    keyed = create_app(with_settings(library, api_keys=KEY, host="0.0.0.0"), library=library)
    with TestClient(keyed, base_url=LOCAL) as c:
        headers = {"host": "192.168.1.5:7860", "x-api-key": KEY}
        status, _, _ = c.portal.call(asgi_call, keyed, "GET", "/papers", headers, [], ("192.168.1.5", 7860))
        assert status == 200


def test_uvicorn_on_all_interfaces_refuses_other_addresses(library: Library) -> None:
    """The app served by plain uvicorn on 0.0.0.0 without keys: loopback works, the machine's own
    network address is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # UDP: picks the outgoing address, sends nothing
            address = probe.getsockname()[0]
        except OSError:
            pytest.skip("this machine has no network address besides loopback")
    if address.startswith("127."):
        pytest.skip("this machine has no network address besides loopback")
    import threading

    import uvicorn

    from service_util import free_port

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(library.settings, library=library), host="0.0.0.0", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{port}/papers").status_code == 200
        r = httpx.get(f"http://{address}:{port}/papers")
        assert r.status_code == 403 and "beyond loopback" in r.json()["error"]
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_wrong_keys_are_limited_per_client(library: Library) -> None:
    app = create_app(with_settings(library, api_keys=KEY, key_failures_per_minute=3), library=library)
    with TestClient(app, base_url=LOCAL, client=("10.0.0.7", 5000)) as guesser:
        for n in range(3):
            error_of(guesser.get("/papers", headers={"x-api-key": f"guess-{n}"}), 401, "not valid")
        r = guesser.get("/papers", headers={"x-api-key": KEY})  # even the right key, for a minute
        body = error_of(r, 429, "sent 3 wrong API keys in the last minute")
        assert int(r.headers["retry-after"]) >= 1 and "ARAG_SERVICE__KEY_FAILURES_PER_MINUTE" in body["fix"]
    with TestClient(app, base_url=LOCAL, client=("10.0.0.8", 5000)) as other:
        assert other.get("/papers", headers={"x-api-key": KEY}).status_code == 200


def test_short_api_keys_are_refused_saying_so(library: Library) -> None:
    with pytest.raises(ConfigError, match="shorter than 32 characters") as exc:
        get_settings(api_keys=f"{KEY},short")
    assert "1 of the 2 API keys" in str(exc.value) and "token_urlsafe" in str(exc.value)
    # Settings copied without validation are checked again when the app is made.
    bad = library.settings.model_copy(update={"api_keys": SecretStr("abc")})
    with pytest.raises(ConfigError, match="shorter than 32"):
        create_app(bad, library=library)


def test_the_page_has_a_strict_policy_and_nothing_is_sniffed(client: TestClient) -> None:
    page = client.get("/")
    csp = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert page.headers["x-frame-options"] == "DENY"
    assert "<script>" not in page.text and " style=" not in page.text  # nothing inline to allow
    for r in (page, client.get("/health"), client.get("/static/app.js"), client.post("/query", json={})):
        assert r.headers["x-content-type-options"] == "nosniff", r.url


# --- PDF bombs through POST /ingest ----------------------------------------------------------------


def test_an_uploaded_pdf_bomb_fails_its_job_with_the_reason(
    library: Library, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The library parses uploads under its own settings' limits.
    pdf = library.settings.pdf.model_copy(update={"max_pages": 5, "parse_memory_mb": 64})
    monkeypatch.setattr(library, "settings", library.settings.model_copy(update={"pdf": pdf}))
    pages = page_bomb(tmp_path / "pages.pdf", 6).read_bytes()
    inflated = inflation_bomb(tmp_path / "inflated.pdf", 5).read_bytes()
    with TestClient(create_app(library.settings, library=library), base_url=LOCAL) as c:
        before = c.get("/papers").json()["total"]
        r = c.post(
            "/ingest",
            files=[
                ("files", ("pages.pdf", pages, "application/pdf")),
                ("files", ("inflated.pdf", inflated, "application/pdf")),
            ],
        )
        assert r.status_code == 202, r.text
        job = r.json()
        deadline = time.monotonic() + 120
        while job["state"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
            job = c.get(f"/ingest/{job['id']}").json()
        assert job["state"] == "done", job
        reasons = {f["key"]: f["reason"] for f in job["failures"]}
        assert "has 6 pages (at most 5)" in reasons["pages.pdf"], reasons
        assert "needs more than 64 MB of memory" in reasons["inflated.pdf"], reasons
        assert c.get("/papers").json()["total"] == before and c.get("/health").status_code == 200


def test_arag_serve_refuses_all_interfaces_without_keys_and_short_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from arag.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["serve", "--host", "0.0.0.0"])
    assert res.exit_code == ConfigError.exit_code and "without API keys" in res.output, res.output
    monkeypatch.setenv("ARAG_API_KEYS", "too-short")
    res = runner.invoke(app, ["serve", "--host", "0.0.0.0"])
    assert res.exit_code == ConfigError.exit_code and "shorter than 32 characters" in res.output, res.output
