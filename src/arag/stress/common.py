"""Shared plumbing of the stress tests: the real CLI in a subprocess, and what a library holds on disk."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from arag.errors import AragError
from arag.index.store import Store
from arag.library.state import LibraryState
from arag.settings import Settings, get_settings

Echo = Callable[[str], None]


def quiet(_: str) -> None:
    """The default progress callback: say nothing."""


def cli_command(*args: str) -> list[str]:
    """``arag ARGS`` as this interpreter runs it (no reliance on an installed ``arag`` script)."""
    return [sys.executable, "-c", "from arag.cli.main import app; app()", *args]


def cli_env(data_dir: Path, **overrides: str) -> dict[str, str]:
    """This process's environment with an explicit data directory and ``ARAG_*`` overrides."""
    env = dict(os.environ)
    env["ARAG_DATA_DIR"] = str(data_dir)
    env.update(overrides)
    # Rich wraps at 80 columns when not on a terminal; long paths in the output must stay whole.
    env["COLUMNS"] = "400"
    return env


def build_overrides(embedder: str, papers: int, papers_per_batch: int | None = None) -> dict[str, str]:
    """The ``ARAG_*`` variables of a subprocess build of ``papers`` QASPER papers with ``embedder``
    (``papers_per_batch``: the store's, None for the configured one); for :func:`cli_env`."""
    overrides = {"ARAG_EMBEDDING__PROVIDER": embedder, "ARAG_CORPUS__MAX_PAPERS": str(papers)}
    if papers_per_batch is not None:
        overrides["ARAG_STORE__PAPERS_PER_BATCH"] = str(papers_per_batch)
    return overrides


