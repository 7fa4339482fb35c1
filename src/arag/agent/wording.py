"""How the LLM's overview of several papers is worded for the reader (a literature answer's one
generation): its markers written as words given words, papers it counted off or called "this paper"
named as one and another, a last sentence cut off by the token budget dropped, and fragments (a
title cited alone, a point copied up to where the prompt clipped it) told apart from sentences.
Pure functions over the text and, where a sentence's papers matter, its markers' paper ids."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from arag.agent.terms import MARKER_PATTERN, cited_numbers, sentences, strip_citations, unfinished

# The end of a sentence an LLM copied from a point clipped mid-phrase ("... new opportunities for a").
_CLIPPED = re.compile(
    r"\b(?:a|an|the|its|their|his|her|our|of|for|to|with|and|or|by|on|in|at|from|as|that|which|than)$", re.I
)


def fragment(claim: str) -> bool:
    """A claim that is no sentence: three words or fewer once its markers are gone (a paper's title
    cited alone: "Speech Model [9]."), or one that stops mid-phrase, on an article, a preposition or a
    conjunction, or as :func:`unfinished` says."""
    text = strip_citations(claim).strip().rstrip(".!?… ").strip()
    return len(text.split()) <= 3 or _CLIPPED.search(text) is not None or unfinished(text)


# Other papers' authors named in the LLM's text ("Mendoza et al. [2] used ..."), or a name cut at "et"
# ("... than other classifiers Yang et [4]"): the 1.5B copying the citations inside a point.
_NAMES_AUTHORS = re.compile(rf"\bet\.?\s*al\b|\bet\s*(?:{MARKER_PATTERN}\s*)*[.]?\s*$")


def names_authors(claim: str) -> bool:
    """Whether an overview claim names other papers' authors ("et al."), which the papers it cites
    only cite: it would credit them with those authors' work."""
    return _NAMES_AUTHORS.search(claim) is not None


# Markers the LLM wrote as words of its sentence: "[2] and [7] papers use ...", "..., while [7] uses
# ...", "[4] updates ...". Removing the markers (the verifier puts them at the end of each claim)
# would leave "and papers use ..." and "while uses ...".
_MARKER = re.compile(MARKER_PATTERN)
_JOINS_MARKERS = re.compile(r"\s*(?:,|,?\s*and)\s*")
# What follows a subject: its verb ("uses", "also uses"), not a preposition or a conjunction.
_AFTER_SUBJECT = re.compile(
    r"(?:\s+papers?\b)?(?=\s+(?!(?:in|on|at|to|for|of|from|with|by|as|and|or|that|which|respectively|"
    r"et|the|a|an)\b)[a-z])"
)
_NOUN_LEADS = re.compile(r"(?:^|[.!?;:,]|\b(?:while|whereas|and|but|with|both))$", re.I)
_PREPOSITION_LEADS = re.compile(r"\b(?:in|by|from|of|see|on|with)$", re.I)
_NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def _markers(marks: Sequence[re.Match[str]]) -> str:
    return " ".join(f"[{m.group(1)}]" for m in marks)


# "The study by [3] proposes ...": the marker names the study already ("by one paper" is no author).
_PAPER_BY = re.compile(rf"\b((?:paper|study|work|article)s?)\s+by\s+(?={MARKER_PATTERN})", re.I)


