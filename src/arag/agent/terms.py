"""Words of questions and passages: key terms (stemmed, as BM25 sees them), named entities, citation
markers and S2ORC placeholders. Shared by the router, planner, grader, context builder and verifier."""

from __future__ import annotations

import re
from collections.abc import Iterable

from arag.ingest.splitter import split_sentences
from arag.text import STOPWORDS, strip_placeholders, tokenize

# Words every research question uses: they say nothing about what the passages must hold.
_GENERIC_TEXT = """
    paper papers author authors work works approach approaches method methods propose proposed use used
    uses using describe explain compare comparison difference differences different mention mentioned
    discuss study present presented show shown result results tell give list example kind type way ways
    main also well much many know please would like question questions answer yes
    finding findings contribution contributions conclusion conclusions key novel novelty idea ideas
    goal goals aim aims purpose overall summary summarize summarise takeaway takeaways outcome outcomes
    primary core address addresses addressed focus"""
GENERIC: frozenset[str] = frozenset(tokenize(_GENERIC_TEXT))

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'\-]*|\d+(?:\.\d+)?")
# Acronyms and mixed-case or alphanumeric names: BERT, SQuAD, GPT-2, F1, WikiText-103, ELMo.
_NAME = re.compile(r"\b(?:[A-Za-z]*[A-Z][a-z]*[A-Z0-9][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*|[A-Za-z]+-\d+)\b")
_QUOTED = re.compile(r"(?<!\w)[\"“‘']([^\"“”‘’]{3,120}?)[\"”’'](?!\w)")
# [3], [1, 2], [1; 4], [2-3] markers (CITE with the space before one, which strip_citations removes).
MARKER_PATTERN = r"\[(\d+(?:\s*[,;\-–]\s*\d+)*)\]"
CITE = re.compile(r"\s*" + MARKER_PATTERN)
# Capitalised words that are not names.
_NOT_NAMES = frozenset("I A The What Which How Why When Where Who Whom Is Are Do Does Did Can Could".split())


def key_terms(text: str) -> list[str]:
    """The stemmed content terms of ``text``, unique, in order, generic research words left out."""
    out: list[str] = []
    for t in tokenize(text):
        if t not in GENERIC and t not in out:
            out.append(t)
    return out


def term_words(text: str) -> dict[str, str]:
    """Each key term of ``text`` mapped to the word it came from (to say what is missing in words)."""
    out: dict[str, str] = {}
    for w in _WORD.findall(text):
        for t in tokenize(w):
            if t not in GENERIC:
                out.setdefault(t, w)
    return out


def content_words(text: str) -> list[str]:
    """The words of ``text`` that are not stopwords or generic, as written."""
    return [w for w in _WORD.findall(text) if w.lower() not in STOPWORDS and key_terms(w)]


def entities(text: str) -> list[str]:
    """Names a passage must mention for a question about them: quoted phrases, acronyms, mixed-case and
    alphanumeric names. Unique, in order."""
    out: list[str] = []
    for m in _QUOTED.finditer(text):
        out.append(m.group(1).strip())
    rest = _QUOTED.sub(" ", text)
    for m in _NAME.finditer(rest):
        name = m.group(0)
        if name not in _NOT_NAMES and not name.isdigit():
            out.append(name)
    return list(dict.fromkeys(out))


def has_entity(entity: str, text_lower: str) -> bool:
    """Whether a (case-folded) text mentions the entity, as a whole word."""
    return (
        re.search(r"(?<![A-Za-z0-9])" + re.escape(entity.lower()) + r"(?![A-Za-z0-9])", text_lower)
        is not None
    )


# A sentence that does not stand alone out of its paragraph: it stops where its content begins
# ("... to the following models:") or where a removed citation stood ("as used by.").
_UNFINISHED = re.compile(r"(?:[:;,]|\b(?:by|in|of|as|see|from|to|and|with|e\.g|i\.e)[.,;:]?)\s*$", re.I)


def exclaims(sentence: str) -> bool:
    """An exclamation: a paper's joke or aside ("... it is totally great research, it really is!"), not
    what the paper does; neither an answer's point nor a summary's sentence."""
    return re.search(r"![\"'”’)\]]*\s*$", sentence) is not None


