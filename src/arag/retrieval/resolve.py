"""Resolve a question to the paper it names, so passage search can be scoped to that paper.

People name papers in many ways: an arXiv id, a quoted title, the title unquoted anywhere in the
question, or a distinctive part of it, with case and punctuation as they please. Resolution is
deliberately conservative: a weak or ambiguous match resolves to nothing and the whole library
is searched, because scoping to the wrong paper guarantees a wrong answer.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from arag.text import fold_accents

Method = Literal["arxiv-id", "quoted-title", "title", "title-part"]

_ARXIV = re.compile(r"(?<![\d.])(\d{4}\.\d{4,5})(?:v\d+)?(?![\d])")
_QUOTED = re.compile(r"[\"“”'‘’«»`]{1,2}([^\"“”‘’«»`]{8,300}?)[\"“”'‘’«»`]{1,2}(?=$|[\s:;,.?!)])")
_NON_ALNUM = re.compile(r"[^0-9a-z]+")
# A title part must carry this share of its title's IDF mass, span at least this many tokens, and
# be found in no other title; below that a question merely shares words with a title.
MIN_PART_SHARE = 0.65
MIN_PART_TOKENS = 3
MIN_QUOTED_RATIO = 0.9
# Quoted strings of one question compared with the titles (each costs a fuzzy match per title).
MAX_QUOTED = 8
_STOP = frozenset(
    "a an the of for and or in on to with by from via at as is are be using towards toward into "
    "its their our we do does what which how".split()
)


_QUOTES = "[\"“”'‘’«»`]{0,2}"
# What is left of "In the paper '<title>': ..." once the title is gone.
_LEAD = re.compile(
    r"^\s*(?:(?:in|from|according\s+to|for)\s+)?(?:the\s+)?(?:paper|article|work|arxiv)?\s*[:,;\-–—]*\s*",
    re.IGNORECASE,
)


def normalise(text: str) -> str:
    """Lowercase, accents dropped (people type titles both ways), punctuation to spaces, single spaces."""
    return _NON_ALNUM.sub(" ", fold_accents(text).lower()).strip()


class PaperRef(BaseModel):
    """The paper a question was resolved to, and why (shown by --explain and in traces)."""

    paper_id: str
    title: str
    method: Method
    score: float
    matched: str

    def reason(self) -> str:
        return f"{self.method} match {self.matched!r} (score {self.score:.2f})"

    def remainder(self, question: str) -> str:
        """The question without the paper's name: what to search for inside the paper.

        Left in, the title's words would match every chunk of the paper equally (or the title
        passages only) and crowd the question's own words out.
        """
        if self.method == "arxiv-id":
            pattern = r"(?:arxiv\s*:?\s*)?" + re.escape(self.matched)
        else:
            tokens = normalise(self.matched).split()
            pattern = _QUOTES + r"[^0-9a-z]+".join(map(re.escape, tokens)) + _QUOTES
        rest, found = re.subn(pattern, " ", question, count=1, flags=re.IGNORECASE)
        if not found:  # the question spells the title with accents the pattern does not hold
            rest = re.sub(pattern, " ", fold_accents(question), count=1, flags=re.IGNORECASE)
        rest = _LEAD.sub("", rest)
        rest = re.sub(r"\s+", " ", rest).strip(" :;,-–—")
        return rest or question


class _Node:
    """A trie node: the one title holding the token path that leads here, or ``SHARED``."""

    __slots__ = ("children", "owner")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.owner: str | None = None


SHARED = "\0shared"


class PaperResolver:
    """Resolves questions against the library's (paper id, title) pairs."""

    def __init__(self, papers: Sequence[tuple[str, str]]) -> None:
        self.titles = {pid: title for pid, title in papers}
        self._norm = {pid: normalise(t) for pid, t in papers}
        self._by_norm: dict[str, list[str]] = defaultdict(list)
        for pid, n in self._norm.items():
            self._by_norm[n].append(pid)
        df: dict[str, int] = defaultdict(int)
        for n in self._norm.values():
            for tok in set(n.split()):
                df[tok] += 1
        total = max(1, len(self._norm))
        self._idf = {t: math.log(1 + total / c) for t, c in df.items()}
        # Every contiguous span of every title, as a trie of token paths from each title position: the
        # longest title span starting at a question token is found in at most (longest title) steps,
        # so title-part resolution is linear in the question's length, not cubic.
        self._trie = _Node()
        for pid, n in self._norm.items():
            toks = n.split()
            for i in range(len(toks)):
                node = self._trie
                for tok in toks[i:]:
                    node = node.children.setdefault(tok, _Node())
                    node.owner = pid if node.owner in (None, pid) else SHARED

    def _mass(self, toks: Sequence[str]) -> float:
        return sum(self._idf.get(t, 0.0) for t in toks if t not in _STOP)

    def resolve(self, question: str) -> PaperRef | None:
        """The paper the question names, or None when it names none (or too weakly)."""
        for m in _ARXIV.finditer(question):
            pid = m.group(1)
            if pid in self.titles:
                return PaperRef(
                    paper_id=pid, title=self.titles[pid], method="arxiv-id", score=1.0, matched=m.group(0)
                )
        for m in itertools.islice(_QUOTED.finditer(question), MAX_QUOTED):
            ref = self._quoted(m.group(1))
            if ref:
                return ref
        qn = normalise(question)
        return self._whole_title(qn) or self._title_part(qn)

    def _quoted(self, quoted: str) -> PaperRef | None:
        qn = normalise(quoted)
        if not qn:
            return None
        exact = self._by_norm.get(qn, [])
        if len(exact) == 1:
            return PaperRef(
                paper_id=exact[0],
                title=self.titles[exact[0]],
                method="quoted-title",
                score=1.0,
                matched=quoted,
            )
        scored = sorted(
            ((difflib.SequenceMatcher(None, qn, n).ratio(), pid) for pid, n in self._norm.items()
             if abs(len(n) - len(qn)) <= 0.2 * max(len(n), len(qn))),
            reverse=True,
        )  # fmt: skip
        if (
            scored
            and scored[0][0] >= MIN_QUOTED_RATIO
            and (len(scored) == 1 or scored[1][0] < scored[0][0] - 0.05)
        ):
            ratio, pid = scored[0]
            return PaperRef(
                paper_id=pid, title=self.titles[pid], method="quoted-title", score=ratio, matched=quoted
            )
        return None

    def _whole_title(self, qn: str) -> PaperRef | None:
        padded = f" {qn} "
        found = [(len(n), pid) for pid, n in self._norm.items() if len(n.split()) >= 2 and f" {n} " in padded]
        if not found:
            return None
        found.sort(reverse=True)
        longest = [pid for length, pid in found if length == found[0][0]]
        if len(longest) != 1:
            return None
        pid = longest[0]
        return PaperRef(
            paper_id=pid, title=self.titles[pid], method="title", score=1.0, matched=self._norm[pid]
        )

    def _title_part(self, qn: str) -> PaperRef | None:
        toks = qn.split()
        best: tuple[float, str, tuple[str, ...]] | None = None
        ambiguous = False
        for i in range(len(toks)):
            # The longest span from i found in a title decides (spans of titles are closed under
            # prefixes, so walking the trie until it ends finds it).
            node, j = self._trie, i
            while j < len(toks) and (child := node.children.get(toks[j])) is not None:
                node, j = child, j + 1
            pid = node.owner
            if j - i < MIN_PART_TOKENS or pid is None or pid == SHARED:
                continue  # too short, or shared: not distinctive (shorter ones from i are shared too)
            span = tuple(toks[i:j])
            title_mass = self._mass(self._norm[pid].split())
            share = self._mass(span) / title_mass if title_mass else 0.0
            if share >= MIN_PART_SHARE:
                if best is None or share > best[0]:
                    ambiguous = best is not None and best[1] != pid and share - best[0] < 0.1
                    best = (share, pid, span)
                elif best[1] != pid and best[0] - share < 0.1:
                    ambiguous = True
        if best is None or ambiguous:
            return None
        share, pid, span = best
        return PaperRef(
            paper_id=pid, title=self.titles[pid], method="title-part", score=share, matched=" ".join(span)
        )
