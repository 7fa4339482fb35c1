"""``arag corpus``: select arXiv papers from a spec into a manifest, then fetch their PDFs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from arag.cli.common import console, err_console, handle_errors, load_settings
from arag.corpus.arxiv import ArxivClient, FetchReport, fetch, select
from arag.corpus.manifest import Manifest, load_spec, read_manifest, write_manifest
from arag.errors import NetworkError

corpus_app = typer.Typer(
    help="Build a corpus from arXiv: select papers from a spec into a manifest, then fetch their PDFs.",
    no_args_is_help=True,
)


def _selection_table(manifest: Manifest) -> Table:
    counts = manifest.counts
    table = Table(title=f"Selection {manifest.spec_name!r}")
    table.add_column("topic")
    table.add_column("found", justify="right")
    table.add_column("kept", justify="right")
    table.add_column("canonical", justify="right")
    canonical: dict[str, int] = {}
    for e in manifest.entries:
        canonical[e.topic] = canonical.get(e.topic, 0) + int(e.canonical)
    for topic in dict.fromkeys([*counts.per_topic_found, *counts.per_topic_kept]):
        table.add_row(
            topic,
            str(counts.per_topic_found.get(topic, 0)),
            str(counts.per_topic_kept.get(topic, 0)),
            str(canonical.get(topic, 0)),
        )
    table.add_section()
    table.add_row("total", "", str(len(manifest.entries)), str(sum(canonical.values())))
    return table


def _gate_table(manifest: Manifest) -> Table:
    counts = manifest.counts
    table = Table(title="Removed")
    table.add_column("gate")
    table.add_column("papers", justify="right")
    table.add_row("exclude list", str(len(counts.removed_exclude)))
    table.add_row("category allow-list", str(len(counts.removed_category)))
    table.add_row("title block-list", str(len(counts.removed_title)))
    table.add_row("duplicates", str(counts.duplicates))
    table.add_row("hand-picked not found", str(len(counts.missing)))
    return table


@corpus_app.command("select")
@handle_errors
def select_cmd(
    spec: Annotated[Path, typer.Argument(help="Selection spec (TOML or JSON).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the manifest.")] = Path(
        "manifest.json"
    ),
    cache_dir: Annotated[
        Path | None, typer.Option("--cache-dir", help="API response cache (default: the data dir's cache).")
    ] = None,
) -> None:
    """Resolve a selection spec against arXiv and write the manifest (the corpus, pinned)."""
    settings = load_settings()
    selection = load_spec(spec)
    with ArxivClient(settings.arxiv, cache_dir or settings.cache_dir) as client:
        manifest = select(selection, client)
        requests = client.requests
    write_manifest(manifest, out)
    console.print(_selection_table(manifest))
    console.print(_gate_table(manifest))
    if manifest.counts.missing:
        console.print(f"[yellow]not found on arXiv: {', '.join(manifest.counts.missing)}[/yellow]")
    console.print(
        f"wrote {len(manifest.entries)} papers to {escape(str(out))} "
        f"({requests} arXiv requests, the rest from the cache)",
        soft_wrap=True,
    )
    console.print(f"next: arag corpus fetch {escape(str(out))}", soft_wrap=True)


def _print_report(console: Console, report: FetchReport) -> None:
    console.print(
        f"downloaded {len(report.downloaded)} ({report.bytes_downloaded / 1e6:.1f} MB), "
        f"already complete {len(report.skipped)}, failed {len(report.failed)}"
    )
    if report.failed:
        table = Table(title="Failed downloads")
        table.add_column("id")
        table.add_column("what went wrong")
        for pid, what in report.failed.items():
            table.add_row(pid, what)
        console.print(table)


@corpus_app.command("fetch")
@handle_errors
def fetch_cmd(
    manifest_path: Annotated[Path, typer.Argument(metavar="MANIFEST", help="Manifest from `corpus select`.")],
    dest: Annotated[
        Path | None, typer.Option("--dest", help="Folder for the PDFs (default: <data dir>/pdfs).")
    ] = None,
) -> None:
    """Download the manifest's PDFs; complete files are skipped, so rerunning resumes."""
    settings = load_settings()
    manifest = read_manifest(manifest_path)
    folder = dest or settings.data_dir / "pdfs"
    with ArxivClient(settings.arxiv, settings.cache_dir) as client:
        report = fetch(manifest, folder, client, console=console)
    _print_report(console, report)
    if report.failed:
        err_console.print(
            f"[red]{len(report.failed)} downloads failed; rerun "
            f"`arag corpus fetch {escape(str(manifest_path))}` to resume them[/red]",
            soft_wrap=True,
        )
    if report.downloaded or report.skipped:
        console.print(f"next: arag library add {escape(str(folder))}", soft_wrap=True)
    if report.failed:
        raise typer.Exit(NetworkError.exit_code)
