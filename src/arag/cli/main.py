"""``arag``: build and inspect the research library (answering arrives in later releases)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table

from arag.cli.common import build_progress, console, handle_errors, load_settings
from arag.corpus.qasper import ATTRIBUTION
from arag.errors import InputError
from arag.library.build import BuildSummary
from arag.library.manage import add_pdfs, build_library, library_status, list_papers
from arag.records import ScoredChunk
from arag.retrieval.pipeline import SearchResult
from arag.settings import Settings

app = typer.Typer(
    name="arag",
    help="arag: an adaptive retrieval-augmented research assistant over a library of AI/ML papers.\n\n"
    "Start with `arag library build` (the default QASPER library), then `arag library status`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
library_app = typer.Typer(help="Build, extend and inspect the paper library.", no_args_is_help=True)
app.add_typer(library_app, name="library")


def _register_subapps() -> None:
    from arag.cli.ask import register as register_ask
    from arag.cli.bench import bench_app
    from arag.cli.corpus import corpus_app
    from arag.cli.eval import eval_app
    from arag.cli.llm import llm_app
    from arag.cli.train import train_app

    register_ask(app)
    from arag.cli.paper_tools import register as register_paper_tools

    register_paper_tools(app)
    from arag.cli.mcp import register as register_mcp
    from arag.cli.serve import serve_cmd

    app.command("serve")(serve_cmd)
    register_mcp(app)
    from arag.cli.stress import stress_app

    app.add_typer(stress_app, name="stress", help="Reliability tests that print their figures (make stress).")
    app.add_typer(
        corpus_app, name="corpus", help="Select papers from arXiv into a manifest and fetch their PDFs."
    )
    app.add_typer(bench_app, name="bench", help="Benchmarks that print figures and can write JSON.")
    app.add_typer(eval_app, name="eval", help="Quality figures on QASPER (validation split).")
    app.add_typer(llm_app, name="llm", help="The local LLM's runtime: `arag llm check` (set-up runs it).")
    app.add_typer(
        train_app, name="train", help="Train arag's own models (the reranker) from packaged weights."
    )


def _print_summary(summary: BuildSummary, title: str) -> None:
    table = Table(title=title, show_header=False, title_justify="left")
    added = str(summary.papers_added)
    if summary.papers_updated:
        updated = summary.papers_updated
        added += f" ({updated} already in the library, indexed again: their text or the chunking changed)"
    table.add_row("papers added", added)
    table.add_row("papers already up to date", str(summary.papers_skipped))
    table.add_row("papers failed", str(summary.papers_failed))
    by_type = ", ".join(f"{k} {v}" for k, v in sorted(summary.chunks_by_type.items())) or "-"
    table.add_row("chunks added", f"{summary.chunks_added} ({by_type})")
    table.add_row("mean overlap", f"{summary.mean_overlap_sentences:.2f} sentences")
    if summary.chunks_added:
        cached = summary.chunks_added - summary.texts_embedded
        rate = f", {summary.chunks_per_second:.1f} texts/s" if summary.texts_embedded else ""
        table.add_row(
            "embedded", f"{summary.texts_embedded} texts ({max(cached, 0)} chunks from the cache{rate})"
        )
    table.add_row("seconds", f"{summary.seconds:.1f}")
    console.print(table)
    for f in summary.failures[:20]:
        console.print(f"  [yellow]skipped[/] {escape(f.key)}: {escape(f.reason)}", highlight=False)
    if len(summary.failures) > 20:
        console.print(f"  ... and {len(summary.failures) - 20} more (see `arag library status`)")


@library_app.command("build")
@handle_errors
def library_build(
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild",
            help="Build from scratch beside the current library (QASPER and every added paper, from "
            "their kept files), then switch to it; refused while another process has the library open.",
        ),
    ] = False,
    drop_missing: Annotated[
        bool,
        typer.Option("--drop-missing", help="With --rebuild: leave out added papers whose file is gone."),
    ] = False,
    max_papers: Annotated[int | None, typer.Option(help="Only the first N papers (quick libraries).")] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the build summary as JSON.")
    ] = None,
) -> None:
    """Build the default library (QASPER) or bring it up to date; resumes after an interruption."""
    overrides = {}
    if max_papers is not None:
        overrides["corpus"] = {"max_papers": max_papers}
    settings = load_settings(**overrides)
    console.print(f"[dim]{ATTRIBUTION}[/]")
    with build_progress("indexing papers") as progress:
        summary = build_library(settings, progress=progress, rebuild=rebuild, drop_missing=drop_missing)
    _print_summary(summary, f"library build ({settings.data_dir})")
    if json_out:
        json_out.write_text(summary.model_dump_json(indent=2))


@library_app.command("add")
@handle_errors
def library_add(
    paths: Annotated[list[Path], typer.Argument(help="PDF files or folders of PDFs.")],
) -> None:
    """Add PDFs to the library (references cut, tables as their own chunks); bad files are skipped."""
    settings = load_settings()
    with build_progress("indexing PDFs") as progress:
        summary = add_pdfs(settings, paths, progress=progress)
    _print_summary(summary, "library add")


@library_app.command("status")
@handle_errors
def library_status_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Papers, chunks by type, model, index size, topics and failures."""
    settings = load_settings()
    st = library_status(settings)
    if as_json:
        print(st.model_dump_json(indent=2))
        return
    if st.papers == 0:
        console.print(f"No library yet in {st.data_dir}: run `arag library build`.", soft_wrap=True)
        return
    table = Table(title="arag library", show_header=False, title_justify="left")
    table.add_row("data directory", st.data_dir)
    table.add_row(
        "papers", f"{st.papers} (" + ", ".join(f"{k} {v}" for k, v in st.papers_by_source.items()) + ")"
    )
    table.add_row(
        "chunks", f"{st.chunks} (" + ", ".join(f"{k} {v}" for k, v in sorted(st.chunks_by_type.items())) + ")"
    )
    table.add_row("embedding model", f"{st.embedding_model} ({st.embedding_dim} dims)")
    table.add_row(
        "index size", f"{st.index_bytes / 2**20:.1f} MiB (+ {st.state_bytes / 2**20:.1f} MiB state)"
    )
    table.add_row("topics", str(len(st.topics)))
    table.add_row("failures", str(len(st.failures)))
    if st.last_build:
        lb = st.last_build
        table.add_row(
            "last build", f"{lb.get('papers_added', 0)} papers added in {lb.get('seconds', 0):.1f} s"
        )
    console.print(table)
    for f in st.failures[:20]:
        console.print(
            f"  [yellow]failed[/] {escape(f.key)} ({escape(f.source)}): {escape(f.reason)}", highlight=False
        )
    console.print(f"[dim]{ATTRIBUTION}[/]")


