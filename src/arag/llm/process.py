"""The local model in a process of its own, supervised: started, watched, restarted, stopped.

llama.cpp is native code: an instruction the CPU or the OS does not allow, or memory running out,
kills the process it runs in. Run inside the server, that took every request, ingest job and the page
with it. Here it runs in a child (:mod:`arag.llm.model_server`) on a loopback port that arag picks;
a monitor thread restarts it when it dies, after a back-off that doubles up to a bound, and the
answers in flight at that moment get one clear error each. The child ends itself when its parent
goes away, and :meth:`ModelProcess.stop` (also run at interpreter exit) ends it otherwise.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from arag.cpu import read_cpu_flags
from arag.errors import ModelError, ModelUnavailable
from arag.llm.builds import PORTABLE, Build

log = logging.getLogger(__name__)

State = Literal["starting", "ready", "restarting", "failed", "stopped"]
# A process that stayed up this long resets the back-off: its next crash restarts at once.
_STABLE_S = 60.0
_LIVE: weakref.WeakSet[ModelProcess] = weakref.WeakSet()


class ProcessInfo(BaseModel):
    """What /ready and /v1/system show of a model process."""

    pid: int | None
    port: int | None
    state: State
    restarts: int
    last_exit: str | None
    build: str
    # Which llama.cpp build runs (llm/builds.py): portable, or one for this CPU's instructions.
    build_name: str = PORTABLE
    log: str


def exit_cause(returncode: int) -> str:
    """``returncode`` in words: the signal that killed the process, or its exit status."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name == "SIGILL":
            return (
                "SIGILL (illegal instruction: llama.cpp ran an instruction this CPU or its OS does not "
                "allow, e.g. AMX or AVX-512 compiled in for another machine)"
            )
        if name == "SIGKILL":
            return "SIGKILL (killed: by the out-of-memory killer or by hand)"
        return name
    return f"exit status {returncode}"


def cpu_flags() -> str:
    """The vector-instruction flags the CPU lists (Linux), for error messages."""
    listed = read_cpu_flags()
    if not listed:
        return "unknown"
    wanted = ("avx", "fma", "f16c", "amx", "bmi2")
    return " ".join(sorted(f for f in listed if f.startswith(wanted))) or "no AVX"


def child_env(build: Build) -> dict[str, str]:
    """The model process's environment: this one's, with ``build``'s folder first on PYTHONPATH so
    that its ``llama_cpp`` is imported before the venv's own."""
    env = dict(os.environ)
    if build.path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(build.path), env.get("PYTHONPATH", "")) if p)
    return env


