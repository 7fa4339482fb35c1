"""``arag ask`` and ``arag chat``: answers with numbered sources, the agent's stages shown as they run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

from arag.cli.common import console, err_console, handle_errors, load_settings
from arag.corpus.arxiv_ids import arxiv_url
from arag.errors import InputError
from arag.settings import Settings
from arag.text import section_path

if TYPE_CHECKING:
    from arag.api import Library
    from arag.records import Answer, Citation, NodeEvent

PROVIDERS = ("llama-cpp", "openai", "extractive")
_CLOSEST = "\n\nClosest papers in the library:"

LlmOpt = Annotated[
    str | None,
    typer.Option("--llm", help="The LLM: llama-cpp (local), openai (an OpenAI-compatible endpoint) or "
                 "extractive (no LLM: the best-supported sentences)."),
]  # fmt: skip
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="The model: a packaged name or a .gguf path (llama-cpp), or the "
                 "endpoint's model name (openai)."),
]  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add the ``ask`` and ``chat`` commands to the top-level app."""
    app.command("ask")(ask_cmd)
    app.command("chat")(chat_cmd)


def llm_overrides(llm: str | None, model: str | None) -> dict[str, Any]:
    """Settings overrides for ``--llm`` / ``--model``; an InputError for an unknown provider."""
    if llm is not None and llm not in PROVIDERS:
        raise InputError(
            f"unknown LLM provider {llm!r}", where="--llm", fix=f"use one of {', '.join(PROVIDERS)}"
        )
    over: dict[str, Any] = {}
    if llm is not None:
        over["provider"] = llm
    if model is not None:
        over["model"] = model
    return {"llm": over} if over else {}


class _AssemblyBar:
    """A progress bar for a packaged model's first assembly, shown only when one happens."""

    def __init__(self) -> None:
        self.bar: Progress | None = None

    def start(self, total: int) -> None:
        self.bar = Progress(
            TextColumn("[bold]preparing the language model (once)"),
            BarColumn(),
            TaskProgressColumn(),
            TimeRemainingColumn(),
            console=err_console,
        )
        self.bar.start()
        self.bar.add_task("assemble", total=total)

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.advance(self.bar.task_ids[0], n)


@contextmanager
def _assembly_bar() -> Iterator[_AssemblyBar]:
    bar = _AssemblyBar()
    try:
        yield bar
    finally:
        if bar.bar is not None:
            bar.bar.stop()


def open_library(settings: Settings) -> Library:
    """The library, with a bar while a packaged LLM is assembled the first time."""
    from arag.api import Library

    with _assembly_bar() as bar:
        return Library(settings, progress=bar)


def check_papers(settings: Settings, papers: list[str] | None) -> list[str] | None:
    """``--paper`` ids checked against the library before any model loads."""
    from arag.api import check_paper_ids
    from arag.library.manage import list_papers

    if not papers:
        return None
    return check_paper_ids(papers, {r.id for r in list_papers(settings)}, where="--paper")


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def stage_line(e: NodeEvent) -> str:
    """One agent step as a console line (rich markup): node, time, decision, counts."""
    counts = " ".join(f"{k}={_number(v)}" for k, v in e.counts.items())
    line = f"[dim]· {e.node:<12} {e.ms:>8.1f} ms[/]  {escape(e.decision)}"
    return line + (f"  [dim]{escape(counts)}[/]" if counts else "")


def print_stage(e: NodeEvent) -> None:
    console.print(stage_line(e), highlight=False, soft_wrap=True)


