"""QASPER's official Answer-F1 / Evidence-F1, on hand-worked cases and on the real validation file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arag.errors import InputError
from arag.eval.qasper_metrics import (
    ANSWER_TYPES,
    QuestionScore,
    evaluate,
    normalize_answer,
    paragraph_f1_score,
    reference_from_annotation,
    score_question,
    token_f1_score,
)


def exact(expected: Any) -> Any:
    """A hand-worked value, compared up to float rounding only."""
    return pytest.approx(expected, rel=1e-12, abs=1e-12)


def ann(
    *,
    spans: list[str] | None = None,
    free: str = "",
    yes_no: bool | None = None,
    unanswerable: bool = False,
    evidence: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "unanswerable": unanswerable,
        "yes_no": yes_no,
        "free_form_answer": free,
        "extractive_spans": spans or [],
        "evidence": evidence or [],
    }


# --- normalisation and token F1 -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Cat, a dog; AN apple!", "cat dog apple"),
        ("  Hello   World.\n", "hello world"),
        ("theory another", "theory another"),  # articles only as whole words
        ("Isn't state-of-the-art", "isnt stateoftheart"),  # punctuation goes before articles are matched
        ("BIBREF19, BIBREF20", "bibref19 bibref20"),
        ("The", ""),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_token_f1_partial_overlap_worked_by_hand() -> None:
    # pred -> [cat, sat, on, mat] (4), gold -> [cat, sat] (2); 2 shared: P = 1/2, R = 1, F1 = 2/3.
    assert token_f1_score("The cat sat on the mat.", "a cat sat") == exact(2 / 3)
    # Shared tokens are counted with multiplicity: min(3, 1) = 1; P = 1/3, R = 1, F1 = 1/2.
    assert token_f1_score("cat cat cat", "cat") == exact(0.5)
    # pred [a1 b c] vs gold [b c d e]: 2 shared, P = 2/3, R = 1/2, F1 = 4/7.
    assert token_f1_score("a1 b c", "b c d e") == exact(4 / 7)
    assert token_f1_score("Yes.", "yes") == 1.0
    assert token_f1_score("cat", "dog") == 0.0


def test_token_f1_empty_is_zero_even_against_empty() -> None:
    # The official script returns 0 whenever no token is shared, including both-empty.
    assert token_f1_score("", "") == 0.0
    assert token_f1_score("the", "a") == 0.0
    assert token_f1_score("", "cat") == 0.0


# --- evidence F1 -----------------------------------------------------------------------------------


def test_paragraph_f1_edge_cases() -> None:
    assert paragraph_f1_score([], []) == 1.0
    assert paragraph_f1_score([], ["p1"]) == 0.0
    assert paragraph_f1_score(["p1"], []) == 0.0
    assert paragraph_f1_score(["p1", "p2"], ["p2", "p1"]) == 1.0
    # 1 shared of 3 predicted and 2 gold: P = 1/3, R = 1/2, F1 = 2/5.
    assert paragraph_f1_score(["a", "b", "c"], ["a", "d"]) == exact(0.4)
    # Precision divides by the list length: a repeated paragraph halves it (P = 1/2, R = 1, F1 = 2/3).
    assert paragraph_f1_score(["a", "a"], ["a"]) == exact(2 / 3)
    # Exact string match, no normalisation.
    assert paragraph_f1_score(["A paragraph."], ["a paragraph"]) == 0.0


# --- references --------------------------------------------------------------------------------------


def test_reference_extraction_per_annotation_kind() -> None:
    ref = reference_from_annotation(ann(spans=["BIBREF19", "BIBREF20"], evidence=["p"]))
    assert (ref.answer, ref.type, ref.evidence) == ("BIBREF19, BIBREF20", "extractive", ["p"])
    ref = reference_from_annotation(ann(free="a free answer", evidence=["p"]))
    assert (ref.answer, ref.type) == ("a free answer", "abstractive")
    assert reference_from_annotation(ann(yes_no=True)).answer == "Yes"
    ref = reference_from_annotation(ann(yes_no=False))
    assert (ref.answer, ref.type) == ("No", "boolean")
    # Unanswerable: fixed string, evidence dropped even if some was listed.
    ref = reference_from_annotation(ann(unanswerable=True, evidence=["p"]))
    assert (ref.answer, ref.type, ref.evidence) == ("Unanswerable", "none", [])
    # QASPER's original nesting ({"answer": {...}}) reads the same.
    assert reference_from_annotation({"answer": ann(yes_no=False)}).answer == "No"


def test_float_selected_evidence_kept_by_default_dropped_on_request() -> None:
    gold = [ann(free="x", evidence=["FLOAT SELECTED: Table 1: Results.", "para"])]
    # Default (official script without --text_evidence_only): P = 1, R = 1/2, F1 = 2/3.
    assert score_question("x", ["para"], gold).evidence_f1 == exact(2 / 3)
    assert score_question("x", ["para"], gold, text_evidence_only=True).evidence_f1 == 1.0
    only_float = [ann(free="x", evidence=["FLOAT SELECTED: Figure 2: A plot."])]
    assert score_question("x", [], only_float).evidence_f1 == 0.0
    assert score_question("x", [], only_float, text_evidence_only=True).evidence_f1 == 1.0


def test_bad_annotations_raise_input_error() -> None:
    with pytest.raises(InputError, match="no answer"):
        reference_from_annotation(ann())
    with pytest.raises(InputError, match="extractive_spans"):
        reference_from_annotation({"unanswerable": False, "yes_no": None, "free_form_answer": ""})
    with pytest.raises(InputError, match="no annotations"):
        score_question("x", [], [])


# --- one question ----------------------------------------------------------------------------------


def test_yes_no_and_unanswerable_questions() -> None:
    yes = [ann(yes_no=True, evidence=["p1"])]
    assert score_question("Yes.", ["p1"], yes) == QuestionScore(
        answer_f1=1.0, evidence_f1=1.0, answer_type="boolean", answer_annotation=0, evidence_annotation=0
    )
    assert score_question("No", ["p1"], yes).answer_f1 == 0.0
    # A verbose yes still overlaps on "yes": P = 1/3, R = 1, F1 = 1/2.
    assert score_question("yes it does", [], yes).answer_f1 == exact(0.5)
    unans = [ann(unanswerable=True)]
    score = score_question("unanswerable", [], unans)
    assert (score.answer_f1, score.evidence_f1, score.answer_type) == (1.0, 1.0, "none")
    assert score_question("Unanswerable", ["p1"], unans).evidence_f1 == 0.0


def test_extractive_spans_are_joined_before_scoring() -> None:
    gold = [ann(spans=["BIBREF19", "BIBREF20"], evidence=["p"])]
    assert score_question("BIBREF19, BIBREF20", ["p"], gold).answer_f1 == 1.0
    # One of two span tokens: P = 1, R = 1/2, F1 = 2/3.
    assert score_question("BIBREF19", ["p"], gold).answer_f1 == exact(2 / 3)


def test_answer_and_evidence_are_maximised_independently() -> None:
    gold = [ann(spans=["cat sat"], evidence=["p1"]), ann(free="dog", evidence=["p2"])]
    score = score_question("cat sat", ["p2"], gold)
    assert score == QuestionScore(
        answer_f1=1.0, evidence_f1=1.0, answer_type="extractive", answer_annotation=0, evidence_annotation=1
    )
    score = score_question("dog", ["p1", "p3"], gold)
    assert (score.answer_f1, score.answer_type, score.answer_annotation) == (1.0, "abstractive", 1)
    # Evidence from annotation 0: P = 1/2, R = 1, F1 = 2/3.
    assert score.evidence_f1 == exact(2 / 3)
    assert score.evidence_annotation == 0


def test_answer_type_tie_goes_to_first_annotation() -> None:
    gold = [ann(free="red"), ann(spans=["blue"]), ann(yes_no=True)]
    score = score_question("green", [], gold)
    assert (score.answer_f1, score.answer_type, score.answer_annotation) == (0.0, "abstractive", 0)
    gold = [ann(spans=["a red car"]), ann(free="red car")]
    assert score_question("red car", [], gold).answer_type == "extractive"


# --- aggregation ---------------------------------------------------------------------------------


def _question(qid: str, answers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"paper_id": "p", "paper_title": "T", "question_id": qid, "question": "?", "answers": answers}


def test_evaluate_by_type_and_missing_predictions() -> None:
    questions = [
        _question("q1", [ann(spans=["cat sat"], evidence=["p1"])]),
        _question("q2", [ann(yes_no=True, evidence=["p2"])]),
        _question("q3", [ann(free="dog", evidence=["p3"])]),
        _question("q4", [ann(spans=["red car"], evidence=["p4", "p5"]), ann(unanswerable=True)]),
        _question("q5", [ann(unanswerable=True)]),
    ]
    predictions = {
        "q1": ("cat sat", ["p1"]),  # answer 1, evidence 1 (extractive)
        "q2": ("No", ["p2", "px"]),  # answer 0 (boolean), evidence P = 1/2, R = 1 -> 2/3
        # q3 missing: 0 and 0, in no type
        "q4": ("red", ["p4"]),  # answer P = 1, R = 1/2 -> 2/3 (extractive); evidence 2/3
        "q5": ("Unanswerable", []),  # answer 1 (none), evidence 1
        "other": ("ignored", []),
    }
    report = evaluate(predictions, questions)
    assert report.num_questions == 5
    assert report.missing_predictions == 1
    assert report.missing_question_ids == ["q3"]
    assert set(report.scores) == {"q1", "q2", "q4", "q5"}
    assert report.answer_f1 == exact((1 + 0 + 0 + 2 / 3 + 1) / 5)
    assert report.evidence_f1 == exact((1 + 2 / 3 + 0 + 2 / 3 + 1) / 5)
    assert report.answer_f1_by_type == exact(
        {"extractive": (1 + 2 / 3) / 2, "abstractive": 0.0, "boolean": 0.0, "none": 1.0}
    )
    assert report.questions_by_type == {"extractive": 2, "abstractive": 0, "boolean": 1, "none": 1}
    official = report.official_dict()
    assert list(official) == ["Answer F1", "Answer F1 by type", "Evidence F1", "Missing predictions"]
    assert official["Missing predictions"] == 1
    assert list(official["Answer F1 by type"]) == list(ANSWER_TYPES)


def test_evaluate_with_no_predictions_and_duplicate_ids() -> None:
    questions = [_question("q1", [ann(free="x")]), _question("q2", [ann(yes_no=False)])]
    report = evaluate({}, questions)
    assert (report.answer_f1, report.evidence_f1, report.missing_predictions) == (0.0, 0.0, 2)
    assert report.answer_f1_by_type == {t: 0.0 for t in ANSWER_TYPES}
    with pytest.raises(InputError, match="twice"):
        evaluate({}, questions + questions[:1])


# --- real data ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def validation_questions(shared_dir: Path) -> list[dict[str, Any]]:
    path = shared_dir / "benchmarks" / "qasper" / "questions_validation.json"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    questions: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))[:200]
    return questions


def _own_answer(a: dict[str, Any]) -> str:
    if a["unanswerable"]:
        return "Unanswerable"
    if a["extractive_spans"]:
        return ", ".join(a["extractive_spans"])
    return a["free_form_answer"] or ("Yes" if a["yes_no"] else "No")


def test_first_annotation_scores_perfectly_on_real_questions(
    validation_questions: list[dict[str, Any]],
) -> None:
    predictions = {
        q["question_id"]: (_own_answer(q["answers"][0]), list(q["answers"][0]["evidence"]))
        for q in validation_questions
    }
    report = evaluate(predictions, validation_questions)
    assert report.num_questions == 200 and report.missing_predictions == 0
    assert report.answer_f1 == 1.0
    assert report.evidence_f1 == 1.0
    assert all(s.answer_annotation == 0 and s.evidence_annotation == 0 for s in report.scores.values())
    present = {t for t, n in report.questions_by_type.items() if n}
    assert present == set(ANSWER_TYPES)
    assert all(report.answer_f1_by_type[t] == 1.0 for t in present)


def test_empty_prediction_scores_low_on_real_questions(validation_questions: list[dict[str, Any]]) -> None:
    predictions: dict[str, tuple[str, list[str]]] = {q["question_id"]: ("", []) for q in validation_questions}
    report = evaluate(predictions, validation_questions)
    assert report.answer_f1 == 0.0
    # Empty evidence is right only where some annotation has none (unanswerable or no evidence given).
    empty_ok = sum(
        any(a["unanswerable"] or not a["evidence"] for a in q["answers"]) for q in validation_questions
    )
    assert 0 < empty_ok < 60
    assert report.evidence_f1 == exact(empty_ok / 200)
