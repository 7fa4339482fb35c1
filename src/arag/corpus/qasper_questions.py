"""QASPER's questions as arag reads them: either file format, the questions with text evidence, and
the query each asks of the whole library. Evaluation, training and benchmarks share this loader."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from arag.errors import InputError
from arag.settings import find_shared_dir

# One in this many QASPER train papers is held out of training (the reranker, the support model, the
# answer reader): thresholds, bars and weights are fit on their questions, so validation is only ever
# reported on.
HELD_OUT_MOD = 10
# How reports and model cards name that slice.
HELD_OUT_NAME = "held-out train papers (sha1(id) % 10 == 0)"

T = TypeVar("T")

# QASPER marks an evidence item that is a figure or table ("FLOAT SELECTED: ..."), not corpus text.
FLOAT_MARKER = "FLOAT SELECTED"


class EvalQuestion(BaseModel):
    """A QASPER question with text evidence."""

    question_id: str
    paper_id: str
    paper_title: str
    question: str
    evidence: list[str]


def held_out_paper(paper_id: str) -> bool:
    """Whether a QASPER train paper is in the slice held out of training, for fitting thresholds."""
    return int(hashlib.sha1(paper_id.encode()).hexdigest()[:8], 16) % HELD_OUT_MOD == 0


def split_held_out(items: Sequence[T], paper_id: Callable[[T], str]) -> tuple[list[T], list[T]]:
    """(training items, held-out items), split by paper with :func:`held_out_paper`, order kept."""
    train = [i for i in items if not held_out_paper(paper_id(i))]
    return train, [i for i in items if held_out_paper(paper_id(i))]


def default_questions_path(split: str = "validation") -> Path:
    """QASPER's questions of ``split`` (validation, train) beside the repository
    (``../shared/benchmarks/qasper``)."""
    shared = find_shared_dir()
    if shared is None:
        raise InputError(
            "no QASPER benchmark found beside the repository",
            where="../shared/benchmarks/qasper",
            fix="pass --questions PATH to a questions_*.json file",
        )
    return shared / "benchmarks" / "qasper" / f"questions_{split}.json"


def read_question_items(path: Path) -> list[dict]:
    """Question records from either format: ours (a list of {paper_id, paper_title, question_id,
    question, answers}) or QASPER's official v0.3 release (a dict of paper id to {title, abstract,
    full_text, qas}, answers nested under "answer")."""
    if not path.is_file():
        raise InputError(
            f"benchmark file not found: {path}",
            where="arag eval retrieval",
            fix="pass --questions PATH (../shared/benchmarks/qasper/questions_validation.json)",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not a JSON file: {exc}", where=str(path), fix="pass a QASPER questions file"
        ) from exc
    except UnicodeDecodeError as exc:
        raise InputError(
            f"not UTF-8 text: {exc}", where=str(path), fix="save the questions file as UTF-8 JSON"
        ) from exc
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        items = []
        for pid, paper in data.items():
            for qa in paper.get("qas", []):
                items.append(
                    {
                        "paper_id": pid,
                        "paper_title": paper.get("title", ""),
                        "question_id": qa["question_id"],
                        "question": qa["question"],
                        "answers": [a.get("answer", a) for a in qa.get("answers", [])],
                    }
                )
        return items
    raise InputError(
        "unrecognised questions file", where=str(path), fix="use a list of questions or QASPER's v0.3 dict"
    )


def load_questions(path: Path, *, limit: int | None = None) -> list[EvalQuestion]:
    """Questions with at least one text evidence paragraph (union over annotations).

    ``count_skipped`` tells how many of the file's questions have none."""
    out: list[EvalQuestion] = []
    for item in read_question_items(path):
        evidence = list(
            dict.fromkeys(
                e
                for a in item["answers"]
                for e in a.get("evidence", [])
                if e and not e.startswith(FLOAT_MARKER)
            )
        )
        if evidence:
            out.append(
                EvalQuestion(
                    question_id=item["question_id"],
                    paper_id=item["paper_id"],
                    paper_title=item["paper_title"],
                    question=item["question"],
                    evidence=evidence,
                )
            )
        if limit is not None and len(out) >= limit:
            break
    return out


Q = TypeVar("Q", bound="EvalQuestion")


def questions_in_library(
    questions: Sequence[Q], paper_ids: Collection[str], *, where: str
) -> tuple[list[Q], int]:
    """The questions whose paper the library holds, and how many were left out (a question about
    a paper the library lacks can only score 0); an InputError when the library holds none."""
    kept = [q for q in questions if q.paper_id in paper_ids]
    if questions and not kept:
        raise InputError(
            f"none of the {len(questions)} questions is about a paper in the library "
            f"({len(paper_ids)} papers)",
            where=where,
            fix="build the library with their papers (arag library build), or pass --questions about "
            "the library's papers",
        )
    return kept, len(questions) - len(kept)


def count_skipped(path: Path) -> int:
    """Questions of the file whose annotations have no text evidence (left out of the metrics)."""
    items = read_question_items(path)
    return sum(
        1
        for item in items
        if not any(
            e and not e.startswith(FLOAT_MARKER) for a in item["answers"] for e in a.get("evidence", [])
        )
    )


def library_query(q: EvalQuestion) -> str:
    """The library-wide query: the questions say 'they', so the paper title goes in front."""
    return f"In the paper '{q.paper_title}': {q.question}"
