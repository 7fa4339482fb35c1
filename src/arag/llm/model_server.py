"""The local model's own process: llama-cpp-python's OpenAI-compatible server on a loopback port.

    python -m arag.llm.model_server --model PATH --port N --parent-pid PID --ready-file FILE ...

Started and supervised by :class:`arag.llm.process.ModelProcess`, never by hand. A crash of llama.cpp
(an illegal instruction, an out-of-memory kill) ends this process only; arag sees it and restarts it.
The process ends itself when its parent goes away, however the parent ended (SIGKILL included), so
no model is left running behind a dead server. Once the model is loaded it writes ``--ready-file``
(JSON: pid, port, llama.cpp's build flags) for the supervisor.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel


def _watch_parent(parent_pid: int) -> None:
    """Exit as soon as the parent is gone (re-parented to init or a subreaper)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(0.5)


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGTERM when the parent dies (the watchdog covers the rest)."""
    if sys.platform != "linux":
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        pass


def build_flags(llama_cpp: object) -> str:
    """llama.cpp's own line of what the build uses (``AVX2 = 1 | AMX_INT8 = 0 | ...``)."""
    info = llama_cpp.llama_print_system_info()  # type: ignore[attr-defined]
    return (info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)).strip()


class NextTokenRequest(BaseModel):
    """The body of ``POST /arag/next-token`` (module level: FastAPI resolves it by name)."""

    messages: list[dict[str, str]]
    reply_prefix: str = ""
    continuations: list[str] = []
    top: int = 5


def _add_next_token_route(app: Any) -> None:
    """``POST /arag/next-token`` (llm/next_token.py), under the same lock as the chat endpoint, so a
    scoring request never runs inside a generation."""
    from fastapi import Depends, HTTPException
    from llama_cpp.server.app import get_llama_proxy
    from starlette.concurrency import run_in_threadpool

    from arag.llm.next_token import next_token

    proxy_dependency = Depends(get_llama_proxy)

    @app.post("/arag/next-token")
    async def arag_next_token(body: NextTokenRequest, proxy: Any = proxy_dependency) -> Any:
        llama = proxy(None)
        try:
            return await run_in_threadpool(
                next_token, llama, body.messages, body.reply_prefix, body.continuations, top=body.top
            )
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="arag.llm.model_server")
    p.add_argument("--model", required=True)
    p.add_argument("--alias", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu-layers", type=int, default=0)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--ready-file", required=True)
    args = p.parse_args(argv)

    _die_with_parent()
    threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()

    import llama_cpp
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    model = ModelSettings(
        model=args.model,
        model_alias=args.alias,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        seed=args.seed,
        n_gpu_layers=args.gpu_layers,
        # The server's default keeps logits of every prompt token: slower prefill, more memory, unused.
        logits_all=False,
        verbose=False,
    )
    # interrupt_requests off: by default a waiting request cuts the running stream short. arag sends
    # one request at a time per process, and a cut answer would be a wrong one.
    server = ServerSettings(host=args.host, port=args.port, interrupt_requests=False)
    app = create_app(server_settings=server, model_settings=[model])  # loads the model now
    _add_next_token_route(app)

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    uv = uvicorn.Server(config)

    def announce() -> None:
        while not uv.started and not uv.should_exit:
            time.sleep(0.02)
        if uv.started:
            ready = Path(args.ready_file)
            tmp = ready.with_suffix(".tmp")
            info = {"pid": os.getpid(), "port": args.port, "build": build_flags(llama_cpp)}
            tmp.write_text(json.dumps(info), encoding="utf-8")
            os.replace(tmp, ready)

    threading.Thread(target=announce, daemon=True).start()
    uv.run()


if __name__ == "__main__":
    main()