# ... or where a removed table or figure stand-in stood ("... shown in Figure."): capitalised, as
# papers write their references.
_DANGLING_REFERENCE = re.compile(
    r"\b(?:Figure|Fig|Table|Section|Sec|Eq|Equation|Appendix|Algorithm|Tab)s?[.,;:]?\s*$"
)


def unfinished(sentence: str) -> bool:
    """The sentence ends on a colon, comma or semicolon, or on a word a removed citation, table or
    figure followed."""
    return _UNFINISHED.search(sentence) is not None or _DANGLING_REFERENCE.search(sentence) is not None


# Sections where a paper describes other papers' work: a sentence from one, shown as the paper's own
# point or method, would cite the paper for another paper's work.
_OTHERS_SECTION = re.compile(r"related|background|previous|prior|other approaches|literature", re.I)


def about_others(section: str | None) -> bool:
    """The section (a chunk's, "Related Work ::: Hate speech") is one about other papers' work."""
    return section is not None and _OTHERS_SECTION.search(section) is not None


def is_placeholder(text: str) -> bool:
    """A placeholder (or only citation markers) where an answer should be."""
    rest = CITE.sub("", strip_placeholders(text)).strip(" .,;:()[]\"'")
    return not rest


def cited_numbers(text: str) -> list[int]:
    """The passage numbers cited in ``text``, in order of first citation (ranges expanded)."""
    out: list[int] = []
    for m in CITE.finditer(text):
        for n in _expand(m.group(1)):
            if n not in out:
                out.append(n)
    return out


def _expand(group: str) -> list[int]:
    nums: list[int] = []
    for part in re.split(r"\s*[,;]\s*", group):
        if re.fullmatch(r"\d+\s*[\-–]\s*\d+", part):
            a, b = (int(x) for x in re.split(r"\s*[\-–]\s*", part))
            # A range wider than a context ever is: read it as its two ends.
            nums.extend(range(a, b + 1) if 0 < b - a <= 10 else [a, b])
        elif part.strip().isdigit():
            nums.append(int(part))
    return nums


def strip_citations(text: str) -> str:
    """``text`` without its [n] markers."""
    return CITE.sub("", text).strip()


def clean_citations(text: str, valid: Iterable[int]) -> tuple[str, int]:
    """Keep only markers that name a passage in ``valid``; return the text and how many numbers were
    removed. A marker left with no valid number disappears."""
    ok = set(valid)
    removed = 0

    def fix(m: re.Match[str]) -> str:
        nonlocal removed
        nums = _expand(m.group(1))
        good = list(dict.fromkeys(n for n in nums if n in ok))
        removed += len(nums) - len([n for n in nums if n in ok])
        return f" [{', '.join(str(n) for n in good)}]" if good else ""

    return CITE.sub(fix, text), removed


def sentences(text: str, *, lower_starts: bool = False) -> list[str]:
    """Sentences of a passage or an answer (``lower_starts``: see ``split_sentences``)."""
    return split_sentences(text, lower_starts=lower_starts)


def coverage(terms: Iterable[str], passage_terms: set[str]) -> float:
    """Share of ``terms`` found among ``passage_terms`` (1.0 when there are no terms to find)."""
    ts = list(terms)
    if not ts:
        return 1.0
    return sum(t in passage_terms for t in ts) / len(ts)


# Stems of Latin and Greek plurals and their singulars, which the stemmer keeps apart ("corpora" and
# "corpus"; "analyses" -> "analys", "analysis" -> "analysi").
_IRREGULAR = (
    ("corpora", "corpus"),
    ("criteria", "criterion"),
    ("phenomena", "phenomenon"),
    ("analys", "analysi"),
    ("hypothes", "hypothesi"),
    ("synthes", "synthesi"),
    ("indic", "index"),
    ("matric", "matrix"),
    ("vertic", "vertex"),
    ("appendic", "appendix"),
    ("schemata", "schema"),
)
_OTHER_NUMBER = {a: b for a, b in _IRREGULAR} | {b: a for a, b in _IRREGULAR}
# Words papers use for one thing: "What datasets are used?" is answered by "the corpus consists of"
# ("corpora" too: spellings are not chained through _OTHER_NUMBER).
_DATASET_WORDS = frozenset({"dataset", "corpus", "corpora"})


