"""A sentence splitter for academic text (QASPER / S2ORC prose, PDF paragraphs).

Rule based, no NLP library: a boundary is a ``.``/``?``/``!`` (plus closing quotes or brackets)
followed by whitespace and a sentence-like start, unless the word before the period is a known
abbreviation, an initial, an ellipsis or lies inside LaTeX math. Newlines split when they separate
sentences (blank lines always; single newlines unless the line is visibly wrapped mid-sentence).

Sentences are stripped slices of the input cut at whitespace only, so joining them with single
spaces gives back the input up to whitespace: no character is lost or reordered.
"""

from __future__ import annotations

import re

__all__ = ["split_sentences"]

# Closing characters allowed between the terminal punctuation and the whitespace: `end.") The`.
_CLOSERS = "\"'”’)]}"
_OPENERS = "\"'“‘`([{"
# Stripped from the front of the word before a period when looking it up ("–i.e.", "(e.g.").
_LEADERS = _OPENERS + "–—-/"

# A candidate boundary: terminal punctuation, optional closers, whitespace (group "ws");
# or any whitespace run holding a newline.
_CANDIDATE = re.compile(
    r"(?P<punct>[.?!])[" + re.escape(_CLOSERS) + r"]*(?P<ws>\s+)(?=\S)|(?P<nl>\s*\n\s*)(?=\S)"
)
# LaTeX math spans: nothing inside them is a sentence boundary.
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$]{1,400}\$", re.DOTALL)
_MULTI_LOWER = re.compile(r"^(?:[a-z]\.){2,}$")  # i.e. e.g. w.r.t. a.k.a.
_MULTI_UPPER = re.compile(r"^(?:[A-Z]\.){2,}$")  # U.S. J.R.R.
_INITIAL = re.compile(r"^[A-Z]\.$")
_BULLET = re.compile(r"^(?:[-•*–—▪◦]|\d{1,2}[.)]|\([a-zA-Z0-9]{1,3}\))\s")


