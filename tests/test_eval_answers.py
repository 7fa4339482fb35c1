"""Answer evaluation: pure scoring and taxonomy on hand-made answers, stratified sampling, the naive
baseline's prompt, and ``arag eval answers`` end to end on a 6-paper hash-embedder library with a
scripted LLM whose replies are functions of the prompt."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from arag.agent import prompts
from arag.agent.support import LexicalSupport
from arag.cli import eval_answers as answers_cli
from arag.cli.main import app
from arag.corpus.qasper_questions import HELD_OUT_NAME
from arag.eval.answers import (
    AnswerQuestion,
    claim_support,
    classify_failure,
    draft_short_answer,
    load_answer_questions,
    mapped_evidence,
    marker_validity,
    prediction,
    score_answer,
    strata,
    stratified_sample,
)
from arag.eval.naive import NAIVE_SYSTEM, NaiveRAG
from arag.eval.qasper_metrics import score_question
from arag.library.manage import open_for_search
from arag.llm.base import ChatMessage, NextToken
from arag.llm.scripted import ScriptedLLM
from arag.records import Answer, Chunk, Citation, NodeEvent, UsedChunk
from arag.settings import Settings

runner = CliRunner()
GOLD = "We train on the Penn Treebank. The corpus has one million words."
CONFIGS = ["naive", "extractive", "full", "no-verifier", "one-pass"]


def _ann(
    *, spans: Sequence[str] = (), free: str = "", yes_no: bool | None = None, unanswerable: bool = False
) -> dict[str, Any]:
    return {
        "unanswerable": unanswerable,
        "extractive_spans": list(spans),
        "free_form_answer": free,
        "yes_no": yes_no,
        "evidence": [] if unanswerable else [GOLD],
        "highlighted_evidence": [],
    }


def _q(qid: str, *annotations: dict[str, Any], evidence: Sequence[str] = (GOLD,)) -> AnswerQuestion:
    kind = {True: "unanswerable"}.get(annotations[0]["unanswerable"]) or (
        "extractive"
        if annotations[0]["extractive_spans"]
        else "abstractive"
        if annotations[0]["free_form_answer"]
        else "yes_no"
    )
    return AnswerQuestion(
        question_id=qid,
        paper_id="p1",
        paper_title="A Paper",
        question="What corpus do they train on?",
        evidence=list(evidence),
        answers=list(annotations),
        kind=kind,  # type: ignore[arg-type]
    )


def _chunk(cid: str, text: str) -> Chunk:
    return Chunk(
        id=cid,
        paper_id="p1",
        index=0,
        title="A Paper",
        type="passage",
        text=text,
        embed_text=text,
        n_tokens=5,
    )


CHUNKS = {
    "gold": _chunk("gold", "Intro. We train on the Penn Treebank. Nothing else."),
    "other": _chunk("other", "Our optimiser is Adam with a learning rate of 0.001."),
}


def _answer(
    short: str,
    text: str = "",
    *,
    kept: Sequence[str] = ("gold",),
    cited: Sequence[tuple[int, str]] = (),
    abstained: bool = False,
    events: Sequence[tuple[str, str]] = (),
) -> Answer:
    return Answer(
        question="q",
        short_answer=short,
        text=text,
        citations=[
            Citation(n=n, chunk_id=c, paper_id="p1", title="A Paper", support=1.0, supported=True)
            for n, c in cited
        ],
        abstained=abstained,
        route="research",
        mode="abstain" if abstained else "llm",
        chunks=[
            UsedChunk(n=i, chunk_id=c, paper_id="p1", title="A Paper", score=1.0, query="q", pass_index=0)
            for i, c in enumerate(kept, 1)
        ],
        events=[NodeEvent(node=n, ms=1.0, decision=d) for n, d in events],
        timings={"retriever": 2.0},
        total_ms=5.0,
    )


# --- pure scoring -------------------------------------------------------------------------------


def test_abstention_is_unanswerable_and_scores_one_against_an_unanswerable_gold() -> None:
    unans = _q("u", _ann(unanswerable=True), evidence=())
    for a in (
        _answer("not in the library", prompts.ABSTAIN, kept=(), abstained=True),
        _answer("not in the library", "The passages do not say [1].", kept=("other",), cited=[(1, "other")]),
    ):
        assert prediction(a) == "Unanswerable"
        row = score_answer("c", unans, a, CHUNKS)
        assert (row.answer_f1, row.abstained, row.failure) == (1.0, True, None)
    # Nothing cited, nothing in the gold: evidence F1 1.0, as the official script counts it.
    assert score_answer("c", unans, _answer("x", abstained=True, kept=()), CHUNKS).evidence_f1 == 1.0
    # Against an answerable gold the same abstention scores 0.
    row = score_answer("c", _q("a", _ann(spans=["Penn Treebank"])), _answer("", abstained=True), CHUNKS)
    assert row.answer_f1 == 0.0 and row.failure == "abstained_wrongly"


def test_answer_f1_is_the_official_score_of_the_short_answer() -> None:
    q = _q("q", _ann(spans=["the Penn Treebank"]), _ann(free="Penn Treebank corpus"))
    a = _answer("Penn Treebank", "They train on the Penn Treebank [1].", cited=[(1, "gold")])
    row = score_answer("c", q, a, CHUNKS)
    assert row.answer_f1 == score_question("Penn Treebank", [], q.answers).answer_f1 == 1.0
    # The explanation as the prediction: "they train on penn treebank" holds both gold tokens of 5.
    assert row.answer_f1_text == pytest.approx(2 * (2 / 5) * 1 / (2 / 5 + 1))
    assert row.evidence_f1 == 1.0 and row.predicted_evidence == [GOLD]
    assert row.citation_validity == 1.0 and (row.claims, row.supported_claims) == (1, 1)


def test_cited_chunks_map_to_gold_paragraphs_by_containment() -> None:
    other = "A different paragraph. It talks about optimisers and schedules."
    texts = ["x. We train on the Penn Treebank.", "the corpus has one million words. More.", "Adam is used."]
    # Both chunks hold part of the first gold paragraph: it counts once; the third is a false positive.
    assert mapped_evidence(texts, [GOLD, other]) == [GOLD, "Adam is used."]
    assert mapped_evidence([], [GOLD]) == []


def test_marker_validity_and_claim_support() -> None:
    ok = _answer("x", "They train on the Penn Treebank [1].", cited=[(1, "gold")])
    bad = _answer("x", "They train on the Penn Treebank [1]. Adam is used [3].", cited=[(1, "gold")])
    assert marker_validity(ok) == 1.0 and marker_validity(bad) == 0.0
    assert marker_validity(_answer("x", "No markers here.")) is None
    passages = {1: CHUNKS["gold"].text}
    text = "They train on the Penn Treebank [1]. Quokkas annotate it in Perth [1]. Yes. Uncited about BERT."
    assert claim_support(text, passages, LexicalSupport(0.5)) == (3, 1)
    # The LLM's sentence may start in lower case; a paper's quoted sentence is cut as its prose is.
    point = "We train on the Penn Treebank, cf. the appendix. e.g. the Penn Treebank [1]."
    llm = "Quokkas annotate it in Perth. the Penn Treebank is used for training [1]."
    assert claim_support(llm, passages, LexicalSupport(0.5)) == (2, 1)
    both = f"{llm}\n\n{point}"
    assert claim_support(both, passages, LexicalSupport(0.5), quoted={point}) == (3, 2)


def test_taxonomy_on_hand_made_cases() -> None:
    # The pure classifier, first match wins.
    kw: dict[str, Any] = {"abstained": False, "evidence_kept": True, "verifier_dropped_right": False}
    assert classify_failure(answer_f1=0.8, kind="extractive", **kw) is None
    assert classify_failure(answer_f1=0.0, kind="extractive", **kw) == "generation_wrong"
    assert classify_failure(answer_f1=0.0, kind="unanswerable", **kw) == "answered_unanswerable"
    assert (
        classify_failure(answer_f1=0.0, kind="yes_no", **{**kw, "evidence_kept": None}) == "no_text_evidence"
    )
    assert (
        classify_failure(answer_f1=0.0, kind="extractive", **{**kw, "evidence_kept": False})
        == "retrieval_miss"
    )
    wrong_abstain = {**kw, "abstained": True}
    assert classify_failure(answer_f1=0.0, kind="abstractive", **wrong_abstain) == "abstained_wrongly"
    dropped = {**kw, "abstained": True, "evidence_kept": False, "verifier_dropped_right": True}
    assert classify_failure(answer_f1=0.0, kind="extractive", **dropped) == "verifier_removed"

    # The same classes from answers and their traces.
    q = _q("q", _ann(spans=["Penn Treebank"]))
    miss = _answer("Adam", "Adam is used [1].", kept=("other",), cited=[(1, "other")])
    assert score_answer("c", q, miss, CHUNKS).failure == "retrieval_miss"
    wrong = _answer("Adam", "Adam is used [1].", kept=("other", "gold"), cited=[(1, "other")])
    row = score_answer("c", q, wrong, CHUNKS)
    assert row.failure == "generation_wrong" and [k.gold for k in row.kept] == [False, True]
    gated = _answer(
        "not in the library", prompts.ABSTAIN, abstained=True, events=[("verifier", "abstain (x)")]
    )
    assert score_answer("c", q, gated, CHUNKS).failure == "abstained_wrongly"
    removed = _answer(
        "not in the library",
        prompts.ABSTAIN,
        abstained=True,
        events=[
            ("synthesizer", 'llm; short answer "the Penn Treebank\'s"; removed 1 invalid citation(s)'),
            ("verifier", "abstain: the core claim is not supported by its passages"),
        ],
    )
    assert draft_short_answer(removed) == "the Penn Treebank's"
    row = score_answer("c", q, removed, CHUNKS)
    # "penn treebanks" against "penn treebank": F1 0.5, a right answer (the bar is 0.5).
    assert (row.failure, row.draft_f1, row.answer_f1) == ("verifier_removed", 0.5, 0.0)


def _kinds_questions() -> list[AnswerQuestion]:
    anns = {
        "extractive": _ann(spans=["x"]),
        "abstractive": _ann(free="y"),
        "yes_no": _ann(yes_no=True),
        "unanswerable": _ann(unanswerable=True),
    }
    plan = ["extractive"] * 50 + ["abstractive"] * 30 + ["yes_no"] * 12 + ["unanswerable"] * 8
    # Interleave the kinds so that file order is not kind order.
    order = sorted(range(100), key=lambda i: (i * 37) % 100)
    return [_q(f"q{i:03d}", anns[plan[i]]) for i in order]


def test_stratified_sampling_is_deterministic_and_proportional() -> None:
    qs = _kinds_questions()
    assert strata(qs) == {"yes_no": 12, "extractive": 50, "abstractive": 30, "unanswerable": 8}
    a = stratified_sample(qs, 20, seed=0)
    # 20 x (12, 50, 30, 8)% = 2.4, 10, 6, 1.6: floors 2, 10, 6, 1; the one left goes to the largest remainder.
    assert strata(a) == {"yes_no": 2, "extractive": 10, "abstractive": 6, "unanswerable": 2}
    assert a == stratified_sample(qs, 20, seed=0)
    assert [q.question_id for q in a] != [q.question_id for q in stratified_sample(qs, 20, seed=1)]
    # In file order, no repeats.
    pos = {q.question_id: i for i, q in enumerate(qs)}
    assert [pos[q.question_id] for q in a] == sorted({pos[q.question_id] for q in a})
    assert stratified_sample(qs, 500) == qs and stratified_sample(qs, 0) == []


def test_both_question_formats_load_alike(tmp_path: Path) -> None:
    flat = [
        {
            "paper_id": "p1",
            "paper_title": "T",
            "question_id": "a",
            "question": "Q1?",
            "answers": [_ann(spans=["x"])],
        },
        {"paper_id": "p1", "paper_title": "T", "question_id": "b", "question": "Q2?", "answers": []},
        {
            "paper_id": "p2",
            "paper_title": "U",
            "question_id": "c",
            "question": "Q3?",
            "answers": [_ann(yes_no=False)],
        },
    ]
    official = {
        "p1": {"title": "T", "qas": [{"question_id": q["question_id"], "question": q["question"],
                                      "answers": [{"answer": a} for a in q["answers"]]} for q in flat[:2]]},
        "p2": {"title": "U", "qas": [{"question_id": "c", "question": "Q3?",
                                      "answers": [{"answer": _ann(yes_no=False)}]}]},
    }  # fmt: skip
    (tmp_path / "flat.json").write_text(json.dumps(flat))
    (tmp_path / "v03.json").write_text(json.dumps(official))
    got_flat = load_answer_questions(tmp_path / "flat.json")
    got_v03 = load_answer_questions(tmp_path / "v03.json")
    assert got_flat == got_v03
    qs, skipped = got_flat
    assert skipped == 1 and [(q.question_id, q.kind, q.evidence) for q in qs] == [
        ("a", "extractive", [GOLD]),
        ("c", "yes_no", [GOLD]),
    ]


# --- on a small library ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    return small_library(rerank={"provider": "none"}, llm={"provider": "extractive"})


@pytest.fixture(scope="module")
def questions_file(lib: Settings, shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The train questions of the library's papers (10 of them, every kind)."""
    store, _ = open_for_search(lib)
    try:
        papers = store.paper_ids()
    finally:
        store.close()
    train = json.loads((shared_dir / "benchmarks" / "qasper" / "questions_train.json").read_text())
    mine = [q for q in train if q["paper_id"] in papers]
    path = tmp_path_factory.mktemp("answers-q") / "questions.json"
    path.write_text(json.dumps(mine))
    return path


