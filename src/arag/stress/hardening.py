"""Hostile requests against a running server (``arag stress api`` runs them after fuzzing): bodies
past their limit (chunked, and with a Content-Length that lies), a write from another site, a
DNS-rebinding Host, a 100k-character query (over HTTP and on the command line) and PDF bombs
uploaded to /ingest. Each case records the status it got, how long the rejection took, and whether
the server was still healthy; raw sockets are used where a client library would fix the request.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from pydantic import BaseModel

from arag.stress.bombs import inflation_bomb, page_bomb
from arag.stress.common import cli_command, cli_env

LONG_QUERY_CHARS = 100_000
# How long a rejection may take before it counts as a stall (the PDF bombs: their job's whole run).
REJECT_WITHIN_S = 5.0
BOMB_JOB_WITHIN_S = 300.0
CLI_WITHIN_S = 30.0  # the command's start-up (imports) is most of it


class HardeningCase(BaseModel):
    """One hostile request: what it should get, what it got, and how fast."""

    name: str
    expected: str
    got: str
    seconds: float
    detail: str = ""
    passed: bool


class HardeningReport(BaseModel):
    cases: list[HardeningCase]
    healthy_after: bool
    papers_unchanged: bool
    passed: bool
    problems: list[str]


def run_hardening(
    url: str,
    *,
    data_dir: Path,
    ingest_limit_bytes: int,
    inflation_mb: float = 100.0,
    echo: Callable[[str], None] = lambda _: None,
) -> HardeningReport:
    """Every case against the server at ``url`` (loopback), which serves ``data_dir``; the report.
    ``ingest_limit_bytes``: the server's /ingest body limit (the chunked upload goes past it);
    ``inflation_mb``: what the inflation bomb inflates to (100 MB passes the default memory limit)."""
    host, port = url.removeprefix("http://").split(":")
    addr = (host, int(port))
    before = httpx.get(f"{url}/papers", params={"limit": 1}).json()["total"]
    cases: list[HardeningCase] = []

    def case(
        name: str,
        expected: str,
        run: Callable[[], tuple[str, str]],
        ok: Callable[[str], bool],
        within: float = REJECT_WITHIN_S,
    ) -> None:
        echo(f"hardening: {name}")
        t0 = time.perf_counter()
        try:
            got, detail = run()
        except Exception as exc:  # a hang or a dropped connection is a result, not a crash
            got, detail = f"error: {type(exc).__name__}", str(exc)[:300]
        took = time.perf_counter() - t0
        cases.append(
            HardeningCase(
                name=name,
                expected=expected,
                got=got,
                seconds=round(took, 3),
                detail=detail,
                passed=ok(got) and took < within,
            )
        )

    json_headers = {"content-type": "application/json"}
    case(
        "JSON body of 20 MB, chunked (no Content-Length)",
        "413 before the body ends",
        lambda: _stream_body(addr, "/search", json_headers, chunked=True, total=20_000_000),
        lambda got: got.startswith("413"),
    )
    case(
        "/ingest upload past its limit, chunked",
        "413 before the body ends",
        lambda: _stream_body(
            addr,
            "/ingest",
            {"content-type": "multipart/form-data; boundary=x"},
            chunked=True,
            total=ingest_limit_bytes + 40_000_000,
            prefix=b'--x\r\nContent-Disposition: form-data; name="files"; filename="big.pdf"\r\n'
            b"Content-Type: application/pdf\r\n\r\n%PDF-1.4\n",
        ),
        lambda got: got.startswith("413"),
    )
    case(
        "Content-Length of 10 GB (a lie: 1 kB follows)",
        "413 without reading",
        lambda: _stream_body(addr, "/ingest", {"content-length": str(10**10)}, chunked=False, total=1000),
        lambda got: got.startswith("413"),
    )
    case(
        "Content-Length of 100 (a lie: 20 MB follow)",
        "a 4xx, the rest not read as the body",
        lambda: _stream_body(
            addr, "/search", {**json_headers, "content-length": "100"}, chunked=False, total=20_000_000
        ),
        lambda got: got[:1] == "4",
    )
    case(
        "POST /search from another site (Origin)",
        "403",
        lambda: _status(
            httpx.post(f"{url}/search", json={"query": "x"}, headers={"origin": "http://attacker.example"})
        ),
        lambda got: got.startswith("403"),
    )
    jobs_before = len(httpx.get(f"{url}/ingest").json())
    case(
        "form POST to /ingest from another site (no preflight)",
        "403, no job",
        lambda: _foreign_form(url, jobs_before),
        lambda got: got == "403, no job",
    )
    case(
        "DNS rebinding (Host: rebind.attacker.example)",
        "400",
        lambda: _status(httpx.get(f"{url}/papers", headers={"host": "rebind.attacker.example"})),
        lambda got: got.startswith("400"),
    )
    long_query = ("how are the networks assembled " * (LONG_QUERY_CHARS // 31 + 1))[:LONG_QUERY_CHARS]
    case(
        f"{LONG_QUERY_CHARS:,}-character query, POST /search",
        "422 or 400",
        lambda: _status(httpx.post(f"{url}/search", json={"query": long_query}, timeout=60)),
        lambda got: got[:3] in ("400", "422"),
    )
    case(
        f"{LONG_QUERY_CHARS:,}-character query, arag search",
        "exit 8",
        lambda: _cli_search(data_dir, long_query),
        lambda got: got == "exit 8",
        within=CLI_WITHIN_S,
    )
    with tempfile.TemporaryDirectory(prefix="arag-bombs-") as tmp:
        bombs = [
            page_bomb(Path(tmp) / "page-bomb.pdf", 1_000),
            inflation_bomb(Path(tmp) / "inflation-bomb.pdf", inflation_mb),
        ]
        case(
            f"PDF bombs uploaded to /ingest (1,000 pages; {bombs[1].stat().st_size / 1e3:.0f} kB "
            f"inflating to {inflation_mb:g} MB of text)",
            "job done, both refused with their limit, /health answering",
            lambda: _bomb_job(url, bombs),
            lambda got: got == "both refused",
            within=BOMB_JOB_WITHIN_S,
        )
    healthy = _healthy(url)
    after = httpx.get(f"{url}/papers", params={"limit": 1}).json()["total"]
    problems = [
        f"{c.name}: expected {c.expected}, got {c.got} in {c.seconds:.2f} s {c.detail}"
        for c in cases
        if not c.passed
    ]
    if not healthy:
        problems.append("the server was not ready after the hostile requests")
    if after != before:
        problems.append(f"the library changed: {before} papers before, {after} after")
    return HardeningReport(
        cases=cases,
        healthy_after=healthy,
        papers_unchanged=after == before,
        passed=not problems,
        problems=problems,
    )


def _status(r: httpx.Response) -> tuple[str, str]:
    try:
        body = r.json()
        return f"{r.status_code}", str(body.get("error", ""))[:200]
    except ValueError:
        return f"{r.status_code}", r.text[:200]


def _stream_body(
    addr: tuple[str, int],
    path: str,
    headers: dict[str, str],
    *,
    chunked: bool,
    total: int,
    prefix: bytes = b"",
) -> tuple[str, str]:
    """POST ``total`` bytes to ``path`` over a raw socket, 64 kB at a time, until the server answers;
    the status line and how much was sent by then."""
    head = [f"POST {path} HTTP/1.1", f"Host: {addr[0]}:{addr[1]}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    if chunked:
        head.append("Transfer-Encoding: chunked")
    sent = 0
    with socket.create_connection(addr, timeout=30) as sock:
        # A small send buffer: what counts as sent is close to what the server was given to read
        # (its own receive buffer still holds a few MB).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        if prefix:
            sock.sendall(b"%x\r\n%s\r\n" % (len(prefix), prefix) if chunked else prefix)
            sent += len(prefix)
        block = b"0" * 65536
        answered = False
        while sent < total:
            n = min(len(block), total - sent)
            data = block[:n]
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (n, data) if chunked else data)
            except OSError:
                break  # the server closed the connection: its answer is waiting
            sent += n
            sock.setblocking(False)
            try:
                answered = bool(sock.recv(1, socket.MSG_PEEK))
            except BlockingIOError:
                answered = False
            except OSError:
                break
            finally:
                sock.setblocking(True)
            if answered:
                break
        if chunked and not answered and sent >= total:
            with contextlib.suppress(OSError):
                sock.sendall(b"0\r\n\r\n")
        sock.settimeout(30)
        reply = b""
        try:
            while b"\r\n\r\n" not in reply:
                piece = sock.recv(65536)
                if not piece:
                    break
                reply += piece
        except OSError:
            pass
    status = reply.split(b"\r\n", 1)[0].decode(errors="replace").split(" ", 2)
    code = status[1] if len(status) > 1 else "no answer"
    return code, f"{sent / 1e6:.1f} MB of {total / 1e6:.1f} MB sent before the answer"


def _foreign_form(url: str, jobs_before: int) -> tuple[str, str]:
    r = httpx.post(
        f"{url}/ingest", data={"arxiv_ids": "1601.01705"}, headers={"origin": "http://attacker.example"}
    )
    jobs = len(httpx.get(f"{url}/ingest").json())
    got = f"{r.status_code}" + (
        ", no job" if jobs == jobs_before else f", {jobs - jobs_before} job(s) started"
    )
    return got, _status(r)[1]


def _cli_search(data_dir: Path, query: str) -> tuple[str, str]:
    proc = subprocess.run(
        cli_command("search", query), env=cli_env(data_dir), capture_output=True, text=True, timeout=120
    )
    said = (proc.stderr or proc.stdout).strip()
    return f"exit {proc.returncode}", said.splitlines()[0][:200] if said else ""


def _bomb_job(url: str, bombs: list[Path]) -> tuple[str, str]:
    files = [("files", (p.name, p.read_bytes(), "application/pdf")) for p in bombs]
    r = httpx.post(f"{url}/ingest", files=files, timeout=60)
    if r.status_code != 202:
        return f"{r.status_code}", r.text[:200]
    job = r.json()
    worst = 0.0
    deadline = time.monotonic() + BOMB_JOB_WITHIN_S
    while job["state"] in ("queued", "running") and time.monotonic() < deadline:
        t0 = time.perf_counter()
        ok = httpx.get(f"{url}/health", timeout=10).status_code == 200
        worst = max(worst, time.perf_counter() - t0)
        if not ok:
            return "/health failed during the job", ""
        time.sleep(0.25)
        job = httpx.get(f"{url}/ingest/{job['id']}").json()
    reasons = {f["key"]: f["reason"].splitlines()[0] for f in job.get("failures", [])}
    detail = f"/health max {worst * 1000:.0f} ms during the job; " + json.dumps(reasons)[:400]
    refused = (
        "pages (at most" in reasons.get("page-bomb.pdf", "")
        and "MB of memory" in reasons.get("inflation-bomb.pdf", "")
        and job["state"] == "done"
        and not job.get("summary", {}).get("papers_added")
    )
    return ("both refused" if refused else f"job {job['state']}"), detail


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False
