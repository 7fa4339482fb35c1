"""The planner: a simple question is searched as asked; a compound one ("compare X and Y", "how does A
work and where does it fail", several questions in one) becomes 2-3 self-contained sub-queries.
Rules always work; with an LLM, a question that looks compound is decomposed by structured output
(JSON), falling back to the rules on a bad reply. The planner also fixes the answer type."""

from __future__ import annotations

import re

from arag.agent import prompts
from arag.agent.answer_type import LEAD, detect_answer_type
from arag.agent.deps import AgentDeps, ask_json
from arag.agent.state import AgentState, Step
from arag.agent.terms import GENERIC, content_words, entities, key_terms, strip_self_reference
from arag.text import tokenize

_ARXIV_ID = re.compile(r"(?<![\d.])\d{4}\.\d{4,5}(?:v\d+)?(?![\d])")

_COMPARE = (
    # compare <what> for X and for Y: the repeated preposition marks where the parts split
    re.compile(
        r"^(?:please\s+)?(?:compare|contrast)\s+(?P<head>.+?)\s+(?P<prep>for|in|on|of|from|between|across)\s+"
        r"(?P<x>.+?),?\s+(?:and|with|to|vs\.?|versus)\s+(?P=prep)\s+(?P<y>.+?)\s*[?.!]*$",
        re.I,
    ),
    # compare X and/with/to Y [on Z]
    re.compile(
        r"^(?:please\s+)?(?:compare|contrast)\s+(?P<x>.+?)\s+(?:and|with|to|vs\.?|versus)\s+(?P<y>.+?)"
        r"(?:\s+(?P<aspect>(?:on|in\s+terms\s+of|regarding|for|with\s+respect\s+to|by)\s+.+?))?\s*[?.!]*$",
        re.I,
    ),
    # what is the difference between X and Y [in Z]
    re.compile(
        r"^(?:what(?:'s|\s+is|\s+are)\s+)?(?:the\s+)?differences?\s+between\s+(?P<x>.+?)\s+and\s+(?P<y>.+?)"
        r"(?:\s+(?P<aspect>(?:on|in\s+terms\s+of|regarding|for|with\s+respect\s+to)\s+.+?))?\s*[?.!]*$",
        re.I,
    ),
    # how does X compare to/with Y [on Z]
    re.compile(
        r"^how\s+(?:does|do|did)\s+(?P<x>.+?)\s+compare\s+(?:to|with|against)\s+(?P<y>.+?)"
        r"(?:\s+(?P<aspect>(?:on|in\s+terms\s+of|regarding|for)\s+.+?))?\s*[?.!]*$",
        re.I,
    ),
    # X vs Y
    re.compile(r"^(?P<x>.+?)\s+(?:vs\.?|versus)\s+(?P<y>.+?)\s*[?.!]*$", re.I),
)
_WH = r"(?:how|where|what|why|when|which|who|does|do|did|is|are|was|were|can|could|should|would)"
# "..., and where does it fail" / "... but why ..." / "...; what ..."
_CLAUSE_SPLIT = re.compile(rf"\s*(?:,?\s+(?:and|but|while|also)\s+|;\s*)(?={_WH}\b)", re.I)
_SENTENCE_SPLIT = re.compile(r"(?<=\?)\s+|(?<=[.!])\s+(?=[A-Z])")
# "how does <subject> work" -> the subject, to stand in for "it" in the next clause.
_SUBJECT = re.compile(
    r"^(?:how|what|why|where|when|which)\s+(?:does|do|did|is|are|was|were|can|could|would|should)\s+"
    r"(?P<subj>.+?)\s+(?:work|works|fail|fails|perform|performs|compare|differ|behave|happen|learn|scale|"
    r"improve|help|matter|succeed|function|operate|generalize|generalise|converge|break)"
    r"(?:\s+(?:on|in|with|for|at|to))?\s*[?.!]*$",
    re.I,
)
_PRONOUN = re.compile(r"\b(?:it|they|them|this|these|those)\b", re.I)
_POSSESSIVE = re.compile(r"\b(?:its|their)\b", re.I)
_COMPOUND_CUES = re.compile(
    r"\b(?:and|vs\.?|versus|compare[sd]?|contrast|differences?|both|while|but)\b|;", re.I
)


