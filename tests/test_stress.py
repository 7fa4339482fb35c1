"""The reliability suite, small: the consistency checker, a crash-resume run, the bad-PDF run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pymupdf
import pytest
from typer.testing import CliRunner

from arag.cli.stress import stress_app
from arag.index.factory import open_store
from arag.library.manage import build_library, list_papers
from arag.library.state import LibraryState
from arag.settings import Settings, get_settings
from arag.stress.bad_pdfs import BAD_KINDS, BOMB_PAGES, NOISE_PAGES, BadPdfReport, make_bad_pdfs
from arag.stress.common import kill_landed
from arag.stress.crash import CrashReport, check_consistency, run_crash_test

runner = CliRunner()


def _small_library(data_dir: Path) -> Settings:
    s = get_settings(
        data_dir=data_dir,
        corpus={"max_papers": 6},
        embedding={"provider": "hash"},
        topics={"k": 3},
        store={"papers_per_batch": 3},
    )
    build_library(s)
    return s


def test_checker_passes_a_built_library_and_finds_damage(tmp_path: Path, qasper_path: Path) -> None:
    s = _small_library(tmp_path / "lib")
    assert check_consistency(s) == []
    first, second = list_papers(s)[:2]

    # Points deleted behind the state's back: the state still records them.
    store = open_store(s, 384, create=False)
    store.delete_paper(first.id)
    store.close()
    problems = check_consistency(s)
    assert problems == [f"paper {first.id}: the state records {first.n_chunks} chunks, the store holds 0"]

    # A paper the state forgot: chunks of an unrecorded paper, allowed only right after a kill.
    state = LibraryState(s.state_db)
    state.forget_papers([first.id, second.id])
    state.close()
    final = check_consistency(s)
    assert len(final) == 1 and f"1 unrecorded papers ({second.n_chunks} chunks)" in final[0]
    assert "a finished build leaves none" in final[0]
    assert check_consistency(s, after_kill=True) == []


def test_checker_reports_a_missing_index(tmp_path: Path, qasper_path: Path) -> None:
    s = _small_library(tmp_path / "lib")
    shutil.rmtree(s.index_dir)
    (problem,) = check_consistency(s)
    assert problem.startswith("the index does not open")


def test_crash_resume_ends_with_the_reference_chunks(tmp_path: Path, qasper_path: Path) -> None:
    out = tmp_path / "crash.json"
    res = runner.invoke(
        stress_app,
        ["crash", "--papers", "20", "--kills", "2", "--batch", "4", "--workdir", str(tmp_path / "w")]
        + ["--rebuild-kills", "2", "--json", str(out)],
    )
    report = CrashReport.model_validate_json(out.read_text())
    assert res.exit_code == 0, (res.output, report.problems)
    assert "PASS" in res.output and "after each kill" in res.output
    # The rebuild case: an added PDF survives every kill and the final rebuild.
    rb = report.rebuild
    assert rb is not None and rb.passed and rb.kills_done == 2 and "after each killed rebuild" in res.output
    assert rb.expected_papers == 21 and rb.pdf_id is not None and rb.pdf_id.startswith("pdf:")
    assert all(k.papers == 21 and k.pdf_present and not k.problems for k in rb.kills)
    assert rb.final_papers == 21 and rb.final_pdf_present and rb.generations_left == 1
    killed = [k for k in report.kills if k.killed_at_s is not None]
    assert report.passed and report.kills_done == len(killed) == 2
    assert all(k.exit_code == -9 and not k.problems for k in killed)
    assert report.chunk_ids_equal and report.final_chunks == report.reference_chunks > 20
    assert report.final_papers == report.reference_papers == 20


def test_a_kill_lands_only_on_a_process_still_running() -> None:
    # The crash test once counted a build that had just finished (exit 0) as killed: a process that
    # ended between the harness's last poll and its SIGKILL is not a kill.
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    assert kill_landed(running) and running.returncode == -9
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    # Wait for it to exit without reaping it: Popen has not seen the exit yet, as after a last poll.
    os.waitid(os.P_PID, done.pid, os.WEXITED | os.WNOWAIT)
    assert not kill_landed(done) and done.returncode == 0


def test_the_bad_pdf_generator_writes_seven_kinds(tmp_path: Path) -> None:
    files = make_bad_pdfs(tmp_path)
    assert tuple(files) == BAD_KINDS and all(p.is_file() for p in files.values())
    assert files["zero-bytes"].stat().st_size == 0
    corrupt = files["corrupt"].read_bytes()
    assert corrupt.startswith(b"%PDF") and b"%%EOF" not in corrupt
    with pymupdf.open(files["encrypted"]) as doc:
        assert doc.needs_pass
    with pymupdf.open(files["image-only"]) as doc:
        assert doc.page_count == 1 and not doc[0].get_text().strip() and doc[0].get_images()
    with pymupdf.open(files["noise"]) as doc:
        assert doc.page_count == NOISE_PAGES and len(doc[NOISE_PAGES - 1].get_text()) > 1000
    with pymupdf.open(files["page-bomb"]) as doc:
        assert doc.page_count == BOMB_PAGES > 300
    assert files["not-a-pdf"].read_bytes().startswith(b"\x89PNG")


def test_bad_pdfs_are_reported_and_the_library_is_intact(tmp_path: Path, shared_dir: Path) -> None:
    out = tmp_path / "bad.json"
    res = runner.invoke(stress_app, ["bad-pdfs", "--workdir", str(tmp_path / "w"), "--json", str(out)])
    report = BadPdfReport.model_validate_json(out.read_text())
    assert res.exit_code == 0, (res.output, report.problems)
    assert report.add_exit_code == 0 and report.earlier_chunks_unchanged
    outcomes = {f.kind: f.outcome for f in report.files}
    assert outcomes == dict.fromkeys(BAD_KINDS, "rejected")
    assert all(f.reason and f.in_output for f in report.files if f.outcome == "rejected")
    assert report.good and all(g.added and g.chunks > 0 for g in report.good)
    assert report.papers_after == report.base_papers + len(report.good)


def test_bad_pdfs_fails_when_the_good_pdfs_are_missing(tmp_path: Path, qasper_path: Path) -> None:
    res = runner.invoke(
        stress_app,
        [
            "bad-pdfs",
            "--papers",
            "1",
            "--workdir",
            str(tmp_path / "w"),
            "--good-pdfs",
            str(tmp_path / "nope"),
        ],
    )
    assert res.exit_code == 1, res.output
    assert "FAIL" in res.output and "exited with" in res.output


@pytest.mark.parametrize("cmd", ["crash", "bad-pdfs"])
def test_an_unknown_embedder_is_a_settings_error(cmd: str, tmp_path: Path) -> None:
    res = runner.invoke(stress_app, [cmd, "--embedder", "nonsense", "--workdir", str(tmp_path / "w")])
    assert res.exit_code == 2
    assert not (tmp_path / "w").exists()


def test_a_build_that_outruns_its_kills_starts_over_then_fails(
    tmp_path: Path, qasper_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arag.stress import crash

    monkeypatch.setattr(crash, "_kill_targets", lambda *a: [1000.0])
    report = run_crash_test(papers=4, kills=1, workdir=tmp_path, papers_per_batch=2)
    assert not report.passed and report.kills_done == 0
    assert [k.killed_at_s for k in report.kills] == [None, None, None]
    assert all(k.exit_code == 0 and k.papers_recorded == 4 and not k.problems for k in report.kills)
    assert report.problems == ["only 0 of 1 kills landed in 3 attempts"]
    assert report.chunk_ids_equal and (tmp_path / "crashed").is_dir()


def test_a_kill_that_was_outrun_is_aimed_earlier_each_time() -> None:
    """A warm re-run can outrun the cold reference's timeline every time (CI once landed 1 of 2
    kills in 6 attempts): each miss moves the aim 40% of the way back towards the end of start-up."""
    from arag.stress.crash import _earlier

    assert _earlier(10.0, 2.0, 0) == 10.0
    assert [round(_earlier(10.0, 2.0, n), 4) for n in (1, 2, 3)] == [6.8, 4.88, 3.728]
    assert _earlier(2.0, 2.0, 5) == 2.0


def test_the_rebuild_check_fails_on_a_missing_paper_or_pdf(tmp_path: Path, shared_dir: Path) -> None:
    """What the rebuild case checks after each kill can fail: a lost paper, a lost PDF paper."""
    from arag.library.manage import add_pdfs
    from arag.stress.rebuild_kill import _check

    s = get_settings(
        data_dir=tmp_path / "lib", corpus={"max_papers": 3}, embedding={"provider": "hash"}, topics={"k": 2}
    )
    build_library(s)
    add_pdfs(s, [next((shared_dir / "pdfs").glob("*.pdf"))])
    ids = {r.id for r in list_papers(s)}
    (pdf_id,) = [i for i in ids if i.startswith("pdf:")]
    problems, papers, chunks, present = _check(s, ids, pdf_id)
    assert problems == [] and papers == 4 and chunks > 4 and present
    problems, *_ = _check(s, ids | {"1234.56789"}, pdf_id)
    assert problems == ["papers: 1 missing (e.g. ['1234.56789']), 0 unexpected"]
    problems, *_, present = _check(s, ids, "pdf:gone-00000000")
    assert not present and problems == ["the added PDF paper pdf:gone-00000000 is not in the library"]
