"""Test isolation: every test gets its own data directory and no user config file.

``ARAG_REQUIRE_SHARED=1`` (set by ``.ci/run``) turns a missing ``../shared`` from skipped tests into
a failed run. It is read here, not in the settings tree: it says what the test harness may skip and
means nothing to arag itself, so it is not one of arag's settings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from arag.corpus.qasper import load_qasper
from arag.library.manage import build_library
from arag.records import Paper
from arag.settings import Settings, find_shared_dir, get_settings

REQUIRE_SHARED = os.environ.get("ARAG_REQUIRE_SHARED", "").strip() not in ("", "0")
_REQUIRED = "ARAG_REQUIRE_SHARED is set: this run needs ../shared beside the repository"


def missing_shared(reason: str) -> NoReturn:
    """Skip a test whose shared data is missing, or fail it where the run requires that data."""
    if REQUIRE_SHARED:
        pytest.fail(f"{reason} ({_REQUIRED})", pytrace=False)
    pytest.skip(reason)


def pytest_sessionstart(session: pytest.Session) -> None:
    if REQUIRE_SHARED and find_shared_dir() is None:
        raise pytest.UsageError(
            f"{_REQUIRED} (corpus, benchmarks, pdfs), and it is missing: no test would use it, and most "
            "would be skipped. Put the shared folder beside the repository, or unset ARAG_REQUIRE_SHARED."
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With ARAG_REQUIRE_SHARED, a skip that names a file of ../shared (a test's own check for a
    missing file) fails instead."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    shared = find_shared_dir()
    if not (REQUIRE_SHARED and report.skipped and shared is not None):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if str(shared) in reason:
        report.outcome = "failed"
        report.longrepr = f"{reason} ({_REQUIRED})"


@pytest.fixture(autouse=True, scope="session")
def _lexical_support() -> Iterator[None]:
    """Claims are checked lexically unless a test says otherwise: the default verifier is the model
    `arag train support` builds, which no test library has. Session-wide, so module fixtures see it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARAG_AGENT__SUPPORT", "lexical")
        yield


# Variables of the shell a test must not see: a server named there must not receive every test's
# writes (the contract suite reads the variable itself, at collection time).
_SHELL_VARS = (
    "ARAG_EMBEDDING__PROVIDER",
    "ARAG_CORPUS__QASPER_PATH",
    "ARAG_CORPUS__MAX_PAPERS",
    "ARAG_QDRANT_URL",
    "ARAG_QDRANT_API_KEY",
    "ARAG_STORE__BACKEND",
    "ARAG_STORE__COLLECTION",
    "ARAG_API_KEYS",
)


def isolate(monkeypatch: pytest.MonkeyPatch, data: Path) -> None:
    """Point arag at ``data`` with an empty config file, offline, without the shell's settings."""
    cfg = data / "empty-config.toml"
    cfg.write_text("")
    monkeypatch.setenv("ARAG_DATA_DIR", str(data))
    monkeypatch.setenv("ARAG_CONFIG", str(cfg))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in _SHELL_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path_factory.mktemp("arag-data")
    isolate(monkeypatch, data)
    return data


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    shared = find_shared_dir()
    if shared is None:
        missing_shared("../shared (corpus, benchmarks, pdfs) is not beside the repository")
    return shared


@pytest.fixture(scope="session")
def qasper_path(shared_dir: Path) -> Path:
    path = shared_dir / "corpus" / "qasper" / "papers.jsonl.gz"
    if not path.is_file():
        missing_shared(f"{path} is missing")
    return path


# A small library: the first 6 QASPER papers, the hash embedder, 2 topics.
SMALL_LIBRARY: dict[str, Any] = {
    "corpus": {"max_papers": 6},
    "embedding": {"provider": "hash"},
    "topics": {"k": 2},
}


@pytest.fixture(scope="session")
def small_library(tmp_path_factory: pytest.TempPathFactory, qasper_path: Path) -> Callable[..., Settings]:
    """A factory of built small libraries: settings overrides in (each top-level section replaces
    :data:`SMALL_LIBRARY`'s), the built library's settings out. The same overrides give the same
    library, built once per session (isolated from the shell as every test is), so its tests only
    read it (a test that changes a library builds its own). ``own``: a module whose tests write
    beside the library (chat sessions, logs, a service's state) names itself, and gets a library
    no other module shares."""
    built: dict[str, Settings] = {}

    def make(own: str = "", **overrides: Any) -> Settings:
        key = json.dumps([own, overrides], sort_keys=True, default=str)
        if key not in built:
            data = tmp_path_factory.mktemp(f"lib-{own}" if own else "lib")
            with pytest.MonkeyPatch.context() as mp:
                isolate(mp, tmp_path_factory.mktemp("env"))
                settings = get_settings(data_dir=data, **{**SMALL_LIBRARY, **overrides})
                build_library(settings)
            built[key] = settings
        return built[key]

    return make


@pytest.fixture(scope="session")
def training_questions(tmp_path_factory: pytest.TempPathFactory, shared_dir: Path) -> tuple[Path, Path]:
    """(train, validation) question files cut to the trainers' tiny slice (training_util); read only."""
    from training_util import cut_questions

    return cut_questions(shared_dir, tmp_path_factory.mktemp("training-questions"))


def qasper_papers(n: int) -> list[Paper]:
    """The first ``n`` papers of the shared QASPER corpus (skips the test when it is absent)."""
    shared = find_shared_dir()
    path = shared / "corpus" / "qasper" / "papers.jsonl.gz" if shared else None
    if path is None or not path.is_file():
        missing_shared("../shared/corpus/qasper/papers.jsonl.gz is needed for this test")
    papers, _ = load_qasper(path, max_papers=n)
    return papers


def qasper_paragraphs(n_papers: int) -> list[str]:
    """Abstracts and body paragraphs of the first ``n_papers`` QASPER papers."""
    out: list[str] = []
    for paper in qasper_papers(n_papers):
        out.append(paper.abstract)
        out.extend(p for s in paper.sections for p in s.paragraphs)
    return out
