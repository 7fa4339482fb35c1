"""Follow-ups rewritten into standalone questions (the history they read: :mod:`arag.agent.chat_history`).

A follow-up ("how is it trained?", "what about ELMo?", "and on SQuAD?") means little to retrieval on its
own, so before the agent sees it, it is rewritten from the session's last research question: by the LLM
when there is one, and by rules without one (or when the LLM's reply is unusable). The rules carry the
previous question's paper scope (an "In the paper '<title>':" lead, a quoted title, an arXiv id) and its
subject (its first named entity, else its main noun phrase) over; a message that is no follow-up is left
as it is. ``arag chat --no-rewrite`` skips all of this when a rewrite over-constrains.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from arag.agent import prompts
from arag.agent.chat_history import Exchange
from arag.agent.deps import ask
from arag.agent.direct import arithmetic_expression, is_chitchat
from arag.agent.terms import entities, key_terms, safe_label, strip_citations
from arag.errors import AragError, ModelUnavailable
from arag.llm.base import LLM
from arag.retrieval.resolve import PaperRef, PaperResolver
from arag.settings import QUESTION_CHARS_CEILING
from arag.text import STOPWORDS

# --- rule-based rewriting ------------------------------------------------------------------------

_ARXIV = re.compile(r"(?<![\d.])\d{4}\.\d{4,5}(?:v\d+)?(?!\d)")
# A quoted title: 8+ characters between quotes that open after a space (not an apostrophe in a word);
# inside double quotes a title may hold apostrophes.
_QUOTED = re.compile(
    r"(?<!\w)(?:[\"“«`]([^\"“”«»`]{8,300}?)[\"”»`]|[‘']([^‘’'\"“”]{8,300}?)[’'])(?=$|[\s:;,.?!)])"
)
_WORDS = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-]*")

_PRONOUN = re.compile(r"\b(?:it's|it|its|they|them|their)\b", re.I)
# "Is it true that ...": an "it" that refers to nothing.
_EXPLETIVE_IT = re.compile(
    r"\bit(?:\s+is|'s|\s+was)?\s+(?:true|possible|necessary|important|known|clear|likely|unlikely|hard|"
    r"easy|worth|feasible)\b",
    re.I,
)
_PAPER_NOUNS = frozenset("paper work article study".split())
_REF_NOUNS = (
    "method methods model models approach approaches technique techniques system systems architecture "
    "algorithm framework dataset datasets corpus task paper work article study idea network networks "
    "metric metrics baseline baselines module modules component components one ones result results"
).split()
# Not "that": "evidence that models overfit" is no reference.
_DEMONSTRATIVE_NP = re.compile(rf"\b(?:this|these|those)\s+(?:{'|'.join(_REF_NOUNS)})\b", re.I)
_THE_PAPER = re.compile(r"\b(?:the|this|that)\s+(?:paper|article|study)\b", re.I)
_BARE_DEMONSTRATIVE = re.compile(
    r"\b(?:this|that|these|those)\b(?=\s*(?:[?.!,;]|$)|\s+(?:is|are|was|were|does|do|did|has|have|can|"
    r"could|would|will|compares?|works?|performs?|differs?|means?|helps?|improves?|scales?)\b)",
    re.I,
)
_WH_AUX = r"(?:what|which|how|why|who|whom|whose|where|when|is|are|was|were|do|does|did|can|could|has|have)"
_WHAT_ABOUT = re.compile(
    r"^(?:(?:and|but|so|also|ok|okay)[\s,]+)?(?:what|how)\s+about\s+(?P<x>.+?)[\s?.!]*$", re.I
)
# A dot inside an arXiv id or a version number does not end the phrase.
_ID_DOT = r"(?<=\d)\.(?=\d)"
# The new part of "and on X?": no question word or auxiliary in it.
_X = rf"(?P<x>(?!.*\b{_WH_AUX}\b)(?:[^?.!,;]|{_ID_DOT})+?)"
_PREPS = r"on|in|for|with|at|across|over|without|using|from|to|by|versus|vs\.?"
_AND_PREP = re.compile(rf"^(?:(?:and|but|also)[\s,]+)?(?P<prep>{_PREPS})\s+{_X}[\s?.!]*$", re.I)
_AND_X = re.compile(rf"^and[\s,]+{_X}[\s?.!]*$", re.I)
_FRAGMENT_WORDS = 4
_MAX_X_WORDS = 8

_WH = frozenset("what which how why who whom whose where when".split())
_AUX = frozenset("is are was were do does did can could would will should has have had".split())
_DETERMINERS = frozenset("the a an this that these those their its our".split())
_PREPOSITIONS = frozenset(
    "on in for with at from to by of than over across against versus vs between into about".split()
)
_QUANTIFIERS = frozenset("many much kind kinds type types sort sorts of".split())
# Verbs that end a noun phrase after "what do the modules ...": a list, since there is no tagger.
_VERBS = frozenset(
    "achieve address affect apply capture combine compare compute deal define differ do encode evaluate "
    "generate get handle help improve include learn measure mean need obtain outperform perform predict "
    "produce represent require select solve train use work".split()
)

Cue = Literal["about", "prep", "pronoun", "demonstrative", "fragment", "short"]


@dataclass(frozen=True)
class FollowUp:
    """Why a message reads as a follow-up: the cue, and for ellipsis the new part ("what about X")."""

    cue: Cue
    x: str = ""
    prep: str = ""


def _named_paper(text: str) -> PaperRef | None:
    """An arXiv id or a quoted title in ``text``, without a library to check it against."""
    m = _ARXIV.search(text)
    if m:
        pid = m.group(0)
        return PaperRef(paper_id=pid, title=pid, method="arxiv-id", score=1.0, matched=pid)
    m = _QUOTED.search(text)
    if m:
        title = (m.group(1) or m.group(2)).strip()
        return PaperRef(paper_id="", title=title, method="quoted-title", score=1.0, matched=title)
    return None


def _resolve(text: str, resolver: PaperResolver | None) -> PaperRef | None:
    ref = resolver.resolve(text) if resolver is not None else None
    return ref or _named_paper(text)


def names_paper(text: str, resolver: PaperResolver | None = None) -> bool:
    """Whether ``text`` names a paper: an arXiv id, a quoted title, or a title the library knows."""
    return _resolve(text, resolver) is not None


def scope_lead(ref: PaperRef) -> str:
    """The lead that scopes a question to a paper: ``In the paper '<title>':`` (or its arXiv id)."""
    if ref.method == "arxiv-id":
        return f"In the paper {ref.matched}:"
    title = safe_label(ref.title)
    q = '"' if "'" in title else "'"
    return f"In the paper {q}{title}{q}:"


def split_scope(question: str, resolver: PaperResolver | None = None) -> tuple[str | None, str]:
    """The paper scope a question names, as a lead, and the question without it; ``(None, question)``
    when it names no paper."""
    ref = _resolve(question, resolver)
    if ref is None:
        return None, question
    return scope_lead(ref), ref.remainder(question)


def _verbish(word: str) -> bool:
    w = word.lower()
    return (
        w in _VERBS
        or (w.endswith("es") and w[:-2] in _VERBS)
        or (w.endswith("s") and w[:-1] in _VERBS)
        or w.endswith(("ed", "ing"))
    )


def main_subject(question: str) -> str | None:
    """What a question is about: its first named entity (an acronym, a mixed-case or quoted name) not
    after a preposition, else the noun phrase after its question word and auxiliary ("How is the
    ontology induced?" -> "the ontology"); None when neither is found."""
    words = _WORDS.findall(question)
    for name in entities(question):
        # "the accuracy on SQuAD" is about the accuracy: a name after a preposition is no subject.
        before = re.search(rf"(\w+)\W+{re.escape(name)}(?![\w-])", question)
        if before is None or before.group(1).lower() not in _PREPOSITIONS:
            return name
    i, n = 0, len(words)
    wh_determiner = do_support = False
    if i < n and words[i].lower() in _WH:
        wh = words[i].lower()
        i += 1
        while i < n and words[i].lower() in _QUANTIFIERS:
            i += 1
        # "Which datasets are used?": the question word is the noun phrase's determiner.
        wh_determiner = wh in ("what", "which") and i < n and words[i].lower() not in _AUX
    if i < n and words[i].lower() in _AUX:
        do_support = words[i].lower() in ("do", "does", "did")
        i += 1
    has_det = False
    while i < n and words[i].lower() in _DETERMINERS:
        has_det = True
        i += 1
    phrase: list[str] = []
    while i < n and len(phrase) < 4:
        w = words[i]
        if w.lower() in STOPWORDS or w.lower() in _AUX or (phrase and _verbish(w)):
            break
        phrase.append(w)
        i += 1
    # "what do the modules compute": with do-support the last word of the question is its verb.
    if do_support and i == n and len(phrase) >= 2:
        phrase.pop()
    if not phrase:
        return None
    return ("the " if has_det or wh_determiner else "") + " ".join(phrase)


def _is_plural(phrase: str) -> bool:
    last = phrase.split()[-1]
    return last.endswith("s") and not last.lower().endswith(("ss", "us", "is"))


def follow_up(message: str) -> FollowUp | None:
    """Why ``message`` reads as a follow-up to an earlier question, or None when it stands alone."""
    msg = message.strip()
    if m := _WHAT_ABOUT.match(msg):
        return FollowUp("about", x=m.group("x").strip())
    m = _AND_PREP.match(msg)
    if m and len(m.group("x").split()) <= _MAX_X_WORDS:
        return FollowUp("prep", x=m.group("x").strip(), prep=m.group("prep").lower())
    m = _AND_X.match(msg)
    if m and len(m.group("x").split()) <= _MAX_X_WORDS:
        return FollowUp("about", x=m.group("x").strip())
    pronouns = [p.lower() for p in _PRONOUN.findall(msg)]
    if _EXPLETIVE_IT.search(msg):
        pronouns = [p for p in pronouns if p != "it"]
    if pronouns:
        return FollowUp("pronoun")
    if _DEMONSTRATIVE_NP.search(msg) or _BARE_DEMONSTRATIVE.search(msg) or _THE_PAPER.search(msg):
        return FollowUp("demonstrative")
    words = _WORDS.findall(msg)
    # "BLEU scores?": a question without its question.
    if msg.endswith("?") and len(words) <= _FRAGMENT_WORDS and words[0].lower() not in _WH | _AUX:
        return FollowUp("fragment")
    if not key_terms(msg) and not entities(msg):
        return FollowUp("short")
    return None


def _cased(replacement: str, at_start: bool) -> str:
    return replacement[:1].upper() + replacement[1:] if at_start else replacement


def substitute(message: str, subject: str, *, they: bool = True) -> tuple[str, bool]:
    """``message`` with its pronouns and demonstratives that agree in number with ``subject`` replaced
    by it, and whether anything was replaced. ``they`` False leaves they/them/their alone (inside one
    paper they are its authors far more often than the previous subject)."""
    plural = _is_plural(subject)
    expletive = _EXPLETIVE_IT.search(message) is not None
    changed = False

    def pronoun(m: re.Match[str]) -> str:
        nonlocal changed
        p = m.group(0).lower()
        singular_p = p in ("it", "it's", "its")
        if singular_p == plural or (p == "it" and expletive) or (not singular_p and not they):
            return m.group(0)
        changed = True
        start = m.start() == 0
        if p == "it's":
            return _cased(subject, start) + " is"
        if p in ("its", "their"):
            return _cased(subject, start) + ("'" if plural else "'s")
        return _cased(subject, start)

    def demonstrative(m: re.Match[str]) -> str:
        nonlocal changed
        words = m.group(0).split()
        if len(words) > 1 and words[1].lower() in _PAPER_NOUNS:
            return m.group(0)  # "this paper": the scope names it
        if (words[0].lower() in ("these", "those")) != plural:
            return m.group(0)
        changed = True
        return _cased(subject, m.start() == 0)

    out = _PRONOUN.sub(pronoun, message)
    out = _DEMONSTRATIVE_NP.sub(demonstrative, out)
    out = _BARE_DEMONSTRATIVE.sub(demonstrative, out)
    return out, changed


def lower_first(text: str) -> str:
    """``text`` with its first letter lowercased, unless the first word is a name (BERT, ELMo, I)."""
    first = text.split(" ", 1)[0]
    if len(first) > 1 and first[0].isupper() and first[1:].islower():
        return text[0].lower() + text[1:]
    return text


def _swap(f: FollowUp, lead: str | None, body: str, resolver: PaperResolver | None) -> str | None:
    """'What about X?' / 'And on X?' as the previous question with X in place of what it replaces; None
    when there is nothing to put X in place of."""
    ref = _resolve(f.x, resolver)
    if ref is not None:  # "what about '<another title>'?": the same question, of that paper
        return f"{scope_lead(ref)} {lower_first(body)}"
    out: str | None = None
    if f.cue == "prep":
        pattern = rf"\b({re.escape(f.prep)})\s+[^?.!,;]+?(?=[\s?.!]*$)"
        if re.search(pattern, body, re.I):
            out = re.sub(pattern, lambda m: f"{m.group(1)} {f.x}", body, count=1, flags=re.I)
    else:
        new, old = entities(f.x), entities(body)
        if new and old:
            out = re.sub(rf"(?<![\w-]){re.escape(old[0])}(?![\w-])", f.x, body, count=1)
    if out is None:
        return None
    return f"{lead} {lower_first(out)}" if lead else out


def rewrite_rules(message: str, previous: str | None, resolver: PaperResolver | None = None) -> str:
    """The standalone question for ``message`` after the research question ``previous`` (a pure function
    given the resolver). A follow-up gets the previous question's paper scope, and its subject in place
    of a pronoun that agrees with it (or as a "Regarding <subject>:" lead when there is no scope to
    carry); "what about X" and "and on X" are the previous question with X swapped in. Anything else,
    and any message that names its own paper, is returned as it is."""
    msg = " ".join(message.split())
    if not previous or not msg or is_chitchat(msg) or arithmetic_expression(msg) is not None:
        return msg
    f = follow_up(msg)
    if f is None:
        return msg
    lead, body = split_scope(previous, resolver)
    if f.cue in ("about", "prep"):
        swapped = _swap(f, lead, body, resolver)
        if swapped is not None:
            return swapped
    if names_paper(msg, resolver):
        return msg
    subject = main_subject(body)
    out, substituted = msg, False
    if f.cue in ("pronoun", "demonstrative") and subject:
        out, substituted = substitute(msg, subject, they=lead is None)
    if lead:
        return f"{lead} {lower_first(out)}"
    if substituted:
        return out
    if subject:
        return f"Regarding {subject}: {lower_first(out)}"
    return msg


# --- the rewriter --------------------------------------------------------------------------------


class Rewrite(BaseModel):
    """A message, the standalone question it became, and how (shown by ``arag chat``)."""

    model_config = ConfigDict(frozen=True)

    message: str
    question: str
    how: Literal["no earlier question", "rules", "llm", "rules (LLM reply unusable)"]

    @property
    def changed(self) -> bool:
        return self.question != self.message


_REPLY_LEAD = re.compile(r"^(?:standalone\s+question|rewritten\s+question|question)\s*:\s*", re.I)


def rewrite_prompt(message: str, history: Sequence[Exchange], turns: int) -> str:
    """The LLM rewriter's user turn: the last ``turns`` exchanges, then the message."""
    lines = []
    for e in history[-turns:] if turns > 0 else []:
        lines.append(f"User: {e.standalone}")
        if e.answer is not None:
            gist = e.answer.short_answer or strip_citations(e.answer.text)[:200]
            lines.append(f"Assistant: {strip_citations(gist)}")
    return "Conversation:\n" + "\n".join(lines) + f"\n\nLast message: {message}\n\nStandalone question:"


def clean_reply(
    reply: str, message: str, previous: str, max_chars: int = QUESTION_CHARS_CEILING
) -> str | None:
    """The LLM's rewrite as a question, or None when it is unusable: empty, or longer than three times
    the longer of the message and the previous question (the model answered instead of rewriting)."""
    line = next((ln.strip() for ln in reply.splitlines() if ln.strip()), "")
    line = _REPLY_LEAD.sub("", line).strip()
    if len(line) >= 2 and line[0] == line[-1] and line[0] in "\"'`":
        line = line[1:-1].strip()
    limit = min(3 * max(len(message), len(previous)), max_chars)
    if not line or len(line) > limit:
        return None
    return line


class Rewriter:
    """Rewrites follow-ups into standalone questions: with the LLM when given one, by rules otherwise and
    whenever the LLM's reply is unusable. Stateless: safe to share between threads."""

    def __init__(
        self,
        llm: LLM | None = None,
        resolver: PaperResolver | None = None,
        *,
        history_turns: int = 3,
        max_chars: int = QUESTION_CHARS_CEILING,
    ) -> None:
        self.llm = llm
        self.resolver = resolver
        self.history_turns = history_turns
        self.max_chars = max_chars

    def rewrite(self, message: str, history: Sequence[Exchange]) -> Rewrite:
        """The standalone question for ``message`` after the exchanges in ``history``."""
        msg = " ".join(message.split())
        research = [e for e in history if e.answer is None or e.answer.route == "research"]
        if not research:
            return Rewrite(message=msg, question=msg, how="no earlier question")
        previous = research[-1].standalone
        by_rules = rewrite_rules(msg, previous, self.resolver)
        if self.llm is None:
            return Rewrite(message=msg, question=by_rules, how="rules")
        try:
            reply = ask(
                self.llm,
                prompts.REWRITE_SYSTEM,
                rewrite_prompt(msg, history, self.history_turns),
                max_tokens=120,
            )
        except ModelUnavailable:
            raise
        except AragError:
            reply = ""
        question = clean_reply(reply, msg, previous, self.max_chars)
        if question is None:
            return Rewrite(message=msg, question=by_rules, how="rules (LLM reply unusable)")
        # A small model often drops the paper the conversation is about: keep the scope the rules saw.
        lead, _ = split_scope(previous, self.resolver)
        if lead and by_rules != msg and not names_paper(question, self.resolver):
            question = f"{lead} {lower_first(question)}"
        return Rewrite(message=msg, question=question, how="llm")