def _passage(user: str, n: int) -> str:
    """The text of passage [n] in an agent or naive prompt."""
    m = re.search(rf"^\[{n}\] [^\n]*\n(.*?)(?:\n\n\[\d+\] |\n\nQuestion:)", user, re.S | re.M)
    assert m, user
    return m.group(1)


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=\.)\s", text.replace("… ", ""))[0].rstrip(".")


def scripted() -> ScriptedLLM:
    """Replies by prompt kind; answers quote passage [1]'s first sentence, citing [1] (and an invalid
    [9] from the naive baseline, which nothing removes)."""

    def reply(messages: Sequence[ChatMessage]) -> str:
        system, user = messages[0].content, messages[-1].content
        if system == prompts.ROUTER_SYSTEM:
            return '{"route": "research"}'
        if system == prompts.PLANNER_SYSTEM:
            return '{"kind": "simple", "sub_queries": []}'
        if system == prompts.GRADER_SYSTEM:
            return '{"sufficient": true}'
        if system == prompts.REFORMULATOR_SYSTEM:
            return '{"queries": ["datasets languages"]}'
        if system in (prompts.SYNTH_SYSTEM, NAIVE_SYSTEM):
            first = _first_sentence(_passage(user, 1))
            extra = " See also [9]." if system == NAIVE_SYSTEM else ""
            return f"Short answer: {' '.join(first.split()[:4])}\nExplanation: {first} [1].{extra}"
        raise AssertionError(f"unexpected prompt: {system[:60]}")

    # The model's first-token probabilities, scored only where something reads them.
    first = NextToken(probs={" not": 0.1}, top=[(" the", 0.5)], entropy=2.0)
    return ScriptedLLM([], default=reply, next_tokens=first)


