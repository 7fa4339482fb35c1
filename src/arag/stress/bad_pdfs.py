"""Bad-PDF ingestion: ``arag library add`` on a folder of broken files beside good ones.

The seven kinds and what ``arag.corpus.pdf`` does with each today:

- ``corrupt``: a real PDF garbled in the middle and cut off: rejected as truncated.
- ``zero-bytes``: rejected as empty.
- ``encrypted``: a real PDF saved with a user password (AES-256): rejected as password-protected.
- ``image-only``: one page holding only an image: rejected as having no extractable text.
- ``noise``: 250 pages of random words: rejected as text that does not read as prose (pdf.py counts
  common English words).
- ``page-bomb``: 1,000 pages of one line each (374 kB): rejected over the page cap (ARAG_PDF__MAX_PAGES,
  300), in the parser's child process.
- ``not-a-pdf``: a PNG image named ``.pdf``: rejected as not a PDF (no ``%PDF-`` signature; MuPDF
  alone would open it as a one-page image).
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Literal

import pymupdf
from pydantic import BaseModel

from arag.settings import find_shared_dir
from arag.stress.bombs import page_bomb
from arag.stress.common import (
    Echo,
    build_overrides,
    clear,
    cli_command,
    cli_env,
    library_settings,
    make_workdir,
    quiet,
    snapshot,
    tail,
)
from arag.stress.crash import check_consistency

BAD_KINDS = ("corrupt", "zero-bytes", "encrypted", "image-only", "noise", "page-bomb", "not-a-pdf")
NOISE_PAGES = 250  # under the page cap: the prose check is what is tested
BOMB_PAGES = 1_000

# What each kind should come to, and words its reason must hold. "strict": a reason without them is a
# failure; otherwise it is only noted (see not-a-pdf in the module docstring).
_EXPECTED: dict[str, tuple[Literal["rejected", "ingested"], str, bool]] = {
    "corrupt": ("rejected", r"truncated|not a readable PDF|could not parse", True),
    "zero-bytes": ("rejected", r"empty", True),
    "encrypted": ("rejected", r"password", True),
    "image-only": ("rejected", r"no extractable text", True),
    "noise": ("rejected", r"does not read as prose", True),
    "page-bomb": ("rejected", r"pages \(at most \d[\d,]*\)", True),
    "not-a-pdf": ("rejected", r"not a (readable )?PDF", True),
}

_LOREM = (
    "Retrieval augmented generation grounds the answers of a language model in passages found in a "
    "library of papers. Each passage is embedded, indexed and searched by meaning and by its words. "
)


def _text_pdf(pages: int = 3) -> pymupdf.Document:
    """A small born-digital PDF with a title and real sentences."""
    doc = pymupdf.open()
    for i in range(pages):
        page = doc.new_page()
        if i == 0:
            page.insert_text((72, 90), "A Paper About Nothing In Particular", fontsize=18)
        page.insert_textbox(pymupdf.Rect(72, 120, 540, 760), _LOREM * 12, fontsize=10)
    return doc


def _png(width: int = 320, height: int = 240) -> bytes:
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, width, height), False)
    pix.clear_with(180)
    return pix.tobytes("png")


def _noise_pdf(path: Path, pages: int, seed: int) -> None:
    """Pages of random lower-case "words", a few ending a "sentence"; one text box per page keeps it
    fast (about a second for 500 pages)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    doc = pymupdf.open()
    for _ in range(pages):
        words = [
            "".join(rng.choices(letters, k=rng.randint(2, 9))) + ("." if rng.random() < 0.08 else "")
            for _ in range(300)
        ]
        doc.new_page().insert_textbox(pymupdf.Rect(50, 50, 560, 780), " ".join(words), fontsize=9)
    doc.save(str(path), garbage=0, deflate=True)


