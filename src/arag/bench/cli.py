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


@bench_app.command("retrieval")
@handle_errors
def bench_retrieval(
    queries: Annotated[int, typer.Option(help="QASPER validation questions to time.")] = 150,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON.")] = None,
) -> None:
    """Per-stage latency medians, 1 vs 3 sub-queries (sequential vs concurrent), cold start."""
    from arag.bench.retrieval import run_retrieval_bench
    from arag.eval.retrieval import default_questions_path, library_query, load_questions

    settings = load_settings()
    qs = [library_query(q) for q in load_questions(default_questions_path(), limit=queries)]
    r = run_retrieval_bench(settings, qs)
    table = Table(
        title=f"retrieval latency ({r.queries} queries, medians)", show_header=False, title_justify="left"
    )
    for stage, ms in r.stage_ms.items():
        table.add_row(f"stage: {stage}", f"{ms:.2f} ms")
    table.add_row("1 query (hybrid)", f"{r.one_query_ms:.1f} ms")
    table.add_row("3 sub-queries, sequential", f"{r.three_sequential_ms:.1f} ms")
    table.add_row(
        "3 sub-queries, concurrent",
        f"{r.three_concurrent_ms:.1f} ms (x{r.concurrent_speedup:.2f} vs sequential)",
    )
    table.add_row("index open / model load", f"{r.index_open_ms:.0f} ms / {r.model_load_ms:.0f} ms")
    table.add_row("cold start (new process to first result)", f"{r.cold_start_ms:.0f} ms")
    console.print(table)
    if json_out:
        json_out.write_text(r.model_dump_json(indent=2))
