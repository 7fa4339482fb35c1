"""``arag serve``: the API and the web page on one port, the library opened before it listens."""

from __future__ import annotations

import threading
import time
from typing import Annotated

import typer

from arag.cli.ask import LlmOpt, ModelOpt, llm_overrides, open_library
from arag.cli.common import console, handle_errors, load_settings
from arag.errors import ConfigError


@handle_errors
def serve_cmd(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 7860).")] = None,
    llm: LlmOpt = None,
    model: ModelOpt = None,
) -> None:
    """Serve the library: the web page at /, the API (OpenAPI at /docs), streaming answers over SSE."""
    import uvicorn

    from arag.service import create_app
    from arag.service.guard import check_bind

    overrides = llm_overrides(llm, model)
    service: dict[str, object] = {}
    if host is not None:
        service["host"] = host
    if port is not None:
        service["port"] = port
    if service:
        overrides["service"] = service
    settings = load_settings(**overrides)
    s = settings.service
    check_bind(settings)  # before the models load; create_app checks again
    console.print("[dim]loading the library and its models…[/]")
    lib = open_library(settings)  # fails here, with its message, before the port opens
    app = create_app(settings, library=lib)
    server = uvicorn.Server(uvicorn.Config(app, host=s.host, port=s.port, log_level="warning"))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            url = f"http://{s.host}:{s.port}"
            console.print(f"[bold green]arag is serving {lib.papers().__len__()} papers at {url}[/]  "
                          f"(API docs: {url}/docs; Ctrl-C stops)", highlight=False)  # fmt: skip

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    finally:
        lib.close()
    if not server.started:
        raise ConfigError(
            f"could not listen on {s.host}:{s.port}",
            where="--port",
            fix="another program holds the port: stop it or pass --port",
        )
