"""Maximal Marginal Relevance (Carbonell & Goldstein, 1998) over a ranked list.

Used after reranking to push down near-duplicates: a candidate's relevance is discounted by its
highest cosine similarity to an already chosen chunk *of the same paper* (chunks of different papers
never count as duplicates, however alike: two papers agreeing is evidence, not redundancy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MMR_LAMBDA = 0.7


def mmr_order(
    relevance: Sequence[float],
    vectors: np.ndarray,
    groups: Sequence[str],
    *,
    lam: float = MMR_LAMBDA,
    k: int | None = None,
) -> list[int]:
    """Indices in MMR order: argmax of lam * rel - (1 - lam) * max same-group cosine to the chosen.

    Relevance is min-max scaled to [0, 1] first so that lam means the same for any score scale.
    Ties go to the earlier index. ``k`` caps how many are chosen (default: all).
    """
    n = len(relevance)
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"MMR lambda must be in [0, 1], got {lam}")
    if not (len(vectors) == len(groups) == n):
        raise ValueError("relevance, vectors and groups must have the same length")
    if n == 0:
        return []
    rel = np.asarray(relevance, dtype=np.float64)
    span = rel.max() - rel.min()
    rel = (rel - rel.min()) / span if span > 0 else np.ones(n)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    sims = unit @ unit.T
    same = np.asarray([[a == b for b in groups] for a in groups])
    chosen: list[int] = []
    max_sim = np.zeros(n)
    remaining = list(range(n))
    limit = n if k is None else min(k, n)
    while remaining and len(chosen) < limit:
        scores = [lam * rel[i] - (1.0 - lam) * max_sim[i] for i in remaining]
        best = remaining[int(np.argmax(scores))]  # argmax returns the first of equal scores
        chosen.append(best)
        remaining.remove(best)
        max_sim = np.maximum(max_sim, np.where(same[best], sims[best], 0.0))
    return chosen
