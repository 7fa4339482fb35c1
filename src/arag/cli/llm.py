"""``arag llm``: the local model's runtime: a real generation on a long prompt (set-up runs it)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from arag.cli.common import FiguresJson, console, handle_errors, load_settings

llm_app = typer.Typer(no_args_is_help=True)


@llm_app.command("check")
@handle_errors
def check_cmd(
    model: Annotated[
        str | None,
        typer.Option(help="A packaged model (qwen2.5-coder-0.5b or -1.5b) or a .gguf path."),
    ] = None,
    prompt_tokens: Annotated[
        int,
        typer.Option(
            help="Prompt length in the model's tokens (>= 512 reaches the kernels that crash a wrong build)."
        ),
    ] = 600,
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 48,
    threads: Annotated[int | None, typer.Option(help="Threads (default ARAG_LLM__THREADS).")] = None,
    json_out: FiguresJson = None,
) -> None:
    """Run the local model once, in its own process, on a long prompt: prefill and generation speed,
    the build's instruction sets; a crash is reported with its signal and the fix (exit 5)."""
    from arag.llm.check import check_model
    from arag.llm.gguf import PACKAGED_MODELS, resolve_model_path
    from arag.llm.llama_cpp import import_llama_cpp

    overrides: dict[str, object] = {}
    if model is not None:
        overrides["model"] = model
    if threads is not None:
        overrides["threads"] = threads
    settings = load_settings(**({"llm": overrides} if overrides else {}))
    cfg = settings.llm
    import_llama_cpp()
    path = resolve_model_path(cfg.model, settings.data_dir, None)
    name = cfg.model if cfg.model in PACKAGED_MODELS else path.stem
    console.print(f"[dim]running {name} on a {prompt_tokens}-token prompt in its own process…[/]")
    result = check_model(
        path, cfg, name=name, log_dir=settings.logs_dir, prompt_tokens=prompt_tokens, max_tokens=max_tokens
    )
    table = Table(title=f"llama.cpp check: {name}", show_header=False, title_justify="left")
    prompt = f"{result.prompt_tokens} tokens in {result.prefill_s:.2f} s"
    prompt_rate = f"{result.prompt_tokens_per_s:.1f} tokens/s, {result.threads} threads"
    table.add_row("prompt", f"{prompt} ({prompt_rate})")
    gen = f"{result.generated_tokens} tokens in {result.generate_s:.2f} s"
    table.add_row("generation", f"{gen} ({result.generated_tokens_per_s:.1f} tokens/s)")
    table.add_row("model load", f"{result.load_s:.2f} s (process start included)")
    table.add_row("reply", result.reply[:120])
    table.add_row("build", result.build)
    table.add_row("CPU lists", result.cpu)
    console.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(result.model_dump(), indent=2), encoding="utf-8")
    console.print("[green]ok[/]: the local LLM runs long prompts on this machine")
