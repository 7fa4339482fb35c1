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


@bench_app.command("map")
@handle_errors
def bench_map(
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON.")] = None,
) -> None:
    """The library map's projections on the built library: PCA (baseline) vs t-SNE (default), timed,
    with the share of each paper's 10 nearest papers kept as neighbours on the map, and topic purity."""
    from arag.bench.map import run_map_bench

    settings = load_settings()
    with console.status("projecting the abstract vectors (PCA, then t-SNE)"):
        r = run_map_bench(settings)
    table = Table(
        "projection", "seconds", f"{r.neighbours}-NN kept", "topic purity",
        title=f"map benchmark ({r.papers} papers, {r.topics} topics; vectors in {r.embed_seconds:.1f} s)",
        title_justify="left",
    )  # fmt: skip
    for p in r.results:
        table.add_row(p.method, f"{p.seconds:.2f}", f"{p.neighbour_agreement:.3f}", f"{p.topic_purity:.3f}")
    console.print(table)
    base, ours = r.results[0], r.results[1]
    if base.neighbour_agreement > 0:
        console.print(
            f"t-SNE / PCA neighbours kept: x{ours.neighbour_agreement / base.neighbour_agreement:.1f}"
        )
    if json_out:
        json_out.write_text(r.model_dump_json(indent=2))
        console.print(f"wrote {json_out}")


@bench_app.command("retrieval")
@handle_errors
def bench_retrieval(
    queries: Annotated[int, typer.Option(help="QASPER validation questions to time.")] = 150,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON.")] = None,
) -> None:
    """Per-stage latency medians (embed, dense, sparse, fuse, rerank), 1 vs 3 sub-queries (sequential
    vs concurrent), with and without reranking, and cold start."""
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
    table.add_row("reranker / candidates", f"{r.reranker} / {r.rerank_candidates:.0f}")
    table.add_row("1 query (hybrid)", f"{r.one_query_ms:.1f} ms")
    table.add_row(
        "1 query (hybrid + rerank)",
        f"{r.one_query_reranked_ms:.1f} ms (x{r.one_query_reranked_ms / r.one_query_ms:.1f} vs hybrid)",
    )
    table.add_row("3 sub-queries, sequential", f"{r.three_sequential_ms:.1f} ms")
    table.add_row(
        "3 sub-queries, concurrent",
        f"{r.three_concurrent_ms:.1f} ms (x{r.concurrent_speedup:.2f} vs sequential)",
    )
    table.add_row(
        "index open / embedder load / reranker load",
        f"{r.index_open_ms:.0f} ms / {r.model_load_ms:.0f} ms / {r.reranker_load_ms:.0f} ms",
    )
    table.add_row("cold start (new process to first result)", f"{r.cold_start_ms:.0f} ms")
    console.print(table)
    if json_out:
        json_out.write_text(r.model_dump_json(indent=2))


@bench_app.command("reranker")
@handle_errors
def bench_reranker(
    lengths: Annotated[
        str, typer.Option(help="Comma-separated input lengths (word-pieces per pair).")
    ] = "128,160,192,256",
    questions: Annotated[int | None, typer.Option(help="Validation questions (default: all).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON.")] = None,
) -> None:
    """The installed reranker at several input lengths: validation nDCG@10 against ms per candidate list."""
    from arag.bench.rerank import run_rerank_bench
    from arag.errors import InputError
    from arag.eval.retrieval import default_questions_path

    try:
        sizes = [int(x) for x in lengths.split(",") if x.strip()]
    except ValueError as exc:
        raise InputError(
            f"bad --lengths {lengths!r}", where="--lengths", fix="give numbers, e.g. 128,192"
        ) from exc
    settings = load_settings()
    with build_progress("rerank bench", unit="lists") as bar:
        r = run_rerank_bench(
            settings, default_questions_path(), sizes, limit=questions, progress=bar.advance, start=bar.start
        )
    table = Table(
        "max length",
        "nDCG@10",
        "Recall@10",
        "nDCG@10, model alone",
        "median ms / list",
        "p90 ms",
        title=f"{r.model} (trained at {r.trained_max_length}) on {r.questions} validation lists of "
        f"{r.candidates_median:.0f}; fused order nDCG@10 {r.fused_ndcg10:.3f}, "
        f"Recall@10 {r.fused_recall10:.3f}",
    )
    for run in r.runs:
        table.add_row(
            str(run.max_length),
            f"{run.ndcg10:.3f}",
            f"{run.recall10:.3f}",
            f"{run.model_ndcg10:.3f}",
            f"{run.median_ms:.1f}",
            f"{run.p90_ms:.1f}",
        )
    console.print(table)
    if json_out:
        json_out.write_text(r.model_dump_json(indent=2))