def print_answer(a: Answer) -> None:
    """The short answer in bold, the explanation with its [n] markers, then the numbered sources (or an
    abstention, in yellow, with the closest papers)."""
    console.print()
    if a.abstained:
        console.print("[bold yellow]Not in the library.[/]", highlight=False)
        console.print(f"[yellow]{escape(a.text.split(_CLOSEST)[0])}[/]", highlight=False, soft_wrap=True)
        if a.closest:
            console.print("\n[bold]Closest papers[/]")
            for p in a.closest:
                link = arxiv_url(p.paper_id)
                tail = f" · {link}" if link else ""
                console.print(
                    f"  - [cyan]{p.paper_id}[/] {escape(p.title)}{tail} · score {p.score:.3f}",
                    highlight=False,
                    soft_wrap=True,
                )
    elif a.form == "literature" and a.groups:
        print_literature(a)
    else:
        if a.short_answer:
            console.print(f"[bold]{escape(a.short_answer)}[/]", highlight=False, soft_wrap=True)
        console.print(escape(a.text), highlight=False, soft_wrap=True)
        if a.citations:
            console.print("\n[bold]Sources[/]")
        scores = {(c.n, c.chunk_id): c.score for c in a.chunks if c.n is not None}
        for c in sorted(a.citations, key=lambda c: c.n):
            parts = [escape(c.title)]
            if c.section:
                parts.append(escape(section_path(c.section)))
            link = arxiv_url(c.paper_id)
            parts.append(link or c.paper_id)
            if (c.n, c.chunk_id) in scores:
                parts.append(f"score {scores[c.n, c.chunk_id]:.3f}")
            support = f"support {c.support:.2f}" + ("" if c.supported else " [yellow](unsupported)[/]")
            parts.append(support)
            console.print(f"  [bold][{c.n}][/] " + " · ".join(parts), highlight=False, soft_wrap=True)
    extra = f", {a.retries} retry" if a.retries else ""
    took = f"{a.total_ms:.0f} ms" if a.total_ms < 1000 else f"{a.total_ms / 1000:.1f} s"
    if a.llm_cached_calls:
        took += f" ({a.llm_cached_calls} LLM replies from the cache)"
    console.print(f"[dim]{a.route} · {a.mode}{extra} · {took}[/]", highlight=False)


def print_literature(a: Answer) -> None:
    """A literature answer: the overview, each group's cited points under its label, then the papers
    with their arXiv links."""
    console.print(f"[bold]{escape(a.short_answer)}[/]", highlight=False, soft_wrap=True)
    group_texts = {g.text for g in a.groups}
    for para in a.text.split("\n\n"):
        if para and para not in group_texts:
            console.print(escape(para), highlight=False, soft_wrap=True)
            console.print()
    for g in a.groups:
        if len(a.groups) > 1:  # one group needs no label
            console.print(f"[bold cyan]{escape(g.label)}[/]", highlight=False, soft_wrap=True)
        console.print(escape(g.text), highlight=False, soft_wrap=True)
        console.print()
    # The papers drawn on, once each with every [n] that cites it: a compound question's parts, or an
    # overview sentence citing another of its passages, give one paper several numbers.
    console.print("[bold]Sources[/] (the papers, each with its " + escape("[n]") + " markers)")
    for line in literature_sources(a):
        console.print("  " + line, highlight=False, soft_wrap=True)


def literature_sources(a: Answer) -> list[str]:
    """One line (rich markup) per paper a literature answer cites, in the order of its first [n]."""
    by_paper: dict[str, list[Citation]] = {}
    for c in sorted(a.citations, key=lambda c: c.n):
        by_paper.setdefault(c.paper_id, []).append(c)
    lines = []
    for pid, cites in by_paper.items():
        parts = [escape(cites[0].title), arxiv_url(pid) or pid]
        labels = [g.label for g in a.groups if pid in g.paper_ids]
        if len(a.groups) > 1 and labels:  # one group needs no label
            parts.append(escape("; ".join(labels)))
        low, high = min(c.support for c in cites), max(c.support for c in cites)
        support = f"support {low:.2f}" if low == high else f"support {low:.2f} to {high:.2f}"
        unsupported = [f"[{c.n}]" for c in cites if not c.supported]
        if unsupported:
            support += f" [yellow](unsupported: {' '.join(unsupported)})[/]"
        parts.append(support)
        marks = " ".join(f"[{c.n}]" for c in cites)
        lines.append(f"[bold]{marks}[/] " + " · ".join(parts))
    return lines