@library_app.command("migrate")
@handle_errors
def library_migrate(
    to: Annotated[
        str,
        typer.Option("--to", help="A Qdrant URL (http://host:6333), or :memory: / path:DIR (local mode)."),
    ],
    collection: Annotated[
        str | None, typer.Option(help="The target collection (default: ARAG_STORE__COLLECTION).")
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Points read and written per step.")] = 256,
    replace: Annotated[
        bool, typer.Option("--replace", help="Delete the target collection first if it holds points.")
    ] = False,
) -> None:
    """Copy the library's index to a Qdrant server (vectors and payload as they are), then verify it."""
    from arag.library.migrate import migrate_library

    settings = load_settings()
    with build_progress("copying points", unit="points") as progress:
        report = migrate_library(
            settings, to, collection=collection, batch=batch, replace=replace, progress=progress
        )
    table = Table(title=f"library migrate -> {report.target}", show_header=False, title_justify="left")
    table.add_row("points copied", f"{report.points} (target holds {report.target_points})")
    table.add_row("chunks by type", ", ".join(f"{k} {v}" for k, v in sorted(report.by_type.items())) or "-")
    table.add_row(
        "target by type", ", ".join(f"{k} {v}" for k, v in sorted(report.target_by_type.items())) or "-"
    )
    table.add_row("sample verified", f"{report.sampled} points, min cosine {report.min_cosine:.6f}")
    table.add_row("seconds", f"{report.seconds:.1f}")
    console.print(table)
    coll = collection or settings.store.collection
    console.print(
        f"verified. To search it: ARAG_QDRANT_URL={escape(to)} ARAG_STORE__COLLECTION={escape(coll)}",
        highlight=False,
        soft_wrap=True,
    )


@library_app.command("topics")
@handle_errors
def library_topics(
    recluster: Annotated[bool, typer.Option(help="Cluster all abstracts again (labels too).")] = False,
) -> None:
    """Show the topics (k-means over abstract vectors); --recluster recomputes them and the map."""
    from arag.library.build import LibraryBuilder
    from arag.library.map import map_missing
    from arag.library.state import LibraryState

    settings = load_settings()
    with LibraryState(settings.state_db) as state:
        unmapped = map_missing(state)
    if recluster or unmapped:
        # A library built before the map existed gets one here (topics untouched without --recluster).
        status = "clustering and mapping the papers" if recluster else "mapping the papers"
        with console.status(status), LibraryBuilder(settings) as builder:
            builder.update_topics(recluster=recluster)
    _print_topics(settings)


def _print_topics(settings: Settings) -> None:
    counts: dict[int, int] = {}
    labels: dict[int, str] = {}
    for r in list_papers(settings):
        if r.topic is not None:
            counts[r.topic] = counts.get(r.topic, 0) + 1
            labels[r.topic] = r.topic_label or ""
    table = Table("topic", "papers", "label", title="topics")
    for t in sorted(counts):
        table.add_row(str(t), str(counts[t]), labels[t])
    console.print(table)


@app.command("papers")
@handle_errors
def papers_cmd(
    topic: Annotated[int | None, typer.Option(help="Only papers of this topic (see --topics).")] = None,
    topics: Annotated[bool, typer.Option("--topics", help="List the topics instead of papers.")] = False,
    limit: Annotated[int, typer.Option(help="Show at most N papers (0: all).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """List the papers in the library."""
    settings = load_settings()
    rows = list_papers(settings, topic=topic)
    if topics:
        _print_topics(settings)
        return
    shown = rows if limit == 0 else rows[:limit]
    if as_json:
        for r in shown:
            print(json.dumps(r.model_dump(exclude={"abstract_text"})))
        return
    table = Table("id", "year", "chunks", "topic", "title", title=f"{len(rows)} papers")
    for r in shown:
        table.add_row(
            r.id, str(r.year or ""), str(r.n_chunks), str(r.topic if r.topic is not None else ""), r.title
        )
    console.print(table)
    if len(shown) < len(rows):
        console.print(f"[dim]... {len(rows) - len(shown)} more: --limit 0 shows all[/]")


@app.command("search")
@handle_errors
def search_cmd(
    query: Annotated[str, typer.Argument(help="What to look for, in your words.")],
    paper: Annotated[
        list[str] | None, typer.Option("--paper", help="Only these paper ids (repeatable).")
    ] = None,
    chunk_type: Annotated[
        list[str] | None, typer.Option("--type", help="Only these chunk types: abstract, passage, table.")
    ] = None,
    topic: Annotated[int | None, typer.Option(help="Only papers of this topic.")] = None,
    limit: Annotated[int, typer.Option("-k", "--k", help="How many passages to show.")] = 10,
    rerank: Annotated[
        bool, typer.Option("--rerank/--no-rerank", help="Rerank with the configured cross-encoder.")
    ] = True,
    explain: Annotated[
        bool, typer.Option("--explain", help="Show every stage's list: each search, fusion, rerank.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the hits as JSON.")] = False,
) -> None:
    """Hybrid search (dense + BM25, fused with RRF), reranked by the cross-encoder."""
    from arag.agent.graph import validate_question
    from arag.library.manage import open_retrieval
    from arag.models.reranker import IdentityReranker
    from arag.records import SearchFilter
    from arag.text import section_path, strip_placeholders

    if limit < 1:
        raise InputError(f"-k must be at least 1, got {limit}", where="-k", fix="ask for 1 or more passages")
    bad = [t for t in chunk_type or [] if t not in ("abstract", "passage", "table")]
    if bad:
        raise InputError(
            f"unknown chunk type {bad[0]!r}", where="--type", fix="use abstract, passage or table"
        )
    settings = load_settings()
    query = validate_question(query, settings.agent.max_question_chars, what="query")
    flt = None
    if paper or chunk_type or topic is not None:
        flt = SearchFilter.model_validate(
            {
                "paper_ids": paper or None,
                "types": chunk_type or None,
                "topics": [topic] if topic is not None else None,
            }
        )
    with open_retrieval(settings, reranker=None if rerank else IdentityReranker()) as retrieval:
        llm = None
        if settings.retrieval.strategy != "plain":
            from arag.llm.factory import get_llm

            llm = get_llm(settings)  # multi-query / HyDE write with the LLM
        result = retrieval.reranking(llm=llm).search(query, flt)
    hits = result.ranked[:limit]
    if as_json:
        out = {
            "query": query,
            "resolved_paper": result.hybrid.resolved.paper_id if result.hybrid.resolved else None,
            "papers": [p.model_dump() for p in result.papers],
            "hits": [h.model_dump() for h in hits],
        }
        print(json.dumps(out, indent=2))
        return
    hyb = result.hybrid
    if hyb.resolved is not None:
        r = hyb.resolved
        console.print(
            f"scoped to [bold]{r.paper_id}[/] {r.title!r}: {r.reason()}", soft_wrap=True, highlight=False
        )
    elif explain:
        console.print("no paper named: searched the whole library", soft_wrap=True)
    if explain:
        if result.expansion:
            console.print(f"{settings.retrieval.strategy}: " + " | ".join(result.expansion), soft_wrap=True)
        elif result.expansion_note:
            console.print(f"{settings.retrieval.strategy}: {result.expansion_note}", soft_wrap=True)
        _explain_stages(result)
    if result.papers:
        _print_papers(result)
    kept = {c.chunk.id for c in result.kept}
    for i, h in enumerate(hits, 1):
        c = h.chunk
        where = f"{section_path(c.section)} ({c.type})" if c.section else c.type
        score = f"rerank {h.rerank_score:.3f}" if h.rerank_score is not None else f"rrf {h.fused_score:.4f}"
        marks = (" · [green]kept[/]" if c.id in kept else "") + (" · floored" if h.floored else "")
        line = (
            f"[bold][{i}][/] [cyan]{c.paper_id}[/] {escape(c.title)} · {escape(where)} · {score} · "
            f"fused #{h.fused_rank} · {'+'.join(h.found_by) or '-'}{marks}"
        )
        console.print(line, soft_wrap=False, highlight=False)
        shown = strip_placeholders(c.text)
        text = shown if len(shown) <= 600 else shown[:600] + " …"
        console.print(Padding(escape(text), (0, 0, 1, 4)), highlight=False)
    console.print(
        f"[dim]{result.model}: {len(result.kept)} kept of {len(result.ranked)} candidates; "
        f"search {result.timings['search']:.0f} ms, rerank {result.timings['rerank']:.0f} ms[/]",
        highlight=False,
    )


def _print_papers(result: SearchResult) -> None:
    """The paper ranking of a question that names no paper: each paper's aggregated evidence."""
    console.print(
        "[bold]papers[/] (the question names none: ranked by their abstracts' and passages' evidence)"
    )
    table = Table("#", "paper", "score", "abstract", "hits", "rerank", "title", box=None, pad_edge=False)
    for p in result.papers:
        table.add_row(
            str(p.rank),
            p.paper_id,
            f"{p.score:.4f}",
            f"#{p.abstract_rank}" if p.abstract_rank else "-",
            str(p.passage_hits),
            f"{p.best_rerank:.2f}" if p.best_rerank is not None else "-",
            escape(p.title),
        )
    console.print(table)
    console.print()


def _explain_stages(result: SearchResult) -> None:
    """Each search's top ranks, then fusion and rerank, side by side."""
    hyb = result.hybrid
    stages: dict[str, Sequence[ScoredChunk]] = {
        "abstracts (dense)": hyb.dense_abstracts,
        "passages (dense)": hyb.dense_passages,
        "bm25": hyb.bm25,
        "fused (rrf)": hyb.fused,
        "reranked": result.ranked,
    }
    table = Table("rank", *stages, title="stages (paper id:chunk index, score)")
    depth = max(len(v) for v in stages.values())
    for i in range(depth):
        cells = []
        for hits in stages.values():
            if i < len(hits):
                h = hits[i]
                cells.append(f"{h.chunk.paper_id}:{h.chunk.index} {h.score:.3f}")
            else:
                cells.append("")
        table.add_row(str(i + 1), *cells)
    console.print(table)


_register_subapps()
