"""PDFs parsed in a child process under limits: a hostile or broken file (a page bomb, a stream that
inflates to gigabytes, a parse that never ends) costs the child, never the caller (``arag serve``
above all), and is rejected with the limit it hit and the setting that raises it.

The parent starts one child per batch (``python -m arag.corpus.pdf``, which calls
:func:`serve_parses`), sends it one path at
a time as a JSON line and reads back a JSON line: the ``Paper`` or the error. The child caps its own
address space (``RLIMIT_AS``: its size once imported plus ``ARAG_PDF__PARSE_MEMORY_MB``); the parent
kills it when a file takes longer than ``ARAG_PDF__PARSE_TIMEOUT_S`` and starts a fresh one for the
next file. Replies are JSON, not pickles: a child that a crafted file took over cannot make the
parent run code.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from arag.errors import IngestError
from arag.records import Paper
from arag.settings import PdfSettings

_PKG_ROOT = str(Path(__file__).resolve().parents[2])
MEMORY_SETTING = "ARAG_PDF__PARSE_MEMORY_MB"
TIME_SETTING = "ARAG_PDF__PARSE_TIMEOUT_S"
# Text of MuPDF's (and Python's) allocation failures.
STARTUP_TIMEOUT_S = 120.0
_OOM_WORDS = ("malloc (", "calloc (", "realloc (", "out of memory", "cannot allocate", "fzerrormemory")


class PdfParser:
    """Parses PDFs in a child process under ``limits``; use as a context manager (or ``close``)."""

    def __init__(self, limits: PdfSettings) -> None:
        self.limits = limits
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def parse(self, path: Path) -> Paper:
        """The paper in ``path``; an IngestError saying why not (a limit names its setting)."""
        proc = self._child()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write((json.dumps({"path": str(path)}) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            return self._died(path)
        line = self._read_line(proc.stdout, self.limits.parse_timeout_s)
        if line is None:
            self.close()
            raise IngestError(
                f"parsing the PDF took longer than {self.limits.parse_timeout_s:g} s",
                where=str(path),
                fix=f"check the file (a PDF made to stall parsers looks like this), or raise {TIME_SETTING}",
            )
        if not line:
            return self._died(path)
        try:
            reply = json.loads(line)
            if "paper" in reply:
                return Paper.model_validate(reply["paper"])
            err = reply["error"]
            if reply.get("restart"):
                self.close()
        except (ValueError, KeyError, TypeError) as exc:
            self.close()
            raise IngestError(
                f"the PDF parser's reply was unreadable ({exc})",
                where=str(path),
                fix="this is a bug in arag: report it with the file",
            ) from exc
        raise IngestError(err["what"], where=err.get("where"), fix=err.get("fix"))

    def _died(self, path: Path) -> Paper:
        proc = self._proc
        code = proc.wait() if proc is not None else None
        self._proc, self._buffer = None, b""
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with {code}"
        raise IngestError(
            f"the PDF parser {how} while reading this file (over its memory limit of "
            f"{self.limits.parse_memory_mb} MB, or a crash in MuPDF)",
            where=str(path),
            fix=f"check the file; if it is a genuine paper, raise {MEMORY_SETTING}",
        )

    def _child(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_ROOT, env.get("PYTHONPATH")) if p)
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "arag.corpus.pdf",
                    str(self.limits.max_pages),
                    str(self.limits.parse_memory_mb),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            self._buffer = b""
            # The time limit is the parse's: wait for the child's imports before the clock starts.
            assert self._proc.stdout is not None
            ready = self._read_line(self._proc.stdout, STARTUP_TIMEOUT_S)
            if ready != b"ready":
                self.close()
                raise IngestError(
                    "the PDF parser process did not start",
                    where="python -m arag.corpus.pdf",
                    fix="check that arag is installed for this Python (import arag.corpus.pdf)",
                )
        return self._proc

    def _read_line(self, out: IO[bytes], timeout: float) -> bytes | None:
        """One reply line; b"" when the child ended; None past ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([out], [], [], left)
            if not ready:
                return None
            data = os.read(out.fileno(), 1 << 20)
            if not data:
                return b""
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        """Stop the child (killed: it may be stuck in a parse)."""
        proc, self._proc = self._proc, None
        self._buffer = b""
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> PdfParser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the child -------------------------------------------------------------------------------------


def _vm_size() -> int:
    """This process's address space in bytes (0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _out_of_memory(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        text = f"{type(seen).__name__} {seen}".lower()
        if isinstance(seen, MemoryError) or any(w in text for w in _OOM_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def serve_parses(parse: Callable[..., Paper], max_pages: int, memory_mb: int) -> None:
    """The child's loop: a path per line in, a JSON reply per line out, ``parse(path,
    max_pages=...)`` under the memory limit."""
    import resource

    # The parse may grow the child by memory_mb beyond what it holds once imported.
    limit = _vm_size() + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # Replies go to the parent on the original stdout; anything else printed (MuPDF's warnings) to
    # stderr, so that it cannot break a reply line.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    out.write(b"ready\n")
    out.flush()
    for raw in sys.stdin.buffer:
        path = Path(json.loads(raw)["path"])
        try:
            reply: dict[str, Any] = {"paper": parse(path, max_pages=max_pages).model_dump(mode="json")}
        except Exception as exc:  # every failure goes back as a reason
            if _out_of_memory(exc):
                reply = {
                    "error": {
                        "what": f"parsing the PDF needs more than {memory_mb} MB of memory",
                        "where": str(path),
                        "fix": "check the file (a compression bomb looks like this), or raise "
                        + MEMORY_SETTING,
                    },
                    # What MuPDF and malloc keep after a failed allocation would fail the next file.
                    "restart": True,
                }
            elif isinstance(exc, IngestError):
                reply = {"error": {"what": exc.what, "where": exc.where, "fix": exc.fix}}
            else:
                reply = {
                    "error": {
                        "what": f"could not parse the PDF ({type(exc).__name__}: {exc})",
                        "where": str(path),
                        "fix": "check that the file opens in a PDF viewer; re-export it if it does not",
                    }
                }
        out.write((json.dumps(reply) + "\n").encode())
        out.flush()
