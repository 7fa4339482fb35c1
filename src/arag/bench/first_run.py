"""``arag bench first-run``: the time a new user waits, from the start of ``arag serve`` in a fresh data
directory (what ``make serve`` runs once set-up is done) to the page answering ``/health``, to the
first cited answer over the partly built library, to the complete library and to the installed
reranker, beside the figures of the serve-after-build flow it replaces.

While the library builds in the server's background, ``/health`` and ``POST /search`` are timed and
compared with the same probes once the server is idle (after the build and the training), so the
cost of the background work to a user's questions is measured in the same run.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
from pydantic import BaseModel, Field

from arag.errors import ConfigError
from arag.stress.common import cli_command, cli_env, stop_cli, tail

FULL_LIBRARY = 1585
# Before serving came first (issue 13, a fresh 2-core machine): set-up, then `arag library build`, then
# `arag train reranker`, and only then `arag serve`.
BEFORE = {
    "setup_s": 17 * 60.0,
    "build_s": 4347.0,
    "reranker_s": 1257.0,
    "page_s": 17 * 60.0 + 4347.0 + 1257.0,  # about 1 h 45 min
}


class Latency(BaseModel):
    n: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    max_ms: float | None = None

    @classmethod
    def of(cls, ms: list[float]) -> Latency:
        if not ms:
            return cls()
        s = sorted(ms)
        return cls(
            n=len(s),
            p50_ms=round(statistics.median(s), 1),
            p95_ms=round(s[min(len(s) - 1, int(0.95 * len(s)))], 1),
            max_ms=round(s[-1], 1),
        )


class FirstRunResult(BaseModel):
    """Seconds from the start of ``arag serve`` in a fresh data directory, and the probes' latency."""

    papers: int = Field(
        description="papers of the library built (QASPER train papers in corpus order, a quarter of them "
        "held out of training for calibration; without training the corpus's first)"
    )
    llm: str
    setup_s: float | None = Field(
        default=None, description="set-up (`make venv`) as measured by the caller, if given"
    )
    health_s: float | None = Field(default=None, description="to GET /health answering")
    page_s: float | None = Field(default=None, description="to GET / serving the page")
    first_answer_s: float | None = Field(
        default=None, description="to the first cited (not abstained) answer"
    )
    first_answer_papers: int | None = Field(default=None, description="papers the first answer searched")
    first_answer_question: str | None = None
    attempts: int = 0
    build_s: float | None = Field(default=None, description="to the complete library (/ready state complete)")
    reranker_s: float | None = Field(
        default=None, description="to the trained reranker installed (None: not trained)"
    )
    reranker_state: str | None = None
    build_papers_per_s: float | None = None
    build_chunks_per_s: float | None = None
    chunks: int = 0
    health_building: Latency = Field(description="GET /health while the library builds")
    health_training: Latency = Field(description="GET /health while the reranker trains")
    health_idle: Latency = Field(description="GET /health with nothing in the background")
    # POST /search's hybrid search as the server times it (timings.search: embed, dense, BM25, fusion),
    # without the rerank stage, which only the idle server has: like against like.
    search_building: Latency
    search_training: Latency
    search_idle: Latency
    search_idle_rerank: Latency = Field(description="the rerank stage of those idle searches")
    full_build_s_extrapolated: float | None = Field(
        default=None,
        description=f"the build's rate scaled to {FULL_LIBRARY} papers (an extrapolation, not a run)",
    )
    before: dict[str, float] = Field(default_factory=lambda: dict(BEFORE))
    log_tail: str = ""


def _questions() -> dict[str, list[str]]:
    """QASPER train and validation questions by paper (empty without the benchmark)."""

    from arag.settings import find_shared_dir

    shared = find_shared_dir()
    out: dict[str, list[str]] = {}
    for name in ("train", "validation"):
        path = shared / "benchmarks" / "qasper" / f"questions_{name}.json" if shared else None
        if path is not None and path.is_file():
            for q in json.loads(path.read_text()):
                out.setdefault(q["paper_id"], []).append(q["question"])
    return out


