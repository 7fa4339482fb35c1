"""``arag train embedder`` end to end on a tiny library: mine, train, export, re-quantise, measure
against the library's embedder, install, load through the factory. A few steps on a few dozen
questions: the numbers mean little, the plumbing (files, card, checksum, reproducibility, the model
id that keeps its vectors apart, the CLI) is what is checked; the batching rule is checked exactly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from arag.cli.main import app
from arag.errors import ModelError
from arag.models.factory import get_embedder
from arag.models.onnx_files import CARD_FILE, MODEL_FILE, file_sha256
from arag.models.onnx_minilm import EmbedderCard
from arag.settings import Settings
from arag.train.embedder import EmbedderExample, EmbedderTrainConfig, make_batches
from arag.train.embedder_pipeline import HeldOut, ranking_figures, train_embedder
from training_util import TRAINING_LIBRARY

CFG = EmbedderTrainConfig(batch=4, epochs=1.0, max_length=96, threads=1)


def _example(qid: str, paper: str) -> EmbedderExample:
    return EmbedderExample(
        question_id=qid, paper_id=paper, question=f"q {qid}", positives=[f"p {qid}"], negatives=[f"n {qid}"]
    )


def test_a_batch_holds_one_question_per_paper_and_every_question_once() -> None:
    examples = [_example(f"{p}{i}", p) for p in "abc" for i in range(3)] + [_example("d0", "d")]
    batches = make_batches(examples, EmbedderTrainConfig(batch=3), 0)
    assert [len(b) for b in batches] == [3, 3, 3, 1]
    papers = [[q.split()[1][0] for q, _, _ in b] for b in batches]
    assert all(len(set(p)) == len(p) for p in papers)
    assert sorted(q for b in batches for q, _, _ in b) == sorted(e.question for e in examples)
    # Fixed by the seed and the epoch.
    assert make_batches(examples, EmbedderTrainConfig(batch=3), 0) == batches
    assert make_batches(examples, EmbedderTrainConfig(batch=3), 1) != batches


def test_a_question_without_a_negative_is_left_out() -> None:
    bare = EmbedderExample(question_id="x", paper_id="x", question="q", positives=["p"], negatives=[])
    assert make_batches([bare, _example("a0", "a")], EmbedderTrainConfig(batch=4), 0) == [
        [("q a0", "p a0", "n a0")]
    ]


def test_ranking_figures_score_the_order_given() -> None:
    case = HeldOut(
        question="q", paper_id="p", texts=[["a"], ["b"], ["c"]], hits=[set(), {0}, set()], n_gold=1
    )
    assert ranking_figures([case], [[1, 0, 2]]) == {"ndcg@10": 1.0, "recall@10": 1.0}
    assert ranking_figures([case], [[0, 1, 2]]) == {"ndcg@10": round(1 / np.log2(3), 4), "recall@10": 1.0}


@pytest.fixture(scope="module")
def questions(training_questions: tuple[Path, Path]) -> Path:
    """QASPER train cut to the library's train papers."""
    return training_questions[0]


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    # Its own library: the tests train models into it.
    return small_library(own="train-embedder", **TRAINING_LIBRARY)


@pytest.fixture(scope="module")
def trained(lib: Settings, questions: Path) -> EmbedderCard:
    # The train papers' questions, with the first ones standing in as the held-out set.
    return train_embedder(lib, CFG, train_path=questions, val_path=questions, train_limit=16, val_limit=6)


@pytest.mark.real_models
def test_the_model_its_card_and_its_figures_are_installed(lib: Settings, trained: EmbedderCard) -> None:
    folder = lib.trained_embedder_dir
    assert sorted(p.name for p in folder.iterdir()) == [CARD_FILE, MODEL_FILE]
    assert file_sha256(folder / MODEL_FILE) == trained.onnx_sha256
    assert trained.model_id.startswith("minilm-l6-qasper-") and trained.seed == 0
    v = trained.validation
    assert v["library_embedder"]["model_id"] == "hash-384" or v["library_embedder"]["model_id"].startswith(
        "hash"
    )
    assert v["chosen"] in ("fp32", "int8") and 0 <= v["int8"]["ndcg@10"] <= 1
    assert trained.training["steps"] >= 1 and trained.data["validation_questions"] == 6


@pytest.mark.real_models
def test_the_factory_loads_it_under_its_own_model_id(lib: Settings, trained: EmbedderCard) -> None:
    settings = lib.embedding.model_copy(update={"provider": "onnx-minilm", "path": lib.trained_embedder_dir})
    with get_embedder(settings) as emb:
        assert emb.model_id == trained.model_id
        v = emb.embed(["Zero-shot translation with cross-lingual pre-training.", "A short one."])
    assert v.shape == (2, 384) and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    with get_embedder(lib.embedding.model_copy(update={"provider": "onnx-minilm"})) as packaged:
        assert packaged.model_id != trained.model_id


@pytest.mark.real_models
def test_a_tampered_or_missing_model_is_refused(lib: Settings, trained: EmbedderCard, tmp_path: Path) -> None:
    settings = lib.embedding.model_copy(update={"provider": "onnx-minilm", "path": tmp_path / "none"})
    with pytest.raises(ModelError, match="no trained embedder") as missing:
        get_embedder(settings)
    assert "arag train embedder" in missing.value.fix
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / CARD_FILE).write_text((lib.trained_embedder_dir / CARD_FILE).read_text())
    data = bytearray((lib.trained_embedder_dir / MODEL_FILE).read_bytes())
    data[-1] ^= 1
    (copy / MODEL_FILE).write_bytes(bytes(data))
    with pytest.raises(ModelError, match="sha256"):
        get_embedder(settings.model_copy(update={"path": copy}))


@pytest.mark.real_models
def test_the_cli_declines_to_retrain_an_installed_model(
    lib: Settings, trained: EmbedderCard, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    res = CliRunner().invoke(app, ["train", "embedder"])
    assert res.exit_code == 0 and "--force retrains it" in " ".join(res.output.split())


def test_dense_orders_embed_a_chunk_once_whatever_its_place_in_each_list() -> None:
    """Two questions of one paper list its chunks in different orders: each chunk keeps its own vector."""
    from arag.train.embedder_pipeline import dense_orders

    axes = {"q1": 0, "a": 0, "q2": 1, "b": 1, "c": 2}
    calls: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        calls.extend(texts)
        return np.eye(3, dtype=np.float32)[[axes[t] for t in texts]]

    first = HeldOut(question="q1", paper_id="p", texts=[["c"], ["a"], ["b"]], hits=[set()] * 3, n_gold=1)
    second = HeldOut(question="q2", paper_id="p", texts=[["a"], ["b"], ["c"]], hits=[set()] * 3, n_gold=1)
    orders, _ = dense_orders([first, second], embed, lambda n: None)
    assert orders == [[1, 0, 2], [1, 0, 2]]  # q1 is "a" (2nd in its list), q2 is "b" (2nd in its)
    assert sorted(calls) == ["a", "b", "c", "q1", "q2"]
