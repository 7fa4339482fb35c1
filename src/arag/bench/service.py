"""The service under concurrent streams: N clients ask over ``POST /query/stream`` at once while a
prober times ``GET /health`` every 50 ms. The baseline is ``/health`` on the same server, idle, in
the same run; the figure that matters is its p95 under load (target: < 50 ms) and that every
stream ends with an answer.

The server is ``arag serve`` in its own process (as users run it; ``arag.stress.api.serving``), or
any running one (``url``).
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import ExitStack

import httpx
from pydantic import BaseModel

from arag.settings import Settings
from arag.stress.common import QUESTIONS, Latency


class StreamRun(BaseModel):
    question: str
    ok: bool
    status: int
    first_event_ms: float
    first_token_ms: float | None
    total_ms: float
    nodes: int
    tokens: int
    abstained: bool | None
    error: str | None = None


class ServiceBench(BaseModel):
    url: str
    clients: int
    llm: str
    # Local model processes (ARAG_LLM__PROCESSES) and threads each; 0 for a hosted LLM.
    llm_processes: int = 0
    llm_threads: int = 0
    # Streamed tokens of all clients over the wall time: the machine's answer throughput.
    tokens_per_s: float = 0.0
    streams: list[StreamRun]
    completed: int
    wall_s: float
    stream_total: Latency
    first_token: Latency
    health_idle: Latency
    health_under_load: Latency
    health_ratio_p95: float
    health_errors: int


async def _stream(client: httpx.AsyncClient, question: str) -> StreamRun:
    t0 = time.perf_counter()
    first_event = first_token = None
    nodes = tokens = 0
    abstained: bool | None = None
    event = ""
    error = None
    status = 0
    try:
        async with client.stream("POST", "/query/stream", json={"question": question}, timeout=600) as r:
            status = r.status_code
            if status != 200:
                error = (await r.aread()).decode()[:300]
            async for line in r.aiter_lines():
                now = 1000 * (time.perf_counter() - t0)
                if line.startswith("event:"):
                    event = line[6:].strip()
                    first_event = first_event if first_event is not None else now
                elif line.startswith("data:"):
                    if event == "node":
                        nodes += 1
                    elif event == "token":
                        tokens += 1
                        first_token = first_token if first_token is not None else now
                    elif event == "answer":
                        abstained = bool(json.loads(line[5:])["abstained"])
                    elif event == "error":
                        error = line[5:].strip()[:300]
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    total = 1000 * (time.perf_counter() - t0)
    return StreamRun(
        question=question,
        ok=status == 200 and abstained is not None and error is None,
        status=status,
        first_event_ms=round(first_event or 0.0, 1),
        first_token_ms=None if first_token is None else round(first_token, 1),
        total_ms=round(total, 1),
        nodes=nodes,
        tokens=tokens,
        abstained=abstained,
        error=error,
    )


async def _probe(client: httpx.AsyncClient, stop: asyncio.Event, out: list[float], errors: list[int]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            r = await client.get("/health", timeout=10)
            if r.status_code != 200:
                errors.append(r.status_code)
        except httpx.HTTPError:
            errors.append(0)
        out.append(1000 * (time.perf_counter() - t0))
        await asyncio.sleep(0.05)


async def _run(
    url: str, clients: int, idle_probes: int
) -> tuple[list[float], list[float], list[int], list[StreamRun], float]:
    # Separate connection pools: the prober never waits behind a stream's connection.
    async with (
        httpx.AsyncClient(base_url=url) as probe,
        httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=clients + 2)) as streams,
    ):
        idle: list[float] = []
        for _ in range(idle_probes):
            t0 = time.perf_counter()
            (await probe.get("/health")).raise_for_status()
            idle.append(1000 * (time.perf_counter() - t0))
            await asyncio.sleep(0.02)
        stop = asyncio.Event()
        loaded: list[float] = []
        errors: list[int] = []
        prober = asyncio.create_task(_probe(probe, stop, loaded, errors))
        t0 = time.perf_counter()
        runs = await asyncio.gather(
            *(_stream(streams, QUESTIONS[i % len(QUESTIONS)]) for i in range(clients))
        )
        wall = time.perf_counter() - t0
        stop.set()
        await prober
    return idle, loaded, errors, list(runs), wall


def run_service_bench(
    settings: Settings,
    *,
    clients: int = 8,
    url: str | None = None,
    port: int = 7861,
    env: dict[str, str] | None = None,
) -> ServiceBench:
    """Start ``arag serve`` on the configured library (unless ``url``; ``env``: its extra settings,
    e.g. ``ARAG_LLM__PROCESSES``), run the clients, stop it; the figures."""
    from arag.stress.api import serving

    with ExitStack() as stack:
        if url is None:
            # No LLM cache: the benchmark asks the same questions every run, and cached replies cost nothing.
            log = settings.data_dir / "bench-serve.log"
            overrides = {"ARAG_LLM__CACHE": "false", **(env or {})}
            url = stack.enter_context(serving(settings.data_dir, port, log, **overrides))
        system = httpx.get(f"{url}/v1/system", timeout=10).json()
        llm = system["models"]["llm"]
        if system["settings"].get("llm_cache"):
            llm += " (with its LLM cache on: repeated questions cost nothing)"
        procs = system.get("llm_processes") or []
        idle, loaded, errors, runs, wall = asyncio.run(_run(url, clients, idle_probes=40))
    h_idle, h_load = Latency.of(idle), Latency.of(loaded)
    return ServiceBench(
        url=url,
        clients=clients,
        llm=llm,
        llm_processes=len(procs),
        llm_threads=int(system["settings"].get("llm_threads", 0)) // max(len(procs), 1) if procs else 0,
        tokens_per_s=round(sum(r.tokens for r in runs) / wall, 2) if wall else 0.0,
        streams=runs,
        completed=sum(r.ok for r in runs),
        wall_s=round(wall, 2),
        stream_total=Latency.of([r.total_ms for r in runs]),
        first_token=Latency.of([r.first_token_ms for r in runs if r.first_token_ms is not None]),
        health_idle=h_idle,
        health_under_load=h_load,
        health_ratio_p95=round(h_load.p95_ms / h_idle.p95_ms, 2) if h_idle.p95_ms else 0.0,
        health_errors=len(errors),
    )