def split_lead(question: str) -> tuple[str, str]:
    """("In the paper 'T': ", rest) when the question names its paper up front, else ("", question):
    each sub-query keeps the lead so it is searched inside that paper."""
    m = LEAD.match(question)
    if m is None:
        return "", question.strip()
    return m.group(0), question[m.end() :].strip()


# A quoted span is a title or a term, never a second question: "... of 'Ontology and parsing'".
_QUOTED_SPAN = re.compile(r"[\"“‘']([^\"“”‘’]{3,200}?)[\"”’']")


def looks_compound(question: str) -> bool:
    """Cheap test for whether decomposition could help (the LLM is asked only then)."""
    _, body = split_lead(question)
    body = _QUOTED_SPAN.sub("TITLE", body)
    return body.count("?") > 1 or _COMPOUND_CUES.search(body) is not None


def _subject(clause: str) -> str | None:
    m = _SUBJECT.match(clause.strip())
    return m.group("subj") if m else None


def _resolve_pronouns(parts: list[str]) -> list[str]:
    """Later clauses name the first clause's subject instead of "it" / "they" (a search cannot
    resolve a pronoun)."""
    subj = _subject(parts[0])
    out = [parts[0]]
    for part in parts[1:]:
        if subj and _PRONOUN.search(part):
            part = _PRONOUN.sub(subj, part, count=1)
        elif subj and _POSSESSIVE.search(part):
            part = _POSSESSIVE.sub(f"{subj}'s", part, count=1)
        elif not subj and (_PRONOUN.search(part) or _POSSESSIVE.search(part)):
            # No subject pattern: carry the first clause's content words instead.
            extra = [w for w in content_words(parts[0]) if w.lower() not in part.lower()]
            part = f"{part.rstrip('?.! ')} ({' '.join(extra[:4])})" if extra else part
        out.append(part)
    return out


def _compare_parts(body: str) -> list[str] | None:
    for pattern in _COMPARE:
        m = pattern.match(body)
        if m is None:
            continue
        if "head" in m.groupdict():
            head = f"{m.group('head')} {m.group('prep')}"
            x, y = m.group("x").strip(" ,"), m.group("y").strip(" ,")
            if key_terms(x) and key_terms(y):
                return [f"{head} {x}", f"{head} {y}"]
            continue
        aspect = (m.groupdict().get("aspect") or "").strip()
        x, y = m.group("x").strip(" ,"), m.group("y").strip(" ,")
        # "dense and sparse retrieval": the modifiers share the head noun.
        if len(x.split()) == 1 and len(y.split()) > 1:
            x = " ".join([x, *y.split()[1:]])
        if not key_terms(x) or not key_terms(y):
            continue
        return [f"{x} {aspect}".strip(), f"{y} {aspect}".strip()]
    return None


def _clean(part: str) -> str:
    return part.strip().strip(",;").strip()


def plan_rules(question: str, max_sub_queries: int = 3) -> list[str]:
    """The sub-queries of a question by rule: [question] when it is simple (a pure function). Words
    about the assistant itself ("the papers in this library") are left out."""
    question = strip_self_reference(question)
    lead, body = split_lead(question)
    parts = [_clean(p) for p in _SENTENCE_SPLIT.split(body) if _clean(p)]
    # Only sentences that ask something count as questions of their own ("We know X. Do they Y?").
    asked = [p for p in parts if p.endswith("?")]
    if len(asked) > 1:
        parts = asked
    elif len(parts) > 1:
        parts = [body]
    if len(parts) == 1:
        parts = _compare_parts(body) or [_clean(p) for p in _CLAUSE_SPLIT.split(body) if _clean(p)]
        if len(parts) > 1 and _compare_parts(body) is None:
            parts = _resolve_pronouns(parts)
    parts = [p for p in parts if key_terms(p)]
    parts = list(dict.fromkeys(parts))[:max_sub_queries]
    if len(parts) < 2:
        return [question.strip()]
    return [f"{lead}{p}" for p in parts]


def _words(text: str) -> set[str]:
    """A text's content words as the planner compares them: stemmed terms and single letters ("X")."""
    letters = {w.lower() for w in re.findall(r"\b[A-Za-z]\b", text)}
    return (set(tokenize(text)) | letters) - GENERIC


def invented(question: str, sub: str) -> bool:
    """A sub-query that shares no content word with the question: a question the user did not ask
    ("In which year was this research conducted?")."""
    return not (_words(sub) & _words(question))