def markers_as_words(text: str) -> str:
    """The LLM's text with each marker it used as a word of its sentence given words: a subject ("[2]
    uses ..." -> "one paper [2] uses ...", "[2] and [7] papers use ..." -> "two papers [2] [7] use
    ..."), or the object of a preposition ("as shown in [2]." -> "in one paper [2]."), so that the text
    still reads once the verifier moves the markers to the end of their claim. A marker after the words
    it cites ("... a reward function [4] and ...") is left alone, and the "," and "and" between markers
    go. "The study by [3]" is "The study [3]"."""
    text = _PAPER_BY.sub(r"\1 ", text)
    marks = list(_MARKER.finditer(text))
    out: list[str] = []
    done, i = 0, 0
    while i < len(marks):
        j = i  # the markers joined to this one by "," or "and"
        while j + 1 < len(marks) and _JOINS_MARKERS.fullmatch(text[marks[j].end() : marks[j + 1].start()]):
            j += 1
        # "..., and [3] reports": the last marker alone may start a clause of its own.
        clause = j > i and re.fullmatch(r"\s*,\s*and\s*", text[marks[j - 1].end() : marks[j].start()])
        for first in (i, j) if clause else (i,):
            head = "".join(out) + text[done : marks[first].start()].rstrip()
            after = _AFTER_SUBJECT.match(text, marks[j].end())
            subject = after is not None and _NOUN_LEADS.search(head)
            if not subject and not _PREPOSITION_LEADS.search(head):
                continue
            count = sum(len(cited_numbers(m.group(0))) for m in marks[first : j + 1])
            if count == 1:
                sentence = re.split(r"[.!?;:]\s", head)[-1]
                words = "another paper" if "one paper" in sentence.lower() else "one paper"
            elif re.search(r"\bboth$", head, re.I):
                words = "papers"
            else:
                words = f"{_NUMBER_WORDS.get(count, 'several')} papers"
            if not head or head[-1] in ".!?;:":
                words = words[:1].upper() + words[1:]
            numbers = _markers(marks[first : j + 1])
            out.append(f"{text[done : marks[first].start()]}{words} {numbers}")
            done = after.end() if subject and after is not None else marks[j].end()
            break
        else:
            if j > i:  # citations joined by words: the words go with the markers
                out.append(text[done : marks[i].start()] + _markers(marks[i : j + 1]))
                done = marks[j].end()
        i = j + 1
    out.append(text[done:])
    return "".join(out)


# The LLM counting papers off ("The first paper ... while the second ... The third ..."): the order it
# means is the points' in its prompt, which the reader never sees.
_COUNTING = re.compile(r"\b[Tt]he first (?:paper|two papers|study|work)\b")
_ORDINAL = re.compile(
    r"\b(?P<the>[Tt]he) (?:(?:first|second|third|fourth|fifth|sixth|last)"
    r"(?P<two> two papers| (?:paper|study|work)\b)"
    r"|(?:second|third|fourth|fifth|sixth)(?= (?:also )?[a-z]+s\b))"
)


def ordinals_as_words(text: str, papers: Mapping[int, str] | None = None) -> str:
    """The LLM's text with the papers it counted off ("The first paper proposes ..., while the second
    addresses ...") named as one and another ("One paper proposes ..., while another paper addresses
    ..."), or as the same paper when ``papers`` (marker number -> paper id) says a sentence's markers
    are all of a paper named before (a compound question's two parts drawn from one paper). Only in
    a text that counts papers; "the first treebank" is left alone."""
    if not _COUNTING.search(text):
        return text
    named: set[str] = set()
    out = []
    for sentence in sentences(text, lower_starts=True):
        cited = {papers[n] for n in cited_numbers(sentence) if n in papers} if papers else set()
        parts, done, replaced = [], 0, False
        for m in _ORDINAL.finditer(sentence):
            if (m.group("two") or "").startswith(" two"):
                words = "two papers"
            elif cited and cited <= named:
                words = "the same paper"
            else:
                words = "another paper" if named or replaced else "one paper"
            replaced = True
            if m.group("the")[0] == "T":
                words = words[:1].upper() + words[1:]
            parts.append(sentence[done : m.start()] + words)
            done = m.end()
        out.append("".join(parts) + sentence[done:])
        if replaced:
            named |= cited or {f"#{len(out)}"}
    return " ".join(out)


# A sentence whose subject is "this paper" or "the study": in an overview of several papers, each such
# sentence means another one. The 1.5B often leads with its marker ("[3] This paper proposes ..."),
# which the verifier moves.
_THIS_PAPER = re.compile(
    rf"^(?P<lead>(?:{MARKER_PATTERN}\s*)*)(?:This|The) (?P<noun>paper|study|work|article)\b"
)