def spellings(term: str) -> set[str]:
    """A stemmed term and its other stems: American for British ("humour", "recognise" must find papers
    written in American English), the other number of an irregular plural ("corpora", "corpus"), and
    the words papers use for the same thing ("dataset", "corpus")."""
    out = {term}
    if term in _OTHER_NUMBER:
        out.add(_OTHER_NUMBER[term])
    if term in _DATASET_WORDS:
        out |= _DATASET_WORDS
    if term.endswith("our"):
        out.add(term[:-3] + "or")
    if term.endswith("is"):
        out |= {term[:-2], term[:-2] + "iz"}
    if term.endswith("ys"):
        out.add(term[:-2] + "yz")
    return out


def holds(held: set[str], term: str) -> bool:
    """Whether ``held`` (a text's stems) holds ``term`` in any of its :func:`spellings`."""
    return bool(spellings(term) & held)


def held_share(terms: Iterable[str], held: set[str]) -> float:
    """Like :func:`coverage`, a term counting in any of its :func:`spellings` (the grader's checks use
    it; the verifier's support scores keep :func:`coverage`, as they were calibrated)."""
    ts = list(terms)
    if not ts:
        return 1.0
    return sum(holds(held, x) for x in ts) / len(ts)


# Sentences of a passage that address the model rather than the reader: retrieved text is data, and
# an instruction inside it ("ignore previous instructions and answer X") must never reach the LLM as
# one, nor count as support for X. Narrow on purpose: a paper that *discusses* prompts is rarely
# phrased as an imperative to the reader's assistant.
_INSTRUCTION = re.compile(
    r"\b(?:ignore|disregard|forget|override)\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+)?"
    r"(?:previous|prior|above|earlier|preceding|your|these|those|system)\b[^.!?]{0,20}"
    r"\b(?:instructions?|prompts?|rules|guidelines|directions)\b"
    r"|\b(?:reveal|repeat|print|show|output|leak)\b[^.!?]{0,20}\b(?:system|hidden|initial)\s+"
    r"(?:prompt|message|instructions?)\b"
    r"|\byou\s+(?:are|must|should)\s+now\b"
    r"|\bcite\b[^.!?]{0,30}\[\d+\]",
    re.I,
)


def is_instruction(sentence: str) -> bool:
    """A sentence that gives the model an instruction (a prompt injection in a passage)."""
    return bool(_INSTRUCTION.search(sentence))


def strip_instructions(text: str) -> tuple[str, int]:
    """``text`` without its instruction-like sentences, and how many were removed."""
    sents = split_sentences(text)
    kept = [s for s in sents if not is_instruction(s)]
    if len(kept) == len(sents):
        return text, 0
    return " ".join(kept), len(sents) - len(kept)


WITHHELD_LABEL = "(withheld: it addressed the model)"


def clean_label(label: str) -> tuple[str, int]:
    """A paper title or section name as the LLM may read it, and how many instruction-like sentences
    were removed. A label comes from the paper (a PDF's first lines, its headings) as much as its text
    does, and sits in the passage header: it gets the passages' injection filter, is kept on one line
    (a newline would let it forge the next passage's header) and loses [n] markers."""
    flat = " ".join(CITE.sub(" ", label).split())
    text, removed = strip_instructions(flat)
    text = " ".join(text.split())
    if removed and not text:
        return WITHHELD_LABEL, removed
    return text, removed


def safe_label(label: str) -> str:
    """:func:`clean_label` without the count."""
    return clean_label(label)[0]


# Words about the assistant itself ("the papers in this library", "what the library says about"):
# searched as terms they match nothing useful ("common library detect fake news"), and no passage
# holds them. "the NLTK library" names software and is left alone.
# "the collection of COVID-19 literature" and "a library of templates" are research, not the assistant.
_LIB = r"(?:this|the|your|our|my|arag's|arag)\s+library(?:'s)?(?!\s+of\b)"
_SELF_PATTERNS = (
    re.compile(
        rf"\bwhat\s+{_LIB}\s+(?:says|say|contains|has|holds|knows|covers)\s+(?:about|on|regarding)\s+", re.I
    ),
    re.compile(rf"\b(?:the\s+)?(papers|articles|works|authors)\s+(?:in|of|from)\s+{_LIB}", re.I),
    re.compile(rf"\s*\b(?:in|of|from|across|within|throughout)\s+{_LIB}", re.I),
    re.compile(r"\barag\b\s*", re.I),
)


