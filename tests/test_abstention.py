"""Calibrated abstention: the signals of an answer (exact values), the rule (probability, threshold,
file round trip, clear errors), the fit (logistic regression against a reference, threshold, AUC,
cross-validation, the one-answer rule), reading traces, the agent's abstention step on a small
library, and `arag train abstention` on the CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from arag.agent import build_agent
from arag.agent.abstention import uses_abstention
from arag.corpus.qasper_questions import held_out_paper
from arag.errors import InputError, ModelError
from arag.eval.answers import AnswerQuestion
from arag.library.manage import load_resolver, open_for_search
from arag.models.abstention import (
    FEATURES,
    NO_SCORE,
    AbstentionRule,
    get_abstention,
    load_rule,
    save_rule,
    signals,
)
from arag.models.reranker import Bars, IdentityReranker, reranker_scale, score_scale, settings_scale
from arag.records import Answer, Citation, NodeEvent, UsedChunk
from arag.retrieval.hybrid import HybridRetriever
from arag.retrieval.pipeline import make_reranking_retriever
from arag.settings import Settings
from arag.train.abstention_fit import (
    Case,
    auc,
    best_threshold,
    cross_validated,
    fit_logistic,
    fit_rule,
    fold_of,
    load_cases,
    nested_gain,
    shares,
    traced_scale,
)


def _chunk(n: int | None, score: float, text: str = "") -> UsedChunk:
    return UsedChunk(
        n=n, chunk_id=f"c{score}", paper_id="p", title="T", score=score, query="q", pass_index=0, text=text
    )


def _answer(**kw: object) -> Answer:
    base: dict[str, object] = {
        "question": "q",
        "short_answer": "",
        "text": "",
        "route": "research",
        "mode": "llm",
    }
    return Answer(**{**base, **kw})  # type: ignore[arg-type]


# --- signals ----------------------------------------------------------------------------------------


def test_signals_of_an_answer_are_exact() -> None:
    a = _answer(
        short_answer="BiLSTM encoder",
        answer_type="span",
        retries=1,
        dropped_claims=2,
        chunks=[
            _chunk(1, 0.5, "We use a BiLSTM."),
            _chunk(None, 3.0, "not in the context"),
            _chunk(2, -1.0, "An encoder."),
            _chunk(3, 2.0, "Other."),
        ],
        citations=[
            Citation(n=1, chunk_id="c0.5", paper_id="p", title="T", support=0.6, supported=True),
            Citation(n=2, chunk_id="c-1.0", paper_id="p", title="T", support=0.4, supported=True),
        ],
    )
    events = [
        NodeEvent(
            node="grader", ms=1, decision="", counts={"coverage": 0.2, "missing": 3, "empty_queries": 1}
        ),
        NodeEvent(
            node="grader", ms=1, decision="", counts={"coverage": 0.75, "missing": 1, "empty_queries": 0}
        ),
    ]
    s = signals(a, events)
    assert list(s) == list(FEATURES)
    # The context's scores only (the 3.0 chunk was not put in the context), best first.
    assert s["best_score"] == 2.0 and s["second_score"] == 0.5
    assert s["mean_top3"] == pytest.approx((2.0 + 0.5 - 1.0) / 3)
    assert s["context_passages"] == 3 and s["retries"] == 1
    # The last grading counts (after the retry).
    assert (s["coverage"], s["missing"], s["empty_queries"]) == (0.75, 1, 0)
    assert s["citations"] == 2 and s["min_support"] == 0.4 and s["mean_support"] == pytest.approx(0.5)
    assert s["dropped_claims"] == 2
    assert s["short_words"] == pytest.approx(math.log1p(2))
    # "bilstm" and "encod" are both in the context's words.
    assert s["short_overlap"] == 1.0
    assert s["short_in_question"] == 0.0 and s["hedged"] == 0.0
    assert (s["yes_no"], s["span"], s["free_form"]) == (0.0, 1.0, 0.0)


def test_signals_see_a_hedged_answer_and_one_that_repeats_the_question() -> None:
    a = _answer(
        question="Which encoder do they use?",
        short_answer="encoder",
        text="The encoder is not specified [1].",
    )
    s = signals(a, [])
    assert s["hedged"] == 1.0 and s["short_in_question"] == 1.0 and s["short_overlap"] == 0.0
    assert signals(a.model_copy(update={"text": "A BiLSTM [1]."}), [])["hedged"] == 0.0


def test_signals_read_the_llms_own_probability_of_not_answering() -> None:
    a = _answer(short_answer="BiLSTM", answer_type="span")
    synth = NodeEvent(
        node="synthesizer",
        ms=1,
        decision="",
        counts={"llm_p_abstain": 0.2, "llm_top_p": 0.7, "llm_entropy": 1.5},
    )
    s = signals(a, [synth])
    assert s["llm_scored"] == 1.0 and s["llm_abstain_logit"] == pytest.approx(math.log(0.2 / 0.8))
    assert (s["llm_top_p"], s["llm_entropy"]) == (0.7, 1.5)
    # Certainty is clipped (log-odds of 1e-4), and a backend that cannot tell leaves the signal out.
    sure = synth.model_copy(update={"counts": {"llm_p_abstain": 0.0}})
    assert signals(a, [sure])["llm_abstain_logit"] == pytest.approx(math.log(1e-4 / (1 - 1e-4)))
    blind = signals(a, [synth.model_copy(update={"counts": {"passages": 3}})])
    assert (blind["llm_scored"], blind["llm_abstain_logit"], blind["llm_top_p"]) == (0.0, 0.0, 0.0)


def test_the_synthesizer_scores_the_short_answers_first_token(lib: Settings) -> None:
    from arag.llm.base import NextToken
    from arag.llm.scripted import ScriptedLLM

    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval, load_resolver(lib))
        retriever = make_reranking_retriever(lib, store, hybrid, IdentityReranker())
        title = "Learning to Compose Neural Networks for Question Answering"
        question = f"In the paper '{title}': what do the modules compute?"
        asked: list[tuple[str, ...]] = []

        def score(messages: object) -> NextToken:
            asked.append(("scored",))
            return NextToken(
                probs={" not": 0.25, " Not": 0.05, " None": 0.0}, top=[(" attention", 0.6)], entropy=1.1
            )

        def reply(messages: object) -> str:
            return "Short answer: attention maps\nExplanation: The modules compute attention [1]."

        def with_confidence(mode: str) -> Settings:
            return lib.model_copy(update={"agent": lib.agent.model_copy(update={"answer_confidence": mode})})

        def synth_counts(settings: Settings, rule: AbstentionRule | None) -> dict[str, float]:
            agent = build_agent(
                settings, retriever, ScriptedLLM(default=reply, next_tokens=score), abstention=rule
            )
            answer = agent.run(question)
            counts = next(e for e in answer.events if e.node == "synthesizer").counts
            assert signals(answer, answer.events)["llm_scored"] == float("llm_p_abstain" in counts)
            return counts

        synth = synth_counts(with_confidence("on"), None)
        assert synth["llm_p_abstain"] == pytest.approx(0.30) and synth["llm_top_p"] == 0.6
        assert asked == [("scored",)]
        # Off (or a hosted API, which cannot tell): no call, no counts.
        assert "llm_p_abstain" not in synth_counts(with_confidence("off"), None) and len(asked) == 1
        # The default, auto: scored only for a rule that is on and weighs the LLM's signals.
        auto = with_confidence("auto")
        assert "llm_p_abstain" not in synth_counts(auto, None) and len(asked) == 1
        blind = _rule(threshold=0.99)
        assert not blind.reads_llm_signals
        assert "llm_p_abstain" not in synth_counts(auto, blind) and len(asked) == 1
        weights = list(blind.weights)
        weights[FEATURES.index("llm_abstain_logit")] = 0.5
        reading = blind.model_copy(update={"weights": weights})
        assert reading.reads_llm_signals
        assert not reading.model_copy(update={"threshold": math.inf}).reads_llm_signals  # off: nothing read
        assert synth_counts(auto, reading)["llm_p_abstain"] == pytest.approx(0.30) and len(asked) == 2
    finally:
        store.close()


def test_signals_of_an_empty_abstention() -> None:
    s = signals(_answer(short_answer="not in the library", abstained=True, mode="abstain"), [])
    assert s["best_score"] == NO_SCORE and s["mean_top3"] == NO_SCORE
    assert s["short_words"] == 0.0 and s["short_overlap"] == 0.0 and s["coverage"] == 0.0


def declines(rule: AbstentionRule, values: dict[str, float]) -> bool:
    """What the agent's step decides (arag.agent.abstention): decline at p >= the threshold."""
    return rule.p_decline(values) >= rule.threshold


