"""The agent's graph, built and compiled once per ``Agent`` and reused for every question.

    START -> router -> direct | about -> END
                    -> planner -> retriever -> grader -> context -> synthesizer -> verifier
                          -> specialists (with a trained reader) -> abstention (with a fitted rule) -> END
                                      ^          |
                                      +- reformulator (at most one retry)

Each node is a closure over ``AgentDeps``, wrapped so that it times itself and emits a ``NodeEvent``
(node, ms, decision, counts) into the state's event list; ``Agent.stream`` yields those events as the
nodes finish, then the ``Answer``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from types import EllipsisType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from arag.agent.abstention import make_abstention, uses_abstention
from arag.agent.context import make_context
from arag.agent.deps import AgentDeps, SearchBackend
from arag.agent.grader import make_grade_edge, make_grader
from arag.agent.hooks import RunHooks, using
from arag.agent.planner import make_planner
from arag.agent.reformulator import make_reformulate_edge, make_reformulator
from arag.agent.retrieve import make_retrieval_node
from arag.agent.router import make_about, make_direct, make_router, route_edge
from arag.agent.specialists import make_specialists, uses_reader
from arag.agent.state import AgentState, Step
from arag.agent.support import (
    CombinedSupport,
    CrossEncoderSupport,
    HubNLISupport,
    LexicalSupport,
    LLMJudgeSupport,
    SupportScorer,
)
from arag.agent.synthesizer import make_synthesizer
from arag.agent.verifier import make_verifier
from arag.errors import InputError
from arag.llm.base import LLM
from arag.llm.cache import cache_hits
from arag.models.abstention import AbstentionRule, get_abstention
from arag.models.reader import Reader, get_reader
from arag.records import Answer, NodeEvent, SearchFilter
from arag.settings import QUESTION_CHARS_CEILING, Settings

NODES = (
    "router",
    "direct",
    "about",
    "planner",
    "retriever",
    "grader",
    "reformulator",
    "context",
    "synthesizer",
    "verifier",
    "specialists",
    "abstention",
)
# Enough for the longest path (10 steps with the retry), with room to spare.
RECURSION_LIMIT = 40


def timed(name: str, fn: Callable[[AgentState], Step], deps: AgentDeps) -> Callable[..., Any]:
    """A node function: stops first if the run was cancelled, runs ``fn`` with the run's hooks
    current, and adds its event (with the time it took) to the update."""

    def node(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        hooks: RunHooks | None = (config.get("configurable") or {}).get("hooks")
        if hooks is not None:
            hooks.check(name)
        t0 = time.perf_counter()
        hits = cache_hits()
        with using(hooks):
            step = fn(state)
        counts = dict(step.counts)
        if cache_hits() > hits:  # the step's LLM replies came from the disk cache: its time is not real
            counts["llm_cached"] = cache_hits() - hits
        event = NodeEvent(
            node=name,
            ms=round(1000 * (time.perf_counter() - t0), 2),
            decision=step.decision,
            counts=counts,
        )
        if deps.on_event is not None:
            deps.on_event(event)
        return {**step.update, "events": [event]}

    return node


def build_graph(deps: AgentDeps):
    """The compiled graph over ``deps``."""
    makers = {
        "router": make_router,
        "direct": make_direct,
        "about": make_about,
        "planner": make_planner,
        "retriever": make_retrieval_node,
        "grader": make_grader,
        "reformulator": make_reformulator,
        "context": make_context,
        "synthesizer": make_synthesizer,
        "verifier": make_verifier,
        "specialists": make_specialists,
        "abstention": make_abstention,
    }
    g = StateGraph(AgentState)
    # Without a reader (or one whose thresholds were never fit) the specialists have nothing to
    # say: the answer ends at the verifier.
    specialists = uses_reader(deps)
    # Likewise a rule that is off (or none fit) declines nothing.
    abstention = uses_abstention(deps)
    skip = {n for n, on in (("specialists", specialists), ("abstention", abstention)) if not on}
    nodes = tuple(n for n in NODES if n not in skip)
    for name in nodes:
        g.add_node(name, timed(name, makers[name](deps), deps))
    g.add_edge(START, "router")
    g.add_conditional_edges("router", route_edge, ["planner", "direct", "about"])
    g.add_edge("direct", END)
    g.add_edge("about", END)
    g.add_edge("planner", "retriever")
    g.add_edge("retriever", "grader")
    g.add_conditional_edges("grader", make_grade_edge(deps.settings.max_retries), ["reformulator", "context"])
    g.add_conditional_edges("reformulator", make_reformulate_edge(), ["retriever", "context"])
    g.add_edge("context", "synthesizer")
    g.add_edge("synthesizer", "verifier")
    tail = ["verifier", *(n for n in ("specialists", "abstention") if n not in skip)]
    for a, b in zip(tail, [*tail[1:], END], strict=True):
        g.add_edge(a, b)
    return g.compile()


def finish_answer(answer: Answer, events: list[NodeEvent], t0: float, **update: Any) -> Answer:
    """``answer`` with its run's steps: the events, each node's milliseconds (summed over its events)
    and the whole run's since ``t0`` (a ``time.perf_counter()``), and any other ``update``."""
    timings: dict[str, float] = {}
    for e in events:
        timings[e.node] = round(timings.get(e.node, 0.0) + e.ms, 2)
    total_ms = round(1000 * (time.perf_counter() - t0), 2)
    return answer.model_copy(update={"events": events, "timings": timings, "total_ms": total_ms, **update})


