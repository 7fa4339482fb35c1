"""BM25 sparse vectors: hashed term ids, and the document/query encoders.

Scoring is split between this module and the index engine. Documents carry the BM25
term-frequency part, ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))``; the engine's
IDF modifier (Qdrant ``Modifier.Idf``) multiplies each matched term by
``ln(1 + (N - n + 0.5) / (n + 0.5))`` at query time, with N the number of indexed points and
n those containing the term (measured against the engine, see tests/test_sparse.py).
Queries carry weight 1.0 per distinct term, so a chunk's score is the classic
BM25 sum over the distinct query terms it contains.

Terms come from :func:`arag.text.tokenize` (:mod:`arag.text` gives the rules), the same for documents
and queries.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable

from arag.records import SparseVector
from arag.text import tokenize


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