def make_bad_pdfs(directory: Path, *, seed: int = 0) -> dict[str, Path]:
    """Write one file of each kind in :data:`BAD_KINDS` into ``directory``; kind -> path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}

    data = bytearray(_text_pdf().tobytes())
    rng = random.Random(seed)
    mid = len(data) // 3
    data[mid : mid + 64] = bytes(rng.randrange(256) for _ in range(64))  # garbled ...
    out["corrupt"] = directory / "corrupt-truncated.pdf"
    out["corrupt"].write_bytes(bytes(data[: len(data) * 2 // 3]))  # ... and cut off, %%EOF with it

    out["zero-bytes"] = directory / "zero-bytes.pdf"
    out["zero-bytes"].write_bytes(b"")

    out["encrypted"] = directory / "encrypted.pdf"
    aes256 = pymupdf.PDF_ENCRYPT_AES_256  # type: ignore[attr-defined]
    _text_pdf().save(str(out["encrypted"]), encryption=aes256, user_pw="secret", owner_pw="owner")

    out["image-only"] = directory / "image-only.pdf"
    doc = pymupdf.open()
    doc.new_page().insert_image(pymupdf.Rect(72, 72, 392, 312), stream=_png())
    doc.save(str(out["image-only"]))

    out["noise"] = directory / f"noise-{NOISE_PAGES}-pages.pdf"
    _noise_pdf(out["noise"], NOISE_PAGES, seed)

    out["page-bomb"] = page_bomb(directory / f"page-bomb-{BOMB_PAGES}-pages.pdf", BOMB_PAGES)

    out["not-a-pdf"] = directory / "not-a-pdf.pdf"
    out["not-a-pdf"].write_bytes(_png())
    return out


class BadFileResult(BaseModel):
    """One bad file: what it should come to and what it came to."""

    kind: str
    name: str
    bytes: int
    expected: str  # rejected | ingested
    outcome: str  # rejected | ingested | missing (neither a failure nor a paper)
    reason: str | None = None
    reason_ok: bool = True
    in_output: bool = False  # the CLI named the file
    chunks: int = 0  # when ingested


class GoodPdfResult(BaseModel):
    name: str
    added: bool
    chunks: int


class BadPdfReport(BaseModel):
    """What ``arag stress bad-pdfs`` found."""

    workdir: str
    base_papers: int
    base_chunks: int
    add_exit_code: int | None
    add_seconds: float
    add_timed_out: bool
    files: list[BadFileResult]
    good: list[GoodPdfResult]
    papers_after: int
    chunks_after: int
    earlier_chunks_unchanged: bool
    problems: list[str]
    notes: list[str]
    passed: bool
    seconds: float


def run_bad_pdf_test(
    workdir: Path | None = None,
    good_pdfs: Path | None = None,
    *,
    papers: int = 5,
    embedder: str = "hash",
    timeout_s: float = 600.0,
    echo: Echo = quiet,
) -> BadPdfReport:
    """Build a small QASPER library, then ``arag library add`` the bad files and the good PDFs in
    one call; check the command finishes, every bad file is accounted for with its reason, the
    good PDFs are in, and the earlier papers' chunks are untouched.

    ``good_pdfs``: a PDF or a folder of them (default ``../shared/pdfs``). A temporary workdir is
    removed on success.
    """
    t_all = time.perf_counter()
    library_settings(Path("unused"), embedder)  # invalid settings raise before any work
    work, temporary = make_workdir(workdir, "arag-stress-pdfs-")
    lib, bad_dir, logs = work / "library", work / "bad-pdfs", work / "logs"
    clear(lib, bad_dir, logs)
    logs.mkdir(parents=True)
    if good_pdfs is None:
        shared = find_shared_dir()
        good_pdfs = shared / "pdfs" if shared is not None else work / "no-shared-pdfs"
    good_pdfs = Path(good_pdfs).resolve()
    good_files = sorted(good_pdfs.rglob("*.pdf")) if good_pdfs.is_dir() else [good_pdfs]
    problems: list[str] = []
    notes: list[str] = []
    env = cli_env(lib, **build_overrides(embedder, papers))
    settings = library_settings(lib, embedder)

    echo(f"building a library of {papers} QASPER papers in {lib}")
    build = subprocess.run(
        cli_command("library", "build"), env=env, capture_output=True, text=True, cwd=work, timeout=timeout_s
    )
    (logs / "build.log").write_text(build.stdout + build.stderr)
    if build.returncode != 0:
        problems.append(f"the base build exited with {build.returncode}: {build.stderr[-1500:]}")
    before = snapshot(settings)
    base_chunks = before.by_paper()

    echo(f"writing the bad files into {bad_dir}")
    bad = make_bad_pdfs(bad_dir)
    missing_good = [p for p in good_files if not p.is_file()]
    if not good_files or missing_good:
        problems.append(f"no good PDFs to add at {good_pdfs}")
    echo(f"arag library add {bad_dir} {good_pdfs}")
    add_log = logs / "add.log"
    t0 = time.perf_counter()
    exit_code: int | None = None
    timed_out = False
    output = ""
    try:
        add = subprocess.run(
            cli_command("library", "add", str(bad_dir), str(good_pdfs)),
            env=env,
            capture_output=True,
            text=True,
            cwd=work,
            timeout=timeout_s,
        )
        exit_code, output = add.returncode, add.stdout + add.stderr
    except subprocess.TimeoutExpired as exc:
        timed_out = True
        output = _text(exc.stdout) + _text(exc.stderr)
        problems.append(f"`arag library add` did not finish in {timeout_s:.0f} s (a hang)")
    add_seconds = time.perf_counter() - t0
    add_log.write_text(output)
    if exit_code not in (0, None):
        problems.append(f"`arag library add` exited with {exit_code}: {tail(add_log)}")

    after = snapshot(settings)
    from arag.library.manage import library_status, list_papers

    failures = {Path(f.key).resolve(): f.reason for f in library_status(settings).failures}
    rows = {Path(r.source_path).resolve(): r for r in list_papers(settings) if r.source_path}
    by_paper = after.by_paper()
    files: list[BadFileResult] = []
    for kind, path in bad.items():
        expected, pattern, strict = _EXPECTED[kind]
        key = path.resolve()
        res = BadFileResult(
            kind=kind,
            name=path.name,
            bytes=path.stat().st_size,
            expected=expected,
            outcome="missing",
            in_output=str(path) in output,
        )
        if key in failures:
            res.outcome, res.reason = "rejected", failures[key].splitlines()[0]
        elif key in rows:
            res.outcome = "ingested"
            res.chunks = len(by_paper.get(rows[key].id, ()))
        if res.outcome != expected:
            problems.append(f"{kind} ({path.name}) was {res.outcome}, expected {expected}")
        if res.outcome == "rejected":
            res.reason_ok = bool(re.search(pattern, res.reason or "", re.IGNORECASE))
            if not res.in_output:
                problems.append(
                    f"{kind} ({path.name}) was rejected but the command's output does not name it"
                )
            if not res.reason_ok:
                msg = f"{kind} ({path.name}) was rejected for: {res.reason!r}"
                (problems if strict else notes).append(msg + f" (expected /{pattern}/)")
        files.append(res)

    good: list[GoodPdfResult] = []
    for p in good_files:
        row = rows.get(p.resolve())
        good.append(
            GoodPdfResult(
                name=p.name, added=row is not None, chunks=len(by_paper.get(row.id, ())) if row else 0
            )
        )
        if row is None:
            why = failures.get(p.resolve())
            problems.append(f"good PDF {p.name} was not added" + (f": {why}" if why else ""))

    unchanged = all(by_paper.get(pid) == ids for pid, ids in base_chunks.items())
    if not unchanged:
        changed = [pid for pid, ids in base_chunks.items() if by_paper.get(pid) != ids]
        problems.append(f"the chunks of {len(changed)} earlier papers changed, e.g. {changed[0]}")
    if len(base_chunks) != papers:
        problems.append(f"the base library has {len(base_chunks)} papers, expected {papers}")
    problems += [f"library: {p}" for p in check_consistency(settings)]
    passed = not problems
    report = BadPdfReport(
        workdir=str(work),
        base_papers=len(before.recorded),
        base_chunks=len(before.chunks),
        add_exit_code=exit_code,
        add_seconds=round(add_seconds, 3),
        add_timed_out=timed_out,
        files=files,
        good=good,
        papers_after=len(after.recorded),
        chunks_after=len(after.chunks),
        earlier_chunks_unchanged=unchanged,
        problems=problems,
        notes=notes,
        passed=passed,
        seconds=round(time.perf_counter() - t_all, 3),
    )
    if passed and temporary:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _text(raw: str | bytes | None) -> str:
    if raw is None:
        return ""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw
