"""``arag serve``: the API and the web page on one port, the library opened before it listens."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Annotated

import typer

from arag.cli.ask import LlmOpt, ModelOpt, _assembly_bar, llm_overrides
from arag.cli.common import console, handle_errors, load_settings
from arag.errors import ConfigError
from arag.settings import Settings

if TYPE_CHECKING:
    from arag.index.store import Store
    from arag.service.background import ProgressFactory


@handle_errors
def serve_cmd(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 7860).")] = None,
    llm: LlmOpt = None,
    model: ModelOpt = None,
) -> None:
    """Serve the library: the web page at /, the API (OpenAPI at /docs), streaming answers over SSE.
    An empty or interrupted default library is built in the background meanwhile, then the reranker
    is trained (the page shows both; ARAG_SERVICE__BUILD_LIBRARY / __TRAIN_RERANKER=false turn them off)."""
    import uvicorn

    from arag.service import create_app
    from arag.service.background import open_serving_library
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
    with _assembly_bar() as bar:  # fails here, with its message, before the port opens
        lib = open_serving_library(settings, train=True, progress=bar)
    app = create_app(settings, library=lib, background=True, trainer=train_in_server)
    server = uvicorn.Server(uvicorn.Config(app, host=s.host, port=s.port, log_level="warning"))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            url = f"http://{s.host}:{s.port}"
            cov = lib.coverage()
            what = (
                f"{cov.papers} papers"
                if cov.complete
                else f"{cov.papers} papers so far while it builds the library (the page shows its progress)"
            )
            console.print(f"[bold green]arag is serving {what} at {url}[/]  "
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


def train_in_server(settings: Settings, store: Store, progress: ProgressFactory) -> str:
    """``arag train reranker`` with its defaults, mining through the server's open index (the
    service's background training); the installed model's id."""
    from arag.corpus.qasper_questions import default_questions_path
    from arag.models.factory import library_embedder
    from arag.train.reranker import TrainConfig
    from arag.train.reranker_pipeline import train_reranker

    # An embedding model of its own, made in the (low-priority) background thread.
    embedder = library_embedder(settings)
    try:
        card = train_reranker(
            settings,
            TrainConfig(),
            train_path=default_questions_path("train"),
            progress=progress,
            library=(store, embedder),
        )
    finally:
        embedder.close()
    return card.model_id
