"""Ingest jobs: uploaded PDFs and arXiv ids added to the open library in the background.

Uploads are checked (size, count, PDF signature) and written under names the server chooses, in a
folder of the job's own inside the data directory: no name from a request reaches the filesystem.
Jobs run one at a time on their own thread, so questions go on meanwhile; each batch of papers is
written whole before it is recorded (the library build's rule), so nothing is ever half-added.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


class Jobs:
    """The ingest jobs of one service: submitted, run one at a time, remembered for a while."""

    def __init__(self, settings: Settings, library: Library) -> None:
        self.settings = settings
        self.library = library
        self._jobs: OrderedDict[str, IngestJob] = OrderedDict()
        self._names: dict[str, dict[str, str]] = {}  # job -> stored path -> the name as sent
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arag-ingest")

    def submit(self, uploads: Sequence[tuple[str, bytes]], arxiv_ids: Sequence[str]) -> IngestJob:
        """Write the uploads to the job's folder and queue the job; returns it (state ``queued``)."""
        job_id = uuid.uuid4().hex[:12]
        folder = self.settings.uploads_dir / job_id
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
        with self._lock:
            self._jobs[job_id] = job
            while len(self._jobs) > self.settings.service.jobs_kept:
                self._jobs.popitem(last=False)
        self._names[job_id] = {str(p): n for p, (n, _) in zip(paths, uploads, strict=True)}
        self._executor.submit(self._run, job_id, folder, paths)
        return job

    def get(self, job_id: str) -> IngestJob:
        with self._lock:
            job = self._jobs.get(job_id) if _JOB_ID.match(job_id) else None
        if job is None:
            raise NotFoundError(
                f"no ingest job {job_id!r}", where="job id", fix="use the id POST /ingest returned"
            )
        return job

    def all(self) -> list[IngestJob]:
        with self._lock:
            return list(reversed(self._jobs.values()))

    def _update(self, job_id: str, **changes: object) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                self._jobs[job_id] = job.model_copy(update=changes)

    def _run(self, job_id: str, folder: Path, paths: list[Path]) -> None:
        self._update(job_id, state="running")
        job = self.get(job_id)
        failures: list[Failure] = []
        try:
            paths = paths + self._download(job, folder, failures)
            done = [len(failures)]

            def advance(n: int) -> None:
                done[0] += n
                self._update(job_id, done=done[0])

            summary = self.library.add_pdfs(paths, progress=Progress(advance=advance))
            names = self._names.pop(job_id, {})
            # Failures name the file as the user sent it, not where the server stored it.
            failures += [
                f.model_copy(update={"key": names.get(f.key, Path(f.key).name)}) for f in summary.failures
            ]
            self._update(
                job_id,
                state="done",
                done=job.total,
                summary=summary.model_copy(update={"failures": []}),
                failures=failures,
                finished=time.time(),
            )
        except Exception as exc:  # the job fails, the service does not
            what = exc.what if isinstance(exc, AragError) else f"{type(exc).__name__}: {exc}"
            log.exception("ingest job %s failed", job_id)
            self._update(job_id, state="failed", error=what, failures=failures, finished=time.time())

    def _download(self, job: IngestJob, folder: Path, failures: list[Failure]) -> list[Path]:
        """The job's arXiv PDFs, fetched into its folder; an id that fails is a failure, not the end."""
        if not job.arxiv_ids:
            return []
        from arag.corpus.arxiv import ArxivClient

        out: list[Path] = []
        with ArxivClient(self.settings.arxiv, self.settings.cache_dir) as client:
            for aid in job.arxiv_ids:
                path = folder / f"arxiv-{aid.replace('/', '_')}.pdf"
                try:
                    client.download_pdf(aid, path)
                    out.append(path)
                except AragError as exc:
                    failures.append(Failure(key=aid, source="arxiv", reason=exc.what))
        return out

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
