"""SIGKILL during ``arag library build --rebuild``: a library of QASPER papers plus one added PDF is
rebuilt and killed at seeded points spread over a reference rebuild's run; after every kill the
library must open whole (every paper, the PDF's included, in the old generation or the new one) and
a final rebuild must finish with the PDF paper present and no generation left over.

A rebuild writes the next generation beside the current one and switches with one rename (see
:mod:`arag.library.rebuild`), so a kill before the rename leaves the old library, after it the new
one; the half-built generation is resumed by the next rebuild, the old one removed.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

from pydantic import BaseModel

from arag.settings import Settings, find_shared_dir
from arag.stress.common import (
    Echo,
    build_overrides,
    clear,
    cli_command,
    cli_env,
    consistency_problems,
    kill_landed,
    library_settings,
    quiet,
    run_logged,
    snapshot,
    tail,
)


class RebuildKill(BaseModel):
    """One rebuild meant to be killed, and the library it left."""

    attempt: int
    target_s: float  # when the kill was due, in seconds after the rebuild started
    killed_at_s: float | None  # None: the rebuild finished first
    exit_code: int | None
    generation: str  # the generation the library is in afterwards ("" : the data dir's own)
    switched: bool  # another generation than before the attempt
    pending: bool  # a half-built generation waits for the next rebuild
    papers: int
    chunks: int
    pdf_present: bool
    check_seconds: float
    problems: list[str]


class RebuildCrashReport(BaseModel):
    """What the SIGKILL-during-rebuild case found."""

    papers: int  # QASPER papers of the library
    pdf: str
    pdf_id: str | None
    expected_papers: int
    kills_requested: int
    kills_done: int
    seed: int
    reference_seconds: float
    kills: list[RebuildKill]
    final_seconds: float
    final_papers: int
    final_chunks: int
    final_pdf_present: bool
    generations_left: int  # generation folders after the final rebuild (1: only the library's)
    problems: list[str]
    passed: bool
    seconds: float


def _pdf(pdf: Path | None) -> Path | None:
    if pdf is not None:
        return Path(pdf)
    shared = find_shared_dir()
    found = sorted((shared / "pdfs").glob("*.pdf")) if shared is not None else []
    return found[0] if found else None


def _check(settings: Settings, expected: set[str], pdf_id: str | None) -> tuple[list[str], int, int, bool]:
    """Problems of the library as it opens now, papers, chunks, and whether the PDF paper is in it."""
    snap = snapshot(settings)
    problems = consistency_problems(snap, settings.store.papers_per_batch, after_kill=False)
    have = set(snap.recorded)
    if have != expected:
        missing, extra = sorted(expected - have), sorted(have - expected)
        problems.append(f"papers: {len(missing)} missing (e.g. {missing[:2]}), {len(extra)} unexpected")
    if not snap.index_exists:
        problems.append("the library does not open")
    pdf_present = pdf_id is not None and pdf_id in have and pdf_id in set(snap.chunks.values())
    if not pdf_present:
        problems.append(f"the added PDF paper {pdf_id} is not in the library")
    return problems, len(have), len(snap.chunks), pdf_present


def run_rebuild_kill_test(
    work: Path,
    papers: int = 100,
    kills: int = 5,
    seed: int = 0,
    embedder: str = "hash",
    *,
    pdf: Path | None = None,
    papers_per_batch: int | None = None,
    timeout_s: float = 1800.0,
    echo: Echo = quiet,
) -> RebuildCrashReport:
    """Build ``papers`` QASPER papers and add ``pdf`` (default: the first of ../shared/pdfs) in
    ``work``, time one rebuild, then SIGKILL ``kills`` rebuilds and check the library after each."""
    t_all = time.perf_counter()
    lib, logs = work / "rebuild-library", work / "rebuild-logs"
    clear(lib, logs)
    logs.mkdir(parents=True)
    env = cli_env(lib, **build_overrides(embedder, papers, papers_per_batch))
    settings = library_settings(lib, embedder, papers_per_batch)
    problems: list[str] = []
    source = _pdf(pdf)
    report = RebuildCrashReport(
        papers=papers,
        pdf=source.name if source is not None else "",
        pdf_id=None,
        expected_papers=0,
        kills_requested=kills,
        kills_done=0,
        seed=seed,
        reference_seconds=0.0,
        kills=[],
        final_seconds=0.0,
        final_papers=0,
        final_chunks=0,
        final_pdf_present=False,
        generations_left=0,
        problems=problems,
        passed=False,
        seconds=0.0,
    )
    if source is None or not source.is_file():
        problems.append("no PDF to add (put ../shared/pdfs beside the repository, or pass one)")
        return report

    # The library: QASPER papers, then the PDF added from a copy that is deleted afterwards, so
    # every rebuild must take it from the library's own kept file.
    echo(f"rebuild case: building {papers} papers and adding {source.name} in {lib}")
    inbox = work / "rebuild-inbox"
    inbox.mkdir(exist_ok=True)
    copy = inbox / source.name
    shutil.copyfile(source, copy)
    for name, cmd in (
        ("build", cli_command("library", "build")),
        ("add", cli_command("library", "add", str(copy))),
    ):
        code = run_logged(cmd, env, logs / f"{name}.log", work, timeout_s)
        if code != 0:
            problems.append(f"`arag library {name}` exited with {code}: {tail(logs / f'{name}.log')}")
            return report
    copy.unlink()
    first = snapshot(settings)
    expected = set(first.recorded)
    pdf_ids = [p for p in expected if p.startswith("pdf:")]
    report.pdf_id = pdf_ids[0] if pdf_ids else None
    report.expected_papers = len(expected)

    echo("rebuild case: a reference rebuild")
    t0 = time.perf_counter()
    code = run_logged(
        cli_command("library", "build", "--rebuild"), env, logs / "reference.log", work, timeout_s
    )
    report.reference_seconds = round(time.perf_counter() - t0, 3)
    if code != 0:
        problems.append(f"the reference rebuild exited with {code}: {tail(logs / 'reference.log')}")
        return report
    problems += [f"reference: {p}" for p in _check(settings, expected, report.pdf_id)[0]]

    rng = random.Random(seed)
    span = 0.95 * report.reference_seconds / kills
    targets = [span * (i + rng.uniform(0.05, 0.95)) for i in range(kills)]
    attempt, outran = 0, 0
    while report.kills_done < kills and attempt < 3 * kills:
        attempt += 1
        # A rebuild that outran its kill (a quieter machine) is tried again, a fifth earlier.
        target = targets[report.kills_done] * 0.8**outran
        before = settings.generation()
        log_path = logs / f"attempt-{attempt}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                cli_command("library", "build", "--rebuild"),
                env=env,
                stdout=out,
                stderr=out,
                cwd=work,
                start_new_session=True,
            )
            t0 = time.perf_counter()
            killed_at: float | None = None
            while proc.poll() is None:
                now = time.perf_counter() - t0
                if now >= target:
                    # A rebuild that ended on its own just before the kill finished first.
                    killed_at = now if kill_landed(proc) else None
                    break
                time.sleep(min(0.005, max(target - now, 0.0)))
        t_check = time.perf_counter()
        found, n_papers, n_chunks, pdf_present = _check(settings, expected, report.pdf_id)
        record = RebuildKill(
            attempt=attempt,
            target_s=round(target, 3),
            killed_at_s=round(killed_at, 3) if killed_at is not None else None,
            exit_code=proc.returncode,
            generation=settings.generation(),
            switched=settings.generation() != before,
            pending=(lib / "generation.next").exists(),
            papers=n_papers,
            chunks=n_chunks,
            pdf_present=pdf_present,
            check_seconds=round(time.perf_counter() - t_check, 3),
            problems=found,
        )
        if killed_at is None and proc.returncode != 0:
            record.problems.append(f"the rebuild failed (exit {proc.returncode}): {tail(log_path)}")
        report.kills.append(record)
        report.kills_done += killed_at is not None
        outran = 0 if killed_at is not None else outran + 1
        problems += [f"attempt {attempt}: {p}" for p in record.problems]
        what = f"killed at {killed_at:.2f} s" if killed_at is not None else "finished before its kill"
        echo(
            f"rebuild attempt {attempt}: {what}; library in "
            f"{'the new' if record.switched else 'the old'} generation, {n_papers} papers, "
            f"PDF {'present' if pdf_present else 'MISSING'}, {len(record.problems)} problems"
        )
    if report.kills_done < kills:
        problems.append(f"only {report.kills_done} of {kills} kills landed in {attempt} rebuilds")

    echo("rebuild case: a final rebuild to the end")
    t0 = time.perf_counter()
    code = run_logged(cli_command("library", "build", "--rebuild"), env, logs / "final.log", work, timeout_s)
    report.final_seconds = round(time.perf_counter() - t0, 3)
    if code != 0:
        problems.append(f"the final rebuild exited with {code}: {tail(logs / 'final.log')}")
    found, report.final_papers, report.final_chunks, report.final_pdf_present = _check(
        settings, expected, report.pdf_id
    )
    problems += [f"final: {p}" for p in found]
    gens = lib / "generations"
    left = [d.name for d in gens.iterdir() if d.is_dir()] if gens.is_dir() else []
    report.generations_left = len(left)
    if left != [settings.generation()]:
        problems.append(f"final: generation folders {left}, the library is in {settings.generation()!r}")
    if (lib / "generation.next").exists():
        problems.append("final: a pending generation is still named after a finished rebuild")
    if (lib / "index").exists():
        problems.append("final: the first library's index is still in the data directory")
    report.passed = not problems
    report.seconds = round(time.perf_counter() - t_all, 3)
    return report
