"""Blocking work off the event loop: a fixed pool of worker threads behind a bounded queue.

Answering holds a CPU for seconds; the event loop must stay free so that ``/health`` and every
other request keep answering. A request is admitted only while fewer than ``workers + queue_size``
are in the pool; past that it gets a BusyError (503, retry later) at once instead of waiting
without end. A streamed run is a sync iterator drained in a worker thread into an asyncio queue;
when the client goes away the run's cancel flag is set and the agent stops at its next step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from arag.errors import BusyError

T = TypeVar("T")
_DONE = object()


class WorkPool:
    """``workers`` threads and room for ``queue_size`` more requests waiting for one."""

    def __init__(self, workers: int, queue_size: int) -> None:
        self.workers = workers
        self.capacity = workers + queue_size
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arag-worker")
        self._lock = threading.Lock()
        self._admitted = 0
        self.rejected = 0

    @property
    def in_flight(self) -> int:
        """Requests running or waiting."""
        return self._admitted

    def _admit(self) -> None:
        with self._lock:
            if self._admitted >= self.capacity:
                self.rejected += 1
                raise BusyError(
                    f"the service is busy ({self._admitted} requests running or queued, at most "
                    f"{self.capacity})",
                    where="request queue",
                    fix="retry in a few seconds (Retry-After), or raise ARAG_SERVICE__QUEUE_SIZE",
                )
            self._admitted += 1

    def _release(self) -> None:
        with self._lock:
            self._admitted -= 1

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread; BusyError when the queue is full."""
        self._admit()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self._release()

    def admit_stream(self) -> None:
        """Take a place for a stream now, so a full queue answers 503 before the stream starts."""
        self._admit()

    async def stream(
        self, make: Callable[[], Iterator[Any]], cancel: threading.Event, extra: asyncio.Queue[Any]
    ) -> AsyncIterator[Any]:
        """Items of ``make()`` (run in a worker thread) interleaved with items put on ``extra`` (by
        callbacks of the same run), in the order they happen; an exception of the run is raised
        here. Closing this iterator early (the client went away) sets ``cancel``. The caller took
        the place with :meth:`admit_stream`."""
        loop = asyncio.get_running_loop()

        def drain() -> None:
            try:
                for item in make():
                    loop.call_soon_threadsafe(extra.put_nowait, ("item", item))
                    if cancel.is_set():
                        break
            except BaseException as exc:  # handed to the event loop, raised there
                loop.call_soon_threadsafe(extra.put_nowait, ("error", exc))
            else:
                loop.call_soon_threadsafe(extra.put_nowait, ("end", _DONE))

        future = loop.run_in_executor(self._executor, drain)
        try:
            while True:
                kind, value = await extra.get()
                if kind == "end":
                    break
                if kind == "error":
                    raise value
                yield value
        finally:
            cancel.set()  # no-op after a finished run; stops an abandoned one at its next step
            future.add_done_callback(lambda _f: self._release())

    def shutdown(self) -> None:
        """Stop taking work; running work is cancelled by its flag, not waited for."""
        self._executor.shutdown(wait=False, cancel_futures=True)
