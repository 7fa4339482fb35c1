"""The abstention rule's paired effect: the answers it declined scored as withheld, exactly."""

from __future__ import annotations

from typing import Any

from arag.eval.answers import AnswerQuestion, TraceRow
from arag.eval.rule_effect import declined_by_rule, rule_effect, withheld_short_answer


def _question(qid: str, unanswerable: bool) -> AnswerQuestion:
    annotation = {
        "unanswerable": unanswerable,
        "yes_no": None,
        "free_form_answer": "",
        "extractive_spans": [] if unanswerable else ["BiLSTM encoder"],
        "evidence": [] if unanswerable else ["We use a BiLSTM encoder."],
    }
    return AnswerQuestion(
        question_id=qid,
        paper_id="1601.00901",
        paper_title="T",
        question="What encoder?",
        evidence=[] if unanswerable else ["We use a BiLSTM encoder."],
        answers=[annotation],
        kind="unanswerable" if unanswerable else "extractive",
    )


def _row(
    qid: str, kind: str, *, f1: float, abstained: bool, decisions: list[Any], draft: str | None = None
) -> TraceRow:
    return TraceRow.model_validate(
        {
            "config": "full", "question_id": qid, "paper_id": "1601.00901", "question": "What encoder?",
            "kind": kind, "route": "research", "answer_type": "span", "mode": "llm", "sub_queries": [],
            "passes": 1, "kept": [], "decisions": decisions, "timings": {}, "total_ms": 1.0,
            "short_answer": "x", "text": "", "prediction": "x", "abstained": abstained, "answer_f1": f1,
            "answer_f1_text": f1, "evidence_f1": 0.0, "predicted_evidence": [], "citation_validity": None,
            "invalid_markers_removed": 0, "claims": 0, "supported_claims": 0, "support_rate": None,
            "draft_short_answer": draft,
        }
    )  # fmt: skip


def _declined(withheld: str) -> list[dict[str, Any]]:
    decision = f"abstain: decline p=0.70 >= 0.41; withheld short answer {withheld!r}"
    return [{"node": "abstention", "decision": decision, "ms": 1}]


def test_the_withheld_answer_is_read_from_the_decision_or_else_the_draft() -> None:
    new = _row("a", "extractive", f1=0.0, abstained=True, decisions=_declined("it's a BiLSTM"), draft="other")
    before = [{"node": "abstention", "decision": "abstain: decline p=0.70 >= 0.41", "ms": 1}]
    old = _row("a", "extractive", f1=0.0, abstained=True, decisions=before, draft="the draft")
    answered = [{"node": "abstention", "decision": "answered (decline p=0.20 < 0.41)", "ms": 1}]
    kept = _row("a", "extractive", f1=1.0, abstained=False, decisions=answered)
    assert declined_by_rule(new) and declined_by_rule(old) and not declined_by_rule(kept)
    assert withheld_short_answer(new) == "it's a BiLSTM"
    assert withheld_short_answer(old) == "the draft"


def test_rule_effect_scores_the_declined_answers_as_withheld() -> None:
    qs = [_question("a", False), _question("b", True), _question("c", False), _question("d", True)]
    rows = [
        # an answerable question declined: its withheld answer scores 1.0 without the rule
        _row("a", "extractive", f1=0.0, abstained=True, decisions=_declined("BiLSTM encoder")),
        # an unanswerable question declined: right with the rule (1.0), wrong without (0.0)
        _row("b", "unanswerable", f1=1.0, abstained=True, decisions=_declined("a CNN")),
        # untouched rows count the same both ways
        _row("c", "extractive", f1=0.5, abstained=False, decisions=[]),
        _row("d", "unanswerable", f1=0.0, abstained=False, decisions=[]),
    ]
    effect = rule_effect(rows, qs)
    assert effect is not None
    counts = (effect.declined, effect.declined_unanswerable, effect.declined_answerable, effect.unknown)
    assert counts == (2, 1, 1, 0)
    assert effect.answer_f1_with.mean == (0.0 + 1.0 + 0.5 + 0.0) / 4
    assert effect.answer_f1_without.mean == (1.0 + 0.0 + 0.5 + 0.0) / 4
    assert effect.difference.mean == 0.0 and effect.difference.n == 4
    assert effect.abstain_unanswerable_without == 0.0 and effect.answered_answerable_without == 1.0
    # A run in which the rule declined nothing has no effect to report.
    assert rule_effect(rows[2:], qs) is None