@bench_app.command("service")
@handle_errors
def bench_service(
    clients: Annotated[int, typer.Option(help="Concurrent /query/stream clients.")] = 8,
    url: Annotated[
        str | None, typer.Option(help="A running server to measure (default: start `arag serve` here).")
    ] = None,
    port: Annotated[int, typer.Option(help="Port for the server this command starts.")] = 7861,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON.")] = None,
) -> None:
    """N concurrent streamed questions while /health is probed every 50 ms (idle baseline, same run)."""
    from arag.bench.service import run_service_bench

    settings = load_settings()
    console.print(f"[dim]{clients} clients against {url or f'arag serve on port {port}'}…[/]")
    r = run_service_bench(settings, clients=clients, url=url, port=port)
    table = Table(title=f"service benchmark ({r.clients} streams, LLM {r.llm})", show_header=False,
                  title_justify="left")  # fmt: skip
    table.add_row("streams completed", f"{r.completed}/{r.clients} in {r.wall_s:.1f} s")
    table.add_row(
        "stream time", f"p50 {r.stream_total.p50_ms / 1000:.1f} s, p95 {r.stream_total.p95_ms / 1000:.1f} s"
    )
    table.add_row(
        "first token", f"p50 {r.first_token.p50_ms / 1000:.1f} s, p95 {r.first_token.p95_ms / 1000:.1f} s"
    )
    table.add_row(
        "/health idle",
        f"p50 {r.health_idle.p50_ms:.1f} ms, p95 {r.health_idle.p95_ms:.1f} ms (n={r.health_idle.n})",
    )
    table.add_row(
        "/health under load",
        f"p50 {r.health_under_load.p50_ms:.1f} ms, p95 {r.health_under_load.p95_ms:.1f} ms, "
        f"max {r.health_under_load.max_ms:.1f} ms (n={r.health_under_load.n}, {r.health_errors} errors; "
        f"p95 x{r.health_ratio_p95} idle)",
    )
    console.print(table)
    for s in r.streams:
        if not s.ok:
            console.print(f"[red]failed:[/] {s.question}: {s.error or s.status}", highlight=False)
    if json_out:
        json_out.write_text(r.model_dump_json(indent=2))
        console.print(f"wrote {json_out}")
    if r.completed < r.clients:
        raise typer.Exit(1)


@bench_app.command("scale")
@handle_errors
def bench_scale(
    sizes: Annotated[
        str, typer.Option(help="Chunk counts to build, comma-separated.")
    ] = "25000,100000,400000",
    queries: Annotated[int, typer.Option(help="QASPER validation questions to time.")] = 100,
    workdir: Annotated[
        Path | None, typer.Option(help="Where to build the indexes (default: a temporary folder, removed).")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON.")] = None,
) -> None:
    """Build and query cost, memory and disk of the embedded store at growing chunk counts (synthetic
    chunks from the built library's text and vectors)."""
    import shutil
    import tempfile

    from arag.bench.scale import run_scale_bench
    from arag.errors import InputError
    from arag.eval.retrieval import default_questions_path, library_query, load_questions

    try:
        wanted = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError as exc:
        raise InputError(f"bad --sizes {sizes!r}", where="--sizes", fix="e.g. --sizes 25000,100000") from exc
    settings = load_settings()
    qs = [library_query(q) for q in load_questions(default_questions_path(), limit=queries)]
    work = workdir or Path(tempfile.mkdtemp(prefix="arag-scale-"))
    try:
        console.print(f"[dim]building {', '.join(map(str, wanted))} chunks in {work}…[/]")
        r = run_scale_bench(settings.data_dir, work, wanted, qs)
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    table = Table(title=f"embedded store at scale ({r.base_chunks} real chunks cycled)", title_justify="left")
    for col in ("chunks", "upsert s", "optimize s", "disk MiB", "open s", "RSS MiB", "dense ms", "BM25 ms",
                "hybrid ms"):  # fmt: skip
        table.add_column(col, justify="right")
    for p in r.points:
        table.add_row(
            f"{p.chunks:,}", f"{p.upsert_s}", f"{p.optimize_s}", f"{p.disk_mib:.0f}", f"{p.open_s}",
            f"{p.rss_mib:.0f}", f"{p.dense_ms}", f"{p.sparse_ms}", f"{p.hybrid_ms}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"per 100k chunks: {r.per_100k_disk_mib:.0f} MiB disk, {r.per_100k_rss_mib:.0f} MiB RSS when open"
    )
    if json_out:
        json_out.write_text(r.model_dump_json(indent=2))
        console.print(f"wrote {json_out}")