def this_paper_as_words(text: str, papers: Mapping[int, str]) -> str:
    """The LLM's text with each sentence that opens on "This paper" or "The study" and cites one paper
    named as one, another or the same paper, when the text cites several papers ("This paper proposes
    X [3]. This paper proposes Y [6]." reads "One paper proposes X [3]. Another paper proposes Y
    [6]."); ``papers`` maps marker numbers to paper ids. A text about one paper is left alone."""
    split = sentences(text, lower_starts=True)
    cited = [{papers[n] for n in cited_numbers(s) if n in papers} for s in split]
    if len(set().union(*cited)) < 2:
        return text
    out: list[str] = []
    seen: set[str] = set()
    for sentence, ids in zip(split, cited, strict=True):
        m = _THIS_PAPER.match(sentence)
        if m and len(ids) == 1:
            lead = "The same" if ids <= seen else "Another" if seen else "One"
            sentence = f"{m.group('lead')}{lead} {m.group('noun')}" + sentence[m.end() :]
        out.append(sentence)
        seen |= ids
    return " ".join(out)


# A claim whose subject is several papers ("Several research papers suggest ...", "The papers
# describe ...", "Two papers focus on ...") or "they" (the 1.5B's "They propose ... [5]. They
# investigate ... [9]."), said of the one paper it cites.
_SEVERAL_PAPERS = re.compile(
    rf"^(?P<lead>(?:{MARKER_PATTERN}\s*)*)(?:(?i:several|many|various|some|most|the|these|both|two|three|"
    r"four|five|six|multiple|different|research|recent)\s+(?:research\s+|recent\s+)?"
    r"(?P<noun>paper|stud(?=ies)|work|article)(?:s|ies)|They)\s+(?P<also>also\s+)?(?P<verb>[a-z]+)\b"
)
_SINGULAR = {"have": "has", "are": "is", "were": "was", "do": "does", "go": "goes"}
_UNCHANGED = frozenset("can could may might must shall should will would has is was does".split())
# Words after the subject that are no verb ("The papers in this area use ...").
_NOT_VERBS = frozenset("in on of for with from by at to that which who and or as about than".split())


def one_paper(claim: str, lead: str = "One") -> str | None:
    """A claim whose subject is several papers or "they" ("The papers compare ...", "Two papers focus
    on ...", "They propose ...") said of one paper ("One paper compares ...", "One paper focuses on
    ...", "One paper proposes ..."), for a claim that cites one; None when the claim is not about
    several papers, or its verb cannot be told."""
    m = _SEVERAL_PAPERS.match(claim)
    if m is None or m.group("verb") in _NOT_VERBS:
        return None
    verb = m.group("verb")
    if verb in _SINGULAR:
        verb = _SINGULAR[verb]
    elif verb.endswith("ed") or verb in _UNCHANGED:
        pass
    elif re.search(r"(?:s|sh|ch|x|z|o)$", verb):
        verb += "es"
    elif re.search(r"[^aeiou]y$", verb):
        verb = verb[:-1] + "ies"
    else:
        verb += "s"
    noun = {"stud": "study", None: "paper"}.get(m.group("noun"), m.group("noun"))
    return f"{m.group('lead')}{lead} {noun} {m.group('also') or ''}{verb}" + claim[m.end() :]


_LATER_MENTION = re.compile(
    rf"^(?P<lead>(?:{MARKER_PATTERN}\s*)*)(?:Another|The same) (?P<noun>paper|study|work|article)\b"
)


def first_mention(claim: str) -> str:
    """The first claim of an overview as the first mention of its paper: "Another paper finds ..."
    reads "One paper finds ..." once the claims before it were dropped."""
    m = _LATER_MENTION.match(claim)
    return claim if m is None else f"{m.group('lead')}One {m.group('noun')}" + claim[m.end() :]


def complete_sentences(text: str) -> str:
    """``text`` without a last sentence cut off before its final stop (an LLM reply that ran out of
    tokens: "... and [13] uses topic-specific sentiment analysis to identify")."""
    if re.search(r"[.!?][\"')\]]*\s*$", strip_citations(text)) or not text.strip():
        return text
    done = sentences(text, lower_starts=True)[:-1]
    return " ".join(done)
