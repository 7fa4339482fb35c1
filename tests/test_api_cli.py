"""The Python API (``arag.Library``, ``arag.ask``) and ``arag ask`` / ``arag chat`` on a small hash-embedder
library (6 QASPER papers, no reranking model, no LLM unless a scripted one is injected)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

import arag
from arag.agent import prompts
from arag.api import Library
from arag.cli.ask import literature_sources, llm_overrides
from arag.cli.main import app
from arag.errors import InputError, StoreError
from arag.llm.base import ChatMessage
from arag.llm.scripted import ScriptedLLM
from arag.records import Answer, ApproachGroup, Citation, NodeEvent
from arag.settings import Settings, get_settings

runner = CliRunner()
COMPOSE = "1601.01705"  # Learning to Compose Neural Networks for Question Answering
COMPOSE_TITLE = "Learning to Compose Neural Networks for Question Answering"
SCOPED = f"In the paper '{COMPOSE_TITLE}': what do the modules compute?"
LEAD = f"In the paper '{COMPOSE_TITLE}':"
ENV = {
    "ARAG_EMBEDDING__PROVIDER": "hash",
    "ARAG_TOPICS__K": "2",
    "ARAG_RERANK__PROVIDER": "none",
    "ARAG_LLM__PROVIDER": "extractive",
}


@pytest.fixture(scope="module")
def lib_dir(small_library: Callable[..., Settings]) -> Path:
    return small_library("api_cli", **_nested(ENV)).data_dir  # its own: the chat tests write beside it


def _nested(env: dict[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for key, value in env.items():
        group, name = key.removeprefix("ARAG_").lower().split("__")
        out.setdefault(group, {})[name] = value
    return out


@pytest.fixture
def settings(lib_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The small library as the environment selects it (as the CLI sees it too)."""
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib_dir))
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    return get_settings()


@pytest.fixture
def lib(settings: Settings) -> Iterator[Library]:
    with Library(settings) as library:
        yield library


def _citations_map_to_chunks(a: Answer) -> None:
    in_context = {c.n: c.chunk_id for c in a.chunks if c.n is not None}
    assert a.citations
    for c in a.citations:
        assert in_context[c.n] == c.chunk_id


# --- the API -------------------------------------------------------------------------------------


def test_library_asks_searches_streams_and_lists(lib: Library) -> None:
    seen: list[NodeEvent] = []
    a = lib.ask("How are the networks assembled?", papers=[f"arXiv:{COMPOSE}v2"], on_event=seen.append)
    assert not a.abstained and {c.paper_id for c in a.chunks} == {COMPOSE}
    assert seen == a.events and seen[0].node == "router"
    _citations_map_to_chunks(a)

    result = lib.search("ontology induction", k=3)
    assert len(result.ranked) == 3 and result.kept
    scoped = lib.search("modules", papers=[COMPOSE])
    assert {h.chunk.paper_id for h in scoped.ranked} == {COMPOSE}

    items = list(lib.stream("How is the ontology induced from text?"))
    assert all(isinstance(i, NodeEvent) for i in items[:-1]) and isinstance(items[-1], Answer)

    rows = lib.papers()
    assert len(rows) == 6 and COMPOSE in {r.id for r in rows}
    topic = rows[0].topic
    assert {r.topic for r in lib.papers(topic=topic)} == {topic}


def test_library_rejects_bad_input(lib: Library) -> None:
    with pytest.raises(InputError, match=r"unknown paper ids: '9999.99999', 'nope'") as exc:
        lib.ask("How are the networks assembled?", papers=["9999.99999", COMPOSE, "nope"])
    assert "arag papers" in str(exc.value)
    with pytest.raises(InputError, match="unknown paper id"):
        lib.stream("anything", papers=["9999.99999"])  # eagerly, not on first next()
    with pytest.raises(InputError, match="empty"):
        lib.ask("  ")
    with pytest.raises(InputError, match="empty"):
        lib.search("")
    with pytest.raises(InputError, match="session id"):
        lib.chat("bad id", "How is it trained?")
    long = "how are the networks assembled " * 3_300  # about 100k characters
    for call in (lib.search, lib.ask, lambda q: lib.stream(q), lambda q: lib.chat("s1", q)):
        with pytest.raises(InputError, match=r"characters long \(at most 2,000\)") as exc:
            call(long)
        assert "ARAG_AGENT__MAX_QUESTION_CHARS" in str(exc.value)
    lib.close()
    lib.close()  # harmless
    with pytest.raises(StoreError, match="closed"):
        lib.ask("How are the networks assembled?")


