"""Does a passage support a claim? The verifier's scorer protocol and two implementations.

``LexicalSupport`` is a baseline: the share of the claim's content words found in the passage. It
catches invented details (names, numbers, terms the passage never mentions) but not a claim that
rearranges the passage's own words into something false. ``LLMJudgeSupport`` asks the LLM, for
capable hosted models. A trained cross-encoder can implement the same protocol.
"""

from __future__ import annotations

import logging
import re
from typing import Protocol, runtime_checkable

from arag.agent import prompts
from arag.agent.terms import key_terms, strip_citations, strip_placeholders
from arag.errors import AragError
from arag.index.sparse import tokenize
from arag.llm.base import LLM, ChatMessage

log = logging.getLogger(__name__)


@runtime_checkable
class SupportScorer(Protocol):
    """Scores how well ``passage`` supports ``claim``, in [0, 1]; ``threshold`` is where support begins."""

    name: str
    threshold: float

    def score(self, claim: str, passage: str) -> float: ...


class LexicalSupport:
    """Content-word overlap: the share of the claim's key terms (stemmed) that the passage holds.

    Numbers must match exactly (a claim's "84.2" against a passage's "82.4" is no support), so each
    number the claim states but the passage lacks halves the score.
    """

    name = "lexical"

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold

    def score(self, claim: str, passage: str) -> float:
        terms = key_terms(strip_placeholders(strip_citations(claim)))
        if not terms:
            return 1.0  # nothing to check ("Yes.", connectives)
        have = set(tokenize(passage))
        share = sum(t in have for t in terms) / len(terms)
        numbers = [t for t in terms if re.fullmatch(r"\d+(?:\.\d+)?", t)]
        for num in numbers:
            if num not in have:
                share /= 2
        return round(share, 4)


class LLMJudgeSupport:
    """Asks the LLM whether the passage supports the claim (yes: 1.0, no: 0.0). A failed call scores
    0.5, which does not clear the default threshold 0.6: fail closed."""

    name = "llm-judge"

    def __init__(self, llm: LLM, threshold: float = 0.6) -> None:
        self.llm = llm
        self.threshold = threshold

    def score(self, claim: str, passage: str) -> float:
        messages = [
            ChatMessage(role="system", content=prompts.JUDGE_SYSTEM),
            ChatMessage(
                role="user",
                content=prompts.JUDGE_USER.format(passage=passage, claim=strip_citations(claim)),
            ),
        ]
        try:
            reply = self.llm.complete(messages, max_tokens=4).text
        except AragError as exc:
            log.warning("support judge failed: %s", exc)
            return 0.5
        word = re.match(r"\W*(\w+)", reply.lower())
        if word is None:
            return 0.5
        return 1.0 if word.group(1) in {"yes", "supported", "true"} else 0.0
