"""The router: a research question (retrieve), a direct reply (greetings, small talk, arithmetic), or a
question about arag itself. Deterministic rules first; the LLM decides only what the rules are unsure
of, and without an LLM an unsure message is treated as research (the grader abstains if the library
has nothing on it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from arag.agent import prompts
from arag.agent.about import about_prompt, relevant_sections
from arag.agent.count import library_size_question
from arag.agent.deps import AgentDeps, ask, ask_json
from arag.agent.direct import arithmetic_expression, evaluate, fixed_reply, is_chitchat
from arag.agent.state import AgentState, Step
from arag.agent.terms import entities, key_terms
from arag.errors import AragError, ModelUnavailable
from arag.records import Answer, LibraryCount, Route

_ARXIV = re.compile(r"(?<![\d.])\d{4}\.\d{4,5}(?:v\d+)?(?!\d)")
_QUOTED_TITLE = re.compile(r"[\"“‘'][^\"“”‘’]{8,300}[\"”’']")
_RAG = r"(?:rag|retrieval[- ]augment(?:ed|ation)(?:\s+generation)?)"
_SELF = r"(?:you|your|yourself|this\s+(?:system|tool|assistant|app|program|bot))"
# "What is RAG?" asks about arag; "how does RAG help open-domain QA?" is research: a RAG question is
# about arag when at most this many other content terms come with it.
_RAG_Q = re.compile(rf"^\s*(?:so\s+)?(?:what|why|how|explain|describe)\b[^?]{{0,40}}\b{_RAG}\b", re.I)
_RAG_TERMS = frozenset(key_terms("rag retrieval augmented augmentation generation better here"))
MAX_RAG_OTHER_TERMS = 1
_ABOUT = (
    re.compile(r"\barag\b", re.I),
    re.compile(
        r"\b(?:plain|bare|vanilla|normal|just\s+an?|simple)\s+(?:llm|language\s+model|chatgpt|gpt)", re.I
    ),
    re.compile(r"\bwho\s+(?:are|made|built|created)\s+you\b|\bwhat\s+are\s+you\b", re.I),
    re.compile(
        rf"\b(?:how\s+(?:do|does|did)\s+{_SELF}\s+(?:work|answer|search|find|cite|decide|know))|"
        rf"(?:what|which)\s+(?:can|do)\s+{_SELF}\s+(?:do|know|have|cover|use|contain)\b|"
        rf"\b{_SELF}\s+(?:library|corpus|data|sources|pipeline|model)\b|"
        rf"(?:what|which)\s+(?:papers|library|corpus|data|models?|sources)\s+(?:do|does|did|are|is)\s+{_SELF}\b",
        re.I,
    ),
    re.compile(r"\bwhat(?:'s|\s+is)\s+in\s+(?:the|your)\s+library\b", re.I),
)
# Words that make a message a research question even when it is short.
_RESEARCH_CUES = frozenset(
    key_terms(
        "paper papers dataset datasets corpus model models method baseline baselines accuracy F1 BLEU "
        "score scores metric metrics evaluate evaluation experiment experiments train training trained "
        "architecture language languages neural network embedding embeddings transformer attention "
        "annotate annotation task tasks benchmark results performance parser parsing translation "
        "classification learning algorithm features"
    )
)
# Content terms that make a message a research question without any cue word.
MIN_RESEARCH_TERMS = 3


@dataclass(frozen=True)
class RouteDecision:
    """A route, the rule behind it, and whether the rules are sure."""

    route: Route
    reason: str
    sure: bool


# Questions that ask for a fact (who/what/which/... or a question mark).
_ASKS_FACT = re.compile(
    r"\?\s*$|^\s*(?:who|what|which|when|where|why|how|is|are|does|do|did|can|list|name)\b", re.I
)


def route_rules(question: str) -> RouteDecision:
    """The rule-based route of a message (a pure function)."""
    q = question.strip()
    if _ARXIV.search(q) or _QUOTED_TITLE.search(q):
        return RouteDecision("research", "names a paper", True)
    if arithmetic_expression(q) is not None:
        return RouteDecision("direct", "arithmetic", True)
    if is_chitchat(q):
        return RouteDecision("direct", "greeting or small talk", True)
    if library_size_question(q):
        return RouteDecision("about", "asks how many papers the library holds", True)
    terms = key_terms(q)
    if any(p.search(q) for p in _ABOUT) or (
        _RAG_Q.search(q) and len(set(terms) - _RAG_TERMS) <= MAX_RAG_OTHER_TERMS
    ):
        return RouteDecision("about", "asks about arag", True)
    if entities(q):
        return RouteDecision("research", "names an entity", True)
    if set(terms) & _RESEARCH_CUES:
        return RouteDecision("research", "research vocabulary", True)
    if len(terms) >= MIN_RESEARCH_TERMS:
        return RouteDecision("research", f"{len(terms)} content terms", True)
    return RouteDecision("research", "unsure: few content terms", False)


def route_edge(state: AgentState) -> Literal["planner", "direct", "about"]:
    """The conditional edge after the router."""
    route = state.get("route", "research")
    return "planner" if route == "research" else route


def make_router(deps: AgentDeps):
    """The router node."""

    def router(state: AgentState) -> Step:
        question = state["question"]
        rules = route_rules(question)
        decision = rules
        if not rules.sure and deps.llm is not None:
            got = ask_json(
                deps.llm,
                prompts.ROUTER_SYSTEM,
                prompts.ROUTER_USER.format(question=question),
                prompts.ROUTER_SCHEMA,
                max_tokens=20,
            )
            route = got.get("route") if got else None
            if route == "direct" and _ASKS_FACT.search(question):
                # A factual question is never answered from the model's memory: it goes to the library,
                # which answers with sources or abstains. "direct" stays for chat the rules missed.
                decision = RouteDecision("research", "a factual question (LLM said direct)", True)
            elif route in ("research", "direct", "about"):
                decision = RouteDecision(route, "LLM (rules unsure)", True)
            else:
                decision = RouteDecision("research", "unsure; LLM reply unusable, research", False)
        return Step({"route": decision.route}, f"{decision.route} ({decision.reason})")

    return router


def make_direct(deps: AgentDeps):
    """The direct node: arithmetic, canned replies, or the LLM for other small talk."""

    def direct(state: AgentState) -> Step:
        question = state["question"]
        expr = arithmetic_expression(question)
        how = "fixed reply"
        if expr is not None:
            short = evaluate(expr)
            text = f"{expr.strip()} = {short}"
            how = "arithmetic"
        elif (reply := fixed_reply(question)) is not None:
            short, text = "", reply
        elif deps.llm is not None:
            try:
                text = ask(deps.llm, prompts.DIRECT_SYSTEM, question, max_tokens=80).strip()
                how = "LLM small talk"
            except ModelUnavailable:
                raise
            except AragError:
                text = prompts.SMALL_TALK_REPLY
            short = ""
        else:
            short, text = "", prompts.SMALL_TALK_REPLY
        answer = Answer(question=question, short_answer=short, text=text, route="direct", mode="direct")
        return Step({"answer": answer}, how)

    return direct


def make_about(deps: AgentDeps):
    """The about node: arag explains itself from its built-in description."""

    def about(state: AgentState) -> Step:
        question = state["question"]
        if library_size_question(question):
            # A number the library knows, not one the LLM would guess from its description.
            n = deps.retriever.paper_count()
            text = (
                f"The library holds {n:,} papers (`arag papers` lists them). Ask how many are on a topic "
                '("How many papers are about sarcasm?") for the papers whose title and abstract name it.'
            )
            size = Answer(
                question=question,
                short_answer=f"{n:,} papers",
                text=text,
                route="about",
                mode="about",
                library_count=LibraryCount(papers=n),
            )
            return Step({"answer": size}, f"the library's size: {n:,} papers", {"papers": n})
        sections = relevant_sections(question)
        text = "\n\n".join(sections)
        how = "description sections"
        if deps.llm is not None:
            try:
                text = (
                    ask(deps.llm, about_prompt(), question, max_tokens=deps.max_answer_tokens).strip() or text
                )
                how = "LLM over the description"
            except ModelUnavailable:
                raise
            except AragError:
                pass
        short = sections[0].split(". ")[0].rstrip(".") + "."
        answer = Answer(question=question, short_answer=short, text=text, route="about", mode="about")
        return Step({"answer": answer}, how, {"sections": len(sections)})

    return about