# --- the rule ---------------------------------------------------------------------------------------


def _rule(
    threshold: float = 0.5, weight: float = -2.0, bias: float = 0.0, fit: dict[str, object] | None = None
) -> AbstentionRule:
    # Declines when the best score is low: one feature on, the others zero.
    d = len(FEATURES)
    weights = [0.0] * d
    weights[FEATURES.index("best_score")] = weight
    return AbstentionRule(
        mean=[0.0] * d, scale=[1.0] * d, weights=weights, bias=bias, threshold=threshold, fit=fit or {}
    )


def test_rule_probability_and_decision() -> None:
    r = _rule()
    assert r.p_decline({"best_score": 0.0}) == pytest.approx(0.5)
    assert r.p_decline({"best_score": 1.0}) == pytest.approx(1 / (1 + math.exp(2)))
    assert declines(r, {"best_score": -1.0}) and not declines(r, {"best_score": 1.0})
    off = _rule(threshold=math.inf)
    assert not off.active and not declines(off, {"best_score": -100.0})


def test_rule_file_round_trip_keeps_an_off_rule_off(tmp_path: Path) -> None:
    path = tmp_path / "models" / "abstention.json"
    save_rule(path, _rule(threshold=math.inf))
    assert json.loads(path.read_text())["threshold"] is None
    assert not load_rule(path).active
    save_rule(path, _rule(threshold=0.7))
    assert load_rule(path).threshold == 0.7
    assert not list(path.parent.glob("*.tmp"))