def free_port() -> int:
    """A loopback port free right now (the child binds it; a lost race is a failed start, retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ModelProcess:
    """One supervised model server. :meth:`start` returns when it answers; :meth:`url` waits while it
    restarts; :meth:`died_since` tells a caller whose request broke whether the process died under it."""

    def __init__(
        self,
        model_path: Path,
        *,
        alias: str,
        threads: int,
        context_tokens: int,
        seed: int = 0,
        gpu_layers: int = 0,
        log_dir: Path,
        start_timeout_s: float = 180.0,
        max_backoff_s: float = 30.0,
        command: list[str] | None = None,
        build: Build | None = None,
    ) -> None:
        """``command``: the child's program (default ``python -m arag.llm.model_server``; tests run a
        stand-in server that takes the same arguments). ``build``: the llama.cpp build the child
        imports (None: the venv's own, portable one)."""
        self.command = command or [sys.executable, "-m", "arag.llm.model_server"]
        self.llama_build = build or Build(PORTABLE)
        self.model_path = model_path
        self.alias = alias
        self.threads = threads
        self.context_tokens = context_tokens
        self.seed = seed
        self.gpu_layers = gpu_layers
        self.start_timeout_s = start_timeout_s
        self.max_backoff_s = max_backoff_s
        log_dir.mkdir(parents=True, exist_ok=True)
        # One log per model, appended to by every process that runs it (each start is headed).
        self.log_path = log_dir / f"llm-{Path(alias).name}.log"
        self._ready_file = log_dir / f".llm-{os.getpid()}-{id(self)}.ready"
        self._cond = threading.Condition()
        self._proc: subprocess.Popen[bytes] | None = None
        self._state: State = "stopped"
        self._port: int | None = None
        self._build = ""
        self._last_exit: str | None = None
        self._restarts = 0
        # Bumped at every spawn: a request remembers it, and a change means the process it used died.
        self.generation = 0
        self._stopping = False
        self._monitor: threading.Thread | None = None

    # -- life cycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the process and wait until it answers; a :class:`ModelError` with the cause (and the
        log's last lines) when it cannot start."""
        with self._cond:
            if self._monitor is not None:
                return
            self._stopping = False
            self._state = "starting"
            self._monitor = threading.Thread(target=self._run, name=f"llm-{self.alias}", daemon=True)
            self._monitor.start()
            _LIVE.add(self)
            deadline = time.monotonic() + self.start_timeout_s + 5
            while self._state == "starting" and time.monotonic() < deadline:
                self._cond.wait(0.2)
            state = self._state
        if state != "ready":
            why = self._last_exit or f"it did not answer within {self.start_timeout_s:.0f} s"
            self.stop()
            raise ModelError(
                f"the local LLM process could not start: {why}",
                where=f"{self.model_path} (log: {self.log_path})",
                fix=start_fix(why),
            )

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 5 s) and the monitor; idempotent."""
        with self._cond:
            self._stopping = True
            proc, monitor = self._proc, self._monitor
            self._cond.notify_all()
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(10)
        with self._cond:
            self._state = "stopped"
            self._monitor = None
            self._proc = None
        self._ready_file.unlink(missing_ok=True)
        _LIVE.discard(self)

    # -- what callers use -----------------------------------------------------------------------------

    def url(self, timeout_s: float | None = None) -> tuple[str, int]:
        """The base URL (``http://127.0.0.1:PORT/v1``) and the generation serving it; waits while the
        process (re)starts, up to ``timeout_s``; :class:`ModelUnavailable` past that or once failed."""
        wait = self.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        with self._cond:
            while self._state in ("starting", "restarting") and time.monotonic() < deadline:
                self._cond.wait(min(0.5, max(deadline - time.monotonic(), 0.01)))
            if self._state != "ready" or self._port is None:
                raise ModelUnavailable(
                    f"the local LLM process is {self._state}"
                    + (f" (last exit: {self._last_exit})" if self._last_exit else ""),
                    where=f"{self.alias} (log: {self.log_path})",
                    fix="retry in a few seconds; if it keeps failing, read the log and run `arag llm check`",
                )
            return f"http://127.0.0.1:{self._port}/v1", self.generation

    def died_since(self, generation: int, *, grace_s: float = 2.0) -> str | None:
        """Why the process serving ``generation`` is gone, or None if it still runs. A broken
        connection can arrive a moment before the exit is visible: wait up to ``grace_s`` for it."""
        deadline = time.monotonic() + grace_s
        while True:
            with self._cond:
                proc = self._proc
                if self.generation != generation or self._state != "ready":
                    return self._last_exit or f"the process was {self._state}"
            if proc is not None and (rc := proc.poll()) is not None:
                return exit_cause(rc)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def info(self) -> ProcessInfo:
        with self._cond:
            proc = self._proc
            return ProcessInfo(
                pid=proc.pid if proc is not None and proc.poll() is None else None,
                port=self._port,
                state=self._state,
                restarts=self._restarts,
                last_exit=self._last_exit,
                build=self._build,
                build_name=self.llama_build.name,
                log=str(self.log_path),
            )

    @property
    def pid(self) -> int | None:
        return self.info().pid

    # -- the monitor thread ---------------------------------------------------------------------------

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Start a child (from the monitor thread: the kernel's parent-death signal follows the thread
        that forked, and this one lives as long as the supervision)."""
        self._ready_file.unlink(missing_ok=True)
        port = free_port()
        cmd = [
            *self.command,
            "--model", str(self.model_path), "--alias", self.alias,
            "--port", str(port), "--n-ctx", str(self.context_tokens),
            "--threads", str(self.threads), "--seed", str(self.seed),
            "--gpu-layers", str(self.gpu_layers),
            "--parent-pid", str(os.getpid()), "--ready-file", str(self._ready_file),
        ]  # fmt: skip
        logf = self.log_path.open("ab")
        try:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            logf.write(f"\n--- start {stamp} port {port} (arag pid {os.getpid()})\n".encode())
            logf.flush()
            # A session of its own: Ctrl-C in the terminal reaches arag, which stops the child in
            # order, instead of killing both at once and racing the restart.
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=child_env(self.llama_build),
            )
        finally:
            logf.close()
        with self._cond:
            self._proc = proc
            self._port = port
            self.generation += 1
        return proc

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._stopping:
                return False
            if proc.poll() is not None:
                return False
            if self._ready_file.is_file():
                try:
                    info = json.loads(self._ready_file.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    time.sleep(0.05)
                    continue
                with self._cond:
                    self._build = str(info.get("build", ""))
                return True
            time.sleep(0.05)
        return False

    def _run(self) -> None:
        failures = 0
        ever_ready = False
        while True:
            with self._cond:
                if self._stopping:
                    return
            proc = self._spawn()
            if self._wait_ready(proc):
                with self._cond:
                    self._state = "ready"
                    self._cond.notify_all()
                ever_ready = True
                up_since = time.monotonic()
                rc = proc.wait()
                if time.monotonic() - up_since > _STABLE_S:
                    failures = 0
            else:
                if proc.poll() is None:
                    proc.kill()
                rc = proc.wait()
            with self._cond:
                if self._stopping:
                    return
                self._last_exit = exit_cause(rc) if rc is not None else "did not answer in time"
                log.warning("the local LLM process (pid %d) ended: %s", proc.pid, self._last_exit)
                if not ever_ready:
                    # A model that never started will not start on the next try either: say why.
                    self._state = "failed"
                    self._cond.notify_all()
                    return
                self._state = "restarting"
                self._restarts += 1
                self._cond.notify_all()
                delay = min(self.max_backoff_s, 0.5 * 2**failures)
                failures += 1
                self._cond.wait(delay)


def start_fix(why: str) -> str:
    """What to do about a model process that would not start or died, by its cause."""
    if why.startswith("SIGILL"):
        return (
            "the llama-cpp-python wheel was built for other instructions than this CPU allows "
            f"(the CPU lists: {cpu_flags()}): delete the cached wheel (<data dir>/wheels) and run "
            "`make venv`, which builds the portable recipe; a build other than the portable one "
            "(ARAG_LLM__BUILD) is not used again unless `arag llm check --build all` passes with it"
        )
    if why.startswith("SIGKILL"):
        return "free memory (another model or program?) or use the smaller qwen2.5-coder-0.5b"
    return "read the log named above; `arag llm check` runs the model on a long prompt and reports"


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE):
        proc.stop()