def test_naive_prompt_holds_exactly_the_top_5_dense_chunks(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    try:
        llm = scripted()
        naive = NaiveRAG(store, embedder, llm)
        query = "In the paper 'Learning to Compose Neural Networks for Question Answering': what is composed?"
        top = store.dense_search(embedder.embed_query(query), 5)
        a = naive.run(query)
    finally:
        store.close()
    assert len(top) == 5 and len(llm.calls) == 1
    system, user = llm.calls[0][0].content, llm.calls[0][1].content
    assert system == NAIVE_SYSTEM
    assert re.findall(r"^\[(\d+)\] ", user, re.M) == ["1", "2", "3", "4", "5"]
    for i, h in enumerate(top, 1):
        assert _passage(user, i) == h.chunk.text
    assert [c.chunk_id for c in a.chunks] == [h.chunk.id for h in top]
    # [9] names no chunk: kept in the text (the baseline does not clean up) and not a citation.
    assert [c.n for c in a.citations] == [1] and marker_validity(a) == 0.0
    assert [e.node for e in a.events] == ["retrieve", "generate"] and set(a.timings) == {
        "retrieve",
        "generate",
    }
    assert naive.book.keys() == {h.chunk.id for h in top}


def _env(monkeypatch: pytest.MonkeyPatch, lib: Settings) -> None:
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_RERANK__PROVIDER", "none")
    monkeypatch.setenv("ARAG_LLM__PROVIDER", "extractive")


def test_cli_compares_every_configuration(
    lib: Settings, questions_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _env(monkeypatch, lib)
    monkeypatch.setattr(answers_cli, "_make_llm", lambda settings: scripted())
    # Wide enough for every configuration's column to show its figures whole.
    monkeypatch.setattr(answers_cli.console, "width", 200)
    out = tmp_path / "out"
    args = ["eval", "answers", "--questions", str(questions_file), "--configs", ",".join(CONFIGS)]
    args += ["--json", str(out / "s.json"), "--traces", str(out / "t.jsonl"), "--plot", str(out / "a.png")]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "10 questions (all): yes_no 1, extractive 5, abstractive 3, unanswerable 1" in res.output
    summary = json.loads((out / "s.json").read_text())
    assert summary["skipped"] == {} and summary["questions"] == 10 and summary["llm"] == "scripted"
    reports = {r["config"]: r for r in summary["configs"]}
    assert list(reports) == CONFIGS
    questions = {q["question_id"]: q for q in json.loads(questions_file.read_text())}
    rows = [json.loads(line) for line in (out / "t.jsonl").read_text().splitlines()]
    assert sorted((r["config"], r["question_id"]) for r in rows) == sorted(
        (c, qid) for c in CONFIGS for qid in questions
    )
    for r in rows:
        # The official score of the recorded prediction, max over the annotations.
        gold = questions[r["question_id"]]["answers"]
        assert r["answer_f1"] == score_question(r["prediction"], [], gold).answer_f1
        assert (r["prediction"] == "Unanswerable") == r["abstained"]
        assert r["decisions"] and r["total_ms"] > 0
    for c, rep in reports.items():
        mine = [r for r in rows if r["config"] == c]
        f1 = rep["metrics"]["answer_f1"]
        assert f1["n"] == 10 and f1["lo"] <= f1["mean"] <= f1["hi"]
        assert f1["mean"] == pytest.approx(sum(r["answer_f1"] for r in mine) / 10)
        assert rep["official"]["Answer F1"] == pytest.approx(f1["mean"])
        # The console shows the official by-type figures beside the question-kind ones.
        for kind, value in rep["official"]["Answer F1 by type"].items():
            assert re.search(rf"official {kind} .*{value:.3f}", res.output)
        assert rep["metrics"]["abstain_unanswerable"]["n"] == 1
        assert rep["metrics"]["answered_answerable"]["n"] == 9
        assert rep["wrong"] == sum(rep["taxonomy"].values()) == sum(r["failure"] is not None for r in mine)
        assert rep["total_p50_ms"] <= rep["total_p95_ms"]
    by = {c: [r for r in rows if r["config"] == c] for c in CONFIGS}
    assert set(reports["naive"]["latency_p50_ms"]) == {"retrieve", "generate"}
    assert all(r["passes"] == 1 and len(r["kept"]) == 5 for r in by["naive"])
    # The naive baseline's invalid [9] counts against it; the agent removed its own invalid markers.
    assert reports["naive"]["metrics"]["citation_validity"]["mean"] == 0.0
    assert reports["full"]["metrics"]["citation_validity"]["mean"] == 1.0
    assert all(r["mode"] in ("extractive", "abstain") for r in by["extractive"])
    assert (
        all(r["passes"] == 1 for r in by["one-pass"]) and reports["one-pass"]["settings"]["max_retries"] == 0
    )
    assert any(r["passes"] == 2 for r in by["full"])
    assert all(r["verifier_claims"].get("dropped", 0) == 0 for r in by["no-verifier"])
    assert reports["no-verifier"]["settings"]["verifier"] == "off (claims accepted)"
    assert (out / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "failure taxonomy" in res.output and "retrieval_miss" in res.output
    # Traces are for fitting an abstention rule: they carry the LLM's first-token signals as well.
    assert summary["machine"]["answer_confidence"] == "on" and summary["machine"]["cores"] >= 1
    assert "first-token scoring on" in res.output
    assert all(r["signals"]["llm_scored"] == 1.0 for r in by["full"] if r["mode"] == "llm")
    assert any(r["mode"] == "llm" for r in by["full"])


def test_cli_without_an_llm_skips_llm_configs_and_says_so(
    lib: Settings, questions_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _env(monkeypatch, lib)
    args = ["eval", "answers", "--questions", str(questions_file), "--limit", "4"]
    res = runner.invoke(app, [*args, "--json", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    assert "4 questions (stratified sample (seed 0) of 10)" in res.output
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [r["config"] for r in summary["configs"]] == ["extractive"]
    assert set(summary["skipped"]) == {"naive", "full", "no-verifier", "one-pass"}
    assert "skipped naive" in res.output and "LLM provider is extractive" in res.output
    assert sum(summary["strata"].values()) == 4
    # No traces, no rule: nothing reads the first-token signals, so no answer pays for them.
    assert summary["machine"]["answer_confidence"] == "auto" and summary["machine"]["llama_build"] is None
    only_llm = runner.invoke(app, [*args, "--configs", "full"])
    assert only_llm.exit_code != 0 and "no chosen configuration" in only_llm.output


@pytest.mark.parametrize("command", ["answers", "retrieval"])
def test_cli_warns_about_questions_outside_the_library_and_rejects_bad_limits(
    command: str, lib: Settings, questions_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _env(monkeypatch, lib)
    with_evidence = [
        q
        for q in json.loads(questions_file.read_text())
        if any(e and not e.startswith("FLOAT") for a in q["answers"] for e in a.get("evidence", []))
    ]
    mine = with_evidence[:3]  # retrieval scores only questions with text evidence
    other = {**mine[0], "paper_id": "9999.99999", "question_id": "elsewhere-1"}
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps([*mine, other, {**other, "question_id": "elsewhere-2"}]))
    extra = ["--methods", "dense", "--scope", "paper"] if command == "retrieval" else []
    extra = extra or ["--configs", "extractive"]
    res = runner.invoke(
        app, ["eval", command, "--questions", str(mixed), *extra, "--json", str(tmp_path / "s.json")]
    )
    assert res.exit_code == 0, res.output
    assert "warning: 2 of 5 questions are about papers not in the library" in res.output
    summary = json.loads((tmp_path / "s.json").read_text())
    first = summary if command == "answers" else summary[0]
    assert first["not_in_library"] == 2
    assert first["questions"] == 3  # the two about other papers are not scored

    none = tmp_path / "none.json"
    none.write_text(json.dumps([other]))
    res = runner.invoke(app, ["eval", command, "--questions", str(none), *extra])
    assert res.exit_code == 8 and "none of the 1 questions" in res.output
    for bad in ("0", "-2"):
        res = runner.invoke(app, ["eval", command, "--questions", str(mixed), "--limit", bad, *extra])
        assert res.exit_code == 8 and "--limit must be at least 1" in res.output, res.output


def test_the_split_note_says_what_was_fit_where_and_warns_about_overlap() -> None:
    s = Settings()
    val = Path("questions_validation.json")
    train = Path("questions_train.json")
    held = f"questions_train.json: {HELD_OUT_NAME}"
    note = answers_cli.split_note(val, False, s, "trained:m", None, held)
    assert note["reported_on"] == "questions_validation.json" and "warning" not in note
    assert any(f"calibrated on {held}" in f for f in note["fit_on"])
    # A reranker calibrated on validation (an old card), reported on validation: not held out.
    old = answers_cli.split_note(val, False, s, "trained:m", None, "questions_validation.json")
    assert "not held out" in old["warning"] and "arag train reranker --force" in old["warning"]
    # Reporting on the held-out train papers the reranker was calibrated on: the same.
    assert "warning" in answers_cli.split_note(train, True, s, "trained:m", None, held)
    # The abstention rule, fit on the held-out train papers' answers: named; and a warning when
    # those are the questions reported on.
    rule = f"{held} (fit.jsonl)"
    ruled = answers_cli.split_note(val, False, s, "trained:m", None, held, rule)
    assert "warning" not in ruled and f"the abstention rule: fit on {rule}" in ruled["fit_on"]
    on_fit = answers_cli.split_note(train, True, s, "none", None, None, rule)
    assert "abstention rule was fit on these questions" in on_fit["warning"]
    # No trained reranker: nothing of QASPER was fit.
    bare = answers_cli.split_note(val, False, s, "none", None)
    assert "warning" not in bare and len(bare["fit_on"]) == 1
    assert (
        "nothing fit on QASPER" in bare["fit_on"][0]
        and "support threshold: on QASPER train" in bare["fit_on"][0]
    )
    # A fine-tuned embedder in use: named as fit on QASPER train.
    tuned = s.model_copy(
        update={"embedding": s.embedding.model_copy(update={"provider": "onnx-minilm", "path": Path("/m/e")})}
    )
    named = answers_cli.split_note(val, False, tuned, "none", None)["fit_on"]
    assert "embedder" not in named[0] and "the embedder (e): fine-tuned on QASPER train" in named[1]


def test_cli_scores_the_answers_a_rule_declined_without_it(
    lib: Settings, questions_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from arag.models.abstention import FEATURES, AbstentionRule, save_rule

    _env(monkeypatch, lib)
    monkeypatch.setattr(answers_cli, "_make_llm", lambda settings: scripted())
    # A rule that declines every answer it sees (bias 1e6): what it withheld is scored paired.
    d = len(FEATURES)
    # Fit on answers ranked as these are: no reranker, the fused order.
    scale = "none, fusion weight 0"
    rule = AbstentionRule(
        mean=[0.0] * d, scale=[1.0] * d, weights=[0.0] * d, bias=1e6, threshold=0.5, fit={"reranker": scale}
    )
    save_rule(tmp_path / "rule.json", rule)
    monkeypatch.setenv("ARAG_ABSTENTION__PROVIDER", "fitted")
    monkeypatch.setenv("ARAG_ABSTENTION__PATH", str(tmp_path / "rule.json"))
    args = ["eval", "answers", "--questions", str(questions_file), "--configs", "full"]
    # A rule fit with another reranker reads scores on another scale: refused, with the way to refit.
    save_rule(
        tmp_path / "rule.json",
        rule.model_copy(update={"fit": {"reranker": "trained:x@128, fusion weight 1"}}),
    )
    res = runner.invoke(app, args)
    assert res.exit_code != 0 and "trained:x@128" in res.output and "arag train abstention" in res.output
    save_rule(tmp_path / "rule.json", rule)
    res = runner.invoke(
        app, [*args, "--json", str(tmp_path / "s.json"), "--traces", str(tmp_path / "t.jsonl")]
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert {r["reranker"] for r in rows} == {scale}
    declined = [r for r in rows if any(d["node"] == "abstention" and d["decision"].startswith("abstain:")
                                       for d in r["decisions"])]  # fmt: skip
    assert declined and all(r["abstained"] for r in declined)
    effect = json.loads((tmp_path / "s.json").read_text())["abstention_rule_effect"]["full"]
    assert effect["declined"] == len(declined) and effect["unknown"] == 0
    questions = {q["question_id"]: q for q in json.loads(questions_file.read_text())}
    without = []
    for r in rows:
        f1 = r["answer_f1"]
        if r in declined:
            withheld = next(d["decision"] for d in r["decisions"] if d["node"] == "abstention")
            short = withheld.split("withheld short answer ", 1)[1][1:-1]
            f1 = score_question(short, [], questions[r["question_id"]]["answers"]).answer_f1
        without.append(f1)
    assert effect["answer_f1_without"]["mean"] == pytest.approx(sum(without) / len(rows))
    assert effect["answer_f1_with"]["mean"] == pytest.approx(sum(r["answer_f1"] for r in rows) / len(rows))
    assert "the abstention rule declined" in res.output and "without it" in res.output