def test_rule_file_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="arag train abstention"):
        load_rule(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ModelError, match="unreadable"):
        load_rule(bad)
    data = _rule().model_dump()
    data["features"] = ["best_score", "a_signal_of_the_future", *FEATURES[2:]]
    bad.write_text(json.dumps(data))
    with pytest.raises(ModelError, match="a_signal_of_the_future"):
        load_rule(bad)


def test_settings_select_the_rule(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path, rerank={"provider": "none"})
    assert get_abstention(s) is None  # auto, none fit
    with pytest.raises(ModelError):
        get_abstention(
            s.model_copy(update={"abstention": s.abstention.model_copy(update={"provider": "fitted"})})
        )
    save_rule(s.abstention_path, _rule(fit={"reranker": settings_scale(s)}))
    assert get_abstention(s) is not None
    none = s.model_copy(update={"abstention": s.abstention.model_copy(update={"provider": "none"})})
    assert get_abstention(none) is None


def test_a_rule_holds_only_for_the_reranker_scale_it_was_fit_on(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path, rerank={"provider": "none"})
    assert settings_scale(s) == reranker_scale(IdentityReranker()) == "none, fusion weight 0"
    fit = "trained:minilm-l6-qasper-6f527fa7@112, fusion weight 1, bars -1.925 / -1.271"
    assert score_scale("trained:minilm-l6-qasper-6f527fa7", 112, 1.0, Bars(lower=-1.925, upper=-1.271)) == fit
    save_rule(s.abstention_path, _rule(fit={"reranker": fit}))
    with pytest.raises(ModelError, match="ranked by the reranker trained:minilm") as err:
        get_abstention(s)
    assert "ARAG_ABSTENTION__PROVIDER=none" in err.value.fix and "arag train abstention" in err.value.fix
    # Bars, a fusion weight or a length set in the settings move the scores too.
    moved = Settings(data_dir=tmp_path, rerank={"provider": "none", "fusion_weight": 0.5})
    assert settings_scale(moved) == "none, fusion weight 0.5"
    save_rule(s.abstention_path, _rule(fit={"reranker": settings_scale(s)}))
    with pytest.raises(ModelError, match="fusion weight 0.5"):
        get_abstention(moved)
    # A rule that does not say (an older arag's) is refused when on; a rule that is off declines
    # nothing and is read whatever the reranker.
    save_rule(s.abstention_path, _rule())
    with pytest.raises(ModelError, match="older arag"):
        get_abstention(s)
    save_rule(s.abstention_path, _rule(threshold=math.inf, fit={"reranker": fit}))
    off = get_abstention(s)
    assert off is not None and not off.active