@handle_errors
def ask_cmd(
    question: Annotated[str, typer.Argument(help="A research question, in your words.")],
    paper: Annotated[
        list[str] | None,
        typer.Option("--paper", help="Answer only from these paper ids (repeatable; see `arag papers`)."),
    ] = None,
    llm: LlmOpt = None,
    model: ModelOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the whole result as JSON (and no stage lines).")
    ] = False,
) -> None:
    """Answer a question from the library, with numbered sources; the agent's stages show as they run."""
    from arag.agent.graph import validate_question

    settings = load_settings(**llm_overrides(llm, model))
    validate_question(question, settings.agent.max_question_chars)
    papers = check_papers(settings, paper)
    with open_library(settings) as lib:
        answer = lib.ask(question, papers=papers, on_event=None if as_json else print_stage)
    if as_json:
        print(answer.model_dump_json(indent=2))
        return
    print_answer(answer)


def _print_history(settings: Settings, session: str | None) -> None:
    from arag.agent.chat_history import ChatHistory, chat_db, validate_session_id

    if session is None:
        raise InputError("--history needs a session", where="--history", fix="add --session ID")
    sid = validate_session_id(session)
    exchanges = ChatHistory(chat_db(settings)).exchanges(sid)
    if not exchanges:
        raise InputError(
            f"no session {sid!r} in {chat_db(settings)}",
            where="--session",
            fix=f'start it with: arag chat --session {sid} "your question"',
        )
    for e in exchanges:
        console.print(f"[bold green]#{e.n} you:[/] {escape(e.message)}", highlight=False, soft_wrap=True)
        if e.standalone != e.message:
            console.print(f"  [cyan]→ standalone:[/] {escape(e.standalone)}", highlight=False, soft_wrap=True)
        if e.answer is not None:
            short = f"[bold]{escape(e.answer.short_answer)}[/] " if e.answer.short_answer else ""
            console.print(f"  [bold]arag:[/] {short}{escape(e.answer.text)}", highlight=False, soft_wrap=True)


def _turn(lib: Library, session: str, message: str, rewrite: bool) -> None:
    if rewrite:
        rw = lib.rewrite(session, message)
        standalone = rw.question
        if rw.changed:
            console.print(
                f"[cyan]→ standalone:[/] {escape(rw.question)}  [dim]({rw.how})[/]",
                highlight=False,
                soft_wrap=True,
            )
    else:
        standalone = message.strip()
    answer = lib.chat(session, message, standalone=standalone, on_event=print_stage)
    print_answer(answer)


@handle_errors
def chat_cmd(
    message: Annotated[
        str | None, typer.Argument(help="One message (a single turn); without it, chat interactively.")
    ] = None,
    session: Annotated[
        str | None, typer.Option("--session", help="The session to continue or start (default: a new one).")
    ] = None,
    rewrite: Annotated[
        bool,
        typer.Option(
            "--rewrite/--no-rewrite",
            help="Rewrite follow-ups ('how is it trained?') into standalone questions from the history.",
        ),
    ] = True,
    history: Annotated[bool, typer.Option("--history", help="Print the session's turns and exit.")] = False,
    llm: LlmOpt = None,
    model: ModelOpt = None,
) -> None:
    """Chat over the library. Follow-ups are rewritten into standalone questions from the session's
    earlier ones (by the LLM when there is one, else by rules); sessions persist in the data directory.
    Type /exit (or end the input) to leave."""
    from arag.agent.chat_history import new_session_id, validate_session_id
    from arag.agent.graph import validate_question

    if history:
        _print_history(load_settings(), session)
        return
    sid = validate_session_id(session) if session is not None else new_session_id()
    settings = load_settings(**llm_overrides(llm, model))
    if message is not None:
        validate_question(message, settings.agent.max_question_chars)
    with open_library(settings) as lib:
        if message is not None:
            _turn(lib, sid, message, rewrite)
            console.print(f"[dim]session {sid}: continue with --session {sid}[/]", highlight=False)
            return
        console.print(f"[dim]session {sid} · /exit to leave[/]", highlight=False)
        while True:
            console.print("[bold green]you>[/] ", end="")
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:
                line = ""
            if not line:
                console.print()
                break
            text = line.strip()
            if text in ("/exit", "/quit"):
                break
            if not text:
                continue
            try:
                _turn(lib, sid, text, rewrite)
            except InputError as exc:
                err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            except KeyboardInterrupt:
                err_console.print("[yellow]interrupted[/]")
                break
    console.print(f"[dim]session {sid}: continue with --session {sid}[/]", highlight=False)
