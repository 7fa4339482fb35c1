"""``arag bench``: benchmark commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from arag.cli.common import FiguresJson, build_progress, console, handle_errors, load_settings, write_figures
from arag.errors import InputError

if TYPE_CHECKING:
    from arag.bench.service import ServiceBench

bench_app = typer.Typer(no_args_is_help=True)


@bench_app.command("build")
@handle_errors
def bench_build(
    papers: Annotated[int, typer.Option(help="Papers to build (0: the whole library).")] = 100,
    data_dir: Annotated[
        Path | None, typer.Option(help="Build here instead of a fresh temporary folder (must be empty).")
    ] = None,
    embed_sample: Annotated[int, typer.Option(help="Chunks for the throughput measurement (0: skip).")] = 512,
    baseline_build: Annotated[
        bool,
        typer.Option(
            help="Then build the same papers again with the packaged int8-weights model "
            "(ARAG_EMBEDDING__INT8=weights, the default before dynamic int8) and report the ratio."
        ),
    ] = False,
    json_out: FiguresJson = None,
) -> None:
    """Time a from-scratch build, a no-op rebuild, index size, peak memory and embedding throughput."""
    from arag.bench.build import run_build_bench

    settings = load_settings()
    with build_progress("bench build") as progress:
        result = run_build_bench(
            settings,
            papers or None,
            data_dir=data_dir,
            embed_sample=embed_sample,
            progress=progress,
            baseline_build=baseline_build,
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
            f"(x{e.speedup:.2f}; baseline {e.baseline}; median of {e.repeats}, {e.texts} chunks, "
            f"batch {e.batch_size}, {e.threads} threads)",
        )
    if result.baseline_build_seconds is not None:
        table.add_row(
            "same papers, baseline model",
            f"{result.baseline_build_seconds:.1f} s with {result.baseline_model} "
            f"(this build x{result.build_speedup:.2f} faster)",
        )
    console.print(table)
    write_figures(json_out, result)


@bench_app.command("map")
@handle_errors
def bench_map(
    json_out: FiguresJson = None,
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
    write_figures(json_out, r)


@bench_app.command("retrieval")
@handle_errors
def bench_retrieval(
    queries: Annotated[int, typer.Option(help="QASPER validation questions to time.")] = 150,
    json_out: FiguresJson = None,
) -> None:
    """Per-stage latency medians (embed, dense, sparse, fuse, rerank), 1 vs 3 sub-queries (sequential
    vs concurrent), with and without reranking, and cold start."""
    from arag.bench.retrieval import run_retrieval_bench
    from arag.corpus.qasper_questions import default_questions_path, library_query, load_questions

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
        "1 query (hybrid + rerank, passages and papers)",
        f"{r.one_query_reranked_ms:.1f} ms (x{r.one_query_reranked_ms / r.one_query_ms:.1f} vs hybrid)",
    )
    table.add_row("1 query, its paper named (resolved + rerank)", f"{r.one_named_query_reranked_ms:.1f} ms")
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
    write_figures(json_out, r)


@bench_app.command("int8")
@handle_errors
def bench_int8(
    texts: Annotated[int, typer.Option(help="Chunk texts to embed each way.")] = 400,
    repeats: Annotated[int, typer.Option(help="Timed runs each way (alternating; medians).")] = 3,
    json_out: FiguresJson = None,
) -> None:
    """The embedder on this CPU's own uint8 x int8 kernels against the exact uint8 rewrite arag runs
    where those kernels clamp (no VNNI or AMX): texts/s of each, and how far the vectors move."""
    from arag.bench.int8 import run_int8_bench

    r = run_int8_bench(load_settings(), texts=texts, repeats=repeats)
    used = "the rewrite" if r.clamps else "its own kernels (exact)"
    table = Table(
        title=f"int8 arithmetic on {r.cpu}: arag runs {used}", show_header=False, title_justify="left"
    )
    table.add_row("texts x runs", f"{r.texts} x {r.repeats}")
    table.add_row("own uint8 x int8 kernels", f"{r.own_kernels_texts_per_s:.1f} texts/s")
    table.add_row(
        "uint8 rewrite (exact)", f"{r.rewrite_texts_per_s:.1f} texts/s (x{r.rewrite_cost:.2f} the time)"
    )
    same = "identical" if r.identical else f"cosine median {r.cosine_median:.5f}, min {r.cosine_min:.5f}"
    table.add_row("vectors, own kernels vs rewrite", same)
    console.print(table)
    write_figures(json_out, r)


@bench_app.command("reranker")
@handle_errors
def bench_reranker(
    lengths: Annotated[
        str, typer.Option(help="Comma-separated input lengths (word-pieces per pair).")
    ] = "128,160,192,256",
    questions: Annotated[int | None, typer.Option(help="Validation questions (default: all).")] = None,
    json_out: FiguresJson = None,
) -> None:
    """The installed reranker at several input lengths: validation nDCG@10 against ms per candidate list."""
    from arag.bench.rerank import run_rerank_bench
    from arag.corpus.qasper_questions import default_questions_path
    from arag.errors import InputError

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
    write_figures(json_out, r)


@bench_app.command("service")
@handle_errors
def bench_service(
    clients: Annotated[int, typer.Option(help="Concurrent /query/stream clients.")] = 8,
    url: Annotated[
        str | None, typer.Option(help="A running server to measure (default: start `arag serve` here).")
    ] = None,
    port: Annotated[int, typer.Option(help="Port for the server this command starts.")] = 7861,
    processes: Annotated[
        str | None,
        typer.Option(
            help="Local model process counts to compare in one run, e.g. 1,2 (threads are shared out)."
        ),
    ] = None,
    json_out: FiguresJson = None,
) -> None:
    """N concurrent streamed questions while /health is probed every 50 ms (idle baseline, same run);
    with --processes, one server per setting, one after the other, compared in one table."""
    from arag.bench.service import run_service_bench

    settings = load_settings()
    counts = [int(p) for p in processes.split(",")] if processes else [None]
    if url is not None and processes:
        raise InputError("--processes starts its own servers", where="--url", fix="drop --url or --processes")
    results = []
    for n in counts:
        env = {"ARAG_LLM__PROCESSES": str(n)} if n is not None else None
        label = f" with {n} model process{'es' if n != 1 else ''}" if n is not None else ""
        console.print(f"[dim]{clients} clients against {url or f'arag serve on port {port}'}{label}…[/]")
        r = run_service_bench(settings, clients=clients, url=url, port=port, env=env)
        results.append(r)
        _print_service(r)
    if len(results) > 1:
        _compare_service(results)
    if json_out:
        data = results[0].model_dump() if len(results) == 1 else {"runs": [r.model_dump() for r in results]}
        json_out.write_text(json.dumps(data, indent=2))
        console.print(f"wrote {json_out}")
    if any(r.completed < r.clients for r in results):
        raise typer.Exit(1)


def _print_service(r: ServiceBench) -> None:
    procs = f", {r.llm_processes} x {r.llm_threads} threads" if r.llm_processes else ""
    table = Table(title=f"service benchmark ({r.clients} streams, LLM {r.llm}{procs})", show_header=False,
                  title_justify="left")  # fmt: skip
    table.add_row("streams completed", f"{r.completed}/{r.clients} in {r.wall_s:.1f} s")
    table.add_row(
        "stream time", f"p50 {r.stream_total.p50_ms / 1000:.1f} s, p95 {r.stream_total.p95_ms / 1000:.1f} s"
    )
    table.add_row(
        "first token", f"p50 {r.first_token.p50_ms / 1000:.1f} s, p95 {r.first_token.p95_ms / 1000:.1f} s"
    )
    table.add_row("tokens streamed", f"{r.tokens_per_s:.2f} tokens/s over all clients")
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


def _compare_service(results: list[ServiceBench]) -> None:
    base = results[0]
    table = Table(
        title="model processes compared (same library, same questions, one run)", title_justify="left"
    )
    for col in (
        "processes x threads",
        "first token p50 / p95 s",
        "stream p50 / p95 s",
        "tokens/s",
        "vs first",
    ):
        table.add_column(col)
    for r in results:
        ratio = r.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0
        table.add_row(
            f"{r.llm_processes} x {r.llm_threads}",
            f"{r.first_token.p50_ms / 1000:.1f} / {r.first_token.p95_ms / 1000:.1f}",
            f"{r.stream_total.p50_ms / 1000:.1f} / {r.stream_total.p95_ms / 1000:.1f}",
            f"{r.tokens_per_s:.2f}",
            f"x{ratio:.2f} tokens/s",
        )
    console.print(table)


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
    json_out: FiguresJson = None,
) -> None:
    """Build and query cost, memory and disk of the embedded store at growing chunk counts (synthetic
    chunks from the built library's text and vectors)."""
    import shutil
    import tempfile

    from arag.bench.scale import run_scale_bench
    from arag.corpus.qasper_questions import default_questions_path, library_query, load_questions
    from arag.errors import InputError

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
    write_figures(json_out, r)


@bench_app.command("first-run")
@handle_errors
def bench_first_run(
    papers: Annotated[int, typer.Option(help="Papers of the library to build (0: all 1,585).")] = 150,
    llm: Annotated[
        str | None, typer.Option(help="LLM provider for the server (default: the configured one).")
    ] = None,
    train: Annotated[
        bool, typer.Option(help="Train the reranker after the build, as make serve does.")
    ] = True,
    setup_s: Annotated[
        float | None, typer.Option("--setup-s", help="Seconds `make venv` took (measured by you), to report.")
    ] = None,
    port: Annotated[int, typer.Option(help="Port for the server under test.")] = 7871,
    data_dir: Annotated[
        Path | None, typer.Option(help="An empty folder to use instead of a temporary one (kept).")
    ] = None,
    json_out: FiguresJson = None,
) -> None:
    """The time a new user waits: `arag serve` in a fresh data directory to /health, to the first cited
    answer, to the complete library and the installed reranker; /health and /search latency while
    the library builds against the idle server; the figures before serving came first beside them."""
    from arag.bench.first_run import FULL_LIBRARY, run_first_run_bench

    r = run_first_run_bench(
        papers=papers, llm=llm, train=train, setup_s=setup_s, port=port, data_dir=data_dir, echo=console.print
    )

    def secs(v: float | None) -> str:
        if v is None:
            return "–"
        return f"{v:,.0f} s ({v / 60:.1f} min)" if v >= 90 else f"{v:.1f} s"

    b = r.before
    table = Table("from the start of `arag serve`", f"this run ({r.papers} papers)", "before (1,585 papers)",
                  title=f"first run (LLM: {r.llm})", title_justify="left")  # fmt: skip
    table.add_row("set-up (make venv)", secs(r.setup_s), secs(b["setup_s"]))
    table.add_row("/health answers, the page is up", secs(r.health_s), secs(b["page_s"]) + " incl. set-up")
    table.add_row(
        "first cited answer",
        secs(r.first_answer_s) + (f", over {r.first_answer_papers} papers" if r.first_answer_papers else ""),
        secs(b["page_s"]) + " incl. set-up",
    )
    table.add_row("library complete", secs(r.build_s), secs(b["build_s"]) + " (the build alone)")
    table.add_row(
        "reranker installed", secs(r.reranker_s) if r.reranker_s else (r.reranker_state or "–"),
        secs(b["reranker_s"]) + " (the training alone)",
    )  # fmt: skip
    if r.full_build_s_extrapolated:
        table.add_row(
            f"EXTRAPOLATED: build of {FULL_LIBRARY:,} papers",
            f"{secs(r.full_build_s_extrapolated)} at {r.build_papers_per_s} papers/s",
            secs(b["build_s"]),
        )
    console.print(table)
    lat = Table("latency", "p50 / p95 / max ms (n)", title="while the background work runs vs idle",
                title_justify="left")  # fmt: skip
    for name, v in (
        ("/health, while the library builds", r.health_building),
        ("/health, while the reranker trains", r.health_training),
        ("/health, idle", r.health_idle),
        ("/search hybrid (server ms), while the library builds", r.search_building),
        ("/search hybrid (server ms), while the reranker trains", r.search_training),
        ("/search hybrid (server ms), idle", r.search_idle),
        ("/search rerank stage (server ms), idle", r.search_idle_rerank),
    ):
        lat.add_row(name, f"{v.p50_ms} / {v.p95_ms} / {v.max_ms} ({v.n})")
    console.print(lat)
    write_figures(json_out, r)
