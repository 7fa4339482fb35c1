"""Crash-resume: SIGKILL a library build at random points, check the library after every kill,
and check that the resumed build ends with exactly the chunks of an uninterrupted one.

Leftovers of the batch in flight. The build writes a batch (one upsert of all its chunks, then
one delete of the papers' other, stale chunks), flushes, and only then records its papers in the
build state. A kill after the upsert and before the record leaves chunks of papers the state does
not know; the resumed build starts at that same batch and rewrites them. So, after a kill, at most one batch
of unrecorded papers (``store.papers_per_batch``) may have chunks in the store, and each of those
papers must be whole (the upsert is one write-ahead-log record); once a build finishes there must
be none. Topic payloads are written to the store before the state, so they are only compared once
a build has finished.

Where the kills land. The kill points are drawn (seeded) one in each equal slice of the reference
build's working time. Each is turned into a phase of the build (the papers the reference had
recorded by then, plus the seconds since), and the killed build is polled and killed in that same
phase, so a busier or idler machine moves the kill less than a plain timer would. A build that
finishes before its kill leaves nothing to kill: the data dir is wiped and the run starts over,
aiming that kill earlier each time (a warm re-run can outrun the cold reference's timeline).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import shutil
import sqlite3
import statistics
import subprocess
import time
from pathlib import Path

from pydantic import BaseModel

from arag.settings import Settings
from arag.stress.common import (
    Echo,
    LibrarySnapshot,
    build_overrides,
    clear,
    cli_command,
    cli_env,
    consistency_problems,
    copy_library,
    kill_landed,
    library_settings,
    make_workdir,
    quiet,
    run_logged,
    snapshot,
    tail,
)
from arag.stress.rebuild_kill import RebuildCrashReport


def check_consistency(settings: Settings, *, after_kill: bool = False) -> list[str]:
    """Problems found in the library of ``settings.data_dir`` (empty: consistent).

    The index opens and answers a search; every paper in the build state has exactly its
    recorded number of chunks in the store; no chunk belongs to an unrecorded paper, except,
    right after a kill (``after_kill``), the papers of the one batch in flight.
    """
    return consistency_problems(snapshot(settings), settings.store.papers_per_batch, after_kill=after_kill)


class KillRecord(BaseModel):
    """One build attempt that was meant to be killed, and the library it left (an attempt that
    finished first has ``killed_at_s`` None; the run then starts over from an empty data dir)."""

    attempt: int
    target_s: float  # the point of the reference build's timeline this kill aims at
    aim_papers: int  # papers the reference had recorded at target_s ...
    aim_after_s: float  # ... and how long before: the kill comes as long after this build has as many
    killed_at_s: float | None  # None: the attempt ended before the kill
    exit_code: int | None
    papers_recorded: int
    chunks_in_store: int
    in_flight_papers: int  # unrecorded papers with chunks in the store
    in_flight_chunks: int
    check_seconds: float
    problems: list[str]


class CrashReport(BaseModel):
    """What ``arag stress crash`` found."""

    papers: int
    kills_requested: int
    kills_done: int
    seed: int
    embedder: str
    papers_per_batch: int
    workdir: str
    reference_seconds: float
    reference_startup_seconds: float
    reference_timeline: dict[int, float]  # papers recorded -> seconds after the start
    reference_papers: int
    reference_chunks: int
    kills: list[KillRecord]
    final_seconds: float
    final_papers: int
    final_chunks: int
    missing_chunk_ids: int
    extra_chunk_ids: int
    chunk_ids_equal: bool
    topics_equal: bool
    problems: list[str]
    passed: bool
    seconds: float
    # The SIGKILL-during-rebuild case, when it ran (`arag stress crash --rebuild-kills N`).
    rebuild: RebuildCrashReport | None = None


def _kill_targets(startup: float, total: float, kills: int, rng: random.Random) -> list[float]:
    """Increasing points of the reference build's timeline, one in each of ``kills`` equal slices
    of its working time (after start-up, up to 95 %: the very end is left for the final attempt)."""
    span = 0.95 * max(total - startup, 0.05) / kills
    return [startup + span * (i + rng.uniform(0.1, 0.9)) for i in range(kills)]


def _earlier(target: float, startup: float, outruns: int) -> float:
    """``target`` moved towards the end of start-up after ``outruns`` attempts finished before their
    kill. A warm re-run (modules and corpus in the page cache) can be quicker than the cold
    reference, most of all in the short last phase of a small build, and would outrun the same aim
    every time; each miss aims 40% earlier, so a kill always lands within a few attempts."""
    return startup + (target - startup) * 0.6**outruns


def _recorded_count(state_db: Path) -> int | None:
    """Papers the build state records now (None: not readable yet)."""
    if not state_db.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(state_db, timeout=0.2)) as db:
            return int(db.execute("SELECT count(*) FROM papers").fetchone()[0])
    except sqlite3.Error:
        return None


def _phase(timeline: dict[int, float], target: float, startup: float) -> tuple[int, float]:
    """Where the reference build was at ``target``: papers recorded, and seconds since it had them
    (since its start-up for none)."""
    done = [(n, t) for n, t in timeline.items() if n > 0 and t <= target]
    n, since = max(done) if done else (0, startup)
    return n, max(target - since, 0.0)


def _run_attempt(
    cmd: list[str],
    env: dict[str, str],
    log_path: Path,
    work: Path,
    state_db: Path,
    aim: tuple[int, float],
    recorded: int,
    startup: float,
    timeout_s: float,
) -> tuple[float | None, int | None]:
    """Run one build and SIGKILL it ``aim[1]`` seconds after it has recorded ``aim[0]`` papers (or,
    when it resumes past that, that long after its start-up); (seconds at the kill, exit code)."""
    papers, after = aim
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, cwd=work, start_new_session=True)
        t0 = time.perf_counter()
        anchor = t0 + startup if papers <= recorded else None
        while proc.poll() is None:
            now = time.perf_counter()
            if anchor is None and (_recorded_count(state_db) or 0) >= papers:
                anchor = now
            if (anchor is not None and now >= anchor + after) or now - t0 > timeout_s:
                # A build that ended on its own just before the kill finished first: the attempt is
                # made again, earlier.
                return (now - t0 if kill_landed(proc) else None), proc.returncode
            wait = 0.02 if anchor is None else min(0.02, max(anchor + after - now, 0.0))
            time.sleep(wait)
    return None, proc.returncode


def _compare_to_reference(snap: LibrarySnapshot, ref: dict[str, set[str]]) -> list[str]:
    """Every paper in the store holds exactly the reference's chunks (all of them or none)."""
    problems = []
    for pid, ids in sorted(snap.by_paper().items()):
        want = ref.get(pid)
        if want is None:
            problems.append(f"paper {pid} is in the store but not in the reference build")
        elif ids != want:
            problems.append(
                f"paper {pid}: {len(ids & want)} of its {len(want)} chunks, {len(ids - want)} foreign"
            )
    for pid, n in snap.recorded.items():
        if pid in ref and n != len(ref[pid]):
            problems.append(f"paper {pid}: recorded with {n} chunks, the reference has {len(ref[pid])}")
    return problems


