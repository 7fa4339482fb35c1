"""``arag summarise`` and ``arag related``: research tools around one paper of the library."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from arag.cli.ask import LlmOpt, ModelOpt, check_papers, llm_overrides, open_library, print_stage
from arag.cli.common import console, handle_errors, load_settings
from arag.text import section_path

if TYPE_CHECKING:
    from arag.agent.related import RelatedPapers
    from arag.agent.summary import PaperSummary


def register(app: typer.Typer) -> None:
    """Add ``summarise`` and ``related`` to the top-level app."""
    app.command("summarise")(summarise_cmd)
    app.command("related")(related_cmd)


PaperArg = Annotated[str, typer.Argument(help="The paper's id (see `arag papers`), e.g. 1912.01214.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (and no stage lines).")]


def print_summary(s: PaperSummary) -> None:
    """The title, each part with its [n] markers, then the numbered passages they cite."""
    console.print(
        f"[bold]{escape(s.title)}[/] · {s.arxiv_url or s.paper_id}", highlight=False, soft_wrap=True
    )
    for p in s.parts:
        console.print()
        how = {"llm": "", "extractive": " [dim](sentences from the paper)[/]", "none": ""}[p.mode]
        console.print(f"[bold]{p.heading}[/]{how}", highlight=False)
        text = escape(p.text) if p.text else "[yellow]not stated in the paper's passages[/]"
        console.print(text, highlight=False, soft_wrap=True)
        if p.dropped:
            console.print(f"[dim]{p.dropped} unsupported sentence(s) dropped[/]", highlight=False)
    if s.sources:
        console.print("\n[bold]Sources[/]")
        for src in s.sources:
            where = escape(section_path(src.section)) if src.section else "abstract"
            excerpt = src.text if len(src.text) <= 240 else src.text[:240] + " …"
            console.print(
                f"  [bold][{src.n}][/] {where} · support {src.support:.2f}\n      {escape(excerpt)}",
                highlight=False,
                soft_wrap=True,
            )
    took = f"{s.total_ms / 1000:.1f} s" if s.total_ms >= 1000 else f"{s.total_ms:.0f} ms"
    console.print(f"[dim]{escape(s.llm)} · {took}[/]", highlight=False)


def print_related(r: RelatedPapers) -> None:
    """One paper per line: rank, id, title, link, then how it relates and the ranks that placed it."""
    console.print(
        f"Papers related to [bold]{escape(r.title)}[/] ({r.paper_id})", highlight=False, soft_wrap=True
    )
    if not r.papers:
        console.print("[yellow]The library holds no other paper.[/]")
    for i, p in enumerate(r.papers, 1):
        link = p.arxiv_url or p.paper_id
        console.print(
            f"\n[bold]{i}.[/] [cyan]{p.paper_id}[/] {escape(p.title)}"
            + (f" ({p.year})" if p.year else "")
            + f" · {link}",
            highlight=False,
            soft_wrap=True,
        )
        console.print(f"   {escape(p.relation)}", highlight=False, soft_wrap=True)
        shared = ", ".join(p.shared_terms) or "-"
        console.print(
            f"   [dim]vector rank {p.dense_rank} (cosine {p.cosine:.3f}) · term rank {p.term_rank} · "
            f"shared: {escape(shared)} · line: {p.relation_mode}[/]",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"\n[dim]{escape(r.method)}[/]", highlight=False, soft_wrap=True)


@handle_errors
def summarise_cmd(
    paper: PaperArg, llm: LlmOpt = None, model: ModelOpt = None, as_json: JsonOpt = False
) -> None:
    """Summarise a paper: problem, method, data, results and limits, every sentence cited to a passage
    of the paper and checked against it (unsupported sentences are dropped)."""
    settings = load_settings(**llm_overrides(llm, model))
    ids = check_papers(settings, [paper])  # before any model loads
    assert ids is not None
    with open_library(settings) as lib:
        summary = lib.summarise(ids[0], on_event=None if as_json else print_stage)
    if as_json:
        print(summary.model_dump_json(indent=2))
        return
    console.print()
    print_summary(summary)


@handle_errors
def related_cmd(
    paper: PaperArg,
    k: Annotated[int, typer.Option("-k", "--k", min=1, max=50, help="How many related papers.")] = 5,
    llm: LlmOpt = None,
    model: ModelOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Related work for a paper: the nearest papers by abstract vectors and shared terms (fused by
    reciprocal rank fusion), one line each on how they relate, with arXiv links."""
    settings = load_settings(**llm_overrides(llm, model))
    ids = check_papers(settings, [paper])
    assert ids is not None
    with open_library(settings) as lib:
        rel = lib.related(ids[0], k=k)
    if as_json:
        print(rel.model_dump_json(indent=2))
        return
    print_related(rel)