# --- the fit ----------------------------------------------------------------------------------------


def test_fit_logistic_matches_a_reference_solution() -> None:
    # The optimum of the penalised weighted log-loss has zero gradient: check it directly, and
    # against a plain gradient descent run to convergence.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    y = (x[:, 0] - 0.5 * x[:, 1] + rng.normal(scale=0.5, size=60) > 0).astype(float)
    w = rng.uniform(0.2, 1.0, size=60)
    coef, bias = fit_logistic(x, y, w, l2=1.0)
    p = 1 / (1 + np.exp(-(x @ coef + bias)))
    assert np.allclose(x.T @ (w * (p - y)) + 1.0 * coef, 0, atol=1e-6)
    assert abs(float(np.sum(w * (p - y)))) < 1e-6
    beta = np.zeros(4)
    xb = np.hstack([x, np.ones((60, 1))])
    for _ in range(20000):
        q = 1 / (1 + np.exp(-(xb @ beta)))
        beta -= 0.01 * (xb.T @ (w * (q - y)) + np.array([1.0, 1.0, 1.0, 0.0]) * beta)
    assert np.allclose(beta[:3], coef, atol=1e-4) and beta[3] == pytest.approx(bias, abs=1e-4)


def test_best_threshold_takes_the_best_prefix_and_respects_ties() -> None:
    gains = np.array([1.0, -0.3, 0.8, -2.0, 0.5])
    probs = np.array([0.9, 0.8, 0.7, 0.6, 0.1])
    # Prefixes by probability: 1.0, 0.7, 1.5, -0.5, 0.0 -> decline p >= 0.7.
    assert best_threshold(gains, probs) == (0.7, pytest.approx(1.5))
    # Tied probabilities are one decision: the two at 0.7 (+0.6 and -1.0) go together, so p >= 0.7
    # sums 0.6, not the 1.6 that taking the +0.6 alone would; the best is p >= 0.9.
    tied = np.array([0.9, 0.7, 0.7, 0.6, 0.1])
    assert best_threshold(np.array([1.0, 0.6, -1.0, -0.5, 0.1]), tied) == (0.9, pytest.approx(1.0))
    assert best_threshold(np.array([-1.0, -0.5]), np.array([0.9, 0.1])) == (math.inf, 0.0)


def test_auc_counts_ties_half() -> None:
    assert auc([0.9, 0.8, 0.1], [True, False, False]) == 1.0
    assert auc([0.5, 0.5], [True, False]) == 0.5
    assert auc([0.1, 0.9, 0.4, 0.6], [True, True, False, False]) == 0.5
    assert auc([0.3], [True]) is None


def test_folds_are_fixed_by_id() -> None:
    assert fold_of("q1") == fold_of("q1") and {fold_of(f"q{i}") for i in range(50)} == set(range(5))


