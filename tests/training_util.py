"""The tiny QASPER slice the trainers' end-to-end tests share: six train and four validation papers
(the first of each split: every question of the tests' limits is about one of them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

__all__ = ["TRAIN_PAPERS", "VAL_PAPERS", "TRAINING_LIBRARY", "cut_questions"]

TRAIN_PAPERS = ["1909.00694", "2003.07723", "1705.09665", "1908.06606", "1811.00942", "1805.02400"]
VAL_PAPERS = ["1912.01214", "1810.08699", "1609.00425", "1801.05147"]
# small_library's overrides for a library of exactly these papers.
TRAINING_LIBRARY = {"corpus": {"paper_ids": TRAIN_PAPERS + VAL_PAPERS}}


def cut_questions(shared_dir: Path, out: Path) -> tuple[Path, Path]:
    """QASPER train and validation questions cut to these papers, written under ``out``."""
    paths = []
    for split, papers in (("train", TRAIN_PAPERS), ("validation", VAL_PAPERS)):
        src = shared_dir / "benchmarks" / "qasper" / f"questions_{split}.json"
        if not src.is_file():
            pytest.skip(f"{src} is missing")
        path = out / f"questions_{split}.json"
        path.write_text(json.dumps([q for q in json.loads(src.read_text()) if q["paper_id"] in papers]))
        paths.append(path)
    return paths[0], paths[1]
