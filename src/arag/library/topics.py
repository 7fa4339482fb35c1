"""Topics: k-means over abstract vectors, each cluster labelled by its most distinctive terms.

QASPER papers carry no topics; the clusters give ``arag papers --topic`` and retrieval a coarse
facet. Labels use class-based TF-IDF (a term frequent in one cluster and rare in the others).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from arag.text import STOPWORDS

_WORD = re.compile(r"[a-z][a-z0-9\-]{2,}")
# Words that are frequent in every cluster of a paper library and so never distinguish a topic
# (title/section/abstract come from the chunk prefix of the embedded abstract text).
_GENERIC = frozenset(
    """
    paper propose proposed approach method methods model models task tasks results show shows
    based using used use new work state art performance data dataset datasets also however two
    different novel well existing first study learning neural network networks
    title section abstract
    """.split()
)


def kmeans(vectors: np.ndarray, k: int, seed: int = 0, iters: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Spherical k-means (cosine) with k-means++ seeding; returns (assignments, unit centroids).

    Deterministic for a given seed. ``k`` is capped at the number of vectors.
    """
    n = len(vectors)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros((0, vectors.shape[1] if vectors.ndim == 2 else 0))
    k = max(1, min(k, n))
    x = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    rng = np.random.default_rng(seed)
    centroids = [x[rng.integers(n)]]
    for _ in range(1, k):
        sims = np.max(x @ np.stack(centroids).T, axis=1)
        d2 = np.clip(2.0 - 2.0 * sims, 0.0, None)
        total = d2.sum()
        idx = int(rng.integers(n)) if total <= 0 else int(rng.choice(n, p=d2 / total))
        centroids.append(x[idx])
    c = np.stack(centroids)
    assign = np.full(n, -1, dtype=np.int64)
    for _ in range(iters):
        new_assign = np.argmax(x @ c.T, axis=1)
        if np.array_equal(new_assign, assign):
            break
        assign = new_assign
        for j in range(k):
            members = x[assign == j]
            if len(members):
                m = members.sum(axis=0)
                c[j] = m / max(float(np.linalg.norm(m)), 1e-12)
    return assign, c


def assign_nearest(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The nearest centroid (cosine) of each vector: how papers added later get a topic."""
    x = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return np.argmax(x @ centroids.T, axis=1)


def label_words(text: str) -> list[str]:
    """Lowercased content words of a text, as candidate label terms."""
    return [
        w
        for w in _WORD.findall(text.lower())
        if w not in STOPWORDS and w not in _GENERIC and not w.endswith("ref")
    ]


def label_clusters(texts: Sequence[str], assignments: Sequence[int], n_terms: int = 4) -> dict[int, str]:
    """Label each cluster by its top class-TF-IDF terms, joined with ', '. Ties break alphabetically."""
    per_cluster: dict[int, Counter[str]] = {}
    for text, c in zip(texts, assignments, strict=True):
        per_cluster.setdefault(int(c), Counter()).update(label_words(text))
    n_clusters = len(per_cluster)
    df: Counter[str] = Counter()
    for counts in per_cluster.values():
        df.update(counts.keys())
    labels: dict[int, str] = {}
    for c, counts in per_cluster.items():
        total = sum(counts.values()) or 1
        scored = sorted(
            ((cnt / total) * math.log(1.0 + n_clusters / df[w]), w) for w, cnt in counts.items() if cnt >= 1
        )
        scored.sort(key=lambda sw: (-sw[0], sw[1]))
        labels[c] = ", ".join(w for _, w in scored[:n_terms]) or f"topic {c}"
    return labels