def _cases(n: int, signal: bool, seed: int = 0) -> list[Case]:
    """n questions, a fifth unanswerable; with ``signal`` their best score is low, else random."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        un = i % 5 == 0
        best = (rng.normal(-2.0 if un else 1.0, 0.5)) if signal else rng.normal(0, 1)
        x = [0.0] * len(FEATURES)
        x[FEATURES.index("best_score")] = float(best)
        x[FEATURES.index("coverage")] = float(rng.uniform())
        f1 = 0.0 if un else float(rng.uniform(0.2, 1.0))
        out.append(Case(f"q{i}", "unanswerable" if un else "extractive", f1, 1.0 if un else 0.0, tuple(x)))
    out.append(Case("abstained", "abstractive", 0.0, 0.0, None))
    return out


def test_fit_turns_the_rule_on_when_a_signal_separates() -> None:
    cases = _cases(100, signal=True)
    rule = fit_rule(cases, fit_on="questions_train.json: held-out")
    assert rule.active
    f = rule.fit
    assert f["auc_unanswerable_cv"] > 0.95 and f["gain_answers"] >= 15
    assert f["answer_f1_after_cv"] > f["answer_f1_before"]
    assert f["after_cv"]["declined_unanswerable"] >= 0.9 and f["after_cv"]["answered_answerable"] >= 0.9
    assert f["before"]["declined_unanswerable"] == 0.0
    # The fitted rule itself declines low-scoring answers and gives high-scoring ones.
    low = {"best_score": -2.0, "coverage": 0.5}
    assert declines(rule, low) and not declines(rule, {"best_score": 1.0, "coverage": 0.5})
    assert f["weights"]["best_score"] < 0 and f["fit_on"].startswith("questions_train.json")


def test_fit_leaves_the_rule_off_on_noise() -> None:
    rule = fit_rule(_cases(100, signal=False, seed=3), fit_on="x")
    assert not rule.active and rule.fit["gain_answers"] < 1.0


def test_the_nested_estimate_does_not_let_a_question_choose_its_own_threshold() -> None:
    # Noise: the best threshold on every fold's probabilities always finds some gain (it picks the
    # luckiest prefix); decided fold by fold with thresholds from the other folds, the gain is gone.
    cases = [c for c in _cases(100, signal=False, seed=1) if c.x is not None]
    gains = np.asarray([c.decline_f1 - c.answer_f1 for c in cases])
    _, flat = best_threshold(gains, cross_validated(cases))
    nested, declined = nested_gain(cases)
    assert flat == pytest.approx(0.627, abs=1e-3) and nested == pytest.approx(-0.951, abs=1e-3)
    assert len(declined) == 5
    by_id = {c.question_id: g for c, g in zip(cases, gains, strict=True)}
    assert nested == pytest.approx(sum(by_id[q] for q in declined))
    # A real signal survives it: 19 of the 20 unanswerable questions declined, no answerable one.
    cases = [c for c in _cases(100, signal=True) if c.x is not None]
    nested, declined = nested_gain(cases)
    unanswerable = {c.question_id for c in cases if c.unanswerable}
    assert declined < unanswerable and len(declined) == 19 and nested == 19.0


def test_fit_needs_enough_answered_questions() -> None:
    with pytest.raises(InputError, match="too few"):
        fit_rule(_cases(5, signal=True), fit_on="x")


def test_shares_count_abstentions_as_declined() -> None:
    cases = [
        Case("a", "unanswerable", 0.0, 1.0, None),
        Case("b", "unanswerable", 0.0, 1.0, (0.0,)),
        Case("c", "extractive", 1.0, 0.0, (0.0,)),
        Case("d", "extractive", 0.0, 0.0, None),
    ]
    assert shares(cases, set()) == {"declined_unanswerable": 0.5, "answered_answerable": 0.5}
    assert shares(cases, {"b", "c"}) == {"declined_unanswerable": 1.0, "answered_answerable": 0.0}


# --- traces -----------------------------------------------------------------------------------------


def _question(qid: str, unanswerable: bool, paper_id: str = "1601.00901") -> AnswerQuestion:
    annotation = {
        "unanswerable": unanswerable,
        "yes_no": None,
        "free_form_answer": "",
        "extractive_spans": [] if unanswerable else ["BiLSTM"],
        "evidence": [] if unanswerable else ["We use a BiLSTM."],
    }
    return AnswerQuestion(
        question_id=qid,
        paper_id=paper_id,
        paper_title="T",
        question="What encoder?",
        evidence=[] if unanswerable else ["We use a BiLSTM."],
        answers=[annotation],
        kind="unanswerable" if unanswerable else "extractive",
    )


def _trace_row(qid: str, **kw: object) -> dict[str, object]:
    row: dict[str, object] = {
        "config": "full", "question_id": qid, "paper_id": "1601.00901", "question": "What encoder?",
        "kind": "extractive", "route": "research", "answer_type": "span", "mode": "llm", "sub_queries": [],
        "passes": 1, "kept": [], "decisions": [{"node": "verifier", "decision": "", "ms": 1}], "timings": {},
        "total_ms": 1.0, "short_answer": "BiLSTM", "text": "", "prediction": "BiLSTM", "abstained": False,
        "answer_f1": 1.0, "answer_f1_text": 1.0, "evidence_f1": 0.0, "predicted_evidence": [],
        "citation_validity": 1.0, "invalid_markers_removed": 0, "claims": 1, "supported_claims": 1,
        "support_rate": 1.0, "signals": {f: 0.5 for f in FEATURES},
    }  # fmt: skip
    return {**row, **kw}


def test_load_cases_scores_declining_with_the_official_metric(tmp_path: Path) -> None:
    qs = [_question("a", False), _question("b", True), _question("c", False)]
    path = tmp_path / "t.jsonl"
    rows = [
        _trace_row("a"),
        _trace_row("b", answer_f1=0.0),
        _trace_row("c", abstained=True, answer_f1=0.0, signals={}),
        _trace_row("a", config="naive"),
        _trace_row("zz"),
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cases = load_cases(path, qs)
    assert [(c.question_id, c.answer_f1, c.decline_f1, c.x is None) for c in cases] == [
        ("a", 1.0, 0.0, False),
        ("b", 0.0, 1.0, False),
        ("c", 0.0, 0.0, True),
    ]
    assert cases[0].x == tuple([0.5] * len(FEATURES))


def test_load_cases_refuses_traces_answered_with_a_rule_or_without_signals(tmp_path: Path) -> None:
    qs = [_question("a", False)]
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_trace_row("a", decisions=[{"node": "abstention", "decision": "", "ms": 1}])))
    with pytest.raises(InputError, match="ARAG_ABSTENTION__PROVIDER=none"):
        load_cases(path, qs)
    path.write_text(json.dumps(_trace_row("a", signals={})))
    with pytest.raises(InputError, match="older arag"):
        load_cases(path, qs)
    with pytest.raises(InputError, match="no traces file"):
        load_cases(tmp_path / "none.jsonl", qs)


def test_traced_scale_is_the_traces_reranker_and_refuses_a_mix(tmp_path: Path) -> None:
    qs = [_question("a", False), _question("b", True)]
    path = tmp_path / "t.jsonl"
    a, b = "trained:m@112, fusion weight 1", "trained:m@128, fusion weight 1"
    path.write_text(json.dumps(_trace_row("a", reranker=a)) + "\n" + json.dumps(_trace_row("b", reranker=a)))
    assert traced_scale(path, qs) == a
    # Naive RAG's rows rerank nothing and are not what a rule is fit on.
    with path.open("a") as fh:
        fh.write("\n" + json.dumps(_trace_row("a", config="naive", reranker=None)))
    assert traced_scale(path, qs) == a
    path.write_text(json.dumps(_trace_row("a")))
    assert traced_scale(path, qs) is None  # an older arag's traces do not say
    path.write_text(json.dumps(_trace_row("a", reranker=a)) + "\n" + json.dumps(_trace_row("b", reranker=b)))
    with pytest.raises(InputError, match="different rerankers"):
        traced_scale(path, qs)


# --- the agent's step -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    return small_library(rerank={"provider": "none"}, llm={"provider": "extractive"})


def test_the_agent_declines_an_answer_the_rule_finds_weak_and_gives_the_others(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval, load_resolver(lib))
        retriever = make_reranking_retriever(lib, store, hybrid, IdentityReranker())
        title = "Learning to Compose Neural Networks for Question Answering"
        question = f"In the paper '{title}': what do the modules compute?"
        plain = build_agent(lib, retriever, None, abstention=None).run(question)
        assert not plain.abstained and "abstention" not in [e.node for e in plain.events]
        # Off: the step is not in the graph.
        off = build_agent(lib, retriever, None, abstention=_rule(threshold=math.inf))
        assert not uses_abstention(off.deps)
        assert "abstention" not in [e.node for e in off.run(question).events]
        # A rule declining every answer whose best score is under 1e6: this one.
        always = _rule(threshold=0.5, weight=-1.0, bias=1e6)
        declined = build_agent(lib, retriever, None, abstention=always).run(question)
        step = next(e for e in declined.events if e.node == "abstention")
        assert declined.abstained and declined.short_answer == "not in the library"
        assert declined.citations == [] and "withheld" in declined.text and step.counts["p_decline"] == 1.0
        # The withheld short answer stays in the trace, for the paired "without the rule" figures.
        assert step.decision.endswith(f"withheld short answer {plain.short_answer!r}")
        # A rule that never declines leaves the answer as it was.
        never = _rule(threshold=0.5, weight=0.0, bias=-1e6)
        kept = build_agent(lib, retriever, None, abstention=never).run(question)
        assert kept.short_answer == plain.short_answer and not kept.abstained
        assert next(e for e in kept.events if e.node == "abstention").decision.startswith("answered")
    finally:
        store.close()


# --- the CLI ----------------------------------------------------------------------------------------


def test_train_abstention_on_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from arag.cli.main import app

    held = next(p for p in (f"2001.{i:05d}" for i in range(100)) if held_out_paper(p))
    qs = [_question(f"q{i}", i % 4 == 0, held) for i in range(60)]
    qfile = tmp_path / "questions_train.json"
    qfile.write_text(json.dumps([q.model_dump() for q in qs]))
    rows = []
    for i, q in enumerate(qs):
        un = q.kind == "unanswerable"
        sig = {f: 0.0 for f in FEATURES}
        sig["best_score"] = -3.0 + 0.01 * i if un else 2.0 - 0.01 * i
        rows.append(
            json.dumps(_trace_row(q.question_id, kind=q.kind, answer_f1=0.0 if un else 0.8, signals=sig))
        )
    traces = tmp_path / "fit.jsonl"
    traces.write_text("\n".join(rows))
    monkeypatch.setenv("ARAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("ARAG_RERANK__PROVIDER", "none")
    r = CliRunner().invoke(app, ["train", "abstention", "--traces", str(traces), "--questions", str(qfile)])
    assert r.exit_code == 0, r.output
    assert "the rule is on" in r.output and "AUC" in r.output
    # Traces that do not name their reranker: recorded with the one in use, and said so.
    assert "do not name the reranker" in r.output
    rule = load_rule(tmp_path / "data" / "models" / "abstention.json")
    assert rule.active and rule.fit["after_cv"]["declined_unanswerable"] == 1.0
    assert rule.fit["reranker"] == "none, fusion weight 0"
    # Traces of another reranker: the rule is theirs, with a warning that it is refused until it is back.
    other = "trained:m@112, fusion weight 1"
    named = tmp_path / "named.jsonl"
    named.write_text("\n".join(json.dumps({**json.loads(row), "reranker": other}) for row in rows))
    r = CliRunner().invoke(app, ["train", "abstention", "--traces", str(named), "--questions", str(qfile)])
    assert r.exit_code == 0, r.output
    assert "will be refused" in r.output
    assert load_rule(tmp_path / "data" / "models" / "abstention.json").fit["reranker"] == other
    assert rule.fit["fit_on"].startswith("questions_train.json: held-out train papers")
    # Traces of other papers' questions are not named as the held-out split.
    qfile.write_text(
        json.dumps([_question(q.question_id, q.kind == "unanswerable").model_dump() for q in qs])
    )
    r = CliRunner().invoke(app, ["train", "abstention", "--traces", str(traces), "--questions", str(qfile)])
    assert r.exit_code == 0, r.output
    fit_on = load_rule(tmp_path / "data" / "models" / "abstention.json").fit["fit_on"]
    assert fit_on == "questions_train.json (fit.jsonl)"
    r = CliRunner().invoke(app, ["train", "abstention", "--traces", str(tmp_path / "no.jsonl")])
    assert r.exit_code != 0 and "no traces file" in r.output
