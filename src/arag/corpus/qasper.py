"""The default library: QASPER's 1,585 arXiv NLP papers (full text, CC-BY 4.0)."""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

from arag.errors import CorpusError
from arag.records import Paper, Section
from arag.text import section_as_text, title_as_text

log = logging.getLogger(__name__)

ATTRIBUTION = "Library: QASPER (Dasigi et al., NAACL 2021), 1,585 NLP papers from arXiv via S2ORC, CC-BY 4.0."
_NEW_ID = re.compile(r"^(\d{2})(\d{2})\.\d{4,5}(v\d+)?$")
# S2ORC joins an abstract's paragraphs with " ::: " (19 of the 1,585): left in, it glued the sentences
# either side into one ("... like clustering.: In this publication ...").
_ABSTRACT_PARAGRAPHS = re.compile(r"\s*:::\s*")


def abstract_text(raw: str) -> str:
    """An abstract's paragraphs as one text; a structured abstract's headings ("RESULTS ::: We found")
    lead their paragraph ("Results: We found")."""
    parts = [p for p in _ABSTRACT_PARAGRAPHS.split(raw.strip()) if p]
    out: list[str] = []
    for i, part in enumerate(parts):
        heading = part.isupper() and len(part.split()) <= 3 and i + 1 < len(parts)
        out.append(f"{part.capitalize()}:" if heading else part)
    return " ".join(out)


def year_month(arxiv_id: str) -> tuple[int | None, int | None]:
    """Year and month from a new-style arXiv id: ``1912.01214`` -> (2019, 12)."""
    m = _NEW_ID.match(arxiv_id)
    if not m:
        return None, None
    yy, mm = int(m.group(1)), int(m.group(2))
    if not 1 <= mm <= 12:
        return None, None
    return 2000 + yy, mm


def missing_corpus_error(path: Path) -> CorpusError:
    """The error for an absent QASPER file: says where to put it and how to get it."""
    return CorpusError(
        f"the QASPER corpus file was not found: {path}",
        where="settings corpus.qasper_path (ARAG_CORPUS__QASPER_PATH)",
        fix=(
            "place papers.jsonl.gz there (the project's ../shared/corpus/qasper/ holds it; it is QASPER's "
            "train+dev+test papers as JSON lines {id, title, abstract, sections}, built from the "
            "allenai/qasper release), or set ARAG_CORPUS__QASPER_PATH to where it is"
        ),
    )


def paper_from_record(rec: dict) -> Paper:
    """One QASPER JSON record as a Paper, keeping arXiv id and section structure."""
    try:
        pid = str(rec["id"]).strip()
        # Six titles keep arXiv's LaTeX ("Yor\\`ub\\'a"); a title is shown and searched as read.
        title = title_as_text(str(rec.get("title") or "").strip())
        sections = [
            Section(
                # 154 headings of 62 papers held S2ORC's marks, a formula given twice, a glued footnote or an
                # empty part; a heading is shown, embedded and read by the LLM.
                name=section_as_text(str(s.get("section") or "")) or "Body",
                paragraphs=[p.strip() for p in (s.get("paragraphs") or []) if p and p.strip()],
            )
            for s in rec.get("sections") or []
        ]
    except (KeyError, TypeError, AttributeError) as exc:
        raise CorpusError(
            f"malformed QASPER record: {exc!r}",
            where=f"paper {rec.get('id', '?') if isinstance(rec, dict) else '?'}",
            fix="check the corpus file format (see ../shared/README.md)",
        ) from exc
    if not pid or not title:
        raise CorpusError(
            "QASPER record without id or title",
            where=f"paper {pid or '?'}",
            fix="check the corpus file format",
        )
    year, month = year_month(pid)
    return Paper(
        id=pid,
        title=title,
        abstract=abstract_text(str(rec.get("abstract") or "")),
        sections=[s for s in sections if s.paragraphs],
        year=year,
        month=month,
        source="qasper",
    )


def iter_qasper(path: Path) -> Iterator[Paper | CorpusError]:
    """Yield each paper of the file; a malformed line yields its CorpusError instead of stopping."""
    if not path.is_file():
        raise missing_corpus_error(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield paper_from_record(json.loads(line))
                except json.JSONDecodeError as exc:
                    yield CorpusError(
                        f"line is not JSON: {exc}", where=f"{path}:{lineno}", fix="repair or replace the file"
                    )
                except CorpusError as exc:
                    yield exc
    except (OSError, EOFError) as exc:
        raise CorpusError(
            f"cannot read the QASPER corpus: {exc}",
            where=str(path),
            fix="the file is corrupt or truncated: replace it with a fresh copy",
        ) from exc


def load_qasper(
    path: Path, *, max_papers: int | None = None, paper_ids: list[str] | None = None
) -> tuple[list[Paper], list[CorpusError]]:
    """All papers (or the chosen ids / the first ``max_papers``) and the records that failed."""
    wanted = set(paper_ids) if paper_ids else None
    papers: list[Paper] = []
    failures: list[CorpusError] = []
    for item in iter_qasper(path):
        if isinstance(item, CorpusError):
            log.warning("skipping a QASPER record: %s", item)
            failures.append(item)
            continue
        if wanted is not None and item.id not in wanted:
            continue
        papers.append(item)
        if max_papers is not None and len(papers) >= max_papers:
            break
    return papers, failures
