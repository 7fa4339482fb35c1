"""The API under fuzzing and load, against ``arag serve`` in its own process on loopback.

By default a fresh library of a few QASPER papers is built (with the real embedder) in the work
folder; ``library`` points at an existing data directory instead (the full library, say). Fuzzing
runs against a server answering extractively (it is about the API's contract, and thousands of
cases must stay cheap); the load runs against a server with the configured LLM (the answers cost
what they cost users).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from pydantic import BaseModel

from arag.errors import ConfigError
from arag.stress.common import cli_command, cli_env, make_workdir, quiet, stop_cli, tail
from arag.stress.fuzz import FuzzReport, run_fuzz
from arag.stress.hardening import HardeningReport, run_hardening
from arag.stress.load import LoadReport, run_load

UPLOAD_MB = 5.0


class ApiStressReport(BaseModel):
    library: str
    papers: int
    fuzz: FuzzReport | None
    hardening: HardeningReport | None = None
    load: LoadReport | None
    llm: str
    passed: bool
    problems: list[str]


@contextmanager
def serving(data_dir: Path, port: int, log: Path, **env: str) -> Iterator[str]:
    """``arag serve`` on 127.0.0.1:``port`` over ``data_dir`` until the block ends; its base URL."""
    overrides = {"ARAG_SERVICE__PORT": str(port), "ARAG_SERVICE__HOST": "127.0.0.1", **env}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cli_command("serve"), env=cli_env(data_dir, **overrides), stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900
        while True:
            if proc.poll() is not None:
                raise ConfigError(
                    f"arag serve exited with {proc.returncode}: {tail(log)}",
                    where=str(log),
                    fix="read its log",
                )
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ConfigError(
                    "arag serve was not ready in 15 minutes", where=str(log), fix="read its log"
                )
            time.sleep(0.5)
        yield url
    finally:
        stop_cli(proc, 30)


def run_api_stress(
    *,
    library: Path | None = None,
    papers: int = 20,
    workdir: Path | None = None,
    port: int = 7870,
    fuzz_examples: int = 100,
    clients: int = 16,
    duration_s: float = 120.0,
    llm: str | None = None,
    echo: Callable[[str], None] = quiet,
) -> ApiStressReport:
    """Build (or use) a library, fuzz the API against it, then load it; the figures."""
    work, _ = make_workdir(workdir, "arag-stress-api-")
    problems: list[str] = []
    if library is None:
        library = work / "library"
        echo(f"building {papers} papers in {library}")
        build = subprocess.run(
            cli_command("library", "build"),
            env=cli_env(library, ARAG_CORPUS__MAX_PAPERS=str(papers)),
            capture_output=True,
            text=True,
        )
        if build.returncode != 0:
            raise ConfigError(
                f"the library build failed: {build.stderr[-1500:]}", where=str(library), fix="read the error"
            )
        # A fresh folder has no trained reranker: the fused order (the service otherwise refuses to start).
        rerank = {"ARAG_RERANK__PROVIDER": "none"}
    else:
        rerank = {}
    n_papers = 0
    echo("fuzzing the API (extractive answers)")
    # Upload limits small enough that the hardening's chunked upload passes them quickly.
    upload = {"ARAG_SERVICE__MAX_UPLOAD_MB": str(UPLOAD_MB), "ARAG_SERVICE__MAX_UPLOAD_FILES": "2"}
    with serving(
        library, port, work / "serve-fuzz.log", ARAG_LLM__PROVIDER="extractive", **upload, **rerank
    ) as url:
        n_papers = httpx.get(f"{url}/papers", params={"limit": 1}).json()["total"]
        fuzz = run_fuzz(url, max_examples=fuzz_examples, answer_examples=max(5, fuzz_examples // 5))
        echo("hostile requests: oversized bodies, foreign Origin and Host, a 100k-character query, PDF bombs")
        hardening = run_hardening(
            url, data_dir=library, ingest_limit_bytes=int(UPLOAD_MB * 1e6) * 2 + 1_000_000, echo=echo
        )
    if not fuzz.passed:
        problems.append(
            f"fuzzing: {fuzz.server_errors} server errors, {fuzz.schema_violations} schema violations"
        )
    problems += [f"hardening: {p}" for p in hardening.problems]
    # Every answer generated for real: repeated questions would otherwise come from the LLM cache.
    env = {**rerank, "ARAG_LLM__CACHE": "false"}
    if llm:
        env["ARAG_LLM__PROVIDER"] = llm
    llm_name = "configured"
    echo(f"load: {clients} clients for {duration_s:.0f} s")
    with serving(library, port + 1, work / "serve-load.log", **env) as url:
        llm_name = httpx.get(f"{url}/v1/system").json()["models"]["llm"]
        load = run_load(url, clients=clients, duration_s=duration_s, request_timeout_s=900.0)
    if not load.passed:
        problems.append(
            f"load: {load.errors} errors, /health p95 {load.health.p95_ms:.1f} ms "
            f"(limit {load.health_p95_limit_ms:.0f})"
        )
    return ApiStressReport(
        library=str(library),
        papers=n_papers,
        fuzz=fuzz,
        hardening=hardening,
        load=load,
        llm=llm_name,
        passed=not problems,
        problems=problems,
    )
