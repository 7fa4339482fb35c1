"""Shared CLI plumbing: settings, logging, error translation, progress bars."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from arag.errors import AragError, InputError
from arag.library.build import Progress as BuildProgress
from arag.settings import Settings, get_settings

console = Console()
err_console = Console(stderr=True)

# ``--json PATH`` of the commands that measure something (arag bench, arag llm check).
FiguresJson = Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON.")]

P = ParamSpec("P")
R = TypeVar("R")


def load_settings(**overrides: Any) -> Settings:
    """Settings for a command, with logging configured from them."""
    settings = get_settings(**overrides)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False)],
        force=True,
    )
    return settings


def write_figures(path: Path | None, figures: BaseModel) -> None:
    """Write ``figures`` as JSON to ``path`` and say so; nothing without a path."""
    if path:
        path.write_text(figures.model_dump_json(indent=2))
        console.print(f"wrote {path}")


def check_text_args(values: dict[str, Any]) -> None:
    """An InputError for a text argument that is not valid Unicode: Python hands bytes of another
    encoding on the command line over as lone surrogates, which nothing downstream can encode."""
    for name, value in values.items():
        for v in value if isinstance(value, list | tuple) else (value,):
            if not isinstance(v, str):
                continue  # paths may hold any bytes the file system allows
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise InputError(
                    f"the {name.replace('_', '-')} given is not UTF-8 text "
                    "(the terminal sent bytes of another encoding)",
                    where=f"the {name.replace('_', '-')} argument",
                    fix="type it in a UTF-8 terminal (a UTF-8 locale, e.g. LANG=C.UTF-8), or re-type the "
                    "non-ASCII characters",
                ) from None


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn an AragError into its message on stderr and its exit code; Ctrl-C into exit 130.
    Text arguments that are not valid Unicode are refused first (exit 8)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            check_text_args(dict(kwargs))
            return fn(*args, **kwargs)
        except AragError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err_console.print(
                "[yellow]interrupted: progress so far is saved; run the command again to resume[/]"
            )
            raise typer.Exit(130) from None

    return wrapper


class PlainProgress:
    """Progress as plain lines, for a stderr that is not a terminal (a log file, CI): rich draws no
    bar there, and a 30-minute training printed nothing until it ended. A line at the start, at each
    tenth of the work (``min_gap_s`` apart at least: a fast stage is not ten lines), every
    ``interval_s`` seconds between tenths, and where it ended."""

    def __init__(
        self,
        label: str,
        unit: str,
        write: Callable[[str], None],
        *,
        interval_s: float = 60.0,
        min_gap_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.unit, self.write = label, unit, write
        self.interval_s, self.min_gap_s, self.clock = interval_s, min_gap_s, clock
        self.total: int | None = None
        self.done = 0
        self.t0 = self.last = clock()
        self.tenths = 0
        self.reported = 0

    def start(self, total: int) -> None:
        self.total = total
        self.write(f"{self.label}: 0/{total} {self.unit}")

    def advance(self, n: int) -> None:
        self.done += n
        now = self.clock()
        tenths = self.done * 10 // self.total if self.total else 0
        gap = now - self.last
        if (tenths > self.tenths and gap >= self.min_gap_s) or gap >= self.interval_s:
            self.tenths = tenths
            self.report(now)

    def finish(self) -> None:
        if self.done != self.reported:
            self.report(self.clock())

    def report(self, now: float) -> None:
        self.last, self.reported = now, self.done
        elapsed = now - self.t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        of = f"/{self.total}" if self.total else ""
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        eta = ""
        if self.total and rate > 0 and self.done < self.total:
            eta = f", ETA {format_seconds((self.total - self.done) / rate)}"
        self.write(
            f"{self.label}: {self.done}{of} {self.unit}{pct}, {rate:.3g} {self.unit}/s, "
            f"{format_seconds(elapsed)} elapsed{eta}"
        )


def format_seconds(seconds: float) -> str:
    """``seconds`` as h:mm:ss."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@contextmanager
def build_progress(label: str, unit: str = "papers") -> Iterator[BuildProgress]:
    """A rich progress bar (count, rate, ETA) wired to the builder's callbacks; plain lines
    (:class:`PlainProgress`) where stderr is not a terminal."""
    if not err_console.is_terminal:
        plain = PlainProgress(
            label, unit, lambda line: err_console.print(line, highlight=False, markup=False, soft_wrap=True)
        )
        try:
            yield BuildProgress(start=plain.start, advance=plain.advance)
        finally:
            plain.finish()
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err_console, transient=False) as bar:
        task = bar.add_task(label, total=None, rate="")

        def start(total: int) -> None:
            bar.update(task, total=total)

        def advance(n: int) -> None:
            bar.advance(task, n)
            t = bar.tasks[task]
            if t.elapsed:
                bar.update(task, rate=f"{t.completed / t.elapsed:.1f} {unit}/s")

        yield BuildProgress(start=start, advance=advance)
