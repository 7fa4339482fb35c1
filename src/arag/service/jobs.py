"""Ingest jobs: uploaded PDFs and arXiv ids added to the open library in the background.

Uploads are checked (size, count, PDF signature) and written under names the server chooses, in a
folder of the job's own inside the data directory: no name from a request reaches the filesystem.
Jobs run one at a time on their own thread, so questions go on meanwhile; each batch of papers is
written whole before it is recorded (the library build's rule), so nothing is ever half-added.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel

from arag.api import Library
from arag.corpus.arxiv_ids import bare_arxiv_id, is_arxiv_id
from arag.errors import AragError, InputError, NotFoundError, TooLargeError, UnsupportedError
from arag.library.build import Progress
from arag.library.state import Failure
from arag.service.schemas import IngestJob
from arag.settings import Settings

log = logging.getLogger(__name__)
PDF_MAGIC = b"%PDF-"
_JOB_ID = re.compile(r"^[0-9a-f]{12}$")
JOB_FILE = "job.json"


def parse_arxiv_ids(raw: str) -> list[str]:
    """arXiv ids from a comma- or space-separated field (``arXiv:`` and abs/pdf URLs accepted);
    an InputError naming those that are not arXiv ids."""
    ids: list[str] = []
    bad: list[str] = []
    for tok in re.split(r"[\s,]+", raw.strip()):
        if not tok:
            continue
        bare = bare_arxiv_id(tok)
        if is_arxiv_id(bare):
            ids.append(bare)
        else:
            bad.append(tok)
    if bad:
        raise InputError(
            f"not arXiv ids: {', '.join(repr(b) for b in bad[:5])}",
            where="arxiv_ids",
            fix="give ids like 2106.09685 or 2106.09685v2, separated by commas or spaces",
        )
    return list(dict.fromkeys(ids))


def check_upload(name: str, data: bytes, max_bytes: int) -> None:
    """A TooLargeError or UnsupportedError for an upload that cannot be a PDF to ingest."""
    if len(data) > max_bytes:
        raise TooLargeError(
            f"{name!r} is {len(data) / 1e6:.1f} MB (at most {max_bytes / 1e6:.0f} MB)",
            where="files",
            fix="upload a smaller PDF, or raise ARAG_SERVICE__MAX_UPLOAD_MB",
        )
    if not data.startswith(PDF_MAGIC):
        raise UnsupportedError(
            f"{name!r} is not a PDF (it does not start with %PDF-)",
            where="files",
            fix="upload PDF files only",
        )


class _Interrupted(Exception):
    """The service is shutting down: the job stops between two batches and resumes at start-up."""


class StoredJob(BaseModel):
    """A job as kept in ``<data dir>/uploads/<job>/job.json``: enough to resume it after a restart."""

    job: IngestJob
    files: list[str] = []  # the stored uploads, by name in the job's folder
    names: dict[str, str] = {}  # stored name -> the name as sent


class Jobs:
    """The ingest jobs of one service: submitted, run one at a time, kept on disk until finished.

    Queued and running jobs are never forgotten: each is written to its folder at every change, a
    restart resumes the unfinished ones (papers already recorded are skipped), and one that cannot
    resume is reported as failed with the reason. Only finished jobs beyond ``jobs_kept`` are dropped.
    """

    def __init__(self, settings: Settings, library: Library) -> None:
        self.settings = settings
        self.library = library
        self._jobs: OrderedDict[str, StoredJob] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arag-ingest")
        self._resume()

    # -- persistence ------------------------------------------------------------------------------

    def _folder(self, job_id: str) -> Path:
        return self.settings.uploads_dir / job_id

    def _save(self, stored: StoredJob) -> None:
        """Write the job's record (atomically: a kill leaves the old record or the new one)."""
        path = self._folder(stored.job.id) / JOB_FILE
        tmp = path.with_name(JOB_FILE + ".tmp")
        try:
            tmp.write_text(stored.model_dump_json(), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not record ingest job %s: %s", stored.job.id, exc)

    def _resume(self) -> None:
        """Load the recorded jobs; queue again those a shutdown or a crash interrupted."""
        if not self.settings.uploads_dir.is_dir():
            return
        loaded: list[StoredJob] = []
        for path in self.settings.uploads_dir.glob(f"*/{JOB_FILE}"):
            try:
                stored = StoredJob.model_validate_json(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                log.warning("ignoring the unreadable ingest job record %s: %s", path, exc)
                continue
            if stored.job.id == path.parent.name and _JOB_ID.match(stored.job.id):
                loaded.append(stored)
        for stored in sorted(loaded, key=lambda st: st.job.created):
            self._jobs[stored.job.id] = stored
            if stored.job.state in ("queued", "running"):
                gone = [f for f in stored.files if not (self._folder(stored.job.id) / f).is_file()]
                if gone:
                    self._finish_failed(
                        stored.job.id, f"its uploaded files are gone since the restart: {', '.join(gone)}"
                    )
                    continue
                log.info("resuming ingest job %s", stored.job.id)
                self._update(stored.job.id, state="queued", done=0)
                self._executor.submit(self._run, stored.job.id)
        with self._lock:
            self._evict()

    def _evict(self) -> None:
        """Forget the oldest finished jobs beyond ``jobs_kept`` (call with the lock held)."""
        finished = [j for j, st in self._jobs.items() if st.job.state in ("done", "failed")]
        for job_id in finished[: max(0, len(finished) - self.settings.service.jobs_kept)]:
            del self._jobs[job_id]
            (self._folder(job_id) / JOB_FILE).unlink(missing_ok=True)

    # -- the API ----------------------------------------------------------------------------------

    def submit(self, uploads: Sequence[tuple[str, bytes]], arxiv_ids: Sequence[str]) -> IngestJob:
        """Write the uploads to the job's folder and queue the job; returns it (state ``queued``)."""
        job_id = uuid.uuid4().hex[:12]
        folder = self._folder(job_id)
        folder.mkdir(parents=True, exist_ok=True)
        paths: list[Path] = []
        for name, data in uploads:
            # A slug of the sent name (a paper's id derives from it): letters, digits and '-' only.
            slug = re.sub(r"[^a-z0-9]+", "-", Path(name).stem.lower()).strip("-")[:60] or "upload"
            path = folder / f"{slug}.pdf"
            n = 1
            while path in paths:
                n += 1
                path = folder / f"{slug}-{n}.pdf"
            path.write_bytes(data)
            paths.append(path)
        job = IngestJob(
            id=job_id,
            state="queued",
            files=[n for n, _ in uploads],
            arxiv_ids=list(arxiv_ids),
            total=len(uploads) + len(arxiv_ids),
            created=time.time(),
        )
        stored = StoredJob(
            job=job,
            files=[p.name for p in paths],
            names={p.name: n for p, (n, _) in zip(paths, uploads, strict=True)},
        )
        with self._lock:
            self._jobs[job_id] = stored
            self._save(stored)
            self._evict()
        self._executor.submit(self._run, job_id)
        return job

    def get(self, job_id: str) -> IngestJob:
        with self._lock:
            stored = self._jobs.get(job_id) if _JOB_ID.match(job_id) else None
        if stored is None:
            raise NotFoundError(
                f"no ingest job {job_id!r}", where="job id", fix="use the id POST /ingest returned"
            )
        return stored.job

    def all(self) -> list[IngestJob]:
        with self._lock:
            return [st.job for st in reversed(self._jobs.values())]

    def _update(self, job_id: str, **changes: object) -> StoredJob:
        with self._lock:
            stored = self._jobs[job_id]
            stored = stored.model_copy(update={"job": stored.job.model_copy(update=changes)})
            self._jobs[job_id] = stored
            self._save(stored)
            if stored.job.state in ("done", "failed"):
                self._evict()
            return stored

    def _finish_failed(self, job_id: str, reason: str, failures: Sequence[Failure] = ()) -> None:
        self._update(job_id, state="failed", error=reason, failures=list(failures), finished=time.time())

    # -- running ----------------------------------------------------------------------------------

    def _run(self, job_id: str) -> None:
        failures: list[Failure] = []
        try:
            if self._stop.is_set():
                return  # shutting down: it stays queued on disk and resumes at start-up
            stored = self._update(job_id, state="running")
            job, folder = stored.job, self._folder(job_id)
            paths = [folder / f for f in stored.files]
            paths += self._download(job, folder, failures)
            done = [len(failures)]

            def advance(n: int) -> None:
                done[0] += n
                self._update(job_id, done=done[0])
                if self._stop.is_set():
                    raise _Interrupted  # between two batches: what is recorded stays recorded

            summary = self.library.add_pdfs(paths, progress=Progress(advance=advance))
            # Failures name the file as the user sent it, not where the server stored it.
            failures += [
                f.model_copy(update={"key": stored.names.get(Path(f.key).name, Path(f.key).name)})
                for f in summary.failures
            ]
            self._update(
                job_id,
                state="done",
                done=job.total,
                summary=summary.model_copy(update={"failures": []}),
                failures=failures,
                finished=time.time(),
            )
        except _Interrupted:
            log.info("ingest job %s interrupted by the shutdown; it resumes at the next start", job_id)
            self._update(job_id, state="queued", done=0)
        except Exception as exc:  # the job fails, the service does not
            what = exc.what if isinstance(exc, AragError) else f"{type(exc).__name__}: {exc}"
            log.exception("ingest job %s failed", job_id)
            try:
                self._finish_failed(job_id, what, failures)
            except Exception:
                log.exception("ingest job %s could not be marked failed", job_id)

    def _download(self, job: IngestJob, folder: Path, failures: list[Failure]) -> list[Path]:
        """The job's arXiv PDFs, fetched into its folder; an id that fails is a failure, not the end.
        A PDF already fetched (before a restart) is not fetched again."""
        if not job.arxiv_ids:
            return []
        from arag.corpus.arxiv import ArxivClient

        out: list[Path] = []
        with ArxivClient(self.settings.arxiv, self.settings.cache_dir) as client:
            for aid in job.arxiv_ids:
                if self._stop.is_set():
                    raise _Interrupted
                path = folder / f"arxiv-{aid.replace('/', '_')}.pdf"
                if path.is_file():
                    out.append(path)
                    continue
                try:
                    client.download_pdf(aid, path)
                    out.append(path)
                except AragError as exc:
                    failures.append(Failure(key=aid, source="arxiv", reason=exc.what))
        return out

    def shutdown(self) -> None:
        """Stop taking jobs and wait for the running one to reach the end of its current batch:
        the queued and the interrupted ones stay recorded as queued and resume at the next start."""
        self._stop.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
