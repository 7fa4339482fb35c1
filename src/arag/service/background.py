"""The server's background work on a first run: build the default library (or resume an interrupted
build) through the open index while questions are answered over what is indexed so far, then train
the reranker and install it without a restart.

One thread, started after the library opens, does both in turn at a low priority (``nice`` per
thread, inherited by the threads it starts: the chunker, its own embedding model's ONNX Runtime
pool, PyTorch's), so that on 2 cores questions come first. The build is the one ``arag library
build`` runs (:func:`arag.library.manage.build_library`): a kill loses at most the batch in flight
and the next start resumes it. Stopping the server stops the build after the batch it is writing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from arag.api import Library
from arag.errors import AragError, Cancelled
from arag.index.store import Store
from arag.library.build import Progress
from arag.library.manage import BuildTarget
from arag.models.onnx_files import CARD_FILE
from arag.service.schemas import BuildStatus, TrainState, TrainStatus
from arag.settings import Settings

log = logging.getLogger(__name__)


def lower_priority(nice: int) -> int | None:
    """Give the calling thread (Linux: nice is per thread) this nice value, never a lower one; the
    value in force, or None where the platform cannot."""
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        if nice > current:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (OSError, AttributeError) as exc:
        log.warning("could not lower the background thread's priority: %s", exc)
        return None


def reranker_installed(settings: Settings) -> bool:
    return (settings.reranker_dir / CARD_FILE).is_file()


ProgressFactory = Callable[[str, str], AbstractContextManager[Progress]]
# Trains and installs the reranker into settings.reranker_dir, reading the library through the open
# index (``arag train reranker``'s pipeline, which the command line layer passes in); the model id.
Trainer = Callable[[Settings, Store, ProgressFactory], str]


class Background:
    """The background build and training of one service, and their live status."""

    def __init__(
        self,
        settings: Settings,
        library: Library,
        target: BuildTarget | None,
        *,
        trainer: Trainer | None = None,
    ) -> None:
        self.settings = settings
        self.library = library
        self.target = target
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.nice: int | None = None
        self._build = BuildStatus(
            state="loading" if target is not None else "off",
            reason=target.reason if target is not None else None,
        )
        self.trainer = trainer
        train = trainer is not None and wants_training(settings)
        model = library.reranker_name
        state: TrainState
        if train:
            state = "waiting" if target is not None else "training"
        elif settings.rerank.provider == "trained" and model == "none":
            state = "off"  # not installed, and not to be trained here
        else:
            state = "installed" if model != "none" else "off"
        self._train = TrainStatus(state=state, model=model)
        self._train_wanted = train

    # -- status ------------------------------------------------------------------------------------

    def build_status(self) -> BuildStatus:
        with self._lock:
            b = self._build
        cov = self.library.coverage()
        return b.model_copy(update={"papers": cov.papers, "papers_total": cov.of})

    def train_status(self) -> TrainStatus:
        with self._lock:
            return self._train.model_copy(update={"model": self.library.reranker_name})

    def _set_build(self, **changes: object) -> None:
        with self._lock:
            self._build = self._build.model_copy(update=changes)

    def _set_train(self, **changes: object) -> None:
        with self._lock:
            self._train = self._train.model_copy(update=changes)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self.target is None and not self._train_wanted:
            return
        if self.target is not None:
            self.library.expect_build()  # answers say "still being built" from the first one
        self._thread = threading.Thread(target=self._run, name="arag-background", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the work to stop at its next batch or step; wait a little for it. The library's close
        waits for a write in progress, so the index is never closed under one."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _check_stop(self) -> None:
        if self._stopping.is_set():
            raise Cancelled("the server is stopping", where="background work", fix="start it again to resume")

    def _run(self) -> None:
        self.nice = lower_priority(self.settings.service.background_nice)
        if self.target is not None and not self._run_build(self.target):
            if self._train.state == "waiting":
                self._set_train(state="stopped", error="the library build did not finish")
            return
        if self._train_wanted and not self._stopping.is_set():
            self._run_training()

    # -- the build ---------------------------------------------------------------------------------

    def _run_build(self, target: BuildTarget) -> bool:
        t0 = time.time()
        self._set_build(state="loading", started=t0)
        clock: dict[str, float] = {}
        done = [0, 0]  # papers, chunks

        def start(total: int) -> None:
            clock["t"] = time.monotonic()
            self._set_build(state="building", papers_todo=total)

        def written(papers: int, chunks: int) -> None:
            done[1] += chunks
            self._set_build(chunks_done=done[1])

        def advance(n: int) -> None:
            done[0] += n
            elapsed = max(time.monotonic() - clock.get("t", time.monotonic()), 1e-6)
            rate = done[0] / elapsed
            with self._lock:
                todo = self._build.papers_todo
            self._set_build(
                papers_done=done[0],
                papers_per_s=round(rate, 3),
                chunks_per_s=round(done[1] / elapsed, 2),
                eta_s=round((todo - done[0]) / rate, 1) if rate > 0 else None,
            )
            self._check_stop()

        try:
            summary = self.library.build_default(
                max_papers=target.max_papers,
                paper_ids=target.paper_ids,
                progress=Progress(start=start, advance=advance, written=written),
            )
        except Cancelled:
            self._set_build(state="stopped", finished=time.time(), eta_s=None)
            return False
        except Exception as exc:  # the build fails, the service goes on serving what is indexed
            if self._stopping.is_set():
                self._set_build(state="stopped", finished=time.time(), eta_s=None)
                return False
            log.exception("the background library build failed")
            what = exc.what if isinstance(exc, AragError) else f"{type(exc).__name__}: {exc}"
            fix = exc.fix if isinstance(exc, AragError) else "read the server's log; restart to resume"
            self._set_build(state="failed", error=what, fix=fix, finished=time.time(), eta_s=None)
            return False
        log.info("background build done: %d papers, %d chunks", summary.papers_added, summary.chunks_added)
        self._set_build(state="complete", finished=time.time(), eta_s=0.0)
        return True

    # -- the reranker ------------------------------------------------------------------------------

    def _run_training(self) -> None:
        from arag.models.reranker import get_reranker

        assert self.trainer is not None
        self._set_train(state="training", started=time.time(), stage="starting")
        try:
            model_id = self.trainer(self.settings, self.library.store, self._stage)
            self.library.set_reranker(get_reranker(self.settings))
        except Cancelled:
            self._set_train(state="stopped", finished=time.time())
            return
        except Exception as exc:
            if self._stopping.is_set():
                self._set_train(state="stopped", finished=time.time())
                return
            log.exception("background reranker training failed")
            what = exc.what if isinstance(exc, AragError) else f"{type(exc).__name__}: {exc}"
            fix = exc.fix if isinstance(exc, AragError) else "run `arag train reranker` to see why"
            self._set_train(state="failed", error=what, fix=fix, finished=time.time())
            return
        log.info("installed the reranker %s", model_id)
        self._set_train(state="installed", stage=None, finished=time.time())

    @contextlib.contextmanager
    def _stage(self, label: str, unit: str) -> Iterator[Progress]:
        """The training pipeline's progress factory: one stage (mining, training, ...) at a time."""
        self._set_train(stage=label, done=0, total=0)
        count = [0]

        def advance(n: int) -> None:
            count[0] += n
            self._set_train(done=count[0])
            self._check_stop()

        yield Progress(start=lambda total: self._set_train(total=total), advance=advance)


def wants_training(settings: Settings) -> bool:
    """Whether the reranker the settings select is one to train here and is not installed yet."""
    return (
        settings.service.train_reranker
        and settings.rerank.provider == "trained"
        and not reranker_installed(settings)
    )


def open_serving_library(settings: Settings, *, train: bool = False, **kwargs: object) -> Library:
    """The library ``arag serve`` answers from: opened empty when it is to be built in the background,
    and searching in the fused order while its reranker is to be trained (``train``). ``kwargs`` go
    to Library (``llm``, ``progress``)."""
    from arag.library.manage import pending_build
    from arag.models.reranker import IdentityReranker

    target = pending_build(settings) if settings.service.build_library else None
    if train and wants_training(settings) and "reranker" not in kwargs:
        kwargs["reranker"] = IdentityReranker()
    return Library(settings, allow_empty=target is not None, **kwargs)  # type: ignore[arg-type]


def start_background(settings: Settings, library: Library, trainer: Trainer | None) -> Background:
    """Start what the library needs in the background (nothing when it is complete and trained)."""
    from arag.library.manage import pending_build

    target = pending_build(settings) if settings.service.build_library else None
    work = Background(settings, library, target, trainer=trainer)
    work.start()
    return work
