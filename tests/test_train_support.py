"""``arag train support`` and the support scorers: pair mining, the labelled set and the threshold on
hand-made data (fast), then the whole run on a tiny library (real models): mine, train, export,
calibrate, install, load, score.

The tiny run is a 1-layer model on 96 word-pieces and a few dozen questions: its numbers mean
nothing, the plumbing (files, card, checksum, calibration, reproducibility, CLI) is what is checked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from arag.agent.graph import make_support
from arag.agent.support import (
    CombinedSupport,
    CrossEncoderSupport,
    HubNLISupport,
    LexicalSupport,
    LLMJudgeSupport,
    SupportScorer,
    combined_probability,
    platt,
)
from arag.cli.main import app
from arag.corpus.qasper_questions import HELD_OUT_NAME, held_out_paper
from arag.errors import ModelError
from arag.library.manage import list_papers
from arag.llm.scripted import ScriptedLLM
from arag.models.onnx_files import CARD_FILE, MODEL_FILE, file_sha256
from arag.models.reranker import ModelCard, OnnxReranker
from arag.settings import Settings, get_settings
from arag.train.calibrate import fit_combined, fit_platt
from arag.train.data import SupportExample, SupportPair
from arag.train.metrics import auc, best_threshold, confusion, verifier_metrics
from arag.train.reranker import TrainConfig
from arag.train.support_pipeline import (
    answer_text,
    answered,
    hypothesis,
    labelled_pairs,
    lexical_calibration,
    recalibrate_support,
    to_mined,
    train_support,
)
from training_util import TRAIN_PAPERS, TRAINING_LIBRARY, VAL_PAPERS

# --- answers and pairs --------------------------------------------------------------------------


def test_answer_text_by_kind() -> None:
    assert answer_text({"unanswerable": True, "extractive_spans": ["x"]}) is None
    assert answer_text({"extractive_spans": ["a ", "b"], "free_form_answer": "f"}) == "a; b"
    assert answer_text({"extractive_spans": [], "free_form_answer": " f "}) == "f"
    assert answer_text({"extractive_spans": [], "free_form_answer": "", "yes_no": False}) == "No"
    assert answer_text({"yes_no": True}) == "Yes"
    assert answer_text({"extractive_spans": [], "free_form_answer": "", "yes_no": None}) is None
    assert hypothesis(" What is it? ", " A parser ") == "What is it? A parser"


def test_answered_keeps_annotations_with_an_answer_and_text_evidence() -> None:
    item = {
        "answers": [
            {"extractive_spans": ["a"], "evidence": ["E1", "FLOAT SELECTED: Table 1"]},
            {"extractive_spans": ["a"], "evidence": ["E2"]},  # the same answer again
            {"free_form_answer": "b", "evidence": ["FLOAT SELECTED: Figure 2"]},  # no text evidence
            {"yes_no": False, "evidence": ["E3"]},
            {"unanswerable": True, "evidence": []},
        ]
    }
    assert answered(item) == [("a", ["E1"]), ("No", ["E3"])]


def _ex(
    qid: str, hyp: str, pos: list[str], hard: list[str], rand: list[str], other: list[str]
) -> SupportExample:
    return SupportExample(
        question_id=qid,
        hypothesis=hyp,
        answer=hyp.split()[-1],
        positives=pos,
        hard=hard,
        random=rand,
        other_papers=other,
    )


def test_labelled_pairs_one_supported_and_one_unsupported_of_each_kind() -> None:
    examples = [
        _ex("q1", "Q1 A1", ["P1"], ["H1"], ["R1"], ["O1"]),
        _ex("q1", "Q1 A2", ["P1b"], ["H1b"], [], []),  # a second annotation: the first one counts
        _ex("q3", "Q3 A", [], ["H3"], [], []),  # no positive: left out
    ]
    got = [
        (p.question_id, p.hypothesis, p.answer, p.premise, p.supported, p.kind)
        for p in labelled_pairs(examples, 0)
    ]
    assert got == [
        ("q1", "Q1 A1", "A1", "P1", True, "evidence"),
        ("q1", "Q1 A1", "A1", "H1", False, "hard"),
        ("q1", "Q1 A1", "A1", "R1", False, "random"),
        ("q1", "Q1 A1", "A1", "O1", False, "other"),
    ]


def test_labelled_pairs_top_up_from_the_top_hard_negatives() -> None:
    hard = [f"h{i}" for i in range(7)]
    examples = [
        _ex("q2", "Q2 A", ["P2", "P2b"], ["H2a", "H2b", "H2c"], [], []),
        _ex("q4", "Q4", ["P4"], hard, ["r"], []),
    ]
    pairs = labelled_pairs(examples, 0)
    assert pairs == labelled_pairs(examples, 0)  # seeded
    q2 = [p for p in pairs if p.question_id == "q2"]
    assert [p.kind for p in q2] == ["evidence", "hard", "hard", "hard"]
    assert q2[0].premise in ("P2", "P2b") and {p.premise for p in q2[1:]} == {"H2a", "H2b", "H2c"}
    q4 = [p for p in pairs if p.question_id == "q4"]
    assert [p.kind for p in q4] == ["evidence", "hard", "random", "hard"]
    # Only the top five hard negatives are drawn from, and none twice.
    assert {q4[1].premise, q4[3].premise} <= set(hard[:5]) and q4[1].premise != q4[3].premise


def test_to_mined_puts_the_hypothesis_in_the_query_slot() -> None:
    hard = [f"h{i}" for i in range(9)]
    (m,) = to_mined([_ex("q", "Q? A", ["P"], hard, ["r0", "r1", "h1"], ["o"])], TrainConfig())
    assert m.query == "Q? A" and m.positives == ["P"] and m.other_papers == ["o"]
    assert m.same_paper == [*hard[:7], "r0", "r1"]


# --- metrics ------------------------------------------------------------------------------------

# Two questions: q1's supported pair outscores its unsupported ones, q2's hard negative outscores
# its supported pair.
KINDS: list[Any] = ["evidence", "hard", "random", "other"]
PAIRS = [
    SupportPair(question_id=q, hypothesis=q, answer=q, premise=k, supported=k == "evidence", kind=k)
    for q in ("q1", "q2")
    for k in KINDS
]
SCORES = [2.0, 1.0, -1.0, -2.0, 0.5, 1.5, -0.5, -3.0]
LABELS = [p.supported for p in PAIRS]


def test_auc_and_confusion() -> None:
    assert auc(SCORES, LABELS) == pytest.approx(10 / 12)
    assert auc([1.0, 1.0], [True, False]) == 0.5
    assert math.isnan(auc([1.0], [True]))
    assert confusion(SCORES, LABELS, 0.5) == {
        "precision": 0.5,
        "recall": 1.0,
        "f1": pytest.approx(2 / 3),
        "tp": 2,
        "fp": 2,
        "fn": 0,
        "tn": 4,
    }


def test_best_threshold() -> None:
    # F1 2/3 both at 2.0 (accept one) and at 0.5 (accept four): the higher wins, midway to 1.5.
    assert best_threshold(SCORES, LABELS) == 1.75
    assert best_threshold([0.9, 0.8, 0.3, 0.1], [True, True, False, False]) == pytest.approx(0.55)
    # Accepting everything is best: the lowest score.
    assert best_threshold([0.2, 0.1], [True, True]) == 0.1


def test_verifier_metrics() -> None:
    m = verifier_metrics(PAIRS, SCORES)
    assert m == {
        "threshold": 1.75,
        "auc": 0.8333,
        "precision": 1.0,
        "recall": 0.5,
        "f1": 0.6667,
        "tp": 1,
        "fp": 0,
        "fn": 1,
        "tn": 6,
        # q1's threshold (1.5) accepts q2's hard negative only: F1 0; q2's (0.0) gives q1 F1 2/3.
        "f1_two_fold": 0.3333,
        "accepted_unsupported": {"hard": 0.0, "random": 0.0, "other": 0.0},
    }


def test_fit_platt() -> None:
    s, y = [-2.0, -1.0, 1.0, 2.0], [False, False, True, True]
    a, b = fit_platt(s, y)
    assert a > 0 and abs(b) < 1e-6  # symmetric data: no offset
    # At the optimum the log loss's gradient (against Platt's smoothed targets 3/4 and 1/4) is zero.
    p = np.array([platt(x, a, b) for x in s])
    t = np.where(y, 0.75, 0.25)
    assert np.allclose([(p - t).sum(), ((p - t) * s).sum()], 0, atol=1e-8)
    a2, b2 = fit_platt(SCORES, LABELS)
    probs = [platt(x, a2, b2) for x in SCORES]
    assert a2 > 0 and all(0 < q < 1 for q in probs)
    assert platt(0.0, 1.0, 0.0) == 0.5 and platt(1e6, 1.0, 0.0) == 1.0 and platt(-1e6, 1.0, 0.0) == 0.0


# --- the scorers and their choice ---------------------------------------------------------------


class FakeNLI:
    """Stands in for a sentence-transformers CrossEncoder: records pairs, returns fixed probabilities."""

    def __init__(self, labels: dict[Any, str]) -> None:
        self.config = type("Config", (), {"id2label": labels})()
        self.pairs: list[tuple[str, str]] = []

    def predict(self, pairs: list[tuple[str, str]], **kwargs: Any) -> np.ndarray:
        assert kwargs["apply_softmax"]
        self.pairs += pairs
        return np.array([[0.1, 0.7, 0.2]], dtype=np.float32)


def test_hub_nli_support_scores_the_entailment_probability() -> None:
    fake = FakeNLI({"0": "contradiction", "1": "entailment", "2": "neutral"})
    s = HubNLISupport("some/nli", 0.5, encoder=fake)
    assert isinstance(s, SupportScorer) and s.name == "nli:some/nli"
    assert s.score("It uses SQuAD [1].", "We use SQuAD.") == pytest.approx(0.7)
    assert fake.pairs == [("We use SQuAD.", "It uses SQuAD.")]  # premise first, markers gone
    with pytest.raises(ModelError, match="not an NLI model"):
        HubNLISupport("some/ranker", encoder=FakeNLI({0: "LABEL_0"}))


def _settings(tmp_path: Path, **agent: Any) -> Settings:
    return get_settings(data_dir=tmp_path, agent=agent)


def test_make_support_by_setting(tmp_path: Path) -> None:
    llm = ScriptedLLM(default="Yes")
    lexical = make_support(_settings(tmp_path, support="lexical", support_threshold=0.4), llm, True)
    assert isinstance(lexical, LexicalSupport) and lexical.threshold == 0.4
    assert isinstance(make_support(_settings(tmp_path, support="auto"), llm, True), LLMJudgeSupport)
    assert isinstance(make_support(_settings(tmp_path, support="llm-judge"), llm, False), LLMJudgeSupport)
    # Offline (no LLM checks, or no LLM at all) the default is lexical (see make_support).
    for model in (llm, None):
        auto = make_support(_settings(tmp_path, support="auto"), model, False)
        assert isinstance(auto, LexicalSupport) and auto.threshold == 0.44
    # The trained model, asked for and not there, is not replaced: the error says how to train it.
    for support, model in (("trained", llm), ("llm-judge", None), ("combined", None)):
        with pytest.raises(ModelError, match="arag train support"):
            make_support(_settings(tmp_path, support=support), model, False)
    assert get_settings(data_dir=tmp_path).support_dir == tmp_path / "models" / "support"


def test_cross_encoder_support_refuses_a_card_without_calibration(tmp_path: Path) -> None:
    (tmp_path / MODEL_FILE).write_bytes(b"not a model")
    card = ModelCard(
        model_id="x",
        base_model="b",
        layers=1,
        max_length=96,
        quantized=False,
        onnx_sha256="0",
        created="",
        seed=0,
    )
    (tmp_path / CARD_FILE).write_text(card.model_dump_json())
    with pytest.raises(ModelError, match="arag train support --force"):
        CrossEncoderSupport(tmp_path, threads=1)


@pytest.mark.real_models
def test_nli_without_weights_on_disk_is_a_clear_error(tmp_path: Path) -> None:
    settings = _settings(tmp_path, support="nli", support_model="cross-encoder/nli-deberta-v3-base")
    with pytest.raises(ModelError, match="NLI cross-encoder|sentence-transformers") as err:
        make_support(settings, None, False)
    assert any(hint in (err.value.fix or "") for hint in ("on disk", "pip install"))


# --- the whole run on a tiny library (real models) ------------------------------------------------

CFG = TrainConfig(layers=1, max_length=96, epochs=1.0, threads=1)


@pytest.fixture(scope="module")
def questions(training_questions: tuple[Path, Path]) -> tuple[Path, Path]:
    return training_questions


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    # Its own library (no other module asks for these papers): the tests train models into it.
    s = small_library(**TRAINING_LIBRARY, threads=1)
    assert sorted(r.id for r in list_papers(s)) == sorted(TRAIN_PAPERS + VAL_PAPERS)
    return s


@pytest.fixture(scope="module")
def trained(lib: Settings, questions: tuple[Path, Path]) -> ModelCard:
    train, val = questions
    return train_support(lib, CFG, train_path=train, val_path=val, train_limit=30, val_limit=10)


@pytest.mark.real_models
def test_the_model_and_its_card_are_installed(lib: Settings, trained: ModelCard) -> None:
    folder = lib.support_dir
    assert sorted(p.name for p in folder.iterdir()) == [CARD_FILE, MODEL_FILE]
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no work folder left
    assert sorted(p.name for p in (lib.cache_dir / "support").iterdir())[0].startswith("train-")
    card = ModelCard.model_validate_json((folder / CARD_FILE).read_text())
    assert card == trained
    assert card.onnx_sha256 == file_sha256(folder / MODEL_FILE)
    assert card.model_id == f"minilm-l1-support-qasper-{card.onnx_sha256[:8]}"
    assert card.layers == 1 and card.max_length == 96 and card.bars is None
    assert card.data["train_questions"] == 30 and card.data["validation_questions"] == 10
    assert card.data["train_examples"] >= 20 and card.training["steps"] > 0
    v = card.validation
    assert v["chosen"] == ("int8" if card.quantized else "fp32")
    # One supported and three unsupported pairs per question, one of each kind.
    assert v["pairs"] == {"supported": 10, "unsupported": 30}
    assert all(x is not None for x in v["lexical"]["accepted_unsupported"].values())
    for name in ("fp32", "int8", "answer_only", "lexical"):
        m = v[name]
        assert m["tp"] + m["fp"] + m["fn"] + m["tn"] == sum(v["pairs"].values())
        assert all(0.0 <= m[k] <= 1.0 for k in ("precision", "recall", "f1", "auc")), (name, m)
    c = card.calibration
    assert c["threshold"] == pytest.approx(platt(c["logit_threshold"], c["platt_a"], c["platt_b"]))
    assert c["logit_threshold"] == v[v["chosen"]]["threshold"] and 0 < c["threshold"] < 1
    combined = c["combined"]
    assert len(combined["coef"]) == 3 and 0 < combined["threshold"] < 1
    assert combined["two_fold"]["tp"] + combined["two_fold"]["fn"] == 10


def test_fit_combined_weighs_both_signals() -> None:
    """Lexical overlap separates half the pairs, the model's logit the other half: the fit uses both,
    beats each alone out of fold, and its weights score pairs exactly as CombinedSupport does."""
    rng = np.random.default_rng(0)
    pairs, lex, logits = [], [], []
    for i in range(400):
        supported = bool(i % 2)
        easy_for_words = i % 4 < 2
        lex.append((0.9 if supported else 0.2) if easy_for_words else float(rng.uniform(0.3, 0.7)))
        logits.append(
            float(rng.normal(0, 1))
            if easy_for_words
            else (2.0 if supported else -2.0) + float(rng.normal(0, 0.5))
        )
        pairs.append(SupportPair(question_id=f"q{i // 4}", hypothesis=f"h{i}", answer="a", premise="p",
                                 supported=supported, kind="hard"))  # fmt: skip
    fit = fit_combined(pairs, lex, logits)
    assert fit["coef"][0] > 0 and fit["coef"][1] > 0
    assert fit["two_fold"]["auc"] > max(fit["auc_lexical"], fit["auc_model"]) + 0.05
    probs = [
        combined_probability(a, b, fit["coef"], fit["intercept"]) for a, b in zip(lex, logits, strict=True)
    ]
    assert auc(probs, [p.supported for p in pairs]) == pytest.approx(fit["fit_auc"], abs=1e-4)


@pytest.mark.real_models
def test_recalibrating_refits_the_same_combination_and_combined_scores(
    lib: Settings, trained: ModelCard, questions: tuple[Path, Path]
) -> None:
    before = (lib.support_dir / CARD_FILE).read_bytes()
    card = recalibrate_support(lib, questions[1], val_limit=10)
    # Same model, same pairs: the same fit (and the card otherwise untouched).
    new, old = card.calibration["combined"], trained.calibration["combined"]
    assert new["coef"] == pytest.approx(old["coef"], abs=1e-6) and new["threshold"] == pytest.approx(
        old["threshold"]
    )
    assert {k: v for k, v in new.items() if k not in ("coef", "intercept", "threshold")} == {
        k: v for k, v in old.items() if k not in ("coef", "intercept", "threshold")
    }
    assert card.model_copy(update={"calibration": trained.calibration}) == trained  # nothing else changed
    assert ModelCard.model_validate_json((lib.support_dir / CARD_FILE).read_text()) == card
    assert not list(lib.support_dir.glob("*.part"))
    assert before  # the card existed before and was replaced in one rename
    settings = lib.model_copy(update={"agent": lib.agent.model_copy(update={"support": "combined"})})
    support = make_support(settings, None, False)
    assert (
        isinstance(support, CombinedSupport)
        and support.threshold == card.calibration["combined"]["threshold"]
    )
    s = support.score("The model is evaluated on SQuAD.", "Experiments: We evaluate on SQuAD.")
    assert 0.0 <= s <= 1.0


@pytest.mark.real_models
def test_the_trained_support_scores_claims(lib: Settings, trained: ModelCard) -> None:
    settings = lib.model_copy(update={"agent": lib.agent.model_copy(update={"support": "trained"})})
    support = make_support(settings, None, False)
    assert isinstance(support, CrossEncoderSupport) and isinstance(support, SupportScorer)
    assert support.name == f"trained:{trained.model_id}"
    assert support.threshold == trained.calibration["threshold"]
    claim, passage = "The model is evaluated on SQuAD.", "Experiments: We evaluate on SQuAD and TriviaQA."
    scores = [support.score(claim, p) for p in (passage, "Acknowledgements: We thank the reviewers.", "")]
    assert all(0.0 <= s <= 1.0 for s in scores)
    logit = float(OnnxReranker(lib.support_dir, threads=1).score(claim, [passage])[0])
    c = trained.calibration
    assert scores[0] == pytest.approx(platt(logit, c["platt_a"], c["platt_b"]))
    assert (scores[0] >= support.threshold) == (logit >= c["logit_threshold"])


@pytest.mark.real_models
def test_training_again_gives_the_same_model(
    lib: Settings, trained: ModelCard, questions: tuple[Path, Path], tmp_path: Path
) -> None:
    other = lib.model_copy(
        update={"agent": lib.agent.model_copy(update={"support_path": tmp_path / "again"})}
    )
    train, val = questions
    again = train_support(other, CFG, train_path=train, val_path=val, train_limit=30, val_limit=10)
    assert again.onnx_sha256 == trained.onnx_sha256
    timing = "ms_per_pair"
    assert {k: v for k, v in again.validation.items() if k != timing} == {
        k: v for k, v in trained.validation.items() if k != timing
    }
    for key in ("platt_a", "platt_b", "logit_threshold", "threshold"):
        assert again.calibration[key] == trained.calibration[key]


@pytest.mark.real_models
def test_train_cli_installs_then_declines_to_retrain(
    lib: Settings, questions: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cli-support"
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_AGENT__SUPPORT_PATH", str(target))
    train, val = questions
    args = ["train", "support", "--train", str(train), "--validation", str(val), "--layers", "1"]
    args += ["--max-length", "96", "--threads", "1", "--train-limit", "20", "--val-limit", "8"]
    runner = CliRunner()
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    for word in ("questions_validation.json", "Precision", "AUC", "answer_only", "lexical"):
        assert word in " ".join(res.output.split())
    assert "installed" in res.output and "support threshold" in res.output
    card = ModelCard.model_validate_json((target / CARD_FILE).read_text())
    assert card.data["train_questions"] == 20 and card.data["validation_questions"] == 8
    stamp = (target / MODEL_FILE).stat().st_mtime_ns
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "a trained support model is installed" in again.output and "--force" in again.output
    assert "questions_validation.json" not in again.output
    assert (target / MODEL_FILE).stat().st_mtime_ns == stamp


@pytest.mark.real_models
def test_by_default_the_support_model_is_calibrated_on_held_out_train_papers(
    lib: Settings, questions: tuple[Path, Path], tmp_path: Path
) -> None:
    # 1909.00694 and 2003.07723 are held out (sha1 % 10 == 0); the other four train papers are not.
    train, _ = questions
    other = lib.model_copy(update={"agent": lib.agent.model_copy(update={"support_path": tmp_path / "held"})})
    card = train_support(other, CFG, train_path=train, train_limit=20, val_limit=6)
    assert card.data["validation"] == f"questions_train.json: {HELD_OUT_NAME}"
    assert card.calibration["combined"]["fit_on"] == card.data["validation"]

    def mined(prefix: str) -> set[str]:
        files = [p for p in (lib.cache_dir / "support").iterdir() if p.name.startswith(prefix)]
        return {e["question_id"] for p in files for e in json.loads(p.read_text())}

    held_ids = {q["question_id"] for q in json.loads(train.read_text()) if held_out_paper(q["paper_id"])}
    trained_on, calibrated_on = mined("train-held-in-"), mined("held-out-")
    assert trained_on and calibrated_on
    assert calibrated_on <= held_ids and not trained_on & held_ids


@pytest.mark.real_models
def test_lexical_calibration_needs_no_model(
    lib: Settings, questions: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    train, _ = questions
    fig = lexical_calibration(lib, train_path=train, val_limit=6)
    assert fig["fit_on"].endswith(HELD_OUT_NAME) and fig["questions"] == 6
    assert fig["pairs"]["supported"] == 6 and fig["pairs"]["unsupported"] > 6
    assert 0.0 <= fig["best"]["threshold"] <= 1.0 and fig["at_setting"]["threshold"] == 0.44
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    args = ["train", "support", "--lexical", "--train", str(train), "--val-limit", "6"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "best F1" in res.output and "setting" in res.output and "held-out" in res.output
    assert "installed" not in res.output  # nothing trained
