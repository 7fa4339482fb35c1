"""The library lock: which processes use a data directory's library, so that a rebuild never swaps
or deletes a library under one of them.

Every process that opens the index holds a shared ``flock`` on ``<data dir>/library.lock``; a
rebuild holds it exclusively. A flock dies with its process, so a killed holder never blocks
anyone. Each holder also leaves a note, ``<data dir>/locks/<pid>.json`` (its command and since
when), so that a refusal can name who holds the library; notes of dead processes are ignored.
Within one process the lock is counted: a process holding it exclusively may open stores freely.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from arag.errors import StoreError

log = logging.getLogger(__name__)
LOCK_FILE = "library.lock"
NOTES_DIR = "locks"


@dataclass
class _Hold:
    fd: int
    exclusive: bool
    count: int


_mutex = threading.Lock()
_holds: dict[str, _Hold] = {}


class LibraryLock:
    """One acquisition of the library lock; ``release`` it once (a context manager too)."""

    def __init__(self, key: str | None, data_dir: Path) -> None:
        self._key: str | None = key
        self.data_dir = data_dir

    def release(self) -> None:
        """Give this acquisition back; the flock goes when the process's last one does."""
        with _mutex:
            if self._key is None:
                return
            key, self._key = self._key, None
            hold = _holds[key]
            hold.count -= 1
            if hold.count > 0:
                return
            del _holds[key]
            with contextlib.suppress(OSError):
                (self.data_dir / NOTES_DIR / f"{os.getpid()}.json").unlink()
            os.close(hold.fd)  # closing the descriptor drops the flock

    def __enter__(self) -> LibraryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _command() -> str:
    args = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else ["python"]
    text = " ".join(args)
    return text if len(text) <= 200 else text[:197] + "..."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holders(data_dir: Path) -> list[str]:
    """The other live processes that left a note: "pid 123 (arag serve, since 16:02:11 UTC)"."""
    out: list[str] = []
    for note in sorted((data_dir / NOTES_DIR).glob("*.json")):
        try:
            info = json.loads(note.read_text(encoding="utf-8"))
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid == os.getpid() or not _alive(pid):
            continue
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info.get("since", 0))))
        mode = "rebuilding it" if info.get("exclusive") else "using it"
        out.append(f"pid {pid} ({info.get('command', '?')}, {mode} since {since})")
    return out


def _write_note(data_dir: Path, exclusive: bool) -> None:
    notes = data_dir / NOTES_DIR
    try:
        notes.mkdir(parents=True, exist_ok=True)
        tmp = notes / f".{os.getpid()}.tmp"
        note = {"pid": os.getpid(), "command": _command(), "since": time.time(), "exclusive": exclusive}
        tmp.write_text(json.dumps(note), encoding="utf-8")
        os.replace(tmp, notes / f"{os.getpid()}.json")
    except OSError:
        pass  # the note only names the holder; the flock is what excludes


def acquire(data_dir: Path, *, exclusive: bool = False) -> LibraryLock:
    """Hold the library of ``data_dir``: shared (open the index) or exclusive (a rebuild).

    Raises StoreError naming the holders when another process holds it in a conflicting mode.
    """
    data_dir = Path(data_dir)
    key = str(data_dir.resolve())
    with _mutex:
        hold = _holds.get(key)
        if hold is not None:
            if exclusive and not hold.exclusive:
                raise StoreError(
                    "this process already has the library open, so it cannot rebuild it",
                    where=str(data_dir),
                    fix="close the library (arag.Library, open stores) before rebuilding",
                )
            hold.count += 1
            return LibraryLock(key, data_dir)
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exclusive:
                raise StoreError(
                    f"cannot lock the library for the rebuild: {exc}",
                    where=str(data_dir / LOCK_FILE),
                    fix="make the data directory writable",
                ) from exc
            # A library on a read-only mount can still be read; nobody can rebuild it there either.
            log.warning("reading the library without its lock (%s)", exc)
            return LibraryLock(None, data_dir)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            who = holders(data_dir)
            named = "; ".join(who) if who else "another process (it left no note)"
            if exclusive:
                what = f"the library is in use, so it cannot be rebuilt now: {named}"
                fix = "stop that process (e.g. `arag serve`, a build), then rebuild"
            else:
                what = f"the library is locked by {named}"
                fix = "wait for it to finish, or stop it"
            raise StoreError(what, where=str(data_dir), fix=fix) from None
        _holds[key] = _Hold(fd=fd, exclusive=exclusive, count=1)
        _write_note(data_dir, exclusive)
        return LibraryLock(key, data_dir)
