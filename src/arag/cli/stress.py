"""``arag stress``: reliability tests that print their figures, can write JSON, and exit 1 on failure."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel
from rich.markup import escape
from rich.table import Table

from arag.cli.common import console, err_console, handle_errors
from arag.stress.bad_pdfs import BadPdfReport, run_bad_pdf_test
from arag.stress.common import make_workdir
from arag.stress.crash import CrashReport, run_crash_test
from arag.stress.rebuild_kill import RebuildCrashReport, run_rebuild_kill_test

stress_app = typer.Typer(
    help="Reliability tests: kill builds and resume them, ingest broken PDFs, fuzz and load the API.",
    no_args_is_help=True,
)

JsonOut = Annotated[Path | None, typer.Option("--json", help="Also write the report as JSON.")]
Workdir = Annotated[
    Path | None,
    typer.Option(help="Where the libraries and logs go (default: a temporary folder, removed on success)."),
]


def _echo(msg: str) -> None:
    err_console.print(f"[dim]{escape(msg)}[/]", highlight=False, soft_wrap=True)


def _finish(report: BaseModel, passed: bool, problems: list[str], json_out: Path | None) -> None:
    for p in problems:
        console.print(f"  [red]problem[/] {escape(p)}", highlight=False, soft_wrap=True)
    if json_out is not None:
        json_out.write_text(report.model_dump_json(indent=2))
    console.print("[bold green]PASS[/]" if passed else "[bold red]FAIL[/]")
    if not passed:
        raise typer.Exit(1)


def _print_crash(r: CrashReport) -> None:
    table = Table(title="stress crash: kill a build, resume it", show_header=False, title_justify="left")
    table.add_row("papers / batch size", f"{r.papers} / {r.papers_per_batch}")
    table.add_row("embedder / seed", f"{r.embedder} / {r.seed}")
    table.add_row(
        "reference build",
        f"{r.reference_papers} papers, {r.reference_chunks} chunks, {r.reference_seconds:.1f} s "
        f"(start-up {r.reference_startup_seconds:.1f} s)",
    )
    table.add_row("kills", f"{r.kills_done} of {r.kills_requested}")
    table.add_row(
        "final resume", f"{r.final_papers} papers, {r.final_chunks} chunks, {r.final_seconds:.1f} s"
    )
    table.add_row(
        "chunk ids vs reference",
        "identical" if r.chunk_ids_equal else f"{r.missing_chunk_ids} missing, {r.extra_chunk_ids} extra",
    )
    table.add_row("topics vs reference", "identical" if r.topics_equal else "different")
    table.add_row("total seconds", f"{r.seconds:.1f}")
    table.add_row("workdir", r.workdir)
    console.print(table)
    kills = Table(
        "attempt",
        "aim: ref. s (papers + s)",
        "after (s)",
        "recorded",
        "chunks",
        "in flight",
        "check (s)",
        "problems",
        title="after each kill",
        title_justify="left",
    )
    for k in r.kills:
        kills.add_row(
            str(k.attempt),
            f"{k.target_s:.2f} ({k.aim_papers} + {k.aim_after_s:.2f} s)",
            _killed(k.killed_at_s, k.exit_code),
            str(k.papers_recorded),
            str(k.chunks_in_store),
            f"{k.in_flight_papers} papers, {k.in_flight_chunks} chunks",
            f"{k.check_seconds:.2f}",
            str(len(k.problems)),
        )
    console.print(kills)


def _killed(killed_at_s: float | None, exit_code: int | None) -> str:
    """When an attempt was killed, or how it ended when it finished before its kill."""
    return f"{killed_at_s:.2f}" if killed_at_s is not None else f"ended ({exit_code})"


def _print_bad_pdfs(r: BadPdfReport) -> None:
    files = Table(
        "kind",
        "file",
        "bytes",
        "expected",
        "outcome",
        "named",
        "chunks",
        "reason",
        title="stress bad-pdfs: `arag library add` on broken files",
        title_justify="left",
    )
    for f in r.files:
        ok = f.outcome == f.expected
        outcome = f"[green]{f.outcome}[/]" if ok else f"[red]{f.outcome}[/]"
        reason = escape(re.sub(r" \(at [^()]*\)$", "", f.reason or ""))  # the file is in its own column
        files.add_row(
            f.kind,
            escape(f.name),
            str(f.bytes),
            f.expected,
            outcome,
            "yes" if f.in_output else "no",
            str(f.chunks),
            reason if f.reason_ok else f"[yellow]{reason}[/]",
        )
    console.print(files)
    table = Table(show_header=False)
    table.add_row("base library", f"{r.base_papers} papers, {r.base_chunks} chunks")
    table.add_row(
        "add", f"exit {r.add_exit_code}, {r.add_seconds:.1f} s" + (" (timed out)" if r.add_timed_out else "")
    )
    good = ", ".join(f"{g.name} ({g.chunks} chunks)" if g.added else f"{g.name} MISSING" for g in r.good)
    table.add_row("good PDFs", escape(good) or "-")
    table.add_row("after", f"{r.papers_after} papers, {r.chunks_after} chunks")
    table.add_row("earlier chunks", "unchanged" if r.earlier_chunks_unchanged else "CHANGED")
    table.add_row("total seconds", f"{r.seconds:.1f}")
    table.add_row("workdir", r.workdir)
    console.print(table)
    for n in r.notes:
        console.print(f"  [yellow]note[/] {escape(n)}", highlight=False, soft_wrap=True)


@stress_app.command("crash")
@handle_errors
def crash_cmd(
    papers: Annotated[int, typer.Option(min=1, help="QASPER papers to build.")] = 100,
    kills: Annotated[int, typer.Option(min=1, help="SIGKILLs before the build may finish.")] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the kill points.")] = 0,
    embedder: Annotated[
        str, typer.Option(help="hash (fast, fake) or onnx-minilm (the real model).")
    ] = "hash",
    batch: Annotated[int | None, typer.Option(min=1, help="Papers per batch (default: the setting).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds any one build may take.")] = 1800.0,
    rebuild_kills: Annotated[
        int, typer.Option(min=0, help="SIGKILLs during `library build --rebuild` (0: skip that case).")
    ] = 5,
    pdf: Annotated[
        Path | None, typer.Option(help="The PDF the rebuild case adds (default: one of ../shared/pdfs).")
    ] = None,
    workdir: Workdir = None,
    json_out: JsonOut = None,
) -> None:
    """Build a reference library, then build it again while SIGKILLing it at random points; check
    the library after every kill and that the resumed build ends with the reference's chunk ids.
    Then rebuild a library with an added PDF while SIGKILLing the rebuilds: after every kill the
    library opens with all its papers, and a final rebuild ends with the PDF paper in it."""
    report = run_crash_test(
        papers, kills, seed, embedder, workdir, papers_per_batch=batch, timeout_s=timeout, echo=_echo
    )
    _print_crash(report)
    if rebuild_kills:
        work, temporary = make_workdir(workdir, "arag-stress-rebuild-")
        rb = run_rebuild_kill_test(
            work, papers, rebuild_kills, seed, embedder, pdf=pdf, papers_per_batch=batch, timeout_s=timeout,
            echo=_echo,
        )  # fmt: skip
        if rb.passed and temporary:
            shutil.rmtree(work, ignore_errors=True)
        _print_rebuild(rb, work)
        report = report.model_copy(
            update={
                "rebuild": rb,
                "passed": report.passed and rb.passed,
                "problems": report.problems + [f"rebuild: {p}" for p in rb.problems],
            }
        )
    _finish(report, report.passed, report.problems, json_out)


def _print_rebuild(r: RebuildCrashReport, work: Path) -> None:
    table = Table(title="stress crash: kill a rebuild", show_header=False, title_justify="left")
    table.add_row("library", f"{r.papers} QASPER papers + {r.pdf} ({r.pdf_id}): {r.expected_papers} papers")
    table.add_row("reference rebuild", f"{r.reference_seconds:.1f} s")
    table.add_row("kills", f"{r.kills_done} of {r.kills_requested} (seed {r.seed})")
    table.add_row(
        "final rebuild",
        f"{r.final_papers} papers, {r.final_chunks} chunks, PDF paper "
        f"{'present' if r.final_pdf_present else 'MISSING'}, {r.final_seconds:.1f} s; "
        f"{r.generations_left} generation folder(s) left",
    )
    table.add_row("total seconds", f"{r.seconds:.1f}")
    table.add_row("workdir", str(work))
    console.print(table)
    kills = Table(
        "attempt",
        "kill due (s)",
        "killed (s)",
        "library in",
        "pending",
        "papers",
        "chunks",
        "PDF",
        "check (s)",
        "problems",
        title="after each killed rebuild",
        title_justify="left",
    )
    for k in r.kills:
        kills.add_row(
            str(k.attempt),
            f"{k.target_s:.2f}",
            _killed(k.killed_at_s, k.exit_code),
            "new generation" if k.switched else "old generation",
            "yes" if k.pending else "no",
            str(k.papers),
            str(k.chunks),
            "yes" if k.pdf_present else "MISSING",
            f"{k.check_seconds:.2f}",
            str(len(k.problems)),
        )
    console.print(kills)


@stress_app.command("bad-pdfs")
@handle_errors
def bad_pdfs_cmd(
    good_pdfs: Annotated[
        Path | None, typer.Option(help="Good PDFs to add alongside (default: ../shared/pdfs).")
    ] = None,
    papers: Annotated[int, typer.Option(min=1, help="QASPER papers in the base library.")] = 5,
    embedder: Annotated[
        str, typer.Option(help="hash (fast, fake) or onnx-minilm (the real model).")
    ] = "hash",
    timeout: Annotated[
        float, typer.Option(help="Seconds `arag library add` may take (a hang fails).")
    ] = 600.0,
    workdir: Workdir = None,
    json_out: JsonOut = None,
) -> None:
    """Add corrupt, empty, encrypted, image-only, noise and non-PDF files with good PDFs in one
    `arag library add`; check each bad file is reported and the library is otherwise intact."""
    report = run_bad_pdf_test(
        workdir, good_pdfs, papers=papers, embedder=embedder, timeout_s=timeout, echo=_echo
    )
    _print_bad_pdfs(report)
    _finish(report, report.passed, report.problems, json_out)


@stress_app.command("api")
@handle_errors
def api_cmd(
    library: Annotated[
        Path | None, typer.Option(help="A built library's data directory (default: build a small one).")
    ] = None,
    papers: Annotated[int, typer.Option(min=1, help="QASPER papers of the small library.")] = 20,
    fuzz_examples: Annotated[int, typer.Option(min=1, help="Generated cases per operation.")] = 100,
    clients: Annotated[int, typer.Option(min=1, help="Concurrent load clients.")] = 16,
    duration: Annotated[float, typer.Option(help="Seconds of load.")] = 120.0,
    llm: Annotated[str | None, typer.Option(help="LLM provider for the load (default: the setting).")] = None,
    port: Annotated[int, typer.Option(help="First of two loopback ports for the servers.")] = 7870,
    workdir: Workdir = None,
    json_out: JsonOut = None,
) -> None:
    """Fuzz every route from the OpenAPI spec (0 server errors, 0 schema violations), send hostile
    requests (oversized bodies, foreign Origin and Host, a 100k-character query, PDF bombs: each
    refused in time), then N clients mixing /query, /query/stream and /search (0 errors; /health
    p95 under 50 ms throughout)."""
    from arag.stress.api import run_api_stress

    r = run_api_stress(
        library=library,
        papers=papers,
        workdir=workdir,
        port=port,
        fuzz_examples=fuzz_examples,
        clients=clients,
        duration_s=duration,
        llm=llm,
        echo=_echo,
    )
    table = Table(
        title=f"stress api ({r.papers} papers, {r.library})", show_header=False, title_justify="left"
    )
    if r.fuzz is not None:
        f = r.fuzz
        table.add_row(
            "fuzz",
            f"{f.operations_tested} operations, {f.cases} cases in {f.seconds:.0f} s: "
            f"{f.server_errors} server errors, {f.schema_violations} schema violations, "
            f"{f.transport_errors} transport errors; "
            f"ready after: {f.ready_after}",
        )
    if r.hardening is not None:
        for c in r.hardening.cases:
            mark = "ok" if c.passed else "FAIL"
            table.add_row(f"  {c.name}", f"{mark}: {c.got} in {c.seconds:.2f} s; {c.detail}".rstrip("; "))
        table.add_row(
            "hardening",
            f"ready after: {r.hardening.healthy_after}; library unchanged: {r.hardening.papers_unchanged}",
        )
    if r.load is not None:
        ld = r.load
        table.add_row(
            "load",
            f"{ld.clients} clients, {ld.wall_s:.0f} s, LLM {r.llm}: {ld.requests} requests, "
            f"{ld.errors} errors, {ld.throughput_rps:.1f}/s",
        )
        for rs in ld.routes:
            table.add_row(
                f"  {rs.route}",
                f"{rs.requests} requests, {rs.errors} errors; p50 {rs.latency.p50_ms:.0f} ms, "
                f"p95 {rs.latency.p95_ms:.0f} ms",
            )
        h = ld.health
        table.add_row(
            "  /health",
            f"p50 {h.p50_ms:.1f} ms, p95 {h.p95_ms:.1f} ms, max {h.max_ms:.1f} ms "
            f"({ld.health_errors} errors)",
        )
    console.print(table)
    _finish(r, r.passed, r.problems, json_out)