def _words(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Never a sentence end, whatever follows (compared lower-cased).
_ABBREV_ANYCASE = _words(
    """fig. figs. eq. eqs. eqn. eqns. sect. sects. tab. tabs. tbl. i.e. e.g. cf. vs. v.s. approx. resp.
    w.r.t. wrt. al. viz. ca. ref. refs. chap. thm. lem. incl. esp. ibid. eds. def. prop. alg. appx.
    proc. exp. expt. eqn."""
)
# Never a sentence end, but only with this capitalisation ("ms." is a unit, "Ms." a title).
_ABBREV_CASED = _words(
    """Sec. Secs. Dr. Drs. Mr. Mrs. Ms. Prof. Profs. St. Mt. No. Nos. Nr.
    Jan. Feb. Mar. Apr. Jun. Jul. Aug. Sep. Sept. Oct. Nov. Dec."""
)
# Not a sentence end when a number follows ("p. 12", "vol. 3", "sec. 4").
_ABBREV_BEFORE_DIGIT = _words("no. nos. nr. p. pp. vol. vols. sec. ch. art. ex. num.")
# A capital letter plus period after one of these is a label ("Appendix A."), not an initial.
_LABEL_WORDS = _words(
    """appendix section table figure fig. part type class task model setting set phase stage step case
    group level experiment condition scenario strategy method option variant version dataset corpus
    track subtask round system baseline example rule category"""
)
# Words that start sentences far more often than they follow an initial ("Fig. 1 A. We ...").
_STARTERS = _words(
    """The This These That Those We Our It Its In On For To As At By With From However Thus Therefore
    Moreover Furthermore Finally Then Here There They Their Each All Both Since While When If Although
    Such Also Note One An Table Figure Section Specifically Similarly Instead Overall Hence Given
    Unlike Using Based"""
)
# A line ending in one of these continues on the next line (a hard wrap, not a sentence end).
_CONTINUERS = _words(
    """a an the of and or nor but to in on at by for from with without into onto as than that which
    who whose whom is are was were be been being has have had this these those its their our via
    per between among over under using"""
)


def split_sentences(text: str, *, lower_starts: bool = False) -> list[str]:
    """Split ``text`` into sentences: stripped, non-empty, in order, every character kept.
    ``lower_starts``: a sentence may also begin in lower case, as an answer's sentence that names
    "word2vec" or "r/Fakeddit" does (papers' prose is split without it: there a lower-case word after
    a period is mostly an abbreviation the lists miss); abbreviations and initials still hold."""
    if not text or text.isspace():
        return []
    math = [m.span() for m in _MATH.finditer(text)] if "$" in text else []
    sentences: list[str] = []
    start = 0
    for m in _CANDIDATE.finditer(text):
        if m.group("nl") is not None:
            ws_start, ws_end = m.span("nl")
            boundary = _newline_boundary(text, ws_start, ws_end)
        else:
            ws_start, ws_end = m.span("ws")
            if "\n" in m.group("ws"):
                boundary = _newline_boundary(text, ws_start, ws_end)
            else:
                lower = lower_starts and text[ws_end].islower()
                boundary = _punct_boundary(text, m.start("punct"), ws_end, strict_next=not lower)
        if not boundary or (math and _inside(math, ws_start)):
            continue
        piece = text[start:ws_start].strip()
        if piece:
            sentences.append(piece)
        start = ws_end
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def _inside(spans: list[tuple[int, int]], pos: int) -> bool:
    return any(a < pos < b for a, b in spans)


def _word_before(text: str, end: int) -> tuple[str, int]:
    """The non-space run ending at ``end`` (exclusive) and its start offset."""
    i = end
    while i > 0 and not text[i - 1].isspace():
        i -= 1
    return text[i:end], i


def _next_word(text: str, pos: int) -> str:
    m = re.match(r"[^\s.,;:!?\"'”’)\]}]*", text[pos:])
    return m.group(0) if m else ""


def _sentence_start(ch: str) -> bool:
    return ch.isupper() or ch.isdigit() or ch in _OPENERS


def _punct_boundary(text: str, punct: int, ws_end: int, *, strict_next: bool) -> bool:
    """Is the terminal punctuation at ``punct`` (whitespace ending at ``ws_end``) a sentence end?"""
    nxt = text[ws_end] if ws_end < len(text) else ""
    if strict_next and not _sentence_start(nxt):
        return False
    if text[punct] in "?!":
        return True
    if punct > 0 and text[punct - 1] == ".":  # an ellipsis ". . ." / "..." continues the sentence
        return False
    word, word_start = _word_before(text, punct + 1)
    core = word.lstrip(_LEADERS)
    low = core.lower()
    if low in _ABBREV_ANYCASE or core in _ABBREV_CASED or _MULTI_LOWER.match(core):
        return False
    if low in _ABBREV_BEFORE_DIGIT and nxt.isdigit():
        return False
    following = _next_word(text, ws_end)
    if _INITIAL.match(core) or _MULTI_UPPER.match(core):
        prev, _ = _word_before(text, len(text[:word_start].rstrip()))
        if prev.lstrip(_LEADERS).lower() in _LABEL_WORDS:
            return True
        return following in _STARTERS
    return True


def _newline_boundary(text: str, ws_start: int, ws_end: int) -> bool:
    """Does the whitespace run ``text[ws_start:ws_end]`` (holding a newline) separate sentences?"""
    ws = text[ws_start:ws_end]
    if ws.count("\n") >= 2:
        return True
    nxt = text[ws_end]
    if _BULLET.match(text[ws_end : ws_end + 6] + " "):
        return True
    # Last non-closer character of the line before.
    i = ws_start - 1
    while i >= 0 and text[i] in _CLOSERS:
        i -= 1
    if i < 0:
        return False
    last = text[i]
    if last in ".?!":
        return _punct_boundary(text, i, ws_end, strict_next=False)
    if last == ":":
        return True
    if last in ",;-–(" or nxt.islower():
        return False
    word, _ = _word_before(text, ws_start)
    if word.lower() in _CONTINUERS:
        return False
    return _sentence_start(nxt)