def run_crash_test(
    papers: int = 100,
    kills: int = 5,
    seed: int = 0,
    embedder: str = "hash",
    workdir: Path | None = None,
    *,
    papers_per_batch: int | None = None,
    timeout_s: float = 1800.0,
    echo: Echo = quiet,
) -> CrashReport:
    """Build ``papers`` QASPER papers once uninterrupted and once killed ``kills`` times; compare.

    ``papers_per_batch`` overrides the store setting for both builds (None: the configured one).
    The workdir holds both data directories and the logs; a temporary one is removed on success.
    """
    t_all = time.perf_counter()
    library_settings(Path("unused"), embedder, papers_per_batch)  # invalid settings raise before any work
    work, temporary = make_workdir(workdir, "arag-stress-crash-")
    ref_dir, crash_dir, logs = work / "reference", work / "crashed", work / "logs"
    clear(ref_dir, crash_dir, logs)
    logs.mkdir(parents=True)
    overrides = build_overrides(embedder, papers, papers_per_batch)
    ref_settings = library_settings(ref_dir, embedder, papers_per_batch)
    settings = library_settings(crash_dir, embedder, papers_per_batch)
    cmd = cli_command("library", "build")
    problems: list[str] = []

    # The reference: its start-up (imports, corpus, model: until the state file appears) and its work.
    echo(f"reference build of {papers} papers ({embedder}) in {ref_dir}")
    ref_log = logs / "reference.log"
    t0 = time.perf_counter()
    startup: float | None = None
    timeline: dict[int, float] = {}  # papers recorded -> when the reference first had them
    with ref_log.open("wb") as log:
        proc = subprocess.Popen(
            cmd, env=cli_env(ref_dir, **overrides), stdout=log, stderr=log, cwd=work, start_new_session=True
        )
        state_db = ref_dir / "library.sqlite3"
        while proc.poll() is None:
            now = time.perf_counter() - t0
            if startup is None and state_db.exists():
                startup = now
            n = _recorded_count(state_db)
            if n is not None:
                timeline.setdefault(n, now)
            if time.perf_counter() - t0 > timeout_s:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.02)
    ref_seconds = time.perf_counter() - t0
    startup = startup if startup is not None else 0.0
    if proc.returncode != 0:
        problems.append(f"the reference build exited with {proc.returncode}: {tail(ref_log)}")
        return _report_failed_reference(
            papers, kills, seed, embedder, ref_settings, work, ref_seconds, startup, problems, t_all
        )
    ref = snapshot(ref_settings)
    problems += [f"reference: {p}" for p in check_consistency(ref_settings)]
    ref_by_paper = ref.by_paper()
    echo(f"reference: {len(ref.recorded)} papers, {len(ref.chunks)} chunks in {ref_seconds:.1f} s")

    rng = random.Random(seed)
    targets = _kill_targets(startup, ref_seconds, kills, rng)
    recorded_at = sorted(t for n, t in timeline.items() if n > 0)
    gaps = [b - a for a, b in itertools.pairwise(recorded_at)]
    batch_s = statistics.median(gaps) if gaps else ref_seconds - startup  # a steady batch of the reference
    records: list[KillRecord] = []
    recorded, attempt, outruns = 0, 0, 0
    while len([r for r in records if r.killed_at_s is not None]) < kills and attempt < 3 * kills:
        attempt += 1
        target = _earlier(targets[len([r for r in records if r.killed_at_s is not None])], startup, outruns)
        # Kill where the reference was at ``target``: as many papers recorded, as long after.
        # Timing each kill from the build's own progress keeps it in place when the machine is
        # busier or idler than during the reference run.
        aim = _phase(timeline, target, startup)
        if aim[0] < recorded:
            # The last kill landed past this aim: kill inside the first batch this build writes.
            aim = (recorded, min(aim[1], batch_s))
        log_path = logs / f"attempt-{attempt}.log"
        env = cli_env(crash_dir, **overrides)
        killed_at, code = _run_attempt(
            cmd, env, log_path, work, settings.state_db, aim, recorded, startup, timeout_s
        )
        if killed_at is not None and killed_at > timeout_s:
            problems.append(f"attempt {attempt} hung: killed after {timeout_s:.0f} s")
            break
        record = _check_attempt(attempt, target, aim, killed_at, code, settings, ref_by_paper, work)
        records.append(record)
        recorded = record.papers_recorded
        problems += [f"attempt {attempt}: {p}" for p in record.problems]
        if killed_at is None and code != 0:
            problems.append(f"attempt {attempt} failed (exit {code}): {tail(log_path)}")
            break
        if killed_at is None:
            # The build outran its kill: the library is complete, so start over from nothing to
            # place the remaining kills (each kill is checked on its own; the final build is compared).
            echo(
                f"attempt {attempt} finished before its kill "
                f"({aim[0]} papers + {aim[1]:.2f} s): starting over"
            )
            shutil.rmtree(crash_dir)
            recorded, outruns = 0, outruns + 1
            continue
        outruns = 0
        echo(
            f"kill {len([r for r in records if r.killed_at_s is not None])}/{kills} at {killed_at:.2f} s: "
            f"{record.papers_recorded} papers recorded, {record.chunks_in_store} chunks, "
            f"{record.in_flight_papers} papers in flight, {len(record.problems)} problems"
        )
    kills_done = len([r for r in records if r.killed_at_s is not None])
    if kills_done < kills:
        problems.append(f"only {kills_done} of {kills} kills landed in {attempt} attempts")

    # The last attempt runs to the end.
    echo("resuming to the end")
    final_log = logs / "final.log"
    t0 = time.perf_counter()
    code = run_logged(cmd, cli_env(crash_dir, **overrides), final_log, work, timeout_s)
    if code is None:
        problems.append(f"the final resume did not finish in {timeout_s:.0f} s")
    elif code != 0:
        problems.append(f"the final resume exited with {code}: {tail(final_log)}")
    final_seconds = time.perf_counter() - t0

    final = snapshot(settings)
    problems += [
        f"final: {p}" for p in consistency_problems(final, settings.store.papers_per_batch, after_kill=False)
    ]
    want, have = set(ref.chunks), set(final.chunks)
    missing, extra = sorted(want - have), sorted(have - want)
    if missing or extra:
        problems.append(
            f"final: {len(missing)} reference chunks missing (e.g. {missing[:2]}), "
            f"{len(extra)} chunks the reference lacks (e.g. {extra[:2]})"
        )
    if final.recorded != ref.recorded:
        problems.append("final: the recorded papers or their chunk counts differ from the reference")
    topics_equal = final.state_topics == ref.state_topics
    if not topics_equal:
        n = sum(1 for p, t in ref.state_topics.items() if final.state_topics.get(p) != t)
        problems.append(f"final: {n} papers have another topic than in the reference build")
    passed = not problems
    report = CrashReport(
        papers=papers,
        kills_requested=kills,
        kills_done=kills_done,
        seed=seed,
        embedder=embedder,
        papers_per_batch=settings.store.papers_per_batch,
        workdir=str(work),
        reference_seconds=round(ref_seconds, 3),
        reference_startup_seconds=round(startup, 3),
        reference_timeline={n: round(t, 3) for n, t in sorted(timeline.items())},
        reference_papers=len(ref.recorded),
        reference_chunks=len(ref.chunks),
        kills=records,
        final_seconds=round(final_seconds, 3),
        final_papers=len(final.recorded),
        final_chunks=len(final.chunks),
        missing_chunk_ids=len(missing),
        extra_chunk_ids=len(extra),
        chunk_ids_equal=not missing and not extra,
        topics_equal=topics_equal,
        problems=problems,
        passed=passed,
        seconds=round(time.perf_counter() - t_all, 3),
    )
    if passed and temporary:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _check_attempt(
    attempt: int,
    target: float,
    aim: tuple[int, float],
    killed_at: float | None,
    exit_code: int | None,
    settings: Settings,
    ref_by_paper: dict[str, set[str]],
    work: Path,
) -> KillRecord:
    """Check a copy of the library an attempt left, so the next attempt resumes from the raw killed
    files (opening the shard replays its write-ahead log and would repair it first). An attempt that
    ended on its own is held to the rules of a finished build."""
    t0 = time.perf_counter()
    copy_dir = work / f"check-{attempt}"
    shutil.rmtree(copy_dir, ignore_errors=True)
    copy = settings.model_copy(update={"data_dir": copy_library(settings, copy_dir)})
    snap = snapshot(copy)
    problems = consistency_problems(snap, settings.store.papers_per_batch, after_kill=killed_at is not None)
    problems += _compare_to_reference(snap, ref_by_paper)
    shutil.rmtree(copy_dir, ignore_errors=True)
    by_paper = snap.by_paper()
    in_flight = set(by_paper) - set(snap.recorded)
    return KillRecord(
        attempt=attempt,
        target_s=round(target, 3),
        aim_papers=aim[0],
        aim_after_s=round(aim[1], 3),
        killed_at_s=round(killed_at, 3) if killed_at is not None else None,
        exit_code=exit_code,
        papers_recorded=len(snap.recorded),
        chunks_in_store=len(snap.chunks),
        in_flight_papers=len(in_flight),
        in_flight_chunks=sum(len(by_paper[p]) for p in in_flight),
        check_seconds=round(time.perf_counter() - t0, 3),
        problems=problems,
    )


def _report_failed_reference(
    papers: int,
    kills: int,
    seed: int,
    embedder: str,
    settings: Settings,
    work: Path,
    ref_seconds: float,
    startup: float,
    problems: list[str],
    t_all: float,
) -> CrashReport:
    return CrashReport(
        papers=papers,
        kills_requested=kills,
        kills_done=0,
        seed=seed,
        embedder=embedder,
        papers_per_batch=settings.store.papers_per_batch,
        workdir=str(work),
        reference_seconds=round(ref_seconds, 3),
        reference_startup_seconds=round(startup, 3),
        reference_timeline={},
        reference_papers=0,
        reference_chunks=0,
        kills=[],
        final_seconds=0.0,
        final_papers=0,
        final_chunks=0,
        missing_chunk_ids=0,
        extra_chunk_ids=0,
        chunk_ids_equal=False,
        topics_equal=False,
        problems=problems,
        passed=False,
        seconds=round(time.perf_counter() - t_all, 3),
    )
