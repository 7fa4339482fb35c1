"""Words of English text as arag counts them: the tokenizer behind BM25, lexical overlap and topic
labels, and the stopword list.

Tokenizer rules:

- Unicode NFKD with accents dropped ("naïve" -> "naive"), then lowercase.
- QASPER placeholders (``BIBREF12``, ``TABREF3``, ``FIGREF1``, ``SECREF2``, ``EQREF4``,
  ``INLINEFORM0``, ``DISPLAYFORM0``) are removed first: they are meaningless and frequent
  enough to dominate document lengths.
- Tokens are runs of letters and digits; a dot between digits stays inside the token, so
  "3.5", "v1.5" and "1810.04805" survive whole, while "corpus.2" (a footnote mark) splits.
  Hyphens, apostrophes and other punctuation split ("pre-trained" -> "pre", "trained").
- One-character tokens are dropped unless they are a digit ("3 layers" keeps "3").
- English stopwords (NLTK's list, fixed below) are dropped, then tokens are stemmed with
  Snowball English (PyStemmer). Mixed tokens such as "gpt2", "f1", "bert" pass unchanged.
"""

from __future__ import annotations

import re
import unicodedata

import Stemmer

# NLTK's English stopword list (179 words), frozen here so nothing is downloaded.
_STOPWORDS_TEXT = """
    i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
    yourselves he him his himself she she's her hers herself it it's its itself they them their
    theirs themselves what which who whom this that that'll these those am is are was were be
    been being have has had having do does did doing a an the and but if or because as until
    while of at by for with about against between into through during before after above below
    to from up down in out on off over under again further then once here there when where why
    how all any both each few more most other some such no nor not only own same so than too
    very s t can will just don don't should should've now d ll m o re ve y ain aren aren't
    couldn couldn't didn didn't doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't
    ma mightn mightn't mustn mustn't needn needn't shan shan't shouldn shouldn't wasn wasn't
    weren weren't won won't wouldn wouldn't
"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORDS_TEXT.split())

# S2ORC/QASPER stand-ins for citations, tables, figures, sections, equations and formulas; the one
# spelling of them (strip_placeholders removes them from what the LLM reads and the reader sees).
# UID42 stands for a numbered subsection, example, step or figure panel ("see Section UID10",
# "Figure 2 . UID8": 347 in 98 papers); only in capitals, as S2ORC writes it.
_UNINDEXED_STAND_INS = "BIBREF|TABREF|FIGREF|SECREF|EQREF|INLINEFORM|DISPLAYFORM"
PLACEHOLDER_PATTERN = rf"(?:{_UNINDEXED_STAND_INS}|(?-i:\bUID))\d+"
# The stand-ins the tokenizer drops: all but UID42, too rare to weigh on a passage's length, whose
# removal would change every built index's terms and so the reranker's training negatives.
_PLACEHOLDER = re.compile(rf"(?:{_UNINDEXED_STAND_INS})\d+", re.IGNORECASE)
# A stand-in with the space before it, as removed from text that is read; LaTeX's non-breaking
# space before it goes too ("Table~ TABREF3" reads "Table").
_PLACEHOLDER_SPACE = re.compile(rf"~?\s*\b{PLACEHOLDER_PATTERN}\b", re.IGNORECASE)
_EMPTY_PARENS = re.compile(r"\s*\(\s*(?:[,;]\s*)*\)")
_SPACE_BEFORE = re.compile(r"\s+([.,;:)])")
_PUNCT_RUN = re.compile(r"([,;:])(?:\s*[,;:])+")
_PUNCT_BEFORE_STOP = re.compile(r"[,;:]+(?=\.)")


# LaTeX markup arXiv abstracts keep (about 50 of the 1,585 QASPER abstracts, a few titles and
# passages): what it marks stays, the commands go. Inside $...$ nothing changes (a formula is not
# prose to tidy); a citation command goes as a stand-in does.
_MATH = re.compile(r"(\$\$?)[^$]*\1")
# A LaTeX citation (\cite{key}, \citep{a,b}); like a stand-in, it cites other work.
LATEX_CITE_PATTERN = r"\\cite[tp]?\*?\{[^{}]*\}"
_CITE_COMMAND = re.compile(rf"\s*~?{LATEX_CITE_PATTERN}")
_FONT_COMMAND = re.compile(
    r"\\(?:emph|textbf|textit|texttt|textsc|textrm|textsf|textmd|underline)\{([^{}]*)\}"
)
_FONT_GROUP = re.compile(r"\{\\(?:bf|sc|it|em|tt|rm|sf|sl)\s+([^{}]*)\}")
# \`u, \'{a}, {\"{a}}, \~n, \^o: the letter with its accent.
_ACCENT = re.compile(r"\{?\\([`'\"^~])\{?([A-Za-z])\}?\}?")
_COMBINING = {"`": "\u0300", "'": "\u0301", '"': "\u0308", "^": "\u0302", "~": "\u0303"}


def _latex_prose(text: str) -> str:
    t = _CITE_COMMAND.sub("", text)
    t = _FONT_GROUP.sub(r"\1", _FONT_COMMAND.sub(r"\1", t))
    return _ACCENT.sub(lambda m: unicodedata.normalize("NFC", m[2] + _COMBINING[m[1]]), t)


def latex_as_text(text: str) -> str:
    """LaTeX markup outside formulas read as text: "{\\sc Hibert}" -> "Hibert", "\\emph{X}" -> "X",
    "Yor\\`ub\\'a" -> "Yorùbá", "\\cite{x}" removed; formulas ($...$) as written."""
    if "\\" not in text:
        return text
    out, last = [], 0
    for m in _MATH.finditer(text):
        out.append(_latex_prose(text[last : m.start()]))
        out.append(m[0])
        last = m.end()
    out.append(_latex_prose(text[last:]))
    return "".join(out)


# What a title's or heading's LaTeX most often holds beyond accents and fonts: a formula that is one
# symbol ("$\\rho$-hot", "English$\\leftrightarrow $German") or one name ("$k$-mers",
# "$\\textsc {0shot-tc}$"), and a degree sign ("360{\\deg}"). A title or a heading is read, never typeset.
_GREEK = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi pi rho sigma tau "
    "upsilon phi chi psi omega"
).split()
_SYMBOLS = {
    "rightarrow": "\u2192",
    "leftarrow": "\u2190",
    "leftrightarrow": "\u2194",
    "Rightarrow": "\u21d2",
    "Leftrightarrow": "\u21d4",
    "otimes": "\u2297",
    "times": "\u00d7",
    "infty": "\u221e",
}
_SYMBOL = re.compile(r"\\([A-Za-z]+)")
_NAME = re.compile(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*")
_NAME_FONT = re.compile(r"\\(?:textsc|textit|textbf|textrm|mathbf|mathrm|mathit|rm|bf|it)(?![A-Za-z])\s*")
_FORMULA = re.compile(r"\$([^$]*)\$")
_DEGREE = re.compile(r"\{?\\(?:degree|deg)(?![A-Za-z])\}?|\$\^\{?\\circ\}?\$")


def _symbol(command: str) -> str | None:
    if command.lower() in _GREEK:
        case = "CAPITAL" if command[0].isupper() else "SMALL"
        # Unicode spells the letter "LAMDA" (a lookup of "LAMBDA" raises).
        return unicodedata.lookup(f"GREEK {case} LETTER {command.upper().replace('LAMBDA', 'LAMDA')}")
    return _SYMBOLS.get(command)


def _formula(m: re.Match[str]) -> str:
    # Font commands and braces around one name or one symbol go; anything more stays as written.
    inner = _NAME_FONT.sub("", m[1]).replace("{", "").replace("}", "").strip()
    if _NAME.fullmatch(inner):
        return inner
    symbol = _SYMBOL.fullmatch(inner)
    shown = _symbol(symbol[1]) if symbol else None
    return shown if shown is not None else m[0]


def title_as_text(title: str) -> str:
    """A paper title as a reader sees it: LaTeX read as text (:func:`latex_as_text`), a formula of
    one symbol or one name as that ("$\\rho$-hot" -> "ρ-hot", "$k$-means" -> "k-means"), a degree
    command as "°" ("360{\\deg}" -> "360°"), spaces single."""
    t = _FORMULA.sub(_formula, _DEGREE.sub("°", title))
    return " ".join(latex_as_text(t).split())


# S2ORC wraps a heading's formulas and stand-ins in @!START@ ... @!END@ (96 headings of 31 QASPER papers).
_HEADING_MARK = re.compile(r"@!(?:START|END)@")
# Older arXiv HTML gave a heading's formula twice, as rendered and then as TeX: "German→\\rightarrow
# English", "The Influence of λ\\lambda". The TeX goes where it names the symbol just before it (with
# the space that ended the command).
_RENDERED_TEX = re.compile(r"(\S)\\([A-Za-z]+)(?![A-Za-z]) ?")
# A footnote glued to its heading: "ExperimentsThe code for this paper is available at https://...",
# "LeafNATS Toolkithttps://github.com/...".
_GLUED_NOTE = re.compile(r"(?<=[a-z])(?:(?:The|This) (?:\S+ ){4,}.*|https?://\S*)$")


def _rendered(m: re.Match[str]) -> str:
    return m[1] if _symbol(m[2]) == m[1] else m[0]


def section_as_text(name: str) -> str:
    """A QASPER section heading as a reader sees it: S2ORC's @!START@/@!END@ marks gone, a formula
    given twice (rendered, then as TeX) given once, a glued footnote cut off, stand-ins removed and
    the rest read as a title is (:func:`title_as_text`), each part of a " ::: " path alone:
    "English@!START@$\\leftrightarrow $@!END@German" -> "English↔German"."""
    parts = []
    # " ::: " joins a subsection's heading to its parents' (kept: the summary reads the last one); a
    # part left empty (":::  ::: Hyperparameters.", 19 headings) goes.
    for part in _HEADING_MARK.sub("", name).split(":::"):
        t = title_as_text(strip_placeholders(_GLUED_NOTE.sub("", _RENDERED_TEX.sub(_rendered, part))))
        if t:
            parts.append(t)
    return " ::: ".join(parts)


def section_path(section: str) -> str:
    """A stored heading path as a reader sees it: "Experiments ::: Datasets" -> "Experiments › Datasets"
    (S2ORC's separator stays in what is stored, which the reranker reads and the API returns)."""
    return " \u203a ".join(p.strip() for p in section.split(":::") if p.strip())


def has_placeholder(text: str) -> bool:
    """Whether ``text`` holds a BIBREF0 / TABREF1 / ... stand-in (what it said is not in the text)."""
    return _PLACEHOLDER_SPACE.search(text) is not None


def strip_placeholders(text: str) -> str:
    """Remove S2ORC's BIBREF0 / TABREF1 / ... stand-ins (meaningless in an answer), and the marks
    they leave behind: "models () and", "in Table )", "by BIBREF1, BIBREF2." read "models and",
    "in Table)", "by." (punctuation only: the words, and so every lexical check, stay the same).
    LaTeX markup outside formulas goes too (:func:`latex_as_text`)."""
    t = _EMPTY_PARENS.sub("", _PLACEHOLDER_SPACE.sub("", latex_as_text(text)))
    t = _SPACE_BEFORE.sub(r"\1", t)
    t = _PUNCT_BEFORE_STOP.sub("", _PUNCT_RUN.sub(r"\1", t))
    return t.strip()


# A token ending in a digit may continue with ".<digits>" (decimals, versions, arXiv ids).
_TOKEN = re.compile(r"[^\W_]*\d(?:\.\d+)+|[^\W_]+")

_STEMMER = Stemmer.Stemmer("english")


def fold_accents(text: str) -> str:
    """``text`` with its letters' accents dropped (NFKD, combining marks dropped: "Yorùbá" -> "Yoruba")."""
    if text.isascii():  # the common case, and ~20x cheaper
        return text
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _fold(text: str) -> str:
    """Lowercase and strip accents."""
    return fold_accents(text).lower()


def tokenize(text: str) -> list[str]:
    """The BM25 terms of ``text``, in order (see the module docstring for the rules)."""
    folded = _fold(_PLACEHOLDER.sub(" ", text))
    words = [w for w in _TOKEN.findall(folded) if (len(w) > 1 or w.isdigit()) and w not in STOPWORDS]
    return list(_STEMMER.stemWords(words))


# Two words with only spaces or a hyphen between them (the second is looked ahead, so pairs overlap).
_ADJACENT = re.compile(r"(?<!\w)([^\W\d_]+)[ \t-]+(?=([^\W\d_]+)(?!\w))")


def joined_terms(text: str) -> set[str]:
    """The stems of each two adjacent words of ``text`` written as one: a compound spelt open or
    hyphenated ("data set", "pre-trained") meets the question's closed spelling ("dataset",
    "pretrained"). Words only (no digits), stopwords included ("on line" -> "onlin")."""
    # A removed stand-in still separates the words around it ("data BIBREF3 set").
    folded = _fold(_PLACEHOLDER.sub(" . ", text))
    pairs = [m.group(1) + m.group(2) for m in _ADJACENT.finditer(folded)]
    return set(_STEMMER.stemWords(pairs))


def held_terms(text: str) -> set[str]:
    """The stems a text holds, for checking a question's key terms against it: its words and each two
    adjacent words written as one (:func:`joined_terms`)."""
    return set(tokenize(text)) | joined_terms(text)