def sample_papers(n: int) -> list[str]:
    """``n`` QASPER train papers in corpus order, a quarter of them from the slice held out of training
    (the reranker is calibrated on their questions: a library of the corpus's first papers would hold
    too few of them)."""

    from arag.corpus.qasper import load_qasper
    from arag.corpus.qasper_questions import held_out_paper
    from arag.settings import find_shared_dir, get_settings

    shared = find_shared_dir()
    qdir = shared / "benchmarks" / "qasper" if shared else None
    if qdir is None or not (qdir / "questions_train.json").is_file():
        raise ConfigError(
            "no QASPER questions beside the repository", where="../shared/benchmarks/qasper",
            fix="put the benchmark there, or run with --no-train",
        )  # fmt: skip
    train = {q["paper_id"] for q in json.loads((qdir / "questions_train.json").read_text())}
    quota = {True: n // 4, False: n - n // 4}
    papers, _ = load_qasper(get_settings().corpus.qasper_path)
    out: list[str] = []
    for p in papers:
        if p.id in train and quota[held_out_paper(p.id)] > 0:
            quota[held_out_paper(p.id)] -= 1
            out.append(p.id)
    return out


def _get(http: httpx.Client, path: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    r = http.get(path)
    return r.status_code, 1000 * (time.perf_counter() - t0)


def _search_ms(http: httpx.Client, query: str) -> tuple[float, float] | None:
    """The server's hybrid-search and rerank milliseconds of one POST /search."""
    r = http.post("/search", json={"query": query, "k": 10})
    if r.status_code != 200:
        return None
    t = r.json()["timings"]
    return float(t.get("search", 0.0)), float(t.get("rerank", 0.0))


def run_first_run_bench(
    *,
    papers: int,
    llm: str | None = None,
    train: bool = True,
    setup_s: float | None = None,
    port: int = 7871,
    data_dir: Path | None = None,
    timeout_s: float = 4 * 3600,
    echo: object = print,
) -> FirstRunResult:
    """Start ``arag serve`` on a fresh data directory and time what a new user waits for."""
    say = echo if callable(echo) else print
    own = data_dir is None
    data = Path(tempfile.mkdtemp(prefix="arag-first-run-")) if data_dir is None else Path(data_dir)
    if any(data.iterdir()) if data.exists() else False:
        raise ConfigError(
            f"{data} is not empty", where="--data-dir", fix="give an empty folder: the run starts fresh"
        )
    log = data.parent / f"{data.name}-serve.log"
    env = {"ARAG_SERVICE__PORT": str(port), "ARAG_SERVICE__HOST": "127.0.0.1", "ARAG_LLM__CACHE": "false"}
    if papers and train:
        # Training needs held-out train papers in the library: a mixed sample, not the corpus's first.
        env["ARAG_CORPUS__PAPER_IDS"] = json.dumps(sample_papers(papers))
    elif papers:
        env["ARAG_CORPUS__MAX_PAPERS"] = str(papers)
    if llm:
        env["ARAG_LLM__PROVIDER"] = llm
    if not train:
        env["ARAG_SERVICE__TRAIN_RERANKER"] = "false"
    url = f"http://127.0.0.1:{port}"
    result: dict[str, object] = {
        "papers": papers or FULL_LIBRARY,
        "llm": llm or "configured",
        "setup_s": setup_s,
    }
    health_b: dict[str, list[float]] = {"build": [], "train": []}
    search_b: dict[str, list[float]] = {"build": [], "train": []}
    phase = ["build"]
    stop = threading.Event()
    with log.open("wb") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cli_command("serve"), env=cli_env(data, **env), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        with httpx.Client(base_url=url, timeout=120) as http:

            def alive() -> None:
                if proc.poll() is not None:
                    raise ConfigError(
                        f"arag serve exited with {proc.returncode}: {tail(log)}",
                        where=str(log),
                        fix="read its log",
                    )
                if time.monotonic() - t0 > timeout_s:
                    raise ConfigError(
                        "the first run did not finish in time", where=str(log), fix="raise --timeout"
                    )

            while True:
                alive()
                try:
                    if http.get("/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            result["health_s"] = round(time.monotonic() - t0, 2)
            say(f"/health answered after {result['health_s']} s")
            page = http.get("/")
            result["page_s"] = round(time.monotonic() - t0, 2) if page.status_code == 200 else None

            # /health probed every 250 ms while the build, then the training, runs.

            def probe() -> None:
                with httpx.Client(base_url=url, timeout=30) as h:
                    while not stop.is_set():
                        try:
                            _code, ms = _get(h, "/health")
                            if phase[0] in health_b:
                                health_b[phase[0]].append(ms)
                        except httpx.HTTPError:
                            pass
                        time.sleep(0.25)

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()

            attempts = 0
            asked: set[str] = set()
            by_paper = _questions()
            last_ask = 0.0
            first_answer: float | None = None
            last_search = 0.0
            ready: dict = {}
            while True:
                alive()
                ready = http.get("/ready").json()
                n = int(ready.get("papers") or 0)
                question = None
                if first_answer is None and n > 0 and time.monotonic() - last_ask > 5.0:
                    # A QASPER question about an indexed paper, as the evaluations put it; the next
                    # one (at most one every 5 s) when the answer abstains.
                    for p in http.get("/papers", params={"limit": 200}).json()["papers"]:
                        for q in by_paper.get(p["id"], ["What do the authors propose?"]):
                            text = f"In the paper '{p['title']}': {q}"
                            if text not in asked:
                                question = text
                                break
                        if question:
                            break
                if question is not None:
                    asked.add(question)
                    attempts += 1
                    last_ask = time.monotonic()
                    r = http.post("/query", json={"question": question}, timeout=600)
                    if r.status_code == 200 and not r.json()["abstained"] and r.json()["citations"]:
                        first_answer = time.monotonic() - t0
                        result.update(
                            first_answer_s=round(first_answer, 2),
                            first_answer_papers=r.json()["coverage"]["papers"],
                            first_answer_question=question,
                        )
                        say(f"first cited answer after {first_answer:.1f} s ({n} papers indexed)")
                building = ready.get("state") == "building"
                if building and time.monotonic() - last_search > 2.0:
                    ms = _search_ms(http, "which datasets are used for evaluation")
                    if ms is not None:
                        search_b["build"].append(ms[0])
                    last_search = time.monotonic()
                if "build_s" not in result and ready.get("state") == "complete":
                    result["build_s"] = round(time.monotonic() - t0, 2)
                    b = ready.get("build") or {}
                    result["build_papers_per_s"] = b.get("papers_per_s")
                    result["build_chunks_per_s"] = b.get("chunks_per_s")
                    say(f"library complete after {result['build_s']} s ({ready.get('papers')} papers)")
                rr = ready.get("reranker") or {}
                training = rr.get("state") in ("waiting", "training")
                if not building:
                    phase[0] = "train" if training else "idle"
                if "build_s" in result and first_answer is not None and not training:
                    break
                if "build_s" in result and training and time.monotonic() - last_search > 2.0:
                    ms = _search_ms(http, "which datasets are used for evaluation")
                    if ms is not None:
                        search_b["train"].append(ms[0])
                    last_search = time.monotonic()
                time.sleep(0.5)
            rr = ready.get("reranker") or {}
            result["reranker_state"] = rr.get("state")
            if rr.get("state") == "installed" and rr.get("finished") is not None:
                result["reranker_s"] = round(time.monotonic() - t0, 2)
            result["attempts"] = attempts
            result["chunks"] = int(ready.get("chunks") or 0)
            phase[0] = "idle"
            # The idle baseline: the same probes, nothing running in the background.
            idle_h: list[float] = []
            idle_s: list[float] = []
            idle_r: list[float] = []
            time.sleep(1.0)
            for _ in range(40):
                idle_h.append(_get(http, "/health")[1])
                time.sleep(0.05)
            for _ in range(20):
                ms = _search_ms(http, "which datasets are used for evaluation")
                if ms is not None:
                    idle_s.append(ms[0])
                    idle_r.append(ms[1])
            stop.set()
            prober.join(timeout=5)
    finally:
        stop.set()
        stop_cli(proc, 60)
    build_rate = result.get("build_papers_per_s")
    full = None
    if isinstance(build_rate, float | int) and build_rate > 0:
        full = round(FULL_LIBRARY / float(build_rate), 0)
    res = FirstRunResult(
        **result,  # type: ignore[arg-type]
        health_building=Latency.of(health_b["build"]),
        health_training=Latency.of(health_b["train"]),
        health_idle=Latency.of(idle_h),
        search_building=Latency.of(search_b["build"]),
        search_training=Latency.of(search_b["train"]),
        search_idle=Latency.of(idle_s),
        search_idle_rerank=Latency.of(idle_r),
        full_build_s_extrapolated=full,
        log_tail=tail(log, 800),
    )
    if own:
        shutil.rmtree(data, ignore_errors=True)
        log.unlink(missing_ok=True)
    return res
