"""The answer specialists and the reader's pure parts: span decoding, the readings' summary, the
decision rules, the threshold fit, and the training examples (exact results on tiny inputs)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from arag.agent.specialists import Summary, Thresholds, decide, span_sentence, summarize
from arag.corpus.qasper_questions import held_out_paper
from arag.eval.qasper_metrics import references_for_question
from arag.models.reader import FREE, NO, NONE, SPAN, YES, Reading, best_span
from arag.records import Paper, Section
from arag.train.reader_calibrate import Case, fit_thresholds, outcome, thresholds_dict
from arag.train.reader_data import annotation_kind, find_span, question_examples, with_neighbour


def reading(none: float, span: float, yes: float, no: float, text: str = "", sp: float = 0.0) -> Reading:
    free = 1.0 - none - span - yes - no
    return Reading((none, span, yes, no, free), text, 0, len(text), sp)


# --- span decoding --------------------------------------------------------------------------------


def test_best_span_takes_the_best_pair_within_the_allowed_tokens() -> None:
    start = np.array([9.0, 0.0, 3.0, 0.0, 1.0])
    end = np.array([9.0, 0.0, 0.0, 2.0, 4.0])
    allowed = np.array([False, True, True, True, True])  # token 0 is the question
    a, b, p = best_span(start, end, allowed)
    assert (a, b) == (2, 4)
    s = np.exp([0.0, 3.0, 0.0, 1.0])
    e = np.exp([0.0, 0.0, 2.0, 4.0])
    assert p == pytest.approx(s[1] / s.sum() * e[3] / e.sum())


def test_best_span_never_ends_before_it_starts_nor_runs_too_long() -> None:
    # The best pair overall would end (token 0) before it starts (token 2): (2, 2) is the best valid one.
    start = np.array([0.0, 0.0, 5.0])
    end = np.array([5.0, 0.0, 1.0])
    assert best_span(start, end, np.ones(3, dtype=bool))[:2] == (2, 2)
    # (0, 3) scores 10 but is 4 tokens long: with at most 2, (0, 1) is best.
    start = np.array([5.0, 0.0, 0.0, 0.0])
    end = np.array([0.0, 1.0, 0.0, 5.0])
    assert best_span(start, end, np.ones(4, dtype=bool), max_tokens=2)[:2] == (0, 1)
    assert best_span(start, end, np.zeros(4, dtype=bool)) == (-1, -1, 0.0)


# --- summary and decisions ------------------------------------------------------------------------


def test_summary_takes_the_surest_span_and_votes_yes_no() -> None:
    rs = [
        reading(0.9, 0.1, 0.0, 0.0, "weak", 0.9),
        reading(0.1, 0.7, 0.1, 0.0, "BERT BIBREF3.", 0.8),
        reading(0.2, 0.0, 0.2, 0.6),
    ]
    s = summarize(rs)
    assert s.span == "BERT" and s.span_index == 1
    assert s.span_conf == pytest.approx(0.56)
    assert s.p_answer == pytest.approx(0.9)
    assert s.yes_no == "No"
    # |0.3 - 0.6| / 0.9, times the strongest yes/no passage's mass (0.8)
    assert s.yes_no_margin == pytest.approx((0.3 / 0.9) * 0.8)
    assert summarize([]) == Summary(0.0, "", -1, 0.0, None, 0.0)
    assert summarize(rs, [0.5, 2.0, -1.0]).evidence == 2.0


def test_decide_follows_the_thresholds_by_answer_type() -> None:
    s = Summary(p_answer=0.8, span="BERT", span_index=0, span_conf=0.5, yes_no="No", yes_no_margin=0.6)
    off = Thresholds()
    assert decide("span", False, s, off) == ("keep", "")
    assert decide("span", True, s, off) == ("keep", "")
    th = Thresholds(span=0.4, yes_no=0.5, answer=0.45, abstain=0.3)
    assert decide("span", False, s, th) == ("span", "BERT")
    assert decide("yes_no", False, s, th) == ("yes_no", "No")
    assert decide("free_form", False, s, th) == ("keep", "")
    assert decide("free_form", False, s, Thresholds(free=0.5)) == ("span", "BERT")
    assert decide("span", True, s, th) == ("answer", "BERT")
    assert decide("yes_no", True, s, th) == ("keep", "")  # only a span answers an abstention
    low = Summary(0.2, "BERT", 0, 0.5, "No", 0.6)
    assert decide("span", False, low, th) == ("abstain", "")
    assert decide("span", False, s, Thresholds(span=0.6)) == ("keep", "")
    weak = Summary(0.8, "BERT", 0, 0.5, "No", 0.6, evidence=-2.0)
    assert decide("span", False, weak, Thresholds(evidence=-1.0)) == ("abstain", "")
    assert decide("span", False, weak, Thresholds(evidence=-3.0)) == ("keep", "")


def test_span_sentence_is_the_sentence_holding_the_span() -> None:
    text = "We use SQuAD. The encoder is BERT-base with 12 layers. It is fine-tuned."
    i = text.index("BERT-base")
    assert span_sentence(text, i, i + 9) == "The encoder is BERT-base with 12 layers."


# --- the fit --------------------------------------------------------------------------------------


def case(qid: str, answer_type: str, abstained: bool, agent_f1: float, s: Summary, gold: dict) -> Case:
    refs = references_for_question([gold], text_evidence_only=True, where=qid)
    return Case(qid, "extractive", answer_type, abstained, agent_f1, s, tuple(refs))


SPAN_GOLD = {
    "unanswerable": False, "yes_no": None, "free_form_answer": "",
    "extractive_spans": ["BERT"], "evidence": [],
}  # fmt: skip
NONE_GOLD = {
    "unanswerable": True, "yes_no": None, "free_form_answer": "", "extractive_spans": [], "evidence": []
}  # fmt: skip


def test_outcome_scores_the_specialists_answer_with_the_official_metric() -> None:
    s = Summary(0.9, "the BERT model", 0, 0.8, None, 0.0)
    c = case("q1", "span", False, 0.0, s, SPAN_GOLD)
    assert outcome(c, Thresholds()) == 0.0  # kept: the agent's F1
    assert outcome(c, Thresholds(span=0.5)) == pytest.approx(2 * (1 / 2) * 1 / (1 / 2 + 1))  # "bert model"
    n = case("q2", "span", False, 0.0, Summary(0.1, "", -1, 0.0, None, 0.0), NONE_GOLD)
    assert outcome(n, Thresholds(abstain=0.2)) == 1.0


def test_a_rule_worth_less_than_one_answer_stays_off() -> None:
    good = Summary(0.9, "BERT", 0, 0.9, None, 0.0)
    cases = [case("g0", "span", False, 0.5, good, SPAN_GOLD)]  # the span would add 0.5 of an answer
    cases += [
        case(f"n{i}", "free_form", False, 0.0, Summary(0.9, "", -1, 0.0, None, 0.0), NONE_GOLD)
        for i in range(5)
    ]
    th, fig = fit_thresholds(cases)
    assert th == Thresholds() and fig["answer_f1_after"] == fig["answer_f1_before"]


def test_the_fit_turns_on_only_the_rules_that_help() -> None:
    good = Summary(0.9, "BERT", 0, 0.9, None, 0.0)
    bad = Summary(0.9, "LSTM", 0, 0.2, None, 0.0)
    cases = [case(f"g{i}", "span", False, 0.3, good, SPAN_GOLD) for i in range(3)]
    cases += [case(f"b{i}", "span", False, 1.0, bad, SPAN_GOLD) for i in range(3)]
    th, fig = fit_thresholds(cases)
    # The confident spans are right, the unsure ones wrong: the bar falls between them.
    assert 0.2 < th.span <= 0.9
    assert fig["answer_f1_after"] == pytest.approx(1.0)
    assert fig["answer_f1_before"] == pytest.approx(0.65)
    assert th.abstain == -math.inf and th.answer == math.inf and th.yes_no == math.inf
    assert th.evidence == -math.inf
    assert th.free == math.inf
    # Only the rules that are on are written to the card (JSON has no infinity); the rest are off.
    assert set(thresholds_dict(th)) == {"span"} and Thresholds.of(thresholds_dict(th)) == th


# --- training examples ----------------------------------------------------------------------------


def test_find_span_exact_then_ignoring_case() -> None:
    assert find_span("We train on SQuAD v1.1 data.", ["squad v1.1"]) == (12, 22)
    assert find_span("abc", ["", "x", "b"]) == (1, 2)
    assert find_span("abc", ["zz"]) is None


def test_annotation_kind() -> None:
    assert annotation_kind(NONE_GOLD) == NONE
    assert annotation_kind(SPAN_GOLD) == SPAN
    assert annotation_kind({"yes_no": True}) == YES
    assert annotation_kind({"yes_no": False}) == NO
    assert annotation_kind({"yes_no": None, "extractive_spans": [], "free_form_answer": "x"}) == FREE


def test_with_neighbour_shifts_the_paragraph() -> None:
    paras = ["First one.", "Second one.", "Third one."]

    class Always(random.Random):
        def random(self) -> float:
            return 0.0

    text, shift = with_neighbour(paras, 2, Always(), joined=1.0)
    assert text == "Second one.\nThird one." and text[shift:] == "Third one."
    assert with_neighbour(paras, 1, random.Random(0), joined=0.0) == ("Second one.", 0)


def test_question_examples_label_positives_and_pick_negatives() -> None:
    paper = Paper(
        id="2001.00001",
        title="T",
        abstract="We study parsing.",
        sections=[
            Section(name="Model", paragraphs=["Our encoder is BERT.", "Parsing uses a chart parser."]),
            Section(name="Data", paragraphs=["We use the Penn Treebank for parsing experiments."]),
        ],
        source="qasper",
    )
    item = {
        "question_id": "q",
        "question": "Which encoder do they use for parsing?",
        "answers": [
            {**SPAN_GOLD, "evidence": ["Our encoder is BERT.", "FLOAT SELECTED: Table 1"]},
            {"unanswerable": False, "yes_no": None, "free_form_answer": "a BERT encoder",
             "extractive_spans": [], "evidence": ["Our encoder is BERT."]},
        ],
    }  # fmt: skip
    exs = question_examples(item, paper, seed=0, negatives=2)
    pos = [e for e in exs if e.label != NONE]
    assert len(pos) == 1 and pos[0].label == SPAN and pos[0].span is not None
    assert pos[0].passage[pos[0].span[0] : pos[0].span[1]] == "BERT"
    negs = [e.passage for e in exs if e.label == NONE]
    assert len(negs) == 2 and "Our encoder is BERT." not in negs
    # The hard negative shares the most question terms ("parsing" twice over).
    assert "We use the Penn Treebank for parsing experiments." in negs or "We study parsing." in negs


def test_held_out_papers_are_about_one_in_ten() -> None:
    ids = [f"{1800 + i // 100}.{i:05d}" for i in range(2000)]
    share = sum(held_out_paper(i) for i in ids) / len(ids)
    assert 0.07 < share < 0.13
    assert held_out_paper(ids[0]) == held_out_paper(ids[0])