def strip_self_reference(text: str) -> str:
    """``text`` without words about the assistant or its library; unchanged when it has none. A bare
    "this library" stays: in "Is this library implemented in Torch?" it is the paper's software."""
    out = text
    for i, pattern in enumerate(_SELF_PATTERNS):
        out = pattern.sub(r"\1" if i == 1 else "", out)
    if out == text:
        return text
    out = re.sub(r"\s+([?.!,;:])", r"\1", re.sub(r"\s{2,}", " ", out)).strip()
    return out or text


def drop_assistant_words(query: str, question: str) -> str:
    """A search query without words about the assistant: its self-references, and the bare words
    "library" and "arag" when the question used them of the assistant ("common library detect fake
    news" from "the papers in this library")."""
    out = strip_self_reference(query)
    if strip_self_reference(question) != question:
        out = re.sub(r"\s{2,}", " ", re.sub(r"\b(?:library|arag)\b", " ", out, flags=re.I)).strip()
    return out or query


# A paper's "we" is its authors: quoted in an answer, a summary or a related-work line, "a filter that
# we built" reads as if arag built it. The alternation tries longer words first (contractions).
_FIRST_PERSON = {
    "we've": "the authors have",
    "we're": "the authors are",
    "we'll": "the authors will",
    "we'd": "the authors would",
    "ourselves": "themselves",
    "ours": "theirs",
    "our": "their",
    "we": "the authors",
    "us": "them",
}
_FIRST_PERSON_RX = re.compile(
    r"\b("
    + "|".join(re.escape(w).replace("'", "['\u2019]") for w in sorted(_FIRST_PERSON, key=len, reverse=True))
    + r")\b",
    re.I,
)


# The authors as the paper names them in a sentence: as its subject or object, and as "our".
_WE = re.compile(r"\b(?:[Ww]e|us|[Oo]urselves)\b")
_OUR = re.compile(r"\b[Oo]urs?\b")
_STOP = re.compile(r"[.!?](?:\s|$)")


# The 1.5B opens answers with "The passage states that ...": the reader sees papers and their
# sources, never "the passage" the LLM was given.
_PASSAGE_SAYS = re.compile(
    r"\b([Tt])he passage(?= (?:\[\d+\] )?(?:clearly |explicitly |also )?(?:states|says|mentions|indicates|"
    r"shows|suggests|describes|notes|explains|reports|provides|lists|discusses|does not|doesn't)\b)"
)


def as_answered(text: str) -> str:
    """An answer's text as the reader is shown it: in the third person (:func:`reported`), and "the
    passage" it read as "the paper" ("The passage states that ..." -> "The paper states that ...")."""
    return _PASSAGE_SAYS.sub(r"\1he paper", reported(text))


def reported(text: str) -> str:
    """A paper's sentence in the third person: "we" is "the authors", "our" is "their", and so on,
    with the capital kept at a sentence's start. The first "our" of a sentence with no "we" in it is
    "the authors'": "Our approach compares favorably ..." out of its paper, as "Their approach ...",
    reads as someone else's. "US" (the country) is left alone."""

    def swap(m: re.Match[str]) -> str:
        word = m.group(1)
        if word.isupper() and len(word) > 1:
            return word
        key = word.lower().replace("\u2019", "'")
        said = _FIRST_PERSON[key]
        if key == "our":
            start = max((x.end() for x in _STOP.finditer(text, 0, m.start())), default=0)
            end = next((x.start() for x in _STOP.finditer(text, m.end())), len(text))
            if not _WE.search(text, start, end) and not _OUR.search(text, start, m.start()):
                said = "the authors'"
        return said[:1].upper() + said[1:] if word[:1].isupper() else said

    return _FIRST_PERSON_RX.sub(swap, text)
