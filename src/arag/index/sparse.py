"""BM25 sparse vectors: the tokenizer, hashed term ids, and the document/query encoders.

Scoring is split between this module and the index engine. Documents carry the BM25
term-frequency part, ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))``; the engine's
IDF modifier (Qdrant ``Modifier.Idf``) multiplies each matched term by
``ln(1 + (N - n + 0.5) / (n + 0.5))`` at query time, with N the number of indexed points and
n those containing the term (measured against the engine, see tests/test_sparse.py).
Queries carry weight 1.0 per distinct term, so a chunk's score is the classic
BM25 sum over the distinct query terms it contains.

Tokenizer rules (the same for documents and queries):

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

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable

import Stemmer

from arag.records import SparseVector

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

# S2ORC/QASPER stand-ins for citations, tables, figures, sections, equations and formulas.
_PLACEHOLDER = re.compile(r"(?:BIBREF|TABREF|FIGREF|SECREF|EQREF|INLINEFORM|DISPLAYFORM)\d+", re.IGNORECASE)
# A token ending in a digit may continue with ".<digits>" (decimals, versions, arXiv ids).
_TOKEN = re.compile(r"[^\W_]*\d(?:\.\d+)+|[^\W_]+")

_STEMMER = Stemmer.Stemmer("english")


def _fold(text: str) -> str:
    """Lowercase and strip accents (NFKD, combining marks dropped)."""
    if text.isascii():  # the common case, and ~20x cheaper
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).lower()


def tokenize(text: str) -> list[str]:
    """The BM25 terms of ``text``, in order (see the module docstring for the rules)."""
    folded = _fold(_PLACEHOLDER.sub(" ", text))
    words = [w for w in _TOKEN.findall(folded) if (len(w) > 1 or w.isdigit()) and w not in STOPWORDS]
    return list(_STEMMER.stemWords(words))


def term_id(term: str) -> int:
    """A stable unsigned 32-bit id for ``term``: the first 4 bytes of its BLAKE2b digest, big-endian.

    Python's ``hash`` is salted per process, so it cannot be used. With ~10^5 distinct terms
    a few collisions are expected; colliding terms simply share one BM25 dimension.
    """
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=4).digest(), "big")


def bm25_tf_weight(tf: int, doc_len: int, *, k1: float, b: float, avg_len: float) -> float:
    """The BM25 term-frequency factor of one term in one document (IDF excluded)."""
    return tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * doc_len / avg_len))


def _counts_to_vector(counts: Iterable[tuple[int, float]]) -> SparseVector:
    items = sorted(counts)
    return SparseVector(indices=[i for i, _ in items], values=[v for _, v in items])


class BM25Encoder:
    """Turns chunk texts and queries into sparse vectors for an IDF-modified sparse index.

    ``avg_len`` is the average number of terms (as :func:`tokenize` counts them) per
    document; pass the corpus average measured at build time.
    """

    def __init__(self, k1: float = 1.2, b: float = 0.75, avg_len: float = 120.0) -> None:
        if k1 < 0:
            raise ValueError(f"k1 must be >= 0, got {k1}")
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"b must be in [0, 1], got {b}")
        if avg_len <= 0:
            raise ValueError(f"avg_len must be > 0, got {avg_len}")
        self.k1 = k1
        self.b = b
        self.avg_len = avg_len

    def encode_document(self, text: str) -> SparseVector:
        """Term ids with BM25 TF-saturation weights; indices sorted ascending."""
        terms = tokenize(text)
        return self.encode_terms(terms)

    def encode_terms(self, terms: list[str]) -> SparseVector:
        """Like :meth:`encode_document`, from terms already tokenized (the length is ``len(terms)``)."""
        tf = Counter(term_id(t) for t in terms)
        n = len(terms)
        return _counts_to_vector(
            (tid, bm25_tf_weight(c, n, k1=self.k1, b=self.b, avg_len=self.avg_len)) for tid, c in tf.items()
        )

    def encode_query(self, text: str) -> SparseVector:
        """Weight 1.0 per distinct query term (repeating a word in a query does not boost it)."""
        return _counts_to_vector((tid, 1.0) for tid in {term_id(t) for t in tokenize(text)})


def average_length(texts: Iterable[str]) -> float:
    """The mean number of BM25 terms per text (for ``BM25Encoder(avg_len=...)``); 1.0 when empty."""
    total = 0
    count = 0
    for text in texts:
        total += len(tokenize(text))
        count += 1
    return total / count if count and total else 1.0
