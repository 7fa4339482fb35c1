"""What kind of answer a question asks for (yes/no, a span of a paper, free form), decided explicitly:
it shapes the synthesis prompt and the checks on the short answer. With a 1.5B model, answer-type
mistakes (a flipped yes/no, BIBREF0 as the answer, "unanswerable" when the passage had it) cost as
much as retrieval misses."""

from __future__ import annotations

import re

from arag.agent import prompts
from arag.agent.terms import CITE, is_placeholder
from arag.records import AnswerType
from arag.text import strip_placeholders

# "In the paper 'T': ..." / "In 1601.00901, ..." leads, which say nothing about the answer's kind.
LEAD = re.compile(
    r"^\s*(?:(?:in|from|according\s+to|for)\s+(?:the\s+)?(?:paper|article|work)?\s*"
    r"(?:[\"“‘'][^\"“”‘’]{3,300}?[\"”’']|(?:arxiv\s*:?\s*)?\d{4}\.\d{4,5}(?:v\d+)?)\s*[:,;\-–—]?\s*)",
    re.I,
)
_AUX = re.compile(
    r"^(?:is|are|was|were|do|does|did|can|could|has|have|had|will|would|should|shall|may|might|must)\b", re.I
)
_SPAN = re.compile(
    r"^(?:how\s+(?:many|much|large|big|long|often|old|fast)|which|who|whom|whose|when|where|"
    r"what\s+(?:is|are|was|were)\s+the\s+(?:name|names|number|size|value|score|scores|accuracy|f1|bleu|"
    r"dataset|datasets|baseline|baselines|metric|metrics|language|languages|performance|improvement|"
    r"source|sources|vocabulary|percentage)\b|"
    r"what\s+(?:dataset|datasets|model|models|metric|metrics|language|languages|baseline|baselines|"
    r"corpus|corpora|features|architecture|task|tasks|kind|type|types|data|methods?|evaluation|"
    r"size|percentage|score|scores|approaches?)\b|"
    r"what\s+(?:do|does|did)\s+(?:they|the\s+authors)\s+(?:use|compare|evaluate)|name\s+the)",
    re.I,
)
_FREE = re.compile(
    r"^(?:why|how|explain|describe|compare|contrast|summari[sz]e|discuss|what\s+are\s+the\s+(?:differences|advantages|limitations))\b",
    re.I,
)

_YES = frozenset("yes yeah yep true correct right indeed affirmative".split())
_NO = frozenset("no nope false incorrect not never negative".split())
_UNANSWERABLE = re.compile(
    r"^(?:unanswerable|not?\s+(?:in|found\s+in)\s+the\s+(?:library|passages|paper)|"
    r"(?:the\s+)?(?:paper|passages?|text|context)\s+(?:does|do)\s+not\s+(?:contain|mention|say|state|"
    r"provide|include)|not\s+(?:mentioned|"
    r"stated|specified|given|reported|available|provided)|(?:it\s+)?(?:cannot|can't)\s+be\s+(?:determined|"
    r"answered)|none\s+given|no\s+information|(?:the\s+)?passages?\s+(?:do|does)\s+not)"
    # Single words count only as the whole answer: "Naive Bayes" or "unknown words" are answers.
    r"(?=$|[\s.,;:!)])|^(?:unknown|n/?a)[\s.!]*$",
    re.I,
)
_NEGATION = re.compile(r"\b(?:not|no|never|neither|nor|without|cannot|fails?|n't)\b", re.I)


def strip_lead(question: str) -> str:
    """The question without its "In the paper '...':" lead."""
    return LEAD.sub("", question, count=1).strip()


def detect_answer_type(question: str) -> AnswerType:
    """yes_no for an auxiliary-verb question without alternatives ("Do they use X?"); span for a
    question after a name, number or short phrase; free_form for explanations and comparisons."""
    q = strip_lead(question)
    # The last question of several decides ("We know X. Do they use Y?").
    parts = [p for p in re.split(r"(?<=[?.!])\s+", q) if p.strip()]
    q = parts[-1] if parts else q
    if _AUX.match(q):
        # "Is it X or Y?" asks for a choice, a span.
        return "span" if re.search(r"\bor\b", q, re.I) else "yes_no"
    if _FREE.match(q):
        # "How many / how much" is a number, not an explanation.
        return "span" if _SPAN.match(q) else "free_form"
    if _SPAN.match(q):
        return "span"
    return "free_form"


def yes_no_of(text: str, *, strict: bool = False) -> str | None:
    """'Yes' or 'No' when ``text`` starts with one (or a synonym), else None. ``strict``: only an
    explicit "Yes," / "No." (an explanation starting "Not only ..." says neither)."""
    m = re.match(r"\W*([A-Za-z']+)(?P<end>\s*(?:[,.;:!]|$))?", text)
    if m is None:
        return None
    word = m.group(1).lower()
    if strict:
        return {"yes": "Yes", "no": "No"}.get(word) if m.group("end") is not None else None
    if word in _YES:
        return "Yes"
    if word in _NO:
        return "No"
    return None


def is_unanswerable(text: str) -> bool:
    """The model says the passages do not hold the answer."""
    return _UNANSWERABLE.match(text.strip().strip("\"'*")) is not None


def normalize_short_answer(raw: str, answer_type: AnswerType) -> str:
    """A clean short answer: no "Short answer:" label, citation markers, placeholders or trailing
    punctuation; yes/no answers become exactly Yes / No; "unanswerable" and its paraphrases become
    "not in the library"; a placeholder alone becomes "" (the caller finds a better one)."""
    text = re.sub(r"^\s*\**\s*short\s+answer\s*\**\s*[:\-–]\s*", "", raw.strip(), flags=re.I)
    text = text.strip().splitlines()[0] if text.strip() else ""
    if is_placeholder(text):
        return ""
    text = CITE.sub("", strip_placeholders(text)).strip()
    for _ in range(2):  # '"SQuAD".' and "SQuAD." alike
        text = re.sub(r"[\s.;:,]+$", "", text).strip("*\"'`“”").strip()
    if is_unanswerable(text):
        return prompts.NOT_IN_LIBRARY
    if answer_type == "yes_no":
        yn = yes_no_of(text)
        if yn is not None:
            return yn
    return text


def extractive_yes_no(sentence: str) -> str:
    """A baseline yes/no from the best-supported sentence alone (no LLM): No when it is negated."""
    return "No" if _NEGATION.search(sentence) else "Yes"
