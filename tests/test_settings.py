from __future__ import annotations

from pathlib import Path

import pytest

from arag.errors import ConfigError
from arag.settings import get_settings


def test_env_overrides_nested_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ARAG_EMBEDDING__BATCH_SIZE", "64")
    monkeypatch.setenv("ARAG_TOPICS__K", "7")
    s = get_settings()
    assert s.embedding.batch_size == 64
    assert s.topics.k == 7
    assert s.index_dir == s.data_dir / "index"


def test_config_file_is_read_and_env_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "arag.toml"
    cfg.write_text('threads = 1\n[embedding]\nprovider = "hash"\nbatch_size = 8\n')
    monkeypatch.setenv("ARAG_CONFIG", str(cfg))
    monkeypatch.setenv("ARAG_EMBEDDING__BATCH_SIZE", "16")
    s = get_settings()
    assert s.threads == 1
    assert s.embedding.provider == "hash"
    assert s.embedding.batch_size == 16


def test_missing_config_file_says_how_to_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ARAG_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="ARAG_CONFIG"):
        get_settings()


def test_invalid_value_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "word2vec")
    with pytest.raises(ConfigError) as exc:
        get_settings()
    assert "provider" in str(exc.value)
    assert exc.value.fix


def test_data_dir_defaults_outside_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARAG_DATA_DIR")
    s = get_settings()
    repo = Path(__file__).resolve().parents[1]
    assert repo not in s.data_dir.resolve().parents
    assert s.data_dir.name == "arag"


def test_default_corpus_is_the_shared_qasper_file(qasper_path: Path) -> None:
    assert get_settings().corpus.qasper_path.resolve() == qasper_path.resolve()


@pytest.mark.parametrize(
    ("value", "mode"), [("true", "on"), ("1", "on"), ("false", "off"), ("auto", "auto"), ("on", "on")]
)
def test_answer_confidence_keeps_its_old_boolean_values(
    monkeypatch: pytest.MonkeyPatch, value: str, mode: str
) -> None:
    assert get_settings().agent.answer_confidence == "auto"  # scored only where a rule reads it
    monkeypatch.setenv("ARAG_AGENT__ANSWER_CONFIDENCE", value)
    assert get_settings().agent.answer_confidence == mode


def test_answer_confidence_rejects_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_AGENT__ANSWER_CONFIDENCE", "sometimes")
    with pytest.raises(ConfigError, match="answer_confidence"):
        get_settings()