def repair_ids(question: str, sub: str) -> str:
    """``sub`` with every arXiv id of the question that it cut up ("1912" for "1912.01214") made whole
    again; a question that names one paper by id has it carried into every sub-query."""
    ids = list(dict.fromkeys(m.group(0) for m in _ARXIV_ID.finditer(question)))
    for pid in ids:
        if pid in sub:
            continue
        head, tail = pid.split(".", 1)
        cut = re.compile(rf"(?<![\w.])(?:arxiv\s*:?\s*)?(?:{head}\.?\d{{0,5}}|{tail[:4]}\d*)(?![\w])", re.I)
        if cut.search(sub):
            sub = cut.sub(pid, sub, count=1)
        elif len(ids) == 1:
            sub = f"In {pid}: {sub}"
    return sub


def keep_names(question: str, subs: list[str]) -> list[str] | None:
    """``subs`` with each quoted title and name of the question written as the question writes it
    ("bert" -> "BERT"); None when one is in no sub-query (it was lost, or changed beyond case)."""
    out = list(subs)
    for name in entities(question):
        pattern = re.compile(r"(?<![\w])" + re.escape(name) + r"(?![\w])", re.I)
        if not any(pattern.search(s) for s in out):
            return None
        out = [pattern.sub(name.replace("\\", r"\\"), s) for s in out]
    return out


def protect(question: str, subs: list[str]) -> list[str] | None:
    """Sub-queries that never damage the question: arXiv ids whole, names and quoted titles verbatim,
    no invented sub-question, no words about the assistant; None when that leaves fewer than two."""
    kept = [repair_ids(question, s) for s in subs if not invented(question, s)]
    kept = [strip_self_reference(s) for s in kept]
    if any(m.group(0) not in " ".join(kept) for m in _ARXIV_ID.finditer(question)):
        return None
    named = keep_names(question, kept)
    if named is None:
        return None
    named = list(dict.fromkeys(named))
    return named if len(named) >= 2 else None


def validate_llm_plan(
    question: str, reply: dict[str, object] | None, max_sub_queries: int = 3
) -> list[str] | None:
    """The LLM's sub-queries when its reply is usable, else None. A paper named up front is carried into
    every sub-query that does not name it; ids, names and titles are kept whole (``protect``)."""
    if reply is None or reply.get("kind") not in ("simple", "compound"):
        return None
    if reply["kind"] == "simple":
        return [strip_self_reference(question.strip())]
    subs = reply.get("sub_queries")
    if not isinstance(subs, list):
        return None
    clean = [s.strip() for s in subs if isinstance(s, str) and s.strip() and len(s) <= 300 and key_terms(s)]
    clean = list(dict.fromkeys(clean))[:max_sub_queries]
    if len(clean) < 2:
        return None
    lead, _ = split_lead(question)
    if lead:
        clean = [s if lead.strip(" :,;").lower() in s.lower() else f"{lead}{s}" for s in clean]
    return protect(question, clean)


def make_planner(deps: AgentDeps):
    """The planner node."""
    settings = deps.settings

    def planner(state: AgentState) -> Step:
        question = state["question"]
        answer_type = detect_answer_type(question)
        how = "rules"
        subs = plan_rules(question, settings.max_sub_queries)
        # A split the rules found is the question's own words, part by part; the LLM is asked only when
        # they found none (it rewrote "... and for joint ontology and semantic parser learning" into
        # "... learning datasets for NMT", a part the user did not ask).
        if deps.llm is not None and settings.plan_with_llm and len(subs) < 2 and looks_compound(question):
            reply = ask_json(
                deps.llm,
                prompts.PLANNER_SYSTEM,
                prompts.PLANNER_USER.format(question=question),
                prompts.PLANNER_SCHEMA,
                max_tokens=160,
            )
            got = validate_llm_plan(question, reply, settings.max_sub_queries)
            if got is not None:
                subs, how = got, "LLM"
            else:
                how = "rules (LLM reply unusable)"
        kind = "compound" if len(subs) > 1 else "simple"
        update = {
            "answer_type": answer_type,
            "plan": subs,
            "pending": subs,
            "pending_targets": subs,
            "passes": 0,
            "retries": 0,
        }
        noun = "sub-queries" if len(subs) > 1 else "sub-query"
        decision = f"{kind}: {len(subs)} {noun} ({how}); answer type {answer_type}"
        return Step(update, decision, {"sub_queries": len(subs)})

    return planner
