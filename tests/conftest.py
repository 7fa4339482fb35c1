"""Test isolation: every test gets its own data directory and no user config file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arag.corpus.qasper import load_qasper
from arag.records import Paper
from arag.settings import find_shared_dir


@pytest.fixture(autouse=True, scope="session")
def _lexical_support() -> Iterator[None]:
    """Claims are checked lexically unless a test says otherwise: the default verifier is the model
    `arag train support` builds, which no test library has. Session-wide, so module fixtures see it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARAG_AGENT__SUPPORT", "lexical")
        yield


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path_factory.mktemp("arag-data")
    cfg = data / "empty-config.toml"
    cfg.write_text("")
    monkeypatch.setenv("ARAG_DATA_DIR", str(data))
    monkeypatch.setenv("ARAG_CONFIG", str(cfg))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in (
        "ARAG_EMBEDDING__PROVIDER",
        "ARAG_CORPUS__QASPER_PATH",
        "ARAG_CORPUS__MAX_PAPERS",
        # A server named in the shell must not receive every test's writes (the contract suite reads
        # the variable itself, at collection time).
        "ARAG_QDRANT_URL",
        "ARAG_QDRANT_API_KEY",
        "ARAG_STORE__BACKEND",
        "ARAG_STORE__COLLECTION",
        "ARAG_API_KEYS",
    ):
        monkeypatch.delenv(var, raising=False)
    return data


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    shared = find_shared_dir()
    if shared is None:
        pytest.skip("../shared (corpus, benchmarks, pdfs) is not beside the repository")
    return shared


@pytest.fixture(scope="session")
def qasper_path(shared_dir: Path) -> Path:
    path = shared_dir / "corpus" / "qasper" / "papers.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


def qasper_papers(n: int) -> list[Paper]:
    """The first ``n`` papers of the shared QASPER corpus (skips the test when it is absent)."""
    shared = find_shared_dir()
    path = shared / "corpus" / "qasper" / "papers.jsonl.gz" if shared else None
    if path is None or not path.is_file():
        pytest.skip("../shared/corpus/qasper/papers.jsonl.gz is needed for this test")
    papers, _ = load_qasper(path, max_papers=n)
    return papers


def qasper_paragraphs(n_papers: int) -> list[str]:
    """Abstracts and body paragraphs of the first ``n_papers`` QASPER papers."""
    out: list[str] = []
    for paper in qasper_papers(n_papers):
        out.append(paper.abstract)
        out.extend(p for s in paper.sections for p in s.paragraphs)
    return out
