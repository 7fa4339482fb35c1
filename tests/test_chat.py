"""Conversations without a library: the rule rewriter (table-driven), the LLM rewriter with a scripted LLM
and its fallback, and the SQLite history (persistence, concurrent writers)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from arag.agent import prompts
from arag.agent.chat_history import ChatHistory, Exchange, validate_session_id
from arag.agent.follow_up import (
    Rewriter,
    clean_reply,
    follow_up,
    main_subject,
    rewrite_prompt,
    rewrite_rules,
    split_scope,
)
from arag.errors import InputError, ModelError
from arag.llm.base import ChatMessage
from arag.llm.scripted import ScriptedLLM
from arag.records import Answer
from arag.retrieval.resolve import PaperResolver

COMPOSE = "Learning to Compose Neural Networks for Question Answering"
PARAPHRASE = "Paraphrase Generation from Latent-Variable PCFGs for Semantic Parsing"
RESOLVER = PaperResolver(
    [
        ("1601.00901", "Joint learning of ontology and semantic parser from text"),
        ("1601.01705", COMPOSE),
        ("1601.06068", PARAPHRASE),
    ]
)
SCOPED = f"In the paper '{COMPOSE}': what do the modules compute?"
LEAD = f"In the paper '{COMPOSE}':"


# --- rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "message", "expected"),
    [
        # The paper scope is carried; "it" disagrees with "the modules", so it stays.
        (SCOPED, "How is it trained?", f"{LEAD} how is it trained?"),
        # Inside one paper, "they" are its authors more often than the previous subject.
        (SCOPED, "What dataset do they use?", f"{LEAD} what dataset do they use?"),
        (SCOPED, "What datasets does this paper use?", f"{LEAD} what datasets does this paper use?"),
        (SCOPED, "Why?", f"{LEAD} why?"),
        # "What about <another paper>?" / "and in <arXiv id>?": the same question, of that paper.
        (SCOPED, f"What about '{PARAPHRASE}'?", f"In the paper '{PARAPHRASE}': what do the modules compute?"),
        (SCOPED, "And in 1601.00901?", "In the paper 1601.00901: what do the modules compute?"),
        # Not follow-ups: unchanged.
        (SCOPED, "What is the capital of France?", "What is the capital of France?"),
        (SCOPED, "hello", "hello"),
        (SCOPED, "what is 12*7", "what is 12*7"),
        # A message naming its own paper keeps its own scope.
        (SCOPED, "How is it trained in 1601.06068?", "How is it trained in 1601.06068?"),
        # No paper scope: the subject replaces an agreeing pronoun or demonstrative.
        ("What dataset does BERT use?", "How is it trained?", "How is BERT trained?"),
        ("What dataset does BERT use?", "What about ELMo?", "What dataset does ELMo use?"),
        ("What dataset does BERT use?", "And ELMo?", "What dataset does ELMo use?"),
        ("What is the accuracy on SQuAD?", "And on TriviaQA?", "What is the accuracy on TriviaQA?"),
        (
            "What is the accuracy on SQuAD?",
            "How does it compare to BERT?",
            "How does the accuracy compare to BERT?",
        ),
        ("How is the ontology induced from text?", "How is it evaluated?", "How is the ontology evaluated?"),
        ("How is the ontology induced from text?", "It is trained how?", "The ontology is trained how?"),
        ("Which word embeddings are used?", "How are they trained?", "How are the word embeddings trained?"),
        (
            "Which word embeddings are used?",
            "What is their dimension?",
            "What is the word embeddings' dimension?",
        ),
        ("Which datasets are used?", "How large are these datasets?", "How large are the datasets?"),
        (
            "What is attention?",
            "How does this compare to convolution?",
            "How does attention compare to convolution?",
        ),
        # Nothing to substitute: the subject leads.
        (
            "How is the ontology induced from text?",
            "What are the results?",
            "Regarding the ontology: what are the results?",
        ),
        ("What is attention?", "BLEU scores?", "Regarding attention: BLEU scores?"),
        # An expletive "it", a complementiser "that", a standalone question: unchanged.
        (
            "How is the ontology induced from text?",
            "Is it true that BERT uses attention?",
            "Is it true that BERT uses attention?",
        ),
        (
            "What is attention?",
            "Is there evidence that models overfit?",
            "Is there evidence that models overfit?",
        ),
        (
            "What is attention?",
            "What is the BLEU score of BERT on WMT14?",
            "What is the BLEU score of BERT on WMT14?",
        ),
        # Neither scope nor subject to carry.
        ("Do they use Wikipedia?", "How is it evaluated?", "How is it evaluated?"),
        # No earlier question.
        (None, "How is it trained?", "How is it trained?"),
    ],
)
def test_rewrite_rules(previous: str | None, message: str, expected: str) -> None:
    assert rewrite_rules(message, previous, RESOLVER) == expected


@pytest.mark.parametrize(
    ("previous", "message", "expected"),
    [
        # Without a library's titles: quoted titles and arXiv ids still carry.
        (SCOPED, "How is it trained?", f"{LEAD} how is it trained?"),
        (
            "How does 1601.01705 assemble networks?",
            "What do they compute?",
            "In the paper 1601.01705: what do they compute?",
        ),
        (
            'What does "Some Unknown Paper Title" propose?',
            "Why?",
            "In the paper 'Some Unknown Paper Title': why?",
        ),
        (
            'In the paper "The model\'s own title here": what is new?',
            "Why?",
            'In the paper "The model\'s own title here": why?',
        ),
    ],
)
def test_rewrite_rules_without_a_resolver(previous: str, message: str, expected: str) -> None:
    assert rewrite_rules(message, previous) == expected


@pytest.mark.parametrize(
    ("question", "lead", "body", "subject"),
    [
        (SCOPED, LEAD, "what do the modules compute?", "the modules"),
        (f"How do the modules of {COMPOSE} work?", LEAD, "How do the modules of work?", "the modules"),
        (
            "How is the ontology induced from text?",
            None,
            "How is the ontology induced from text?",
            "the ontology",
        ),
        (
            "Which datasets are used for evaluation?",
            None,
            "Which datasets are used for evaluation?",
            "the datasets",
        ),
        ("How does the model handle negation?", None, "How does the model handle negation?", "the model"),
        ("How does BERT compare to ELMo?", None, "How does BERT compare to ELMo?", "BERT"),
        ("What is the embedding size?", None, "What is the embedding size?", "the embedding size"),
        ("Do they use Wikipedia?", None, "Do they use Wikipedia?", None),
    ],
)
def test_scope_and_subject(question: str, lead: str | None, body: str, subject: str | None) -> None:
    assert split_scope(question, RESOLVER) == (lead, body)
    assert main_subject(body) == subject


@pytest.mark.parametrize(
    ("message", "cue"),
    [
        ("what about ELMo?", "about"),
        ("And ELMo?", "about"),
        ("and on SQuAD?", "prep"),
        ("How is it trained?", "pronoun"),
        ("How large are these datasets?", "demonstrative"),
        ("Why is that?", "demonstrative"),
        ("Summarise the paper", "demonstrative"),
        ("BLEU scores?", "fragment"),
        ("What are the results?", "short"),
        ("In which dataset is BERT evaluated?", None),
        ("How are word embeddings trained?", None),
    ],
)
def test_follow_up_cues(message: str, cue: str | None) -> None:
    f = follow_up(message)
    assert (f.cue if f else None) == cue


# --- the LLM rewriter ----------------------------------------------------------------------------


def _answer(question: str, short: str = "modules", route: str = "research") -> Answer:
    return Answer.model_validate(
        {
            "question": question,
            "short_answer": short,
            "text": f"{short} [1].",
            "route": route,
            "mode": "extractive" if route == "research" else route,
        }
    )


def _exchange(n: int, message: str, standalone: str | None = None, route: str = "research") -> Exchange:
    q = standalone or message
    return Exchange(n=n, message=message, standalone=q, answer=_answer(q, route=route), created=0.0)


HISTORY = [_exchange(1, SCOPED), _exchange(2, "hello", route="direct")]


def rewriter_llm(reply: str | Exception) -> ScriptedLLM:
    def answer(messages: Sequence[ChatMessage]) -> str:
        assert messages[0].content == prompts.REWRITE_SYSTEM
        if isinstance(reply, Exception):
            raise reply
        return reply

    return ScriptedLLM([], default=answer)


def test_llm_rewrite_is_used_and_sees_the_history() -> None:
    llm = rewriter_llm(f"Standalone question: \"How are the modules of '{COMPOSE}' trained?\"\nextra line")
    rw = Rewriter(llm, RESOLVER).rewrite("How are they trained?", HISTORY)
    assert rw.how == "llm" and rw.changed
    assert rw.question == f"How are the modules of '{COMPOSE}' trained?"
    user = llm.calls[0][-1].content
    assert user == rewrite_prompt("How are they trained?", HISTORY, 3)
    assert user == (
        f"Conversation:\nUser: {SCOPED}\nAssistant: modules\nUser: hello\nAssistant: modules\n\n"
        "Last message: How are they trained?\n\nStandalone question:"
    )


def test_llm_rewrite_that_drops_the_paper_keeps_its_scope() -> None:
    rw = Rewriter(rewriter_llm("How are the modules trained?"), RESOLVER).rewrite(
        "How are they trained?", HISTORY
    )
    assert (rw.how, rw.question) == ("llm", f"{LEAD} how are the modules trained?")


@pytest.mark.parametrize(
    "reply",
    ["", "   \n  ", "The modules are trained jointly with the layout predictor. " * 6, ModelError("down")],
)
def test_unusable_llm_reply_falls_back_to_the_rules(reply: str | Exception) -> None:
    rw = Rewriter(rewriter_llm(reply), RESOLVER).rewrite("How is it trained?", HISTORY)
    assert rw.how == "rules (LLM reply unusable)"
    assert rw.question == f"{LEAD} how is it trained?"


def test_rewriter_without_history_or_llm() -> None:
    llm = rewriter_llm("never asked")
    assert Rewriter(llm).rewrite("How is it trained?", []).how == "no earlier question"
    only_direct = [_exchange(1, "hello", route="direct")]
    rw = Rewriter(llm).rewrite("  How is   it trained? ", only_direct)
    assert (rw.question, rw.how, rw.changed) == ("How is it trained?", "no earlier question", False)
    assert llm.calls == []
    rules = Rewriter(None, RESOLVER).rewrite("How is it trained?", HISTORY)
    assert (rules.question, rules.how) == (f"{LEAD} how is it trained?", "rules")


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("How is X trained?", "How is X trained?"),
        ("Question: 'How is X trained?'", "How is X trained?"),
        ("\n\n`How is X trained?`\nBecause ...", "How is X trained?"),
        ("", None),
        ("x" * 61, None),  # 3 x the longer of message (12) and previous (20)
        ("x" * 60, "x" * 60),
    ],
)
def test_clean_reply(reply: str, expected: str | None) -> None:
    assert clean_reply(reply, "How is it ?!", "What is the X model?") == expected


# --- the history ---------------------------------------------------------------------------------


def test_history_persists_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "chat.sqlite3"
    h = ChatHistory(path)
    first = h.record("s1", SCOPED, SCOPED, _answer(SCOPED))
    second = h.record("s1", "How is it trained?", f"{LEAD} how is it trained?", _answer("q2", "jointly"))
    h.record("other", "hello", "hello", _answer("hello", "", route="direct"))
    assert (first.n, second.n) == (1, 2)

    again = ChatHistory(path)
    ex = again.exchanges("s1")
    assert [(e.n, e.message, e.standalone) for e in ex] == [
        (1, SCOPED, SCOPED),
        (2, "How is it trained?", f"{LEAD} how is it trained?"),
    ]
    assert ex[1].answer is not None and ex[1].answer.short_answer == "jointly"
    turns = again.turns("s1")
    assert [(t.turn, t.role) for t in turns] == [(1, "user"), (2, "assistant"), (3, "user"), (4, "assistant")]
    assert turns[1].text == "modules [1]." and turns[0].answer is None and turns[1].standalone is None
    assert {(s.id, s.exchanges) for s in again.sessions()} == {("s1", 2), ("other", 1)}
    assert again.exchanges("never") == []
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_concurrent_writers_get_distinct_turns(tmp_path: Path) -> None:
    h = ChatHistory(tmp_path / "chat.sqlite3")

    def write(i: int) -> None:
        for j in range(5):
            h.record("shared", f"m{i}-{j}", f"m{i}-{j}", _answer(f"m{i}-{j}"))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    turns = h.turns("shared")
    assert [t.turn for t in turns] == list(range(1, 41))
    # Each exchange's two turns are adjacent: the answer follows its own message.
    for user, assistant in zip(turns[::2], turns[1::2], strict=True):
        assert user.role == "user" and assistant.answer is not None
        assert assistant.answer.question == user.text
    assert len(h.exchanges("shared")) == 20


@pytest.mark.parametrize("bad", ["", "  ", "a b", "x" * 65, "-lead", "semi;colon"])
def test_invalid_session_ids(bad: str) -> None:
    with pytest.raises(InputError, match="session id"):
        validate_session_id(bad)


def test_valid_session_id_is_stripped() -> None:
    assert validate_session_id(" user:42_a.b-c ") == "user:42_a.b-c"