def run_logged(cmd: list[str], env: dict[str, str], log: Path, cwd: Path, timeout_s: float) -> int | None:
    """Run ``cmd`` to its end with its output in ``log``: its exit code, None when it ran past
    ``timeout_s`` (it is killed then)."""
    with log.open("wb") as out:
        try:
            return subprocess.run(cmd, env=env, stdout=out, stderr=out, cwd=cwd, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return None


def stop_cli(proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """Stop a CLI child as Ctrl-C does (SIGINT: `arag serve` shuts down cleanly), killing it when it
    has not exited within ``timeout_s``; nothing for one that has exited already."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def kill_landed(proc: subprocess.Popen[Any]) -> bool:
    """SIGKILL ``proc`` and wait for it: whether the kill ended it. False when it had ended on its own
    between the caller's last poll and the signal (a build that finished first, not a kill)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode == -signal.SIGKILL


def clear(*dirs: Path) -> None:
    """Remove each folder that exists: a case run again in the same workdir starts clean."""
    for d in dirs:
        if d.exists():
            shutil.rmtree(d)


def library_settings(data_dir: Path, embedder: str, papers_per_batch: int | None = None) -> Settings:
    """The settings a subprocess run with :func:`cli_env` sees (same environment, same data dir)."""
    extra: dict = {"store": {"papers_per_batch": papers_per_batch}} if papers_per_batch else {}
    return get_settings(data_dir=data_dir, embedding={"provider": embedder}, **extra)


def make_workdir(workdir: Path | None, prefix: str) -> tuple[Path, bool]:
    """The folder to work in, and whether it was created here (a temporary one)."""
    if workdir is not None:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        return workdir.resolve(), False
    return Path(tempfile.mkdtemp(prefix=prefix)), True


def tail(path: Path, chars: int = 1500) -> str:
    """The end of a log file (for a problem message)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def copy_library(settings: Settings, dest: Path) -> Path:
    """Copy the state and the index of the current generation (not the caches) to ``dest``, as a
    library in the data dir itself; return the copy's data dir.

    Sparse files stay sparse (``cp --sparse=always``): the engine preallocates pages of holes.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for p in settings.state_db.parent.glob(settings.state_db.name + "*"):
        shutil.copy2(p, dest / p.name)
    if settings.index_dir.is_dir():
        target = dest / settings.index_dir.name
        cp = shutil.which("cp")
        done = False
        if cp is not None and sys.platform.startswith("linux"):
            proc = subprocess.run(
                [cp, "-a", "--sparse=always", str(settings.index_dir), str(target)], capture_output=True
            )
            done = proc.returncode == 0
        if not done:
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(settings.index_dir, target)
    return dest


class LibrarySnapshot(BaseModel):
    """A library as it lies on disk: what the build state records and what the store holds."""

    recorded: dict[str, int] = {}  # paper id -> chunks the state records
    state_topics: dict[str, int | None] = {}
    chunks: dict[str, str] = {}  # chunk id -> paper id, from the store
    chunk_topics: dict[str, int | None] = {}
    store_count: int = 0  # what the engine's exact count says
    index_exists: bool = False
    search_hits: int = 0
    problems: list[str] = []  # what could not even be read

    def by_paper(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for cid, pid in self.chunks.items():
            out.setdefault(pid, set()).add(cid)
        return out


def _scroll_chunks(store: Store) -> list[dict]:
    """Every point's id, paper and topic. The Store protocol has no "list all chunks", so this
    reads through the Qdrant Edge backend's own scroll."""
    from arag.index.qdrant_edge import EdgeStore

    if not isinstance(store, EdgeStore):
        raise TypeError(f"cannot list the chunks of a {type(store).__name__}")
    return list(store._scroll_payloads(["id", "paper_id", "topic"]))


def snapshot(settings: Settings) -> LibrarySnapshot:
    """Open the state and the index of ``settings.data_dir`` (no model is loaded) and read them."""
    from arag.index.factory import open_store

    snap = LibrarySnapshot()
    try:
        state = LibraryState(settings.state_db)
    except AragError as exc:
        snap.problems.append(f"the build state does not open: {exc}")
        return snap
    try:
        rows = state.papers()
        dim = state.get_meta("embedding_dim")
    except Exception as exc:  # sqlite errors on a damaged file
        snap.problems.append(f"the build state does not read: {exc}")
        return snap
    finally:
        state.close()
    snap.recorded = {r.id: r.n_chunks for r in rows}
    snap.state_topics = {r.id: r.topic for r in rows}
    if dim is None:
        if rows:
            snap.problems.append(f"{len(rows)} papers recorded but no embedding dimension in the state")
        return snap  # killed before the builder recorded its model: there is no index to read
    try:
        store = open_store(settings, int(dim), create=False)
    except AragError as exc:
        if rows or settings.index_dir.exists():
            snap.problems.append(f"the index does not open: {exc}")
        return snap
    snap.index_exists = True
    try:
        snap.store_count = store.count()
        for payload in _scroll_chunks(store):
            cid, pid = str(payload.get("id")), str(payload.get("paper_id"))
            snap.chunks[cid] = pid
            topic = payload.get("topic")
            snap.chunk_topics[cid] = int(topic) if topic is not None else None
        # A search must answer: a unit vector finds the nearest chunks of any non-empty index.
        probe = np.full(int(dim), 1.0 / np.sqrt(int(dim)), dtype=np.float32)
        snap.search_hits = len(store.dense_search(probe, 3))
    except AragError as exc:
        snap.problems.append(f"the index does not read: {exc}")
    finally:
        store.close()
    return snap


def consistency_problems(snap: LibrarySnapshot, papers_per_batch: int, *, after_kill: bool) -> list[str]:
    """What is wrong with a library snapshot (the rules: see the docstring of arag.stress.crash)."""
    problems = list(snap.problems)
    if not snap.index_exists:
        return problems
    if snap.store_count != len(snap.chunks):
        problems.append(
            f"the engine counts {snap.store_count} chunks but {len(snap.chunks)} distinct chunk ids scroll"
        )
    if snap.chunks and snap.search_hits == 0:
        problems.append(f"a dense search over {len(snap.chunks)} chunks found nothing")
    bad_ids = [cid for cid, pid in snap.chunks.items() if not cid.startswith(pid + ":")]
    if bad_ids:
        problems.append(f"{len(bad_ids)} chunk ids do not belong to their paper, e.g. {bad_ids[0]}")
    by_paper = snap.by_paper()
    for pid, n in sorted(snap.recorded.items()):
        have = len(by_paper.get(pid, ()))
        if have != n:
            problems.append(f"paper {pid}: the state records {n} chunks, the store holds {have}")
    unrecorded = sorted(set(by_paper) - set(snap.recorded))
    if unrecorded:
        n_chunks = sum(len(by_paper[p]) for p in unrecorded)
        what = f"{len(unrecorded)} unrecorded papers ({n_chunks} chunks) in the store, e.g. {unrecorded[0]}"
        if not after_kill:
            problems.append(f"{what}: a finished build leaves none")
        elif len(unrecorded) > papers_per_batch:
            problems.append(f"{what}: more than one batch ({papers_per_batch} papers) was in flight")
    if not after_kill:
        wrong = [
            cid
            for cid, pid in snap.chunks.items()
            if pid in snap.state_topics and snap.chunk_topics.get(cid) != snap.state_topics[pid]
        ]
        if wrong:
            problems.append(f"{len(wrong)} chunks carry another topic than the state gives their paper")
    return problems


# The questions the service benchmark and the load test ask, and their latency figures.
QUESTIONS = (
    "Which datasets are used to evaluate question answering over scientific papers?",
    "How is the ontology induced from text?",
    "What baselines do neural machine translation papers compare against?",
    "How do the authors measure the quality of generated summaries?",
    "What data is used to train sentiment classifiers for tweets?",
    "Which languages are covered by the multilingual experiments?",
    "How is the attention mechanism used in the question answering model?",
    "What evaluation metrics are used for named entity recognition?",
)


class Latency(BaseModel):
    n: int
    p50_ms: float
    p95_ms: float
    max_ms: float

    @classmethod
    def of(cls, ms: list[float]) -> Latency:
        s = sorted(ms)
        if not s:
            return cls(n=0, p50_ms=0.0, p95_ms=0.0, max_ms=0.0)
        return cls(
            n=len(s),
            p50_ms=round(statistics.median(s), 2),
            p95_ms=round(s[min(len(s) - 1, int(0.95 * len(s)))], 2),
            max_ms=round(s[-1], 2),
        )
