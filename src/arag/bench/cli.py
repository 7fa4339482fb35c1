"""``arag bench``: benchmark commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from arag.cli.common import build_progress, console, handle_errors, load_settings

bench_app = typer.Typer(no_args_is_help=True)


@bench_app.command("build")
@handle_errors
def bench_build(
    papers: Annotated[int, typer.Option(help="Papers to build (0: the whole library).")] = 100,
    data_dir: Annotated[
        Path | None, typer.Option(help="Build here instead of a fresh temporary folder (must be empty).")
    ] = None,
    embed_sample: Annotated[int, typer.Option(help="Chunks for the throughput measurement (0: skip).")] = 512,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON.")] = None,
) -> None:
    """Time a from-scratch build, a no-op rebuild, index size, peak memory and embedding throughput."""
    from arag.bench.build import run_build_bench

    settings = load_settings()
    with build_progress("bench build") as progress:
        result = run_build_bench(
            settings, papers or None, data_dir=data_dir, embed_sample=embed_sample, progress=progress
        )
    table = Table(title=f"build benchmark ({result.papers} papers)", show_header=False, title_justify="left")
    table.add_row("build wall time", f"{result.build_seconds:.1f} s")
    table.add_row(
        "no-op rebuild", f"{result.noop_build_seconds:.2f} s ({result.noop_papers_added} papers added)"
    )
    table.add_row("chunks", f"{result.chunks} " + str(result.chunks_by_type))
    table.add_row("mean overlap", f"{result.build.mean_overlap_sentences:.2f} sentences")
    table.add_row("index on disk", f"{result.index_bytes / 2**20:.1f} MiB")
    table.add_row("peak RSS", f"{result.peak_rss_mib:.0f} MiB")
    table.add_row(
        "embedding during build",
        f"{result.build.chunks_per_second:.1f} texts/s ({result.build.texts_embedded} texts by the model)",
    )
    if result.embedding:
        e = result.embedding
        table.add_row(
            "embedding throughput",
            f"{e.ours_chunks_per_s:.1f} chunks/s vs baseline {e.baseline_chunks_per_s:.1f} "
            f"(x{e.speedup:.2f}; median of {e.repeats}, {e.texts} chunks, "
            f"batch {e.batch_size}, {e.threads} threads)",
        )
    console.print(table)
    if json_out:
        json_out.write_text(result.model_dump_json(indent=2))
        console.print(f"wrote {json_out}")