class Agent:
    """Answers questions over the library. Thread-safe: the compiled graph is shared, the state is
    per question."""

    def __init__(self, deps: AgentDeps) -> None:
        self.deps = deps
        self.graph = build_graph(deps)

    def stream(
        self, question: str, flt: SearchFilter | None = None, hooks: RunHooks | None = None
    ) -> Iterator[NodeEvent | Answer]:
        """Each node's event as the node finishes, then the answer (last). ``hooks`` can cancel the
        run (Cancelled is raised at the next node or token) and see the answer's tokens."""
        question = validate_question(question, self.deps.settings.max_question_chars)
        t0 = time.perf_counter()
        init: AgentState = {"question": question, "flt": flt}
        events: list[NodeEvent] = []
        final: dict[str, Any] = {}
        config: RunnableConfig = {"recursion_limit": RECURSION_LIMIT, "configurable": {"hooks": hooks}}
        for mode, chunk in self.graph.stream(init, stream_mode=["updates", "values"], config=config):
            if mode == "updates":
                for update in chunk.values():
                    for event in (update or {}).get("events", []):
                        events.append(event)
                        yield event
            else:
                final = chunk
        answer: Answer = final["answer"]
        cached = int(sum(e.counts.get("llm_cached", 0) for e in events))
        yield finish_answer(answer, events, t0, llm_cached_calls=cached)

    def run(
        self,
        question: str,
        flt: SearchFilter | None = None,
        on_event: Callable[[NodeEvent], None] | None = None,
        hooks: RunHooks | None = None,
    ) -> Answer:
        """Answer one question; ``on_event`` sees each node's event as it happens."""
        for item in self.stream(question, flt, hooks):
            if isinstance(item, Answer):
                return item
            if on_event is not None:
                on_event(item)
        raise AssertionError("the agent's graph ended without an answer")


def validate_question(question: str, max_chars: int, *, what: str = "question") -> str:
    """The question (or query: ``what``) stripped; an InputError when it is empty or longer than
    ``max_chars`` (ARAG_AGENT__MAX_QUESTION_CHARS). Every entry point calls it before any work: paper
    resolution and the searches cost time in the question's length."""
    q = (question or "").strip()
    if not q:
        raise InputError(f"the {what} is empty", where=what, fix=f"give a {what}")
    if len(q) > max_chars:
        raise InputError(
            f"the {what} is {len(q):,} characters long (at most {max_chars:,})",
            where=what,
            fix=f"shorten the {what}, or raise ARAG_AGENT__MAX_QUESTION_CHARS "
            f"(up to {QUESTION_CHARS_CEILING:,})",
        )
    return q


def make_support(settings: Settings, llm: LLM | None, llm_checks: bool) -> SupportScorer:
    """The configured claim-support scorer. ``auto``: the LLM judge when LLM checks are on (a hosted
    model), else the lexical scorer. The combined scorer (the trained support model with the lexical
    overlap) ranks QASPER validation's labelled pairs better (two-fold AUC 0.861 against 0.811) but
    moved no answer of 100 validation questions, and its model part vetoes claims copied almost word
    for word when they are phrased as statements (the pairs it learnt from are question + answer):
    "The paper presents a novel approach to joint learning of ontology ..." against its own abstract
    got logit -3.0 and missed the bar. So it is a choice, not the default. A chosen model that is
    missing is a ModelError, never replaced."""
    a = settings.agent
    choice = a.support
    if choice == "auto":
        choice = "llm-judge" if llm is not None and llm_checks else "lexical"
    if choice == "llm-judge" and llm is not None:
        return LLMJudgeSupport(llm)
    if choice == "lexical":
        return LexicalSupport(a.support_threshold)
    if choice == "nli":
        return HubNLISupport(a.support_model, a.support_threshold, threads=settings.threads)
    if choice == "combined":
        return CombinedSupport(settings.support_dir, threads=settings.threads)
    return CrossEncoderSupport(settings.support_dir, threads=settings.threads)


def build_agent(
    settings: Settings,
    retriever: SearchBackend,
    llm: LLM | None = None,
    *,
    support: SupportScorer | None = None,
    on_event: Callable[[NodeEvent], None] | None = None,
    reader: Reader | None | EllipsisType = ...,
    abstention: AbstentionRule | None | EllipsisType = ...,
) -> Agent:
    """An agent over an open retriever. ``llm`` None answers extractively (the ``extractive``
    provider); LLM checks (grader, judge) are on for a hosted model unless the settings say otherwise.
    ``reader``: the answer specialists' reader, ``abstention``: the rule after them (default: the ones
    the settings select)."""
    a = settings.agent
    llm_checks = llm is not None and (
        a.llm_checks == "on" or (a.llm_checks == "auto" and settings.llm.provider == "openai")
    )
    deps = AgentDeps(
        retriever=retriever,
        llm=llm,
        support=support or make_support(settings, llm, llm_checks),
        settings=a,
        max_answer_tokens=settings.llm.max_answer_tokens,
        llm_checks=llm_checks,
        on_event=on_event,
        reader=get_reader(settings) if isinstance(reader, EllipsisType) else reader,
        abstention=get_abstention(settings) if isinstance(abstention, EllipsisType) else abstention,
    )
    return Agent(deps)
