"""Ingest jobs are never lost: not evicted while unfinished, waited for at shutdown, resumed after a
restart (or failed with the reason). A gated stand-in for the library lets a test hold a job running."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from arag.library.build import BuildSummary, Progress
from arag.service.jobs import JOB_FILE, Jobs
from arag.settings import Settings, get_settings


class GatedLibrary:
    """Stands in for ``arag.Library.add_pdfs``: waits for ``gate``, then "adds" each file (one batch
    per file), recording its name."""

    def __init__(self, open_gate: bool = False) -> None:
        self.gate = threading.Event()
        if open_gate:
            self.gate.set()
        self.started = threading.Event()
        self.added: list[str] = []

    def add_pdfs(self, paths: Sequence[Path], *, progress: Progress | None = None) -> BuildSummary:
        self.started.set()
        assert self.gate.wait(30), "the test never opened the gate"
        for p in paths:
            self.added.append(Path(p).name)
            if progress is not None:
                progress.advance(1)
        return BuildSummary(papers_seen=len(paths), papers_added=len(paths))


def _settings(tmp_path: Path, kept: int = 100) -> Settings:
    return get_settings(data_dir=tmp_path / "data", service={"jobs_kept": kept})


def _pdf(name: str) -> tuple[str, bytes]:
    return (f"{name}.pdf", b"%PDF-1.4 " + name.encode())


def _wait_finished(jobs: Jobs, ids: Sequence[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(jobs.get(i).state in ("queued", "running") for i in ids):
        assert time.monotonic() < deadline, [jobs.get(i) for i in ids]
        time.sleep(0.02)


def test_unfinished_jobs_are_never_evicted(tmp_path: Path) -> None:
    lib = GatedLibrary()
    jobs = Jobs(_settings(tmp_path, kept=1), lib)  # type: ignore[arg-type]
    try:
        a = jobs.submit([_pdf("a")], [])
        assert lib.started.wait(10)
        b = jobs.submit([_pdf("b")], [])
        c = jobs.submit([_pdf("c")], [])
        # Three unfinished jobs, one kept: none may be dropped.
        assert [j.state for j in (jobs.get(a.id), jobs.get(b.id), jobs.get(c.id))] == [
            "running",
            "queued",
            "queued",
        ]
        lib.gate.set()
        deadline = time.monotonic() + 30
        while len(lib.added) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lib.added == ["a.pdf", "b.pdf", "c.pdf"]
        _wait_finished(jobs, [c.id])
        # Finished, the older ones go beyond jobs_kept: only the newest is listed.
        assert [j.id for j in jobs.all()] == [c.id] and jobs.get(c.id).state == "done"
    finally:
        jobs.shutdown()


def test_shutdown_waits_and_a_restart_resumes_or_fails_with_the_reason(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    first = GatedLibrary()
    jobs = Jobs(s, first)  # type: ignore[arg-type]
    a = jobs.submit([_pdf("a1"), _pdf("a2")], [])
    assert first.started.wait(10)
    b = jobs.submit([_pdf("b")], [])
    c = jobs.submit([_pdf("c")], [])
    stopper = threading.Thread(target=jobs.shutdown)
    stopper.start()
    stopper.join(0.3)
    assert stopper.is_alive(), "shutdown returned while a job was running"
    first.gate.set()  # the running job reaches the end of its first batch and stops there
    stopper.join(10)
    assert not stopper.is_alive()
    assert first.added == ["a1.pdf"]
    assert {j.id: j.state for j in jobs.all()} == {a.id: "queued", b.id: "queued", c.id: "queued"}

    # While the service was down, c's upload disappeared.
    (s.uploads_dir / c.id / "c.pdf").unlink()
    second = GatedLibrary(open_gate=True)
    restarted = Jobs(s, second)  # type: ignore[arg-type]
    try:
        _wait_finished(restarted, [a.id, b.id, c.id])
        assert second.added == ["a1.pdf", "a2.pdf", "b.pdf"]  # a again from its start: adds are idempotent
        assert restarted.get(a.id).state == "done" and restarted.get(a.id).summary is not None
        assert restarted.get(b.id).state == "done"
        failed = restarted.get(c.id)
        assert failed.state == "failed" and failed.error is not None and "c.pdf" in failed.error
        assert "gone" in failed.error
    finally:
        restarted.shutdown()
    assert (s.uploads_dir / a.id / JOB_FILE).is_file()
