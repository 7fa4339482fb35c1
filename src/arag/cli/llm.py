"""``arag llm``: the local model's runtime: a real generation on a long prompt (set-up runs it)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, get_args

import typer
from rich.table import Table

from arag.cli.common import FiguresJson, console, handle_errors, load_settings
from arag.settings import LlamaBuild

if TYPE_CHECKING:
    from arag.llm.check import BuildCheck

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
    build: Annotated[
        str,
        typer.Option(
            help="The llama.cpp build: auto (the one answers use, default ARAG_LLM__BUILD), portable, "
            "avx512, or all: each installed build this CPU lists the instructions of, in one run "
            "(set-up does this; a passing check lets auto use that build on this CPU)."
        ),
    ] = "",
    json_out: FiguresJson = None,
) -> None:
    """Run the local model once, in its own process, on a long prompt: prefill and generation speed,
    the build's instruction sets; a crash is reported with its signal and the fix (exit 5)."""
    from arag.cpu import read_cpu_flags
    from arag.errors import InputError
    from arag.llm.builds import builds_root, candidates, choose_build
    from arag.llm.check import check_builds
    from arag.llm.gguf import PACKAGED_MODELS, resolve_model_path
    from arag.llm.llama_cpp import import_llama_cpp

    choices = (*get_args(LlamaBuild), "all")
    if build and build not in choices:
        raise InputError(f"unknown build {build!r}", where="--build", fix=f"use one of: {', '.join(choices)}")
    overrides: dict[str, object] = {}
    if model is not None:
        overrides["model"] = model
    if threads is not None:
        overrides["threads"] = threads
    if build and build != "all":
        overrides["build"] = build
    settings = load_settings(**({"llm": overrides} if overrides else {}))
    cfg = settings.llm
    import_llama_cpp()
    path = resolve_model_path(cfg.model, settings.data_dir, None)
    name = cfg.model if cfg.model in PACKAGED_MODELS else path.stem
    root, flags = builds_root(), read_cpu_flags()
    builds = candidates(root, flags) if build == "all" else [choose_build(cfg.build, root, flags)]
    shown = ", ".join(b.name for b in builds)
    console.print(f"[dim]running {name} on a {prompt_tokens}-token prompt in its own process ({shown})…[/]")
    checks = check_builds(
        path,
        cfg,
        builds,
        name=name,
        log_dir=settings.logs_dir,
        root=root,
        flags=flags,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        keep_going=build == "all",
    )
    for c in checks:
        _show(name, c)
    if len(checks) > 1 and all(c.result is not None for c in checks):
        base = checks[0].result
        for c in checks[1:]:
            assert base is not None and c.result is not None
            ratio = (
                c.result.prompt_tokens_per_s / base.prompt_tokens_per_s if base.prompt_tokens_per_s else 0.0
            )
            console.print(f"prefill, {c.build_name} / portable, same run: x{ratio:.2f}")
    # Chosen again: a check's stamp can change what auto runs.
    used = choose_build(cfg.build, root, flags)
    if json_out is not None:
        figures: dict[str, object] = (
            checks[0].result.model_dump()
            if build != "all" and checks[0].result is not None
            else {"builds": [c.model_dump() for c in checks]}
        )
        figures["answers_use"] = used.name
        json_out.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    console.print(
        f"[green]ok[/]: the local LLM runs long prompts on this machine; answers use the {used.name} build"
        + (f" ({used.why})" if used.why else "")
    )


def _show(name: str, check: BuildCheck) -> None:
    if check.result is None:
        console.print(
            f"[yellow]the {check.build_name} build failed here[/] (answers keep to the portable one):\n"
            f"{check.error}"
        )
        return
    result = check.result
    table = Table(
        title=f"llama.cpp check: {name}, {check.build_name} build", show_header=False, title_justify="left"
    )
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