def test_library_is_shared_between_threads(lib: Library) -> None:
    questions = ["How is the ontology induced from text?", "How are the networks assembled?"]
    out: dict[str, Answer] = {}
    threads = [threading.Thread(target=lambda q=q: out.update({q: lib.ask(q)})) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {q: out[q].question for q in questions} == {q: q for q in questions}


def test_library_chat_rewrites_follow_ups_and_keeps_the_history(settings: Settings) -> None:
    sid = "api-chat"
    with Library(settings) as lib:
        first = lib.chat(sid, SCOPED)
        assert first.question == SCOPED
        second = lib.chat(sid, "How is it trained?")
        assert second.question == f"{LEAD} how is it trained?"
        assert {c.paper_id for c in second.chunks} == {COMPOSE}
        third = lib.chat(sid, "How is it trained?", rewrite=False)
        assert third.question == "How is it trained?"
    # A new instance (as a restarted service would) sees the turns.
    with Library(settings) as again:
        history = again.history(sid)
        assert [(e.n, e.message, e.standalone) for e in history] == [
            (1, SCOPED, SCOPED),
            (2, "How is it trained?", f"{LEAD} how is it trained?"),
            (3, "How is it trained?", "How is it trained?"),
        ]
        assert history[1].answer is not None and history[1].answer.text == second.text
        assert again.history("never") == []


def test_injected_llm_rewrites_follow_ups(settings: Settings) -> None:
    def reply(messages: Sequence[ChatMessage]) -> str:
        assert messages[0].content == prompts.REWRITE_SYSTEM
        return f"How are the modules of '{COMPOSE_TITLE}' trained?"

    llm = ScriptedLLM([], default=reply)
    sid = "llm-chat"
    with Library(settings, llm=llm) as lib:
        assert lib.llm is llm and lib.rewriter.llm is llm
        assert lib.rewrite(sid, "How are they trained?").how == "no earlier question"
        earlier = Answer(
            question=SCOPED, short_answer="modules", text="modules [1].", route="research", mode="llm"
        )
        lib.chat_history.record(sid, SCOPED, SCOPED, earlier)
        rw = lib.rewrite(sid, "How are they trained?")
    assert (rw.how, rw.question) == ("llm", f"How are the modules of '{COMPOSE_TITLE}' trained?")


def test_arag_ask_opens_answers_and_closes(settings: Settings) -> None:
    a = arag.ask("How is the ontology induced from text?", settings=settings)
    assert isinstance(a, Answer) and not a.abstained
    # Closed: the index can be opened again at once.
    Library(settings).close()
    with pytest.raises(InputError, match="empty"):
        arag.ask("")


# --- the CLI -------------------------------------------------------------------------------------


def test_ask_shows_stages_then_the_answer_with_numbered_sources(settings: Settings) -> None:
    res = runner.invoke(app, ["ask", "How is the ontology induced from text?"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    stages = [line.split()[1] for line in out.splitlines() if line.startswith("· ")]
    assert stages == ["router", "planner", "retriever", "grader", "context", "synthesizer", "verifier"]
    assert "Sources" in out
    sources = [line for line in out.splitlines() if re.match(r"\s+\[\d+\] ", line)]
    assert sources and all("https://arxiv.org/abs/1601.00901" in s and "support " in s for s in sources)
    assert out.index("· verifier") < out.index("Sources")


def test_a_literature_answer_lists_each_paper_once_with_all_its_markers() -> None:
    # A compound question's two parts drew a point from paper A each ([1], [3]); an overview sentence
    # cited another passage of B ([4]). The list had shown A twice, the second time without its part.
    def cite(n: int, pid: str, support: float = 1.0) -> Citation:
        return Citation(n=n, chunk_id=f"{pid}:{n}", paper_id=pid, title=f"Paper {pid}", support=support,
                        supported=support >= 0.5)  # fmt: skip

    a = Answer(
        question="How is bias measured, and how is it removed?", short_answer="2 papers", text="",
        route="research", mode="llm", form="literature",
        citations=[cite(3, "1909.00871"), cite(1, "1909.00871"), cite(2, "1905.12801"),
                   cite(4, "1905.12801", 0.4)],
        groups=[ApproachGroup(label="How is bias measured", paper_ids=["1909.00871", "1905.12801"], text=""),
                ApproachGroup(label="How is it removed", paper_ids=["1909.00871"], text="")],
    )  # fmt: skip
    assert literature_sources(a) == [
        "[bold][1] [3][/] Paper 1909.00871 · https://arxiv.org/abs/1909.00871 · How is bias measured; "
        "How is it removed · support 1.00",
        "[bold][2] [4][/] Paper 1905.12801 · https://arxiv.org/abs/1905.12801 · How is bias measured · "
        "support 0.40 to 1.00 [yellow](unsupported: [4])[/]",
    ]
    # One group needs no label.
    one = a.model_copy(update={"groups": a.groups[:1]})
    assert (
        literature_sources(one)[0]
        == "[bold][1] [3][/] Paper 1909.00871 · https://arxiv.org/abs/1909.00871 · support 1.00"
    )


def test_ask_json_is_the_whole_answer(settings: Settings) -> None:
    res = runner.invoke(app, ["ask", "How are the networks assembled?", "--paper", COMPOSE, "--json"])
    assert res.exit_code == 0, res.output
    a = Answer.model_validate_json(res.stdout)
    assert not a.abstained and a.sub_queries and a.events and a.timings and a.total_ms > 0
    assert {c.paper_id for c in a.chunks} == {COMPOSE}
    _citations_map_to_chunks(a)
    raw = json.loads(res.stdout)["citations"]
    assert [c["support"] for c in raw] == [c.support for c in a.citations]  # nothing lost in the JSON
    # The verifier kept these claims: each citation is supported, at or above the bar, at most 1.
    bar = settings.agent.support_threshold
    assert all(c.supported and bar <= c.support <= 1.0 for c in a.citations), (bar, a.citations)


def test_ask_abstains_in_words_with_the_closest_papers(settings: Settings) -> None:
    res = runner.invoke(app, ["ask", "What is the best pizza recipe in Naples?"])
    assert res.exit_code == 0, res.output
    assert "Not in the library." in res.stdout and "Closest papers" in res.stdout
    assert "Sources" not in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ask", "How are the networks assembled?", "--paper", "9999.99999"], "arag papers"),
        (["ask", "   "], "empty"),
        (["ask", "How?", "--llm", "gpt-9"], "unknown LLM provider"),
        (["chat", "--history"], "needs a session"),
        (["chat", "--history", "--session", "never-used"], "no session 'never-used'"),
        (["chat", "--session", "bad id", "hi"], "invalid session id"),
        (["search", "modules " * 12_500], "at most 2,000"),
        (["ask", "modules " * 12_500], "at most 2,000"),
        (["chat", "modules " * 12_500], "at most 2,000"),
    ],
)
def test_bad_input_exits_with_the_input_error_code(settings: Settings, args: list[str], message: str) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == InputError.exit_code, res.output
    assert message in res.output


def test_chat_single_turns_rewrite_and_persist(settings: Settings) -> None:
    sid = "cli-chat"
    first = runner.invoke(app, ["chat", "--session", sid, SCOPED])
    assert first.exit_code == 0, first.output
    assert "→ standalone" not in first.stdout and f"--session {sid}" in first.stdout

    second = runner.invoke(app, ["chat", "--session", sid, "How is it trained?"])
    assert second.exit_code == 0, second.output
    assert f"→ standalone: {LEAD} how is it trained?  (rules)" in second.stdout
    assert "https://arxiv.org/abs/1601.01705" in second.stdout

    third = runner.invoke(app, ["chat", "--session", sid, "--no-rewrite", "How is it trained?"])
    assert third.exit_code == 0, third.output
    assert "→ standalone" not in third.stdout

    with Library(settings) as lib:
        assert [e.standalone for e in lib.history(sid)] == [
            SCOPED,
            f"{LEAD} how is it trained?",
            "How is it trained?",
        ]
    shown = runner.invoke(app, ["chat", "--session", sid, "--history"])
    assert shown.exit_code == 0, shown.output
    assert [line.split(":")[0] for line in shown.stdout.splitlines() if line.startswith("#")] == [
        "#1 you",
        "#2 you",
        "#3 you",
    ]
    assert f"→ standalone: {LEAD} how is it trained?" in shown.stdout


def test_chat_interactive_loop(settings: Settings) -> None:
    sid = "cli-loop"
    res = runner.invoke(
        app, ["chat", "--session", sid], input=f"{SCOPED}\n\nhello\nHow is it trained?\n/exit\n"
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.count("you> ") == 5
    assert f"→ standalone: {LEAD} how is it trained?" in res.stdout
    # EOF ends the loop as /exit does; the session goes on where it stopped.
    more = runner.invoke(app, ["chat", "--session", sid], input="Why?\n")
    assert more.exit_code == 0, more.output
    assert f"→ standalone: {LEAD} why?" in more.stdout
    with Library(settings) as lib:
        assert [e.message for e in lib.history(sid)] == [SCOPED, "hello", "How is it trained?", "Why?"]


def test_help_lists_ask_and_chat() -> None:
    out = runner.invoke(app, ["--help"]).output
    assert "ask" in out and "chat" in out


def test_llm_options_override_the_settings() -> None:
    assert llm_overrides(None, None) == {}
    assert llm_overrides("openai", "gpt-4o-mini") == {"llm": {"provider": "openai", "model": "gpt-4o-mini"}}
    assert llm_overrides(None, "qwen2.5-coder-0.5b") == {"llm": {"model": "qwen2.5-coder-0.5b"}}
    with pytest.raises(InputError, match="unknown LLM provider 'gpt'"):
        llm_overrides("gpt", None)


def test_ask_with_llm_option(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # The environment asks for the local model; --llm extractive answers without one.
    monkeypatch.setenv("ARAG_LLM__PROVIDER", "llama-cpp")
    res = runner.invoke(
        app, ["ask", "How is the ontology induced from text?", "--llm", "extractive", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert Answer.model_validate_json(res.stdout).mode == "extractive"


def test_the_question_limit_is_one_setting(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_AGENT__MAX_QUESTION_CHARS", "40")
    question = "How are the networks assembled from the modules?"  # 49 characters
    for args in (["search", question], ["ask", question]):
        res = runner.invoke(app, args)
        assert res.exit_code == InputError.exit_code and "at most 40" in res.output, res.output
    with Library(get_settings()) as lib, pytest.raises(InputError, match="at most 40"):
        lib.search(question)
    with pytest.raises(InputError, match="at most 40"):
        arag.ask(question)
