"""Sustained load: ``clients`` concurrent clients loop for ``duration_s`` over a mix of ``POST /query``,
``POST /query/stream`` (read to the end; it must send an ``answer`` event) and ``POST /search``, with
questions from a fixed list, while a prober times ``GET /health`` every 50 ms on its own connection.

An error is any non-200, a stream without an ``answer`` event (or with an ``error`` event), or a
transport error (refused, reset, timed out). A 503 (the queue is full) is an error too: the pool
admits ``workers + queue_size`` requests (20 by default), more than the 16 clients of the default
run, so a 503 there means places are held past the end of their requests. Pass: no error anywhere
and the /health p95 under 50 ms (the event loop stays free while the workers answer).

Bounded: no request starts after the deadline, each has a timeout, and the whole run is cut at
``duration_s + request_timeout_s + 5`` s whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass, field

import httpx
from pydantic import BaseModel, Field

from arag.stress.common import QUESTIONS, Latency

ROUTES = ("query", "stream", "search")
HEALTH_P95_MS = 50.0


class RouteStats(BaseModel):
    route: str
    requests: int
    errors: int
    error_kinds: dict[str, int] = Field(description="status code, exception or stream problem: count")
    busy: int = Field(description="503 answers (counted in errors)")
    latency: Latency = Field(description="every request's time to its full answer, errors included")


class LoadReport(BaseModel):
    base_url: str
    clients: int
    duration_s: float
    mix: dict[str, float]
    seed: int
    wall_s: float
    routes: list[RouteStats]
    requests: int
    errors: int
    throughput_rps: float
    health: Latency
    health_errors: int
    health_p95_limit_ms: float = HEALTH_P95_MS
    cut_at_bound: bool = Field(description="the run overran its bound and was cancelled")
    passed: bool


@dataclass
class _Route:
    times: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def run_load(
    base_url: str,
    *,
    clients: int = 16,
    duration_s: float = 120.0,
    mix: tuple[float, float, float] = (1.0, 1.0, 1.0),
    seed: int = 0,
    request_timeout_s: float = 60.0,
    probe_interval_s: float = 0.05,
    headers: dict[str, str] | None = None,
) -> LoadReport:
    """Run the load against the service at ``base_url``; ``mix``: weights of (query, stream,
    search). ``headers`` go with every request (an API key)."""
    if len(mix) != len(ROUTES) or min(mix) < 0 or sum(mix) <= 0:
        raise ValueError(f"mix takes {len(ROUTES)} weights (query, stream, search), not all zero: {mix}")
    base_url = base_url.rstrip("/")
    stats = {r: _Route() for r in ROUTES}
    health: list[float] = []
    health_errors: list[str] = []
    t0 = time.perf_counter()
    deadline = time.monotonic() + duration_s
    # The prober has its own thread and connection: its timings are the server's answer time, not
    # how long the clients' event loop took to get back to it.
    stop = threading.Event()
    prober = threading.Thread(
        target=_prober,
        args=(base_url, headers or {}, deadline, probe_interval_s, stop, health, health_errors),
        name="arag-load-prober",
        daemon=True,
    )
    prober.start()
    try:
        cut = asyncio.run(
            _run(base_url, clients, deadline, duration_s, mix, seed, request_timeout_s, headers or {}, stats)
        )
    finally:
        stop.set()
        prober.join(timeout=10)
    wall = time.perf_counter() - t0
    routes = [
        RouteStats(
            route=name,
            requests=len(s.times),
            errors=sum(s.errors.values()),
            error_kinds=dict(sorted(s.errors.items())),
            busy=s.errors.get("503", 0),
            latency=Latency.of(s.times),
        )
        for name, s in stats.items()
    ]
    requests = sum(r.requests for r in routes)
    errors = sum(r.errors for r in routes)
    h = Latency.of(health)
    return LoadReport(
        base_url=base_url,
        clients=clients,
        duration_s=duration_s,
        mix=dict(zip(ROUTES, mix, strict=True)),
        seed=seed,
        wall_s=round(wall, 2),
        routes=routes,
        requests=requests,
        errors=errors,
        throughput_rps=round(requests / wall, 2) if wall else 0.0,
        health=h,
        health_errors=len(health_errors),
        cut_at_bound=cut,
        passed=errors == 0 and not health_errors and not cut and h.n > 0 and h.p95_ms < HEALTH_P95_MS,
    )


async def _run(
    base_url: str,
    clients: int,
    deadline: float,
    duration_s: float,
    mix: tuple[float, float, float],
    seed: int,
    timeout_s: float,
    headers: dict[str, str],
    stats: dict[str, _Route],
) -> bool:
    """The clients until the deadline; True when the bound cut them."""
    # An idle pooled connection is dropped after 2 s, before uvicorn's 5 s keep-alive timeout closes it:
    # with both at 5 s (httpx's default), a request sent on a connection the server is closing at that
    # moment fails with a ReadError that is the client's race, not the server's error.
    limits = httpx.Limits(
        max_connections=clients + 4, max_keepalive_connections=clients + 4, keepalive_expiry=2.0
    )
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=timeout_s, limits=limits
    ) as http:
        tasks = [
            asyncio.create_task(_client(http, random.Random(seed * 1000 + i), mix, deadline, stats))
            for i in range(clients)
        ]
        done, pending = await asyncio.wait(tasks, timeout=duration_s + timeout_s + 5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()  # a bug in a client loop is raised, not hidden
        return bool(pending)


async def _client(
    http: httpx.AsyncClient,
    rng: random.Random,
    mix: tuple[float, float, float],
    deadline: float,
    stats: dict[str, _Route],
) -> None:
    while time.monotonic() < deadline:
        route = rng.choices(ROUTES, weights=mix)[0]
        question = rng.choice(QUESTIONS)
        t0 = time.perf_counter()
        try:
            if route == "stream":
                problem = await _stream(http, question)
            else:
                path, body = (
                    ("/query", {"question": question})
                    if route == "query"
                    else ("/search", {"query": question})
                )
                r = await http.post(path, json=body)
                problem = None if r.status_code == 200 else str(r.status_code)
        except httpx.HTTPError as exc:
            problem = type(exc).__name__
        except (ValueError, AttributeError) as exc:  # an event whose data is not the JSON it should be
            problem = f"bad event data ({type(exc).__name__})"
        stats[route].times.append(1000 * (time.perf_counter() - t0))
        if problem is not None:
            stats[route].error(problem)


async def _stream(http: httpx.AsyncClient, question: str) -> str | None:
    """None when the stream ended with an answer; else what was wrong."""
    event = ""
    answered = False
    async with http.stream("POST", "/query/stream", json={"question": question}) as r:
        if r.status_code != 200:
            await r.aread()
            return str(r.status_code)
        async for line in r.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                if event == "error":
                    status = json.loads(line[5:]).get("status", "?")
                    return f"error event {status}"
                if event == "answer":
                    json.loads(line[5:])  # the whole answer arrived
                    answered = True
    return None if answered else "stream without an answer"


def _prober(
    base_url: str,
    headers: dict[str, str],
    deadline: float,
    interval_s: float,
    stop: threading.Event,
    out: list[float],
    errors: list[str],
) -> None:
    with httpx.Client(base_url=base_url, headers=headers, timeout=5.0) as probe:
        while time.monotonic() < deadline and not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = probe.get("/health")
                if r.status_code != 200:
                    errors.append(str(r.status_code))
            except httpx.HTTPError as exc:
                errors.append(type(exc).__name__)
            out.append(1000 * (time.perf_counter() - t0))
            stop.wait(max(0.0, interval_s - (time.perf_counter() - t0)))
